"""tray.simtest: the public toolkit for simulated clusters.

``trace_digest()`` is the digest of the running (or last) simulated run's
event trace; the same program and seed give the same digest in any process.
``cluster()`` is the running simulated cluster."""

from __future__ import annotations


def _clusters() -> dict:
    from ..backends.sim.patches import _active

    return _active


def cluster():
    """The running simulated cluster; TrayError if none runs."""
    from ..exceptions import TrayError

    running = _clusters()["cluster"]
    if running is None:
        raise TrayError("no simulated cluster is running: call tray.init(backend='sim') first")
    return running


def trace_digest() -> str:
    """Hex digest of the current, or most recently shut down, simulated run."""
    from ..exceptions import TrayError

    last = _clusters()["cluster"] or _clusters()["last"]
    if last is None:
        raise TrayError("no simulated run has happened in this process")
    return last.digest()


__all__ = ["cluster", "trace_digest"]
