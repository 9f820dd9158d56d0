"""The autoscaler: config checks, the policy as a pure state machine, the GCS's
demand table, and the whole loop on the simulated provider (virtual time)."""

from __future__ import annotations

import logging
import time

import pytest

import tray
import tray.autoscaler as autoscaler
from tray.autoscaler import sdk
from tray.autoscaler.policy import FAILED, LAUNCHING, RUNNING, Autoscaler, ProviderNode
from tray.core.gcs.demand import ClusterLoad, NodeLoad

BASE = {
    "max_workers": 10,
    "idle_timeout_minutes": 0.5,
    "autoscaler_period_s": 1.0,
    "head_node_type": "head",
    "available_node_types": {
        "head": {"resources": {}, "max_workers": 0},
        "small": {"resources": {"CPU": 2}, "min_workers": 0, "max_workers": 8},
        "gpu": {"resources": {"CPU": 4, "GPU": 1}, "min_workers": 0, "max_workers": 2},
    },
    "provider": {"type": "sim", "boot_delay_s": [1.0, 3.0]},
}


def config(**changes):
    raw = {**BASE, **changes}
    return autoscaler.from_dict(raw)


# ================================================================ config


@pytest.mark.parametrize("raw, message", [
    ({**BASE, "head_node_type": "nope"}, "head_node_type 'nope' is not one of"),
    ({**BASE, "available_node_types": {"head": {"resources": {}},
                                       "w": {"min_workers": 3, "max_workers": 1}}},
     "available_node_types.w.max_workers (1) is below its min_workers (3)"),
    ({**BASE, "available_node_types": {"head": {"resources": {"CPU": "four"}}}},
     "available_node_types.head.resources.CPU must be a number"),
    ({**BASE, "available_node_types": {"head": {"min_workers": -1}}},
     "min_workers must be at least 0"),
    ({**BASE, "max_workers": 1,
      "available_node_types": {"head": {}, "w": {"min_workers": 2, "max_workers": 3}}},
     "max_workers (1) is below the sum of the node types' min_workers (2)"),
    ({**BASE, "provider": {"type": "aws"}}, "provider.type 'aws' is not one tray has"),
    ({**BASE, "upscaling_speed": 0}, "upscaling_speed must be positive"),
    ({**BASE, "available_node_types": {}}, "available_node_types must name at least one"),
    ({**BASE, "provider": {"type": "sim", "boot_failure_probability": 1.0}},
     "boot_failure_probability must be below 1"),
])
def test_bad_config_is_a_clear_error(raw, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        autoscaler.from_dict(raw)


def test_yaml_config_with_rays_keys(tmp_path):
    path = tmp_path / "cluster.yaml"
    path.write_text(
        "cluster_name: demo\n"
        "max_workers: 4\n"
        "upscaling_speed: 2.0\n"
        "idle_timeout_minutes: 1\n"
        "auth: {ssh_user: ubuntu}\n"  # Ray keys tray does not use are accepted
        "head_node_type: head\n"
        "available_node_types:\n"
        "  head: {resources: {CPU: 0}, max_workers: 0}\n"
        "  worker: {resources: {CPU: 4, custom: 1}, min_workers: 1, max_workers: 3,\n"
        "           node_config: {InstanceType: m5.xlarge}}\n"
        "provider: {type: local}\n")
    loaded = autoscaler.load(str(path))
    assert loaded.max_workers == 4
    assert loaded.upscaling_speed == 2.0
    assert loaded.idle_timeout_s == 60.0
    assert loaded.provider_type == "local"
    worker = loaded.node_types["worker"]
    assert worker.resources == {"CPU": 4.0, "custom": 1.0}
    assert (worker.min_workers, worker.max_workers) == (1, 3)
    assert worker.node_config == {"InstanceType": "m5.xlarge"}
    assert [t.name for t in loaded.worker_types()] == ["worker"]


def test_unreadable_yaml_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match="cannot read the cluster config"):
        autoscaler.load(str(tmp_path / "missing.yaml"))
    bad = tmp_path / "bad.yaml"
    bad.write_text("available_node_types: [unclosed\n")
    with pytest.raises(ValueError, match="not valid YAML"):
        autoscaler.load(str(bad))


# ================================================================ policy


def load(nodes=(), shapes=(), groups=(), requested=()):
    return ClusterLoad(tuple(nodes), tuple(shapes), tuple(groups), tuple(requested))


def node(node_id, total, available=None, leases=0, bundles=0):
    return NodeLoad(node_id, f"addr-{node_id}", dict(total), dict(available or total), True,
                    leases, bundles)


HEAD = node("head", {"CPU": 0.0})


def test_policy_bin_packs_demand_onto_the_type_that_holds_it():
    policy = Autoscaler(config())
    decisions = policy.update(load([HEAD], shapes=[({"CPU": 1.0}, 5)]), [], now=0.0)
    assert [(d.action, d.node_type, d.count) for d in decisions] == [("launch", "small", 3)]
    # A GPU request can only go to the gpu type.
    decisions = Autoscaler(config()).update(
        load([HEAD], shapes=[({"CPU": 1.0, "GPU": 1.0}, 1)]), [], now=0.0)
    assert [(d.action, d.node_type, d.count) for d in decisions] == [("launch", "gpu", 1)]


def test_policy_counts_booting_nodes_and_free_resources():
    policy = Autoscaler(config())
    booting = [ProviderNode("p1", "small", LAUNCHING)]
    # 2 CPUs booting hold 2 of the 3 requests: one more node.
    decisions = policy.update(load([HEAD], shapes=[({"CPU": 1.0}, 3)]), booting, now=0.0)
    assert [(d.action, d.count) for d in decisions] == [("launch", 1)]
    # Free resources on a running node hold the demand: nothing to do.
    running = [ProviderNode("p1", "small", RUNNING, node_id="n1")]
    decisions = policy.update(load([HEAD, node("n1", {"CPU": 2.0})],
                                   shapes=[({"CPU": 1.0}, 2)]), running, now=1.0)
    assert decisions == []


def test_policy_never_exceeds_max_workers_and_upscaling_speed():
    policy = Autoscaler(config(max_workers=3))
    decisions = policy.update(load([HEAD], shapes=[({"CPU": 1.0}, 100)]), [], now=0.0)
    assert sum(d.count for d in decisions if d.action == "launch") == 3
    # upscaling_speed: at most max(5, speed * nodes) booting at once.
    policy = Autoscaler(config(max_workers=100, upscaling_speed=1.0,
                               available_node_types={
                                   "head": {"resources": {}, "max_workers": 0},
                                   "small": {"resources": {"CPU": 2}, "max_workers": 100}}))
    decisions = policy.update(load([HEAD], shapes=[({"CPU": 1.0}, 1000)]), [], now=0.0)
    assert sum(d.count for d in decisions if d.action == "launch") == 5
    # The per-type max holds too.
    decisions = Autoscaler(config()).update(
        load([HEAD], shapes=[({"GPU": 1.0}, 10)]), [], now=0.0)
    assert sum(d.count for d in decisions if d.action == "launch") == 2


def test_policy_launches_min_workers_without_demand():
    policy = Autoscaler(config(available_node_types={
        "head": {"resources": {}, "max_workers": 0},
        "small": {"resources": {"CPU": 2}, "min_workers": 2, "max_workers": 4}}))
    decisions = policy.update(load([HEAD]), [], now=0.0)
    assert [(d.action, d.count, d.reason) for d in decisions] == \
        [("launch", 2, "min_workers")]


def test_policy_reports_infeasible_shapes_once(caplog):
    policy = Autoscaler(config())
    with caplog.at_level(logging.WARNING, logger="tray.autoscaler"):
        first = policy.update(load([HEAD], shapes=[({"TPU": 1.0}, 2)]), [], now=0.0)
        second = policy.update(load([HEAD], shapes=[({"TPU": 1.0}, 2)]), [], now=1.0)
    assert [d.action for d in first] == ["infeasible"]
    assert second == []
    assert "No available node types can fulfill resource request {'TPU': 1.0}" in caplog.text
    assert policy.status.infeasible == ({"TPU": 1.0},)


def test_policy_removes_idle_nodes_after_the_timeout_only():
    policy = Autoscaler(config())
    running = [ProviderNode("p1", "small", RUNNING, node_id="n1"),
               ProviderNode("p2", "small", RUNNING, node_id="n2"),
               ProviderNode("p3", "small", RUNNING, node_id="n3")]
    nodes = [HEAD, node("n1", {"CPU": 2.0}),
             node("n2", {"CPU": 2.0}, {"CPU": 1.0}, leases=1),  # runs a task
             node("n3", {"CPU": 2.0})]
    objects = {"n3": 1024}  # holds an object an owner may need
    assert policy.update(load(nodes), running, now=0.0, objects_held=objects) == []
    assert policy.update(load(nodes), running, now=29.0, objects_held=objects) == []
    decisions = policy.update(load(nodes), running, now=30.0, objects_held=objects)
    assert [(d.action, d.provider_id) for d in decisions] == [("terminate", "p1")]


def test_policy_keeps_min_workers_and_nodes_request_resources_needs():
    policy = Autoscaler(config(available_node_types={
        "head": {"resources": {}, "max_workers": 0},
        "small": {"resources": {"CPU": 2}, "min_workers": 1, "max_workers": 4}}))
    running = [ProviderNode("p1", "small", RUNNING, node_id="n1"),
               ProviderNode("p2", "small", RUNNING, node_id="n2"),
               ProviderNode("p3", "small", RUNNING, node_id="n3")]
    nodes = [HEAD] + [node(f"n{i}", {"CPU": 2.0}) for i in (1, 2, 3)]
    requested = [{"CPU": 2.0}]  # request_resources keeps one node
    policy.update(load(nodes, requested=requested), running, now=0.0)
    decisions = policy.update(load(nodes, requested=requested), running, now=100.0)
    terminated = sorted(d.provider_id for d in decisions if d.action == "terminate")
    assert terminated == ["p2", "p3"]  # p1 is kept for the request (and min_workers)


def test_policy_request_resources_scales_against_totals():
    policy = Autoscaler(config())
    busy = node("n1", {"CPU": 2.0}, {"CPU": 0.0}, leases=2)
    running = [ProviderNode("p1", "small", RUNNING, node_id="n1")]
    # 6 CPUs requested; the cluster has 2 (busy or not): 2 more small nodes.
    decisions = policy.update(load([HEAD, busy], requested=[{"CPU": 1.0}] * 6), running,
                              now=0.0)
    assert [(d.action, d.node_type, d.count) for d in decisions] == [("launch", "small", 2)]


def test_policy_backs_off_after_a_failed_boot():
    policy = Autoscaler(config(available_node_types={
        "head": {"resources": {}, "max_workers": 0},
        "small": {"resources": {"CPU": 2}, "max_workers": 4}}))
    demand = load([HEAD], shapes=[({"CPU": 1.0}, 1)])
    decisions = policy.update(demand, [ProviderNode("p1", "small", FAILED, error="no capacity")],
                              now=0.0)
    assert [d.action for d in decisions] == ["boot_failed"]
    assert "no capacity; next launch of this type in 5 s" in decisions[0].reason
    assert policy.update(demand, [], now=4.0) == []  # backing off
    assert [d.action for d in policy.update(demand, [], now=5.0)] == ["launch"]
    # A second failure doubles the wait.
    decisions = policy.update(demand, [ProviderNode("p2", "small", FAILED)], now=6.0)
    assert "in 10 s" in decisions[0].reason
    assert policy.failed_boots == 2


def test_policy_strict_spread_bundles_need_a_node_each():
    policy = Autoscaler(config())
    group = ("pg1", "STRICT_SPREAD", [{"CPU": 1.0}] * 3)
    decisions = policy.update(load([HEAD], groups=[group]), [], now=0.0)
    assert [(d.action, d.count) for d in decisions] == [("launch", 3)]
    group = ("pg2", "STRICT_PACK", [{"CPU": 1.0}] * 4)  # 4 CPUs on one node: gpu type
    decisions = Autoscaler(config()).update(load([HEAD], groups=[group]), [], now=0.0)
    assert [(d.action, d.node_type) for d in decisions] == [("launch", "gpu")]


def test_policy_forgets_a_crashed_node():
    policy = Autoscaler(config())
    lost = [ProviderNode("p1", "small", RUNNING, node_id="gone")]
    # Booted, not registered yet: it counts as booting, not as lost.
    assert policy.update(load([HEAD], shapes=[({"CPU": 1.0}, 2)]), lost, now=0.0) == []
    busy = node("gone", {"CPU": 2.0}, {"CPU": 0.0}, leases=2)
    assert policy.update(load([HEAD, busy]), lost, now=1.0) == []
    decisions = policy.update(load([HEAD]), lost, now=2.0)  # registered, then gone
    assert [(d.action, d.provider_id) for d in decisions] == [("node_lost", "p1")]


# ======================================================== demand in the GCS


def test_gcs_aggregates_queued_infeasible_actor_and_group_demand():
    from tray.api.blocking import gcs_call
    from tray.util.placement_group import placement_group

    tray.init(backend="sim", seed=3, num_cpus=1)
    try:
        @tray.remote
        def hold(seconds):
            time.sleep(seconds)
            return seconds

        @tray.remote(resources={"accel": 1})
        class Needy:
            def ping(self):
                return 1

        running = [hold.remote(20.0) for _ in range(3)]  # 1 runs, 2 queue
        infeasible = hold.options(num_cpus=16).remote(1.0)  # no node has 16 CPUs
        actor = Needy.remote()  # no node has "accel"
        group = placement_group([{"CPU": 8}], strategy="PACK")  # never fits
        time.sleep(3.0)  # a few heartbeats: the nodes report
        demand = gcs_call("get_cluster_load")
        shapes = {tuple(sorted(shape.items())): count for shape, count in demand.shapes}
        assert shapes.get((("CPU", 1.0),), 0) >= 2
        assert shapes.get((("CPU", 16.0),), 0) >= 1
        assert shapes.get((("CPU", 1.0), ("accel", 1.0)), 0) == 1 or \
            shapes.get((("accel", 1.0),), 0) == 1
        assert [(strategy, bundles) for _, strategy, bundles in demand.placement_groups] == \
            [("PACK", [{"CPU": 8.0}])]
        assert [n.leases for n in demand.nodes] == [1]
        sdk.request_resources(num_cpus=3, bundles=[{"GPU": 1}])
        assert gcs_call("get_cluster_load").requested == \
            ({"CPU": 1.0}, {"CPU": 1.0}, {"CPU": 1.0}, {"GPU": 1.0})
        sdk.request_resources()
        assert gcs_call("get_cluster_load").requested == ()
        del running, infeasible, actor, group
    finally:
        tray.shutdown()


@pytest.mark.parametrize("kwargs, message", [
    ({"num_cpus": -1}, "num_cpus must be a non-negative integer"),
    ({"num_cpus": 1.5}, "num_cpus must be a non-negative integer"),
    ({"bundles": {"CPU": 1}}, "bundles must be a list of dicts"),
    ({"bundles": [{}]}, r"bundles\[0\] must be a non-empty dict"),
    ({"bundles": [{"CPU": -2}]}, r"bundles\[0\]: 'CPU' must map to a non-negative number"),
])
def test_request_resources_bad_input(kwargs, message):
    with pytest.raises(ValueError, match=message):
        sdk.request_resources(**kwargs)


# ============================================ the loop on the sim provider


SIM_CONFIG = {
    "max_workers": 6, "idle_timeout_minutes": 0.25, "autoscaler_period_s": 1.0,
    "head_node_type": "head",
    "available_node_types": {
        "head": {"resources": {}, "max_workers": 0},
        "worker": {"resources": {"CPU": 2, "work": 2}, "min_workers": 0, "max_workers": 5},
    },
    "provider": {"type": "sim", "boot_delay_s": [1.0, 2.0]},
}


@tray.remote(resources={"work": 1})
def _on_worker(value):
    time.sleep(1.0)
    return value * 2


def _scale_up_and_down(seed: int) -> tuple:
    from tray.simtest import trace_digest

    tray.init(backend="sim", seed=seed, num_cpus=1)
    try:
        monitor = autoscaler.start(SIM_CONFIG)
        started = time.time()
        values = tray.get([_on_worker.remote(i) for i in range(10)])
        assert values == [2 * i for i in range(10)]
        alive = sum(1 for n in tray.nodes() if n["Alive"])
        launched = sum(d.count for d in monitor.decisions if d.action == "launch")
        time.sleep(15.0 + 3.0)  # idle timeout + periods
        after = sum(1 for n in tray.nodes() if n["Alive"])
        status = autoscaler.read_status()
        monitor.stop()
        assert monitor.provider.violations == []
        return values, alive, launched, after, status, time.time() - started, trace_digest()
    finally:
        tray.shutdown()


def test_sim_scales_up_for_work_and_back_down_when_idle():
    values, alive, launched, after, status, _, _ = _scale_up_and_down(seed=5)
    assert 2 <= launched <= 5  # 10 one-unit tasks, 2 units a node, at most 5 nodes
    assert alive >= 2  # the head and at least one worker ran them
    assert after == 1  # only the head is left
    assert status["nodes_by_type"] == {}
    actions = [d["action"] for d in status["decisions"]]
    assert "launch" in actions and "terminate" in actions
    text = autoscaler.format_status(status)
    assert "Recent decisions:" in text and "terminate worker" in text


def test_sim_autoscaling_replays_bit_for_bit():
    first = _scale_up_and_down(seed=11)
    second = _scale_up_and_down(seed=11)
    assert first[-1] == second[-1]  # the trace digests
    assert first[:4] == second[:4]


def test_sim_request_resources_scales_without_tasks():
    tray.init(backend="sim", seed=2, num_cpus=1)
    try:
        monitor = autoscaler.start(SIM_CONFIG)
        sdk.request_resources(bundles=[{"work": 2}] * 3)
        time.sleep(6.0)
        workers = [n for n in tray.nodes() if n["Alive"] and n["Resources"].get("work")]
        assert len(workers) == 3
        sdk.request_resources()  # withdrawn: they are idle now
        time.sleep(15.0 + 3.0)
        assert [n for n in tray.nodes() if n["Alive"] and n["Resources"].get("work")] == []
        monitor.stop()
    finally:
        tray.shutdown()


def test_sim_boot_failures_are_retried_and_reported():
    config = {**SIM_CONFIG, "provider": {"type": "sim", "boot_delay_s": 1.0,
                                         "boot_failure_probability": 0.5}}
    tray.init(backend="sim", seed=5, num_cpus=1)
    try:
        monitor = autoscaler.start(config)
        values = tray.get([_on_worker.remote(i) for i in range(6)], timeout=600)
        assert values == [2 * i for i in range(6)]
        failures = [d for d in monitor.decisions if d.action == "boot_failed"]
        assert failures, "seed 5 with p=0.5 fails its first boots"
        assert monitor.status.failed_boots == len(failures)
        monitor.stop()
    finally:
        tray.shutdown()


def test_sim_infeasible_task_is_reported_not_launched_for(caplog):
    tray.init(backend="sim", seed=1, num_cpus=1)
    try:
        monitor = autoscaler.start(SIM_CONFIG)
        with caplog.at_level(logging.WARNING, logger="tray.autoscaler"):
            ref = _on_worker.options(resources={"work": 1, "TPU": 1}).remote(1)
            ready, _ = tray.wait([ref], timeout=5.0)
        assert ready == []  # it stays pending, as in Ray
        assert "No available node types can fulfill resource request" in caplog.text
        assert [d.action for d in monitor.decisions] == ["infeasible"]
        assert monitor.status.infeasible == ({"CPU": 1.0, "TPU": 1.0, "work": 1.0},)
        monitor.stop()
    finally:
        tray.shutdown()


def test_start_needs_a_cluster_and_a_good_config():
    with pytest.raises(RuntimeError, match=r"needs a running cluster"):
        autoscaler.start(SIM_CONFIG)
    with pytest.raises(ValueError, match="config must be a path, a dict"):
        autoscaler.start(42)


# ====================================== the lease manager's part: spill, drain


def test_queued_work_moves_to_a_node_that_joins():
    from tray.simtest import cluster

    tray.init(backend="sim", seed=6, num_cpus=1)
    try:
        @tray.remote
        def slow():
            time.sleep(10.0)
            return tray.get_runtime_context().get_node_id()

        sim = cluster()
        start = sim.clock.current_time()
        refs = [slow.remote() for _ in range(3)]  # one runs, two queue on the only node
        time.sleep(1.0)
        sim.add_node({"CPU": 2})
        nodes = tray.get(refs)
        elapsed = sim.clock.current_time() - start
        assert len(set(nodes)) == 2  # the queued two ran on the new node
        assert elapsed < 15.0  # not 30 s one after another
    finally:
        tray.shutdown()


def test_a_node_drains_only_when_empty_and_then_takes_no_work():
    from tray.api.blocking import block
    from tray.core.context import get_worker
    from tray.simtest import cluster
    from tray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    tray.init(backend="sim", seed=8, num_cpus=1, num_nodes=2)
    try:
        sim = cluster()
        second = sim.node_ids()[1]
        address = next(n["NodeManagerAddress"] for n in tray.nodes() if n["NodeID"] == second)
        worker = get_worker()

        def drain():
            async def call():
                return await worker.endpoint.call(address, "drain")
            return block(worker, call)

        @tray.remote
        def hold(seconds):
            time.sleep(seconds)
            return tray.get_runtime_context().get_node_id()

        pinned = hold.options(scheduling_strategy=NodeAffinitySchedulingStrategy(
            second, soft=False)).remote(5.0)
        time.sleep(1.0)
        assert drain() is False  # a lease is held there
        assert tray.get(pinned) == second
        time.sleep(1.0)
        assert drain() is True
        # Work that would have gone there runs on the other node.
        assert set(tray.get([hold.remote(0.5) for _ in range(4)])) == {sim.node_ids()[0]}
    finally:
        tray.shutdown()


def test_policy_gives_up_on_a_node_that_booted_but_never_registered():
    policy = Autoscaler(config())
    stuck = [ProviderNode("p1", "small", RUNNING, node_id="never")]
    assert policy.update(load([HEAD]), stuck, now=0.0) == []
    assert policy.update(load([HEAD]), stuck, now=20.0) == []
    decisions = policy.update(load([HEAD]), stuck, now=21.0)
    assert [(d.action, d.provider_id) for d in decisions] == [("node_lost", "p1")]
    assert "did not register within 20 s" in decisions[0].reason
