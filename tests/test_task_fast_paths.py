"""The task path's fast paths: a driver keeps an idle lease for a moment
(its next task takes it instead of a new lease), and ``get`` from the
driver's script of objects it owns that are not ready yet waits on a
condition of its own instead of a round trip through the loop. These tests
check what they must not change: values, errors (the first failure fails a
``get`` at once), timeouts, stored results, refs owned elsewhere, and that
the leases go back."""

from __future__ import annotations

import time

import numpy as np
import pytest

import tray
import tray.exceptions as tex
import tray.simtest
from tray.api import state
from tray.core.context import driver
from tray.core.worker.normal_task_submitter import LEASE_IDLE_KEEP_S

GET_TIMEOUT_S = 120.0  # a bound on a test that would otherwise hang, not a speed goal


@tray.remote
def echo(x):
    return x


@tray.remote
def fail(message):
    raise ValueError(message)


@tray.remote
def sleep_then(x, seconds):
    time.sleep(seconds)
    return x


@tray.remote
def big():
    return np.ones(1_000_000)


@tray.remote
def inner_ref():
    return [tray.put("inside")]


@tray.remote
def fan_out(width):
    return sum(tray.get([echo.remote(i) for i in range(width)]))


@tray.remote
def fan_out_of_fan_outs():
    return sum(tray.get([fan_out.remote(10) for _ in range(10)]))


def _events(name: str) -> list:
    return [event for event in tray.simtest.cluster().trace.events if event["event"] == name]


# ------------------------------------------------------- kept leases (sim)

def test_driver_sync_loop_reuses_one_lease():
    tray.init(backend="sim", seed=11, num_cpus=2)
    try:
        for i in range(20):
            assert tray.get(echo.remote(i)) == i
        # Without the kept lease: a lease granted and returned per task.
        assert len(_events("lease_granted")) <= 2
        worker = driver()
        assert worker.normal_submitter.queues  # kept idle for the next task
        time.sleep(LEASE_IDLE_KEEP_S * 50)  # virtual time: the kept lease's time runs out
        assert not worker.normal_submitter.queues
        assert len(_events("lease_returned")) == len(_events("lease_granted"))
    finally:
        tray.shutdown()


def test_a_sync_loop_keeps_one_reaper_that_never_wakes_while_the_lease_is_used(monkeypatch):
    # A reaper task per idle spell was spawned (and woken) about once per
    # task of a sync loop; now one sleeps until the kept lease is due, and
    # its deadline moves with the lease.
    from tray.core.worker import normal_task_submitter

    runs = {"started": 0, "returned": 0}
    reap = normal_task_submitter.NormalTaskSubmitter._reap_idle
    return_lease = normal_task_submitter.NormalTaskSubmitter._return_lease

    async def counted_reap(self, key, queue):
        runs["started"] += 1
        await reap(self, key, queue)

    def counted_return(self, queue, lease, worker_ok):
        runs["returned"] += 1
        return_lease(self, queue, lease, worker_ok)

    monkeypatch.setattr(normal_task_submitter.NormalTaskSubmitter, "_reap_idle", counted_reap)
    monkeypatch.setattr(normal_task_submitter.NormalTaskSubmitter, "_return_lease",
                        counted_return)
    tray.init(backend="sim", seed=11, num_cpus=2)
    try:
        for i in range(50):
            assert tray.get(echo.remote(i)) == i
        assert runs == {"started": 1, "returned": 0}
        (queue,) = driver().normal_submitter.queues.values()
        (lease,) = queue.leases
        assert queue.reaper.deadline == lease.idle_since + LEASE_IDLE_KEEP_S
        time.sleep(LEASE_IDLE_KEEP_S * 50)  # virtual time: the kept lease goes back, the reaper ends
        assert runs == {"started": 1, "returned": 1} and queue.reaper is None
        assert not driver().normal_submitter.queues
    finally:
        tray.shutdown()


def test_workers_return_their_idle_leases_at_once():
    """A task's children are a fan-out that ends with it: their leases go
    back as soon as the class runs dry, never kept idle in a worker."""
    tray.init(backend="sim", seed=12, num_cpus=2)
    try:
        for _ in range(3):
            assert tray.get(fan_out.remote(5)) == 10
        workers = [process.component for process in tray.simtest.cluster().processes.values()
                   if getattr(process.component, "mode", None) == "worker"]
        assert workers
        for worker in workers:
            for queue in worker.normal_submitter.queues.values():
                assert all(lease.busy for lease in queue.leases)
        # The driver's own task lease may be kept; every other was returned.
        granted, returned = len(_events("lease_granted")), len(_events("lease_returned"))
        assert granted - returned <= 1
    finally:
        tray.shutdown()


def test_sim_replays_with_kept_leases():
    def run() -> str:
        tray.init(backend="sim", seed=13, num_cpus=2)
        try:
            for i in range(10):
                tray.get(echo.remote(i))
            time.sleep(LEASE_IDLE_KEEP_S / 2)
            tray.get([echo.remote(i) for i in range(10)])
            tray.get(fan_out.remote(4))
            return tray.simtest.trace_digest()
        finally:
            tray.shutdown()

    assert run() == run()


# --------------------------------------------- get from the driver's thread

@pytest.fixture
def local():
    tray.init(backend="local", num_cpus=2, include_dashboard=False)
    try:
        yield
    finally:
        tray.shutdown()


def test_sync_loop_gets_without_entering_the_loop(local, monkeypatch):
    runtime = state.runtime
    crossings: list = []
    original = runtime.run

    def counted(async_fn, *args):
        crossings.append(async_fn)
        return original(async_fn, *args)

    monkeypatch.setattr(runtime, "run", counted)
    for i in range(30):
        assert tray.get(echo.remote(i)) == i
    assert tray.get([echo.remote(i) for i in range(30)]) == list(range(30))
    assert crossings == []  # every get waited on its own condition


def test_get_of_a_pending_failure_raises_at_once(local):
    slow = sleep_then.remote("slow", GET_TIMEOUT_S * 10)
    with pytest.raises(ValueError, match="boom"):
        # Fails fast: it does not wait for the slow task (it would time out).
        tray.get([slow, fail.remote("boom")], timeout=GET_TIMEOUT_S)
    with pytest.raises(ValueError, match="again"):
        tray.get(fail.remote("again"), timeout=GET_TIMEOUT_S)
    tray.cancel(slow)


def test_get_timeout_then_the_value(local):
    ref = sleep_then.remote("late", 1.0)
    with pytest.raises(tex.GetTimeoutError):
        tray.get(ref, timeout=0.01)
    assert tray.get(ref, timeout=GET_TIMEOUT_S) == "late"
    assert tray.get([ref], timeout=GET_TIMEOUT_S) == ["late"]


def test_stored_results_and_refs_owned_elsewhere_take_the_loop(local):
    value = tray.get(big.remote(), timeout=GET_TIMEOUT_S)
    assert value.shape == (1_000_000,)
    [inner] = tray.get(inner_ref.remote(), timeout=GET_TIMEOUT_S)
    assert tray.get(inner, timeout=GET_TIMEOUT_S) == "inside"
    assert tray.get([echo.remote(1), big.remote()], timeout=GET_TIMEOUT_S)[1].sum() == 1_000_000


# ------------------------------------------- cancelled lease requests (sim)

@tray.remote
def waves(width, count):
    total = 0
    for _ in range(count):
        # Each wave runs dry while its later lease requests still wait at
        # the node: they are cancelled, and the next wave asks anew.
        total += sum(tray.get([echo.remote(i) for i in range(width)]))
    return total


def test_nested_fan_out_takes_no_lease_it_does_not_use():
    tray.init(backend="sim", seed=14, num_cpus=2)
    try:
        for _ in range(3):
            assert tray.get(fan_out_of_fan_outs.remote()) == 10 * 45
        tasks = len(_events("task_started"))
        assert tasks == 3 * (1 + 10 + 100)
        # Without the cancel: nearly a lease per task (331 for 333 in one
        # run), most granted after their owner's queue had run dry.
        assert len(_events("lease_granted")) <= tasks // 2
    finally:
        tray.shutdown()


@pytest.mark.parametrize("seed", [14, 19])
def test_nested_leaves_start_before_every_middle_has(seed):
    """The node grants the deeper of its waiting lease requests first: a
    middle blocked on its leaves gets them running before all of its
    siblings have started (first come, first served started every middle,
    then the first leaf)."""
    tray.init(backend="sim", seed=seed, num_cpus=2)
    try:
        assert tray.get(fan_out_of_fan_outs.remote()) == 10 * 45
        started = [event["name"] for event in _events("task_started")]
        assert started.count("fan_out") == 10 and started.count("echo") == 100
        last_middle = max(i for i, name in enumerate(started) if name == "fan_out")
        assert started.index("echo") < last_middle, started[:24]
    finally:
        tray.shutdown()


def test_a_request_waits_behind_deeper_ones_at_most_a_bound():
    """At the node: the deeper request is offered the freed CPU first, but
    one that has waited DEPTH_FIRST_MAX_WAIT_S goes ahead of all (a stream
    of nested work must not starve a driver's tasks)."""
    import random

    import trio
    import trio.testing

    from tray.core.config import Config
    from tray.core.interfaces import NullTracer
    from tray.core.messages import LeaseRequest
    from tray.core.node import lease_manager
    from tray.core.scheduling import DefaultStrategy

    async def main():
        manager = lease_manager.LeaseManager(
            node_id="n" * 32, address="node", endpoint=None, nursery=None,
            tracer=NullTracer(), config=Config(), resources={"CPU": 1}, rng=random.Random(0),
            pool=None, refresh_view=None, gcs_address="gcs", note_infeasible=None)
        manager.available["CPU"] = 0.0  # the one CPU is leased

        def ask(owner: str, depth: int):
            waiter = lease_manager._Waiter(LeaseRequest(
                resources={"CPU": 1.0}, strategy=DefaultStrategy(), owner=owner, depth=depth))
            manager._queue(waiter)
            return waiter

        def free_one_cpu():
            manager.available["CPU"] = 1.0
            manager._dispatch()

        shallow = ask("driver", 1)
        await trio.sleep(0.1)
        deep, deeper = ask("middle", 2), ask("leaf-owner", 3)
        assert manager.waiting == [deeper, deep, shallow]
        free_one_cpu()
        assert deeper.event.is_set() and not deep.event.is_set()
        # The shallow request has waited the bound, the deep one not yet.
        await trio.sleep(lease_manager.DEPTH_FIRST_MAX_WAIT_S - 0.05)
        manager.available["CPU"] = 0.0
        free_one_cpu()
        assert shallow.event.is_set() and not deep.event.is_set()
        manager.available["CPU"] = 0.0
        free_one_cpu()
        assert deep.event.is_set() and manager.waiting == []

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


@pytest.mark.parametrize("seed", [15, 16, 17])
def test_a_wave_after_cancelled_requests_still_runs(seed):
    tray.init(backend="sim", seed=seed, num_cpus=2)
    try:
        refs = [waves.remote(8, 4) for _ in range(3)]
        assert tray.get(refs) == [4 * 28] * 3
    finally:
        tray.shutdown()


# ------------------------------------------ submissions without a task (sim)

def test_tasks_with_nothing_to_wait_for_are_queued_at_once(monkeypatch):
    from tray.core.worker.normal_task_submitter import NormalTaskSubmitter

    waited: list = []
    original = NormalTaskSubmitter.submit

    async def counted(self, task):
        waited.append(task.spec.name)
        await original(self, task)

    monkeypatch.setattr(NormalTaskSubmitter, "submit", counted)
    tray.init(backend="sim", seed=18, num_cpus=2)
    try:
        assert tray.get(echo.remote(0)) == 0  # the first exports the function
        first = len(waited)
        assert tray.get([echo.remote(i) for i in range(50)]) == list(range(50))
        assert len(waited) == first  # no task of their own
        ref = echo.remote("by ref")
        # A by-reference argument still waits for its object first.
        assert tray.get(echo.remote(ref)) == "by ref"
        assert len(waited) == first + 1
    finally:
        tray.shutdown()


# ------------------------------------------------ pushes without a task (sim)

def test_pushes_over_an_open_connection_start_no_task(monkeypatch):
    from tray.core.worker.normal_task_submitter import NormalTaskSubmitter

    slow_pushes: list = []
    original = NormalTaskSubmitter._push

    async def counted(self, key, queue, lease, task):
        slow_pushes.append(task.spec.name)
        await original(self, key, queue, lease, task)

    monkeypatch.setattr(NormalTaskSubmitter, "_push", counted)
    tray.init(backend="sim", seed=19, num_cpus=2)
    try:
        assert tray.get([echo.remote(i) for i in range(60)]) == list(range(60))
        # Only a lease's first push waits to connect to its worker.
        assert len(slow_pushes) <= 4
        # (A worker that dies under a task pushed this way, and the retry:
        # the mixed chaos sweep kills workers mid-task.)
    finally:
        tray.shutdown()
