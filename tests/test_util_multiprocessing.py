"""tray.util.multiprocessing.Pool: the standard library's Pool API over tray
actors (ray/tests/test_multiprocessing.py's behaviours, tray's own tests),
where tray differs on purpose, and the errors users can cause."""

from __future__ import annotations

import itertools
import multiprocessing
import os
import pickle
import time

import pytest

import tray
import tray.simtest
from tray.util.multiprocessing import Pool, RemoteTraceback, TimeoutError

# ================================================================ functions

STATE = {}


def square(x):
    return x * x


def add(a, b):
    return a + b


def worker_id(_=None):
    """Which pool worker ran this: its actor id."""
    return tray.get_runtime_context().get_actor_id()


def remember(value):
    STATE["initialized"] = value


def recall(_=None):
    return STATE.get("initialized")


def fail_on_three(x):
    if x == 3:
        raise KeyError(f"three is bad ({x})")
    return x


def sleep_then(args):
    value, sleep_s = args
    time.sleep(sleep_s)
    return value


def crash_once(x):
    """Kills its worker process the first time it sees ``x`` (the simulator
    keeps ``STATE`` across the crash: one process)."""
    if x == 2 and not STATE.get("crashed"):
        STATE["crashed"] = True
        os._exit(1)
    return x * 10


def bad_initializer():
    raise OSError("no such device")


def nested_pool_sum(n):
    with Pool(processes=2) as inner:
        return sum(inner.map(square, range(n)))


@pytest.fixture
def sim():
    STATE.clear()
    tray.init(backend="sim", num_nodes=2, num_cpus=2, seed=0)
    yield
    tray.shutdown()


# ================================================================ both backends


def test_pool_api_on_both_backends(one_node):
    with Pool(processes=3, initializer=remember, initargs=("ready",)) as pool:
        assert pool.map(square, range(10)) == [x * x for x in range(10)]
        assert pool.starmap(add, [(1, 2), (3, 4)]) == [3, 7]
        assert list(pool.imap(square, range(5), chunksize=2)) == [0, 1, 4, 9, 16]
        assert sorted(pool.imap_unordered(square, iter(range(5)))) == [0, 1, 4, 9, 16]
        assert pool.apply(add, (2,), {"b": 5}) == 7
        result = pool.apply_async(square, (9,))
        assert result.get(timeout=60) == 81 and result.ready() and result.successful()
        # every worker ran the initializer; the work spread over all of them
        assert set(pool.map(recall, range(12), chunksize=1)) == {"ready"}
        assert len(set(pool.map(worker_id, range(12), chunksize=1))) == 3
        with pytest.raises(KeyError, match="three is bad") as caught:
            pool.map(fail_on_three, range(6))
        assert type(caught.value) is KeyError  # the original class, not a wrapper
        assert isinstance(caught.value.__cause__, RemoteTraceback)
        assert "fail_on_three" in str(caught.value.__cause__)
    with pytest.raises(ValueError, match="Pool not running"):
        pool.map(square, [1])


def test_pool_starts_a_local_cluster_when_none_runs():
    if "local" not in os.environ.get("TRAY_TEST_BACKENDS", "sim,local"):
        pytest.skip("local backend not selected")
    pool = Pool(processes=2)
    try:
        assert tray.is_initialized()
        assert tray.cluster_resources()["CPU"] == 2
        assert pool.map(square, [1, 2, 3]) == [1, 4, 9]
    finally:
        pool.terminate()
        tray.shutdown()


# ============================================================= the simulator


def test_pool_size_follows_the_cluster(sim):
    pool = Pool()
    assert pool.statistics().processes == 4  # 2 nodes x 2 CPUs
    assert len(set(pool.map(worker_id, range(8), chunksize=1))) == 4
    pool.terminate()
    with pytest.raises(ValueError, match="5 processes on a cluster with only 4 CPUs"):
        Pool(processes=5)


def test_workers_spread_over_the_nodes(sim):
    def node(_):
        return tray.get_runtime_context().get_node_id()

    with Pool(processes=4) as pool:
        assert len(set(pool.map(node, range(8), chunksize=1))) == 2


def test_chunks_and_order(sim):
    with Pool(processes=2) as pool:
        items = list(range(101))
        assert pool.map(square, items) == [x * x for x in items]
        assert pool.map(square, items, chunksize=7) == [x * x for x in items]
        assert pool.map(square, []) == []
        assert pool.starmap(add, zip(range(5), range(5), strict=True), chunksize=2) == [0, 2, 4, 6, 8]
        chunks_before = pool.statistics().chunks_submitted
        pool.map(square, range(16), chunksize=4)
        assert pool.statistics().chunks_submitted - chunks_before == 4


def test_maxtasksperchild_replaces_workers(sim):
    pool = Pool(processes=2, maxtasksperchild=1)
    assert len(set(pool.map(worker_id, range(6), chunksize=1))) == 6
    assert pool.statistics().actors_retired == 6
    pool.close()
    pool.join()
    assert pool.statistics().state == "TERMINATE"


def test_async_results_timeouts_and_readiness(sim):
    with Pool(processes=2) as pool:
        slow = pool.apply_async(sleep_then, ((5, 10.0),))
        assert not slow.ready()
        with pytest.raises(ValueError, match="not ready"):
            slow.successful()
        with pytest.raises(TimeoutError):
            slow.get(timeout=1.0)
        assert issubclass(TimeoutError, multiprocessing.TimeoutError)
        slow.wait(timeout=0.5)
        assert not slow.ready()
        slow.wait()
        assert slow.ready() and slow.successful() and slow.get() == 5

        failing = pool.map_async(fail_on_three, range(6))
        failing.wait()
        assert failing.ready() and not failing.successful()
        with pytest.raises(KeyError):
            failing.get()


def test_callbacks_run_once_when_the_result_is_seen(sim):
    seen, errors = [], []
    pool = Pool(processes=2)
    ok = pool.map_async(square, range(5), callback=seen.append, error_callback=errors.append)
    assert ok.get() == [0, 1, 4, 9, 16]
    assert seen == [[0, 1, 4, 9, 16]] and errors == []
    ok.get()
    assert len(seen) == 1  # once only

    pool.apply_async(fail_on_three, (3,), callback=seen.append, error_callback=errors.append)
    pool.apply_async(square, (6,), callback=seen.append)
    # not observed by the caller: join() runs what is due
    pool.close()
    pool.join()
    assert seen[1:] == [36]
    assert len(errors) == 1 and isinstance(errors[0], KeyError)


def test_a_raising_callback_does_not_break_the_pool(sim, caplog):
    def broken(_):
        raise RuntimeError("callback bug")

    with Pool(processes=1) as pool:
        assert pool.apply_async(square, (3,), callback=broken).get() == 9
        assert pool.map(square, [2]) == [4]
    assert "callback bug" in caplog.text


def test_imap_is_lazy_bounded_and_raises_in_place(sim):
    with Pool(processes=2) as pool:
        # an endless input: imap takes only what it needs (2 chunks per worker in flight)
        results = pool.imap(square, itertools.count(), chunksize=3)
        assert [next(results) for _ in range(10)] == [x * x for x in range(10)]
        assert pool.statistics().chunks_in_flight <= 4

        results = pool.imap(fail_on_three, range(6))
        got = []
        for _ in range(6):
            try:
                got.append(next(results))
            except KeyError:
                got.append("error")
        assert got == [0, 1, 2, "error", 4, 5]
        with pytest.raises(StopIteration):
            next(results)


def test_imap_timeouts_and_unordered_completion(sim):
    with Pool(processes=3) as pool:
        inputs = [(0, 0.1), (1, 5.0), (2, 0.1)]
        ordered = pool.imap(sleep_then, inputs)
        assert ordered.next() == 0
        with pytest.raises(TimeoutError):
            ordered.next(timeout=1.0)
        assert ordered.next() == 1
        assert ordered.next() == 2
        # Completion order, without ties (two equal sleeps may end in either order).
        staggered = [(0, 0.1), (1, 5.0), (2, 0.5)]
        assert list(pool.imap_unordered(sleep_then, staggered)) == [0, 2, 1]


def test_terminate_fails_work_in_flight(sim):
    pool = Pool(processes=2)
    running = pool.map_async(sleep_then, [(1, 100.0), (2, 100.0)], chunksize=1)
    pool.terminate()
    pool.join()
    with pytest.raises(tray.exceptions.ActorDiedError):
        running.get(timeout=10)
    assert running.ready() and not running.successful()


def test_close_lets_work_finish(sim):
    pool = Pool(processes=2)
    running = pool.map_async(sleep_then, [(1, 5.0), (2, 5.0)], chunksize=1)
    pool.close()
    with pytest.raises(ValueError, match="Pool not running: it was closed"):
        pool.apply(square, (1,))
    pool.join()
    assert running.get(timeout=0) == [1, 2]


def test_a_crashed_worker_is_restarted_and_its_chunk_rerun(sim):
    with Pool(processes=2) as pool:
        assert pool.map(crash_once, range(4), chunksize=1) == [0, 10, 20, 30]
    assert STATE["crashed"]


def test_a_pool_inside_a_task(sim):
    @tray.remote
    def outer(n):
        return nested_pool_sum(n)

    assert tray.get(outer.remote(4)) == 0 + 1 + 4 + 9


def test_failing_initializer_fails_the_pool(sim):
    with pytest.raises(RuntimeError, match="initializer .* failed in a worker: OSError") as caught:
        Pool(processes=2, initializer=bad_initializer)
    assert isinstance(caught.value.__cause__, OSError)


def test_bad_input_gets_clear_errors(sim, monkeypatch):
    with pytest.raises(ValueError, match="at least 1"):
        Pool(processes=0)
    with pytest.raises(TypeError, match="processes must be an int"):
        Pool(processes="4")
    with pytest.raises(TypeError, match="initializer must be a callable"):
        Pool(processes=1, initializer="setup")
    with pytest.raises(ValueError, match="maxtasksperchild"):
        Pool(processes=1, maxtasksperchild=0)
    with pytest.raises(TypeError, match="ray_remote_args"):
        Pool(processes=1, ray_remote_args=["num_cpus"])
    pool = Pool(processes=1)
    with pytest.raises(ValueError, match="still running"):
        pool.join()
    with pytest.raises(TypeError, match="func must be a callable"):
        pool.map("square", [1])
    with pytest.raises(TypeError, match="not iterable"):
        pool.map(square, 5)
    with pytest.raises(TypeError, match="not iterable"):
        pool.imap(square, 5)
    with pytest.raises(ValueError, match="Chunksize must be 1"):
        pool.imap(square, [1], chunksize=0)
    with pytest.raises(ValueError, match="Chunksize must be 1"):
        pool.map(square, [1], chunksize=-2)
    with pytest.raises(TypeError, match="args must be a tuple"):
        pool.apply_async(square, 3)
    with pytest.raises(TypeError, match="callback must be a callable"):
        pool.apply_async(square, (3,), callback="print")
    with pytest.raises(ValueError, match="timeout"):
        pool.apply_async(square, (3,)).get(timeout=-1)
    with pytest.raises(NotImplementedError, match="cannot be passed"):
        pickle.dumps(pool)
    pool.terminate()
    with pytest.raises(ValueError, match="Pool not running: it was terminated"):
        pool.map(square, [1])
    with pytest.raises(ValueError, match="Pool not running"):
        pool.__enter__()


def test_no_cluster_and_auto_init_off_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("TRAY_AUTO_INIT", "0")
    with pytest.raises(tray.exceptions.NotInitializedError, match="TRAY_AUTO_INIT=0"):
        Pool(processes=1)


def test_pool_replays_identically():
    def run() -> str:
        STATE.clear()
        tray.init(backend="sim", num_nodes=2, num_cpus=2, seed=9)
        try:
            with Pool(processes=3) as pool:
                assert list(pool.imap_unordered(sleep_then, [(i, (7 - i) / 10) for i in range(7)]))
                assert pool.map(square, range(20), chunksize=3)[-1] == 361
            return tray.simtest.trace_digest()
        finally:
            tray.shutdown()

    assert run() == run()
