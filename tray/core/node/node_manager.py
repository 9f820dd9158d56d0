"""The node manager (Ray's "raylet"): one per node.

A facade over the node's components, each with one concern:

  ``worker_pool``     the node's worker processes (start, hand out, reap)
  ``lease_manager``   the node's resources and the leases that hold them
  ``demand_reporter`` what waits here, reported to the GCS for the autoscaler
  ``object_manager``  moving objects between nodes and freeing them
  ``memory_monitor``  killing a worker when the machine runs low on memory

The node manager itself keeps the node's membership: it registers with the
GCS, heartbeats (reporting free resources, receiving the changes to the
cluster view that the lease manager schedules with: see gcs/node_table.py
for how deltas stay correct), and fences itself — kills its workers
and ends — when the GCS declared it dead (it was unreachable too long, and
its work has been retried elsewhere). It also reacts when a peer process
goes away: the objects it owned are freed, the leases it held return, and
a worker of this node whose connection closed is dead."""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass

import trio

from ..messages import NodeRecord, NodeStats, ViewUpdate, WorkerRow
from ..rpc import Endpoint, EndpointStatistics, PeerDisconnected, add_handlers
from .demand_reporter import DemandReporter, DemandReporterStatistics
from .lease_manager import LeaseManager, LeaseStatistics
from .memory_monitor import MemoryMonitor, MemoryMonitorStatistics
from .object_manager import ObjectManager, ObjectManagerStatistics, packed_slice, unpack_object
from .worker_pool import WorkerPool, WorkerPoolStatistics

logger = logging.getLogger("tray.node")

__all__ = ["NodeManager", "packed_slice", "unpack_object"]


@dataclass(frozen=True)
class NodeManagerStatistics:
    node_id: str
    workers: WorkerPoolStatistics
    leases: LeaseStatistics
    pulls_in_progress: int
    memory: MemoryMonitorStatistics | None = None
    demand: DemandReporterStatistics | None = None
    objects: ObjectManagerStatistics | None = None
    endpoint: EndpointStatistics | None = None


class NodeManager:
    def __init__(self, env, nursery: trio.Nursery) -> None:
        self.env = env
        self.config = env.config
        self.node_id: str = env.node_id
        self.nursery = nursery
        self.tracer = env.tracer
        handlers: dict = {}
        self.endpoint = endpoint = Endpoint(env, handlers, nursery)
        self.pool = WorkerPool(
            node_id=env.node_id, endpoint=endpoint, nursery=nursery, tracer=env.tracer,
            config=env.config, spawner=env.spawner, rng=env.rng, gcs_address=env.gcs_address,
            cpus=int(env.resources.get("CPU", 0)),
            prestart_workers=env.prestart_workers)
        self.leases = LeaseManager(
            node_id=env.node_id, address=env.address, endpoint=endpoint, nursery=nursery,
            tracer=env.tracer, config=env.config, resources=env.resources, rng=env.rng,
            pool=self.pool, refresh_view=self._refresh_view, gcs_address=env.gcs_address,
            note_infeasible=lambda request: self.demand.note_infeasible(request))
        self.demand = DemandReporter(node_id=env.node_id, endpoint=endpoint, nursery=nursery,
                                     config=env.config, gcs_address=env.gcs_address,
                                     leases=self.leases, pool=self.pool)
        self.pool.release_leases_of = self.leases.release_leases_of
        self.objects = ObjectManager(node_id=env.node_id, address=env.address,
                                     endpoint=endpoint, tracer=env.tracer, config=env.config,
                                     store=env.object_store, nursery=nursery)
        self.memory = MemoryMonitor(node_id=env.node_id, config=env.config, tracer=env.tracer,
                                    read_memory=env.read_memory, leases=self.leases,
                                    pool=self.pool)
        # The messages a node manager answers, by component (every handle_*
        # method must be here: tests/test_handler_tables.py).
        add_handlers(handlers, {
            "view_changed": self.handle_view_changed,
            "get_node_stats": self.handle_get_node_stats,
            "list_workers": self.handle_list_workers,
        }, {
            "register_worker": self.pool.handle_register_worker,
            "kill_worker": self.pool.handle_kill_worker,
        }, {
            "request_lease": self.leases.handle_request_lease,
            "cancel_lease_requests": self.leases.handle_cancel_lease_requests,
            "worker_blocked": self.leases.handle_worker_blocked,
            "worker_unblocked": self.leases.handle_worker_unblocked,
            "return_lease": self.leases.handle_return_lease,
            "prepare_bundles": self.leases.handle_prepare_bundles,
            "commit_bundles": self.leases.handle_commit_bundles,
            "cancel_bundles": self.leases.handle_cancel_bundles,
            "drain": self.leases.handle_drain,
        }, {
            "pull_object": self.objects.handle_pull_object,
            "share_object": self.objects.handle_share_object,
            "read_object_chunk": self.objects.handle_read_object_chunk,
            "free_objects": self.objects.handle_free_objects,
            "owner_died": self.objects.handle_owner_died,
        }, {
            "worker_failure_cause": self.memory.handle_worker_failure_cause,
        })
        endpoint.add_peer_closed_listener(self._peer_closed)
        # The version of the view this node holds (see gcs/node_table.py);
        # epoch 0 is no GCS's: the first update is a whole view.
        self.view_epoch = 0
        self.view_version = -1

    async def run(self) -> None:
        await self.endpoint.serve()
        registration = NodeRecord(
            node_id=self.node_id, address=self.env.address, resources=self.leases.total,
            available=dict(self.leases.available),
            object_store_bytes=self.env.object_store.capacity_bytes,
            **dataclasses.asdict(self.env.node_location))
        # A GCS started beside this node may not listen yet.
        deadline = trio.current_time() + self.env.wait_for_gcs_s
        while True:
            try:
                reply = await self.endpoint.call(self.env.gcs_address, "register_node",
                                                 registration)
                break
            except PeerDisconnected:
                if trio.current_time() >= deadline:
                    raise
                await trio.sleep(0.05)
        self._update_view(reply.view)
        self.tracer.record(self.node_id[:8], "node_started", resources=self.leases.total)
        self.pool.prestart()
        self.nursery.start_soon(self._heartbeat_loop)
        if self.memory.enabled:
            self.nursery.start_soon(self.memory.run)

    def statistics(self) -> NodeManagerStatistics:
        return NodeManagerStatistics(self.node_id, self.pool.statistics(),
                                     self.leases.statistics(), self.objects.pulls_in_progress(),
                                     self.memory.statistics(), self.demand.statistics(),
                                     self.objects.statistics(), self.endpoint.statistics())

    def validate_state(self) -> None:
        """Check every component's invariants (the simulator calls this
        after every step of a simtest run)."""
        self.pool.validate_state()
        self.leases.validate_state()
        self.memory.validate_state()
        self.demand.validate_state()
        self.objects.validate_state()
        self.endpoint.validate_state()

    def worker_process_exited(self, worker_id: str, exit_code: int) -> None:
        """The spawner saw a worker process end (a backend calls this)."""
        self.pool.worker_process_exited(worker_id, exit_code)

    # ------------------------------------------------------------ membership

    def _update_view(self, update: ViewUpdate) -> None:
        """Apply a view or a delta from the GCS, if it fits the view held
        (see gcs/node_table.py): a delta that does not start at or before
        the version held, or ends at or before it, is dropped, and the next
        heartbeat brings what it would have. A whole view is always taken:
        the GCS sends one when it cannot trust the version held (one an
        older whole view overtook is repaired the same way, a period later)."""
        whole = update.base_version == -1
        if not whole and (update.epoch != self.view_epoch or
                          not update.base_version <= self.view_version < update.version):
            return
        for node_id, node in sorted(update.nodes.items(), key=lambda item: item[0]):
            known = self.leases.view.get(node_id)
            if not node.alive and known is not None and known.alive and \
                    node_id != self.node_id:
                self.endpoint.drop(node.address)  # stop waiting for a dead node
        if whole:
            self.leases.set_view(update.nodes)
        else:
            self.leases.update_view(update.nodes)
        self.view_epoch, self.view_version = update.epoch, update.version

    async def _refresh_view(self) -> None:
        self._update_view(await self.endpoint.call(self.env.gcs_address, "get_view"))

    def handle_view_changed(self, conn, update: ViewUpdate) -> None:
        self._update_view(update)

    async def _heartbeat_loop(self) -> None:
        while True:
            await trio.sleep(self.config.heartbeat_period_s)
            self.pool.reap_idle()
            self.demand.report()
            self.leases.reconcile()
            self.objects.reconcile()
            try:
                reply = await self.endpoint.call(self.env.gcs_address, "heartbeat",
                                                 self.node_id, dict(self.leases.available),
                                                 self.view_epoch, self.view_version)
            except PeerDisconnected:
                continue  # the GCS is restarting; try again next period
            except Exception as error:  # noqa: BLE001 - the GCS failed this heartbeat
                logger.warning("the GCS failed a heartbeat of node %s: %s", self.node_id, error)
                continue
            if reply.dead:
                self._fence()
                return
            self._update_view(reply.view)

    def _fence(self) -> None:
        """The GCS declared this node dead (it was unreachable for too long):
        its work has been retried elsewhere, so it must end, as a raylet
        does, rather than run on beside its replacement."""
        logger.error("node %s was declared dead by the GCS; exiting", self.node_id)
        self.tracer.record(self.node_id[:8], "node_fenced")
        self.pool.kill_all()
        if self.env.exit_process is not None:
            self.env.exit_process()

    def handle_get_node_stats(self, conn) -> NodeStats:
        return NodeStats(node_id=self.node_id, total=dict(self.leases.total),
                         available=dict(self.leases.available),
                         workers=self.pool.live_count(),
                         workers_started=self.pool.started,
                         leases=len(self.leases.leases),
                         store_used_bytes=self.objects.store.used_bytes())

    def handle_list_workers(self, conn) -> list[WorkerRow]:
        """This node's worker processes (``tray.util.state.list_workers``)."""
        return [WorkerRow(worker.worker_id, worker.address, worker.state.value, worker.lease_id)
                for _, worker in sorted(self.pool.workers.items())]

    def _peer_closed(self, address: str) -> None:
        self.objects.handle_owner_died(None, address)
        self.pool.connection_closed(address)
        self.leases.owner_gone(address)
