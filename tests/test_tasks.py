"""Remote functions: the task patterns of Ray's core tutorial, on every backend
and on one and three nodes."""

from __future__ import annotations

import time

import numpy as np
import pytest

import tray
from tray.exceptions import GetTimeoutError, TaskError, TrayError
from tray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

# Remote functions may be declared before tray.init, as in Ray.


@tray.remote
def add(a, b):
    return a + b


@tray.remote
def identity(x):
    return x


@tray.remote
def sleep_then_return(duration_s, value):
    time.sleep(duration_s)
    return value


@tray.remote
def current_node_id():
    return tray.get_runtime_context().get_node_id()


def _is_hex(s) -> bool:
    if not isinstance(s, str) or not s:
        return False
    try:
        int(s, 16)
    except ValueError:
        return False
    return True


# ---------------------------------------------------------------------------
# Chains, trees, nesting
# ---------------------------------------------------------------------------


def test_single_task(cluster):
    ref = add.remote(1, 2)
    assert tray.get(ref) == 3


def test_get_list_and_single(cluster):
    refs = [add.remote(i, i) for i in range(10)]
    assert tray.get(refs) == [2 * i for i in range(10)]
    assert tray.get(refs[3]) == 6


def test_chain_of_tasks(cluster):
    ref = identity.remote(0)
    for _ in range(20):
        ref = add.remote(ref, 1)
    assert tray.get(ref) == 20


def test_tree_reduce_numpy(cluster):
    data = [tray.put(np.ones(1000)) for _ in range(16)]
    while len(data) > 1:
        data.append(add.remote(data.pop(0), data.pop(0)))
    result = tray.get(data[0])
    assert isinstance(result, np.ndarray)
    assert result.shape == (1000,)
    assert result.sum() == 16000


def test_nested_tasks(cluster):
    @tray.remote
    def square(x):
        return x * x

    @tray.remote
    def sum_of_squares(n):
        refs = [square.remote(i) for i in range(n)]
        return sum(tray.get(refs))

    assert tray.get(sum_of_squares.remote(10)) == sum(i * i for i in range(10))


def test_nested_tasks_two_levels_deep(cluster):
    @tray.remote
    def leaf(x):
        return x + 1

    @tray.remote
    def middle(x):
        return tray.get(leaf.remote(x)) * 10

    @tray.remote
    def top(x):
        return sum(tray.get([middle.remote(x), middle.remote(x + 1)]))

    assert tray.get(top.remote(1)) == 20 + 30


def test_nested_task_returns_ref_created_inside(cluster):
    @tray.remote
    def make():
        return [add.remote(20, 22), tray.put("inner")]

    refs = tray.get(make.remote())
    assert tray.get(refs) == [42, "inner"]


def test_remote_function_passed_into_task(cluster):
    @tray.remote
    def double(x):
        return 2 * x

    @tray.remote
    def apply(fn, x):
        return tray.get(fn.remote(x))

    assert tray.get(apply.remote(double, 21)) == 42


def test_many_small_tasks(cluster):
    refs = [identity.remote(i) for i in range(200)]
    assert tray.get(refs) == list(range(200))


# ---------------------------------------------------------------------------
# Multiple returns
# ---------------------------------------------------------------------------


def test_num_returns_via_options(cluster):
    @tray.remote
    def pair():
        return "a", "b"

    a, b = pair.options(num_returns=2).remote()
    assert tray.get(a) == "a"
    assert tray.get(b) == "b"
    assert tray.get([b, a]) == ["b", "a"]


def test_num_returns_via_decorator(cluster):
    @tray.remote(num_returns=3)
    def triple(x):
        return x, x + 1, x + 2

    refs = triple.remote(10)
    assert len(refs) == 3
    assert tray.get(list(refs)) == [10, 11, 12]


def test_num_returns_one_returns_single_ref_of_tuple(cluster):
    @tray.remote
    def pair():
        return 1, 2

    ref = pair.remote()
    assert tray.get(ref) == (1, 2)


def test_multiple_returns_feed_separate_tasks(cluster):
    @tray.remote(num_returns=2)
    def split(xs):
        half = len(xs) // 2
        return xs[:half], xs[half:]

    @tray.remote
    def total(xs):
        return sum(xs)

    left, right = split.remote(list(range(10)))
    assert tray.get([total.remote(left), total.remote(right)]) == [10, 35]


def test_num_returns_zero_returns_none_and_runs(cluster):
    @tray.remote
    class Box:
        def __init__(self):
            self.value = None

        def set(self, value):
            self.value = value

        def read(self):
            return self.value

    @tray.remote
    def side_effect(box):
        tray.get(box.set.remote("done"))

    box = Box.remote()
    assert side_effect.options(num_returns=0).remote(box) is None
    for _ in range(200):
        if tray.get(box.read.remote()) == "done":
            break
        tray.get(sleep_then_return.remote(0.05, None))
    assert tray.get(box.read.remote()) == "done"


# ---------------------------------------------------------------------------
# wait
# ---------------------------------------------------------------------------


@pytest.mark.cluster(num_cpus=8)
def test_wait_loop_processes_results_in_completion_order(cluster):
    # Real processes on a loaded 2-core machine can wake half a second late:
    # space the finishing times wider than that jitter.
    tick = cluster.tick_s if cluster.is_sim else 2 * cluster.tick_s
    # Warm up: on real processes, workers still starting would skew the ticks.
    tray.get([sleep_then_return.remote(0.1 * tick, i) for i in range(5)])
    # Submitted in an order unrelated to the order in which they finish.
    durations = [5, 1, 4, 2, 3]
    refs = [sleep_then_return.remote(d * tick, d) for d in durations]
    finished = []
    pending = list(refs)
    while pending:
        ready, pending = tray.wait(pending, num_returns=1)
        assert len(ready) == 1
        finished.append(tray.get(ready[0]))
    assert finished == sorted(durations)


def test_wait_returns_lists_partitioning_input(cluster):
    refs = [identity.remote(i) for i in range(5)]
    tray.get(refs)
    ready, not_ready = tray.wait(refs, num_returns=5)
    assert sorted(tray.get(ready)) == list(range(5))
    assert not_ready == []


def test_wait_preserves_input_order_within_ready(cluster):
    refs = [identity.remote(i) for i in range(6)]
    tray.get(refs)
    ready, not_ready = tray.wait(refs, num_returns=6)
    assert ready == refs
    assert not_ready == []


def test_wait_with_timeout_returns_partial(cluster):
    tick = cluster.tick_s
    fast = identity.remote("fast")
    slow = sleep_then_return.remote(1000 * tick, "slow")
    assert tray.get(fast) == "fast"
    ready, not_ready = tray.wait([fast, slow], num_returns=2, timeout=tick)
    assert ready == [fast]
    assert not_ready == [slow]


def test_wait_timeout_zero_polls(cluster):
    slow = sleep_then_return.remote(1000 * cluster.tick_s, "slow")
    ready, not_ready = tray.wait([slow], timeout=0)
    assert ready == []
    assert not_ready == [slow]


def test_get_with_timeout_raises_get_timeout_error(cluster):
    slow = sleep_then_return.remote(1000 * cluster.tick_s, "slow")
    with pytest.raises(GetTimeoutError) as info:
        tray.get(slow, timeout=cluster.tick_s)
    assert isinstance(info.value, TimeoutError)
    assert isinstance(info.value, TrayError)


def test_get_with_timeout_succeeds_when_ready_in_time(cluster):
    ref = sleep_then_return.remote(cluster.tick_s, "ok")
    assert tray.get(ref, timeout=100 * cluster.tick_s) == "ok"


# ---------------------------------------------------------------------------
# References inside arguments and values (borrowing)
# ---------------------------------------------------------------------------


def test_top_level_ref_argument_is_resolved(cluster):
    @tray.remote
    def kind(x):
        return type(x).__name__

    assert tray.get(kind.remote(tray.put(5))) == "int"


def test_ref_inside_list_argument_is_borrowed(cluster):
    @tray.remote
    def read_first(refs):
        first = refs[0]
        return type(first).__name__, tray.get(first)

    ref = tray.put("payload")
    type_name, value = tray.get(read_first.remote([ref]))
    assert type_name == type(ref).__name__
    assert value == "payload"


def test_ref_to_pending_task_inside_dict_argument(cluster):
    @tray.remote
    def read(d):
        return tray.get(d["ref"]) + 1

    pending = sleep_then_return.remote(cluster.tick_s, 41)
    assert tray.get(read.remote({"ref": pending})) == 42


def test_ref_inside_put_object(cluster):
    inner = tray.put(np.arange(10))
    outer = tray.put([inner, "tag"])
    got = tray.get(outer)
    assert got[1] == "tag"
    assert type(got[0]) is type(inner)
    assert np.array_equal(tray.get(got[0]), np.arange(10))


def test_ref_inside_ref_passed_to_task(cluster):
    @tray.remote
    def unwrap(lst):
        # The top-level ref is resolved to the list; the inner ref is not.
        return tray.get(lst[0]) * 2

    inner = tray.put(21)
    outer = tray.put([inner])
    del inner
    assert tray.get(unwrap.remote(outer)) == 42


def test_task_returns_ref_to_its_own_put(cluster):
    @tray.remote
    def producer():
        return [tray.put(np.full(100, 7))]

    [ref] = tray.get(producer.remote())
    assert tray.get(ref).sum() == 700


# ---------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------


def test_task_error_is_instance_of_user_exception(cluster):
    @tray.remote
    def fail_loudly():
        raise ValueError("boom-123")

    with pytest.raises(ValueError) as info:
        tray.get(fail_loudly.remote())
    err = info.value
    assert isinstance(err, TaskError)
    assert isinstance(err, TrayError)
    assert isinstance(err, tray.exceptions.RayTaskError)
    text = str(err)
    assert "boom-123" in text
    assert "fail_loudly" in text  # the remote traceback names the function
    assert "Traceback" in text or "line" in text


@tray.remote
def raise_in_task():
    raise ValueError("from a task")


@tray.remote
class RaisesEverywhere:
    def __init__(self, fail=False):
        if fail:
            raise ValueError("from a constructor")

    def sync_method(self):
        raise ValueError("from a method")

    async def async_method(self):
        raise ValueError("from an async method")


@tray.remote(max_concurrency=2)
class RaisesInThreads:
    def threaded_method(self):
        raise ValueError("from a threaded method")


def test_a_task_error_s_traceback_starts_at_the_user_s_code(one_node):
    """No frame of the worker, greenback, trio or asyncio before the user's:
    as in Ray, the traceback begins with the function that raised."""
    refs = {
        "raise_in_task": raise_in_task.remote(),
        "sync_method": RaisesEverywhere.remote().sync_method.remote(),
        "async_method": RaisesEverywhere.remote().async_method.remote(),
        "threaded_method": RaisesInThreads.remote().threaded_method.remote(),
        "__init__": RaisesEverywhere.remote(fail=True).sync_method.remote(),
    }
    for function, ref in refs.items():
        with pytest.raises(TrayError) as caught:
            tray.get(ref, timeout=60 * one_node.tick_s)
        text = str(caught.value)
        frames = [line for line in text.splitlines() if line.lstrip().startswith("File ")]
        assert frames, text
        assert __file__ in frames[0] and frames[0].endswith(f"in {function}"), text
        assert "greenback" not in text and "task_receiver" not in text, text


def test_task_error_custom_exception_class(cluster):
    class InventoryError(Exception):
        pass

    @tray.remote
    def check():
        raise InventoryError("out of stock")

    with pytest.raises(InventoryError) as info:
        tray.get(check.remote())
    assert isinstance(info.value, TaskError)
    assert "out of stock" in str(info.value)


def test_task_error_propagates_through_dependent_task(cluster):
    @tray.remote
    def fail():
        raise ValueError("root-cause")

    @tray.remote
    def dependent(x):
        return ("ran", x)

    ref = dependent.remote(add.remote(fail.remote(), 1))
    with pytest.raises(ValueError) as info:
        tray.get(ref)
    assert isinstance(info.value, TaskError)
    assert "root-cause" in str(info.value)


def test_task_error_inside_nested_get(cluster):
    @tray.remote
    def fail():
        raise KeyError("inner-key")

    @tray.remote
    def outer():
        return tray.get(fail.remote())

    with pytest.raises(KeyError) as info:
        tray.get(outer.remote())
    assert isinstance(info.value, TaskError)
    assert "inner-key" in str(info.value)


def test_task_can_catch_error_of_nested_task(cluster):
    @tray.remote
    def fail():
        raise ValueError("nested")

    @tray.remote
    def outer():
        try:
            tray.get(fail.remote())
        except ValueError as exc:
            return ("caught", isinstance(exc, TaskError))
        return ("not caught", False)

    assert tray.get(outer.remote()) == ("caught", True)


def test_failed_task_does_not_poison_later_tasks(cluster):
    @tray.remote
    def maybe_fail(i):
        if i % 2:
            raise RuntimeError(f"odd {i}")
        return i

    refs = [maybe_fail.remote(i) for i in range(6)]
    for i, ref in enumerate(refs):
        if i % 2:
            with pytest.raises(RuntimeError):
                tray.get(ref)
        else:
            assert tray.get(ref) == i


# ---------------------------------------------------------------------------
# Runtime context
# ---------------------------------------------------------------------------


def test_runtime_context_in_driver(cluster):
    ctx = tray.get_runtime_context()
    assert _is_hex(ctx.get_job_id())
    assert ctx.get_actor_id() is None
    node_ids = {n["NodeID"] for n in tray.nodes()}
    assert ctx.get_node_id() in node_ids


def test_runtime_context_in_task(cluster):
    @tray.remote
    def ids():
        ctx = tray.get_runtime_context()
        return ctx.get_job_id(), ctx.get_task_id(), ctx.get_actor_id(), ctx.get_node_id()

    (job1, task1, actor1, node1), (job2, task2, actor2, node2) = tray.get(
        [ids.remote(), ids.remote()]
    )
    driver_job = tray.get_runtime_context().get_job_id()
    assert job1 == job2 == driver_job
    assert _is_hex(task1)
    assert _is_hex(task2)
    assert task1 != task2
    assert actor1 is None
    assert actor2 is None
    node_ids = {n["NodeID"] for n in tray.nodes()}
    assert node1 in node_ids
    assert node2 in node_ids


def test_nested_task_has_its_own_task_id(cluster):
    @tray.remote
    def inner_id():
        return tray.get_runtime_context().get_task_id()

    @tray.remote
    def outer():
        return tray.get_runtime_context().get_task_id(), tray.get(inner_id.remote())

    outer_id, inner = tray.get(outer.remote())
    assert _is_hex(outer_id)
    assert _is_hex(inner)
    assert outer_id != inner


@tray.remote
class IdLog:
    """What each execution of a task or constructor made: (task id, ids)."""

    def __init__(self):
        self.runs = []

    def add(self, run):
        self.runs.append(run)
        return len(self.runs)

    def all(self):
        return list(self.runs)


@tray.remote
def noop():
    return None


@tray.remote(max_retries=1)
def make_ids_then_exit_once(log):
    put_ref, child_ref = tray.put("made"), noop.remote()
    tray.get(child_ref)
    runs = tray.get(log.add.remote((tray.get_runtime_context().get_task_id(),
                                    put_ref.hex(), child_ref.hex())))
    if runs == 1:
        raise SystemExit(1)  # ends the worker: the task runs again
    return "second run"


def test_a_retry_makes_children_and_puts_with_new_ids(one_node):
    """As Ray's TaskID::ForExecutionAttempt: a retry's puts and children
    must not reuse the first run's ids, whose objects may still sit in a
    store under the dead worker's ownership (simtest mixed chaos seed 2368)."""
    log = IdLog.remote()
    assert tray.get(make_ids_then_exit_once.remote(log), timeout=120 * one_node.tick_s) \
        == "second run"
    (task1, put1, child1), (task2, put2, child2) = tray.get(log.all.remote())
    assert task1 == task2  # the same task, run twice
    assert put1 != put2 and child1 != child2


@tray.remote(max_restarts=1)
class PutsInItsConstructor:
    def __init__(self, log):
        self.ref = tray.put("made")
        tray.get(log.add.remote(self.ref.hex()))

    def ref_hex(self):
        return self.ref.hex()


def test_a_restarted_actor_s_constructor_makes_puts_with_new_ids(one_node):
    log = IdLog.remote()
    actor = PutsInItsConstructor.remote(log)
    first = tray.get(actor.ref_hex.remote())
    tray.kill(actor, no_restart=False)
    deadline = time.monotonic() + 200 * one_node.tick_s
    while len(tray.get(log.all.remote())) < 2 and time.monotonic() < deadline:
        time.sleep(one_node.tick_s)
    assert tray.get(log.all.remote())[0] == first
    assert tray.get(actor.ref_hex.remote()) not in (first, None)
    assert len(set(tray.get(log.all.remote()))) == 2


# ---------------------------------------------------------------------------
# Resources and scheduling
# ---------------------------------------------------------------------------


def _intervals_overlap(a, b) -> bool:
    return a[0] < b[1] and b[0] < a[1]


@tray.remote
def timed_sleep(duration_s):
    start = time.time()
    time.sleep(duration_s)
    return start, time.time()


def test_tasks_needing_all_cpus_run_one_at_a_time(one_node):
    tick = one_node.tick_s
    refs = [timed_sleep.options(num_cpus=4).remote(5 * tick) for _ in range(3)]
    intervals = sorted(tray.get(refs))
    for a, b in zip(intervals, intervals[1:], strict=False):
        assert not _intervals_overlap(a, b), intervals


def test_small_tasks_run_concurrently(one_node):
    tick = one_node.tick_s
    refs = [timed_sleep.options(num_cpus=1).remote(5 * tick) for _ in range(4)]
    intervals = tray.get(refs)
    for a in intervals:
        for b in intervals:
            assert _intervals_overlap(a, b), intervals


def test_fractional_cpus(one_node):
    tick = one_node.tick_s
    # 8 tasks of half a CPU fit at once on 4 CPUs. (Long enough that 8 worker
    # processes start one after another on a loaded machine before the
    # first task ends.)
    refs = [timed_sleep.options(num_cpus=0.5).remote(12 * tick) for _ in range(8)]
    intervals = tray.get(refs)
    latest_start = max(s for s, _ in intervals)
    earliest_end = min(e for _, e in intervals)
    assert latest_start < earliest_end, intervals


@pytest.mark.cluster(resources={"widget": 2})
def test_custom_resource_task(cluster):
    @tray.remote(resources={"widget": 1})
    def uses_widget():
        return "widget ok"

    assert tray.get([uses_widget.remote() for _ in range(4)]) == ["widget ok"] * 4


@pytest.mark.cluster(resources={"widget": 1})
def test_custom_resource_limits_concurrency(one_node):
    tick = one_node.tick_s
    refs = [timed_sleep.options(resources={"widget": 1}).remote(5 * tick) for _ in range(2)]
    a, b = sorted(tray.get(refs))
    assert not _intervals_overlap(a, b)


def test_num_cpus_option_accepted_in_decorator(cluster):
    @tray.remote(num_cpus=2)
    def heavy():
        return "heavy"

    assert tray.get(heavy.remote(), timeout=100 * cluster.tick_s) == "heavy"


def test_memory_option_schedules_on_default_cluster(cluster):
    # Ray gives every node a "memory" resource by default, so a modest memory
    # request is feasible without configuring anything.
    @tray.remote(memory=10 * 1024 * 1024)
    def needs_memory():
        return "fits"

    assert tray.get(needs_memory.remote(), timeout=100 * cluster.tick_s) == "fits"


def test_spread_uses_more_than_one_node(three_nodes):
    refs = [
        sleep_then_return.options(scheduling_strategy="SPREAD").remote(three_nodes.tick_s, None)
        for _ in range(6)
    ]
    tray.get(refs)
    node_refs = [current_node_id.options(scheduling_strategy="SPREAD").remote() for _ in range(9)]
    used = set(tray.get(node_refs))
    assert len(used) > 1
    assert used <= {n["NodeID"] for n in tray.nodes()}


def test_default_strategy_overflows_to_other_nodes(three_nodes):
    @tray.remote
    def hold(duration_s):
        time.sleep(duration_s)
        return tray.get_runtime_context().get_node_id()

    # 12 one-CPU tasks at once cannot all fit on one 4-CPU node.
    used = set(tray.get([hold.remote(5 * three_nodes.tick_s) for _ in range(12)]))
    assert len(used) > 1


def test_node_affinity_hard_places_all_tasks_on_node(cluster):
    target = tray.nodes()[-1]["NodeID"]
    strategy = NodeAffinitySchedulingStrategy(target, soft=False)
    refs = [current_node_id.options(scheduling_strategy=strategy).remote() for _ in range(10)]
    assert set(tray.get(refs)) == {target}


def test_node_affinity_hard_each_node(three_nodes):
    for node in tray.nodes():
        node_id = node["NodeID"]
        strategy = NodeAffinitySchedulingStrategy(node_id=node_id, soft=False)
        refs = [current_node_id.options(scheduling_strategy=strategy).remote() for _ in range(3)]
        assert set(tray.get(refs)) == {node_id}


def test_node_affinity_soft_runs_on_node_when_free(three_nodes):
    target = tray.nodes()[1]["NodeID"]
    strategy = NodeAffinitySchedulingStrategy(target, soft=True)
    assert tray.get(current_node_id.options(scheduling_strategy=strategy).remote()) == target


# ---------------------------------------------------------------------------
# Retries and cancellation
# ---------------------------------------------------------------------------


@tray.remote
class Attempts:
    def __init__(self):
        self.count = 0

    def next(self):
        self.count += 1
        return self.count


def test_retry_exceptions_retries_application_errors(cluster):
    @tray.remote
    def flaky(attempts, fail_times):
        n = tray.get(attempts.next.remote())
        if n <= fail_times:
            raise ValueError(f"attempt {n} fails")
        return n

    attempts = Attempts.remote()
    ref = flaky.options(max_retries=3, retry_exceptions=True).remote(attempts, 2)
    assert tray.get(ref) == 3


def test_application_errors_not_retried_by_default(cluster):
    @tray.remote
    def flaky(attempts):
        n = tray.get(attempts.next.remote())
        raise ValueError(f"attempt {n} fails")

    attempts = Attempts.remote()
    with pytest.raises(ValueError, match="attempt 1 fails"):
        tray.get(flaky.options(max_retries=3).remote(attempts))
    assert tray.get(attempts.next.remote()) == 2


def test_retries_exhausted_raise_last_error(cluster):
    @tray.remote(max_retries=2, retry_exceptions=True)
    def always_fails(attempts):
        n = tray.get(attempts.next.remote())
        raise RuntimeError(f"attempt {n} fails")

    attempts = Attempts.remote()
    with pytest.raises(RuntimeError, match="attempt 3 fails"):
        tray.get(always_fails.remote(attempts))


def test_retry_exceptions_list_only_retries_listed_types(cluster):
    @tray.remote
    def fails_with_key_error(attempts):
        n = tray.get(attempts.next.remote())
        raise KeyError(f"attempt {n}")

    attempts = Attempts.remote()
    ref = fails_with_key_error.options(max_retries=3, retry_exceptions=[ValueError]).remote(
        attempts
    )
    with pytest.raises(KeyError):
        tray.get(ref)
    assert tray.get(attempts.next.remote()) == 2


def test_cancel_pending_task(cluster):
    from tray.exceptions import TaskCancelledError

    # Infeasible, so it is certainly still pending when cancelled.
    ref = identity.options(resources={"unobtainium": 1}).remote(1)
    tray.cancel(ref)
    with pytest.raises(TaskCancelledError):
        tray.get(ref, timeout=100 * cluster.tick_s)


def test_cancel_running_task(cluster):
    from tray.exceptions import TaskCancelledError

    ref = sleep_then_return.remote(1000 * cluster.tick_s, "never")
    # Make sure it has started before cancelling. Ray interrupts a running
    # synchronous task reliably only with force=True (it kills the worker).
    tray.wait([ref], timeout=cluster.tick_s)
    tray.cancel(ref, force=True)
    with pytest.raises(TaskCancelledError):
        tray.get(ref, timeout=100 * cluster.tick_s)


def test_cancel_does_not_affect_other_tasks(cluster):
    from tray.exceptions import TaskCancelledError

    victim = sleep_then_return.remote(1000 * cluster.tick_s, "never")
    survivor = sleep_then_return.remote(cluster.tick_s, "survived")
    tray.cancel(victim)
    assert tray.get(survivor, timeout=100 * cluster.tick_s) == "survived"
    with pytest.raises(TaskCancelledError):
        tray.get(victim, timeout=100 * cluster.tick_s)


def test_wait_fetch_local_false(cluster):
    refs = [identity.remote(i) for i in range(3)]
    ready, not_ready = tray.wait(refs, num_returns=3, fetch_local=False, timeout=100)
    assert ready == refs
    assert not_ready == []


def test_is_initialized_inside_tasks_and_actors(one_node):
    # Regression: on real processes it said False inside a task.
    @tray.remote
    def inside():
        return tray.is_initialized()

    assert tray.is_initialized() is True
    assert tray.get(inside.remote()) is True
