"""The GCS's demand table: what the cluster waits for, for the autoscaler.

Ray's autoscaler reads "load metrics" from the GCS: the resource shapes of
everything that waits, and how busy each node is. tray's GCS keeps the same
picture from four sources, none of them polled per query:

  * each node's lease manager reports (``report_demand``, a ``NodeDemand``)
    the shapes queued at it and the shapes it answered "infeasible" to,
    when that changes, at its heartbeat cadence;
  * pending actors the actor manager could not send to any node (those
    waiting in a node's queue are already in that node's report);
  * bundles of placement groups that are pending or being rescheduled, as
    a gang: a group's bundles must be placed together (``strategy`` kept);
  * ``tray.autoscaler.sdk.request_resources``: a standing request the
    cluster must be able to hold at once (replaced by the next call, as in
    Ray; an empty call withdraws it), kept in the GCS's storage so that a
    GCS restart does not withdraw it.

The same reports say which nodes are at their worker cap
(``workers_per_node_max``) with leases waiting for a worker to be free, and
which actors' creations wait there: ``worker_limits`` (for ``tray status``)
and ``pending_reasons`` (the state API's per-actor reason) read them, so a
caller learns why its actor does not start without reading a node's log.

``get_cluster_load`` hands the autoscaler all of it with the nodes' totals,
free resources and whether each runs anything (``ClusterLoad``). The
shapes of a node whose heartbeats are late are left out: it has likely
died, and what waited there is asked for again elsewhere (counting it would
launch nodes for demand that no longer exists). A node
that reported nothing yet counts as busy: the autoscaler must never remove
a node it knows nothing about.

Bounds: one report per live node (dead nodes' reports are dropped when the
autoscaler reads), ``DEMAND_SHAPES_MAX`` shapes per report (the node
truncates), ``REQUESTED_BUNDLES_MAX`` bundles per explicit request, and at
most ``PENDING_GROUPS_MAX`` placement groups and ``PENDING_ACTORS_MAX``
actors read per query (the rest wait for a later round)."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass

from .. import scheduling
from ..messages import ActorStatus, PlacementGroupStatus
from ..scheduling import PlacementGroupStrategy

logger = logging.getLogger("tray.gcs")

REQUESTED_BUNDLES_MAX = 10_000
T_DEMAND = "demand"  # the durable table: "requested" -> the standing request (JSON)
PENDING_GROUPS_MAX = 1_000
PENDING_ACTORS_MAX = 10_000


@dataclass(frozen=True)
class NodeLoad:
    node_id: str
    address: str
    total: dict
    available: dict
    alive: bool
    leases: int  # -1: never reported
    bundles: int


@dataclass(frozen=True)
class ClusterLoad:
    """What the autoscaler decides on (see the module header)."""
    nodes: tuple  # NodeLoad, by node id
    shapes: tuple  # (resources dict, count): queued and infeasible requests, actors
    placement_groups: tuple  # (pg id, strategy, bundles list) still to be placed
    requested: tuple  # bundles of request_resources (each a dict)
    shapes_dropped: int = 0


@dataclass(frozen=True)
class WorkerLimitWait:
    """A node at its worker cap with leases waiting for a worker."""
    node_id: str
    limit: int  # its workers_per_node_max
    leases: int  # leases waiting for one of its workers to be free
    actors: tuple  # ids of the actors among them (the node lists a bounded number)


def worker_limit_reason(limit: int, node_id: str) -> str:
    """Why an actor's creation waits at a node at its worker cap."""
    return f"waiting: worker limit {limit} reached on node {node_id}"


@dataclass(frozen=True)
class DemandTableStatistics:
    reports: int  # nodes whose last demand report is kept
    requested_bundles: int  # bundles of the standing request_resources


class DemandTable:
    def __init__(self, *, nodes, actors=None, placement_groups=None, tracer=None,
                 storage=None) -> None:
        self._nodes = nodes
        self._actors = actors
        self._placement_groups = placement_groups
        self._tracer = tracer
        self._storage = storage
        # node id -> its last NodeDemand (a lease_manager.NodeDemand).
        self.reports: dict = {}
        # The standing request is durable: a GCS restart must not withdraw it
        # (the user's floor stands until the next call replaces it).
        self.requested: tuple = ()
        saved = storage.get(T_DEMAND, "requested") if storage is not None else None
        if saved is not None:
            self.requested = tuple(json.loads(saved))

    def statistics(self) -> DemandTableStatistics:
        return DemandTableStatistics(reports=len(self.reports),
                                     requested_bundles=len(self.requested))

    def validate_state(self) -> None:
        """Each report under its node, of a node the table knows; the
        standing request within its bound. O(reports): one per node."""
        for node_id, report in self.reports.items():
            assert report.node_id == node_id, node_id
            # (A dead node's report stays until the autoscaler next reads.)
            assert node_id in self._nodes.nodes, node_id
        assert len(self.requested) <= REQUESTED_BUNDLES_MAX, len(self.requested)

    def handle_report_demand(self, conn, demand) -> None:
        node = self._nodes.nodes.get(demand.node_id)
        if node is None or not node.alive:
            return  # a report from a node declared dead: its work is elsewhere
        self.reports[demand.node_id] = demand

    def handle_request_resources(self, conn, bundles: list) -> None:
        if len(bundles) > REQUESTED_BUNDLES_MAX:
            raise ValueError(f"request_resources takes at most {REQUESTED_BUNDLES_MAX} "
                             f"bundles, got {len(bundles)}")
        self.requested = tuple(scheduling.normalize_resources(bundle) for bundle in bundles)
        if self._storage is not None:
            self._storage.put(T_DEMAND, "requested",
                              json.dumps([dict(b) for b in self.requested],
                                         sort_keys=True).encode())
        if self._tracer is not None:
            self._tracer.record("gcs", "resources_requested", bundles=len(self.requested))

    def handle_worker_limits(self, conn) -> tuple:
        return self.worker_limits()

    def worker_limits(self) -> tuple:
        """``WorkerLimitWait`` of each live node whose last report says it
        is at its worker cap with leases waiting, by node id (as of its last
        heartbeat: a report follows a change within one)."""
        waits = []
        for node_id, report in sorted(self.reports.items()):
            node = self._nodes.nodes.get(node_id)
            at_cap = report.worker_limit
            if at_cap is None or node is None or not node.alive or \
                    self._nodes.heartbeat_late(node_id):
                continue
            waits.append(WorkerLimitWait(node_id, at_cap.limit, at_cap.leases, at_cap.actors))
        return tuple(waits)

    def pending_reasons(self) -> dict:
        """Actor id -> why its creation waits, for the actors the nodes
        report waiting at their worker cap."""
        return {actor_id: worker_limit_reason(wait.limit, wait.node_id)
                for wait in self.worker_limits() for actor_id in wait.actors}

    def handle_get_cluster_load(self, conn) -> ClusterLoad:
        return self.cluster_load()

    def cluster_load(self) -> ClusterLoad:
        nodes = []
        for node_id, node in sorted(self._nodes.nodes.items()):
            report = self.reports.get(node_id)
            if not node.alive:
                self.reports.pop(node_id, None)
                continue
            nodes.append(NodeLoad(node_id, node.address, dict(node.resources),
                                  dict(node.available), node.alive,
                                  -1 if report is None else report.leases,
                                  0 if report is None else report.bundles))
        counts: dict[tuple, int] = {}
        waiting_actors: set = set()
        dropped = 0
        for node_id, report in sorted(self.reports.items()):
            if self._nodes.heartbeat_late(node_id):
                continue  # likely dead: what waited there is retried elsewhere
            for key, count in report.shapes:
                counts[key] = counts.get(key, 0) + count
            waiting_actors.update(report.actors_waiting)
            dropped += report.shapes_dropped
        if self._actors is not None:
            seen = 0
            for actor_id, actor in sorted(self._actors.actors.items()):
                if actor.state not in (ActorStatus.PENDING_CREATION, ActorStatus.RESTARTING) or \
                        actor_id in waiting_actors or \
                        isinstance(actor.spec.strategy, PlacementGroupStrategy):
                    continue
                seen += 1
                if seen > PENDING_ACTORS_MAX:
                    break
                key = tuple(sorted(scheduling.normalize_resources(
                    actor.spec.resources).items()))
                counts[key] = counts.get(key, 0) + 1
        groups = []
        if self._placement_groups is not None:
            for pg_id, group in sorted(self._placement_groups.groups.items()):
                if group.state not in (PlacementGroupStatus.PENDING,
                                       PlacementGroupStatus.RESCHEDULING):
                    continue
                if len(groups) >= PENDING_GROUPS_MAX:
                    break
                missing = [dict(bundle) for index, bundle in enumerate(group.spec.bundles)
                           if index not in group.bundle_nodes]
                if missing:
                    groups.append((pg_id, group.spec.strategy, missing))
        shapes = tuple((dict(key), count) for key, count in
                       sorted(counts.items(), key=lambda item: (-item[1], item[0])) if key)
        return ClusterLoad(tuple(nodes), shapes, tuple(groups),
                           tuple(dict(bundle) for bundle in self.requested), dropped)
