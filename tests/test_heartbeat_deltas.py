"""Heartbeat replies carry only what changed in the cluster view
(tray/core/gcs/node_table.py): every node's view must still converge to the
GCS's when updates are lost, arrive out of order, or the GCS restarts."""

from __future__ import annotations

import pytest

import tray
from tray.core.messages import ViewUpdate
from tray.core.scheduling import NodeView
from tray.simtest import cluster as current_cluster


@pytest.fixture
def sim():
    tray.init(backend="sim", seed=11, num_nodes=4, num_cpus=2)
    try:
        yield current_cluster()
    finally:
        tray.shutdown()


def _gcs(cluster):
    return cluster.processes[cluster.gcs_address].component.node_table


def _node(cluster, index):
    return cluster.processes[f"n{index}/raylet"].component


def _rows(view: dict) -> dict:
    return {node_id: (node.address, node.total, node.available, node.alive)
            for node_id, node in view.items()}


def _assert_converged(cluster) -> None:
    table = _gcs(cluster)
    expected = _rows(table.view())
    for index in range(cluster.num_nodes):
        process = cluster.processes.get(f"n{index}/raylet")
        if process is None or not process.alive:
            continue
        manager = process.component
        held = _rows(manager.leases.view)
        # A node knows its own free resources better than the GCS does.
        held.pop(manager.node_id)
        mine = expected.copy()
        mine.pop(manager.node_id)
        assert held == mine, f"node {index}'s view differs from the GCS's"
        assert (manager.view_epoch, manager.view_version) == (table.epoch, table.version)


@tray.remote
def _square(x):
    return x * x


def test_an_idle_heartbeat_carries_no_nodes(sim):
    table = _gcs(sim)
    sim.advance(2.0)
    update = table.update_since(table.epoch, table.version)
    assert update.nodes == {} and update.base_version == table.version
    # A version this GCS never issued, or another incarnation's: the whole view.
    for epoch, version in ((table.epoch + 1, 0), (table.epoch, table.version + 5),
                           (table.epoch, -1)):
        whole = table.update_since(epoch, version)
        assert whole.base_version == -1 and set(whole.nodes) == set(table.nodes)
    _assert_converged(sim)


def test_a_delta_holds_only_the_nodes_that_changed(sim):
    table = _gcs(sim)
    sim.advance(1.0)
    before = table.version
    victim = sim.node_ids()[2]
    sim.kill_node(victim)
    sim.advance(sim.config.node_death_timeout_s + 2.0)
    assert not table.nodes[victim].alive
    update = table.update_since(table.epoch, before)
    assert victim in update.nodes and not update.nodes[victim].alive
    assert len(update.nodes) < len(table.nodes)
    _assert_converged(sim)


def test_out_of_order_and_gapped_updates_are_dropped_then_repaired(sim):
    table = _gcs(sim)
    manager = _node(sim, 1)
    sim.advance(1.0)
    epoch, version = manager.view_epoch, manager.view_version
    some_id = sim.node_ids()[3]
    bogus = {some_id: NodeView(some_id, "nowhere", {"CPU": 99.0}, {"CPU": 99.0}, True)}

    def feed(update):
        sim.call_soon(lambda: manager.handle_view_changed(None, update))
        tray.get(_square.remote(2))  # lets the simulation run the call

    # Lost updates: a delta whose base this node never reached is a gap.
    feed(ViewUpdate(epoch, version + 10, version + 5, bogus))
    # Reordered: a delta older than the view held.
    feed(ViewUpdate(epoch, version, version - 1, bogus))
    # Another GCS incarnation's delta.
    feed(ViewUpdate(epoch + 1, version + 1, version, bogus))
    assert manager.leases.view[some_id].address != "nowhere"
    assert (manager.view_epoch, manager.view_version) >= (epoch, version)
    # A whole view from the future is taken (the GCS's authority)...
    feed(ViewUpdate(epoch, table.version + 100, -1, {**table.view(), **bogus}))
    assert manager.leases.view[some_id].address == "nowhere"
    # ...and the next heartbeats, which name that version, bring it back:
    # the GCS never issued it, so it answers with the whole view.
    sim.advance(3 * sim.config.heartbeat_period_s)
    assert manager.leases.view[some_id].address != "nowhere"
    _assert_converged(sim)


def test_views_converge_after_resets_partitions_gcs_restarts_and_joins(sim):
    refs = [_square.remote(i) for i in range(40)]
    first_epoch = _gcs(sim).epoch
    sim.reset_connections(sim.node_ids()[1])
    sim.partition([sim.node_ids()[2]], [sim.node_ids()[0]])
    sim.advance(0.7 * sim.config.heartbeat_period_s)
    sim.restart_gcs(down_for_s=0.3)
    sim.advance(0.5)
    sim.heal()
    joined = sim.add_node()
    sim.kill_node(sim.node_ids()[3])
    assert tray.get(refs) == [i * i for i in range(40)]
    sim.advance(sim.config.node_death_timeout_s + 3.0)
    table = _gcs(sim)
    assert table.epoch != first_epoch, "a restarted GCS numbers views afresh"
    assert table.nodes[joined].alive
    _assert_converged(sim)


def test_deltas_replay_identically():
    digests = []
    for _ in range(2):
        tray.init(backend="sim", seed=5, num_nodes=3, num_cpus=1)
        try:
            cluster = current_cluster()
            refs = [_square.remote(i) for i in range(20)]
            cluster.restart_gcs(down_for_s=0.2)
            assert tray.get(refs) == [i * i for i in range(20)]
            cluster.advance(2.0)
            digests.append(tray.simtest.trace_digest())
        finally:
            tray.shutdown()
    assert digests[0] == digests[1]
