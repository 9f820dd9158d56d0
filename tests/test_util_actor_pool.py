"""tray.util.ActorPool: Ray's semantics (ray/tests/test_actor_pool.py's
behaviours, tray's own tests), where tray differs on purpose, and the
errors users can cause.

One test runs on both backends; the rest run on the simulator, where a
"slow" call sleeps virtual time for free."""

from __future__ import annotations

import time

import pytest

import tray
import tray.simtest
from tray.util import ActorPool
from tray.util.actor_pool import ActorPool as ActorPoolFromModule


@tray.remote
class Worker:
    def __init__(self, tag=0):
        self.tag = tag
        self.calls = 0

    def double(self, x):
        self.calls += 1
        return 2 * x

    def slow_double(self, x, sleep_s):
        time.sleep(sleep_s)
        return 2 * x

    def tagged(self, x):
        return (self.tag, x)

    def fail_on(self, x, bad):
        if x == bad:
            raise KeyError(f"bad value {x}")
        return x

    @tray.method(num_returns=2)
    def pair(self, x):
        return x, -x

    def die(self):
        import os
        os._exit(1)

    def count(self):
        return self.calls


@pytest.fixture
def sim():
    tray.init(backend="sim", num_nodes=2, num_cpus=2, seed=0)
    yield
    tray.shutdown()


def double(actor, value):
    return actor.double.remote(value)


# ================================================================ both backends


def test_map_submit_and_results_on_both_backends(one_node):
    actors = [Worker.remote(tag) for tag in range(3)]
    pool = ActorPool(actors)
    assert list(pool.map(double, range(7))) == [0, 2, 4, 6, 8, 10, 12]
    assert sorted(pool.map_unordered(double, [5, 6, 7])) == [10, 12, 14]
    # every actor took part: the pool spreads values over idle actors
    assert sum(tray.get([a.count.remote() for a in actors])) == 10
    assert all(n > 0 for n in tray.get([a.count.remote() for a in actors]))
    for value in range(4):
        pool.submit(double, value)
        assert pool.get_next() == 2 * value
    assert not pool.has_next()
    assert pool.has_free()


# ============================================================= the simulator


def test_importable_from_ray_paths():
    assert ActorPool is ActorPoolFromModule
    assert tray.util.ActorPool is ActorPool


def test_get_next_is_in_submission_order_even_when_later_calls_finish_first(sim):
    pool = ActorPool([Worker.remote() for _ in range(3)])
    for value, sleep_s in [(1, 3.0), (2, 0.1), (3, 1.0)]:
        pool.submit(lambda a, v: a.slow_double.remote(*v), (value, sleep_s))
    assert [pool.get_next() for _ in range(3)] == [2, 4, 6]


def test_get_next_unordered_returns_the_first_to_finish(sim):
    pool = ActorPool([Worker.remote() for _ in range(3)])
    for value, sleep_s in [(1, 3.0), (2, 0.1), (3, 1.0)]:
        pool.submit(lambda a, v: a.slow_double.remote(*v), (value, sleep_s))
    assert [pool.get_next_unordered() for _ in range(3)] == [4, 6, 2]
    with pytest.raises(StopIteration):
        pool.get_next_unordered()


def test_more_values_than_actors_wait_for_a_free_actor(sim):
    actors = [Worker.remote(tag) for tag in range(2)]
    pool = ActorPool(actors)
    for value in range(5):
        pool.submit(lambda a, v: a.tagged.remote(v), value)
    stats = pool.statistics()
    assert (stats.busy_actors, stats.idle_actors, stats.values_waiting) == (2, 0, 3)
    assert not pool.has_free()
    results = [pool.get_next() for _ in range(5)]
    assert [x for _, x in results] == [0, 1, 2, 3, 4]
    assert {tag for tag, _ in results} == {0, 1}
    assert pool.statistics().idle_actors == 2


def test_map_is_eager_and_an_iterator(sim):
    pool = ActorPool([Worker.remote()])
    results = pool.map(double, [1, 2, 3])
    # submitted at map() time, not when iterated
    assert pool.statistics().results_pending == 3
    assert next(results) == 2
    assert list(results) == [4, 6]


def test_map_drops_results_of_earlier_submissions(sim):
    """Ray's map ignores what was submitted before it (gh-23107): a stuck
    earlier call does not hold up the map, and its result never shows."""
    pool = ActorPool([Worker.remote() for _ in range(2)])
    pool.submit(lambda a, v: a.slow_double.remote(v, 1000.0), 99)
    assert list(pool.map(double, [1, 2, 3, 4, 5])) == [2, 4, 6, 8, 10]
    assert list(pool.map_unordered(double, [1])) == [2]
    assert not pool.has_next()


def test_timeouts(sim):
    pool = ActorPool([Worker.remote() for _ in range(2)])
    pool.submit(lambda a, v: a.slow_double.remote(v, 10.0), 1)
    with pytest.raises(TimeoutError):
        pool.get_next(timeout=0.5)
    with pytest.raises(TimeoutError):
        pool.get_next_unordered(timeout=0.5)
    # not ignored: the result is still there once it is ready
    assert pool.get_next(timeout=20) == 2
    assert not pool.has_next()


def test_ignore_if_timedout_gives_the_call_up_and_keeps_its_actor_busy(sim):
    """tray returns a timed-out actor only once its call ends (Ray returns
    it at once, so the next value would queue behind the stuck call)."""
    slow, fast = Worker.remote(0), Worker.remote(1)
    pool = ActorPool([slow])
    pool.submit(lambda a, v: a.slow_double.remote(v, 5.0), 1)
    with pytest.raises(TimeoutError, match="ignored"):
        pool.get_next(timeout=0.1, ignore_if_timedout=True)
    assert not pool.has_next()
    assert pool.statistics().draining_actors == 1
    assert not pool.has_free()
    pool.push(fast)
    pool.submit(lambda a, v: a.tagged.remote(v), 7)
    assert pool.get_next() == (1, 7)  # the free actor took it, not the stuck one
    time.sleep(6.0)  # virtual: the given-up call ends meanwhile
    assert pool.statistics().idle_actors == 1
    assert pool.has_free()
    assert pool.statistics().idle_actors == 2
    # the unordered form gives up the oldest call
    pool.submit(lambda a, v: a.slow_double.remote(v, 5.0), 2)
    with pytest.raises(TimeoutError):
        pool.get_next_unordered(timeout=0.1, ignore_if_timedout=True)
    assert not pool.has_next()


def test_a_value_waiting_for_a_draining_actor_runs_when_it_ends(sim):
    pool = ActorPool([Worker.remote()])
    pool.submit(lambda a, v: a.slow_double.remote(v, 2.0), 1)
    with pytest.raises(TimeoutError):
        pool.get_next(timeout=0.1, ignore_if_timedout=True)
    pool.submit(double, 21)
    assert pool.has_next()
    assert pool.get_next() == 42


def test_multiple_returns(sim):
    pool = ActorPool([Worker.remote() for _ in range(2)])
    for value in range(4):
        pool.submit(lambda a, v: a.pair.remote(v), value)
    assert [pool.get_next() for _ in range(2)] == [[0, 0], [1, -1]]
    assert sorted(pool.get_next_unordered() for _ in range(2)) == [[2, -2], [3, -3]]


def test_ordered_after_unordered_returns_the_oldest_left(sim):
    """Ray raises ValueError for get_next after get_next_unordered; tray
    returns the oldest result not yet returned."""
    pool = ActorPool([Worker.remote() for _ in range(3)])
    for value, sleep_s in [(1, 3.0), (2, 0.1), (3, 1.0)]:
        pool.submit(lambda a, v: a.slow_double.remote(*v), (value, sleep_s))
    assert pool.get_next_unordered() == 4
    assert pool.get_next() == 2
    assert pool.get_next() == 6


def test_errors_reach_the_caller_and_the_actor_stays(sim):
    pool = ActorPool([Worker.remote()])
    results = pool.map(lambda a, v: a.fail_on.remote(v, 2), [1, 2, 3])
    assert next(results) == 1
    with pytest.raises(KeyError, match="bad value 2"):
        next(results)
    assert list(pool.map(double, [4])) == [8]


def test_a_dead_actor_leaves_the_pool(sim):
    doomed, healthy = Worker.remote(0), Worker.remote(1)
    pool = ActorPool([doomed])
    pool.push(healthy)
    pool.submit(lambda a, v: a.die.remote() if v == "die" else a.tagged.remote(v), "die")
    pool.submit(lambda a, v: a.tagged.remote(v), "ok")
    with pytest.raises(tray.exceptions.ActorDiedError):
        pool.get_next()
    assert pool.get_next() == (0, "ok")
    # only the living actor is left: values keep going to it
    assert [pool.statistics().idle_actors, pool.statistics().busy_actors] == [1, 0]
    assert list(pool.map(lambda a, v: a.tagged.remote(v), [1, 2])) == [(0, 1), (0, 2)]


def test_values_left_when_every_actor_died_fail_loudly(sim):
    pool = ActorPool([Worker.remote()])
    pool.submit(lambda a, v: a.die.remote(), None)
    pool.submit(double, 1)
    pool.submit(double, 2)
    with pytest.raises(tray.exceptions.ActorDiedError):
        pool.get_next()
    assert pool.has_next()
    with pytest.raises(RuntimeError, match="2 submitted values can never run"):
        pool.get_next()
    pool.push(Worker.remote())
    assert [pool.get_next(), pool.get_next()] == [2, 4]


def test_pop_idle_and_push(sim):
    first, second, third = Worker.remote(1), Worker.remote(2), Worker.remote(3)
    pool = ActorPool([first])
    pool.submit(double, 1)
    assert pool.pop_idle() is None
    assert pool.has_free() is False
    with pytest.raises(ValueError, match="already belongs"):
        pool.push(first)
    pool.push(second)
    assert pool.has_free()
    pool.submit(double, 2)
    pool.submit(double, 3)
    assert not pool.has_free()
    assert pool.statistics().values_waiting == 1
    pool.push(third)  # takes the waiting value at once
    assert pool.statistics().values_waiting == 0
    assert [pool.get_next() for _ in range(3)] == [2, 4, 6]
    popped = {pool.pop_idle() for _ in range(3)}
    assert popped == {first, second, third}
    assert pool.pop_idle() is None


def test_bad_input_gets_clear_errors(sim):
    actor = Worker.remote()
    with pytest.raises(TypeError, match="list of actor handles"):
        ActorPool(actor)
    with pytest.raises(TypeError, match="actor handles"):
        ActorPool([actor, "not an actor"])
    with pytest.raises(ValueError, match="listed twice"):
        ActorPool([actor, actor])
    empty = ActorPool([])
    with pytest.raises(ValueError, match="has no actors"):
        empty.submit(double, 1)
    with pytest.raises(ValueError, match="has no actors"):
        empty.map(double, [1, 2])
    assert not empty.has_next()
    with pytest.raises(StopIteration):
        empty.get_next()
    pool = ActorPool([actor])
    with pytest.raises(TypeError, match="fn must be a callable"):
        pool.submit("double", 1)
    with pytest.raises(TypeError, match="must return the ObjectRef"):
        pool.submit(lambda a, v: v, 1)
    assert pool.has_free()  # the actor came back after the bad fn
    with pytest.raises(TypeError, match="values must be an iterable"):
        pool.map(double, 5)
    with pytest.raises(ValueError, match="timeout"):
        pool.get_next(timeout=-1)
    with pytest.raises(TypeError, match="actor handles"):
        pool.push(42)


def test_pool_replays_identically():
    def run() -> str:
        tray.init(backend="sim", num_nodes=2, num_cpus=2, seed=3)
        try:
            pool = ActorPool([Worker.remote(tag) for tag in range(3)])
            out = list(pool.map_unordered(lambda a, v: a.slow_double.remote(v, v / 10), range(9)))
            assert sorted(out) == [2 * v for v in range(9)]
            return tray.simtest.trace_digest()
        finally:
            tray.shutdown()

    assert run() == run()
