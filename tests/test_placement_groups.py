"""Placement groups: bundles reserved together across nodes, as Ray's
``ray.util.placement_group``; strategies, exclusivity of bundle resources,
removal, names, capture of child tasks, bad input; in the simulator, bundles
lost with a node are placed again."""

from __future__ import annotations

import time

import pytest

import tray
import tray.simtest
from tray import exceptions as tex
from tray.util import (
    get_current_placement_group,
    get_placement_group,
    placement_group,
    placement_group_table,
    remove_placement_group,
)
from tray.util.scheduling_strategies import PlacementGroupSchedulingStrategy


@tray.remote
def node_of() -> str:
    return tray.get_runtime_context().get_node_id()


@tray.remote
def current_group():
    group = get_current_placement_group()
    return None if group is None else group.id.hex()


@tray.remote
def group_of_child():
    return tray.get(current_group.remote())


@tray.remote
class Pinned:
    def node(self) -> str:
        return tray.get_runtime_context().get_node_id()

    def group(self):
        group = get_current_placement_group()
        return None if group is None else group.id.hex()


def _in(pg, index=-1, capture=None):
    return PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=index,
                                            placement_group_capture_child_tasks=capture)


def _eventually(condition, timeout_s: float = 20.0) -> bool:
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if condition():
            return True
        time.sleep(0.1)
    return condition()


# ================================================================ placing


@pytest.mark.cluster(num_cpus=2)
def test_strict_spread_puts_each_bundle_on_its_own_node(three_nodes):
    pg = placement_group([{"CPU": 1}] * 3, strategy="STRICT_SPREAD")
    assert pg.wait(30)
    assert tray.get(pg.ready()) == pg
    table = placement_group_table(pg)
    assert table["state"] == "CREATED" and table["strategy"] == "STRICT_SPREAD"
    assert len(set(table["bundles_to_node_id"].values())) == 3
    nodes = tray.get([node_of.options(scheduling_strategy=_in(pg, i)).remote()
                      for i in range(3)])
    assert nodes == [table["bundles_to_node_id"][i] for i in range(3)]
    remove_placement_group(pg)


@pytest.mark.cluster(num_cpus=2)
def test_strict_pack_puts_every_bundle_on_one_node(three_nodes):
    pg = placement_group([{"CPU": 1}, {"CPU": 1}], strategy="STRICT_PACK")
    assert pg.wait(30)
    assert len(set(placement_group_table(pg)["bundles_to_node_id"].values())) == 1
    too_big = placement_group([{"CPU": 2}, {"CPU": 1}], strategy="STRICT_PACK")
    assert not too_big.wait(2)  # no node has 3 CPUs: it stays pending
    assert placement_group_table(too_big)["state"] == "PENDING"
    remove_placement_group(too_big)
    remove_placement_group(pg)


@pytest.mark.cluster(num_cpus=4)
def test_pack_and_spread_prefer_one_node_and_many_nodes(three_nodes):
    packed = placement_group([{"CPU": 1}] * 3, strategy="PACK")
    spread = placement_group([{"CPU": 1}] * 3, strategy="SPREAD")
    assert packed.wait(30) and spread.wait(30)
    assert len(set(placement_group_table(packed)["bundles_to_node_id"].values())) == 1
    assert len(set(placement_group_table(spread)["bundles_to_node_id"].values())) == 3
    remove_placement_group(packed)
    remove_placement_group(spread)


# ========================================================== exclusivity


@pytest.mark.cluster(num_cpus=2)
def test_bundle_resources_serve_only_the_group(one_node):
    pg = placement_group([{"CPU": 2}])
    assert pg.wait(30)
    assert tray.available_resources().get("CPU", 0.0) == 0.0
    outside = node_of.remote()
    ready, _ = tray.wait([outside], timeout=2 * one_node.tick_s)
    assert ready == []  # the node's CPUs are all the group's
    inside = [node_of.options(scheduling_strategy=_in(pg)).remote() for _ in range(4)]
    assert len(tray.get(inside)) == 4  # the group's tasks run
    remove_placement_group(pg)
    assert tray.get(outside, timeout=30)  # freed for everyone
    assert _eventually(lambda: tray.available_resources().get("CPU") == 2.0)


def test_actors_run_in_their_bundle_and_die_with_the_group(cluster):
    pg = placement_group([{"CPU": 1}], strategy="STRICT_PACK")
    actor = Pinned.options(num_cpus=1, scheduling_strategy=_in(pg, 0)).remote()
    assert tray.get(actor.node.remote()) == placement_group_table(pg)["bundles_to_node_id"][0]
    assert tray.get(actor.group.remote()) == pg.id.hex()
    remove_placement_group(pg)
    with pytest.raises(tex.ActorPlacementGroupRemoved, match="placement group"):
        for _ in range(100):  # dies soon after the removal
            tray.get(actor.node.remote())
            time.sleep(0.1)
    late = node_of.options(scheduling_strategy=_in(pg)).remote()
    with pytest.raises(tex.TaskPlacementGroupRemoved, match="was removed"):
        tray.get(late)


@tray.remote
def sleep_then(seconds: float, value):
    time.sleep(seconds)
    return value


@pytest.mark.cluster(num_cpus=2)
def test_a_task_waiting_for_a_removed_groups_bundle_never_runs(one_node):
    # Releasing a removed group's bundle gave its freed CPU to the task that
    # was waiting for that very bundle, which then ran after the removal
    # (simtest edges, no faults, seeds 3, 6, 12).
    pg = placement_group([{"CPU": 1}])
    assert pg.wait(30)
    running = sleep_then.options(scheduling_strategy=_in(pg, 0)).remote(3.0, "ran")
    ready, _ = tray.wait([running], timeout=0.5)
    assert ready == []
    queued = sleep_then.options(scheduling_strategy=_in(pg, 0)).remote(0.0, "queued ran")
    ready, _ = tray.wait([queued], timeout=0.5)
    assert ready == []  # it waits for the bundle the first one holds
    remove_placement_group(pg)
    with pytest.raises(tex.TaskPlacementGroupRemoved, match="was removed"):
        tray.get(queued, timeout=30)


@pytest.mark.cluster(num_gpus=2)
def test_gpus_in_bundles_are_the_bundles_own(one_node):
    pg = placement_group([{"GPU": 1, "CPU": 1}, {"GPU": 1, "CPU": 1}], strategy="PACK")
    assert pg.wait(30)

    @tray.remote(num_gpus=1)
    def gpus():
        return tray.get_gpu_ids()

    ids = tray.get([gpus.options(scheduling_strategy=_in(pg, i)).remote() for i in range(2)])
    assert sorted(i for group in ids for i in group) == [0, 1]
    remove_placement_group(pg)


# ================================================= capture, names, owners


def test_child_tasks_join_the_group_only_when_captured(one_node):
    pg = placement_group([{"CPU": 2}])
    assert pg.wait(30)
    assert tray.get(current_group.options(scheduling_strategy=_in(pg)).remote()) == pg.id.hex()
    captured = group_of_child.options(scheduling_strategy=_in(pg, capture=True)).remote()
    not_captured = group_of_child.options(scheduling_strategy=_in(pg)).remote()
    assert tray.get(captured) == pg.id.hex()
    assert tray.get(not_captured) is None
    assert get_current_placement_group() is None  # the driver is in no group
    remove_placement_group(pg)


def test_named_groups_are_found_and_names_are_unique(one_node):
    pg = placement_group([{"CPU": 1}], name="trainers")
    assert get_placement_group("trainers") == pg
    with pytest.raises(ValueError, match="already exists"):
        placement_group([{"CPU": 1}], name="trainers")
    remove_placement_group(pg)
    with pytest.raises(ValueError, match="Failed to look up placement group"):
        get_placement_group("trainers")
    again = placement_group([{"CPU": 1}], name="trainers")  # the name is free again
    assert get_placement_group("trainers") == again
    remove_placement_group(again)


@tray.remote
class GroupMaker:
    def make(self, detached: bool):
        pg = placement_group([{"CPU": 1}], lifetime="detached" if detached else None)
        return pg.id.hex()


def test_a_group_goes_with_its_creator_unless_detached():
    tray.init(backend="sim", num_cpus=2, seed=2)
    try:
        maker = GroupMaker.remote()
        owned = tray.get(maker.make.remote(False))
        detached = tray.get(maker.make.remote(True))
        tray.kill(maker)
        time.sleep(2.0)
        states = {pg_id: row["state"] for pg_id, row in placement_group_table().items()}
        assert states[owned] == "REMOVED"
        assert states[detached] == "CREATED"
    finally:
        tray.shutdown()


# ================================================================ faults


def test_bundles_lost_with_a_node_are_placed_again():
    tray.init(backend="sim", num_nodes=3, num_cpus=1, seed=5)
    try:
        sim = tray.simtest.cluster()
        head = sim.node_ids()[0]
        pg = placement_group([{"CPU": 1}, {"CPU": 1}], strategy="STRICT_SPREAD")
        assert pg.wait(30)
        placed = placement_group_table(pg)["bundles_to_node_id"]
        victim = next(node for node in placed.values() if node != head)
        sim.kill_node(victim, restart_after_s=1.0)  # a new node (new id) joins
        sim.advance(15.0)  # the GCS declares the node dead; the bundle moves
        assert pg.wait(30)
        now = placement_group_table(pg)["bundles_to_node_id"]
        assert victim not in now.values() and len(set(now.values())) == 2
        assert len(tray.get([node_of.options(scheduling_strategy=_in(pg, i)).remote()
                             for i in range(2)])) == 2
        remove_placement_group(pg)
    finally:
        tray.shutdown()


# ============================================================ bad input


@pytest.mark.parametrize("bundles,message", [
    ({"CPU": 1}, "must be list"),
    ([], "cannot contain an empty list"),
    ([{}], "cannot be an empty dictionary"),
    ([{"CPU": 0}], "only 0 values"),
    ([{"CPU": -1}], "non-negative"),
    ([{"CPU": "one"}], "non-negative number"),
    (["CPU"], "must be a dict"),
])
def test_bad_bundles_are_refused(one_node, bundles, message):
    with pytest.raises(ValueError, match=message):
        placement_group(bundles)


def test_bad_strategy_lifetime_and_index_are_refused(one_node):
    with pytest.raises(ValueError, match="Invalid placement group strategy"):
        placement_group([{"CPU": 1}], strategy="PACKED")
    with pytest.raises(ValueError, match="lifetime"):
        placement_group([{"CPU": 1}], lifetime="forever")
    pg = placement_group([{"CPU": 1}])
    with pytest.raises(ValueError, match="bundle_index 1 is invalid"):
        PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=1)
    with pytest.raises(ValueError, match="must be a PlacementGroup"):
        PlacementGroupSchedulingStrategy("pg")
    with pytest.raises(ValueError, match="more than bundle 0"):
        tray.get(node_of.options(num_cpus=2, scheduling_strategy=_in(pg, 0)).remote())
    remove_placement_group(pg)
