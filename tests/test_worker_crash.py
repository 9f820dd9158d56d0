"""os._exit inside simulated user code crashes that simulated worker only;
the owner sees the worker die and retries within max_retries."""

import os

import pytest

import tray
import tray.exceptions as tex


@tray.remote
class Attempts:
    def __init__(self):
        self.count = 0

    def next(self):
        self.count += 1
        return self.count


@tray.remote
def crash_until(counter, succeed_on):
    if tray.get(counter.next.remote()) < succeed_on:
        os._exit(1)
    return "survived"


@pytest.mark.parametrize("num_nodes", [1, 3])
def test_worker_crash_is_retried_then_succeeds(num_nodes):
    tray.init(backend="sim", num_nodes=num_nodes, seed=5)
    try:
        counter = Attempts.remote()
        assert tray.get(crash_until.options(max_retries=3).remote(counter, 3)) == "survived"
        assert tray.get(counter.next.remote()) == 4  # ran exactly 3 times
    finally:
        tray.shutdown()


def test_worker_crash_exhausts_retries():
    tray.init(backend="sim", seed=6)
    try:
        counter = Attempts.remote()
        with pytest.raises(tex.WorkerCrashedError) as info:
            tray.get(crash_until.options(max_retries=1).remote(counter, 100))
        assert "max_retries=1" in str(info.value)
        assert tray.get(counter.next.remote()) == 3  # 1 + max_retries attempts
        # The cluster (and this process) are still fine.
        assert tray.get(crash_until.remote(counter, 0)) == "survived"
    finally:
        tray.shutdown()


def test_a_shutdown_that_cannot_finish_leaves_no_run_behind(monkeypatch):
    # Regression: a simulated cluster whose shutdown failed left its trio
    # guest run installed, and every later tray.init(backend="sim") in the
    # process failed with "Attempted to call run() from inside a run()" (one
    # failing test became 245 errors in CI).
    from tray.backends.sim import patches as sim_patches
    from tray.exceptions import TrayError

    tray.init(backend="sim", seed=1)
    cluster = sim_patches._active["cluster"]

    def stalled(condition, what):
        raise TrayError(f"the simulation stalled during {what}")

    monkeypatch.setattr(cluster, "_pump", stalled)
    with pytest.raises(TrayError, match="stalled during shutdown"):
        tray.shutdown()
    monkeypatch.undo()
    tray.init(backend="sim", seed=2)
    try:
        assert tray.get(tray.put(5)) == 5
    finally:
        tray.shutdown()
