"""A node's resources and the leases that hold them.

An owner asks for a *lease*: a worker fit for a scheduling class. The lease
manager either grants a local worker (allocating the resources, GPU device
ids included), answers "spill back to node N" when the shared policy
(``scheduling.pick_node`` over the cluster view) prefers another node, or
says the request is infeasible. Requests that fit the node but not its free
resources wait in a queue (``waiting``): the deepest tasks' requests first
(``TaskSpec.depth``), first come first served within a depth, and any that
waited ``DEPTH_FIRST_MAX_WAIT_S`` ahead of all (oldest first); each time
resources are released the queue is scanned for the first requests that fit.

Every unit of a resource is either available or held by exactly one lease:
``available + sum(lease resources) == total`` for each resource, except
the CPU of a lease whose task is blocked in ``get``/``wait``: it is lent
back (``blocked``) and taken again when the task resumes (which may
oversubscribe the node for a while, as in Ray).

A lease granted over a connection that broke may never have reached its
owner; such leases are *reconciled*: the owner is asked which of them it
holds (``held_leases``), and the others are released. A lease the owner says
it holds is tied to the connection that answered, and asked about again when
that one breaks: an owner that restarted (a GCS) no longer holds it.

Placement groups reserve *bundles* here (``prepare_bundles``, then
``commit_bundles``, from the GCS's placement-group manager): a bundle's
resources leave the node's pool and form a pool of their own, which only
leases for that group (a ``PlacementGroupStrategy``) draw from. So,
for every resource, ``available + leases outside bundles + bundles ==
total``, and within each bundle ``available + its leases == reserved``.
Cancelling a bundle (the group was removed) kills the workers leased in it
and gives its resources back. Every heartbeat the node asks the GCS which of
its bundles it should still hold (``held_bundles``) and releases the rest.

What waits here is reported to the GCS for the autoscaler by
``demand_reporter`` (a request answered "infeasible" is noted there,
``note_infeasible``: it reaches no queue). When a node joins the view,
requests queued here that do not fit this node's free resources now but fit
the new node's are answered with a spillback to it, as Ray's raylet spills
queued work to nodes that became available; every heartbeat the same is
done for requests queued longer than a period, towards any node whose last
reported free resources hold them. Without it,
work queued before the autoscaler added a node would wait for this node's
leases to end while the new node sat idle (and an actor whose node filled
up with a placement group's bundles would wait for the group to go)."""

from __future__ import annotations

import bisect
import logging
from dataclasses import dataclass, field

import trio

from .. import scheduling
from ..messages import Infeasible, LeaseGranted, LeaseRequest, LeaseWithdrawn, Spillback
from ..rpc import Endpoint, PeerDisconnected
from ..scheduling import NodeAffinityStrategy, PlacementGroupStrategy, Strategy
from .worker_pool import WorkerPool, WorkerState

logger = logging.getLogger("tray.node")

# A request waits behind deeper ones for at most this long; then it goes
# first (``_in_grant_order``).
DEPTH_FIRST_MAX_WAIT_S = 1.0


def shape_key(resources: dict) -> tuple:
    """A resource shape as a sorted, hashable tuple."""
    return tuple(sorted((name, float(amount)) for name, amount in resources.items()
                        if amount))


@dataclass
class Lease:
    lease_id: int
    worker_id: str
    owner: str
    resources: dict
    gpu_allocation: list
    for_actor: str | None = None
    blocked: bool = False  # its task waits in get/wait and lent its CPU back
    # The connection the grant went out on: if it breaks, the grant may
    # never have arrived, so the owner is asked whether it holds the lease.
    conn: object = None
    bundle: tuple | None = None  # (pg id, bundle index) whose resources it holds
    retriable: bool = True  # its owner retries a task whose worker dies
    # Order of the grant (its worker attached), 0 before: lease ids follow
    # when resources were allocated, and workers may arrive in another order.
    granted: int = 0


@dataclass
class Bundle:
    """Resources a placement group reserved on this node."""
    pg_id: str
    index: int
    resources: dict  # reserved from the node
    available: dict  # what its leases do not hold
    gpus: scheduling.GpuAllocator  # over the devices reserved from the node
    node_gpu_allocation: list  # what was taken from the node's allocator
    committed: bool = False  # usable by leases (prepared only, until then)


@dataclass
class _Waiter:
    request: LeaseRequest
    event: trio.Event = field(default_factory=trio.Event)
    lease_id: int = 0
    gpu_ids: list = field(default_factory=list)
    withdrawn: str = ""  # why it will never be granted (its bundle went)
    spillback: Spillback | None = None  # sent on to a node that can serve it now
    cancelled: bool = False  # its owner ran out of tasks for it (cancel_lease_requests)
    since: float = field(default_factory=trio.current_time)  # when it was queued


def _deeper_first(waiter: _Waiter) -> int:
    return -waiter.request.depth


def _since(waiter: _Waiter) -> float:
    return waiter.since


@dataclass(frozen=True)
class LeaseSummary:
    lease_id: int
    worker_id: str
    owner: str
    resources: dict
    for_actor: str | None
    blocked: bool


@dataclass(frozen=True)
class LeaseStatistics:
    total: dict
    available: dict
    leases: tuple  # LeaseSummary, by lease id
    waiting: tuple  # (owner, resources) of queued requests, in queue order
    bundles: tuple = ()  # (pg id, index, reserved resources, committed)


class LeaseManager:
    def __init__(self, *, node_id: str, address: str, endpoint: Endpoint,
                 nursery: trio.Nursery, tracer, config, resources: dict, rng,
                 pool: WorkerPool, refresh_view, gcs_address: str, note_infeasible) -> None:
        self._gcs_address = gcs_address
        self._node_id = node_id
        self._trace_name = node_id[:8]
        self._address = address
        self._endpoint = endpoint
        self._nursery = nursery
        self._tracer = tracer
        self._config = config
        self._pool = pool
        # refresh_view(): ask the GCS for the cluster view now (async).
        self._refresh_view = refresh_view
        # note_infeasible(request): a request was answered "infeasible"
        # (DemandReporter.note_infeasible: demand no queue shows).
        self._note_infeasible = note_infeasible
        self.total = scheduling.normalize_resources(resources)
        self.available = dict(self.total)
        self.gpus = scheduling.GpuAllocator(int(self.total.get("GPU", 0)))
        self.leases: dict[int, Lease] = {}
        # Owner -> ids of its leases. With the pool's ``WorkerInfo.lease_id``
        # (``_lease_of_worker``), a worker's death, its blocking and an
        # owner's death find their leases without a scan of all leases, which
        # made killing n actors on one node O(n²).
        self._leases_by_owner: dict[str, set[int]] = {}
        self._next_lease_id = 1
        self._grants = 0
        self.waiting: list[_Waiter] = []
        # The cluster as this node last heard of it from the GCS.
        self.view: dict[str, scheduling.NodeView] = {}
        self.policy_state = scheduling.PolicyState(rng=rng)
        self._reconciling: set[str] = set()
        # Placement-group bundles reserved here: (pg id, index) -> Bundle.
        self.bundles: dict[tuple, Bundle] = {}
        self._reconciling_bundles = False
        # The autoscaler is removing this node: it takes no new work.
        self.draining = False

    def statistics(self) -> LeaseStatistics:
        return LeaseStatistics(
            total=dict(self.total), available=dict(self.available),
            leases=tuple(LeaseSummary(lease.lease_id, lease.worker_id, lease.owner,
                                      dict(lease.resources), lease.for_actor, lease.blocked)
                         for _, lease in sorted(self.leases.items())),
            waiting=tuple((waiter.request.owner, dict(waiter.request.resources))
                          for waiter in self.waiting),
            bundles=tuple((pg_id, index, dict(bundle.resources), bundle.committed)
                          for (pg_id, index), bundle in sorted(self.bundles.items())))

    def validate_state(self) -> None:
        held: dict = {}  # by the node's pool: leases outside bundles, and bundles
        in_bundles: dict = {key: {} for key in self.bundles}
        for lease_id, lease in self.leases.items():
            assert lease.lease_id == lease_id, lease_id
            assert 0 < lease_id < self._next_lease_id, lease_id
            target = held if lease.bundle is None else in_bundles.get(lease.bundle)
            assert target is not None, f"lease {lease_id} in a bundle that is gone"
            for name, amount in lease.resources.items():
                if name == "CPU" and lease.blocked:
                    continue  # lent back while its task waits
                target[name] = target.get(name, 0.0) + amount
            if lease.worker_id:
                worker = self._pool.workers.get(lease.worker_id)
                assert worker is not None, (lease_id, lease.worker_id)
                assert worker.state == (WorkerState.ACTOR if lease.for_actor
                                        else WorkerState.LEASED), \
                    (lease_id, worker.state)
                assert worker.lease_id == lease_id, (lease_id, worker.lease_id)
            assert lease_id in self._leases_by_owner.get(lease.owner, ()), lease_id
        for key, bundle in self.bundles.items():
            assert (bundle.pg_id, bundle.index) == key, key
            for name, amount in bundle.resources.items():
                held[name] = held.get(name, 0.0) + amount
                # Within a bundle too, every unit is free or held by one lease.
                assert abs(bundle.available.get(name, 0.0) + in_bundles[key].get(name, 0.0)
                           - amount) <= 1e-6, (key, name, bundle.available, in_bundles[key])
            if not bundle.committed:
                assert not in_bundles[key], f"leases in bundle {key} before its commit"
        for name, total in self.total.items():
            # Every unit is free, held by exactly one lease, or in one bundle.
            assert abs(self.available.get(name, 0.0) + held.get(name, 0.0) - total) <= \
                1e-6, (name, self.available.get(name), held.get(name), total)
        for name in self.available:
            assert name in self.total, name
        allocated = {device: 0.0 for device in self.gpus.free}
        for lease in self.leases.values():
            if lease.bundle is None:
                for device, share in lease.gpu_allocation:
                    allocated[device] += share
        for bundle in self.bundles.values():
            for device, share in bundle.node_gpu_allocation:
                allocated[device] += share
        for device, share in self.gpus.free.items():
            assert abs(share + allocated[device] - self.gpus.capacity[device]) <= 1e-6, \
                (device, share, allocated[device])
        leased_workers = {lease.worker_id for lease in self.leases.values() if lease.worker_id}
        assert sum(map(len, self._leases_by_owner.values())) == len(self.leases), \
            "an owner's lease index holds a lease that is gone"
        assert all(self._leases_by_owner.values()), "an owner with no leases is indexed"
        for worker_id, worker in self._pool.workers.items():
            if worker.state in (WorkerState.LEASED, WorkerState.ACTOR):
                assert worker_id in leased_workers, f"worker {worker_id} is busy without a lease"
        for waiter in self.waiting:
            assert not waiter.event.is_set(), waiter.request
        depths = [waiter.request.depth for waiter in self.waiting]
        assert depths == sorted(depths, reverse=True), depths  # deeper first

    # ------------------------------------------------------------------ view

    def set_view(self, view: dict) -> None:
        joined = sorted(node_id for node_id, node in view.items()
                        if node.alive and node_id != self._node_id and
                        (node_id not in self.view or not self.view[node_id].alive))
        self.view = {node_id: scheduling.NodeView(node.node_id, node.address, node.total,
                                                  node.available, node.alive)
                     for node_id, node in view.items()}
        self._refresh_local_view()
        if joined and self.waiting:
            self._spill_to_joined(joined)

    def update_view(self, changed: dict) -> None:
        """``set_view`` for the nodes that changed only (node id -> NodeView):
        a heartbeat costs what changed, not the cluster's size."""
        joined = sorted(node_id for node_id, node in changed.items()
                        if node.alive and node_id != self._node_id and
                        (node_id not in self.view or not self.view[node_id].alive))
        for node_id, node in changed.items():
            self.view[node_id] = scheduling.NodeView(node.node_id, node.address, node.total,
                                                     node.available, node.alive)
        self._refresh_local_view()
        if joined and self.waiting:
            self._spill_to_joined(joined)

    def _spill_to_joined(self, joined: list) -> None:
        self._respill(joined, waited_s=0.0)

    def _respill(self, node_ids: list, waited_s: float) -> None:
        """Queued requests this node cannot serve now, queued for at least
        ``waited_s``, go to one of ``node_ids`` whose free resources (as
        last heard) hold them (see the module header). Placement-group
        requests stay (their bundle is here), and so do tasks pinned here; an
        actor's request (pinned by the GCS, which picked this node) is
        answered with a spillback too, and the GCS picks again."""
        now = trio.current_time()
        free = {node_id: dict(self.view[node_id].available) for node_id in node_ids
                if node_id in self.view and self.view[node_id].alive and
                node_id != self._node_id}
        if not free:
            return
        nowhere: set = set()  # shapes no node has room for (a long queue stays cheap)
        for waiter in list(self.waiting):
            request = waiter.request
            if isinstance(request.strategy, PlacementGroupStrategy) or \
                    now - waiter.since < waited_s:
                continue
            if isinstance(request.strategy, NodeAffinityStrategy) and request.for_actor is None:
                continue
            key = shape_key(request.resources)
            if key in nowhere or self._pool_for(request) is not None:
                continue  # no room elsewhere, or it will be granted here
            nowhere.add(key)
            for node_id in sorted(free):
                if scheduling.fits(request.resources, free[node_id]):
                    nowhere.discard(key)
                    for name, amount in request.resources.items():
                        free[node_id][name] = free[node_id].get(name, 0.0) - amount
                    self.waiting.remove(waiter)
                    waiter.spillback = Spillback(self.view[node_id].address, node_id)
                    waiter.event.set()
                    self._tracer.record(self._trace_name, "lease_respilled", to=node_id)
                    break

    def _refresh_local_view(self) -> None:
        mine = self.view.get(self._node_id)
        if mine is not None:
            mine.available = dict(self.available)

    # ---------------------------------------------------------------- grants

    async def handle_request_lease(self, conn, request: LeaseRequest):
        if self.draining:
            return Infeasible(f"node {self._node_id} is being removed by the autoscaler")
        resources = request.resources
        hops = request.hops
        strategy = request.strategy
        if isinstance(strategy, NodeAffinityStrategy) and strategy.node_id not in self.view:
            try:  # a node that joined since the last view update?
                await self._refresh_view()
            except PeerDisconnected:
                pass
        pinned_elsewhere = isinstance(strategy, NodeAffinityStrategy) and \
            not strategy.soft and strategy.node_id != self._node_id
        if isinstance(strategy, PlacementGroupStrategy):
            # The owner asked the node holding the group's bundle(s).
            refusal = self._bundle_refusal(resources, strategy)
            if refusal:
                return Infeasible(refusal)
            target = self._node_id
        elif hops >= self._config.spillback_hops_max and \
                scheduling.fits(resources, self.total) and not pinned_elsewhere:
            # Enough spillbacks: run here. Not when the request is pinned to
            # another node — it may have come here because a restarted node
            # took over the address of the node it was meant for.
            target = self._node_id
        else:
            self._refresh_local_view()
            target = scheduling.pick_node(resources, strategy, self._node_id, self.view,
                                          self.policy_state,
                                          self._config.local_utilization_threshold)
        if target == scheduling.INFEASIBLE:
            self._note_infeasible(request)
            return Infeasible(self._infeasible_reason(resources, strategy))
        if target != self._node_id:
            node = self.view[target]
            return Spillback(node.address, target)
        waiter = _Waiter(request)
        self._queue(waiter)
        self._dispatch()
        await waiter.event.wait()
        if waiter.withdrawn:
            return Infeasible(waiter.withdrawn)
        if waiter.cancelled:
            return LeaseWithdrawn()
        if waiter.spillback is not None:
            return waiter.spillback
        try:
            worker = await self._pool.take_worker(gpu=resources.get("GPU", 0.0) > 0,
                                                  runtime_env_hash=request.runtime_env_hash,
                                                  actor_id=request.for_actor)
        except BaseException:
            self.release_lease(waiter.lease_id, worker_ok=True)
            raise
        lease = self.leases.get(waiter.lease_id)
        if lease is None:
            # Released while a worker was on its way: its owner went away.
            self._pool.put_back(worker)
            return LeaseWithdrawn()
        if conn is not None and conn.closed:
            # The requester went away while it waited: nobody would return this lease.
            self._pool.put_back(worker)
            self.release_lease(lease.lease_id, worker_ok=True)
            return LeaseWithdrawn()
        lease.worker_id = worker.worker_id
        lease.conn = conn
        self._grants += 1
        lease.granted = self._grants
        worker.state = WorkerState.ACTOR if lease.for_actor else WorkerState.LEASED
        worker.lease_id = lease.lease_id
        self._tracer.record(self._trace_name, "lease_granted", lease=lease.lease_id,
                            worker=worker.worker_id)
        logger.debug("lease %d granted: worker %s to %s", lease.lease_id, worker.worker_id[:8],
                     lease.owner)
        return LeaseGranted(lease_id=lease.lease_id, node_id=self._node_id,
                            gpu_ids=waiter.gpu_ids, worker_id=worker.worker_id,
                            worker_address=worker.address)

    def _infeasible_reason(self, resources: dict, strategy: Strategy) -> str:
        if isinstance(strategy, NodeAffinityStrategy) and not strategy.soft:
            node = self.view.get(strategy.node_id)
            if node is None or not node.alive:
                return f"node {strategy.node_id} (hard node affinity) is not alive"
            return (f"node {strategy.node_id} (hard node affinity) has only {node.total}, "
                    f"the request needs {resources}")
        totals = [n.total for n in self.view.values() if n.alive]
        best = min(totals, key=lambda t: len(scheduling.missing(resources, t)), default={})
        return (f"no node in the cluster has {scheduling.missing(resources, best) or resources} "
                f"(requested {resources})")

    def _bundles_for(self, strategy: PlacementGroupStrategy) -> list:
        """The keys of this node's bundles a placement-group request may use."""
        pg_id, index = strategy.placement_group_id, strategy.bundle_index
        return [key for key in sorted(self.bundles)
                if key[0] == pg_id and (index < 0 or key[1] == index)]

    def _bundle_refusal(self, resources: dict, strategy: PlacementGroupStrategy) -> str:
        """Why a placement-group request cannot wait here ('' if it can)."""
        keys = self._bundles_for(strategy)
        which = "any bundle" if strategy.bundle_index < 0 else \
            f"bundle {strategy.bundle_index}"
        if not keys:
            return (f"placement group {strategy.placement_group_id} has no {which} on node "
                    f"{self._node_id}")
        if not any(scheduling.fits(resources, self.bundles[key].resources) for key in keys):
            return (f"{which} of placement group {strategy.placement_group_id} cannot hold "
                    f"{resources} (it reserved "
                    f"{[self.bundles[key].resources for key in keys]})")
        return ""

    def _pool_for(self, request: LeaseRequest):
        """(bundle key or None, available dict, GPU allocator) a request can
        be granted from now, or None."""
        resources = request.resources
        gpus = resources.get("GPU", 0.0)
        if isinstance(request.strategy, PlacementGroupStrategy):
            for key in self._bundles_for(request.strategy):
                bundle = self.bundles[key]
                if bundle.committed and scheduling.fits(resources, bundle.available) and \
                        bundle.gpus.can_allocate(gpus):
                    return key, bundle.available, bundle.gpus
            return None
        if scheduling.fits(resources, self.available) and self.gpus.can_allocate(gpus):
            return None, self.available, self.gpus
        return None

    def _queue(self, waiter: _Waiter) -> None:
        """Deeper requests first, first come first served within a depth: a
        task blocked on its children gets them running before more of its
        siblings start (nested fan-out: the leaves no longer wait until every
        middle runs), as a fork-join scheduler runs depth-first."""
        bisect.insort(self.waiting, waiter, key=_deeper_first)

    def _in_grant_order(self) -> list[_Waiter]:
        """The waiting requests in the order they are offered resources:
        the queue's (deepest first), except that those waiting
        ``DEPTH_FIRST_MAX_WAIT_S`` or longer go ahead, oldest first, so a
        steady stream of nested work cannot starve shallower tasks."""
        now = trio.current_time()
        overdue = [waiter for waiter in self.waiting
                   if now - waiter.since >= DEPTH_FIRST_MAX_WAIT_S]
        if not overdue:
            return list(self.waiting)
        overdue.sort(key=_since)
        return overdue + [waiter for waiter in self.waiting
                          if now - waiter.since < DEPTH_FIRST_MAX_WAIT_S]

    def _dispatch(self) -> None:
        for waiter in self._in_grant_order():
            resources = waiter.request.resources
            found = self._pool_for(waiter.request)
            if found is None:
                continue
            key, available, gpus = found
            self.waiting.remove(waiter)
            for name, amount in resources.items():
                available[name] = available.get(name, 0.0) - amount
            allocation = gpus.allocate(resources.get("GPU", 0.0))
            lease_id = self._next_lease_id
            self._next_lease_id += 1
            self.leases[lease_id] = Lease(lease_id, "", waiter.request.owner, resources,
                                          allocation, waiter.request.for_actor, bundle=key,
                                          retriable=waiter.request.retriable)
            self._leases_by_owner.setdefault(waiter.request.owner, set()).add(lease_id)
            waiter.lease_id = lease_id
            waiter.gpu_ids = [i for i, _ in allocation]
            waiter.event.set()

    def handle_cancel_lease_requests(self, conn, request: LeaseRequest, count: int) -> None:
        """The owner's class ran out of tasks: up to ``count`` of its requests
        still queued here for that class (the newest first) are answered
        ``LeaseWithdrawn`` instead of being granted later and returned at
        once, as Ray's owner cancels its lease requests (CancelWorkerLease).
        Measured in the simulator, nested fan-out: 242 of 330 leases were
        granted after their owner's queue had run dry, and went back unused."""
        for waiter in reversed(list(self.waiting)):
            if count <= 0:
                break
            queued = waiter.request
            if queued.owner == request.owner and queued.for_actor is None and \
                    queued.resources == request.resources and \
                    queued.strategy == request.strategy and \
                    queued.retriable == request.retriable and \
                    queued.runtime_env_hash == request.runtime_env_hash:
                self.waiting.remove(waiter)
                waiter.cancelled = True
                waiter.event.set()
                count -= 1

    def _pool_of(self, lease: Lease):
        """(available dict, total dict, GPU allocator) a lease draws from."""
        if lease.bundle is None:
            return self.available, self.total, self.gpus
        bundle = self.bundles[lease.bundle]
        return bundle.available, bundle.resources, bundle.gpus

    # ------------------------------------------------------ blocked workers

    def _lease_of_worker(self, worker_id: str) -> Lease | None:
        """The lease a worker works under, if any (its ``lease_id`` outlives
        the lease: lease ids are never reused, so a stale one finds none)."""
        worker = self._pool.workers.get(worker_id)
        lease = self.leases.get(worker.lease_id) if worker is not None else None
        return lease if lease is not None and lease.worker_id == worker_id else None

    def _task_lease_of(self, worker_id: str) -> Lease | None:
        """The lease a worker runs tasks under, if any (not an actor's)."""
        lease = self._lease_of_worker(worker_id)
        return lease if lease is not None and lease.for_actor is None else None

    def handle_worker_blocked(self, conn, worker_id: str) -> None:
        lease = self._task_lease_of(worker_id)
        if lease is None or lease.blocked:
            return
        lease.blocked = True
        available, _, _ = self._pool_of(lease)
        available["CPU"] = available.get("CPU", 0.0) + lease.resources.get("CPU", 0.0)
        self._dispatch()

    def handle_worker_unblocked(self, conn, worker_id: str) -> None:
        lease = self._task_lease_of(worker_id)
        if lease is None or not lease.blocked:
            return
        lease.blocked = False
        # May oversubscribe the node for a while, as in Ray: the task runs on.
        available, _, _ = self._pool_of(lease)
        available["CPU"] = available.get("CPU", 0.0) - lease.resources.get("CPU", 0.0)

    # -------------------------------------------------------------- release

    def handle_return_lease(self, conn, lease_id: int, worker_ok: bool) -> None:
        self.release_lease(lease_id, worker_ok)

    def release_lease(self, lease_id: int, worker_ok: bool) -> None:
        lease = self.leases.pop(lease_id, None)
        if lease is None:
            return
        available, total, gpus = self._pool_of(lease)
        for name, amount in lease.resources.items():
            if name == "CPU" and lease.blocked:
                continue  # lent back already
            available[name] = available.get(name, 0.0) + amount
            assert available[name] <= total.get(name, 0.0) + scheduling.EPSILON
        gpus.release(lease.gpu_allocation)
        owned = self._leases_by_owner[lease.owner]
        owned.discard(lease_id)
        if not owned:
            del self._leases_by_owner[lease.owner]
        self._pool.lease_ended(lease.worker_id, worker_ok, lease.for_actor is not None)
        self._tracer.record(self._trace_name, "lease_returned", lease=lease_id)
        logger.debug("lease %d returned (worker %s ok=%s)", lease_id, lease.worker_id[:8],
                     worker_ok)
        self._dispatch()

    def release_leases_of(self, worker_id: str) -> None:
        """The worker died: its lease ends (and it is not coming back)."""
        lease = self._lease_of_worker(worker_id)
        if lease is not None:
            self.release_lease(lease.lease_id, worker_ok=False)

    def owner_gone(self, owner: str) -> None:
        """A process that held leases for tasks went away: they come back,
        and their workers go, with whatever they were running for it (as
        Ray's raylet kills a leased worker whose owner died). Made idle, a
        worker ran the orphaned task to its end: a child of a recursively
        cancelled task outlived the cancel (default seeds 1269, 3114, 3261)."""
        for lease_id in sorted(self._leases_by_owner.get(owner, ())):
            lease = self.leases.get(lease_id)
            if lease is not None and lease.for_actor is None:
                self.release_lease(lease_id, worker_ok=False)

    # --------------------------------------------------------------- bundles

    def handle_prepare_bundles(self, conn, pg_id: str, node_id: str, bundles: list) -> bool:
        """Reserve these (index, resources) bundles of a placement group if
        they all fit now; nothing is reserved otherwise. Idempotent."""
        if node_id != self._node_id:
            return False  # meant for the node that had this address before
        if self.draining:
            return False  # being removed: the group goes elsewhere
        new = [(index, resources) for index, resources in bundles
               if (pg_id, index) not in self.bundles]
        need: dict = {}
        for _, resources in new:
            for name, amount in resources.items():
                need[name] = need.get(name, 0.0) + amount
        if not scheduling.fits(need, self.available):
            return False
        probe = scheduling.GpuAllocator(0, devices=list(self.gpus.free.items()))
        for _, resources in new:
            if not probe.can_allocate(resources.get("GPU", 0.0)):
                return False
            probe.allocate(resources.get("GPU", 0.0))
        for index, resources in new:
            resources = scheduling.normalize_resources(resources)
            for name, amount in resources.items():
                self.available[name] = self.available.get(name, 0.0) - amount
            allocation = self.gpus.allocate(resources.get("GPU", 0.0))
            self.bundles[(pg_id, index)] = Bundle(
                pg_id, index, dict(resources), dict(resources),
                scheduling.GpuAllocator(0, devices=allocation), allocation)
        self._tracer.record(self._trace_name, "bundles_prepared", pg=pg_id,
                            bundles=[index for index, _ in new])
        return True

    def handle_commit_bundles(self, conn, pg_id: str, indexes: list) -> None:
        for index in indexes:
            bundle = self.bundles.get((pg_id, index))
            if bundle is None:
                raise ValueError(f"bundle {index} of placement group {pg_id} was not "
                                 f"prepared on node {self._node_id}")
            bundle.committed = True
        self._tracer.record(self._trace_name, "bundles_committed", pg=pg_id, bundles=indexes)
        self._dispatch()

    def handle_cancel_bundles(self, conn, pg_id: str, indexes: list | None) -> None:
        """Give back bundles of a group (all of its bundles here with None):
        the workers leased in them are killed."""
        keys = [key for key in sorted(self.bundles)
                if key[0] == pg_id and (indexes is None or key[1] in indexes)]
        for key in keys:
            self._release_bundle(key)
        if keys:
            self._tracer.record(self._trace_name, "bundles_released", pg=pg_id,
                                bundles=[index for _, index in keys])
            self._dispatch()

    def _release_bundle(self, key: tuple) -> None:
        # Closed first: releasing its leases dispatches, which must not grant
        # a request waiting for this bundle the resources it is giving back.
        self.bundles[key].committed = False
        for lease in sorted(self.leases.values(), key=lambda lease: lease.lease_id):
            if lease.bundle == key:
                self.release_lease(lease.lease_id, worker_ok=False)
        bundle = self.bundles.pop(key)
        for name, amount in bundle.resources.items():
            self.available[name] = self.available.get(name, 0.0) + amount
        self.gpus.release(bundle.node_gpu_allocation)
        for waiter in list(self.waiting):
            strategy = waiter.request.strategy
            if isinstance(strategy, PlacementGroupStrategy) and not self._bundles_for(strategy):
                # Its bundle went: the owner asks the GCS where the group is now.
                self.waiting.remove(waiter)
                waiter.withdrawn = (f"the bundles of placement group {key[0]} on node "
                                    f"{self._node_id} were released")
                waiter.event.set()

    def _reconcile_bundles(self) -> None:
        if self.bundles and not self._reconciling_bundles:
            self._reconciling_bundles = True
            self._nursery.start_soon(self._ask_about_bundles, sorted(self.bundles))

    async def _ask_about_bundles(self, keys: list) -> None:
        try:
            held = await self._endpoint.call(self._gcs_address, "held_bundles", self._node_id,
                                             keys)
        except Exception as error:  # noqa: BLE001 - the GCS is away: ask again later
            if not isinstance(error, PeerDisconnected):
                logger.warning("the GCS failed to say which bundles node %s holds: %s",
                               self._node_id, error)
            return
        finally:
            self._reconciling_bundles = False
        held = {tuple(key) for key in held}
        for key in keys:
            if key not in held and key in self.bundles:
                self._tracer.record(self._trace_name, "bundle_reclaimed", pg=key[0],
                                    bundle=key[1])
                self._release_bundle(key)
        self._dispatch()

    # ----------------------------------------------------------------- drain

    def handle_drain(self, conn) -> bool:
        """The autoscaler wants to remove this node: agree, and take no more
        work, only when nothing runs, waits or is reserved here (the
        autoscaler decided on a report that may be a period old)."""
        if self.leases or self.bundles or self.waiting:
            return False
        self.draining = True
        self._tracer.record(self._trace_name, "node_draining")
        return True

    # ------------------------------------------------------------ reconcile

    def reconcile(self) -> None:
        """Ask the owners of leases granted over connections that broke since
        whether they hold them; those not held are reclaimed. Ask the GCS
        which bundles this node should still hold. (The heartbeat reports
        the demand just before: ``DemandReporter.report``.)"""
        if self.waiting:
            self._respill(sorted(self.view), waited_s=self._config.heartbeat_period_s)
        self._reconcile_bundles()
        orphans: dict[str, list] = {}
        for lease_id, lease in sorted(self.leases.items()):
            if lease.conn is not None and lease.conn.closed:
                orphans.setdefault(lease.owner, []).append(lease_id)
        for owner, lease_ids in sorted(orphans.items()):
            if owner not in self._reconciling:
                self._reconciling.add(owner)
                self._nursery.start_soon(self._reconcile, owner, lease_ids)

    async def _reconcile(self, owner: str, lease_ids: list) -> None:
        try:
            connection = await self._endpoint.connect(owner)
            held = await connection.call("held_leases", self._address, lease_ids)
        except Exception as error:  # noqa: BLE001 - unreachable, or it failed to answer
            # Ask again later (if it died, its leases go anyway).
            if not isinstance(error, PeerDisconnected):
                logger.warning("%s failed to say which leases it holds: %s", owner, error)
            return
        finally:
            self._reconciling.discard(owner)
        for lease_id in lease_ids:
            lease = self.leases.get(lease_id)
            if lease is None:
                continue
            if lease_id in held:
                # Held by the process at the far end of this connection: if
                # it breaks in turn, ask again. The owner may have restarted
                # and forgotten the lease (a GCS restart while it created an
                # actor on it: chaos seed 3397, a lease confirmed held and
                # then never reclaimed).
                lease.conn = connection
            else:
                self._tracer.record(self._trace_name, "lease_reclaimed", lease=lease_id)
                self.release_lease(lease_id, worker_ok=False)
