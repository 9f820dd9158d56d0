"""A node's resources and the leases that hold them.

An owner asks for a *lease*: a worker fit for a scheduling class. The lease
manager either grants a local worker (allocating the resources, GPU device
ids included), answers "spill back to node N" when the shared policy
(``scheduling.pick_node`` over the cluster view) prefers another node, or
says the request is infeasible. Requests that fit the node but not its free
resources wait in a FIFO queue (``waiting``); each time resources are
released the queue is scanned for the first requests that fit.

Every unit of a resource is either available or held by exactly one lease:
``available + sum(lease resources) == total`` for each resource, except
the CPU of a lease whose task is blocked in ``get``/``wait``: it is lent
back (``blocked``) and taken again when the task resumes (which may
oversubscribe the node for a while, as in Ray).

A lease granted over a connection that broke may never have reached its
owner; such leases are *reconciled*: the owner is asked which of them it
holds (``held_leases``), and the others are released."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import trio

from .. import scheduling
from ..messages import Infeasible, LeaseGranted, LeaseRequest, LeaseWithdrawn, Spillback
from ..rpc import Endpoint, PeerDisconnected
from .worker_pool import WorkerPool

logger = logging.getLogger("tray.node")


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


@dataclass
class _Waiter:
    request: LeaseRequest
    event: trio.Event = field(default_factory=trio.Event)
    lease_id: int = 0
    gpu_ids: list = field(default_factory=list)


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


class LeaseManager:
    def __init__(self, *, node_id: str, address: str, endpoint: Endpoint,
                 nursery: trio.Nursery, tracer, config, resources: dict, rng,
                 pool: WorkerPool, refresh_view) -> None:
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
        self.total = scheduling.normalize_resources(resources)
        self.available = dict(self.total)
        self.gpus = scheduling.GpuAllocator(int(self.total.get("GPU", 0)))
        self.leases: dict[int, Lease] = {}
        self._next_lease_id = 1
        self.waiting: list[_Waiter] = []
        # The cluster as this node last heard of it from the GCS.
        self.view: dict[str, scheduling.NodeView] = {}
        self.policy_state = scheduling.PolicyState(rng=rng)
        self._reconciling: set[str] = set()

    def statistics(self) -> LeaseStatistics:
        return LeaseStatistics(
            total=dict(self.total), available=dict(self.available),
            leases=tuple(LeaseSummary(lease.lease_id, lease.worker_id, lease.owner,
                                      dict(lease.resources), lease.for_actor, lease.blocked)
                         for _, lease in sorted(self.leases.items())),
            waiting=tuple((waiter.request.owner, dict(waiter.request.resources))
                          for waiter in self.waiting))

    def validate_state(self) -> None:
        held: dict = {}
        for lease_id, lease in self.leases.items():
            assert lease.lease_id == lease_id, lease_id
            assert 0 < lease_id < self._next_lease_id, lease_id
            for name, amount in lease.resources.items():
                if name == "CPU" and lease.blocked:
                    continue  # lent back while its task waits
                held[name] = held.get(name, 0.0) + amount
            if lease.worker_id:
                worker = self._pool.workers.get(lease.worker_id)
                assert worker is not None, (lease_id, lease.worker_id)
                assert worker.state == ("actor" if lease.for_actor else "leased"), \
                    (lease_id, worker.state)
                assert worker.lease_id == lease_id, (lease_id, worker.lease_id)
        for name, total in self.total.items():
            # Every unit is free or held by exactly one lease.
            assert abs(self.available.get(name, 0.0) + held.get(name, 0.0) - total) <= \
                1e-6, (name, self.available.get(name), held.get(name), total)
        for name in self.available:
            assert name in self.total, name
        allocated = [0.0] * len(self.gpus.free)
        for lease in self.leases.values():
            for index, share in lease.gpu_allocation:
                allocated[index] += share
        for index, share in enumerate(self.gpus.free):
            assert abs(share + allocated[index] - 1.0) <= 1e-6, (index, share, allocated[index])
        leased_workers = {lease.worker_id for lease in self.leases.values() if lease.worker_id}
        for worker_id, worker in self._pool.workers.items():
            if worker.state in ("leased", "actor"):
                assert worker_id in leased_workers, f"worker {worker_id} is busy without a lease"
        for waiter in self.waiting:
            assert not waiter.event.is_set(), waiter.request

    # ------------------------------------------------------------------ view

    def set_view(self, view: dict) -> None:
        self.view = {node_id: scheduling.NodeView(node.node_id, node.address, node.total,
                                                  node.available, node.alive)
                     for node_id, node in view.items()}
        self._refresh_local_view()

    def _refresh_local_view(self) -> None:
        mine = self.view.get(self._node_id)
        if mine is not None:
            mine.available = dict(self.available)

    # ---------------------------------------------------------------- grants

    async def handle_request_lease(self, conn, request: LeaseRequest):
        resources = request.resources
        hops = request.hops
        strategy = request.strategy
        if strategy.kind == "NODE_AFFINITY" and strategy.node_id not in self.view:
            try:  # a node that joined since the last view update?
                await self._refresh_view()
            except PeerDisconnected:
                pass
        pinned_elsewhere = strategy.kind == "NODE_AFFINITY" and not strategy.soft and \
            strategy.node_id != self._node_id
        if hops >= self._config.spillback_hops_max and scheduling.fits(resources, self.total) \
                and not pinned_elsewhere:
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
            return Infeasible(self._infeasible_reason(resources, strategy))
        if target != self._node_id:
            node = self.view[target]
            return Spillback(node.address, target)
        waiter = _Waiter(request)
        self.waiting.append(waiter)
        self._dispatch()
        await waiter.event.wait()
        try:
            worker = await self._pool.take_worker()
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
        worker.state = "actor" if lease.for_actor else "leased"
        worker.lease_id = lease.lease_id
        self._tracer.record(self._trace_name, "lease_granted", lease=lease.lease_id,
                            worker=worker.worker_id)
        logger.debug("lease %d granted: worker %s to %s", lease.lease_id, worker.worker_id[:8],
                     lease.owner)
        return LeaseGranted(lease_id=lease.lease_id, node_id=self._node_id,
                            gpu_ids=waiter.gpu_ids, worker_id=worker.worker_id,
                            worker_address=worker.address)

    def _infeasible_reason(self, resources: dict, strategy) -> str:
        if strategy.kind == "NODE_AFFINITY" and not strategy.soft:
            node = self.view.get(strategy.node_id or "")
            if node is None or not node.alive:
                return f"node {strategy.node_id} (hard node affinity) is not alive"
            return (f"node {strategy.node_id} (hard node affinity) has only {node.total}, "
                    f"the request needs {resources}")
        totals = [n.total for n in self.view.values() if n.alive]
        best = min(totals, key=lambda t: len(scheduling.missing(resources, t)), default={})
        return (f"no node in the cluster has {scheduling.missing(resources, best) or resources} "
                f"(requested {resources})")

    def _dispatch(self) -> None:
        for waiter in list(self.waiting):
            resources = waiter.request.resources
            if not scheduling.fits(resources, self.available):
                continue
            gpus = resources.get("GPU", 0.0)
            if not self.gpus.can_allocate(gpus):
                continue
            self.waiting.remove(waiter)
            for name, amount in resources.items():
                self.available[name] = self.available.get(name, 0.0) - amount
            allocation = self.gpus.allocate(gpus)
            lease_id = self._next_lease_id
            self._next_lease_id += 1
            self.leases[lease_id] = Lease(lease_id, "", waiter.request.owner, resources,
                                          allocation, waiter.request.for_actor)
            waiter.lease_id = lease_id
            waiter.gpu_ids = [i for i, _ in allocation]
            waiter.event.set()

    # ------------------------------------------------------ blocked workers

    def _lease_of(self, worker_id: str) -> Lease | None:
        for lease in self.leases.values():
            if lease.worker_id == worker_id and lease.for_actor is None:
                return lease
        return None

    def handle_worker_blocked(self, conn, worker_id: str) -> None:
        lease = self._lease_of(worker_id)
        if lease is None or lease.blocked:
            return
        lease.blocked = True
        self.available["CPU"] = self.available.get("CPU", 0.0) + lease.resources.get("CPU", 0.0)
        self._dispatch()

    def handle_worker_unblocked(self, conn, worker_id: str) -> None:
        lease = self._lease_of(worker_id)
        if lease is None or not lease.blocked:
            return
        lease.blocked = False
        # May oversubscribe the node for a while, as in Ray: the task runs on.
        self.available["CPU"] = self.available.get("CPU", 0.0) - lease.resources.get("CPU", 0.0)

    # -------------------------------------------------------------- release

    def handle_return_lease(self, conn, lease_id: int, worker_ok: bool) -> None:
        self.release_lease(lease_id, worker_ok)

    def release_lease(self, lease_id: int, worker_ok: bool) -> None:
        lease = self.leases.pop(lease_id, None)
        if lease is None:
            return
        for name, amount in lease.resources.items():
            if name == "CPU" and lease.blocked:
                continue  # lent back already
            self.available[name] = self.available.get(name, 0.0) + amount
            assert self.available[name] <= self.total.get(name, 0.0) + scheduling.EPSILON
        self.gpus.release(lease.gpu_allocation)
        self._pool.lease_ended(lease.worker_id, worker_ok, lease.for_actor is not None)
        self._tracer.record(self._trace_name, "lease_returned", lease=lease_id)
        logger.debug("lease %d returned (worker %s ok=%s)", lease_id, lease.worker_id[:8],
                     worker_ok)
        self._dispatch()

    def release_leases_of(self, worker_id: str) -> None:
        """The worker died: its leases end (and it is not coming back)."""
        for lease in list(self.leases.values()):
            if lease.worker_id == worker_id:
                self.release_lease(lease.lease_id, worker_ok=False)

    def owner_gone(self, owner: str) -> None:
        """A process that held leases for tasks went away: they come back."""
        for lease in sorted(self.leases.values(), key=lambda lease: lease.lease_id):
            if lease.owner == owner and lease.for_actor is None:
                self.release_lease(lease.lease_id, worker_ok=True)

    # ------------------------------------------------------------ reconcile

    def reconcile(self) -> None:
        """Ask the owners of leases granted over connections that broke since
        whether they hold them; those not held are reclaimed."""
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
            held = await self._endpoint.call(owner, "held_leases", self._address, lease_ids)
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
                lease.conn = None
            else:
                self._tracer.record(self._trace_name, "lease_reclaimed", lease=lease_id)
                self.release_lease(lease_id, worker_ok=False)
