"""The cluster as a whole: lifecycle, nodes, resource views, GPUs, infeasible
requests."""

from __future__ import annotations

import time

import pytest

import tray
from tray.exceptions import TrayError


@tray.remote
def sleep_then_return(duration_s, value):
    time.sleep(duration_s)
    return value


def _wait_until(predicate, poll_ref=None, tick_s=1.0, tries=200):
    """Poll ``predicate`` until it holds; between polls let time pass (virtual
    time in the simulator) by waiting briefly on a ref."""
    for _ in range(tries):
        if predicate():
            return True
        ref = poll_ref if poll_ref is not None else tray.put(None)
        tray.wait([ref], timeout=0.05 * tick_s)
        if poll_ref is None:
            time.sleep(0.001)
    return predicate()


def _is_hex(s) -> bool:
    if not isinstance(s, str) or not s:
        return False
    try:
        int(s, 16)
    except ValueError:
        return False
    return True


# ---------------------------------------------------------------------------
# Lifecycle
# ---------------------------------------------------------------------------


def test_api_before_init_raises_tray_error(monkeypatch):
    monkeypatch.setenv("TRAY_AUTO_INIT", "0")  # the explicit mode (auto-init: its own tests)
    assert not tray.is_initialized()

    @tray.remote
    def f():
        return 1

    with pytest.raises(TrayError):
        f.remote()
    with pytest.raises(TrayError):
        tray.put(1)
    with pytest.raises(TrayError):
        tray.nodes()
    assert not tray.is_initialized()  # no auto-init


def test_init_shutdown_init_again(backend, monkeypatch):
    monkeypatch.setenv("TRAY_AUTO_INIT", "0")  # after shutdown, calls fail (no auto-init)
    kwargs = {"seed": 0} if backend == "sim" else {}
    tray.init(backend=backend, num_cpus=2, **kwargs)
    assert tray.is_initialized()

    @tray.remote
    def f(x):
        return x + 1

    assert tray.get(f.remote(1)) == 2
    tray.shutdown()
    assert not tray.is_initialized()
    with pytest.raises(TrayError):
        f.remote(1)

    tray.init(backend=backend, num_cpus=2, **kwargs)
    assert tray.is_initialized()
    assert tray.get(f.remote(2)) == 3
    tray.shutdown()
    assert not tray.is_initialized()


def test_shutdown_when_not_initialized_is_harmless():
    assert not tray.is_initialized()
    tray.shutdown()
    assert not tray.is_initialized()


def test_unknown_backend_is_value_error():
    with pytest.raises(ValueError, match="no-such-backend"):
        tray.init(backend="no-such-backend")
    assert not tray.is_initialized()


def test_sim_same_seed_same_node_ids():
    tray.init(backend="sim", num_nodes=3, num_cpus=2, seed=11)
    first = [n["NodeID"] for n in tray.nodes()]
    tray.shutdown()
    tray.init(backend="sim", num_nodes=3, num_cpus=2, seed=11)
    second = [n["NodeID"] for n in tray.nodes()]
    tray.shutdown()
    assert first == second
    assert len(set(first)) == 3


# ---------------------------------------------------------------------------
# Nodes and resource views
# ---------------------------------------------------------------------------


def test_nodes(cluster):
    nodes = tray.nodes()
    assert len(nodes) == cluster.num_nodes
    ids = [n["NodeID"] for n in nodes]
    assert len(set(ids)) == cluster.num_nodes
    for node in nodes:
        assert _is_hex(node["NodeID"])
        assert node["Alive"] is True
        assert node["Resources"]["CPU"] == 4.0


def test_cluster_resources_sum_over_nodes(cluster):
    total = tray.cluster_resources()
    assert total["CPU"] == 4.0 * cluster.num_nodes
    assert total.get("GPU", 0) == 0


@pytest.mark.cluster(object_store_memory=64 * 1024**2)
def test_nodes_report_their_object_store_capacity(cluster):
    # As Ray's: each node's resources hold object_store_memory (bytes).
    for node in tray.nodes():
        assert node["Resources"]["object_store_memory"] == 64 * 1024**2
    assert tray.cluster_resources()["object_store_memory"] == 64 * 1024**2 * cluster.num_nodes
    free = tray.available_resources()["object_store_memory"]
    assert 0 < free <= 64 * 1024**2 * cluster.num_nodes


@pytest.mark.cluster(num_cpus=3, num_gpus=2, resources={"widget": 5})
def test_cluster_resources_with_gpus_and_custom(cluster):
    total = tray.cluster_resources()
    n = cluster.num_nodes
    assert total["CPU"] == 3.0 * n
    assert total["GPU"] == 2.0 * n
    assert total["widget"] == 5.0 * n
    for node in tray.nodes():
        assert node["Resources"]["GPU"] == 2.0
        assert node["Resources"]["widget"] == 5.0


def test_available_resources_full_when_idle(cluster):
    total = tray.cluster_resources()
    assert _wait_until(lambda: tray.available_resources().get("CPU") == total["CPU"])


def test_available_resources_drop_while_running_and_return(cluster):
    tick = cluster.tick_s
    total_cpu = tray.cluster_resources()["CPU"]
    long = sleep_then_return.options(num_cpus=2).remote(30 * tick, "done")
    assert _wait_until(
        lambda: tray.available_resources().get("CPU") == total_cpu - 2,
        poll_ref=long,
        tick_s=tick,
    ), tray.available_resources()
    assert tray.get(long) == "done"
    assert _wait_until(lambda: tray.available_resources().get("CPU") == total_cpu), (
        tray.available_resources()
    )


@pytest.mark.cluster(num_gpus=2, resources={"widget": 3})
def test_available_resources_return_to_full_after_tasks(cluster):
    @tray.remote
    def work(x):
        time.sleep(0.5)
        return x

    total = tray.cluster_resources()
    refs = [work.options(num_cpus=1).remote(i) for i in range(10)]
    refs += [work.options(num_gpus=1).remote(i) for i in range(4)]
    refs += [work.options(num_gpus=0.5, resources={"widget": 1}).remote(i) for i in range(4)]
    tray.get(refs)

    def full():
        avail = tray.available_resources()
        return all(avail.get(k) == total[k] for k in ("CPU", "GPU", "widget"))

    assert _wait_until(full), (tray.available_resources(), total)


# ---------------------------------------------------------------------------
# GPUs
# ---------------------------------------------------------------------------


@tray.remote
def gpu_ids_after(duration_s):
    start = time.time()
    time.sleep(duration_s)
    return tray.get_gpu_ids(), start, time.time()


@pytest.mark.cluster(num_gpus=2)
def test_task_with_one_gpu_sees_one_id(one_node):
    ids, _, _ = tray.get(gpu_ids_after.options(num_gpus=1).remote(0))
    assert len(ids) == 1
    assert ids[0] in {0, 1}
    assert all(isinstance(i, int) for i in ids)


@pytest.mark.cluster(num_gpus=2)
def test_task_with_two_gpus_sees_both(one_node):
    ids, _, _ = tray.get(gpu_ids_after.options(num_gpus=2).remote(0))
    assert sorted(ids) == [0, 1]


@pytest.mark.cluster(num_gpus=2)
def test_concurrent_gpu_tasks_get_different_ids(one_node):
    tick = one_node.tick_s
    a, b = tray.get([gpu_ids_after.options(num_gpus=1).remote(5 * tick) for _ in range(2)])
    (ids_a, start_a, end_a), (ids_b, start_b, end_b) = a, b
    assert start_a < end_b and start_b < end_a, "both fit at once, so they overlap"
    assert len(ids_a) == 1
    assert len(ids_b) == 1
    assert ids_a != ids_b
    assert set(ids_a + ids_b) == {0, 1}


@pytest.mark.cluster(num_gpus=2)
def test_gpu_tasks_beyond_capacity_queue(one_node):
    tick = one_node.tick_s
    results = tray.get([gpu_ids_after.options(num_gpus=1).remote(5 * tick) for _ in range(4)])
    # At no instant do more than two one-GPU tasks run.
    events = sorted([(s, 1) for _, s, _ in results] + [(e, -1) for _, _, e in results])
    running = max_running = 0
    for _, delta in events:
        running += delta
        max_running = max(max_running, running)
    assert max_running <= 2
    for ids, _, _ in results:
        assert len(ids) == 1
        assert ids[0] in {0, 1}


@pytest.mark.cluster(num_gpus=2)
def test_fractional_gpu(one_node):
    ids, _, _ = tray.get(gpu_ids_after.options(num_gpus=0.5).remote(0))
    assert len(ids) == 1
    assert ids[0] in {0, 1}


@pytest.mark.cluster(num_gpus=2)
def test_fractional_gpus_share_devices(one_node):
    tick = one_node.tick_s
    results = tray.get([gpu_ids_after.options(num_gpus=0.5).remote(5 * tick) for _ in range(4)])
    latest_start = max(s for _, s, _ in results)
    earliest_end = min(e for _, _, e in results)
    assert latest_start < earliest_end, "four half-GPU tasks fit on two GPUs at once"
    used = [ids[0] for ids, _, _ in results]
    assert sorted(used) == [0, 0, 1, 1]


@pytest.mark.cluster(num_gpus=2)
def test_task_without_gpus_sees_no_ids(one_node):
    ids, _, _ = tray.get(gpu_ids_after.remote(0))
    assert ids == []


@pytest.mark.cluster(num_gpus=2)
def test_gpu_actor_keeps_its_device(one_node):
    @tray.remote(num_gpus=1)
    class GpuActor:
        def ids(self):
            return tray.get_gpu_ids()

    a = GpuActor.remote()
    b = GpuActor.remote()
    a_ids = tray.get([a.ids.remote() for _ in range(3)])
    b_ids = tray.get(b.ids.remote())
    assert a_ids[0] == a_ids[1] == a_ids[2]
    assert len(a_ids[0]) == 1
    assert len(b_ids) == 1
    assert a_ids[0] != b_ids


@pytest.mark.cluster(num_gpus=2)
def test_gpu_ids_on_every_node(cluster):
    from tray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    for node in tray.nodes():
        strategy = NodeAffinitySchedulingStrategy(node["NodeID"], soft=False)
        ids, _, _ = tray.get(
            gpu_ids_after.options(num_gpus=1, scheduling_strategy=strategy).remote(0)
        )
        assert len(ids) == 1
        assert ids[0] in {0, 1}


# ---------------------------------------------------------------------------
# Infeasible requests
# ---------------------------------------------------------------------------


@pytest.mark.cluster(num_gpus=2)
def test_infeasible_gpu_request_stays_pending(cluster):
    ref = gpu_ids_after.options(num_gpus=4).remote(0)
    ready, not_ready = tray.wait([ref], timeout=1)
    assert ready == []
    assert not_ready == [ref]
    # It does not block feasible work.
    assert tray.get(sleep_then_return.remote(0, "feasible")) == "feasible"
    ready, not_ready = tray.wait([ref], timeout=1)
    assert ready == []


def test_infeasible_custom_resource_stays_pending(cluster):
    ref = sleep_then_return.options(resources={"unobtainium": 1}).remote(0, "x")
    ready, not_ready = tray.wait([ref], timeout=1)
    assert ready == []
    assert not_ready == [ref]
    with pytest.raises(TimeoutError):
        tray.get(ref, timeout=1)


def test_infeasible_actor_stays_pending(cluster):
    @tray.remote(num_cpus=1000)
    class Huge:
        def ping(self):
            return "pong"

    h = Huge.remote()
    ref = h.ping.remote()
    ready, not_ready = tray.wait([ref], timeout=1)
    assert ready == []
    assert not_ready == [ref]
