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
the actors that lived there (the ``on_node_dead`` hook).

Views travel as deltas. Every change to a node's row in the view (it
registered, reported different free resources, died) bumps the table's
``version`` and moves the node to the end of ``_changed`` (node id -> the
version of its last change, in change order). A node heartbeats with the
version of the view it holds, and the reply carries only the nodes changed
after it: found by walking ``_changed`` from its end, so a reply costs what
changed, not the cluster's size. An idle cluster of n nodes used to cost
O(n^2) per heartbeat period in building, pickling and applying whole views
(100 idle simulated nodes: 1.2 s of wall time per virtual second); every
membership change pushed the whole view to every node, O(n^2) per join, so
starting n nodes cost O(n^3) (300 simulated nodes: 92 s of CPU to start).

Deltas must stay correct when messages are lost or reordered and when the
GCS restarts, so each view is stamped with the GCS incarnation's ``epoch``
(the count of GCS starts on its storage, and a random number: versions
restart with the GCS) and each
update with the version it applies on (``base_version``; -1 for a whole
view). The GCS answers a whole view when the node's epoch is not its own or
its version is not one it issued (a new node, a restarted node, a
restarted GCS). A node applies an update only when its own version is in
``[base_version, version)`` and its epoch matches: a lost update leaves it
behind, a reordered one arrives after a newer one and is dropped, and
either way its next heartbeat names the version it holds and gets what it
lacks. Pushes on membership changes (so that nobody waits a heartbeat
period to hear of a death or a join) carry what changed since the version
last sent to that node, coalesced over ``VIEW_PUSH_COALESCE_S``; one that
finds a gap is dropped the same way."""

from __future__ import annotations

import dataclasses
import logging
import pickle
from dataclasses import dataclass

import trio

from ..messages import HeartbeatReply, NodeRecord, ViewUpdate
from ..rpc import Endpoint

logger = logging.getLogger("tray.gcs")

T_NODES = "nodes"
T_GCS_META = "gcs_meta"
# Membership changes within this much time reach the nodes in one push (10
# ms against a 0.5 s heartbeat: starting 1,000 simulated nodes cost 55 s of
# CPU in O(n^2) pushes of one change each).
VIEW_PUSH_COALESCE_S = 0.01


@dataclass(frozen=True)
class NodeTableStatistics:
    nodes: int  # every node that ever registered, dead ones included
    alive: int
    addresses: int  # addresses nodes registered at
    view_version: int  # the view's version (bumped by every change of a row)
    nodes_sent_a_view: int  # live nodes whose view version is known (pushes go to them)
    push_scheduled: bool  # a coalesced push of membership changes is on its way


class NodeTable:
    def __init__(self, *, storage, endpoint: Endpoint, nursery: trio.Nursery, tracer,
                 config, rng) -> None:
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
        # The view's versions (see the module header). Both grow with node
        # starts only: one entry per node ever registered.
        self.epoch = self._next_incarnation(storage) << 32 | rng.getrandbits(32)
        self.version = 0
        self._changed: dict[str, int] = {}  # node id -> version of its last change
        # Volatile: node id -> the version last sent to it (a push's base).
        self._sent: dict[str, int] = {}
        self._push_scheduled = False
        # Address -> the nodes ever registered there (a dict as an ordered
        # set): a closed connection asks "was that a node?" and a join
        # looks for its address's predecessor without a scan of every node
        # (O(nodes) per event: O(n²) to start n nodes).
        self._at_address: dict[str, dict[str, None]] = {}
        for key, value in storage.scan(T_NODES):
            self.nodes[key] = node = pickle.loads(value)
            self._at_address.setdefault(node.address, {})[key] = None
        for node_id in sorted(self.nodes):
            self._touch(node_id)

    @staticmethod
    def _next_incarnation(storage) -> int:
        """Counts GCS starts on this storage: a restarted GCS must number
        its views apart from its predecessor's (a simulated restart draws
        the same random numbers again, so randomness alone does not)."""
        stored = storage.get(T_GCS_META, "incarnation")
        incarnation = (0 if stored is None else int(stored)) + 1
        storage.put(T_GCS_META, "incarnation", str(incarnation).encode())
        return incarnation

    def statistics(self) -> NodeTableStatistics:
        """Walks the nodes to count the live ones: O(nodes)."""
        return NodeTableStatistics(
            nodes=len(self.nodes), alive=sum(node.alive for node in self.nodes.values()),
            addresses=len(self._at_address), view_version=self.version,
            nodes_sent_a_view=len(self._sent), push_scheduled=self._push_scheduled)

    def validate_state(self) -> None:
        """The nodes, the address index, the view's versions: O(nodes)."""
        for node_id, node in self.nodes.items():
            assert node.node_id == node_id, node_id
            assert node_id in self._at_address[node.address], node_id
        for address, node_ids in self._at_address.items():
            assert node_ids, address
            for node_id in node_ids:
                assert self.nodes[node_id].address == address, (node_id, address)
        for node_id in self.heartbeat_at:
            assert node_id in self.nodes, node_id
        assert self._changed.keys() == self.nodes.keys(), "a node without a view version"
        versions = list(self._changed.values())
        assert versions == sorted(versions) and len(set(versions)) == len(versions), versions
        assert not versions or versions[-1] == self.version, (versions[-1], self.version)
        for node_id, version in self._sent.items():
            assert node_id in self.nodes and 0 <= version <= self.version, (node_id, version)
            # (A node is forgotten here when it dies: pushes go to live ones.)
            assert self.nodes[node_id].alive, node_id

    def _touch(self, node_id: str) -> None:
        """The node's row in the view changed: a new version, the node last
        in change order."""
        self.version += 1
        self._changed.pop(node_id, None)
        self._changed[node_id] = self.version

    def update_since(self, epoch: int, version: int) -> ViewUpdate:
        """What a node holding the view ``(epoch, version)`` lacks: the
        nodes changed since, or the whole view when that version is not one
        this GCS issued."""
        if epoch != self.epoch or not 0 <= version <= self.version:
            return ViewUpdate(self.epoch, self.version, -1, self.view())
        changed = {}
        for node_id in reversed(self._changed):
            if self._changed[node_id] <= version:
                break
            changed[node_id] = self.nodes[node_id].view()
        return ViewUpdate(self.epoch, self.version, version, changed)

    def _save(self, node: NodeRecord) -> None:
        self._storage.put(T_NODES, node.node_id, pickle.dumps(node, protocol=5))

    def start(self) -> None:
        """After a (re)start: every known node gets a full timeout to heartbeat."""
        now = trio.current_time()
        for node_id in self.nodes:
            self.heartbeat_at[node_id] = now

    def handle_register_node(self, conn, node: NodeRecord) -> HeartbeatReply:
        node = dataclasses.replace(node, alive=True)
        self.nodes[node.node_id] = node
        self._at_address.setdefault(node.address, {})[node.node_id] = None
        self.heartbeat_at[node.node_id] = trio.current_time()
        self._save(node)
        self._touch(node.node_id)
        self._tracer.record("gcs", "node_registered", node=node.node_id)
        # One process listens at an address: a node still counted alive
        # there is gone (it died while the GCS was down, say, so nothing
        # timed its heartbeats), and its actors and leases with it now, not
        # a death timeout later (simtest chaos seed 5: an actor recorded on
        # it made a lease of its successor look held).
        for other_id in sorted(self._at_address[node.address]):
            other = self.nodes[other_id]
            if other.alive and other_id != node.node_id and other.address == node.address:
                self.mark_node_dead(other_id, f"a new node ({node.node_id}) registered at "
                                              f"its address {node.address}")
        self._publish_view()
        self._sent[node.node_id] = self.version
        return HeartbeatReply(ViewUpdate(self.epoch, self.version, -1, self.view()))

    def _publish_view(self) -> None:
        """Tell every live node manager about a membership change soon
        (within ``VIEW_PUSH_COALESCE_S``) rather than at its next heartbeat.
        Changes that come together go in one push per node: n nodes
        starting at once cost O(n) pushes per round, not O(n) per node."""
        if not self._push_scheduled:
            self._push_scheduled = True
            self._nursery.start_soon(self._push_view_later)

    async def _push_view_later(self) -> None:
        await trio.sleep(VIEW_PUSH_COALESCE_S)
        self._push_scheduled = False
        # What changed since the version last sent to each node (a node not
        # heard from since this GCS started gets the whole view at its next
        # heartbeat instead).
        for node_id, other in sorted(self.nodes.items()):
            sent = self._sent.get(node_id)
            if other.alive and sent is not None and sent < self.version:
                update = self.update_since(self.epoch, sent)
                self._sent[node_id] = self.version
                self._nursery.start_soon(self._endpoint.notify, other.address, "view_changed",
                                         update)

    def handle_heartbeat(self, conn, node_id: str, available: dict, epoch: int = 0,
                         version: int = -1) -> HeartbeatReply:
        """A node's free resources; the reply brings its view from
        ``(epoch, version)`` (the one it holds) up to date."""
        node = self.nodes.get(node_id)
        if node is None or not node.alive:
            return HeartbeatReply(None, dead=True)
        if node.available != available:
            node.available = available
            self._touch(node_id)
        self.heartbeat_at[node_id] = trio.current_time()
        self._sent[node_id] = self.version
        return HeartbeatReply(self.update_since(epoch, version))

    def view(self) -> dict:
        """node id -> NodeView, sorted by id."""
        return {node_id: node.view() for node_id, node in sorted(self.nodes.items())}

    def handle_get_view(self, conn) -> ViewUpdate:
        return ViewUpdate(self.epoch, self.version, -1, self.view())

    def handle_get_all_nodes(self, conn) -> list[NodeRecord]:
        return [dataclasses.replace(node) for _, node in sorted(self.nodes.items())]

    def addresses(self):
        """Every address a node ever registered at (read-only: a live view)."""
        return self._at_address.keys()

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
        self._touch(node_id)
        self._sent.pop(node_id, None)
        self._tracer.record("gcs", "node_dead", node=node_id, reason=reason)
        self._publish_view()
        logger.warning("node %s is dead: %s", node_id, reason)
        # This GCS stops waiting for the dead node's manager (a lease request
        # held up by a partition: restarts default seed 71), unless a newer
        # node listens at its address; every other process stops waiting
        # for the dead node's processes.
        if not any(self.nodes[other].alive for other in self._at_address[node.address]):
            self._endpoint.drop(node.address)
        nodes = self.addresses()
        for peer in self._endpoint.peers():
            if peer not in nodes:
                self._nursery.start_soon(self._endpoint.notify_reliable, peer, "node_died",
                                         node_id, node.address)
        self.on_node_dead(node_id, reason)
