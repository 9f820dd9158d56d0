"""A mixed tray workload for the determinism test (ARCHITECTURE.md section 5).

Run as ``python tests/determinism_program.py SEED``: it runs the workload on a
simulated three-node cluster and prints one line per result, then the trace
digest of the run as its *last* line.  ``tests/test_determinism.py`` runs it
in fresh interpreters with different ``PYTHONHASHSEED`` values and compares.

The workload deliberately touches what tends to break determinism: string
keys (named actors, custom resources, dict/set-heavy bookkeeping hashed by
``PYTHONHASHSEED``), numpy buffers, several concurrent callers of one actor,
nested tasks that block in ``tray.get``, and a ``wait`` loop whose completion
order depends on simulated latencies.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

import tray
import tray.simtest

NUM_NODES = 3
NUM_CPUS = 4


def _define():
    """Remote functions and classes, defined after init like a user script."""

    @tray.remote
    def add(a, b):
        return a + b

    @tray.remote
    def leaf(x):
        return x * x

    @tray.remote
    def parent(n):
        # A nested task: submits children and blocks on them inside the worker.
        return sum(tray.get([leaf.remote(i) for i in range(n)]))

    @tray.remote
    def grandparent(k):
        return tray.get([parent.remote(i + 1) for i in range(k)])

    @tray.remote
    class Recorder:
        def __init__(self, label):
            self.label = label
            self.log = []
            self.seen = set()

        def record(self, who, i):
            self.log.append(f"{who}:{i}")
            self.seen.add(who)
            return len(self.log)

        def summary(self):
            return self.label, list(self.log), sorted(self.seen)

    @tray.remote
    def caller(recorder, who, n):
        # Several callers share one actor; each caller's calls are ordered,
        # the interleaving between callers is up to the (seeded) simulation.
        return [tray.get(recorder.record.remote(who, i)) for i in range(n)]

    @tray.remote(resources={"widget": 1})
    def slow(i):
        time.sleep(0.01 * ((i * 7) % 5))  # virtual time inside the simulator
        return {"task": f"slow-{i}", "value": i}

    return add, parent, grandparent, Recorder, caller, slow


def run_workload(seed: int) -> tuple[list[str], str, str]:
    """Run the workload once; returns (result lines, digest before shutdown,
    digest after shutdown)."""
    tray.init(
        backend="sim",
        seed=seed,
        num_nodes=NUM_NODES,
        num_cpus=NUM_CPUS,
        resources={"widget": 2},
    )
    lines: list[str] = []
    try:
        add, parent, grandparent, Recorder, caller, slow = _define()

        # 1. Tree reduce over numpy arrays (puts, chains of dependencies, buffers).
        data = [tray.put(np.arange(1000, dtype=np.float64) * i) for i in range(16)]
        while len(data) > 1:
            data.append(add.remote(data.pop(0), data.pop(0)))
        total = tray.get(data[0])
        assert float(total.sum()) == float(np.arange(1000).sum() * sum(range(16)))
        lines.append(f"tree_reduce {float(total.sum())!r}")

        # 2. Named actors with several callers each (tasks and the driver).
        recorders = [Recorder.options(name=f"recorder-{k}").remote(f"r{k}") for k in range(2)]
        calls = [caller.remote(recorders[j % 2], f"caller-{j}", 3) for j in range(6)]
        driver_calls = [recorders[0].record.remote("driver", i) for i in range(3)]
        tray.get(calls)
        tray.get(driver_calls)
        for k in range(2):
            same = tray.get_actor(f"recorder-{k}")
            label, log, seen = tray.get(same.summary.remote())
            assert len(log) == (12 if k == 0 else 9), log
            for who in seen:
                indices = [int(e.split(":")[1]) for e in log if e.split(":")[0] == who]
                assert indices == sorted(indices), (who, log)  # per-caller order
            lines.append(f"actor {label} {log}")

        # 3. Nested tasks, two levels deep.
        nested = tray.get(grandparent.remote(4))
        assert nested == [sum(i * i for i in range(n + 1)) for n in range(4)], nested
        lines.append(f"nested {nested}")

        # 4. A wait loop, processing results as they finish.
        pending = [slow.remote(i) for i in range(8)]
        order = []
        while pending:
            ready, pending = tray.wait(pending, num_returns=1)
            order.append(tray.get(ready[0])["value"])
        assert sorted(order) == list(range(8)), order
        lines.append(f"wait_order {order}")

        digest_live = tray.simtest.trace_digest()
    finally:
        tray.shutdown()
    digest_final = tray.simtest.trace_digest()
    return lines, digest_live, digest_final


def main(argv: list[str]) -> int:
    seed = int(argv[1]) if len(argv) > 1 else 0
    lines, digest_live, digest_final = run_workload(seed)
    for line in lines:
        print(line)
    print(f"digest_live {digest_live}")
    print(digest_final)
    return 0


if __name__ == "__main__":
    # Run through the module imported by its own name, as the in-process test
    # does, so that the remote functions' __module__ (which is part of their
    # pickled definition, hence of the function table and the trace) is
    # "determinism_program" in both cases rather than "__main__" here.
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import determinism_program

    sys.exit(determinism_program.main(sys.argv))
