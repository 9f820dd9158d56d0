"""The ``train`` simtest workload: a DataParallelTrainer run under the
default fault profile, and proof that its invariants can fail."""

from __future__ import annotations

import json

from tray.simtest import runner
from tray.simtest.cli import sweep
from tray.train import _storage


def test_train_workload_is_green_and_deterministic():
    summary = sweep(range(0, 8), "train", "default", determinism_every=4)
    assert summary["failures"] == [], json.dumps(summary["failures"], indent=1)[:4000]
    assert summary["seeds"] == 8
    assert summary["nondeterministic_seeds"] == []


def test_ranks_follow_where_the_workers_started():
    # Chaos seed 214: a bundle's node died between the group's placement
    # and its workers' start; ranks computed from the group's table named
    # the dead node, while the worker started where the bundle went next.
    result = runner.run_seed(214, "train", "chaos")
    assert result.ok, (result.invariant, result.message)


def test_a_restart_from_a_stale_checkpoint_is_caught(monkeypatch):
    add = _storage.RunStorage.add

    def add_and_forget_the_newest(self, row, metrics, checkpoint_path):
        add(self, row, metrics, checkpoint_path)
        if len(self.kept) >= 2:
            self.latest = self.kept[0]  # restarts would resume from an old checkpoint

    monkeypatch.setattr(_storage.RunStorage, "add", add_and_forget_the_newest)
    for seed in range(20):
        result = runner.run_seed(seed, "train", "crash")
        if not result.ok:
            assert result.invariant in ("train-resumes-from-latest-checkpoint",
                                        "train-latest-checkpoint"), result.report()
            return
    raise AssertionError("no seed of the train workload noticed a stale checkpoint")
