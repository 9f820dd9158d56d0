"""The simulated backend: a whole cluster in this process, on virtual time.

``tray.init(backend="sim", seed=N, num_nodes=K)`` starts a GCS, K node
managers, their workers and the driver's core worker as trio tasks in one
trio run, started in *guest mode* on a virtual clock that jumps to the next
deadline when nothing can run (``engine.VirtualClock``):
the user's synchronous script stays in charge of the thread, and each
blocking API call pumps the run until its answer is there. Nothing runs in
another thread; with trio's deterministic scheduling switched on and every
random draw coming from RNGs seeded from ``seed``, the same program and seed
give the same event trace, byte for byte."""

from __future__ import annotations

from .cluster import SimCluster, start

__all__ = ["SimCluster", "start"]
