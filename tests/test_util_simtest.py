"""The ``util`` simtest workload: ActorPool, multiprocessing.Pool and Queue
under the default fault profile, and proof that its queue invariants can
fail."""

from __future__ import annotations

import json

from tray.simtest import runner
from tray.simtest.cli import sweep
from tray.util import queue as tray_queue


def test_util_workload_is_green_and_deterministic():
    summary = sweep(range(0, 8), "util", "default", determinism_every=4)
    assert summary["failures"] == [], json.dumps(summary["failures"], indent=1)[:4000]
    assert summary["seeds"] == 8
    assert summary["nondeterministic_seeds"] == []


def test_a_queue_that_delivers_twice_is_caught(monkeypatch):
    take = tray_queue._QueueActor._take

    def take_and_keep_the_first(self):
        item = take(self)
        if not getattr(self, "duplicated", False):
            self.duplicated = True
            self.items.appendleft(item)
        return item

    monkeypatch.setattr(tray_queue._QueueActor, "_take", take_and_keep_the_first)
    for seed in range(20):
        result = runner.run_seed(seed, "util", "none")
        if not result.ok:
            assert result.invariant in ("queue-delivers-each-item-once", "queue-as-ray",
                                        "get-returns-model-value"), result.report()
            return
    raise AssertionError("no seed of the util workload noticed a queue delivering twice")
