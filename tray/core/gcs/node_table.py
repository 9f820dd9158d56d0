"""The GCS's node table: membership, heartbeats, death detection, the view.

Nodes register and then heartbeat every ``heartbeat_period_s`` with their
free resources; each reply carries the cluster *view* (every node's
address, total and last reported free resources, and whether it is alive),
which node managers schedule with. A node silent for longer than
``node_death_timeout_s`` is declared dead: for good (a node that comes back
is told to fence itself, and a restarted machine registers as a new node).

A death is broadcast: the view goes to every live node manager at once,
and ``node_died`` to every other connected process, so that calls waiting
on the dead node's processes fail now; the actor manager restarts or buries
the actors that lived there (the ``on_node_dead`` hook)."""

from __future__ import annotations

import dataclasses
import logging
import pickle

import trio

from ..messages import HeartbeatReply, NodeRecord
from ..rpc import Endpoint

logger = logging.getLogger("tray.gcs")

T_NODES = "nodes"


class NodeTable:
    def __init__(self, *, storage, endpoint: Endpoint, nursery: trio.Nursery, tracer,
                 config) -> None:
        self._storage = storage
        self._endpoint = endpoint
        self._nursery = nursery
        self._tracer = tracer
        self._config = config
        # Every node that ever registered, dead ones included: the history
        # `tray.nodes()` shows. Grows with node starts, not with load.
        self.nodes: dict[str, NodeRecord] = {}
        self.heartbeat_at: dict[str, float] = {}
        # Set by the GCS: on_node_dead(node_id, reason).
        self.on_node_dead = None
        for key, value in storage.scan(T_NODES):
            self.nodes[key] = pickle.loads(value)

    def validate_state(self) -> None:
        for node_id, node in self.nodes.items():
            assert node.node_id == node_id, node_id
        for node_id in self.heartbeat_at:
            assert node_id in self.nodes, node_id

    def _save(self, node: NodeRecord) -> None:
        self._storage.put(T_NODES, node.node_id, pickle.dumps(node, protocol=5))

    def start(self) -> None:
        """After a (re)start: every known node gets a full timeout to heartbeat."""
        now = trio.current_time()
        for node_id in self.nodes:
            self.heartbeat_at[node_id] = now

    def handle_register_node(self, conn, node: NodeRecord) -> dict:
        node = dataclasses.replace(node, alive=True)
        self.nodes[node.node_id] = node
        self.heartbeat_at[node.node_id] = trio.current_time()
        self._save(node)
        self._tracer.record("gcs", "node_registered", node=node.node_id)
        # One process listens at an address: a node still counted alive
        # there is gone (it died while the GCS was down, say, so nothing
        # timed its heartbeats), and its actors and leases with it now, not
        # a death timeout later (simtest chaos seed 5: an actor recorded on
        # it made a lease of its successor look held).
        for other_id, other in sorted(self.nodes.items()):
            if other.alive and other_id != node.node_id and other.address == node.address:
                self.mark_node_dead(other_id, f"a new node ({node.node_id}) registered at "
                                              f"its address {node.address}")
        self._publish_view(exclude=node.node_id)
        return self.view()

    def _publish_view(self, exclude: str | None = None) -> None:
        """Tell every live node manager about a membership change now,
        rather than at its next heartbeat."""
        view = self.view()
        for node_id, other in sorted(self.nodes.items()):
            if other.alive and node_id != exclude:
                self._nursery.start_soon(self._endpoint.notify, other.address, "update_view",
                                         view)

    def handle_heartbeat(self, conn, node_id: str, available: dict) -> HeartbeatReply:
        node = self.nodes.get(node_id)
        if node is None or not node.alive:
            return HeartbeatReply(self.view(), dead=True)
        node.available = available
        self.heartbeat_at[node_id] = trio.current_time()
        return HeartbeatReply(self.view())

    def view(self) -> dict:
        """node id -> NodeView, sorted by id."""
        return {node_id: node.view() for node_id, node in sorted(self.nodes.items())}

    def handle_get_view(self, conn) -> dict:
        return self.view()

    def handle_get_all_nodes(self, conn) -> list[NodeRecord]:
        return [dataclasses.replace(node) for _, node in sorted(self.nodes.items())]

    def addresses(self) -> set:
        return {node.address for node in self.nodes.values()}

    def address_of(self, node_id: str) -> str | None:
        node = self.nodes.get(node_id)
        return None if node is None else node.address

    def heartbeat_late(self, node_id: str) -> bool:
        """Whether the node missed its last heartbeats (dead or cut off,
        not declared so yet): what it last reported is not to be trusted."""
        last = self.heartbeat_at.get(node_id)
        return last is not None and \
            trio.current_time() - last > 3 * self._config.heartbeat_period_s

    def handle_node_removed(self, conn, node_id: str, reason: str) -> None:
        """The autoscaler terminated this node: it is dead now, not a
        heartbeat timeout later (its work was drained first)."""
        if node_id in self.nodes:
            self.mark_node_dead(node_id, reason)

    async def death_detector(self) -> None:
        while True:
            await trio.sleep(self._config.heartbeat_period_s)
            now = trio.current_time()
            for node_id, node in sorted(self.nodes.items()):
                if node.alive and now - self.heartbeat_at.get(node_id, now) > \
                        self._config.node_death_timeout_s:
                    self.mark_node_dead(node_id, "missed heartbeats")

    def mark_node_dead(self, node_id: str, reason: str) -> None:
        node = self.nodes[node_id]
        if not node.alive:
            return
        node.alive = False
        self._save(node)
        self._tracer.record("gcs", "node_dead", node=node_id, reason=reason)
        self._publish_view()
        logger.warning("node %s is dead: %s", node_id, reason)
        # Every other process stops waiting for the dead node's processes.
        nodes = self.addresses()
        for peer in self._endpoint.peers():
            if peer not in nodes:
                self._nursery.start_soon(self._endpoint.notify_reliable, peer, "node_died",
                                         node_id, node.address)
        self.on_node_dead(node_id, reason)
