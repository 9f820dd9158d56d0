"""The node manager (Ray's "raylet"): one per node.

It owns the node's resources and worker pool and grants *leases*: an owner
asks for a worker fit for a scheduling class, and the node manager either
grants a local worker (allocating the resources, GPU device ids included),
answers "spill back to node N" when the shared policy prefers another node,
or says the request is infeasible. Requests that fit the node but not its
free resources wait in a FIFO queue; each time resources are released the
queue is scanned for the first requests that fit.

It also owns the node's object store and moves objects between nodes: a
worker that needs an object it does not have locally asks its node manager
to *pull* it, and the node manager reads it from a node that holds a copy in
chunks of ``object_chunk_bytes``."""

from __future__ import annotations

import logging
import struct
from dataclasses import dataclass, field

import trio

from .. import exceptions
from . import scheduling
from .ids import WorkerID
from .rpc import Endpoint, PeerDisconnected

logger = logging.getLogger("tray.node")


@dataclass
class WorkerInfo:
    worker_id: str
    address: str = ""
    state: str = "starting"  # starting | idle | leased | actor | dead
    lease_id: int = 0


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
    request: dict
    event: trio.Event = field(default_factory=trio.Event)
    grant: dict | None = None


def packed_slice(data: bytes, buffers: list, offset: int, size: int) -> tuple[int, bytes]:
    """Bytes ``[offset, offset + size)`` of an object's packed form (a header,
    the pickle, then each buffer) and the packed form's length, copying
    only that slice."""
    parts = [memoryview(data).cast("B"), *(memoryview(b).cast("B") for b in buffers)]
    header = struct.pack(f"<II{len(buffers)}Q", len(data), len(buffers),
                         *(p.nbytes for p in parts[1:]))
    parts.insert(0, memoryview(header))
    total = sum(p.nbytes for p in parts)
    chunk, start = [], 0
    for part in parts:
        end = start + part.nbytes
        if end > offset and start < offset + size:
            chunk.append(part[max(0, offset - start):min(part.nbytes, offset + size - start)])
        start = end
    return total, b"".join(chunk)


def unpack_object(blob: bytes) -> tuple[bytes, list]:
    view = memoryview(blob)
    data_len, count = struct.unpack_from("<II", view, 0)
    sizes = struct.unpack_from(f"<{count}Q", view, 8)
    offset = 8 + 8 * count
    data = bytes(view[offset:offset + data_len])
    offset += data_len
    buffers = []
    for size in sizes:
        buffers.append(view[offset:offset + size])
        offset += size
    return data, buffers


class NodeManager:
    def __init__(self, env, nursery: trio.Nursery) -> None:
        self.env = env
        self.config = env.config
        self.node_id: str = env.node_id
        self.nursery = nursery
        self.tracer = env.tracer
        self.store = env.object_store
        self.total = scheduling.normalize_resources(env.resources)
        self.available = dict(self.total)
        self.gpus = scheduling.GpuAllocator(int(self.total.get("GPU", 0)))
        self.workers: dict[str, WorkerInfo] = {}
        self.idle: list[str] = []
        self.leases: dict[int, Lease] = {}
        self._next_lease_id = 1
        self.waiting: list[_Waiter] = []
        self.worker_registered = trio.Event()
        self.failed_worker_starts = 0
        self.last_start_failure = ""
        self.idle_since: dict[str, float] = {}
        self.view: dict[str, scheduling.NodeView] = {}
        self.policy_state = scheduling.PolicyState(rng=env.rng)
        self._pulls: dict[bytes, trio.Event] = {}
        self._reconciling: set[str] = set()
        self.endpoint = Endpoint(env, {name[len("handle_"):]: getattr(self, name)
                                       for name in dir(self) if name.startswith("handle_")},
                                 nursery)
        self.endpoint.on_peer_closed = self._peer_closed

    async def run(self) -> None:
        await self.endpoint.serve()
        registration = {
            "node_id": self.node_id, "address": self.env.address,
            "resources": self.total, "available": dict(self.available),
            "object_store_bytes": self.store.capacity_bytes,
            **self.env.extra.get("node_info", {}),
        }
        # A GCS started beside this node may not listen yet.
        deadline = trio.current_time() + self.env.extra.get("wait_for_gcs_s", 0.0)
        while True:
            try:
                reply = await self.endpoint.call(self.env.gcs_address, "register_node",
                                                 registration)
                break
            except PeerDisconnected:
                if trio.current_time() >= deadline:
                    raise
                await trio.sleep(0.05)
        self._update_view(reply["view"])
        self.tracer.record(self.node_id[:8], "node_started", resources=self.total)
        for _ in range(min(self.env.extra.get("prestart_workers", 0),
                           self.config.workers_per_node_max)):
            self._start_worker()
        self.nursery.start_soon(self._heartbeat_loop)

    # ------------------------------------------------------------ membership

    def _update_view(self, view: dict) -> None:
        for node_id, (address, _, _, alive) in sorted(view.items()):
            known = self.view.get(node_id)
            if not alive and known is not None and known.alive and node_id != self.node_id:
                self.endpoint.drop(address)  # stop waiting for a dead node
        self.view = {node_id: scheduling.NodeView(node_id, address, total, available, alive)
                     for node_id, (address, total, available, alive) in view.items()}
        mine = self.view.get(self.node_id)
        if mine is not None:
            mine.available = dict(self.available)

    def handle_update_view(self, conn, view: dict) -> None:
        self._update_view(view)

    def _reap_idle_workers(self) -> None:
        """Idle workers beyond one per CPU go after ``idle_worker_timeout_s``."""
        keep = max(int(self.total.get("CPU", 0)), self.env.extra.get("prestart_workers", 0))
        now = trio.current_time()
        while len(self.idle) > keep:
            worker = self.workers[self.idle[0]]
            if now - self.idle_since.get(worker.worker_id, now) < \
                    self.config.idle_worker_timeout_s:
                break
            self.env.spawner.kill_worker(worker.worker_id)
            self._worker_died(worker, "idle")

    def _reconcile_leases(self) -> None:
        """Ask the owners of leases granted over connections that broke since
        whether they hold them; those not held are reclaimed."""
        orphans: dict[str, list] = {}
        for lease_id, lease in sorted(self.leases.items()):
            if lease.conn is not None and lease.conn.closed:
                orphans.setdefault(lease.owner, []).append(lease_id)
        for owner, lease_ids in sorted(orphans.items()):
            if owner not in self._reconciling:
                self._reconciling.add(owner)
                self.nursery.start_soon(self._reconcile, owner, lease_ids)

    async def _reconcile(self, owner: str, lease_ids: list) -> None:
        try:
            held = await self.endpoint.call(owner, "held_leases", self.env.address, lease_ids)
        except PeerDisconnected:
            return  # unreachable: ask again later (if it died, its leases go anyway)
        finally:
            self._reconciling.discard(owner)
        for lease_id in lease_ids:
            lease = self.leases.get(lease_id)
            if lease is None:
                continue
            if lease_id in held:
                lease.conn = None
            else:
                self.tracer.record(self.node_id[:8], "lease_reclaimed", lease=lease_id)
                self._release_lease(lease_id, worker_ok=False)

    async def _heartbeat_loop(self) -> None:
        while True:
            await trio.sleep(self.config.heartbeat_period_s)
            self._reap_idle_workers()
            self._reconcile_leases()
            try:
                reply = await self.endpoint.call(self.env.gcs_address, "heartbeat",
                                                 self.node_id, dict(self.available))
            except PeerDisconnected:
                continue  # the GCS is restarting; try again next period
            if reply.get("dead"):
                self._fence()
                return
            self._update_view(reply["view"])

    def _fence(self) -> None:
        """The GCS declared this node dead (it was unreachable for too long):
        its work has been retried elsewhere, so it must end, as a raylet
        does, rather than run on beside its replacement."""
        logger.error("node %s was declared dead by the GCS; exiting", self.node_id)
        self.tracer.record(self.node_id[:8], "node_fenced")
        for worker in sorted(self.workers.values(), key=lambda w: w.worker_id):
            if worker.state != "dead":
                self.env.spawner.kill_worker(worker.worker_id)
        exit_process = self.env.extra.get("exit_process")
        if exit_process is not None:
            exit_process()

    def handle_get_node_stats(self, conn) -> dict:
        return {"node_id": self.node_id, "total": dict(self.total),
                "available": dict(self.available),
                "workers": len([w for w in self.workers.values() if w.state != "dead"]),
                "leases": len(self.leases), "store_used_bytes": self.store.used_bytes()}

    # --------------------------------------------------------------- workers

    def handle_register_worker(self, conn, worker_id: str, address: str) -> dict:
        worker = self.workers.get(worker_id)
        if worker is None or worker.state == "dead":
            raise ValueError(f"unknown worker {worker_id}")
        worker.address = address
        worker.state = "idle"
        self.idle.append(worker_id)
        self.idle_since[worker_id] = trio.current_time()
        self.tracer.record(self.node_id[:8], "worker_registered", worker=worker_id)
        logger.debug("worker %s registered at %s", worker_id[:8], address)
        self.failed_worker_starts = 0
        self._wake_worker_waiters()
        return {"node_id": self.node_id}

    def _start_worker(self) -> None:
        live = [w for w in self.workers.values() if w.state != "dead"]
        if len(live) >= self.config.workers_per_node_max:
            raise RuntimeError(f"node {self.node_id} has {len(live)} workers, the maximum")
        worker_id = WorkerID.from_random(self.env.rng).hex()
        self.workers[worker_id] = WorkerInfo(worker_id)
        self.tracer.record(self.node_id[:8], "worker_start", worker=worker_id)
        logger.debug("starting worker %s", worker_id[:8])
        self.env.spawner.start_worker(worker_id, {})

    async def _take_worker(self) -> WorkerInfo:
        while True:
            while self.idle:
                worker = self.workers[self.idle.pop(0)]
                if worker.state == "idle":
                    return worker
            if self.failed_worker_starts >= self.config.worker_start_failures_max:
                raise exceptions.TrayError(
                    f"workers fail to start on node {self.node_id} "
                    f"({self.failed_worker_starts} in a row; last: {self.last_start_failure})")
            starting = [w for w in self.workers.values() if w.state == "starting"]
            if not starting:
                self._start_worker()
            await self.worker_registered.wait()

    def worker_process_exited(self, worker_id: str, exit_code: int) -> None:
        """The spawner saw a worker process end (a backend calls this)."""
        worker = self.workers.get(worker_id)
        if worker is None or worker.state == "dead":
            return
        if worker.state == "starting":
            self.failed_worker_starts += 1
            self.last_start_failure = f"worker {worker_id[:8]} exited with code {exit_code} " \
                                      "before registering"
            logger.error("%s", self.last_start_failure)
            self._worker_died(worker, self.last_start_failure)
            self._wake_worker_waiters()
            return
        self._worker_died(worker, f"its process exited with code {exit_code}")

    def _wake_worker_waiters(self) -> None:
        self.worker_registered.set()
        self.worker_registered = trio.Event()

    def _peer_closed(self, address: str) -> None:
        self.handle_owner_died(None, address)
        for worker in sorted(self.workers.values(), key=lambda w: w.worker_id):
            if worker.address == address and worker.state != "dead":
                self._worker_died(worker, "its connection closed")
        for lease in sorted(self.leases.values(), key=lambda lease: lease.lease_id):
            if lease.owner == address and lease.for_actor is None:
                self._release_lease(lease.lease_id, worker_ok=True)

    def _worker_died(self, worker: WorkerInfo, reason: str) -> None:
        previous = worker.state
        worker.state = "dead"
        self.idle_since.pop(worker.worker_id, None)
        if worker.worker_id in self.idle:
            self.idle.remove(worker.worker_id)
        self.tracer.record(self.node_id[:8], "worker_died", worker=worker.worker_id,
                           reason=reason)
        logger.debug("worker %s died: %s", worker.worker_id[:8], reason)
        for lease in list(self.leases.values()):
            if lease.worker_id == worker.worker_id:
                self._release_lease(lease.lease_id, worker_ok=False)
        if previous in ("leased", "actor"):
            self.nursery.start_soon(self._report_worker_death, worker.worker_id, reason)

    async def _report_worker_death(self, worker_id: str, reason: str) -> None:
        try:
            await self.endpoint.notify(self.env.gcs_address, "worker_died", worker_id,
                                       self.node_id, reason)
        except PeerDisconnected:
            pass

    def handle_kill_worker(self, conn, worker_id: str) -> None:
        worker = self.workers.get(worker_id)
        if worker is None or worker.state == "dead":
            return
        self.env.spawner.kill_worker(worker_id)
        self._worker_died(worker, "killed")

    # ---------------------------------------------------------------- leases

    async def handle_request_lease(self, conn, request: dict) -> dict:
        resources = request["resources"]
        hops = request.get("hops", 0)
        strategy = request["strategy"]
        if strategy.kind == "NODE_AFFINITY" and strategy.node_id not in self.view:
            try:  # a node that joined since the last view update?
                self._update_view(await self.endpoint.call(self.env.gcs_address, "get_view"))
            except PeerDisconnected:
                pass
        if hops >= self.config.spillback_hops_max and scheduling.fits(resources, self.total):
            target = self.node_id
        else:
            self._refresh_local_view()
            target = scheduling.pick_node(resources, strategy, self.node_id, self.view,
                                          self.policy_state,
                                          self.config.local_utilization_threshold)
        if target == scheduling.INFEASIBLE:
            return {"infeasible": self._infeasible_reason(resources, strategy)}
        if target != self.node_id:
            node = self.view[target]
            return {"spillback": node.address, "node_id": target}
        waiter = _Waiter(request)
        self.waiting.append(waiter)
        self._dispatch()
        await waiter.event.wait()
        grant = waiter.grant
        assert grant is not None
        try:
            worker = await self._take_worker()
        except BaseException:
            self._release_lease(grant["lease_id"], worker_ok=True)
            raise
        lease = self.leases[grant["lease_id"]]
        if conn is not None and conn.closed:
            # The requester went away while it waited: nobody would return this lease.
            self.idle.insert(0, worker.worker_id)
            self._release_lease(lease.lease_id, worker_ok=True)
            return {}
        lease.worker_id = worker.worker_id
        lease.conn = conn
        worker.state = "actor" if lease.for_actor else "leased"
        worker.lease_id = lease.lease_id
        grant.update(worker_id=worker.worker_id, worker_address=worker.address)
        self.tracer.record(self.node_id[:8], "lease_granted", lease=lease.lease_id,
                           worker=worker.worker_id)
        logger.debug("lease %d granted: worker %s to %s", lease.lease_id, worker.worker_id[:8],
                     lease.owner)
        return grant

    def _refresh_local_view(self) -> None:
        mine = self.view.get(self.node_id)
        if mine is not None:
            mine.available = dict(self.available)

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
            resources = waiter.request["resources"]
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
            self.leases[lease_id] = Lease(lease_id, "", waiter.request["owner"], resources,
                                          allocation, waiter.request.get("for_actor"))
            waiter.grant = {"lease_id": lease_id, "node_id": self.node_id,
                            "gpu_ids": [i for i, _ in allocation]}
            waiter.event.set()

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

    def handle_return_lease(self, conn, lease_id: int, worker_ok: bool) -> None:
        self._release_lease(lease_id, worker_ok)

    def _release_lease(self, lease_id: int, worker_ok: bool) -> None:
        lease = self.leases.pop(lease_id, None)
        if lease is None:
            return
        for name, amount in lease.resources.items():
            if name == "CPU" and lease.blocked:
                continue  # lent back already
            self.available[name] = self.available.get(name, 0.0) + amount
            assert self.available[name] <= self.total.get(name, 0.0) + scheduling.EPSILON
        self.gpus.release(lease.gpu_allocation)
        worker = self.workers.get(lease.worker_id)
        if worker is not None and worker.state in ("leased", "actor"):
            if worker_ok and lease.for_actor is None:
                worker.state = "idle"
                self.idle.append(worker.worker_id)
                self.idle_since[worker.worker_id] = trio.current_time()
                self._wake_worker_waiters()
            elif not worker_ok:
                self.env.spawner.kill_worker(worker.worker_id)
                self._worker_died(worker, "returned as broken")
        self.tracer.record(self.node_id[:8], "lease_returned", lease=lease_id)
        logger.debug("lease %d returned (worker %s ok=%s)", lease_id, lease.worker_id[:8],
                     worker_ok)
        self._dispatch()

    # --------------------------------------------------------------- objects

    async def handle_pull_object(self, conn, object_id: bytes, locations: list,
                                 owner: str) -> bool:
        """Make ``object_id`` local, copying it from one of ``locations``
        ((node id, node manager address) pairs); False if no copy could be read."""
        while not self.store.contains(object_id):
            event = self._pulls.get(object_id)
            if event is not None:
                await event.wait()
                continue
            event = self._pulls[object_id] = trio.Event()
            try:
                for node_id, address in sorted(locations):
                    if node_id == self.node_id:
                        continue
                    try:
                        blob = await self._read_remote(address, object_id)
                    except PeerDisconnected:
                        continue
                    if blob is not None:
                        data, buffers = unpack_object(blob)
                        self.store.put(object_id, data, buffers, owner=owner)
                        self.tracer.record(self.node_id[:8], "object_pulled",
                                           object=object_id, source=node_id, size=len(blob))
                        # The owner frees every copy, so it must know of this one.
                        await self.endpoint.notify(owner, "add_location", object_id,
                                                   self.node_id, self.env.address)
                        break
                else:
                    return False
            finally:
                del self._pulls[object_id]
                event.set()
        return True

    async def _read_remote(self, address: str, object_id: bytes) -> bytes | None:
        chunks, offset = [], 0
        while True:
            reply = await self.endpoint.call(address, "read_object_chunk", object_id, offset,
                                             self.config.object_chunk_bytes)
            if reply is None:
                return None
            total, chunk = reply
            chunks.append(chunk)
            offset += len(chunk)
            if offset >= total:
                return b"".join(chunks)

    def handle_read_object_chunk(self, conn, object_id: bytes, offset: int, size: int):
        entry = self.store.get(object_id)
        if entry is None:
            return None
        return packed_slice(*entry, offset, size)

    def handle_free_objects(self, conn, object_ids: list) -> None:
        for object_id in object_ids:
            self.store.delete(object_id)

    def handle_owner_died(self, conn, owner: str) -> None:
        """Free the objects a dead process owned: nobody can free them now."""
        freed = self.store.objects_owned_by(owner)
        for object_id in freed:
            self.store.delete(object_id)
        if freed:
            self.tracer.record(self.node_id[:8], "owner_objects_freed", owner=owner,
                               count=len(freed))
