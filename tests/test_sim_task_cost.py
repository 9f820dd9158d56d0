"""Simulated work takes simulated time (issue 12, item 7): each task and
actor call is charged a seeded, replayable cost in virtual time."""

from __future__ import annotations

import collections

import pytest

import tray
import tray.simtest


@pytest.fixture(autouse=True)
def _shutdown():
    yield
    if tray.is_initialized():
        tray.shutdown()


def _virtual_s() -> float:
    return tray.simtest.cluster().clock.current_time()


@tray.remote
def quick():
    return 1


@tray.remote
def heavy():
    return 2


def test_a_function_named_in_task_cost_s_costs_about_its_mean():
    tray.init(backend="sim", seed=5, num_cpus=1, task_cost_s={"default": 0.0, "heavy": 2.0})
    tray.get(quick.remote())  # (a worker is up: startup is not measured below)
    start = _virtual_s()
    assert tray.get(quick.remote()) == 1
    assert _virtual_s() - start < 0.1  # free
    start = _virtual_s()
    assert tray.get(heavy.remote()) == 2
    took = _virtual_s() - start
    assert 1.0 <= took < 3.2, took  # 2 s * jitter in [0.5, 1.5), plus messages


def test_the_cost_of_an_execution_replays_and_varies_between_tasks():
    def run() -> tuple[list, str]:
        tray.init(backend="sim", seed=11, num_cpus=1, task_cost_s=1.0)
        spans = []
        for _ in range(3):
            start = _virtual_s()
            tray.get(quick.remote())
            spans.append(round(_virtual_s() - start, 9))
        digest = tray.simtest.trace_digest()
        tray.shutdown()
        return spans, digest

    first, second = run(), run()
    assert first == second
    assert len(set(first[0][1:])) == 2  # jittered per task, not one constant


def test_load_spreads_over_nodes_as_on_real_machines():
    # Free user code let the two actors on the driver's node answer a wait
    # loop ten times more often than the two on the other node (14:137).
    tray.init(backend="sim", num_nodes=2, num_cpus=2, seed=3)

    @tray.remote(num_cpus=1)
    class Runner:
        def __init__(self, i):
            self.i = i

        def rollout(self):
            return self.i

    runners = [Runner.remote(i) for i in range(4)]
    tray.get([r.__ray_ready__.remote() for r in runners])
    pending = {r.rollout.remote(): r for r in runners}
    counts = collections.Counter()
    for _ in range(300):
        [done], _ = tray.wait(list(pending), num_returns=1)
        runner = pending.pop(done)
        counts[tray.get(done)] += 1
        pending[runner.rollout.remote()] = runner
    assert max(counts.values()) < 1.5 * min(counts.values()), counts


@pytest.mark.parametrize("bad", [-1.0, float("nan"), "1", True, {"f": -2}, {3: 1.0}])
def test_bad_task_costs_are_refused(bad):
    with pytest.raises(ValueError, match="task_cost_s"):
        tray.init(backend="sim", seed=1, task_cost_s=bad)
    assert not tray.is_initialized()
