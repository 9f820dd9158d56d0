"""A model of the autoscaler's policy, held against every round it plays.

The ``autoscaler`` workload wraps its monitor's ``Autoscaler.update`` (on
the instance: the policy itself is untouched) and hands each round's
inputs — the GCS's load, the provider's nodes, the time, the bytes in
each node's store — and the decisions that came out to ``PolicyModel``.
The model asks what the policy promises, in the relaxations of it that a
correct policy can never break, so that a heuristic's choice (which node
type, which bin) never reads as a bug:

* ``autoscaler-launches-for-demand``: after a round's launches, the
  resources of the live nodes' free capacity, the booting nodes and the
  new ones cover, resource by resource, the demand that some node type
  could still be launched for (room under ``max_workers``, the type's own
  max, the pending limit, no boot back-off). Demand is never left waiting
  for a later round, nor launched for one node short. The same for
  ``request_resources`` bundles against the nodes' *totals*, and each
  type's ``min_workers``; and a STRICT_SPREAD group has as many distinct
  nodes that could each hold one of its bundles as it has bundles.
* ``autoscaler-launches-only-for-demand``: no round launches more nodes
  (beyond ``min_workers``) than there are units of feasible demand, nor a
  type that fits none of it, nor a GPU type for demand that needs no GPU
  while a GPU-free type that fits it could be launched (Ray's GPU
  avoidance), nor anything at all when every unit is infeasible.
* ``autoscaler-launches-only-for-real-demand``: the same bound held
  against the cluster's ground truth rather than what tray reported
  (``DemandTruth``): no round launches more nodes (beyond
  ``min_workers``) than the distinct units of feasible demand that really
  waited in the window the round's load may reflect, nor a type that fits
  none of them. A unit is a lease request queued at a live node (not one
  for a placement group's bundle: the group already holds its resources),
  an owner's task waiting for a lease with no request queued for it (an
  infeasible one retrying), a pending actor (not in a group), a bundle of
  a pending group, or a ``request_resources`` bundle. Work queued inside a
  placed group's bundles is never demand for a new node (Ray).
* ``autoscaler-reports-infeasible``: a shape no node type can hold is in
  the round's status as infeasible.
* ``autoscaler-terminates-idle-nodes``: a node idle (no lease, no bundle,
  no object, all its resources free) in every round for ``idle_timeout``
  is terminated in that round, down to its type's ``min_workers`` (unless
  ``request_resources`` holds the cluster up); and
  ``autoscaler-terminates-only-idle-nodes``: no other node is, and no type
  goes below its ``min_workers``.

Where the model must know the policy's state it keeps its own, erring on
the lenient side: a boot failure's back-off is counted from every failure
of the type (the policy's resets when a node of the type comes up), a node
booted but not registered counts against the room to launch and adds its
capacity. Violations are recorded, not raised (the round runs inside the
simulation, where the monitor would log and swallow an exception); the
workload raises the first at its end."""

from __future__ import annotations

import collections

EPS = 1e-9
# The policy's documented boot back-off: BOOT_BACKOFF_S doubling to the max.
BACKOFF_S, BACKOFF_MAX_S = 5.0, 300.0
PENDING_NODES_MIN = 5


def _fits(request: dict, resources: dict) -> bool:
    return all(resources.get(name, 0.0) + EPS >= amount for name, amount in request.items()
               if amount > EPS)


def _add_into(total: dict, resources: dict, times: float = 1.0) -> None:
    for name, amount in resources.items():
        total[name] = total.get(name, 0.0) + amount * times


def _shape(resources: dict) -> str:
    return "{" + ", ".join(f"{k}: {v:g}" for k, v in sorted(resources.items())) + "}"


class PolicyModel:
    def __init__(self, config) -> None:
        self.config = config
        self.failures: collections.Counter = collections.Counter()  # type -> failed boots
        self.blocked_until: dict = {}  # type -> no launch before (>= the policy's back-off)
        self._seen_failed: set = set()
        self.idle_since: dict = {}  # provider id -> first round seen idle (in a row)
        self.violations: list = []  # (invariant, message)
        self.rounds = 0
        self.infeasible_reported: set = set()  # shapes a round's status named infeasible
        self.infeasible_seen: set = set()  # infeasible shapes some round's load held
        self._now = 0.0
        # The ground truth (a DemandTruth), and when the round being checked
        # read its load (the workload sets both; without them the check
        # against the truth is skipped).
        self.truth = None
        self.load_read_at: float | None = None

    def _violate(self, invariant: str, message: str) -> None:
        if len(self.violations) < 20:
            self.violations.append((invariant, f"round at t={self._now:.3f}: {message}"))

    # ------------------------------------------------------------ a round

    def check_round(self, load, provider_nodes: list, now: float, objects_held: dict,
                    decisions: list, status) -> None:
        from tray.autoscaler.policy import FAILED, LAUNCHING, RUNNING

        config = self.config
        self.rounds += 1
        self._now = now
        objects_held = objects_held or {}
        gcs = {node.node_id: node for node in load.nodes}
        live = [n for n in provider_nodes if n.state == RUNNING and n.node_id in gcs]
        booting = [n for n in provider_nodes if n.state == LAUNCHING]
        unregistered = [n for n in provider_nodes if n.state == RUNNING and
                        n.node_id not in gcs]
        for node in provider_nodes:
            if node.state == FAILED and node.provider_id not in self._seen_failed:
                self._seen_failed.add(node.provider_id)
                self.failures[node.node_type] += 1
                backoff = min(BACKOFF_S * 2 ** (self.failures[node.node_type] - 1),
                              BACKOFF_MAX_S)
                self.blocked_until[node.node_type] = max(
                    self.blocked_until.get(node.node_type, -1.0), now + backoff)
        launched: collections.Counter = collections.Counter()
        for decision in decisions:
            if decision.action == "launch":
                launched[decision.node_type] += decision.count
        types = config.worker_types()

        # The room left after the round's launches (as much or less than the
        # policy's: booted-but-unregistered nodes all count).
        counts = collections.Counter(n.node_type for n in live + booting + unregistered)
        counts.update(launched)
        pending = len(booting) + len(unregistered) + sum(launched.values())
        pending_max = max(PENDING_NODES_MIN, int(config.upscaling_speed * max(1, len(live) + 1)))
        room = min(config.max_workers - sum(counts.values()), pending_max - pending)

        def launchable(node_type) -> bool:
            return room > 0 and counts[node_type.name] < node_type.max_workers and \
                now >= self.blocked_until.get(node_type.name, -1.0)

        # The demand, as units (resources, how many).
        units = [(dict(shape), count) for shape, count in load.shapes]
        for _group, strategy, bundles in load.placement_groups:
            if strategy == "STRICT_PACK":
                total: dict = {}
                for bundle in bundles:
                    _add_into(total, bundle)
                units.append((total, 1))
            else:
                units += [(dict(bundle), 1) for bundle in bundles]
        requested = [(dict(bundle), 1) for bundle in load.requested]
        # Infeasible: no node type holds it (and no node there now, which
        # may serve it without a launch).
        infeasible = [shape for shape, _ in units + requested
                      if not any(_fits(shape, t.resources) for t in types) and
                      not any(_fits(shape, node.total) for node in gcs.values())]
        feasible_units = [(s, c) for s, c in units if any(_fits(s, t.resources) for t in types)]
        feasible_requested = [(s, c) for s, c in requested
                              if any(_fits(s, t.resources) for t in types)]

        # Capacity: free on live nodes (all the GCS lists), full on booting
        # ones (for requests, the nodes' totals), and the new ones, which
        # demand and requests share.
        booting_capacity: dict = {}
        for node in booting + unregistered:
            _add_into(booting_capacity, config.node_types[node.node_type].resources)
        new_capacity: dict = {}
        for name, count in launched.items():
            if name in config.node_types:
                _add_into(new_capacity, config.node_types[name].resources, count)
        free: dict = dict(booting_capacity)
        totals: dict = dict(booting_capacity)
        for node in gcs.values():
            _add_into(free, node.available)
            _add_into(totals, node.total)
        helped = [t for t in types if launchable(t)]

        def deficit(wanted: list, have: dict) -> dict:
            need: dict = {}
            for shape, count in wanted:
                if any(_fits(shape, t.resources) for t in helped):
                    _add_into(need, shape, count)
            return {name: amount - have.get(name, 0.0) for name, amount in need.items()
                    if amount - have.get(name, 0.0) > EPS}

        # Launches only for demand, of types that fit it.
        lower = collections.Counter(n.node_type for n in live + booting)  # <= the policy's
        below_min = {t.name: max(0, t.min_workers - lower[t.name]) for t in types}
        for_demand = {name: count - below_min.get(name, 0) for name, count in launched.items()
                      if count - below_min.get(name, 0) > 0}
        wanted = feasible_units + feasible_requested
        unit_count = sum(count for _, count in wanted)
        if sum(for_demand.values()) > unit_count:
            self._violate("autoscaler-launches-only-for-demand",
                          f"launched {dict(launched)} ({sum(for_demand.values())} beyond "
                          f"min_workers) for {unit_count} unit(s) of feasible demand "
                          f"{[(_shape(s), c) for s, c in wanted]}")
        if for_demand and self.truth is not None:
            self._check_real_demand(for_demand, types, launched, units)
        needs_gpu = any(shape.get("GPU", 0.0) > EPS for shape, _ in wanted)
        for name in sorted(for_demand):
            node_type = config.node_types.get(name)
            if node_type is None:
                self._violate("autoscaler-launches-only-for-demand",
                              f"launched {name}, not a node type")
                continue
            served = [shape for shape, _ in wanted if _fits(shape, node_type.resources)]
            if not served:
                self._violate("autoscaler-launches-only-for-demand",
                              f"launched {for_demand[name]} {name} node(s), a type that fits "
                              f"none of the demand {[(_shape(s), c) for s, c in wanted]}"
                              f"{' (all of it infeasible: ' + str(infeasible) + ')' if infeasible else ''}")
            elif node_type.resources.get("GPU", 0.0) > EPS and not needs_gpu:
                other = [t.name for t in types if t.resources.get("GPU", 0.0) <= EPS and
                         launchable(t) and all(_fits(s, t.resources) for s in served)]
                if other:
                    self._violate("autoscaler-launches-only-for-demand",
                                  f"launched GPU type {name} for demand that needs no GPU "
                                  f"({[_shape(s) for s in served]}) while {other} could "
                                  f"still be launched")

        short_demand = deficit(feasible_units, free)
        short_requested = deficit(feasible_requested, totals)
        for name in sorted(set(short_demand) | set(short_requested)):
            needed = short_demand.get(name, 0.0) + short_requested.get(name, 0.0)
            if new_capacity.get(name, 0.0) + EPS < needed:
                self._violate(
                    "autoscaler-launches-for-demand",
                    f"{name}: the demand waiting needs {short_demand.get(name, 0.0):g} more "
                    f"than the live nodes have free and the booting ones bring, "
                    f"request_resources {short_requested.get(name, 0.0):g} more than their "
                    f"totals; the round launched {dict(launched)}, bringing "
                    f"{new_capacity.get(name, 0.0):g}, and {[t.name for t in helped]} could "
                    f"still be launched (room {room}); demand "
                    f"{[(_shape(s), c) for s, c in units]}, requested "
                    f"{[_shape(s) for s, _ in requested]}")
                break
        # A STRICT_SPREAD group needs a node per bundle: as many distinct
        # hosts, each holding one bundle, among the live nodes (by their
        # free resources), the booting and the new ones (by their type).
        for group, strategy, bundles in load.placement_groups:
            if strategy != "STRICT_SPREAD" or not bundles:
                continue
            bundle = bundles[0]
            if not any(_fits(b, t.resources) for t in helped for b in bundles):
                continue
            hosts = sum(1 for node in gcs.values() if _fits(bundle, node.available)) + \
                sum(1 for node in booting + unregistered
                    if _fits(bundle, config.node_types[node.node_type].resources)) + \
                sum(count for name, count in launched.items()
                    if name in config.node_types and
                    _fits(bundle, config.node_types[name].resources))
            if hosts < len(bundles):
                self._violate(
                    "autoscaler-launches-for-demand",
                    f"STRICT_SPREAD group {str(group)[:8]} of {len(bundles)} bundle(s) "
                    f"{_shape(bundle)} has {hosts} node(s) that could each hold one (live "
                    f"with room, booting, or launched this round: {dict(launched)}), and "
                    f"{[t.name for t in helped]} could still be launched (room {room})")
        for node_type in types:
            if counts[node_type.name] < node_type.min_workers and launchable(node_type):
                self._violate("autoscaler-launches-for-demand",
                              f"{counts[node_type.name]} {node_type.name} node(s) after the "
                              f"round, min_workers is {node_type.min_workers}")

        # Infeasible shapes are reported.
        reported = {_shape(shape) for shape in (status.infeasible if status else ())}
        self.infeasible_reported |= reported
        for shape in infeasible:
            self.infeasible_seen.add(_shape(shape))
            if _shape(shape) not in reported and len(reported) < 20:
                self._violate("autoscaler-reports-infeasible",
                              f"{_shape(shape)} fits no node type, the status names "
                              f"{sorted(reported)} infeasible")

        self._check_scale_down(load, gcs, live, booting, unregistered, objects_held, now,
                               decisions)

    def _check_real_demand(self, for_demand: dict, types: list, launched,
                           load_units: list) -> None:
        """Launches beyond ``min_workers`` against the demand that really
        waited since the oldest moment the round's load may reflect."""
        read_at = self._now if self.load_read_at is None else self.load_read_at
        since = read_at - self.truth.window_s
        units = [shape for shape in self.truth.units_since(since)
                 if any(_fits(shape, t.resources) for t in types)]
        count = sum(for_demand.values())
        window = f"since t={since:.3f} (the load was read at t={read_at:.3f})"
        if count > len(units):
            self._violate("autoscaler-launches-only-for-real-demand",
                          f"launched {dict(launched)} ({count} beyond min_workers) while "
                          f"{len(units)} unit(s) of feasible demand really waited {window}: "
                          f"{_shapes_counted(units)}; the round's load held "
                          f"{[(_shape(shape), c) for shape, c in load_units]}")
            return
        for name in sorted(for_demand):
            node_type = self.config.node_types.get(name)
            if node_type is not None and not any(_fits(s, node_type.resources) for s in units):
                self._violate("autoscaler-launches-only-for-real-demand",
                              f"launched {for_demand[name]} {name} node(s), a type that fits "
                              f"none of the demand that really waited {window}: "
                              f"{_shapes_counted(units)}")

    def _check_scale_down(self, load, gcs, live, booting, unregistered, objects_held,
                          now, decisions) -> None:
        config = self.config
        listed = {n.provider_id for n in live}
        for provider_id in sorted(set(self.idle_since) - listed):
            del self.idle_since[provider_id]
        overdue: dict = {}
        for node in live:
            reading = gcs[node.node_id]
            idle = reading.leases == 0 and reading.bundles == 0 and \
                objects_held.get(node.node_id, 0) == 0 and \
                all(reading.available.get(name, 0.0) + EPS >= amount
                    for name, amount in reading.total.items())
            if not idle:
                self.idle_since.pop(node.provider_id, None)
                continue
            since = self.idle_since.setdefault(node.provider_id, now)
            if now - since >= config.idle_timeout_s - EPS:
                overdue.setdefault(node.node_type, []).append(node.provider_id)
        terminated: dict = {}
        for decision in decisions:
            if decision.action != "terminate":
                continue
            terminated.setdefault(decision.node_type, []).append(decision.provider_id)
            since = self.idle_since.pop(decision.provider_id, None)
            if decision.provider_id not in overdue.get(decision.node_type, []):
                idle_for = "not idle" if since is None else f"idle for {now - since:g} s"
                self._violate("autoscaler-terminates-only-idle-nodes",
                              f"terminated {decision.provider_id} ({decision.node_type}), "
                              f"{idle_for}; idle_timeout is {config.idle_timeout_s:g} s")
        for name, node_type in sorted(config.node_types.items()):
            present = sum(1 for n in live + booting if n.node_type == name)
            upper = present + sum(1 for n in unregistered if n.node_type == name)
            gone = len(terminated.get(name, []))
            if upper - gone < node_type.min_workers and gone:
                self._violate("autoscaler-terminates-only-idle-nodes",
                              f"terminated {gone} {name} node(s) of {upper}, min_workers is "
                              f"{node_type.min_workers}")
            if load.requested:
                continue  # request_resources may hold any node up
            due = min(len(overdue.get(name, [])), present - node_type.min_workers)
            if gone < due:
                self._violate("autoscaler-terminates-idle-nodes",
                              f"{overdue[name]} ({name}) idle for at least "
                              f"{config.idle_timeout_s:g} s (idle_timeout), {gone} terminated; "
                              f"{present} {name} node(s), min_workers {node_type.min_workers}")

    def first_violation(self):
        return self.violations[0] if self.violations else None


def _shapes_counted(shapes: list) -> list:
    return sorted(collections.Counter(_shape(shape) for shape in shapes).items())


class DemandTruth:
    """The demand that really waits in the cluster, read from the
    components' state, never from what they report: each unit with the
    last virtual time it was seen waiting.

    Units (by identity, so that a unit seen twice counts once): a lease
    request queued at a live node's lease manager, unless it is for a
    placement group's bundle (the group holds its resources already) — an
    actor's creation by the actor's id; an owner's task of a class outside
    any group that waits for a lease with no request of its class waiting at
    a node for it (its requests were answered infeasible and it retries, or
    a request is on its way); an actor the GCS has pending or restarting
    (not in a group); each bundle of a pending or rescheduling group not
    placed yet; each ``request_resources`` bundle.

    A round's load may be older than its reading: a node re-sends an
    unchanged report only every ``DEMAND_REFRESH_PERIODS`` heartbeats (a
    lost update stands until then), an infeasible request counts for two
    retry periods after it was made, and a report goes at a heartbeat:
    ``window_s`` covers all of it. Sampled after every step the simulator
    validates (and at each round), reading only."""

    def __init__(self, cluster) -> None:
        from tray.core.node.demand_reporter import DEMAND_REFRESH_PERIODS

        config = cluster.config
        self.cluster = cluster
        self.window_s = 2 * config.infeasible_retry_period_s + \
            (DEMAND_REFRESH_PERIODS + 2) * config.heartbeat_period_s + 1.0
        self.seen: dict = {}  # unit key -> (shape, last seen waiting, the waiter or None)
        self.samples = 0
        self._previous = None
        self._pruned_at = 0.0

    def install(self) -> None:
        cluster = self.cluster
        previous = cluster.validate_components
        self._previous = previous

        def validate_components(changed_only: bool = False) -> None:
            previous(changed_only)
            self.sample(cluster.clock._now_s)

        self._installed = validate_components
        cluster.validate_components = validate_components

    def uninstall(self) -> None:
        if self._previous is not None and \
                self.cluster.__dict__.get("validate_components") is self._installed:
            self.cluster.validate_components = self._previous
        self._previous = None

    def units_since(self, since: float) -> list:
        return [shape for shape, last, _ in self.seen.values() if last >= since - EPS]

    def sample(self, now: float) -> None:
        from tray.core.messages import ActorStatus, PlacementGroupStatus
        from tray.core.scheduling import PlacementGroupStrategy

        self.samples += 1
        seen = self.seen
        gcs = None
        for address, process in self.cluster.processes.items():
            if not process.alive or process.component is None:
                continue
            component = process.component
            if address == self.cluster.gcs_address:
                gcs = component
            waiting = getattr(getattr(component, "leases", None), "waiting", None)
            if waiting is not None and address.endswith("/raylet"):
                for waiter in waiting:
                    request = waiter.request
                    if isinstance(request.strategy, PlacementGroupStrategy):
                        continue
                    key = ("lease", id(waiter)) if request.for_actor is None else \
                        ("actor", request.for_actor)
                    seen[key] = (request.resources, now, waiter)  # (kept: its id stays its)
            submitter = getattr(component, "normal_submitter", None)
            if submitter is None:
                continue
            for class_key, queue in submitter.queues.items():
                if not queue.tasks or isinstance(class_key[1], PlacementGroupStrategy):
                    continue
                uncovered = len(queue.tasks) - sum(queue.asking.values())
                for task in list(queue.tasks)[len(queue.tasks) - max(uncovered, 0):]:
                    seen[("task", address, task.spec.task_id)] = (task.spec.resources, now,
                                                                   None)
        if gcs is not None:
            pending = (ActorStatus.PENDING_CREATION, ActorStatus.RESTARTING)
            for actor_id, actor in gcs.actor_manager.actors.items():
                if actor.state in pending and \
                        not isinstance(actor.spec.strategy, PlacementGroupStrategy):
                    seen[("actor", actor_id)] = (actor.spec.resources, now, None)
            for pg_id, group in gcs.placement_groups.groups.items():
                if group.state in (PlacementGroupStatus.PENDING,
                                   PlacementGroupStatus.RESCHEDULING):
                    for index, bundle in enumerate(group.spec.bundles):
                        if index not in group.bundle_nodes:
                            seen[("bundle", pg_id, index)] = (dict(bundle), now, None)
            for index, bundle in enumerate(gcs.demand.requested):
                seen[("requested", index, tuple(sorted(bundle.items())))] = (
                    dict(bundle), now, None)
        if now - self._pruned_at >= self.window_s:
            self._pruned_at = now
            for key in [key for key, (_, last, _) in seen.items()
                        if last < now - 3 * self.window_s]:
                del seen[key]


def period_gaps(rounds: list, period_s: float) -> str | None:
    """``rounds``: (start, end) of each round in virtual time. A round must
    start one period after the last one ended (Ray's update interval)."""
    for (_, end), (start, _) in zip(rounds, rounds[1:], strict=False):
        if start - end > period_s + 1e-6 or start < end - 1e-9:
            return (f"a round started at t={start:.3f}, {start - end:.3f} s after the last "
                    f"one ended (t={end:.3f}); the period is {period_s:g} s")
    return None


