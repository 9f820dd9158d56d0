"""The driver's call path: ``.remote()`` and small ``put`` from the user's
thread queue their work for the loop (``worker/thread_inbox``) and never wait
for it; ``get`` of an object already in the driver's memory reads it without
entering the loop. These tests check what that must not change: every
submission runs once, refs stay distinct and counted (no leak, no early
free), user errors still raise at the call, and order holds across threads."""

from __future__ import annotations

import gc
import sys
import threading
import time

import numpy as np
import pytest
from polling import wait_for  # (tests/ is on sys.path)

import tray
import tray.exceptions as tex
from tray.api import state
from tray.api.blocking import in_loop
from tray.backends.local import _thread_condition
from tray.core.context import driver
from tray.core.worker.thread_inbox import ThreadInbox

THREAD_JOIN_S = 60.0  # a bound on a test that would otherwise hang, not a speed goal


@tray.remote
def echo(x):
    return x


@tray.remote
def fail(message):
    raise ValueError(message)


@tray.remote
class Counter:
    def __init__(self):
        self.calls = []

    def add(self, x):
        self.calls.append(x)
        return x

    def seen(self):
        return list(self.calls)


@tray.remote
class Slow:
    def slow_echo(self, x):
        time.sleep(0.3)
        return x


def _driver():
    return driver()


def _driver_objects() -> int:
    # Read on the loop: the local driver's tables change there meanwhile.
    worker = _driver()
    return in_loop(worker, worker.statistics).references.objects


def _settle() -> None:
    gc.collect()
    time.sleep(0.2)  # in the simulator: virtual time, letting the frees through


@pytest.fixture
def local():
    tray.init(backend="local", num_cpus=2, include_dashboard=False)
    try:
        yield
    finally:
        tray.shutdown()


# ------------------------------------------------------------ both backends

def test_dropped_refs_are_freed_and_kept_refs_are_not(one_node):
    kept = [echo.remote(i) for i in range(50)]
    for i in range(200):
        echo.remote(i)  # dropped at once
        tray.put(i)  # dropped at once
    assert tray.get(kept) == list(range(50))
    wait_for(lambda: (_settle(), _driver_objects() == 50)[1],
             "the dropped refs to be freed (only the 50 kept remain)")
    assert tray.get(kept) == list(range(50))  # never freed early
    del kept
    wait_for(lambda: (_settle(), _driver_objects() == 0)[1], "every ref to be freed")


def test_user_errors_still_raise_at_remote(one_node):
    with pytest.raises(TypeError, match="Could not serialize the argument #0"):
        echo.remote(threading.Lock())
    with pytest.raises(TypeError, match="echo.remote()"):
        echo.remote(1, 2)
    with pytest.raises(ValueError, match="num_returns"):
        echo.options(num_returns=-1).remote(1)
    with pytest.raises(TypeError, match="put\\(\\) on an ObjectRef"):
        tray.put(echo.remote(1))
    with pytest.raises(TypeError, match="Could not serialize"):
        tray.put(threading.Lock())
    counter = Counter.remote()
    with pytest.raises(TypeError, match="Could not serialize the argument #0"):
        counter.add.remote(threading.Lock())
    # Nothing half-submitted is left behind: the actor saw only good calls.
    assert tray.get(counter.add.remote(1)) == 1
    assert tray.get(counter.seen.remote()) == [1]


def test_max_pending_calls_still_refused_at_remote(one_node):
    slow = Slow.options(max_pending_calls=2).remote()
    pending = [slow.slow_echo.remote(x) for x in range(2)]
    with pytest.raises(tex.PendingCallsLimitExceeded, match="max_pending_calls=2"):
        slow.slow_echo.remote(2)
    assert tray.get(pending) == [0, 1]


def test_ready_values_and_errors_read_again(one_node):
    ref = tray.put({"a": 1})
    assert tray.get(ref) == {"a": 1}
    assert tray.get(ref) == {"a": 1}  # ready and in the driver's memory now
    assert tray.get([ref, ref]) == [{"a": 1}, {"a": 1}]
    bad = fail.remote("boom")
    for _ in range(2):  # the second read is the ready path's
        with pytest.raises(ValueError, match="boom"):
            tray.get(bad)
    with pytest.raises(ValueError, match="boom"):
        tray.get([ref, bad])
    # A ref inside a value goes through the loop (it must be registered).
    outer = tray.put([ref])
    inner = tray.get(outer)[0]
    assert tray.get(inner) == {"a": 1}


def test_large_arguments_and_puts_still_go_to_the_store(one_node):
    big = np.arange(100_000, dtype=np.float64)  # 800 kB: above the inline limit
    ref = tray.put(big)
    assert float(tray.get(ref).sum()) == float(big.sum())
    assert float(tray.get(echo.remote(big)).sum()) == float(big.sum())


def test_actor_calls_run_in_submission_order(one_node):
    counter = Counter.remote()
    refs = [counter.add.remote(i) for i in range(300)]
    assert tray.get(refs) == list(range(300))
    assert tray.get(counter.seen.remote()) == list(range(300))


def test_sim_replays_with_queued_path_code():
    """The simulator's driver runs the loop in its own thread: its
    submissions happen in the call, in a deterministic order, as before."""
    import tray.simtest

    def run() -> str:
        tray.init(backend="sim", seed=7, num_cpus=2)
        try:
            counter = Counter.remote()
            refs = [echo.remote(i) for i in range(30)]
            refs += [counter.add.remote(i) for i in range(30)]
            tray.get(refs)
            tray.get(tray.put(5))
            return tray.simtest.trace_digest()
        finally:
            tray.shutdown()

    assert run() == run()


# ------------------------------------------------ the local backend's driver

def test_two_threads_submitting_at_once(local):
    per_thread = 400
    results: dict = {}
    counter = Counter.remote()

    def submit(name: str, base: int) -> None:
        refs = [echo.remote(base + i) for i in range(per_thread)]
        refs += [counter.add.remote(base + i) for i in range(per_thread)]
        refs += [tray.put(base + i) for i in range(per_thread)]
        results[name] = refs

    threads = [threading.Thread(target=submit, args=(name, base))
               for name, base in (("a", 0), ("b", 100_000))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(THREAD_JOIN_S)
    all_refs = results["a"] + results["b"]
    assert len(set(all_refs)) == len(all_refs) == 6 * per_thread  # distinct ids
    for name, base in (("a", 0), ("b", 100_000)):
        expected = list(range(base, base + per_thread))
        assert tray.get(results[name]) == expected * 3
    # Each thread's calls reached the actor in that thread's order.
    seen = tray.get(counter.seen.remote())
    assert sorted(seen) == list(range(per_thread)) + list(range(100_000, 100_000 + per_thread))
    for base in (0, 100_000):
        mine = [x for x in seen if base <= x < base + per_thread]
        assert mine == list(range(base, base + per_thread))


def test_submissions_are_queued_not_waited_for(local):
    before = _driver().inbox.statistics().ops
    refs = [echo.remote(i) for i in range(200)]
    assert tray.get(refs) == list(range(200))
    after = _driver().inbox.statistics()
    assert after.ops - before >= 200  # every submission went through the queue
    assert after.batches <= after.ops


def test_ref_dropped_in_another_thread_after_submission(local):
    handed: list = []
    ready = threading.Event()

    def drop_later() -> None:
        ready.wait(THREAD_JOIN_S)
        handed.clear()  # the last reference goes here, in this thread

    thread = threading.Thread(target=drop_later)
    thread.start()
    handed.extend(echo.remote(i) for i in range(100))
    ready.set()
    thread.join(THREAD_JOIN_S)
    assert not handed
    wait_for(lambda: (_settle(), _driver_objects() == 0)[1], "the handed-over refs to be freed")


def _while_the_loop_is_held(read, then=lambda: None):
    """[what ``read()`` returned in another thread] while the driver's loop
    is held (only a call that does not enter it returns), and ``then()``'s
    result, called before the loop is let go."""
    release = threading.Event()
    state.runtime.call_soon(lambda: release.wait(THREAD_JOIN_S))
    try:
        got: list = []
        reader = threading.Thread(target=lambda: got.append(read()))
        reader.start()
        reader.join(THREAD_JOIN_S)
        return got, then()
    finally:
        release.set()


def test_get_of_a_ready_object_does_not_wait_for_a_busy_loop(local):
    ref = tray.put("ready")
    result_ref = echo.remote("done")
    assert tray.get([ref, result_ref]) == ["ready", "done"]
    got, late = _while_the_loop_is_held(
        lambda: tray.get([ref, result_ref]),
        then=lambda: echo.remote("queued while the loop was busy"))  # queued, not waited for
    assert got == [["ready", "done"]]
    assert tray.get(late) == "queued while the loop was busy"


@tray.remote
def nap(seconds, x):
    time.sleep(seconds)
    return x


def _known_to_the_loop(refs) -> None:
    """Wait until the loop has registered these refs (submissions from the
    user's thread are queued): until then ``wait`` takes the loop's path."""
    table = _driver().references.refs
    wait_for(lambda: all(ref._id in table for ref in refs), "the submissions to be registered")


def _no_wait_on_the_loop(monkeypatch) -> None:
    def refused(*args):
        raise AssertionError("wait() went through the loop")
    monkeypatch.setattr(_driver(), "wait_async", refused)


def test_wait_for_a_ready_ref_does_not_wait_for_a_busy_loop(local):
    ready = tray.put("ready")
    pending = nap.remote(30, "late")
    assert tray.get(ready) == "ready"
    _known_to_the_loop([pending])
    got, _ = _while_the_loop_is_held(lambda: tray.wait([pending, ready]))
    assert got == [([ready], [pending])]
    tray.cancel(pending, force=True)


def test_a_wait_that_finds_too_few_ready_sleeps_in_its_thread_until_the_loop_wakes_it(
        local, monkeypatch):
    """Refs this driver owns: the user's thread waits on a condition of its
    own, and the loop wakes it when enough are ready (no ``from_thread``
    call into the loop, no callback parked on each ref's entry)."""
    slow = nap.remote(30, "slow")
    fast = [nap.remote(0.3, i) for i in range(2)]
    refs = [slow, *fast]
    _known_to_the_loop(refs)
    _no_wait_on_the_loop(monkeypatch)
    ready, rest = tray.wait(refs, num_returns=2, timeout=THREAD_JOIN_S)
    assert ready == fast and rest == [slow]  # in list order
    assert tray.get(fast) == [0, 1]
    assert all(entry.event is None or not entry.event._callbacks
               for entry in list(_driver().references.refs.values()))
    wait_for(lambda: not _driver().references.ready_listeners, "the listener to go")
    # A timeout answers with what is ready then, and takes the listener back.
    assert tray.wait([slow, *fast], num_returns=3, timeout=0.2) == (fast, [slow])
    assert tray.wait([slow], timeout=0.2) == ([], [slow])
    wait_for(lambda: not _driver().references.ready_listeners, "the listener to go")
    tray.cancel(slow, force=True)


def test_a_wait_loop_over_many_refs_in_the_driver_s_thread_returns_each_once(local):
    refs = [nap.remote(0.001 * (i % 5), i) for i in range(300)]
    not_ready, seen = refs, []
    while not_ready:
        ready, not_ready = tray.wait(not_ready, timeout=THREAD_JOIN_S)
        assert len(ready) == 1
        seen.extend(ready)
    assert sorted(tray.get(seen)) == list(range(300))
    wait_for(lambda: not _driver().references.ready_listeners, "the listeners to go")


def test_a_wait_on_refs_owned_elsewhere_goes_through_the_loop(local, monkeypatch):
    @tray.remote
    def make():
        return [tray.put(i) for i in range(3)]

    inner = tray.get(make.remote())  # owned by the worker that made them
    waited_on_the_loop: list = []
    worker = _driver()
    on_loop = worker.wait_async

    async def spy(*args):
        waited_on_the_loop.append(len(args[0]))
        return await on_loop(*args)

    monkeypatch.setattr(worker, "wait_async", spy)
    ready, rest = tray.wait(inner, num_returns=3, timeout=THREAD_JOIN_S)
    assert ready == inner and rest == []
    assert waited_on_the_loop == [3]


def test_the_loop_counts_a_wait_again_when_an_object_became_ready_after_the_thread_looked(
        local):
    """The thread reads ``ready_generation`` before it looks at the entries;
    the loop recounts only when an object was made ready since, and
    otherwise trusts the thread's count."""
    from tray.core.worker.thread_waits import ThreadWait

    worker = _driver()
    refs = [tray.put(i) for i in range(3)]
    _known_to_the_loop(refs)
    assert tray.get(refs) == [0, 1, 2]
    generation = worker.references.ready_generation
    stale = ThreadWait(_thread_condition(), refs, 2, 0, True, generation - 1)
    in_loop(worker, worker.thread_waits._watch_wait_for_thread, stale)
    assert stale.woken and not stale.gave_up  # recounted: two were ready
    current = ThreadWait(_thread_condition(), refs, 2, 0, True, generation)
    in_loop(worker, worker.thread_waits._watch_wait_for_thread, current)
    assert not current.woken  # the thread's count (none ready) is taken as is
    assert current in worker.references.ready_listeners
    in_loop(worker, worker.references.ready_listeners.pop, current)


def test_threads_waiting_in_get_or_wait_raise_when_tray_shuts_down():
    """A user's thread asleep in get or wait (on its own condition) is woken
    by tray.shutdown() from another thread, and raises: it does not wait
    for a loop that is gone (it hung before)."""
    tray.init(backend="local", num_cpus=2, include_dashboard=False)
    try:
        pending = nap.remote(30, "never")
        _known_to_the_loop([pending])
        outcomes: list = []

        def blocked(call) -> None:
            try:
                call()
                outcomes.append("returned")
            except tex.TrayError as error:
                outcomes.append(str(error))

        threads = [threading.Thread(target=blocked, args=(lambda: tray.get(pending),)),
                   threading.Thread(target=blocked, args=(lambda: tray.wait([pending]),))]
        for thread in threads:
            thread.start()
        wait_for(lambda: len(_driver().thread_waits._waiters) == 2, "both threads to be asleep")
    finally:
        tray.shutdown()
    for thread in threads:
        thread.join(THREAD_JOIN_S)
    assert outcomes == ["tray.shutdown() was called while this thread was waiting for "
                        "objects"] * 2


# ------------------------------------------------------------- the inbox

class _ManualLoop:
    """A stand-in for the loop's run_sync_soon: callbacks run when asked."""

    def __init__(self) -> None:
        self.callbacks: list = []

    def call_soon(self, fn) -> None:
        self.callbacks.append(fn)

    def run(self) -> None:
        callbacks, self.callbacks = self.callbacks, []
        for fn in callbacks:
            fn()


def test_inbox_wakes_the_loop_once_per_batch_and_keeps_order():
    loop = _ManualLoop()
    inbox = ThreadInbox(None, loop.call_soon, condition=_thread_condition())
    done: list = []
    for i in range(100):
        inbox.put(done.append, i)
    assert len(loop.callbacks) == 1  # one wake-up for the whole burst
    loop.run()
    assert done == list(range(100))
    inbox.put(done.append, 100)
    assert len(loop.callbacks) == 1  # empty again: the next put wakes it again
    loop.run()
    assert done == list(range(101))
    assert inbox.statistics().batches == 2 and inbox.statistics().ops == 101


def test_a_long_drain_has_its_messages_written_as_it_goes():
    # A burst the user's thread keeps filling is one drain, and the loop's
    # pass (whose end writes what the connections queued) ends after it: the
    # drain has the transport write every FLUSH_EVERY_OPS operations, so the
    # calls leave during the burst (1:1 actor calls async: +19%).
    from tray.core.worker.thread_inbox import FLUSH_EVERY_OPS

    loop = _ManualLoop()
    flushed_after: list = []
    done: list = []
    inbox = ThreadInbox(None, loop.call_soon, condition=_thread_condition(),
                        flush=lambda: flushed_after.append(len(done)))
    count = 3 * FLUSH_EVERY_OPS + 5
    for i in range(count):
        inbox.put(done.append, i)
    loop.run()
    assert done == list(range(count))
    assert flushed_after == [FLUSH_EVERY_OPS, 2 * FLUSH_EVERY_OPS, 3 * FLUSH_EVERY_OPS]
    # A short drain leaves its messages to the end of the pass.
    inbox.put(done.append, count)
    loop.run()
    assert len(flushed_after) == 3


def test_a_failing_flush_does_not_stop_the_drain():
    from tray.core.worker.thread_inbox import FLUSH_EVERY_OPS

    loop = _ManualLoop()
    done: list = []
    inbox = ThreadInbox(None, loop.call_soon, condition=_thread_condition(),
                        flush=lambda: 1 / 0)
    for i in range(FLUSH_EVERY_OPS + 1):
        inbox.put(done.append, i)
    loop.run()
    assert done == list(range(FLUSH_EVERY_OPS + 1))


def test_inbox_full_fails_clearly_when_the_loop_takes_nothing():
    loop = _ManualLoop()
    inbox = ThreadInbox(None, loop.call_soon, max_queued=3, stall_timeout_s=0.1, condition=_thread_condition())
    done: list = []
    for i in range(3):
        inbox.put(done.append, i)
    with pytest.raises(tex.TrayError, match="took none of the 3 queued"):
        inbox.put(done.append, 3)  # nothing runs the loop: the stall is reported
    loop.run()
    assert done == [0, 1, 2]


def test_inbox_full_waits_for_the_loop():
    loop = _ManualLoop()
    inbox = ThreadInbox(None, loop.call_soon, max_queued=3, stall_timeout_s=THREAD_JOIN_S, condition=_thread_condition())
    done: list = []
    for i in range(3):
        inbox.put(done.append, i)
    waiter = threading.Thread(target=inbox.put, args=(done.append, 3))
    waiter.start()  # blocks until the loop takes the batch (or finds it room at once)
    loop.run()
    waiter.join(THREAD_JOIN_S)
    loop.run()
    assert done == [0, 1, 2, 3]


def test_inbox_one_failing_operation_does_not_stop_the_rest():
    loop = _ManualLoop()
    inbox = ThreadInbox(None, loop.call_soon, condition=_thread_condition())
    done: list = []
    inbox.put(done.append, 1)
    inbox.put(lambda: 1 / 0)
    inbox.put(done.append, 2)
    loop.run()
    assert done == [1, 2]


def test_inbox_threads_appending_while_the_loop_drains_lose_nothing():
    """Appends take no lock (``ThreadInbox.put``): operations queued while
    a drain is stopping are run by it or by the drain they schedule, each
    once, in each thread's order."""
    import queue

    callbacks: queue.Queue = queue.Queue()

    def loop() -> None:  # the loop's thread: runs what call_soon handed it
        while (fn := callbacks.get()) is not None:
            fn()

    inbox = ThreadInbox(None, callbacks.put, max_queued=500, condition=_thread_condition())
    runner = threading.Thread(target=loop)
    runner.start()
    seen: dict = {k: [] for k in range(4)}
    per_thread = 20_000

    def produce(k: int) -> None:
        for i in range(per_thread):
            inbox.put(seen[k].append, i)

    producers = [threading.Thread(target=produce, args=(k,)) for k in range(4)]
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # threads switch often: the races get their chance
    try:
        for thread in producers:
            thread.start()
        for thread in producers:
            thread.join(THREAD_JOIN_S)
    finally:
        sys.setswitchinterval(interval)
    wait_for(lambda: sum(map(len, seen.values())) == 4 * per_thread,
             "every queued operation to run")
    callbacks.put(None)
    runner.join(THREAD_JOIN_S)
    assert all(seen[k] == list(range(per_thread)) for k in range(4))
    assert len(inbox) == 0 and inbox.statistics().ops == 4 * per_thread


def test_inbox_put_after_the_loop_ended_raises():
    def closed(fn):
        raise RuntimeError("the loop has ended")

    inbox = ThreadInbox(None, closed, condition=_thread_condition())
    with pytest.raises(RuntimeError, match="ended"):
        inbox.put(print, "never")
    inbox.put_quietly(print, "never")  # a ref dropped at exit: nothing to tell
    assert len(inbox) == 0
