"""The global control store: cluster membership, actors, names, and a
key-value store (which also holds the function table).

Durable state goes through the ``Storage`` interface (tables of key -> bytes)
so that a GCS restarted on the same storage recovers nodes, actors, names and
the key-value store. Volatile state (who waits for what, heartbeat times) is
rebuilt from the next messages.

Actors are scheduled here (as in Ray's GCS-based actor scheduling): the GCS
picks a node with the shared policy, leases a dedicated worker from that
node's manager, and sends it the creation task. When the worker dies the
actor restarts elsewhere within ``max_restarts``; callers learn the actor's
state by long-polling ``wait_actor_ready``."""

from __future__ import annotations

import logging
import pickle

import trio

from . import scheduling
from .rpc import Endpoint, PeerDisconnected

logger = logging.getLogger("tray.gcs")

PENDING, ALIVE, RESTARTING, DEAD = "PENDING_CREATION", "ALIVE", "RESTARTING", "DEAD"

T_NODES, T_ACTORS, T_NAMES, T_KV, T_JOBS = "nodes", "actors", "names", "kv", "jobs"


class GcsServer:
    def __init__(self, env, nursery: trio.Nursery) -> None:
        self.env = env
        self.config = env.config
        self.storage = env.storage
        self.nursery = nursery
        self.endpoint = Endpoint(env, self._handlers(), nursery)
        self.endpoint.on_peer_closed = self._peer_closed
        self.tracer = env.tracer
        self.policy_state = scheduling.PolicyState(rng=env.rng)
        self.nodes: dict[str, dict] = {}
        self.heartbeat_at: dict[str, float] = {}
        self.actors: dict[str, dict] = {}
        self.actor_changed: dict[str, trio.Event] = {}
        self.names: dict[tuple[str, str], str] = {}
        # Actor placements not yet visible in heartbeats: node -> [[resources, until]].
        self.placements: dict[str, list] = {}
        # Leases granted for actors still being created: (node address, lease id).
        self.granting: set[tuple[str, int]] = set()
        self._recover()

    def _handlers(self) -> dict:
        return {name[len("handle_"):]: getattr(self, name)
                for name in dir(self) if name.startswith("handle_")}

    # ------------------------------------------------------------------ state

    def _recover(self) -> None:
        for key, value in self.storage.scan(T_NODES):
            self.nodes[key] = pickle.loads(value)
        for key, value in self.storage.scan(T_ACTORS):
            self.actors[key] = pickle.loads(value)
        for key, value in self.storage.scan(T_NAMES):
            namespace, _, name = key.partition("/")
            self.names[(namespace, name)] = value.decode()

    def _save_node(self, node: dict) -> None:
        self.storage.put(T_NODES, node["node_id"], pickle.dumps(node))

    def _save_actor(self, actor: dict) -> None:
        self.storage.put(T_ACTORS, actor["actor_id"], pickle.dumps(actor))
        event = self.actor_changed.pop(actor["actor_id"], None)
        if event is not None:
            event.set()

    async def run(self) -> None:
        await self.endpoint.serve()
        now = trio.current_time()
        for node_id in self.nodes:
            self.heartbeat_at[node_id] = now
        for actor in self.actors.values():
            if actor["state"] in (PENDING, RESTARTING):
                self.nursery.start_soon(self._schedule_actor, actor["actor_id"])
        self.tracer.record("gcs", "started", nodes=len(self.nodes), actors=len(self.actors))
        self.nursery.start_soon(self._death_detector)

    # ------------------------------------------------------------------ nodes

    def handle_register_node(self, conn, node: dict) -> dict:
        node = dict(node, alive=True)
        self.nodes[node["node_id"]] = node
        self.heartbeat_at[node["node_id"]] = trio.current_time()
        self._save_node(node)
        self.tracer.record("gcs", "node_registered", node=node["node_id"])
        self._publish_view(exclude=node["node_id"])
        return {"view": self._view()}

    def _publish_view(self, exclude: str | None = None) -> None:
        """Tell every live node manager about a membership change now,
        rather than at its next heartbeat."""
        view = self._view()
        for node_id, other in sorted(self.nodes.items()):
            if other["alive"] and node_id != exclude:
                self.nursery.start_soon(self.endpoint.notify, other["address"], "update_view",
                                        view)

    def handle_heartbeat(self, conn, node_id: str, available: dict) -> dict:
        node = self.nodes.get(node_id)
        if node is None or not node["alive"]:
            return {"view": self._view(), "dead": True}
        node["available"] = available
        self.heartbeat_at[node_id] = trio.current_time()
        return {"view": self._view()}

    def _view(self) -> dict:
        return {node_id: (node["address"], node["resources"], node.get("available", node["resources"]),
                          node["alive"]) for node_id, node in sorted(self.nodes.items())}

    def policy_view(self) -> dict[str, scheduling.NodeView]:
        """The nodes as the actor scheduler sees them: what each reported
        free at its last heartbeat, less the actors placed there since
        (a heartbeat sent before a placement must not undo it)."""
        now = trio.current_time()
        view = {}
        for node_id, (address, total, available, alive) in self._view().items():
            available = dict(available)
            for resources, until in self.placements.get(node_id, []):
                if until > now:
                    for name, amount in resources.items():
                        available[name] = available.get(name, 0.0) - amount
            view[node_id] = scheduling.NodeView(node_id, address, total, available, alive)
        return view

    def handle_get_view(self, conn) -> dict:
        return self._view()

    def handle_get_all_nodes(self, conn) -> list[dict]:
        return [dict(node) for _, node in sorted(self.nodes.items())]

    async def _death_detector(self) -> None:
        while True:
            await trio.sleep(self.config.heartbeat_period_s)
            now = trio.current_time()
            for node_id, node in sorted(self.nodes.items()):
                if node["alive"] and now - self.heartbeat_at.get(node_id, now) > \
                        self.config.node_death_timeout_s:
                    self.mark_node_dead(node_id, "missed heartbeats")

    def mark_node_dead(self, node_id: str, reason: str) -> None:
        node = self.nodes[node_id]
        if not node["alive"]:
            return
        node["alive"] = False
        self._save_node(node)
        self.tracer.record("gcs", "node_dead", node=node_id, reason=reason)
        self._publish_view()
        logger.warning("node %s is dead: %s", node_id, reason)
        # Every other process stops waiting for the dead node's processes.
        nodes = self._node_addresses()
        for peer in self.endpoint.peers():
            if peer not in nodes:
                self.nursery.start_soon(self.endpoint.notify, peer, "node_died", node_id,
                                        node["address"])
        for actor in sorted(self.actors.values(), key=lambda a: a["actor_id"]):
            if actor["node_id"] == node_id and actor["state"] in (ALIVE, PENDING):
                self._actor_failed(actor, f"its node {node_id} died ({reason})")

    # --------------------------------------------------------------- jobs, kv

    def handle_register_job(self, conn, driver_address: str) -> int:
        job_id = len(self.storage.scan(T_JOBS)) + 1
        self.storage.put(T_JOBS, f"{job_id:08d}", driver_address.encode())
        self.tracer.record("gcs", "job_registered", job=job_id)
        return job_id

    def handle_kv_put(self, conn, key: str, value: bytes, overwrite: bool) -> bool:
        if not overwrite and self.storage.get(T_KV, key) is not None:
            return False
        self.storage.put(T_KV, key, value)
        return True

    def handle_kv_get(self, conn, key: str) -> bytes | None:
        return self.storage.get(T_KV, key)

    def handle_kv_del(self, conn, key: str) -> None:
        self.storage.delete(T_KV, key)

    # ----------------------------------------------------------------- actors

    def handle_create_actor(self, conn, actor: dict) -> dict:
        """Register an actor; returns at once, scheduling continues."""
        if actor["actor_id"] in self.actors:  # a retry after a GCS restart
            return {"existing": None}
        name, namespace = actor.get("name"), actor.get("namespace") or ""
        if name:
            existing = self.names.get((namespace, name))
            if existing is not None and self.actors[existing]["state"] != DEAD:
                if actor.get("get_if_exists"):
                    return {"existing": self._public_actor(self.actors[existing])}
                raise ValueError(f"an actor named {name!r} already exists in namespace "
                                 f"{namespace!r}; pass get_if_exists=True to reuse it")
            self.names[(namespace, name)] = actor["actor_id"]
            self.storage.put(T_NAMES, f"{namespace}/{name}", actor["actor_id"].encode())
        actor.update(state=PENDING, address=None, worker_id=None, node_id=None, restarts=0,
                     death_cause=None, incarnation=0)
        self.actors[actor["actor_id"]] = actor
        self._save_actor(actor)
        self.tracer.record("gcs", "actor_registered", actor=actor["actor_id"])
        self.nursery.start_soon(self._schedule_actor, actor["actor_id"])
        return {"existing": None}

    def _public_actor(self, actor: dict) -> dict:
        return {key: actor[key] for key in
                ("actor_id", "state", "address", "worker_id", "node_id", "name", "namespace",
                 "restarts", "max_restarts", "death_cause", "incarnation", "class_name",
                 "max_task_retries", "is_async", "method_meta")}

    def handle_get_actor(self, conn, actor_id: str) -> dict | None:
        actor = self.actors.get(actor_id)
        return None if actor is None else self._public_actor(actor)

    def handle_get_named_actor(self, conn, name: str, namespace: str) -> dict | None:
        actor_id = self.names.get((namespace, name))
        if actor_id is None or self.actors[actor_id]["state"] == DEAD:
            return None
        return self._public_actor(self.actors[actor_id])

    def handle_list_actors(self, conn) -> list[dict]:
        return [self._public_actor(actor) for _, actor in sorted(self.actors.items())]

    async def handle_wait_actor_ready(self, conn, actor_id: str, seen_incarnation: int) -> dict:
        """Reply when the actor is ALIVE in an incarnation newer than
        ``seen_incarnation``, or DEAD."""
        while True:
            actor = self.actors.get(actor_id)
            if actor is None:
                raise ValueError(f"unknown actor {actor_id}")
            if actor["state"] == DEAD or (actor["state"] == ALIVE and
                                          actor["incarnation"] > seen_incarnation):
                return self._public_actor(actor)
            event = self.actor_changed.setdefault(actor_id, trio.Event())
            await event.wait()

    async def handle_kill_actor(self, conn, actor_id: str, no_restart: bool) -> None:
        actor = self.actors.get(actor_id)
        if actor is None or actor["state"] == DEAD:
            return
        self.tracer.record("gcs", "actor_kill", actor=actor_id, no_restart=no_restart)
        node_id, worker_id = actor["node_id"], actor["worker_id"]
        if no_restart:
            self._set_dead(actor, "the actor was killed by tray.kill()")
        else:
            actor["max_restarts_budget_bypass"] = True
        if worker_id is not None and node_id in self.nodes:
            try:
                await self.endpoint.call(self.nodes[node_id]["address"], "kill_worker", worker_id)
            except PeerDisconnected:
                pass

    def handle_held_leases(self, conn, node_manager: str, lease_ids: list) -> list:
        """Which of these leases from ``node_manager`` host (or are creating)
        an actor; the node reclaims the others (granted before a GCS
        restart, or to a creation that was given up)."""
        held = {actor.get("lease_id") for actor in self.actors.values()
                if actor["state"] != DEAD and actor["node_id"] in self.nodes
                and self.nodes[actor["node_id"]]["address"] == node_manager}
        return [lease_id for lease_id in lease_ids
                if lease_id in held or (node_manager, lease_id) in self.granting]

    def handle_worker_died(self, conn, worker_id: str, node_id: str, reason: str) -> None:
        for actor in sorted(self.actors.values(), key=lambda a: a["actor_id"]):
            if actor["worker_id"] == worker_id and actor["state"] in (ALIVE, PENDING):
                self._actor_failed(actor, f"its worker died ({reason})")

    def handle_owner_died(self, conn, owner_address: str) -> None:
        for actor in sorted(self.actors.values(), key=lambda a: a["actor_id"]):
            if actor["owner_address"] == owner_address and not actor["detached"] \
                    and actor["state"] != DEAD:
                self._set_dead(actor, "its owner exited")
                if actor["worker_id"] and actor["node_id"] in self.nodes:
                    self.nursery.start_soon(self._kill_worker, actor["node_id"], actor["worker_id"])

    def _peer_closed(self, address: str) -> None:
        # A process went away: the non-detached actors it owned die, and
        # every node frees the objects it owned.
        if any(actor["owner_address"] == address for actor in self.actors.values()):
            self.handle_owner_died(None, address)
        if address in self._node_addresses():
            return
        for _node_id, node in sorted(self.nodes.items()):
            if node["alive"]:
                self.nursery.start_soon(self.endpoint.notify, node["address"], "owner_died",
                                        address)

    def _node_addresses(self) -> set:
        return {node["address"] for node in self.nodes.values()}

    async def _kill_worker(self, node_id: str, worker_id: str) -> None:
        try:
            await self.endpoint.call(self.nodes[node_id]["address"], "kill_worker", worker_id)
        except PeerDisconnected:
            pass

    def _actor_failed(self, actor: dict, reason: str) -> None:
        bypass = actor.pop("max_restarts_budget_bypass", False)
        budget = actor["max_restarts"]
        if actor["state"] == DEAD:
            return
        if bypass or budget == -1 or actor["restarts"] < budget:
            if not bypass:
                actor["restarts"] += 1
            actor.update(state=RESTARTING, address=None, worker_id=None, node_id=None)
            self._save_actor(actor)
            self.tracer.record("gcs", "actor_restarting", actor=actor["actor_id"], reason=reason)
            self.nursery.start_soon(self._schedule_actor, actor["actor_id"])
        else:
            self._set_dead(actor, f"the actor died because {reason}, and its restart budget "
                                  f"(max_restarts={budget}) is used up")

    def _set_dead(self, actor: dict, reason: str, cause: bytes | None = None) -> None:
        actor.update(state=DEAD, death_cause=(reason, cause), address=None)
        self._save_actor(actor)
        self.tracer.record("gcs", "actor_dead", actor=actor["actor_id"], reason=reason)

    async def _schedule_actor(self, actor_id: str) -> None:
        warned = False
        while True:
            actor = self.actors[actor_id]
            if actor["state"] == DEAD:
                return
            target = scheduling.pick_node(actor["resources"], actor["strategy"], None,
                                          self.policy_view(), self.policy_state,
                                          self.config.local_utilization_threshold)
            if target == scheduling.INFEASIBLE:
                if not warned:
                    warned = True
                    logger.warning("actor %s (%s) cannot be scheduled: no node has %s",
                                   actor["class_name"], actor_id, actor["resources"])
                await trio.sleep(self.config.infeasible_retry_period_s)
                continue
            node = self.nodes[target]
            # Count the placement until heartbeats sent after the lease was
            # granted have arrived, so the next actor is not put in the same room.
            placement = [actor["resources"], float("inf")]
            self.placements.setdefault(target, []).append(placement)
            request = {"resources": actor["resources"], "owner": self.env.address,
                       "strategy": scheduling.Strategy("NODE_AFFINITY", target, False),
                       "for_actor": actor_id, "hops": self.config.spillback_hops_max}
            try:
                grant = await self.endpoint.call(node["address"], "request_lease", request)
            except PeerDisconnected:
                await trio.sleep(self.config.heartbeat_period_s)
                continue
            finally:
                placement[1] = trio.current_time() + 2 * self.config.heartbeat_period_s
                now = trio.current_time()
                self.placements[target] = [p for p in self.placements[target] if p[1] > now]
            if "worker_address" not in grant:
                await trio.sleep(self.config.infeasible_retry_period_s)
                continue
            granting = (node["address"], grant["lease_id"])
            self.granting.add(granting)
            try:
                reply = await self._create_actor(actor_id, target, grant)
            finally:
                self.granting.discard(granting)
            if reply == "retry":
                continue
            if reply == "dead":
                return
            actor = self.actors[actor_id]
            if actor["state"] == DEAD:
                await self._kill_worker(target, grant["worker_id"])
                return
            if reply is not None:  # the constructor raised: the actor is dead for good
                self._set_dead(actor, "its constructor raised an exception", reply)
                await self._kill_worker(target, grant["worker_id"])
                return
            incarnation = actor["incarnation"] + 1
            actor.update(state=ALIVE, address=grant["worker_address"],
                         worker_id=grant["worker_id"], node_id=target, incarnation=incarnation,
                         lease_id=grant["lease_id"])
            self._save_actor(actor)
            self.tracer.record("gcs", "actor_alive", actor=actor_id, node=target,
                               incarnation=incarnation)
            return

    async def _create_actor(self, actor_id: str, target: str, grant: dict):
        """Run the constructor in the leased worker: None when it succeeded,
        the serialized error when it raised, "retry" when the worker was
        lost, "dead" when the actor was killed meanwhile."""
        actor = self.actors[actor_id]
        if actor["state"] == DEAD:
            await self._kill_worker(target, grant["worker_id"])
            return "dead"
        try:
            return await self.endpoint.call(grant["worker_address"], "create_actor",
                                            actor["creation"], grant["gpu_ids"],
                                            actor["incarnation"] + 1)
        except PeerDisconnected:
            # Dead, or only cut off: either way that worker is given up.
            self.tracer.record("gcs", "actor_creation_lost", actor=actor_id)
            await self._kill_worker(target, grant["worker_id"])
            return "retry"
