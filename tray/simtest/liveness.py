"""Liveness and efficiency invariants, checked in virtual time while a seed
runs (not only at its end): what must happen *within a bound*, not merely
eventually.

* ``work-conserving-leases``: no lease request waits at a node's lease
  manager while the resources it needs sit idle: in the pool it would be
  granted from on its own node (its bundle's, for a placement group) for
  longer than ``LOCAL_GRANT_S`` (the node grants in the step that frees
  them), or on another live node that the node would spill it to (a
  request not pinned to its node: not a placement group's, not a node
  affinity's) for longer than ``spill_bound_s`` (a resource report, a
  view update and a re-spill: a few heartbeat periods); and no granted
  lease holds its resources without a worker for longer than
  ``worker_bound_s``;
* ``fitting-placement-group-placed``: a pending (or rescheduling) placement
  group whose bundles *clearly fit* the free resources of the live nodes
  under its strategy (PACK, SPREAD, STRICT_PACK, STRICT_SPREAD; see
  ``_group_fits``) is placed within ``group_bound_s`` (its retry period, a
  report and a view update); an infeasible one is never judged;
* ``placement-group-bundles-held-where-placed``: a created group's bundles
  are held, committed, by the nodes the GCS placed them on, and a removed
  group's are given back, within ``bundles_bound_s``;
* ``fitting-actor-created``: a pending (or restarting) actor with no lease
  granted or asked for, whose resources fit the free ones of a live node it
  may go to (its bundle's pool, its hard affinity's node), is being created
  within ``actor_create_bound_s``;
* ``unreferenced-actor-ends``: a non-detached actor that no live process
  holds a handle to any more (no local, submitted or contained count of its
  handle reference in any core worker: the ground truth, not the owner's
  bookkeeping), or whose owner died, is DEAD by the GCS within
  ``actor_end_bound_s``; an actor a workload declares unreferenced
  (``expect_end``) too; and a DEAD actor's lease is returned and its worker
  gone within ``release_bound_s``;
* ``actor-outlives-its-handles``: an actor the GCS ended as out of scope had
  no handle left anywhere when it did.

The bounds come from the cluster's config (heartbeat period, retry
period). Views are legitimately stale while the cluster is disturbed, so a
bound's clock starts only ``settle_s`` after the last disturbance: a fault
recorded in the trace (crash, restart, partition, stall, reset, slow node,
heal), a partition, stall or slowdown in force, the GCS down, a machine
without a live node, or the GCS's idea of which nodes live differing from
the truth (a death it has not noticed yet).

The monitor reads the components' state (public attributes, the lease
manager's lease counter) and never changes it: it runs from the
simulator's per-step ``validate_components`` hook, at most once every
``SAMPLE_S`` of virtual time, so it costs little and leaves every seed's
digest as it was. The first violation is raised there (and kept:
``failure``), which ends the run at the step that showed it."""

from __future__ import annotations

import itertools

from ..core import scheduling
from ..core.gcs.actor_manager import GRACEFUL_EXIT_TIMEOUT_S, OUT_OF_SCOPE
from ..core.messages import ActorStatus, PlacementGroupStatus
from ..core.scheduling import NodeAffinityStrategy, PlacementGroupStrategy
from ..core.worker.reference_counter import actor_handle_id
from .checks_actors import FencingWatch
from .invariants import InvariantViolation

SAMPLE_S = 0.01  # virtual seconds between two looks at the cluster
# A node grants a request in the very step that frees what it needs; this
# is a few samples.
LOCAL_GRANT_S = 0.1
# Trace events that mark a disturbance (faults, whoever caused them).
_FAULT_COMPONENTS = frozenset({"fault", "node_fenced"})
_FAULT_EVENTS = frozenset({"fault", "faults_stopped", "node_fenced", "node_dead"})
_PENDING_GROUP = (PlacementGroupStatus.PENDING, PlacementGroupStatus.RESCHEDULING)


class LivenessMonitor:
    def __init__(self, cluster, sample_s: float = SAMPLE_S) -> None:
        self.cluster = cluster
        config = cluster.config
        heartbeat_s = config.heartbeat_period_s
        # A node's free resources reach another node's view in two heartbeat
        # periods (its report, the other's reply; one more if a delta was
        # dropped), and a request queued a period is re-spilled at the next.
        self.spill_bound_s = 4 * heartbeat_s + 0.5
        # The GCS's view (a report) and its retry period.
        self.group_bound_s = config.infeasible_retry_period_s + 3 * heartbeat_s + 0.5
        # The owner's message to the GCS (retried every heartbeat period),
        # the worker asked to exit, the node releasing its lease.
        self.actor_end_bound_s = 4 * heartbeat_s + 0.5
        # A pending actor: the GCS's view (a report), a spill from a node
        # that filled up (as a request's), and the GCS's retry period.
        self.actor_create_bound_s = self.spill_bound_s + config.infeasible_retry_period_s + \
            2 * heartbeat_s
        # A granted lease waits for its worker: idle ones are handed out at
        # once, new ones start one at a time (a few ms each in the simulator).
        self.worker_bound_s = 2 * heartbeat_s
        self.release_bound_s = GRACEFUL_EXIT_TIMEOUT_S + 4 * heartbeat_s
        # One ended as out of scope has no call left to finish: it goes at once.
        self.scoped_release_bound_s = self.actor_end_bound_s + 2 * heartbeat_s
        # A group's bundles: cancelled by the GCS at once, or reclaimed by
        # the node's reconciliation every heartbeat.
        self.bundles_bound_s = 4 * heartbeat_s + 0.5
        self.settle_s = 4 * heartbeat_s
        self.local_grant_s = LOCAL_GRANT_S
        self.sample_s = sample_s
        self.failure: InvariantViolation | None = None
        self.samples = 0
        # The longest wait each check saw, as a fraction of its bound (how
        # much margin the bounds leave; a violation is above 1).
        self.worst: dict[str, float] = {}
        self._next_sample_s = 0.0
        self._events_seen = 0
        self._disturbed_s = -1e9  # the last sample that saw a disturbance
        self._local: dict = {}  # id(waiter) -> (waiter, fitting since)
        self._spill: dict = {}  # (id(waiter), node id) -> (waiter, fitting since)
        self._lease_seq: dict = {}  # node id -> its lease counter at the last sample
        self._churned: set = set()  # nodes that allocated since the last sample
        self._groups: dict = {}  # pg id -> fitting since
        self._workerless: dict = {}  # (node id, lease id) -> granted without a worker since
        self._stray_bundles: dict = {}  # (node id, pg id) -> held for a removed group since
        self._missing_bundles: dict = {}  # (pg id, index) -> CREATED, not held, since
        self._creatable: dict = {}  # actor id -> fitting (and not being created) since
        self._unreferenced: dict = {}  # actor id -> (since, why)
        self._expected_end: dict = {}  # actor id -> (since, label)
        self._dead: dict = {}  # actor id -> DEAD since (its release pending)
        self._last_holders: dict = {}  # actor id -> who held a handle at the last look
        self._settled: set = set()  # DEAD actors whose end was checked
        self._original = None
        self.fencing = FencingWatch(cluster)  # dead-node-fenced (checks_actors)

    # ------------------------------------------------------------ plumbing

    def install(self) -> None:
        """Sample after the simulator's per-step checks (needs
        ``validate_every_steps``; without them nothing is sampled)."""
        cluster = self.cluster
        original = cluster.validate_components
        self._original = original

        def validate_components(changed_only: bool = False) -> None:
            original(changed_only)
            now = cluster.clock._now_s
            if now >= self._next_sample_s and self.failure is None:
                self.sample(now)

        cluster.validate_components = validate_components

    def uninstall(self) -> None:
        if self._original is not None:
            self.cluster.__dict__.pop("validate_components", None)
            self._original = None

    def expect_end(self, actor_id: str, label: str) -> None:
        """The workload holds no handle to this actor any more, and nothing
        it gave one to does: it must end (``unreferenced-actor-ends``)."""
        now = self.cluster.clock.current_time()
        self._expected_end.setdefault(actor_id, (now, label))

    def sample(self, now: float) -> None:
        self._next_sample_s = now + self.sample_s
        self.samples += 1
        cluster = self.cluster
        nodes = self._live_nodes()
        gcs_process = cluster.processes.get(cluster.gcs_address)
        gcs = gcs_process.component if gcs_process is not None and gcs_process.alive else None
        if self._disturbed(now, nodes, gcs):
            self._disturbed_s = now
        quiet_from = self._disturbed_s + self.settle_s
        self._note_churn(nodes)
        try:
            self.fencing.sample(now, gcs)
            self._check_leases(now, nodes, quiet_from,
                               gcs.actor_manager.actors if gcs is not None else None)
            if gcs is not None:
                self._check_groups(now, nodes, gcs, quiet_from)
                self._check_actors(now, nodes, gcs, quiet_from)
        except InvariantViolation as violation:
            self.failure = violation
            raise

    # ------------------------------------------------------------ the truth

    def _live_nodes(self) -> list:
        """(node id, lease manager) of every live node manager, by machine."""
        found = []
        for address, process in sorted(self.cluster.processes.items()):
            if not address.endswith("/raylet") or not process.alive:
                continue
            manager = getattr(process.component, "leases", None)
            if manager is not None and hasattr(manager, "waiting"):
                found.append((process.component.node_id, manager))
        return found

    def _core_workers(self) -> list:
        """(address, reference table) of every live core worker."""
        found = []
        for address, process in sorted(self.cluster.processes.items()):
            references = getattr(process.component, "references", None)
            if process.alive and references is not None and hasattr(references, "refs"):
                found.append((address, references.refs))
        return found

    def _disturbed(self, now: float, nodes: list, gcs) -> bool:
        cluster = self.cluster
        disturbed = False
        trace = cluster.trace
        new = trace.event_count - self._events_seen
        self._events_seen = trace.event_count
        if new > 0:
            for event in itertools.islice(reversed(trace.events), min(new, len(trace.events))):
                if event["component"] in _FAULT_COMPONENTS or event["event"] in _FAULT_EVENTS:
                    disturbed = True
                    break
        network = cluster.network
        if network.blocked or network.slow or \
                any(until > now for until in network.stalled_until.values()) or \
                any(until > now for until in getattr(network, "lagging", {}).values()):
            disturbed = True
        if gcs is None or getattr(cluster, "_gcs_down", False):
            return True
        machines = len(cluster.node_ids())
        if len(nodes) < machines:
            return True  # a node is down (its restart pending)
        actual = {node_id for node_id, _ in nodes}
        known = {node_id for node_id, record in gcs.node_table.nodes.items() if record.alive}
        return disturbed or actual != known

    def _note_churn(self, nodes: list) -> None:
        """Which nodes allocated resources since the last sample: their free
        resources were not free all along, whatever two samples show."""
        churned = set()
        seqs = {}
        for node_id, manager in nodes:
            seq = (getattr(manager, "_next_lease_id", 0), len(manager.bundles))
            seqs[node_id] = seq
            if self._lease_seq.get(node_id) != seq:
                churned.add(node_id)
        self._lease_seq = seqs
        self._churned = churned

    # ---------------------------------------------------------------- leases

    @staticmethod
    def _fits_pool(manager, request) -> bool:
        """Whether the request could be granted from its pool on this node now."""
        resources = request.resources
        gpus = resources.get("GPU", 0.0)
        strategy = request.strategy
        if isinstance(strategy, PlacementGroupStrategy):
            for (pg_id, index), bundle in sorted(manager.bundles.items()):
                if pg_id != strategy.placement_group_id or \
                        (strategy.bundle_index >= 0 and index != strategy.bundle_index):
                    continue
                if bundle.committed and scheduling.fits(resources, bundle.available) and \
                        bundle.gpus.can_allocate(gpus):
                    return True
            return False
        return scheduling.fits(resources, manager.available) and manager.gpus.can_allocate(gpus)

    @staticmethod
    def _pinned(request, gcs_actors) -> bool:
        """Whether a queued request must stay on its node: a placement
        group's (its bundle is there), a task's with node affinity; an
        actor's only if its own strategy pins it (the GCS asks with an
        affinity to the node it picked, and picks again after a spill)."""
        strategy = request.strategy
        if request.for_actor is not None and isinstance(strategy, NodeAffinityStrategy):
            record = gcs_actors.get(request.for_actor) if gcs_actors is not None else None
            if record is None:
                return True
            strategy = record.spec.strategy
        return isinstance(strategy, (PlacementGroupStrategy, NodeAffinityStrategy))

    def _check_leases(self, now: float, nodes: list, quiet_from: float,
                      gcs_actors) -> None:
        local, spill, workerless = {}, {}, {}
        for node_id, manager in nodes:
            for lease_id, lease in manager.leases.items():
                if lease.worker_id:
                    continue
                since = self._workerless.get((node_id, lease_id), now)
                workerless[(node_id, lease_id)] = since
                waited = self._overdue("worker", now, since, quiet_from, self.worker_bound_s)
                if waited is not None:
                    pool = getattr(manager, "_pool", None)
                    idle = len(pool.idle) if pool is not None else "?"
                    raise InvariantViolation(
                        "work-conserving-leases",
                        f"lease {lease_id} at node {node_id[:8]} ({lease.owner}, "
                        f"{dict(sorted(lease.resources.items()))}"
                        + (f", for actor {lease.for_actor[:8]}" if lease.for_actor else "")
                        + f") has held its resources without a worker for {waited:.3f} "
                        f"s of virtual time with no fault ({idle} idle worker(s) on the node; "
                        f"the bound, a worker's start, is {self.worker_bound_s} s)")
            for waiter in manager.waiting:
                request = waiter.request
                if self._fits_pool(manager, request):
                    previous = self._local.get(id(waiter))
                    since = previous[1] if previous is not None and previous[0] is waiter \
                        else now
                    local[id(waiter)] = (waiter, since)
                    self._note("local", now - since, self.local_grant_s)
                    if now - since > self.local_grant_s:
                        raise InvariantViolation("work-conserving-leases", self._waiter_story(
                            node_id, manager, waiter,
                            f"fits this node's free resources ({_pool_text(manager, request)}) "
                            f"and has not been granted for {now - since:.3f} s of virtual "
                            f"time (a node grants in the step that frees what a request "
                            f"needs; the bound is {self.local_grant_s} s)"))
                    continue
                if self._pinned(request, gcs_actors):
                    continue  # pinned to this node
                for other_id, other in nodes:
                    if other_id == node_id or other.draining or \
                            not scheduling.fits(request.resources, other.available) or \
                            not other.gpus.can_allocate(request.resources.get("GPU", 0.0)):
                        continue
                    key = (id(waiter), other_id)
                    previous = self._spill.get(key)
                    since = previous[1] if previous is not None and previous[0] is waiter and \
                        other_id not in self._churned else now
                    spill[key] = (waiter, since)
                    waited = self._overdue("spill", now, since, quiet_from, self.spill_bound_s)
                    if waited is not None:
                        raise InvariantViolation("work-conserving-leases", self._waiter_story(
                            node_id, manager, waiter,
                            f"does not fit here, and live node {other_id[:8]} has had the "
                            f"free resources it needs ({dict(sorted(other.available.items()))}) "
                            f"for {waited:.3f} s of virtual time with no allocation "
                            f"there and no fault (the bound, a few resource reports and "
                            f"a re-spill, is {self.spill_bound_s} s)"))
        self._local, self._spill, self._workerless = local, spill, workerless

    def _waiter_story(self, node_id: str, manager, waiter, what: str) -> str:
        request = waiter.request
        queue = [f"{dict(sorted(w.request.resources.items()))} for {w.request.owner}"
                 for w in manager.waiting[:8]]
        return (f"a lease request queued at node {node_id[:8]} since t={waiter.since:.6f}s "
                f"(owner {request.owner}, {dict(sorted(request.resources.items()))}, "
                f"{type(request.strategy).__name__}"
                + (f", for actor {request.for_actor[:8]}" if request.for_actor else "")
                + f") {what}\n  the node: total {dict(sorted(manager.total.items()))}, "
                f"available {dict(sorted(manager.available.items()))}, "
                f"{len(manager.leases)} lease(s); its queue: {queue}")

    # ------------------------------------------------------ placement groups

    def _check_groups(self, now: float, nodes: list, gcs, quiet_from: float) -> None:
        groups = gcs.placement_groups.groups
        self._check_bundles(now, nodes, groups, quiet_from)
        tracked = {}
        for pg_id, group in groups.items():
            if group.state not in _PENDING_GROUP:
                continue
            used = self._group_fits(group, nodes)
            if used is None:
                continue
            since = self._groups.get(pg_id, now)
            if used & self._churned:
                since = now
            tracked[pg_id] = since
            waited = self._overdue("group", now, since, quiet_from, self.group_bound_s)
            if waited is not None:
                spec = group.spec
                free = {node_id[:8]: dict(sorted(manager.available.items()))
                        for node_id, manager in nodes if not manager.draining}
                raise InvariantViolation(
                    "fitting-placement-group-placed",
                    f"placement group {pg_id} ({spec.strategy}, bundles {spec.bundles}, "
                    f"{group.state.value}, placed {group.bundle_nodes}) fits the free "
                    f"resources of the live nodes and has not been placed for "
                    f"{waited:.3f} s of virtual time with no allocation on those "
                    f"nodes and no fault (the bound, its retry period and a resource "
                    f"report, is {self.group_bound_s} s); free: {free}")
        self._groups = tracked

    def _check_bundles(self, now: float, nodes: list, groups: dict, quiet_from: float) -> None:
        """A removed group's bundles are given back, and a created group's
        are held (committed) by the nodes the GCS placed them on."""
        stray, missing = {}, {}
        nodes_by_id = dict(nodes)
        for node_id, manager in nodes:
            for pg_id in sorted({key[0] for key in manager.bundles}):
                group = groups.get(pg_id)
                if group is not None and group.state != PlacementGroupStatus.REMOVED:
                    continue
                since = stray[(node_id, pg_id)] = self._stray_bundles.get((node_id, pg_id), now)
                waited = self._overdue("bundles released", now, since, quiet_from, self.bundles_bound_s)
                if waited is not None:
                    raise InvariantViolation(
                        "placement-group-bundles-held-where-placed",
                        f"node {node_id[:8]} has held bundles "
                        f"{sorted(index for key, index in manager.bundles if key == pg_id)} of "
                        f"placement group {pg_id}, which the GCS "
                        f"{'does not know' if group is None else 'removed'}, for "
                        f"{waited:.3f} s of virtual time with no fault (the bound is "
                        f"{self.bundles_bound_s} s)")
        for pg_id, group in groups.items():
            if group.state != PlacementGroupStatus.CREATED:
                continue
            for index, node_id in group.bundle_nodes.items():
                manager = nodes_by_id.get(node_id)
                if manager is None:
                    continue  # a death the GCS has not heard of yet (a disturbance)
                bundle = manager.bundles.get((pg_id, index))
                if bundle is not None and bundle.committed:
                    continue
                since = missing[(pg_id, index)] = self._missing_bundles.get((pg_id, index), now)
                waited = self._overdue("bundles held", now, since, quiet_from, self.bundles_bound_s)
                if waited is not None:
                    raise InvariantViolation(
                        "placement-group-bundles-held-where-placed",
                        f"placement group {pg_id} is CREATED with bundle {index} on node "
                        f"{node_id[:8]}, which has "
                        f"{'not committed it' if bundle is not None else 'no such bundle'} "
                        f"for {waited:.3f} s of virtual time with no fault (the bound "
                        f"is {self.bundles_bound_s} s)")
        self._stray_bundles, self._missing_bundles = stray, missing

    @staticmethod
    def _group_fits(group, nodes: list) -> set | None:
        """The nodes a placement group would clearly fit on now, or None.

        Conservative, and independent of the GCS's placement code: the
        missing bundles fit when (STRICT_PACK) their sum fits one node (the
        node of the bundles placed, if any); (STRICT_SPREAD) each fits on at
        least as many nodes outside those of the placed bundles as there
        are missing bundles; (PACK, SPREAD) their sum fits one node, or each
        fits on at least as many nodes as there are missing ones. Each of
        these lets any placement that goes bundle by bundle succeed,
        whatever it picks first."""
        spec = group.spec
        fixed = dict(group.bundle_nodes)
        missing = [spec.bundles[index] for index in range(len(spec.bundles))
                   if index not in fixed]
        if not missing:
            return None
        free = {node_id: manager for node_id, manager in nodes if not manager.draining}
        if any(node_id not in free for node_id in fixed.values()):
            return None
        total: dict = {}
        for bundle in missing:
            for name, amount in bundle.items():
                total[name] = total.get(name, 0.0) + amount

        def fits(request: dict, manager) -> bool:
            return scheduling.fits(request, manager.available) and \
                manager.gpus.can_allocate(request.get("GPU", 0.0))

        homes = set(fixed.values())
        if spec.strategy == "STRICT_PACK":
            candidates = sorted(homes) if homes else sorted(free)
            whole = [node_id for node_id in candidates if fits(total, free[node_id])]
            return set(whole[:1]) or None
        if spec.strategy == "STRICT_SPREAD":
            candidates = [node_id for node_id in sorted(free) if node_id not in homes]
        else:
            whole = [node_id for node_id in sorted(free) if fits(total, free[node_id])]
            if whole:
                return set(whole)
            candidates = sorted(free)
        used = set()
        for bundle in missing:
            fitting = [node_id for node_id in candidates if fits(bundle, free[node_id])]
            if len(fitting) < len(missing):
                return None
            used.update(fitting)
        return used

    # ---------------------------------------------------------------- actors

    def _check_actors(self, now: float, nodes: list, gcs, quiet_from: float) -> None:
        processes = self.cluster.processes
        workers = None
        unreferenced, creatable, last_holders = {}, {}, {}
        nodes_by_id = dict(nodes)
        leased = {lease.for_actor for _, manager in nodes for lease in manager.leases.values()
                  if lease.for_actor is not None}
        leased.update(request.for_actor for _, manager in nodes for request in
                      (waiter.request for waiter in manager.waiting)
                      if request.for_actor is not None)
        for actor_id, record in gcs.actor_manager.actors.items():
            if actor_id in self._settled:
                continue
            if record.state == ActorStatus.DEAD:
                self._check_dead(now, nodes, actor_id, record, quiet_from)
                continue
            expected = self._expected_end.get(actor_id)
            if record.spec.detached and expected is None:
                continue
            owner = processes.get(record.spec.owner_address)
            why = ""
            holders = frozenset()
            if not record.spec.detached:
                if workers is None:
                    workers = self._core_workers()
                holders = _holders_of(workers, actor_handle_id(actor_id))
                if holders:
                    last_holders[actor_id] = holders
            if expected is not None:
                why = f"the workload let go of every handle to it ({expected[1]})"
            elif owner is None or not owner.alive:
                why = f"its owner {record.spec.owner_address} died"
            elif not holders:
                why = "no live process holds a handle to it"
            if not why:
                fitting = self._creatable_on(record, nodes, leased)
                if fitting:
                    since = self._creatable.get(actor_id, now)
                    if fitting <= self._churned:
                        since = now
                    creatable[actor_id] = since
                    waited = self._overdue("actor create", now, since, quiet_from, self.actor_create_bound_s)
                    if waited is not None:
                        free = {node_id[:8]: dict(sorted(nodes_by_id[node_id].available.items()))
                                for node_id in sorted(fitting)}
                        raise InvariantViolation(
                            "fitting-actor-created",
                            f"actor {actor_id} ({record.spec.class_name}, "
                            f"{dict(sorted(record.spec.resources.items()))}, "
                            f"{type(record.spec.strategy).__name__}) has been "
                            f"{record.state.value} for {waited:.3f} s of virtual time "
                            f"with no lease or creation under way, while node(s) {free} had "
                            f"the free resources it needs with no allocation and no fault "
                            f"(the bound is {self.actor_create_bound_s} s)")
                continue
            since = self._unreferenced.get(actor_id, (now, why))[0]
            if expected is not None:
                since = min(since, expected[0])
            unreferenced[actor_id] = (since, why)
            waited = self._overdue("actor end", now, since, quiet_from, self.actor_end_bound_s)
            if waited is not None:
                raise InvariantViolation(
                    "unreferenced-actor-ends",
                    f"actor {actor_id} ({record.spec.class_name}, "
                    f"{'detached, ' if record.spec.detached else ''}owner "
                    f"{record.spec.owner_address}) is {record.state.value} by the GCS "
                    f"{waited:.3f} s of virtual time after {why}, with no fault "
                    f"meanwhile (the bound is {self.actor_end_bound_s} s)")
        self._unreferenced = unreferenced
        self._creatable = creatable
        self._last_holders = last_holders

    def _creatable_on(self, record, nodes: list, leased: set) -> set:
        """The live nodes a pending (or restarting) actor could be created
        on now, by its strategy and their free resources; empty while a
        lease for it is granted or asked for, or it is not pending."""
        if record.state not in (ActorStatus.PENDING_CREATION, ActorStatus.RESTARTING) or \
                record.actor_id in leased:
            return set()
        spec = record.spec
        resources, strategy = spec.resources, spec.strategy
        gpus = resources.get("GPU", 0.0)
        found = set()
        for node_id, manager in nodes:
            if manager.draining:
                continue
            if isinstance(strategy, PlacementGroupStrategy):
                if self._fits_pool(manager, _Asking(resources, strategy)):
                    found.add(node_id)
                continue
            if isinstance(strategy, NodeAffinityStrategy) and not strategy.soft and \
                    node_id != strategy.node_id:
                continue
            if scheduling.fits(resources, manager.available) and \
                    manager.gpus.can_allocate(gpus):
                found.add(node_id)
        return found

    def _check_dead(self, now: float, nodes: list, actor_id: str, record,
                    quiet_from: float) -> None:
        cause = record.death_cause.reason if record.death_cause is not None else ""
        if actor_id not in self._dead:
            self._dead[actor_id] = now
            if cause == OUT_OF_SCOPE:
                # Those that held a handle at the last look before the end and
                # hold one still (a handle deserialized since, by a lineage
                # re-run of a task it was an argument of, came too late to
                # count: lifetimes chaos seed 126).
                before = self._last_holders.get(actor_id, ())
                holders = [address for address, refs in self._holders(actor_id)
                           if address in before]
                if holders:
                    raise InvariantViolation(
                        "actor-outlives-its-handles",
                        f"actor {actor_id} ({record.spec.class_name}) was ended as out of "
                        f"scope while {holders} still held a handle to it")
        leases = [(node_id, lease.lease_id) for node_id, manager in nodes
                  for lease in manager.leases.values() if lease.for_actor == actor_id]
        process = self.cluster.processes.get(record.address) if record.address else None
        if not leases and (process is None or not process.alive):
            self._settled.add(actor_id)
            self._dead.pop(actor_id, None)
            return
        bound_s = self.scoped_release_bound_s if cause == OUT_OF_SCOPE else \
            self.release_bound_s
        waited = self._overdue("actor release", now, self._dead[actor_id], quiet_from, bound_s)
        if waited is not None:
            raise InvariantViolation(
                "unreferenced-actor-ends",
                f"actor {actor_id} ({record.spec.class_name}) has been DEAD by the GCS for "
                f"{waited:.3f} s of virtual time with no fault meanwhile, and "
                + (f"its lease(s) {leases} are still held" if leases else
                   f"its worker {record.address} still lives")
                + f" (the bound is {bound_s} s)")

    def _overdue(self, check: str, now: float, since: float, quiet_from: float,
                 bound_s: float) -> float | None:
        """How long a wait that began at ``since`` has lasted (counted from
        ``quiet_from`` at the earliest), noted for the check's margin; None
        while within ``bound_s``."""
        waited = now - max(since, quiet_from)
        self._note(check, waited, bound_s)
        return waited if waited > bound_s else None

    def _note(self, check: str, waited_s: float, bound_s: float) -> None:
        if waited_s > 0:
            self.worst[check] = max(self.worst.get(check, 0.0), waited_s / bound_s)

    def _holders(self, actor_id: str) -> list:
        oid = actor_handle_id(actor_id)
        found = []
        for address, process in sorted(self.cluster.processes.items()):
            references = getattr(process.component, "references", None)
            refs = getattr(references, "refs", None)
            if process.alive and refs is not None:
                entry = refs.get(oid)
                if entry is not None and (entry.local or entry.submitted or entry.contained):
                    found.append((address, entry))
        return found

    # ------------------------------------------------------------------ end

    def finish(self) -> None:
        """A last look (the run's phases are over): raises the violation it
        finds, as a sample does."""
        if self.failure is None and self._original is not None:
            self.sample(self.cluster.clock.current_time())


class _Asking:
    """What ``_fits_pool`` reads of a lease request."""

    def __init__(self, resources: dict, strategy) -> None:
        self.resources = resources
        self.strategy = strategy


def _holders_of(workers: list, oid) -> frozenset:
    """The addresses of the core workers that hold a count of ``oid``."""
    return frozenset(address for address, refs in workers
                     if (entry := refs.get(oid)) is not None and
                     (entry.local or entry.submitted or entry.contained))


def _pool_text(manager, request) -> str:
    strategy = request.strategy
    if isinstance(strategy, PlacementGroupStrategy):
        return "; ".join(f"bundle {index} of {pg_id[:8]}: {dict(sorted(b.available.items()))}"
                         for (pg_id, index), b in sorted(manager.bundles.items())
                         if pg_id == strategy.placement_group_id)
    return f"available {dict(sorted(manager.available.items()))}"
