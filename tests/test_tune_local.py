"""tray.tune on real processes (the local backend): trials in worker
processes, a real process crash retried from its checkpoint, and
``Tuner.restore`` after the driver process is SIGKILLed."""

from __future__ import annotations

import os

import pytest
from test_tune import Counter, check_restored, history, quadratic, run, run_killed_driver

import tray
from tray import tune


@pytest.fixture
def local():
    tray.init(num_cpus=2)
    yield
    tray.shutdown()


def test_local_experiment_with_a_crash_retried_from_its_checkpoint(local, tmp_path):
    marker = str(tmp_path / "crashed")
    grid = run(Counter, tmp_path, name="crash", num_samples=1,
               param_space={"start": 0, "steps": 5, "crash_at": 3, "marker": marker},
               failure_config=tune.FailureConfig(max_failures=1),
               checkpoint_config=tune.CheckpointConfig(checkpoint_frequency=1))
    [result] = grid
    assert os.path.exists(marker)  # a worker process really exited
    assert result.status == "TERMINATED"
    assert result.metrics["value"] == 5
    assert [row["value"] for row in history(result)] == [1, 2, 3, 4, 5]

    grid = run(quadratic, tmp_path, name="asha", metric="score", mode="max", num_samples=6,
               param_space={"x": tune.uniform(0, 1), "steps": 4},
               scheduler=tune.schedulers.ASHAScheduler(max_t=4, reduction_factor=2))
    assert grid.num_terminated == 6
    assert grid.get_best_result().metrics["training_iteration"] == 4


def test_restore_after_the_driver_was_killed_local(tmp_path):
    ledger = run_killed_driver(tmp_path, "num_cpus=2", "test_tune")
    tray.init(num_cpus=2)
    try:
        check_restored(tmp_path, ledger)
    finally:
        tray.shutdown()
