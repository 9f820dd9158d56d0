"""What waits on a node, as the node reports it to the GCS for the autoscaler.

Every heartbeat period the node tells the GCS (``report_demand``, only when
it changed, and again every ``DEMAND_REFRESH_PERIODS`` so a restarted GCS
relearns it) the shapes of what waits here: queued lease requests by
resource shape, the actors whose creation waits here, and the shapes it
answered "infeasible" to within the last retry period (an owner asks again
every ``infeasible_retry_period_s``, so an infeasible task is demand that
never reaches a queue). The queue and the leases are the lease manager's;
this component reads them, and keeps the infeasible requests it heard of
(``note_infeasible``, which the lease manager calls) and what it sent last.
At ``workers_per_node_max`` the report also says how many leases wait for a
worker to be free and which actors' creations are among them (the worker
pool's ``worker_limit_waits``): the GCS tells callers why those actors
pend. The GCS's side is ``gcs/demand.py``."""

from __future__ import annotations

from dataclasses import dataclass

import trio

from ..messages import LeaseRequest
from ..rpc import Endpoint
from ..scheduling import NodeAffinityStrategy, PlacementGroupStrategy
from .lease_manager import LeaseManager, shape_key
from .worker_pool import WorkerLimitWaits, WorkerPool

# The demand report holds at most this many distinct shapes (the most
# requested first); further shapes are counted in ``shapes_dropped``.
DEMAND_SHAPES_MAX = 256
# Distinct (owner, shape) pairs remembered as infeasible; the oldest go first.
INFEASIBLE_KEYS_MAX = 1024
# A node re-sends an unchanged demand report every this many heartbeats.
DEMAND_REFRESH_PERIODS = 10


@dataclass(frozen=True)
class NodeDemand:
    """What waits on one node, as the node reports it to the GCS."""
    node_id: str
    shapes: tuple  # (shape_key, count), most requested first
    actors_waiting: tuple  # ids of actors whose creation waits in this node's queue
    leases: int  # leases held (running work)
    bundles: int  # placement-group bundles reserved
    shapes_dropped: int = 0  # requests left out past DEMAND_SHAPES_MAX shapes
    # At the worker cap (worker_pool.WorkerLimitWaits), else None: leases
    # granted resources that wait for a worker to be free.
    worker_limit: WorkerLimitWaits | None = None


@dataclass(frozen=True)
class DemandReporterStatistics:
    infeasible_keys: int  # (owner, shape) pairs answered "infeasible" recently
    last_sent: NodeDemand | None  # the last report sent to the GCS
    periods_since_sent: int  # heartbeats since it was sent


class DemandReporter:
    def __init__(self, *, node_id: str, endpoint: Endpoint, nursery: trio.Nursery, config,
                 gcs_address: str, leases: LeaseManager, pool: WorkerPool) -> None:
        self._node_id = node_id
        self._endpoint = endpoint
        self._nursery = nursery
        self._config = config
        self._gcs_address = gcs_address
        self._leases = leases
        self._pool = pool
        # (owner, shape_key) -> [retry window index, requests in it, in the one
        # before]: an owner asks again once per window for each pending task.
        self._infeasible: dict[tuple, list] = {}
        self._demand_sent: NodeDemand | None = None
        self._demand_periods = 0

    def statistics(self) -> DemandReporterStatistics:
        return DemandReporterStatistics(infeasible_keys=len(self._infeasible),
                                        last_sent=self._demand_sent,
                                        periods_since_sent=self._demand_periods)

    def validate_state(self) -> None:
        assert len(self._infeasible) <= INFEASIBLE_KEYS_MAX, len(self._infeasible)
        for window, current, previous in self._infeasible.values():
            assert window >= 0 and current >= 1 and previous >= 0, (window, current, previous)

    def _window(self) -> int:
        return int(trio.current_time() / self._config.infeasible_retry_period_s)

    def note_infeasible(self, request: LeaseRequest) -> None:
        if isinstance(request.strategy, NodeAffinityStrategy) and not request.strategy.soft:
            return  # pinned to a node: no new node can serve it
        key = (request.owner, shape_key(request.resources))
        window = self._window()
        entry = self._infeasible.pop(key, None)
        if entry is None or entry[0] < window - 1:
            entry = [window, 0, 0]
        elif entry[0] == window - 1:
            entry = [window, 0, entry[1]]
        entry[1] += 1
        self._infeasible[key] = entry  # (re)inserted last: the oldest key is first
        while len(self._infeasible) > INFEASIBLE_KEYS_MAX:
            del self._infeasible[next(iter(self._infeasible))]

    def demand(self) -> NodeDemand:
        """What waits on this node now (see the module header)."""
        counts: dict[tuple, int] = {}
        actors = []
        for waiter in self._leases.waiting:
            if isinstance(waiter.request.strategy, PlacementGroupStrategy):
                continue  # its bundle is reserved: no new node would serve it
            if waiter.request.for_actor is not None:
                actors.append(waiter.request.for_actor)
            key = shape_key(waiter.request.resources)
            counts[key] = counts.get(key, 0) + 1
        window = self._window()
        for (owner, key), (seen, current, previous) in list(self._infeasible.items()):
            if seen == window:
                recent = max(current, previous)  # this window may have just begun
            elif seen == window - 1:
                recent = current
            else:
                del self._infeasible[(owner, key)]
                continue
            counts[key] = counts.get(key, 0) + recent
        ranked = sorted(counts.items(), key=lambda item: (-item[1], item[0]))
        kept = ranked[:DEMAND_SHAPES_MAX]
        dropped = sum(count for _, count in ranked[DEMAND_SHAPES_MAX:])
        return NodeDemand(self._node_id, tuple(kept), tuple(sorted(actors)),
                          leases=len(self._leases.leases), bundles=len(self._leases.bundles),
                          shapes_dropped=dropped, worker_limit=self._pool.worker_limit_waits())

    def report(self) -> None:
        """Send the demand to the GCS if it changed, or every
        ``DEMAND_REFRESH_PERIODS`` heartbeats (the node's heartbeat calls this)."""
        demand = self.demand()
        self._demand_periods += 1
        if demand == self._demand_sent and self._demand_periods < DEMAND_REFRESH_PERIODS:
            return
        self._demand_sent = demand
        self._demand_periods = 0
        self._nursery.start_soon(self._endpoint.notify, self._gcs_address, "report_demand",
                                 demand)
