"""Actor lifetimes and node fencing, checked against what they promise
(Ray's semantics), from the GCS's tables, the processes and the trace.

* ``actor-death-explained`` (after quiescence, ``check_actor_deaths``):
  every actor the GCS holds DEAD died for a reason its kind permits, and the
  reason is true: killed (``tray.kill``), out of scope or its owner gone
  (never a detached actor: it outlives its creator and its handles, and
  dies only by a kill, an exit of its own or faults that used up its
  restarts), its owner's process really gone, its placement group really
  removed (with the group-removed cause, which makes its calls raise
  ``ActorPlacementGroupRemoved``), its restart budget really used up (the
  GCS counted exactly ``max_restarts`` restarts, never more, for any
  actor), an exit of its own or its constructor's error.
* ``one-actor-incarnation-at-a-time`` (after the values, from the trace,
  ``check_one_incarnation``): once an actor's newer incarnation was created,
  no older one starts a call, unless the older one's node had been
  declared dead by then (a node cut off runs on until it can hear that it
  is dead: ``dead-node-fenced`` bounds how long).
* ``dead-node-fenced`` (while the seed runs, ``FencingWatch``, sampled by
  the liveness monitor): a node manager that the GCS declared dead and
  that can reach the GCS (no partition, stall or lag between them, the GCS
  up) ends itself and its workers within a few heartbeat periods, as a
  raylet does: at its next heartbeat the GCS tells it it is dead.

* ``node-declared-dead-after-its-timeout`` (trace, ``check_node_deaths``):
  the GCS declares a node dead for missed heartbeats only after hearing
  nothing from it for ``node_death_timeout_s``.

Each reads state and trace only (the digest is unchanged). The workload
patterns that reach these paths (``pieces_actors``) raise their own:
``detached-actor-outlives-its-creator``, ``owned-actor-dies-with-its-owner``,
``removed-group-ends-its-actors``, ``silent-node-declared-dead`` and
``dead-node-work-recovered``."""

from __future__ import annotations

import re

from ..core.gcs.actor_manager import OUT_OF_SCOPE, PIN_NODE_DEAD
from ..core.messages import ActorStatus, PlacementGroupStatus
from ..core.scheduling import placement_group_id_of
from .invariants import InvariantViolation

_GROUP_REMOVED = re.compile(r"its placement group ([0-9a-f]+) (was removed|does not exist or "
                            r"was removed)$")
_BUDGET_USED = re.compile(r"the actor died because (.*), and its restart budget "
                          r"\(max_restarts=(-?\d+)\) is used up$", re.S)
KILLED = "the actor was killed by tray.kill()"
OWNER_EXITED = "its owner exited"
EXITED = "the actor exited by itself: "
CONSTRUCTOR = "its constructor raised an exception"
_PIN_NODE_DEAD = re.compile(re.escape(PIN_NODE_DEAD).replace(re.escape("{}"), "([0-9a-f]+)") + "$")


def _gcs(cluster):
    process = cluster.processes.get(cluster.gcs_address)
    if process is None or not process.alive or process.component is None:
        return None
    return process.component


def check_actor_deaths(cluster, program=None) -> None:
    """``actor-death-explained`` over the GCS's actor table (see the module
    docstring); raises the first unexplained death or over-spent budget.
    Then ``check_node_deaths``."""
    gcs = _gcs(cluster)
    if gcs is None:
        return
    check_node_deaths(cluster, gcs)
    groups = gcs.placement_groups.groups
    killed = removed_at = died_at = None
    if cluster.trace.event_count <= len(cluster.trace.events):
        killed, removed_at, died_at = set(), {}, {}
        for index, event in enumerate(cluster.trace.events):
            name = event["event"]
            if name == "actor_kill" and event.get("no_restart"):
                killed.add(event["actor"])
            elif name == "placement_group_removed":
                removed_at.setdefault(event["pg"], index)
            elif name == "actor_dead":
                died_at.setdefault(event["actor"], index)
    for actor_id, record in sorted(gcs.actor_manager.actors.items()):
        spec = record.spec
        what = (f"actor {actor_id} ({spec.class_name}"
                + (f", named {spec.name!r}" if spec.name else "")
                + (", detached" if spec.detached else "")
                + f", max_restarts={spec.max_restarts}, owner {spec.owner_address})")
        if spec.max_restarts >= 0 and record.restarts > spec.max_restarts:
            raise InvariantViolation(
                "actor-death-explained",
                f"{what} was restarted {record.restarts} times by the GCS, more than its "
                f"max_restarts={spec.max_restarts} permits")
        pg_id = placement_group_id_of(spec.strategy)
        group = groups.get(pg_id) if pg_id else None
        if group is not None and group.state == PlacementGroupStatus.REMOVED:
            # Removing a group ends the actors placed in it, at once and
            # with that cause, wherever their workers are (cut off too).
            if record.state != ActorStatus.DEAD:
                raise InvariantViolation(
                    "actor-death-explained",
                    f"{what} is {record.state.value} by the GCS, although its placement "
                    f"group {pg_id} was removed")
            cause = record.death_cause
            if not (cause is not None and cause.placement_group_removed) and \
                    removed_at is not None and pg_id in removed_at and \
                    died_at.get(actor_id, -1) > removed_at[pg_id]:
                raise InvariantViolation(
                    "actor-death-explained",
                    f"{what} died after its placement group {pg_id} was removed, of "
                    f"{cause.reason if cause is not None else '?'!r}: the removal must end "
                    "it, with the group-removed cause (its calls raise "
                    "ActorPlacementGroupRemoved)")
        if record.state != ActorStatus.DEAD:
            continue
        cause = record.death_cause
        reason = cause.reason if cause is not None else ""
        why = _unexplained(cluster, record, reason, cause, groups, killed)
        if why is not None:
            raise InvariantViolation("actor-death-explained",
                                     f"{what} is DEAD by the GCS ({reason!r}): {why}")


def _gcs_node(cluster, node_id: str):
    gcs = _gcs(cluster)
    return None if gcs is None else gcs.node_table.nodes.get(node_id)


def _unexplained(cluster, record, reason: str, cause, groups: dict, killed) -> str | None:
    spec = record.spec
    group_removed = bool(cause is not None and cause.placement_group_removed)
    match = _GROUP_REMOVED.match(reason)
    if group_removed or match is not None:
        pg_id = placement_group_id_of(spec.strategy)
        if match is None or not group_removed:
            return "a death by its group's removal must say so, and carry the group-removed " \
                   "cause (its calls raise ActorPlacementGroupRemoved)"
        if pg_id != match.group(1):
            return f"it was not placed in group {match.group(1)} (its group: {pg_id})"
        group = groups.get(pg_id)
        if group is not None and group.state != PlacementGroupStatus.REMOVED:
            return f"its group {pg_id} is {group.state.value}, not removed"
        return None
    if reason == KILLED:
        if killed is not None and record.actor_id not in killed:
            return "no tray.kill(no_restart=True) of it reached the GCS (no actor_kill event)"
        return None
    if reason == OUT_OF_SCOPE or reason == OWNER_EXITED:
        if spec.detached:
            return ("a detached actor outlives its creator and its handles: only a kill, an "
                    "exit of its own or faults that used up its restarts may end it")
        if reason == OWNER_EXITED:
            owner = cluster.processes.get(spec.owner_address)
            if owner is not None and owner.alive:
                return f"its owner {spec.owner_address} is alive"
        return None
    budget = _BUDGET_USED.match(reason)
    if budget is not None:
        if int(budget.group(2)) != spec.max_restarts or spec.max_restarts < 0:
            return f"the budget it names is not its max_restarts={spec.max_restarts}"
        if record.restarts != spec.max_restarts:
            return (f"the GCS restarted it {record.restarts} times, not the "
                    f"{spec.max_restarts} its budget allows")
        return None
    if reason.startswith(EXITED) or reason == CONSTRUCTOR:
        return None
    pinned = _PIN_NODE_DEAD.match(reason)
    if pinned is not None:
        strategy = spec.strategy
        if getattr(strategy, "node_id", None) != pinned.group(1) or \
                getattr(strategy, "soft", True):
            return f"it was not pinned (soft=False) to node {pinned.group(1)}"
        node = _gcs_node(cluster, pinned.group(1))
        if node is None or node.alive:
            return f"node {pinned.group(1)} is not dead in the GCS's node table"
        return None
    return "no cause a program, its owner, its group or the faults may give"


def check_one_incarnation(cluster) -> None:
    """``one-actor-incarnation-at-a-time`` from the trace (see the module
    docstring); skipped when the trace kept too few events."""
    trace = cluster.trace
    if trace.event_count > len(trace.events):
        return
    node_of: dict[str, str] = {}  # worker component -> its node's id prefix
    hosts: dict[str, tuple] = {}  # worker component -> (actor, incarnation)
    newest: dict[str, tuple] = {}  # actor -> (incarnation, worker component, created at)
    dead_at: dict[str, float] = {}  # node id prefix -> declared dead at
    for event in trace.events:
        name = event["event"]
        if name == "worker_start":
            node_of[f"worker:{event['worker'][-8:]}"] = event["component"]
        elif name == "node_dead":
            dead_at.setdefault(event["node"][:8], event["t"])
        elif name == "actor_created":
            actor, incarnation = event["actor"], event["incarnation"]
            hosts[event["component"]] = (actor, incarnation)
            if incarnation >= newest.get(actor, (-1,))[0]:
                newest[actor] = (incarnation, event["component"], event["t"])
        elif name == "task_started":
            host = hosts.get(event["component"])
            if host is None or event.get("name", "").endswith(".__init__"):
                continue
            actor, incarnation = host
            latest = newest[actor]
            if latest[0] <= incarnation or latest[1] == event["component"]:
                continue
            node = node_of.get(event["component"], "")
            if node and dead_at.get(node, float("inf")) <= event["t"]:
                continue  # cut off: fencing bounds it (dead-node-fenced)
            raise InvariantViolation(
                "one-actor-incarnation-at-a-time",
                f"actor {actor}: its incarnation {incarnation} on {event['component']} (node "
                f"{node or '?'}) started the call {event.get('name')} (task {event['task']}) "
                f"at t={event['t']:.6f}s, after its incarnation {latest[0]} was created on "
                f"{latest[1]} at t={latest[2]:.6f}s, while the GCS held the older one's node "
                "alive: two incarnations handled calls at once")


class FencingWatch:
    """``dead-node-fenced``, sampled by the liveness monitor."""

    def __init__(self, cluster) -> None:
        self.cluster = cluster
        heartbeat_s = cluster.config.heartbeat_period_s
        # Its next heartbeat (one period), the reply, the node's exit.
        self.bound_s = 2 * heartbeat_s + 0.5
        self._since: dict[str, float] = {}  # node id -> dead by the GCS and reachable since
        self.worst = 0.0

    def sample(self, now: float, gcs) -> None:
        cluster = self.cluster
        if gcs is None or getattr(cluster, "_gcs_down", False):
            self._since.clear()
            return
        network = cluster.network
        gcs_address = cluster.gcs_address
        gcs_machine = gcs_address.split("/", 1)[0]
        tracked = {}
        for address, process in sorted(cluster.processes.items()):
            if not address.endswith("/raylet") or not process.alive or \
                    process.component is None:
                continue
            node_id = getattr(process.component, "node_id", None)
            record = gcs.node_table.nodes.get(node_id)
            if record is None or record.alive:
                continue
            machine = address.split("/", 1)[0]
            cut = (machine, gcs_machine) in network.blocked or \
                (gcs_machine, machine) in network.blocked or \
                max(network.stalled_until.get(machine, 0.0),
                    network.stalled_until.get(gcs_machine, 0.0)) > now or \
                any(until > now for lagging, until in network.lagging.items()
                    if lagging in (address, gcs_address))
            since = now if cut else self._since.get(node_id, now)
            tracked[node_id] = since
            waited = now - since
            self.worst = max(self.worst, waited / self.bound_s)
            if waited > self.bound_s:
                workers = sorted(other for other, p in cluster.processes.items()
                                 if p.alive and other.startswith(machine + "/worker-"))
                raise InvariantViolation(
                    "dead-node-fenced",
                    f"node {node_id[:8]} ({address}) was declared dead by the GCS, and has "
                    f"lived on for {waited:.3f} s of virtual time while it could reach the "
                    f"GCS (no partition, stall or lag between them), with {len(workers)} "
                    f"live worker(s) {workers[:4]}: a node told it is dead must end itself "
                    f"and its work (the bound, its next heartbeat, is {self.bound_s} s)")
        self._since = tracked


def check_node_deaths(cluster, gcs) -> None:
    """``node-declared-dead-after-its-timeout``: the GCS declares a node dead
    for missed heartbeats only once it has heard nothing from it (no
    heartbeat, no registration) for ``node_death_timeout_s``, counted from
    the GCS's own (re)start too. From the trace; skipped when it kept too
    few events."""
    trace = cluster.trace
    if trace.event_count > len(trace.events):
        return
    timeout_s = cluster.config.node_death_timeout_s
    heard: dict[str, float] = {}  # raylet address -> the GCS last heard from it
    started_s = 0.0
    gcs_name = cluster.gcs_address
    for event in trace.events:
        name = event["event"]
        if name == "recv" and event["component"] == gcs_name and \
                event["msg"] in ("heartbeat", "register_node"):
            heard[event["peer"]] = event["t"]
        elif name == "started" and event["component"] == "gcs":
            started_s = event["t"]
        elif name == "node_dead" and event.get("reason") == "missed heartbeats":
            record = gcs.node_table.nodes.get(event["node"])
            if record is None:
                continue
            last = max(heard.get(record.address, 0.0), started_s)
            if event["t"] - last < timeout_s - 1e-6:
                raise InvariantViolation(
                    "node-declared-dead-after-its-timeout",
                    f"the GCS declared node {event['node'][:8]} ({record.address}) dead for "
                    f"missed heartbeats at t={event['t']:.6f}s, {event['t'] - last:.3f} s "
                    f"after it last heard from it (or started), short of "
                    f"node_death_timeout_s={timeout_s}")
