"""tray.util.queue: Ray's actor-backed FIFO queue (ray/tests/test_queue.py's
behaviours, tray's own tests): blocking and timeouts without polling,
batches, shutdown, and the errors users can cause."""

from __future__ import annotations

import queue as stdlib_queue
import time

import pytest

import tray
import tray.simtest
from tray.util.queue import Empty, Full, Queue


@pytest.fixture
def sim():
    tray.init(backend="sim", num_nodes=2, num_cpus=2, seed=0)
    yield
    tray.shutdown()


@tray.remote
def consume(q, n, timeout=None):
    """Get ``n`` items; also says when (virtual time in the simulator) the
    last one arrived."""
    items = [q.get(timeout=timeout) for _ in range(n)]
    return items, time.time()


@tray.remote
def produce(q, items, delay_s=0.0):
    time.sleep(delay_s)
    for item in items:
        q.put(item)
    return time.time()


# ================================================================ both backends


def test_queue_basics_on_both_backends(one_node):
    q = Queue()
    assert q.empty() and q.size() == 0 and len(q) == 0
    for item in ["a", {"b": 1}, 3]:
        q.put(item)
    assert q.qsize() == 3 and not q.empty() and not q.full()
    assert [q.get(), q.get(block=False), q.get(timeout=1)] == ["a", {"b": 1}, 3]
    with pytest.raises(Empty):
        q.get_nowait()
    with pytest.raises(Empty):
        q.get(timeout=0.2)

    bounded = Queue(maxsize=2)
    bounded.put(1)
    bounded.put_nowait(2)
    assert bounded.full()
    with pytest.raises(Full):
        bounded.put_nowait(3)
    with pytest.raises(Full):
        bounded.put(3, timeout=0.2)
    assert [bounded.get(), bounded.get()] == [1, 2]

    # tasks share the queue: a consumer blocks until producers fill it
    consumer = consume.remote(bounded, 6, 60)
    producers = [produce.remote(bounded, [p * 10 + i for i in range(3)]) for p in range(2)]
    items, _ = tray.get(consumer)
    tray.get(producers)
    assert sorted(items) == [0, 1, 2, 10, 11, 12]
    assert [x for x in items if x < 10] == [0, 1, 2]  # one producer's items stay in order

    bounded.put_nowait_batch([7, 8])
    assert bounded.get_nowait_batch(2) == [7, 8]
    bounded.shutdown()
    with pytest.raises(RuntimeError, match="shut down"):
        bounded.put(1)


# ============================================================= the simulator


def test_errors_are_the_stdlib_queue_errors(sim):
    assert issubclass(Empty, stdlib_queue.Empty)
    assert issubclass(Full, stdlib_queue.Full)
    q = Queue(maxsize=1)
    with pytest.raises(stdlib_queue.Empty):
        q.get(block=False)
    q.put(1)
    try:
        q.put(2, block=False)
    except Full as error:
        assert type(error) is Full  # plain, not wrapped in a TaskError
        assert "full" in str(error)
    else:
        pytest.fail("put on a full queue did not raise Full")


def test_a_blocked_get_is_parked_and_woken_by_the_put(sim):
    """No polling: the getter waits inside the actor and the put hands the
    item over directly, at the same virtual instant."""
    q = Queue()
    consumer = consume.remote(q, 1, None)
    ready, _ = tray.wait([consumer], timeout=2.0)
    assert not ready
    assert q.statistics().getters_waiting == 1
    put_at = tray.get(produce.remote(q, ["x"], 5.0))
    items, got_at = tray.get(consumer)
    assert items == ["x"]
    assert abs(got_at - put_at) < 0.05
    assert q.statistics().getters_waiting == 0


def test_a_blocked_put_waits_for_room_in_order(sim):
    q = Queue(maxsize=1)
    q.put("first")
    blocked = produce.remote(q, ["second", "third"])
    ready, _ = tray.wait([blocked], timeout=2.0)
    assert not ready
    stats = q.statistics()
    assert (stats.size, stats.putters_waiting) == (1, 1)
    assert [q.get(timeout=5), q.get(timeout=5), q.get(timeout=5)] == ["first", "second", "third"]
    tray.get(blocked)


def test_timeouts_are_virtual_and_exact_in_the_simulator(sim):
    q = Queue()

    @tray.remote
    def timed_get(q, timeout):
        start = time.time()
        try:
            q.get(timeout=timeout)
        except Empty:
            return time.time() - start
        return None

    waited = tray.get(timed_get.remote(q, 30.0))
    assert waited is not None and 30.0 <= waited < 30.1
    assert tray.get(timed_get.remote(q, 0)) < 0.05


def test_many_consumers_each_item_once(sim):
    q = Queue(maxsize=3)
    consumers = [consume.remote(q, 5, 100) for _ in range(4)]
    producers = [produce.remote(q, list(range(p * 10, p * 10 + 10)), p * 0.3) for p in range(2)]
    got = [item for items, _ in tray.get(consumers) for item in items]
    tray.get(producers)
    assert sorted(got) == list(range(10)) + list(range(10, 20))
    assert q.empty()


def test_batches_are_all_or_nothing(sim):
    q = Queue(maxsize=3)
    q.put_nowait_batch(iter([1, 2]))
    with pytest.raises(Full, match="nothing was put"):
        q.put_nowait_batch([3, 4])
    assert q.size() == 2
    with pytest.raises(Empty, match="nothing was taken"):
        q.get_nowait_batch(3)
    assert q.get_nowait_batch(0) == []
    assert q.get_nowait_batch(2) == [1, 2]
    # items go straight to parked getters, which do not count against maxsize
    consumers = [consume.remote(q, 1, 50) for _ in range(2)]
    tray.wait(consumers, num_returns=2, timeout=1.0)
    assert q.statistics().getters_waiting == 2
    q.put_nowait_batch([5, 6, 7, 8, 9])
    assert sorted(items[0] for items, _ in tray.get(consumers)) == [5, 6]
    assert q.get_nowait_batch(3) == [7, 8, 9]


def test_async_put_and_get_from_an_async_actor(sim):
    @tray.remote
    class Relay:
        async def move(self, source, target, n):
            for _ in range(n):
                item = await source.get_async(timeout=10)
                await target.put_async(item * 10)
            try:
                await source.get_async(block=False)
            except Empty:
                return "drained"

    source, target = Queue(), Queue()
    relay = Relay.remote()
    done = relay.move.remote(source, target, 3)
    for item in [1, 2, 3]:
        source.put(item)
    assert tray.get(done) == "drained"
    assert [target.get(timeout=1) for _ in range(3)] == [10, 20, 30]


def test_actor_options_reach_the_queue_actor(sim):
    q = Queue(actor_options={"name": "work-queue", "num_cpus": 1})
    q.put("job")
    handle = tray.get_actor("work-queue")
    assert tray.get(handle.qsize.remote()) == 1


def test_shutdown_waits_for_parked_calls_then_kills(sim):
    q = Queue()
    parked = consume.remote(q, 1, None)
    tray.wait([parked], timeout=1.0)
    q.shutdown(grace_period_s=2)
    with pytest.raises(tray.exceptions.ActorDiedError):
        tray.get(parked)
    q.shutdown()  # twice is fine

    served = Queue()
    parked = consume.remote(served, 1, None)
    tray.wait([parked], timeout=1.0)
    served.put("last")
    served.shutdown(force=True)
    assert tray.get(parked)[0] == ["last"]


def test_bad_input_gets_clear_errors(sim):
    with pytest.raises(ValueError, match="maxsize must be >= 0"):
        Queue(maxsize=-1)
    with pytest.raises(TypeError, match="maxsize must be an int"):
        Queue(maxsize="3")
    with pytest.raises(TypeError, match="actor_options must be a dict"):
        Queue(actor_options=[("num_cpus", 1)])
    with pytest.raises(ValueError, match="unknown|invalid|option"):
        Queue(actor_options={"not_an_option": 1})
    q = Queue()
    with pytest.raises(ValueError, match="non-negative"):
        q.put(1, timeout=-1)
    with pytest.raises(ValueError, match="non-negative"):
        q.get(timeout=-0.5)
    with pytest.raises(TypeError, match="timeout"):
        q.get(timeout="soon")
    with pytest.raises(TypeError, match="num_items must be an int"):
        q.get_nowait_batch("2")
    with pytest.raises(ValueError, match="num_items must be >= 0"):
        q.get_nowait_batch(-1)
    with pytest.raises(TypeError, match="items must be an iterable"):
        q.put_nowait_batch(5)
    with pytest.raises(ValueError, match="grace_period_s"):
        q.shutdown(grace_period_s=-1)
    q.shutdown()
    for use in (q.get, q.size, q.empty, lambda: q.put_nowait(1)):
        with pytest.raises(RuntimeError, match="shut down"):
            use()


def test_queue_replays_identically():
    def run() -> str:
        tray.init(backend="sim", num_nodes=2, num_cpus=2, seed=5)
        try:
            q = Queue(maxsize=2)
            consumers = [consume.remote(q, 4, 100) for _ in range(2)]
            producers = [produce.remote(q, list(range(p * 4, p * 4 + 4)), p * 0.1)
                         for p in range(2)]
            got = sorted(i for items, _ in tray.get(consumers) for i in items)
            assert got == list(range(8))
            tray.get(producers)
            return tray.simtest.trace_digest()
        finally:
            tray.shutdown()

    assert run() == run()


# ====================================== the actor's logic on either event loop
#
# tray runs async actors on trio today (an asyncio loop is planned); the
# queue actor must work on both. These drive its methods directly, without a
# cluster, under each library.


async def _queue_actor_scenario(sleep, spawn) -> list:
    """Parked getters and putters, timeouts and a cancelled getter; returns
    the order things happened in."""
    from tray.util.queue import _QueueActor

    actor = _QueueActor(maxsize=1)
    log = []

    async def getter(name, timeout_s=None):
        try:
            log.append((name, await actor.get(timeout_s)))
        except Empty:
            log.append((name, "empty"))

    async def putter(name, item, timeout_s=None):
        try:
            await actor.put(item, timeout_s)
            log.append((name, "put"))
        except Full:
            log.append((name, "full"))

    spawn(getter, "g1")
    await sleep(0.01)  # trio may start tasks spawned together in any order
    spawn(getter, "g2", 0.5)
    await sleep(0.01)
    assert (await actor.statistics()).getters_waiting == 2
    await actor.put("a")                        # handed straight to g1
    await sleep(1.0)                            # g2 times out
    await actor.put("b")                        # queue: [b]
    spawn(putter, "p1", "c", 5.0)               # parked: the queue is full
    await sleep(0.01)
    spawn(putter, "p2", "d", 0.2)               # parked, then times out
    await sleep(0.5)
    assert await actor.get(0) == "b"            # lets p1's item in
    await sleep(0.01)
    assert await actor.get_nowait() == "c"
    assert await actor.wait_idle(0.1)
    return log


def test_queue_actor_on_trio():
    import trio
    import trio.testing

    async def main():
        async with trio.open_nursery() as nursery:
            return await _queue_actor_scenario(trio.sleep, nursery.start_soon)

    log = trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))  # virtual time
    assert log == [("g1", "a"), ("g2", "empty"), ("p2", "full"), ("p1", "put")]


def test_queue_actor_on_asyncio():
    import asyncio

    async def main():
        tasks = []
        log = await _queue_actor_scenario(
            asyncio.sleep, lambda fn, *args: tasks.append(asyncio.create_task(fn(*args))))
        await asyncio.gather(*tasks)
        return log

    log = asyncio.run(main())
    assert log == [("g1", "a"), ("g2", "empty"), ("p2", "full"), ("p1", "put")]


def test_a_cancelled_getter_gives_its_item_back():
    """On asyncio a getter can be cancelled after the put handed it an item
    but before it ran again; the item goes back to the front of the queue.
    (On trio the wake-up wins over a later cancel, so the call returns it.)"""
    import asyncio

    from tray.util.queue import _QueueActor

    async def main():
        actor = _QueueActor(maxsize=0)
        getter = asyncio.create_task(actor.get(None))
        await asyncio.sleep(0.01)
        await actor.put("x")   # handed to the parked getter...
        getter.cancel()        # ...which is cancelled before it runs again
        try:
            await getter
        except asyncio.CancelledError:
            pass
        else:
            raise AssertionError("the getter was not cancelled")
        assert await actor.get_nowait() == "x"
        assert (await actor.statistics()).getters_waiting == 0

    asyncio.run(main())
