"""Actors: state, per-caller ordering, handles passed around, names and
namespaces, lifetimes, kill, failures, async actors, resources."""

from __future__ import annotations

import time

import numpy as np
import pytest

import tray
from tray.exceptions import ActorDiedError, ActorError, TaskError, TrayError


@tray.remote
class Counter:
    def __init__(self, start=0):
        self.value = start

    def increment(self, by=1):
        self.value += by
        return self.value

    def read(self):
        return self.value


@tray.remote
def sleep_then_return(duration_s, value):
    time.sleep(duration_s)
    return value


# ---------------------------------------------------------------------------
# State and ordering
# ---------------------------------------------------------------------------


def test_counter_issue_example(cluster):
    c = Counter.remote()
    assert tray.get([c.increment.remote() for _ in range(5)]) == [1, 2, 3, 4, 5]


def test_constructor_arguments(cluster):
    c = Counter.remote(100)
    assert tray.get(c.increment.remote(by=5)) == 105
    c2 = Counter.remote(start=7)
    assert tray.get(c2.read.remote()) == 7


def test_actors_have_independent_state(cluster):
    a = Counter.remote()
    b = Counter.remote()
    tray.get([a.increment.remote() for _ in range(3)])
    tray.get(b.increment.remote())
    assert tray.get([a.read.remote(), b.read.remote()]) == [3, 1]


def test_calls_from_one_caller_execute_in_order(cluster):
    c = Counter.remote()
    refs = [c.increment.remote() for _ in range(300)]
    results = tray.get(refs)
    assert results == list(range(1, 301))


def test_calls_in_order_with_pending_ref_arguments(cluster):
    """A call whose argument is not ready yet still executes before later calls
    from the same caller (Ray: calls from one handle run in submission order)."""

    @tray.remote
    class Log:
        def __init__(self):
            self.items = []

        def append(self, x):
            self.items.append(x)
            return len(self.items)

        def read(self):
            return list(self.items)

    log = Log.remote()
    slow = sleep_then_return.remote(5 * cluster.tick_s, "slow")
    log.append.remote(slow)
    log.append.remote("fast")
    assert tray.get(log.read.remote()) == ["slow", "fast"]


def test_actor_ref_results_usable_as_task_args(cluster):
    @tray.remote
    def double(x):
        return 2 * x

    c = Counter.remote()
    ref = c.increment.remote(by=21)
    assert tray.get(double.remote(ref)) == 42


def test_method_error_does_not_kill_actor(cluster):
    @tray.remote
    class Fragile:
        def __init__(self):
            self.calls = 0

        def maybe_fail(self, fail):
            self.calls += 1
            if fail:
                raise ValueError("method failed")
            return self.calls

    f = Fragile.remote()
    assert tray.get(f.maybe_fail.remote(False)) == 1
    with pytest.raises(ValueError) as info:
        tray.get(f.maybe_fail.remote(True))
    assert isinstance(info.value, TaskError)
    assert not isinstance(info.value, ActorError)
    assert "method failed" in str(info.value)
    assert tray.get(f.maybe_fail.remote(False)) == 3


def test_actor_runtime_context(cluster):
    @tray.remote
    class Who:
        def ids(self):
            ctx = tray.get_runtime_context()
            return ctx.get_actor_id(), ctx.get_node_id(), ctx.get_job_id()

    a = Who.remote()
    b = Who.remote()
    (a1, node_a1, job_a), (a2, node_a2, _), (b1, _, _) = tray.get(
        [a.ids.remote(), a.ids.remote(), b.ids.remote()]
    )
    assert isinstance(a1, str)
    int(a1, 16)
    assert a1 == a2
    assert a1 != b1
    assert node_a1 == node_a2
    assert node_a1 in {n["NodeID"] for n in tray.nodes()}
    assert job_a == tray.get_runtime_context().get_job_id()


# ---------------------------------------------------------------------------
# Handles passed around
# ---------------------------------------------------------------------------


def test_actor_handle_passed_to_tasks(cluster):
    @tray.remote
    def bump(counter, times):
        return tray.get([counter.increment.remote() for _ in range(times)])

    c = Counter.remote()
    results = tray.get([bump.remote(c, 5) for _ in range(4)])
    # Each task's own calls are ordered; all 20 increments happen exactly once.
    for r in results:
        assert r == sorted(r)
    flat = sorted(x for r in results for x in r)
    assert flat == list(range(1, 21))
    assert tray.get(c.read.remote()) == 20


def test_actor_handle_passed_to_actor(cluster):
    @tray.remote
    class Forwarder:
        def __init__(self, target):
            self.target = target

        def forward(self):
            return tray.get(self.target.increment.remote())

    c = Counter.remote()
    f = Forwarder.remote(c)
    assert tray.get([f.forward.remote() for _ in range(3)]) == [1, 2, 3]
    assert tray.get(c.read.remote()) == 3


def test_actor_handle_returned_from_task(cluster):
    @tray.remote
    def make_counter():
        return Counter.remote(10)

    handle = tray.get(make_counter.remote())
    assert tray.get(handle.increment.remote()) == 11


def test_actor_created_inside_task_with_handle_inside_list(cluster):
    @tray.remote
    def use(handles):
        return tray.get([h.increment.remote() for h in handles])

    counters = [Counter.remote() for _ in range(3)]
    assert tray.get(use.remote(counters)) == [1, 1, 1]


# ---------------------------------------------------------------------------
# Multiple returns
# ---------------------------------------------------------------------------


def test_method_num_returns(cluster):
    @tray.remote
    class Pairs:
        @tray.method(num_returns=2)
        def pair(self, x):
            return x, x * 10

        def single(self):
            return (1, 2)

    p = Pairs.remote()
    a, b = p.pair.remote(3)
    assert tray.get(a) == 3
    assert tray.get(b) == 30
    assert tray.get(p.single.remote()) == (1, 2)


def test_method_num_returns_via_options(cluster):
    @tray.remote
    class Triples:
        def triple(self):
            return "x", "y", "z"

    t = Triples.remote()
    refs = t.triple.options(num_returns=3).remote()
    assert tray.get(list(refs)) == ["x", "y", "z"]


# ---------------------------------------------------------------------------
# Named actors, namespaces, lifetimes
# ---------------------------------------------------------------------------


def test_named_actor_get_actor(cluster):
    c = Counter.options(name="global-counter").remote()
    tray.get(c.increment.remote())
    same = tray.get_actor("global-counter")
    assert tray.get(same.increment.remote()) == 2
    assert tray.get(c.read.remote()) == 2


def test_named_actor_found_from_task(cluster):
    @tray.remote
    def bump_by_name():
        return tray.get(tray.get_actor("shared-counter").increment.remote())

    c = Counter.options(name="shared-counter").remote()
    assert sorted(tray.get([bump_by_name.remote() for _ in range(3)])) == [1, 2, 3]
    assert tray.get(c.read.remote()) == 3


def test_get_actor_unknown_name_is_value_error(cluster):
    with pytest.raises(ValueError):
        tray.get_actor("no-such-actor")


def test_duplicate_name_is_value_error(cluster):
    c = Counter.options(name="dup").remote()
    tray.get(c.read.remote())
    with pytest.raises(ValueError):
        c2 = Counter.options(name="dup").remote()
        tray.get(c2.read.remote())


def test_namespaces_separate_names(cluster):
    a = Counter.options(name="same", namespace="ns-a").remote(0)
    b = Counter.options(name="same", namespace="ns-b").remote(100)
    assert tray.get([a.read.remote(), b.read.remote()]) == [0, 100]
    assert tray.get(tray.get_actor("same", namespace="ns-a").read.remote()) == 0
    assert tray.get(tray.get_actor("same", namespace="ns-b").read.remote()) == 100
    with pytest.raises(ValueError):
        tray.get_actor("same", namespace="ns-c")


def test_named_actor_not_visible_from_other_namespace(cluster):
    # Keep the handle: as in Ray, a non-detached actor whose handles are all
    # gone may be destroyed, name and all.
    handle = Counter.options(name="only-here", namespace="ns-1").remote()
    assert tray.get(handle.read.remote()) == 0
    assert tray.get(tray.get_actor("only-here", namespace="ns-1").read.remote()) == 0
    with pytest.raises(ValueError):
        tray.get_actor("only-here", namespace="ns-2")


def test_get_if_exists_returns_existing(cluster):
    first = Counter.options(name="singleton", get_if_exists=True).remote()
    tray.get(first.increment.remote())
    second = Counter.options(name="singleton", get_if_exists=True).remote()
    assert tray.get(second.increment.remote()) == 2
    assert tray.get(first.read.remote()) == 2


def test_get_if_exists_creates_when_missing(cluster):
    c = Counter.options(name="fresh", get_if_exists=True).remote(5)
    assert tray.get(c.read.remote()) == 5
    assert tray.get(tray.get_actor("fresh").read.remote()) == 5


def test_detached_actor(cluster):
    d = Counter.options(name="detached-one", lifetime="detached").remote()
    assert tray.get(d.increment.remote()) == 1
    found = tray.get_actor("detached-one")
    assert tray.get(found.increment.remote()) == 2
    tray.kill(found)


# ---------------------------------------------------------------------------
# kill and failures
# ---------------------------------------------------------------------------


def test_kill_then_calls_raise_actor_died(cluster):
    c = Counter.remote()
    assert tray.get(c.increment.remote()) == 1
    tray.kill(c)
    with pytest.raises(ActorDiedError) as info:
        tray.get(c.increment.remote(), timeout=100 * cluster.tick_s)
    assert isinstance(info.value, ActorError)
    assert isinstance(info.value, TrayError)
    assert isinstance(info.value, tray.exceptions.RayActorError)


def test_kill_fails_every_later_call(cluster):
    c = Counter.remote()
    tray.get(c.read.remote())
    tray.kill(c)
    refs = [c.increment.remote() for _ in range(5)]
    for ref in refs:
        with pytest.raises(ActorDiedError):
            tray.get(ref, timeout=100 * cluster.tick_s)


@tray.remote(max_restarts=1)
class Incarnations:
    """max_task_retries=0, Ray's default: only a call in flight when the
    actor dies may fail."""

    def __init__(self):
        import os

        self.pid = os.getpid()
        # (pid, id): a restarted actor's process, forked from the same
        # zygote, may place the new instance at the old one's address.
        self.instance = (self.pid, id(self))

    def whoami(self):
        return self.pid, self.instance


def _crash_actor_process(cluster, actor, pid: int) -> None:
    if cluster.is_sim:
        import tray.simtest

        assert tray.simtest.cluster().kill_actor_worker(actor)
    else:
        import os
        import signal

        os.kill(pid, signal.SIGKILL)


def test_a_call_made_after_an_actor_restarted_runs_on_the_new_instance(one_node):
    """No call was in flight when the actor's process died: the next call
    waits for the restart and runs there, as in Ray (it used to fail with
    ActorDiedError, 'died while running', when it found the old process
    gone)."""
    actor = Incarnations.remote()
    pid, first = tray.get(actor.whoami.remote())
    _crash_actor_process(one_node, actor, pid)
    time.sleep(2 * one_node.tick_s)  # (virtual seconds in the simulator)
    _pid, second = tray.get(actor.whoami.remote(), timeout=100 * one_node.tick_s)
    assert second != first


def test_kill_releases_name(cluster):
    c = Counter.options(name="to-kill").remote()
    tray.get(c.read.remote())
    tray.kill(c)
    # Ray frees the name of a killed (non-restartable) actor; it becomes
    # reusable soon after.
    for _ in range(200):
        try:
            tray.get_actor("to-kill")
        except ValueError:
            break
        tray.get(sleep_then_return.remote(0.05, None))
    with pytest.raises(ValueError):
        tray.get_actor("to-kill")
    c2 = Counter.options(name="to-kill").remote(9)
    assert tray.get(c2.read.remote()) == 9


def test_kill_non_actor_is_error(cluster):
    with pytest.raises((TypeError, ValueError)):
        tray.kill("not an actor")


def test_failing_constructor_raises_actor_died_with_cause(cluster):
    @tray.remote
    class Broken:
        def __init__(self):
            raise ValueError("constructor exploded")

        def ping(self):
            return "pong"

    b = Broken.remote()
    with pytest.raises(ActorDiedError) as info:
        tray.get(b.ping.remote(), timeout=100 * cluster.tick_s)
    err = info.value
    cause = getattr(err, "cause", None) or err.__cause__
    assert isinstance(cause, ValueError), (type(cause), cause)
    assert "constructor exploded" in str(cause) or "constructor exploded" in str(err)


def test_failing_constructor_every_call_fails(cluster):
    @tray.remote
    class Broken:
        def __init__(self):
            raise RuntimeError("nope")

        def ping(self):
            return "pong"

    b = Broken.remote()
    refs = [b.ping.remote() for _ in range(3)]
    for ref in refs:
        with pytest.raises(ActorDiedError):
            tray.get(ref, timeout=100 * cluster.tick_s)


def test_wait_on_dead_actor_call_is_ready(cluster):
    c = Counter.remote()
    tray.kill(c)
    ref = c.read.remote()
    ready, not_ready = tray.wait([ref], timeout=100 * cluster.tick_s)
    assert ready == [ref]
    assert not_ready == []


# ---------------------------------------------------------------------------
# Async actors
# ---------------------------------------------------------------------------


@tray.remote
class Gate:
    """Each call registers as running, then awaits an ObjectRef (handed in
    inside a list, so it is not resolved before the call), then finishes."""

    def __init__(self):
        self.running = 0
        self.max_running = 0
        self.done = 0

    async def through(self, wrapped_ref, i):
        self.running += 1
        self.max_running = max(self.max_running, self.running)
        value = await wrapped_ref[0]
        self.running -= 1
        self.done += 1
        return (i, value)

    async def stats(self):
        return self.max_running, self.done


def test_async_actor_awaits_object_ref(cluster):
    g = Gate.remote()
    release = sleep_then_return.remote(cluster.tick_s, "opened")
    assert tray.get(g.through.remote([release], 0)) == (0, "opened")


def test_async_actor_runs_calls_concurrently_up_to_max_concurrency(cluster):
    g = Gate.options(max_concurrency=3).remote()
    tray.get(g.stats.remote())  # the actor is up before the gate starts closing
    release = sleep_then_return.remote(10 * cluster.tick_s, "opened")
    refs = [g.through.remote([release], i) for i in range(10)]
    assert tray.get(refs) == [(i, "opened") for i in range(10)]
    max_running, done = tray.get(g.stats.remote())
    assert done == 10
    assert max_running == 3


def test_async_actor_default_concurrency_is_large(cluster):
    g = Gate.remote()
    tray.get(g.stats.remote())
    release = sleep_then_return.remote(10 * cluster.tick_s, "opened")
    refs = [g.through.remote([release], i) for i in range(10)]
    assert tray.get(refs) == [(i, "opened") for i in range(10)]
    max_running, done = tray.get(g.stats.remote())
    assert done == 10
    assert max_running == 10


def test_async_actor_awaits_nested_remote_call(cluster):
    @tray.remote
    class Client:
        def __init__(self, counter):
            self.counter = counter

        async def bump(self):
            return await self.counter.increment.remote()

    c = Counter.remote()
    client = Client.remote(c)
    assert tray.get(client.bump.remote()) == 1
    assert tray.get(client.bump.remote()) == 2


def test_async_actor_method_error(cluster):
    @tray.remote
    class AsyncFails:
        async def go(self):
            raise KeyError("async-failure")

    a = AsyncFails.remote()
    with pytest.raises(KeyError) as info:
        tray.get(a.go.remote())
    assert isinstance(info.value, TaskError)
    assert "async-failure" in str(info.value)


def test_sync_actor_with_max_concurrency_one_is_sequential(cluster):
    @tray.remote
    class Busy:
        def __init__(self):
            self.running = 0
            self.max_running = 0

        def work(self, duration_s):
            self.running += 1
            self.max_running = max(self.max_running, self.running)
            time.sleep(duration_s)
            self.running -= 1
            return self.max_running

    b = Busy.remote()
    assert tray.get([b.work.remote(cluster.tick_s) for _ in range(4)]) == [1, 1, 1, 1]


# ---------------------------------------------------------------------------
# Resources
# ---------------------------------------------------------------------------


@pytest.mark.cluster(resources={"special": 1})
def test_actor_on_custom_resource(cluster):
    @tray.remote(resources={"special": 1})
    class Special:
        def where(self):
            return tray.get_runtime_context().get_node_id()

    actors = [Special.remote() for _ in range(cluster.num_nodes)]
    nodes = tray.get([a.where.remote() for a in actors], timeout=100 * cluster.tick_s)
    # One unit of "special" per node: the actors must land on different nodes.
    assert len(set(nodes)) == cluster.num_nodes


@pytest.mark.cluster(resources={"special": 1})
def test_actor_holds_resource_until_killed(one_node):
    tick = one_node.tick_s

    @tray.remote(resources={"special": 1})
    class Special:
        def ping(self):
            return "pong"

    first = Special.remote()
    assert tray.get(first.ping.remote()) == "pong"
    second = Special.remote()
    pending = second.ping.remote()
    ready, not_ready = tray.wait([pending], timeout=5 * tick)
    assert ready == []
    assert not_ready == [pending]
    tray.kill(first)
    assert tray.get(pending, timeout=100 * tick) == "pong"


def test_actor_options_num_cpus(one_node):
    @tray.remote
    class Worker:
        def ping(self):
            return "pong"

    w = Worker.options(num_cpus=2).remote()
    assert tray.get(w.ping.remote()) == "pong"


# ===================================== constructor arguments of every kind


@tray.remote
class _Keeper:
    def __init__(self, *args, **kwargs):
        self.args = args
        self.kwargs = kwargs

    def get(self):
        return self.args, self.kwargs


def test_constructor_arguments_of_every_kind(one_node):
    # Small NumPy arrays (carried inside the actor's record, which the GCS
    # stores) failed with "PickleBuffer can only pickled with protocol >= 5".
    import pandas as pd
    import pyarrow as pa

    small = np.arange(100)
    large = np.ones(300_000)  # past the inline limit: put in the store
    frame = pd.DataFrame({"a": [1, 2], "b": ["x", "y"]})
    table = pa.table({"c": [1.5, 2.5]})
    ref = tray.put(np.full(10, 7))
    keeper = _Keeper.remote(small, large, [small, {"nested": small * 2}], ref, frame, table,
                            key=np.float32(3.5))
    args, kwargs = tray.get(keeper.get.remote())
    assert np.array_equal(args[0], small)
    assert args[1].shape == (300_000,) and float(args[1].sum()) == 300_000.0
    assert np.array_equal(args[2][1]["nested"], small * 2)
    assert np.array_equal(args[3], np.full(10, 7))  # a ref argument arrives as its value
    assert args[4].equals(frame)
    assert args[5].equals(table)
    assert kwargs == {"key": np.float32(3.5)}
