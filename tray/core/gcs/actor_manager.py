"""The GCS's actor manager: the actor directory and every actor's lifecycle.

Actors are scheduled here (as in Ray's GCS-based actor scheduling): the
actor manager picks a node with the shared policy, leases a dedicated worker
from that node's manager, and sends it the creation task. An actor moves
through

  PENDING_CREATION -> ALIVE -> (RESTARTING -> ALIVE)* -> DEAD

restarting (on any node) when its worker or node dies, within
``max_restarts``; a constructor that raises makes it DEAD at once. Each
creation bumps the actor's *incarnation*; callers long-poll
``wait_actor_ready`` for an incarnation newer than the one they saw die.
Named actors are looked up per namespace; a non-detached actor dies with
its owner.

A non-detached actor also ends when its owner reports that every handle to
it is gone (``actor_out_of_scope``, see ``worker/actor_task_submitter``),
and any actor when it exits by itself (``actor_exiting``: ``exit_actor()``,
``__ray_terminate__``). Both end it *gracefully*: DEAD at once (no restart,
later calls fail with ``ActorDiedError`` naming the reason), then its worker
is asked to finish the calls it is running and exit (``terminate_actor``);
one that has not answered within ``GRACEFUL_EXIT_TIMEOUT_S`` is killed, as
Ray's GCS force-kills after its graceful-shutdown timeout. Named actors are
no exception (Ray's rule); detached actors never end by handles.

A creation under way is *cancelled* when its worker or its node is
reported dead (as Ray's ``GcsActorScheduler::CancelOnWorker`` and
``CancelOnNode``): the actor is created again elsewhere, and a reply from
that worker arriving later is not believed. The actor is not ALIVE until
the reply comes, so the death report finds it only in the creations under
way (``_creating``); a reply that the worker sent just before it crashed,
held up behind a partition, would otherwise mark the actor ALIVE on a dead
worker after the report had been dropped, for good (simtest chaos seed
3939 of ``mixed``).

Records live in ``Storage`` (``ActorRecord``, versioned), so a GCS restarted
on Redis resumes scheduling whatever was pending or restarting."""

from __future__ import annotations

import enum
import logging
import pickle
from dataclasses import dataclass

import trio

from .. import scheduling
from ..messages import (
    ActorCreation,
    ActorDeathCause,
    ActorInfo,
    ActorRecord,
    ActorSpec,
    ActorStatePage,
    ActorStatus,
    LeaseGranted,
    LeaseRequest,
    PlacementGroupStatus,
)
from ..rpc import Endpoint, PeerDisconnected
from ..scheduling import NodeAffinityStrategy, PlacementGroupStrategy, placement_group_id_of
from ..serialization import serialize_error
from .node_table import NodeTable

logger = logging.getLogger("tray.gcs")

T_ACTORS, T_NAMES = "actors", "names"

# State changes kept per actor for the state API (an actor restarting
# without end would otherwise grow its list without end).
STATE_TIMES_MAX = 32

# How long an actor's worker may take to finish its running calls and exit
# after a graceful termination before the GCS kills it.
GRACEFUL_EXIT_TIMEOUT_S = 30.0

OUT_OF_SCOPE = ("all references to the actor were removed: every handle to it went out of "
                "scope and no call to it was pending")
# Ray's ActorUnschedulableError: pinned (soft=False) to a node that died.
PIN_NODE_DEAD = "the actor cannot be scheduled: node {} (hard node affinity) is not alive"


@dataclass(frozen=True)
class ActorManagerStatistics:
    actors: int  # every actor of the cluster's life, dead ones included
    pending: int  # PENDING_CREATION
    alive: int
    restarting: int
    dead: int
    named: int  # names registered (a dead actor's name stays until reused)
    creating: int  # creation tasks sent to leased workers, not answered yet
    granting: int  # leases granted for actors still being created
    nodes_with_placements: int  # nodes with actor placements not yet in heartbeats
    waiters: int  # actors someone long-polls (wait_actor_ready)


class _Creation(enum.Enum):
    """How one attempt to create an actor in a leased worker ended."""
    CREATED = "created"
    CONSTRUCTOR_FAILED = "constructor failed"  # the actor is dead for good
    WORKER_LOST = "worker lost"  # try again with another worker
    KILLED = "killed"  # the actor was killed meanwhile


class _CreationUnderWay:
    """One creation task sent to a leased worker and not yet answered."""

    def __init__(self, actor_id: str, node_id: str) -> None:
        self.actor_id = actor_id
        self.node_id = node_id
        # Cancelled, with ``lost_because`` said, when the worker or its node
        # is reported dead before the reply comes.
        self.cancel_scope = trio.CancelScope()
        self.lost_because: str | None = None


class ActorManager:
    def __init__(self, *, address: str, storage, endpoint: Endpoint, nursery: trio.Nursery,
                 tracer, config, rng, nodes: NodeTable, placement_groups) -> None:
        self._address = address
        self._placement_groups = placement_groups
        self._storage = storage
        self._endpoint = endpoint
        self._nursery = nursery
        self._tracer = tracer
        self._config = config
        self._nodes = nodes
        self.policy_state = scheduling.PolicyState(rng=rng)
        # Every actor of the cluster's life, dead ones included (their death
        # causes answer later calls).
        self.actors: dict[str, ActorRecord] = {}
        self.actor_changed: dict[str, trio.Event] = {}
        self.names: dict[tuple[str, str], str] = {}
        # Actor placements not yet visible in heartbeats: node -> [[resources, until]].
        self.placements: dict[str, list] = {}
        # Leases granted for actors still being created: (node address, lease id).
        self.granting: set[tuple[str, int]] = set()
        # Worker id -> the creation task it runs now. At most one per actor
        # (each actor's ``_schedule`` creates it in one worker at a time), so
        # bounded by the actors table. Volatile: a restarted GCS schedules
        # the creations again and its nodes reclaim the old leases.
        self._creating: dict[str, _CreationUnderWay] = {}
        # When each actor entered its states, for the state API: actor id ->
        # [(state, time on this GCS's clock)], the last STATE_TIMES_MAX only.
        # Volatile (a restarted GCS knows the times from its start on).
        self.state_times: dict[str, list] = {}
        # Indexes, so that a death or a closed connection costs the actors
        # it concerns and not a scan of every actor (killing 5,000 actors
        # one by one was O(actors²): 52% and 21% of the samples in
        # ``owns_any`` and ``handle_worker_died``). Values are dicts used as
        # ordered sets of actor ids; decisions iterate them sorted.
        # Owner address -> its actors, dead ones included (a spec never changes).
        self._by_owner: dict[str, dict[str, None]] = {}
        # Placement group id -> the actors placed in it.
        self._by_group: dict[str, dict[str, None]] = {}
        # Worker id / node id -> the live (ALIVE or PENDING_CREATION) actors
        # there with that worker or node recorded; kept by ``_save``, which
        # every change of state goes through. ``_placed``: actor id -> the
        # (worker id, node id) it is indexed under.
        self._by_worker: dict[str, dict[str, None]] = {}
        self._by_node: dict[str, dict[str, None]] = {}
        self._placed: dict[str, tuple] = {}
        # Set by the GCS: () -> {actor id: why its creation waits} (the
        # nodes' demand reports: a node at its worker cap, demand.py).
        self.pending_reasons = dict
        for key, value in storage.scan(T_ACTORS):
            self.actors[key] = actor = pickle.loads(value)
            self._index(actor)
            self._reindex(actor)
        for key, value in storage.scan(T_NAMES):
            namespace, _, name = key.partition("/")
            self.names[(namespace, name)] = value.decode()

    def statistics(self) -> ActorManagerStatistics:
        """Walks the actors to count their states: O(actors)."""
        states = dict.fromkeys(ActorStatus, 0)
        for actor in self.actors.values():
            states[actor.state] += 1
        return ActorManagerStatistics(
            actors=len(self.actors), pending=states[ActorStatus.PENDING_CREATION],
            alive=states[ActorStatus.ALIVE], restarting=states[ActorStatus.RESTARTING],
            dead=states[ActorStatus.DEAD], named=len(self.names),
            creating=len(self._creating), granting=len(self.granting),
            nodes_with_placements=len(self.placements), waiters=len(self.actor_changed))

    def validate_state(self) -> None:
        """Every actor's record and its entries in the indexes, both ways;
        the creations under way. O(actors)."""
        for actor_id, actor in self.actors.items():
            assert actor.actor_id == actor_id, actor_id
            assert actor.version == ActorRecord.VERSION, (actor_id, actor.version)
            assert actor.state in (ActorStatus.PENDING_CREATION, ActorStatus.ALIVE,
                                   ActorStatus.RESTARTING, ActorStatus.DEAD), actor.state
            if actor.state == ActorStatus.ALIVE:
                assert actor.address is not None, actor_id
                assert actor.worker_id is not None, actor_id
                assert actor.node_id is not None, actor_id
            if actor.state == ActorStatus.DEAD:
                assert actor.death_cause is not None, actor_id
                assert actor.address is None, actor_id
            budget = actor.spec.max_restarts
            assert budget == -1 or actor.restarts <= budget, (actor_id, actor.restarts)
        for (namespace, name), actor_id in self.names.items():
            assert actor_id in self.actors, (namespace, name)
            assert self.actors[actor_id].spec.name == name, (namespace, name)
        # Each index: every actor under its key (walking the actors), and as
        # many entries as that (so none under a wrong key).
        grouped = 0
        for actor_id, actor in self.actors.items():
            assert actor_id in self._by_owner.get(actor.spec.owner_address, ()), actor_id
            group = placement_group_id_of(actor.spec.strategy)
            if group is not None:
                grouped += 1
                assert actor_id in self._by_group.get(group, ()), actor_id
            placed = self._placed.get(actor_id)
            if actor.state in (ActorStatus.ALIVE, ActorStatus.PENDING_CREATION):
                assert placed == (actor.worker_id, actor.node_id), (actor_id, placed)
            else:
                assert placed is None, (actor_id, placed)
        assert sum(map(len, self._by_owner.values())) == len(self.actors), "_by_owner"
        assert sum(map(len, self._by_group.values())) == grouped, "_by_group"
        on_workers = on_nodes = 0
        for actor_id, (worker_id, node_id) in self._placed.items():
            if worker_id is not None:
                on_workers += 1
                assert actor_id in self._by_worker[worker_id], (actor_id, worker_id)
            if node_id is not None:
                on_nodes += 1
                assert actor_id in self._by_node[node_id], (actor_id, node_id)
        assert all(self._by_worker.values()), "an empty entry in _by_worker"
        assert all(self._by_node.values()), "an empty entry in _by_node"
        assert sum(map(len, self._by_worker.values())) == on_workers, "_by_worker"
        assert sum(map(len, self._by_node.values())) == on_nodes, "_by_node"
        for actor_id, times in self.state_times.items():
            assert actor_id in self.actors, actor_id
            assert 0 < len(times) <= STATE_TIMES_MAX, (actor_id, len(times))
        for actor_id, event in self.actor_changed.items():
            assert actor_id in self.actors, actor_id
            # (A change pops the event before it sets it.)
            assert not event.is_set(), actor_id
        creating = [creation.actor_id for creation in self._creating.values()]
        assert len(creating) == len(set(creating)), "an actor created in two workers"
        for worker_id, creation in self._creating.items():
            # Only a creation that is still wanted is under way: not one of
            # an actor that is ALIVE (its reply was believed) ...
            assert self.actors[creation.actor_id].state != ActorStatus.ALIVE, (creation.actor_id,
                                                                   worker_id)
            # ... nor one in a worker that an actor is recorded in.
            assert worker_id not in self._by_worker, worker_id

    def _index(self, actor: ActorRecord) -> None:
        """Index a new actor by what never changes: its owner and group."""
        spec = actor.spec
        self._by_owner.setdefault(spec.owner_address, {})[actor.actor_id] = None
        group = placement_group_id_of(spec.strategy)
        if group is not None:
            self._by_group.setdefault(group, {})[actor.actor_id] = None

    def _reindex(self, actor: ActorRecord) -> None:
        """Index the actor under the worker and node it has now, if live."""
        actor_id = actor.actor_id
        placed = (actor.worker_id, actor.node_id) \
            if actor.state in (ActorStatus.ALIVE, ActorStatus.PENDING_CREATION) else None
        old = self._placed.get(actor_id)
        if old == placed:
            return
        if old is not None:
            for index, key in ((self._by_worker, old[0]), (self._by_node, old[1])):
                if key is not None:
                    index[key].pop(actor_id, None)
                    if not index[key]:
                        del index[key]
            del self._placed[actor_id]
        if placed is not None:
            self._placed[actor_id] = placed
            for index, key in ((self._by_worker, placed[0]), (self._by_node, placed[1])):
                if key is not None:
                    index.setdefault(key, {})[actor_id] = None

    def _indexed(self, index: dict, key) -> list[ActorRecord]:
        """The actors under ``key`` in one of the indexes, by id (the order
        in which they are handled is the same in every run)."""
        return [self.actors[actor_id] for actor_id in sorted(index.get(key, ()))]

    def _save(self, actor: ActorRecord) -> None:
        self._storage.put(T_ACTORS, actor.actor_id, pickle.dumps(actor, protocol=5))
        self._reindex(actor)
        times = self.state_times.setdefault(actor.actor_id, [])
        if not times or times[-1][0] != actor.state:
            times.append((actor.state, trio.current_time()))
            del times[:-STATE_TIMES_MAX]
        event = self.actor_changed.pop(actor.actor_id, None)
        if event is not None:
            event.set()

    def start(self) -> None:
        """After a (re)start: resume scheduling what was pending."""
        for actor in self.actors.values():
            if actor.state in (ActorStatus.PENDING_CREATION, ActorStatus.RESTARTING):
                self._nursery.start_soon(self._schedule, actor.actor_id)

    # ---------------------------------------------------------------- queries

    def handle_create_actor(self, conn, spec: ActorSpec) -> ActorCreation:
        """Register an actor; returns at once, scheduling continues."""
        if spec.actor_id in self.actors:  # a retry after a GCS restart
            return ActorCreation()
        name, namespace = spec.name, spec.namespace or ""
        if name:
            existing = self.names.get((namespace, name))
            if existing is not None and self.actors[existing].state != ActorStatus.DEAD:
                if spec.get_if_exists:
                    return ActorCreation(self.actors[existing].info())
                raise ValueError(f"an actor named {name!r} already exists in namespace "
                                 f"{namespace!r}; pass get_if_exists=True to reuse it")
            self.names[(namespace, name)] = spec.actor_id
            self._storage.put(T_NAMES, f"{namespace}/{name}", spec.actor_id.encode())
        actor = ActorRecord(spec)
        self.actors[spec.actor_id] = actor
        self._index(actor)
        self._save(actor)
        self._tracer.record("gcs", "actor_registered", actor=spec.actor_id)
        self._nursery.start_soon(self._schedule, spec.actor_id)
        return ActorCreation()

    def handle_get_actor(self, conn, actor_id: str) -> ActorInfo | None:
        actor = self.actors.get(actor_id)
        return None if actor is None else actor.info()

    def handle_get_named_actor(self, conn, name: str, namespace: str) -> ActorInfo | None:
        actor_id = self.names.get((namespace, name))
        if actor_id is None or self.actors[actor_id].state == ActorStatus.DEAD:
            return None
        return self.actors[actor_id].info()

    def handle_get_named_actor_handle(self, conn, name: str, namespace: str):
        """(info, owner address, detached) of the live actor called ``name``,
        or None: what ``get_actor`` needs to borrow the actor's handle."""
        info = self.handle_get_named_actor(conn, name, namespace)
        if info is None:
            return None
        spec = self.actors[info.actor_id].spec
        return info, spec.owner_address, spec.detached

    def handle_actor_owner(self, conn, actor_id: str):
        """(owner address, detached) of an actor, or None if unknown."""
        actor = self.actors.get(actor_id)
        return None if actor is None else (actor.spec.owner_address, actor.spec.detached)

    def handle_list_actors(self, conn) -> list[ActorInfo]:
        return [actor.info() for _, actor in sorted(self.actors.items())]

    def handle_list_actor_states(self, conn, actor_id: str | None = None) -> ActorStatePage:
        """Every actor (or one) as the state API shows it (Ray's ActorState
        fields, times on this GCS's clock), with the clock's ``now``."""
        rows = []
        reasons = self.pending_reasons()
        for key, actor in sorted(self.actors.items()):
            if actor_id is not None and key != actor_id:
                continue
            spec = actor.spec
            cause = actor.death_cause
            pending = actor.state in (ActorStatus.PENDING_CREATION, ActorStatus.RESTARTING)
            rows.append({
                "actor_id": key, "class_name": spec.class_name, "state": actor.state.value,
                "job_id": spec.creation.job_id, "name": spec.name or "",
                "node_id": actor.node_id, "worker_id": actor.worker_id,
                "address": actor.address, "ray_namespace": spec.namespace,
                "required_resources": dict(spec.resources),
                "death_cause": None if cause is None else cause.reason,
                "pending_reason": reasons.get(key) if pending else None,
                "is_detached": spec.detached,
                "placement_group_id": placement_group_id_of(spec.strategy),
                "num_restarts": actor.restarts, "max_restarts": spec.max_restarts,
                "owner_address": spec.owner_address,
                "creation_task_id": spec.creation.task_id.hex(),
                "state_times": [(state.value, at)
                                for state, at in self.state_times.get(key, ())]})
        return ActorStatePage(rows, trio.current_time())

    async def handle_wait_actor_ready(self, conn, actor_id: str,
                                      seen_incarnation: int) -> ActorInfo:
        """Reply when the actor is ALIVE in an incarnation newer than
        ``seen_incarnation``, or DEAD."""
        while True:
            actor = self.actors.get(actor_id)
            if actor is None:
                raise ValueError(f"unknown actor {actor_id}")
            if actor.state == ActorStatus.DEAD or (actor.state == ActorStatus.ALIVE and
                                       actor.incarnation > seen_incarnation):
                return actor.info()
            event = self.actor_changed.setdefault(actor_id, trio.Event())
            await event.wait()

    def handle_held_leases(self, conn, node_manager: str, lease_ids: list) -> list:
        """Which of these leases from ``node_manager`` host (or are creating)
        an actor; the node reclaims the others (granted before a GCS
        restart, or to a creation that was given up)."""
        # Only a live actor's lease, on a live node: an actor waiting to
        # restart still records the lease it had, maybe from an earlier node
        # at this address, whose lease ids the new node reuses (simtest chaos
        # seed 5: a lease given up in a GCS restart was then never reclaimed).
        held = {actor.lease_id
                for node_id, node in self._nodes.nodes.items()
                if node.alive and node.address == node_manager
                for actor in self._indexed(self._by_node, node_id)
                if actor.state == ActorStatus.ALIVE}
        return [lease_id for lease_id in lease_ids
                if lease_id in held or (node_manager, lease_id) in self.granting]

    # ----------------------------------------------------------------- deaths

    async def handle_kill_actor(self, conn, actor_id: str, no_restart: bool) -> None:
        actor = self.actors.get(actor_id)
        if actor is None or actor.state == ActorStatus.DEAD:
            return
        self._tracer.record("gcs", "actor_kill", actor=actor_id, no_restart=no_restart)
        node_id, worker_id = actor.node_id, actor.worker_id
        if no_restart:
            self._set_dead(actor, "the actor was killed by tray.kill()")
        else:
            actor.restart_budget_bypass = True
        if worker_id is not None and node_id in self._nodes.nodes:
            await self._kill_worker(node_id, worker_id)

    def handle_actor_out_of_scope(self, conn, actor_id: str) -> None:
        """The owner holds no handle to the actor any more, nor does anyone
        it lent one to, and no call is pending: end it (not a detached one)."""
        actor = self.actors.get(actor_id)
        if actor is None or actor.state == ActorStatus.DEAD or actor.spec.detached:
            return
        self._end_gracefully(actor, OUT_OF_SCOPE)

    def handle_actor_exiting(self, conn, actor_id: str, worker_id: str, reason: str) -> None:
        """The actor's worker is ending it (exit_actor, __ray_terminate__)."""
        actor = self.actors.get(actor_id)
        if actor is None or actor.state == ActorStatus.DEAD or actor.worker_id != worker_id:
            return
        self._end_gracefully(actor, f"the actor exited by itself: {reason}")

    def _end_gracefully(self, actor: ActorRecord, reason: str) -> None:
        """DEAD now, without restart; its worker finishes its running calls
        and exits (a creation under way is abandoned by ``_schedule``)."""
        node_id, worker_id, address = actor.node_id, actor.worker_id, actor.address
        alive = actor.state == ActorStatus.ALIVE
        self._tracer.record("gcs", "actor_terminate", actor=actor.actor_id)
        self._set_dead(actor, reason)
        if alive and worker_id is not None and node_id in self._nodes.nodes:
            self._nursery.start_soon(self._stop_worker, actor.actor_id, node_id, worker_id,
                                     address, reason)

    async def _stop_worker(self, actor_id: str, node_id: str, worker_id: str, address: str,
                           reason: str) -> None:
        with trio.move_on_after(GRACEFUL_EXIT_TIMEOUT_S):
            try:
                if await self._endpoint.call(address, "terminate_actor", actor_id, reason):
                    return  # it exits by itself
            except PeerDisconnected:
                if not await self._endpoint.reachable(address):
                    return  # gone already
            except Exception as error:  # noqa: BLE001 - it could not even try: kill it
                logger.warning("actor %s did not exit gracefully: %s", actor_id, error)
        self._tracer.record("gcs", "actor_exit_forced", actor=actor_id)
        if node_id in self._nodes.nodes:
            await self._kill_worker(node_id, worker_id)

    def handle_worker_died(self, conn, worker_id: str, node_id: str, reason: str,
                           address: str = "") -> None:
        """A node reports a leased or actor worker dead (``address``: where
        it served). What it hosted fails; what it owned goes with it, as
        Ray's GCS destroys the actors of a dead owner (``OnWorkerDead``):
        the GCS hears of an owner's end from its own connection to it too,
        but there is none when the owner died while the GCS restarted, or
        before it called the restarted GCS (lifetimes default seed 14: an
        actor made inside a task lived on after the task's worker died)."""
        if address:
            if self.owns_any(address):
                self.handle_owner_died(None, address)
            self._placement_groups.owner_died(address)
        creation = self._creating.get(worker_id)
        if creation is not None:
            self._creation_lost(worker_id, creation, f"its worker died ({reason})")
        for actor in self._indexed(self._by_worker, worker_id):
            if actor.worker_id == worker_id and \
                    actor.state in (ActorStatus.ALIVE, ActorStatus.PENDING_CREATION):
                self._actor_failed(actor, f"its worker died ({reason})")

    def node_died(self, node_id: str, reason: str) -> None:
        for worker_id, creation in sorted(self._creating.items()):
            if creation.node_id == node_id:
                self._creation_lost(worker_id, creation, f"its node {node_id} died ({reason})")
        for actor in self._indexed(self._by_node, node_id):
            if actor.node_id == node_id and \
                    actor.state in (ActorStatus.ALIVE, ActorStatus.PENDING_CREATION):
                self._actor_failed(actor, f"its node {node_id} died ({reason})")
        # Owners on the dead node died with it, as Ray's OnNodeDead ends the
        # actors its workers owned: an owner killed while the GCS restarted
        # left its actor ALIVE for good (mixed default seed 410).
        owners = sorted({actor.spec.owner_address for actor in self.actors.values()
                         if actor.spec.owner_node_id == node_id})
        for owner in owners:
            self.handle_owner_died(None, owner)

    def _creation_lost(self, worker_id: str, creation: _CreationUnderWay, reason: str) -> None:
        """The worker creating an actor died, or its node did: stop waiting
        for its reply (``_create`` gives the worker up and ``_schedule``
        creates the actor again), as Ray's GCS drops the worker from its
        creating map and ignores the late reply."""
        if creation.lost_because is None:
            creation.lost_because = reason
            self._tracer.record("gcs", "actor_creation_cancelled", actor=creation.actor_id,
                                worker=worker_id, reason=reason)
        creation.cancel_scope.cancel()

    def placement_group_removed(self, pg_id: str) -> None:
        """The actors placed in a removed group die (their workers go with
        the group's bundles)."""
        for actor in self._indexed(self._by_group, pg_id):
            if placement_group_id_of(actor.spec.strategy) == pg_id and \
                    actor.state != ActorStatus.DEAD:
                self._set_dead(actor, f"its placement group {pg_id} was removed",
                               group_removed=True)
                if actor.worker_id and actor.node_id in self._nodes.nodes:
                    self._nursery.start_soon(self._kill_worker, actor.node_id, actor.worker_id)

    def owns_any(self, owner_address: str) -> bool:
        return owner_address in self._by_owner

    def handle_owner_died(self, conn, owner_address: str) -> None:
        for actor in self._indexed(self._by_owner, owner_address):
            if actor.spec.owner_address == owner_address and not actor.spec.detached \
                    and actor.state != ActorStatus.DEAD:
                self._set_dead(actor, "its owner exited")
                if actor.worker_id and actor.node_id in self._nodes.nodes:
                    self._nursery.start_soon(self._kill_worker, actor.node_id, actor.worker_id)

    async def _kill_worker(self, node_id: str, worker_id: str) -> None:
        try:
            await self._endpoint.call(self._nodes.nodes[node_id].address, "kill_worker",
                                      worker_id)
        except Exception as error:  # noqa: BLE001 - gone already, or the node failed
            if not isinstance(error, PeerDisconnected):
                logger.warning("node %s failed to kill worker %s: %s", node_id, worker_id,
                               error)

    def _actor_failed(self, actor: ActorRecord, reason: str) -> None:
        bypass, actor.restart_budget_bypass = actor.restart_budget_bypass, False
        budget = actor.spec.max_restarts
        if actor.state == ActorStatus.DEAD:
            return
        if bypass or budget == -1 or actor.restarts < budget:
            if not bypass:
                actor.restarts += 1
            actor.state, actor.address, actor.worker_id, actor.node_id = \
                ActorStatus.RESTARTING, None, None, None
            self._save(actor)
            self._tracer.record("gcs", "actor_restarting", actor=actor.actor_id, reason=reason)
            self._nursery.start_soon(self._schedule, actor.actor_id)
        else:
            self._set_dead(actor, f"the actor died because {reason}, and its restart budget "
                                  f"(max_restarts={budget}) is used up")

    def _set_dead(self, actor: ActorRecord, reason: str, cause=None,
                  group_removed: bool = False) -> None:
        actor.state = ActorStatus.DEAD
        actor.death_cause = ActorDeathCause(reason, cause, group_removed)
        actor.address = None
        self._save(actor)
        self._tracer.record("gcs", "actor_dead", actor=actor.actor_id, reason=reason)

    # ------------------------------------------------------------- scheduling

    def policy_view(self) -> dict[str, scheduling.NodeView]:
        """The nodes as the actor scheduler sees them: what each reported
        free at its last heartbeat, less the actors placed there since
        (a heartbeat sent before a placement must not undo it)."""
        now = trio.current_time()
        for node_id in sorted(self.placements):
            kept = [p for p in self.placements[node_id] if p[1] > now]
            if kept:
                self.placements[node_id] = kept
            else:
                del self.placements[node_id]
        view = {}
        for node_id, node in self._nodes.view().items():
            available = dict(node.available)
            for resources, _until in self.placements.get(node_id, []):
                for name, amount in resources.items():
                    available[name] = available.get(name, 0.0) - amount
            view[node_id] = scheduling.NodeView(node_id, node.address, node.total, available,
                                                node.alive)
        return view

    async def _schedule(self, actor_id: str) -> None:
        warned = False
        while True:
            actor = self.actors[actor_id]
            if actor.state == ActorStatus.DEAD:
                return
            spec = actor.spec
            if isinstance(spec.strategy, PlacementGroupStrategy):
                target = await self._bundle_node(actor)
                if target is None:
                    return  # dead: its group is gone
                strategy = spec.strategy
            else:
                pinned = spec.strategy
                if isinstance(pinned, NodeAffinityStrategy) and not pinned.soft and \
                        pinned.node_id in self._nodes.nodes and \
                        not self._nodes.nodes[pinned.node_id].alive:
                    # Ray's ActorUnschedulableError: its node is gone for
                    # good (serve chaos seed 469: a proxy waited for good).
                    self._set_dead(actor, PIN_NODE_DEAD.format(pinned.node_id))
                    return
                target = scheduling.pick_node(spec.resources, spec.strategy, None,
                                              self.policy_view(), self.policy_state,
                                              self._config.local_utilization_threshold)
                strategy = NodeAffinityStrategy(target, False)
            if target == scheduling.INFEASIBLE:
                if not warned:
                    warned = True
                    logger.warning("actor %s (%s) cannot be scheduled: no node has %s",
                                   spec.class_name, actor_id, spec.resources)
                await trio.sleep(self._config.infeasible_retry_period_s)
                continue
            node = self._nodes.nodes[target]
            # Count the placement until heartbeats sent after the lease was
            # granted have arrived, so the next actor is not put in the same room.
            placement = [spec.resources, float("inf")]
            if not isinstance(spec.strategy, PlacementGroupStrategy):  # (a bundle holds those)
                self.placements.setdefault(target, []).append(placement)
            request = LeaseRequest(resources=spec.resources, owner=self._address,
                                   strategy=strategy, for_actor=actor_id,
                                   hops=self._config.spillback_hops_max,
                                   runtime_env_hash=spec.creation.runtime_env_hash,
                                   depth=spec.creation.depth)
            try:
                grant = await self._endpoint.call(node.address, "request_lease", request)
            except PeerDisconnected:
                await trio.sleep(self._config.heartbeat_period_s)
                continue
            except Exception as error:  # noqa: BLE001 - the node failed the request
                # The actor stays pending and is tried again: a node's error
                # about one lease must not end the GCS.
                logger.warning("actor %s (%s): node %s failed a lease request: %s",
                               spec.class_name, actor_id, target, error)
                self._tracer.record("gcs", "actor_lease_failed", actor=actor_id,
                                    error=type(error).__name__)
                await trio.sleep(self._config.infeasible_retry_period_s)
                continue
            finally:
                placement[1] = trio.current_time() + 2 * self._config.heartbeat_period_s
            if not isinstance(grant, LeaseGranted):
                await trio.sleep(self._config.infeasible_retry_period_s)
                continue
            # The node that granted it: a newer node than ``target`` when one
            # registered at its address meanwhile (simtest chaos seed 6829: an
            # actor was recorded alive on the dead node it was meant for, so
            # its real node's death never restarted it).
            target = grant.node_id
            granting = (node.address, grant.lease_id)
            self.granting.add(granting)
            try:
                outcome, error = await self._create(actor_id, target, grant)
            finally:
                self.granting.discard(granting)
            if outcome is _Creation.WORKER_LOST:
                continue
            if outcome is _Creation.KILLED:
                return
            actor = self.actors[actor_id]
            if actor.state == ActorStatus.DEAD:
                await self._kill_worker(target, grant.worker_id)
                return
            if outcome is _Creation.CONSTRUCTOR_FAILED:  # the actor is dead for good
                self._set_dead(actor, "its constructor raised an exception", error)
                await self._kill_worker(target, grant.worker_id)
                return
            granted_by = self._nodes.nodes.get(target)
            if granted_by is None or not granted_by.alive:
                # Its node was declared dead before the creation began (its
                # death then cancelled nothing): create the actor again.
                self._tracer.record("gcs", "actor_creation_lost", actor=actor_id)
                self._nursery.start_soon(self._kill_worker, target, grant.worker_id)
                continue
            incarnation = actor.incarnation + 1
            actor.state, actor.address, actor.worker_id = ActorStatus.ALIVE, grant.worker_address, \
                grant.worker_id
            actor.node_id, actor.incarnation, actor.lease_id = target, incarnation, \
                grant.lease_id
            self._save(actor)
            self._tracer.record("gcs", "actor_alive", actor=actor_id, node=target,
                                incarnation=incarnation)
            return

    async def _bundle_node(self, actor: ActorRecord) -> str | None:
        """The node of the bundle an actor in a placement group goes to
        (once the group is placed); None, with the actor dead, when the
        group is gone; INFEASIBLE when no bundle of it could hold the actor."""
        spec = actor.spec
        strategy: PlacementGroupStrategy = spec.strategy
        pg_id = strategy.placement_group_id
        info = await self._placement_groups.wait_ready(pg_id)
        if info is None or info.state == PlacementGroupStatus.REMOVED:
            self._set_dead(actor, f"its placement group {pg_id} does not exist or was removed",
                           group_removed=True)
            return None
        index = strategy.bundle_index
        candidates = [index] if index >= 0 else sorted(info.bundle_nodes)
        for candidate in candidates:
            if candidate in info.bundle_nodes and \
                    scheduling.fits(spec.resources, info.bundles[candidate]):
                return info.bundle_nodes[candidate]
        return scheduling.INFEASIBLE

    async def _create(self, actor_id: str, target: str, grant: LeaseGranted):
        """Run the constructor in the leased worker: (outcome, the serialized
        constructor error when it raised)."""
        actor = self.actors[actor_id]
        if actor.state == ActorStatus.DEAD:
            await self._kill_worker(target, grant.worker_id)
            return _Creation.KILLED, None
        assert grant.worker_id not in self._creating, grant.worker_id
        creation = self._creating[grant.worker_id] = _CreationUnderWay(actor_id, target)
        error = None
        try:
            with creation.cancel_scope:
                error = await self._endpoint.call(grant.worker_address, "create_actor",
                                                  actor.spec, grant.gpu_ids,
                                                  actor.incarnation + 1)
        except PeerDisconnected:
            # Dead, or only cut off: either way that worker is given up.
            self._tracer.record("gcs", "actor_creation_lost", actor=actor_id)
            await self._kill_worker(target, grant.worker_id)
            return _Creation.WORKER_LOST, None
        except Exception as failure:  # noqa: BLE001 - the worker could not even try
            # (its class could not be loaded, say): the actor is dead with that error.
            if creation.lost_because is None:
                return _Creation.CONSTRUCTOR_FAILED, serialize_error(failure)
        finally:
            del self._creating[grant.worker_id]
        if creation.lost_because is not None:
            # Reported dead while it ran the constructor (``_creation_lost``):
            # whatever it answered, or would have, it is not where the actor
            # lives. Killed in case it is only cut off behind a partition
            # (its node then no longer leases it to us), without holding up
            # the new creation.
            self._tracer.record("gcs", "actor_creation_lost", actor=actor_id)
            self._nursery.start_soon(self._kill_worker, target, grant.worker_id)
            return _Creation.WORKER_LOST, None
        if error is not None:
            return _Creation.CONSTRUCTOR_FAILED, error
        return _Creation.CREATED, None
