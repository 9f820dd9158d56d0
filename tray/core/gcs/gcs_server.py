"""The global control store: cluster membership, actors, names, and a
key-value store (which also holds the function table).

A facade over its tables, each with one concern:

  ``node_table``               membership, heartbeats, death detection, the view
  ``actor_manager``            the actor directory, actor scheduling and lifecycle
  ``placement_group_manager``  bundles reserved across nodes, two-phase
  ``kv_store``                 the key-value store and the job table
  ``task_event_table``         the newest task attempts' events (volatile)

Durable state goes through the ``Storage`` interface (tables of key ->
bytes) so that a GCS restarted on the same storage recovers nodes, actors,
names and the key-value store. Volatile state (who waits for what,
heartbeat times) is rebuilt from the next messages.

When a process goes away, the non-detached actors and placement groups it
owned go with it, and every node is told to free the objects it owned."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import trio

from ..rpc import Endpoint, EndpointStatistics, add_handlers
from .actor_manager import ActorManager, ActorManagerStatistics
from .demand import DemandTable, DemandTableStatistics
from .kv_store import KvStore, KvStoreStatistics
from .node_table import NodeTable, NodeTableStatistics
from .placement_group_manager import PlacementGroupManager, PlacementGroupStatistics
from .task_event_table import TaskEventTable, TaskEventTableStatistics

logger = logging.getLogger("tray.gcs")


@dataclass(frozen=True)
class GcsStatistics:
    nodes: NodeTableStatistics
    actors: ActorManagerStatistics
    placement_groups: PlacementGroupStatistics
    kv: KvStoreStatistics
    demand: DemandTableStatistics
    task_events: TaskEventTableStatistics
    endpoint: EndpointStatistics


class GcsServer:
    def __init__(self, env, nursery: trio.Nursery) -> None:
        self.env = env
        self.config = env.config
        self.nursery = nursery
        self.tracer = env.tracer
        handlers: dict = {}
        self.endpoint = endpoint = Endpoint(env, handlers, nursery)
        self.node_table = NodeTable(storage=env.storage, endpoint=endpoint, nursery=nursery,
                                    tracer=env.tracer, config=env.config, rng=env.rng)
        self.placement_groups = PlacementGroupManager(
            storage=env.storage, endpoint=endpoint, nursery=nursery, tracer=env.tracer,
            config=env.config, nodes=self.node_table)
        self.actor_manager = ActorManager(
            address=env.address, storage=env.storage, endpoint=endpoint, nursery=nursery,
            tracer=env.tracer, config=env.config, rng=env.rng, nodes=self.node_table,
            placement_groups=self.placement_groups)
        self.node_table.on_node_dead = self._node_dead
        self.placement_groups.on_removed = self.actor_manager.placement_group_removed
        self.kv = KvStore(env.storage, env.tracer, env.config)
        # What the cluster waits for, for the autoscaler (demand.py).
        self.demand = DemandTable(nodes=self.node_table, actors=self.actor_manager,
                                  placement_groups=self.placement_groups, tracer=env.tracer,
                                  storage=env.storage)
        self.actor_manager.pending_reasons = self.demand.pending_reasons
        self.task_events = TaskEventTable(config=env.config, tracer=env.tracer,
                                          storage=env.storage)
        # The messages the GCS answers, by table (every handle_* method must
        # be here: tests/test_handler_tables.py).
        add_handlers(handlers, {
            "register_node": self.node_table.handle_register_node,
            "heartbeat": self.node_table.handle_heartbeat,
            "get_view": self.node_table.handle_get_view,
            "get_all_nodes": self.node_table.handle_get_all_nodes,
            "node_removed": self.node_table.handle_node_removed,
        }, {
            "create_actor": self.actor_manager.handle_create_actor,
            "get_actor": self.actor_manager.handle_get_actor,
            "get_named_actor": self.actor_manager.handle_get_named_actor,
            "get_named_actor_handle": self.actor_manager.handle_get_named_actor_handle,
            "actor_owner": self.actor_manager.handle_actor_owner,
            "list_actors": self.actor_manager.handle_list_actors,
            "list_actor_states": self.actor_manager.handle_list_actor_states,
            "wait_actor_ready": self.actor_manager.handle_wait_actor_ready,
            "held_leases": self.actor_manager.handle_held_leases,
            "kill_actor": self.actor_manager.handle_kill_actor,
            "actor_out_of_scope": self.actor_manager.handle_actor_out_of_scope,
            "actor_exiting": self.actor_manager.handle_actor_exiting,
            "worker_died": self.actor_manager.handle_worker_died,
            "owner_died": self.actor_manager.handle_owner_died,
        }, {
            "create_placement_group": self.placement_groups.handle_create_placement_group,
            "get_placement_group": self.placement_groups.handle_get_placement_group,
            "get_named_placement_group": self.placement_groups.handle_get_named_placement_group,
            "list_placement_groups": self.placement_groups.handle_list_placement_groups,
            "wait_placement_group_ready": self.placement_groups.handle_wait_placement_group_ready,
            "held_bundles": self.placement_groups.handle_held_bundles,
            "remove_placement_group": self.placement_groups.handle_remove_placement_group,
        }, {
            "register_job": self.kv.handle_register_job,
            "list_driver_jobs": self.kv.handle_list_driver_jobs,
            "kv_put": self.kv.handle_kv_put,
            "kv_get": self.kv.handle_kv_get,
            "kv_del": self.kv.handle_kv_del,
            "user_kv_put": self.kv.handle_user_kv_put,
            "user_kv_get": self.kv.handle_user_kv_get,
            "user_kv_keys": self.kv.handle_user_kv_keys,
            "user_kv_del": self.kv.handle_user_kv_del,
            "job_submission_put": self.kv.handle_job_submission_put,
            "job_submission_get": self.kv.handle_job_submission_get,
            "job_submission_list": self.kv.handle_job_submission_list,
            "job_submission_delete": self.kv.handle_job_submission_delete,
        }, {
            "report_demand": self.demand.handle_report_demand,
            "request_resources": self.demand.handle_request_resources,
            "get_cluster_load": self.demand.handle_get_cluster_load,
            "worker_limits": self.demand.handle_worker_limits,
        }, {
            "add_task_events": self.task_events.handle_add_task_events,
            "get_task_events": self.task_events.handle_get_task_events,
            "worker_pids": self.task_events.handle_worker_pids,
            "summarize_task_events": self.task_events.handle_summarize_task_events,
        })
        endpoint.add_peer_closed_listener(self._peer_closed)

    def statistics(self) -> GcsStatistics:
        return GcsStatistics(
            nodes=self.node_table.statistics(), actors=self.actor_manager.statistics(),
            placement_groups=self.placement_groups.statistics(), kv=self.kv.statistics(),
            demand=self.demand.statistics(), task_events=self.task_events.statistics(),
            endpoint=self.endpoint.statistics())

    def validate_state(self) -> None:
        """Check every table's invariants (the simulator calls this after
        every step of a simtest run)."""
        self.node_table.validate_state()
        self.actor_manager.validate_state()
        self.placement_groups.validate_state()
        self.task_events.validate_state()
        self.demand.validate_state()
        self.kv.validate_state()
        self.endpoint.validate_state()

    async def run(self) -> None:
        await self.endpoint.serve()
        self.node_table.start()
        self.placement_groups.start()
        self.actor_manager.start()
        self.tracer.record("gcs", "started", nodes=len(self.node_table.nodes),
                           actors=len(self.actor_manager.actors))
        self.nursery.start_soon(self.node_table.death_detector)

    def _node_dead(self, node_id: str, reason: str) -> None:
        self.placement_groups.node_died(node_id)
        self.actor_manager.node_died(node_id, reason)

    def _peer_closed(self, address: str) -> None:
        # A process went away: the non-detached actors and placement groups
        # it owned go, and every node frees the objects it owned.
        if self.actor_manager.owns_any(address):
            self.actor_manager.handle_owner_died(None, address)
        self.placement_groups.owner_died(address)
        if address in self.node_table.addresses():
            return
        for job_id in self.kv.driver_exited(address):
            self.task_events.job_ended(job_id)
        for _node_id, node in sorted(self.node_table.nodes.items()):
            if node.alive:
                self.nursery.start_soon(self.endpoint.notify_reliable, node.address,
                                        "owner_died", address)
