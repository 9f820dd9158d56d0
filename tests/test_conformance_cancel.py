"""Cancelling a ref this process borrowed (created by another process)
cancels the task through its owner, as Ray's (Ray's test_cancel.py); a
cancel that reaches a worker before the task has started there is sent
again until the task ends. Actor calls follow Ray's rules for actor tasks:
one still waiting is never run, an async method's asyncio task is
cancelled, and a running synchronous method runs on."""

from __future__ import annotations

import asyncio
import time

import pytest

import tray
import tray.exceptions as tex


@tray.remote
def sleeper(seconds, value="slept"):
    time.sleep(seconds)
    return value


@tray.remote
def cancel_it(refs):
    tray.cancel(refs[0])  # a ref this task borrowed from the driver
    return "cancel sent"


def test_borrower_cancels_a_task_through_its_owner(cluster):
    slow = sleeper.remote(60 * cluster.tick_s)
    assert tray.get(cancel_it.remote([slow])) == "cancel sent"
    with pytest.raises(tex.TaskCancelledError):
        tray.get(slow, timeout=30 * cluster.tick_s)


@tray.remote
def start_slow(seconds):
    return [sleeper.remote(seconds)]  # owned by this task's worker


def test_driver_cancels_a_ref_owned_by_a_worker(one_node):
    [inner] = tray.get(start_slow.remote(60 * one_node.tick_s))
    tray.cancel(inner)
    with pytest.raises(tex.TaskCancelledError):
        tray.get(inner, timeout=30 * one_node.tick_s)


@tray.remote
class Starter:
    def start(self, seconds):
        return [sleeper.remote(seconds)]

    def start_call(self, other, seconds):
        return [other.nap.remote(seconds)]


@tray.remote
class Napper:
    def nap(self, seconds):
        time.sleep(seconds)
        return "napped"


def test_driver_cancels_a_ref_owned_by_an_actor(one_node):
    starter = Starter.remote()
    [inner] = tray.get(starter.start.remote(60 * one_node.tick_s))
    tray.cancel(inner, force=True)
    with pytest.raises(tex.TaskCancelledError):
        tray.get(inner, timeout=30 * one_node.tick_s)


def test_force_on_a_borrowed_actor_call_is_refused_by_its_owner():
    tray.init(backend="sim", num_cpus=4)
    starter, napper = Starter.remote(), Napper.remote()
    [call] = tray.get(starter.start_call.remote(napper, 5.0))
    with pytest.raises(ValueError, match="force=True is not supported for actor tasks"):
        tray.cancel(call, force=True)
    assert tray.get(call) == "napped"


def test_cancelling_a_finished_borrowed_ref_changes_nothing():
    tray.init(backend="sim")
    [inner] = tray.get(start_slow.remote(0.0))
    assert tray.get(inner) == "slept"
    tray.cancel(inner)
    assert tray.get(inner) == "slept"




def test_cancel_between_dequeue_and_push_never_runs_the_task(monkeypatch):
    """Regression (CI, 2026-11-23): a cancel that landed after the submitter
    took the task off its queue for a free lease, and before the push began,
    failed an assertion that ended the owner's process (its refs then raised
    OwnerDiedError). The task must stay cancelled, unsent, and the lease
    serve the next task."""
    from tray.core.context import get_worker
    from tray.core.ids import ObjectID
    from tray.core.worker.normal_task_submitter import NormalTaskSubmitter

    tray.init(backend="sim", seed=3, num_cpus=1)
    try:
        worker = get_worker()
        original = NormalTaskSubmitter._push
        cancelled = []

        async def push_after_a_cancel(self, key, queue, lease, task):
            if task.spec.name.endswith("sleeper") and not cancelled:
                task_id = ObjectID(task.spec.return_ids[0]).task_id()
                cancelled.append(task_id)
                await worker.canceller._cancel_owned(task_id, False, False)
            await original(self, key, queue, lease, task)

        monkeypatch.setattr(NormalTaskSubmitter, "_push", push_after_a_cancel)
        victim = sleeper.remote(0.5, "ran")
        with pytest.raises(tex.TaskCancelledError):
            tray.get(victim, timeout=10)
        assert cancelled == [victim.task_id()]
        assert tray.get(sleeper.remote(0.1, "next"), timeout=10) == "next"
    finally:
        tray.shutdown()


@tray.remote
class _AsyncSleeper:
    def __init__(self):
        self.seen = []

    async def sleep_long(self):
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            self.seen.append("CancelledError")
            raise
        return "slept"

    async def seen_so_far(self):
        return self.seen


def _cancel_while_running(ref, running_for_s: float = 0.3) -> None:
    ready, _ = tray.wait([ref], timeout=running_for_s)
    assert ready == []  # still running
    tray.cancel(ref)
    with pytest.raises(tex.TaskCancelledError):
        tray.get(ref, timeout=60)


def _eventually(fn, expected):
    for _ in range(200):
        value = fn()
        if value == expected:
            return value
        time.sleep(0.05)
    return value


def test_cancelling_a_running_async_method_cancels_its_asyncio_task(one_node):
    actor = _AsyncSleeper.remote()
    assert tray.get(actor.seen_so_far.remote(), timeout=60) == []
    _cancel_while_running(actor.sleep_long.remote(), 0.5)
    # The caller's get fails as soon as the owner knows; the actor hears of
    # it just after, and the method sees asyncio's CancelledError.
    seen = _eventually(lambda: tray.get(actor.seen_so_far.remote(), timeout=60),
                       ["CancelledError"])
    assert seen == ["CancelledError"]


@tray.remote
class _Ledger:
    def __init__(self):
        self.entries = []

    def slow(self, seconds):
        time.sleep(seconds)
        self.entries.append("slow finished")
        return "slow"

    def record(self, entry):
        self.entries.append(entry)
        return entry

    def read(self):
        return self.entries

    def until_cancelled(self):
        # Runs on (not interrupted) until it sees the cancel, as Ray allows.
        assert tray.get_runtime_context().is_canceled() is False
        for _ in range(2000):
            if tray.get_runtime_context().is_canceled():
                self.entries.append("saw the cancel")
                return "stopped"
            time.sleep(0.01)
        self.entries.append("never saw the cancel")
        return "timed out"


def test_a_running_sync_method_runs_on_and_a_cancelled_call_behind_it_never_runs(one_node):
    actor = _Ledger.remote()
    assert tray.get(actor.read.remote(), timeout=60) == []
    running = actor.slow.remote(1.0)
    ready, _ = tray.wait([running], timeout=0.3)
    assert ready == []  # running
    queued = actor.record.remote("queued")  # waits for its turn behind slow
    tray.cancel(running)
    tray.cancel(queued)
    for ref in (running, queued):
        with pytest.raises(tex.TaskCancelledError):
            tray.get(ref, timeout=60)
    # slow was not interrupted (the actor's state stays whole); the call
    # waiting behind it never ran; later calls run as usual.
    assert tray.get(actor.record.remote("after"), timeout=60) == "after"
    assert tray.get(actor.read.remote(), timeout=60) == ["slow finished", "after"]


def _sees_its_cancel(actor) -> None:
    assert tray.get(actor.read.remote(), timeout=60) == []
    _cancel_while_running(actor.until_cancelled.remote())
    entries = _eventually(lambda: tray.get(actor.read.remote(), timeout=60),
                          ["saw the cancel"])
    assert entries == ["saw the cancel"]


def test_a_running_sync_method_can_see_that_it_was_cancelled(one_node):
    _sees_its_cancel(_Ledger.remote())
    with pytest.raises(RuntimeError, match="inside a task"):
        tray.get_runtime_context().is_canceled()  # the driver runs no task


def test_a_threaded_actors_method_sees_its_cancel_from_its_own_thread(local_node):
    _sees_its_cancel(_Ledger.options(max_concurrency=2).remote())
