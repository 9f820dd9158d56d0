"""Concurrent actors, as Ray's: async actors run their methods on asyncio,
threaded actors (max_concurrency > 1) run synchronous methods in threads on
real processes, concurrency groups split the slots, and neither kind keeps
the callers' order."""

from __future__ import annotations

import asyncio
import time

import pytest

import tray
import tray.simtest


@tray.remote
def later(value, sleep_s: float):
    time.sleep(sleep_s)
    return value


@tray.remote
class AsyncService:
    def __init__(self):
        self.event = None

    async def sleepy_double(self, x, sleep_s: float):
        await asyncio.sleep(sleep_s)  # asyncio, not trio
        return 2 * await later.remote(x, 0.0)  # an ObjectRef awaited from asyncio code

    async def gathered(self, n: int):
        return await asyncio.gather(*[self.sleepy_double(i, 0.1) for i in range(n)])

    async def wait_for_event(self):
        self.event = self.event or asyncio.Event()
        await self.event.wait()
        return "woke"

    async def set_event(self):
        self.event = self.event or asyncio.Event()
        self.event.set()
        return "set"

    async def loop_kind(self):
        return type(asyncio.get_running_loop()).__name__


def test_async_actor_methods_run_on_asyncio(one_node):
    service = AsyncService.remote()
    assert tray.get(service.sleepy_double.remote(5, 0.2)) == 10
    assert tray.get(service.gathered.remote(3)) == [0, 2, 4]
    waiting = service.wait_for_event.remote()
    assert tray.get(service.set_event.remote()) == "set"
    assert tray.get(waiting, timeout=30) == "woke"
    assert "Loop" in tray.get(service.loop_kind.remote())


def test_asyncio_in_the_simulator_is_on_virtual_time_and_replays():
    digests = []
    for _ in range(2):
        tray.init(backend="sim", seed=4)
        try:
            service = AsyncService.remote()
            start = time.time()
            assert tray.get(service.sleepy_double.remote(1, 3600.0)) == 2  # an hour, virtually
            assert time.time() - start < 60
            digests.append(tray.simtest.trace_digest())
        finally:
            tray.shutdown()
    assert digests[0] == digests[1]


@tray.remote
class Reordered:
    async def echo(self, value):
        return value


def test_a_concurrent_actor_does_not_hold_calls_back_for_an_earlier_one(one_node):
    # As Ray's async and threaded actors: a call runs as soon as it can.
    actor = Reordered.remote()
    assert tray.get(actor.echo.remote("up")) == "up"  # its worker has started
    slow = actor.echo.remote(later.remote("slow", 10 * one_node.tick_s))
    fast = actor.echo.remote("fast")
    assert tray.get(fast) == "fast"
    ready, _ = tray.wait([slow], timeout=0)
    assert ready == []  # still waiting for its argument: fast did not wait for it
    assert tray.get(slow) == "slow"


@tray.remote(max_concurrency=2)
class Threaded:
    def __init__(self):
        import threading

        self.event = threading.Event()
        self.running = 0
        self.peak = 0

    def wait_for_event(self):
        return "woke" if self.event.wait(timeout=30) else "timed out"

    def set_event(self):
        self.event.set()
        return tray.get(later.remote("set", 0.0))  # tray calls work from a method's thread

    def busy(self, sleep_s: float):
        self.running += 1
        self.peak = max(self.peak, self.running)
        time.sleep(sleep_s)
        self.running -= 1
        return self.peak


def test_threaded_actor_runs_methods_in_threads(local_node):
    # Each call in a thread of its own: a call blocked on a threading.Event
    # does not stop the call that sets it (it deadlocked before).
    actor = Threaded.remote()
    waiting = actor.wait_for_event.remote()
    assert tray.get(actor.set_event.remote(), timeout=30) == "set"
    assert tray.get(waiting, timeout=30) == "woke"
    peaks = tray.get([actor.busy.remote(0.5) for _ in range(4)])
    assert max(peaks) == 2  # max_concurrency threads, no more


@tray.remote(max_concurrency=4)
class Burst:
    def whoami(self, i: int):
        import threading

        if i % 50 == 7:
            raise ValueError(f"call {i} fails")
        return (i, tray.get_runtime_context().get_task_id(), threading.current_thread().name)

    def method_threads(self):
        import threading

        return sorted(t.name for t in threading.enumerate() if t.name.startswith("tray method"))


def test_a_burst_of_threaded_calls_each_gets_its_own_result_from_at_most_max_concurrency_threads(
        local_node):
    # The worker's method threads deliver results to the loop in batches:
    # each call must still get its own result (or its own error), run with
    # its own task context, and the threads stay within max_concurrency.
    actor = Burst.remote()
    refs = [actor.whoami.remote(i) for i in range(300)]
    task_ids = set()
    for i, ref in enumerate(refs):
        if i % 50 == 7:
            with pytest.raises(ValueError, match=f"call {i} fails"):
                tray.get(ref, timeout=60)
            continue
        index, task_id, thread = tray.get(ref, timeout=60)
        assert index == i and thread.startswith("tray method thread")
        task_ids.add(task_id)
    assert len(task_ids) == 300 - 6  # a context of its own per call
    threads = tray.get(actor.method_threads.remote(), timeout=60)
    assert 1 <= len(threads) <= 4, threads


def test_threaded_actor_in_the_simulator_interleaves_where_methods_block():
    # The simulator has no threads: synchronous methods run inline, and
    # interleave where they block in tray (time.sleep is virtual, get waits).
    tray.init(backend="sim", seed=1)
    try:
        actor = Threaded.remote()
        assert max(tray.get([actor.busy.remote(1.0) for _ in range(4)])) == 2
    finally:
        tray.shutdown()


@tray.remote(concurrency_groups={"io": 2, "compute": 1})
class Grouped:
    def __init__(self):
        self.running = {}
        self.peak = {}

    async def _work(self, group: str):
        self.running[group] = self.running.get(group, 0) + 1
        self.peak[group] = max(self.peak.get(group, 0), self.running[group])
        await asyncio.sleep(0.3)
        self.running[group] -= 1
        return group

    @tray.method(concurrency_group="io")
    async def io(self):
        return await self._work("io")

    @tray.method(concurrency_group="compute")
    async def compute(self):
        return await self._work("compute")

    async def peaks(self):
        return self.peak


def test_concurrency_groups_limit_each_group(one_node):
    actor = Grouped.remote()
    refs = [actor.io.remote() for _ in range(5)] + [actor.compute.remote() for _ in range(3)]
    refs.append(actor.compute.options(concurrency_group="io").remote())  # runs as io
    assert tray.get(refs) == ["io"] * 5 + ["compute"] * 4
    peaks = tray.get(actor.peaks.remote())
    assert peaks["io"] == 2 and peaks["compute"] <= 2


def test_a_method_may_only_name_a_declared_group(one_node):
    @tray.remote(concurrency_groups={"io": 1})
    class Undeclared:
        @tray.method(concurrency_group="gpu")
        async def f(self):
            return 1

    with pytest.raises(ValueError, match="does not declare"):
        Undeclared.remote()
    with pytest.raises(ValueError, match="concurrency_groups"):
        Grouped.options(concurrency_groups={"io": 0})
    actor = Grouped.remote()
    with pytest.raises(tray.exceptions.ActorError, match="no concurrency group 'gpu'"):
        tray.get(actor.io.options(concurrency_group="gpu").remote())


@tray.remote
def _seven():
    return 7


@tray.remote
class _Blocking:
    def __init__(self):
        self.ticks = 0

    async def blocking_get(self):
        # Ray allows blocking calls in async methods (with a warning): a
        # get, a submission and the internal key-value store, from the
        # method's own code.
        from tray.experimental import internal_kv

        internal_kv._internal_kv_put("blocking", b"kv")
        return tray.get(_seven.remote()), internal_kv._internal_kv_get("blocking")

    async def ticker(self):
        for _ in range(20):
            self.ticks += 1
            await asyncio.sleep(0.01)

    async def get_while_ticking(self, seconds):
        @tray.remote
        def slow(s):
            import time
            time.sleep(s)
            return "done"

        before = self.ticks
        value = tray.get(slow.remote(seconds))
        return value, self.ticks - before


def test_a_blocking_get_inside_an_async_method_works(one_node):
    # It failed with greenback's "You must create a greenback portal" error.
    actor = _Blocking.remote()
    assert tray.get(actor.blocking_get.remote(), timeout=60) == (7, b"kv")


def test_a_blocking_get_suspends_only_its_own_method(one_node):
    # tray suspends the method's asyncio task (Ray blocks the actor's whole
    # event loop): the actor's other calls go on meanwhile.
    actor = _Blocking.remote()
    ticking = actor.ticker.remote()
    value, ticked = tray.get(actor.get_while_ticking.remote(0.3), timeout=60)
    tray.get(ticking)
    assert value == "done"
    assert ticked > 0, "the ticker did not run while the get waited"
