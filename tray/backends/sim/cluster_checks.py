"""Checks across a simulated cluster's components, run with their own
invariants after every step (``InvariantChecks.validate_components``):
what no single component can see broken, judged against the simulator's
own truth (the network's deliveries, the machines' stores).

* ``reliable_handled_once``: a process handled exactly the reliable one-way
  messages that were new to it (rpc's promise: each handled once, whatever
  the resends after broken connections deliver again), as the network
  counts them (``SimNetwork.reliable_new``).
* ``recovery_keeps_good_copies``: when an owner recovers an object (its
  ``object_recovery`` trace event, recorded before it acts), the copies it
  knew of that were still good (in the store of a live node that the GCS
  never declared dead) stay known, are not freed, and the object's task is
  not re-run while one is left.

Each returns None, or ``(invariant name, what broke)``."""

from __future__ import annotations

from itertools import islice

from ...core.ids import ObjectID


def reliable_handled_once(cluster, process) -> tuple[str, str] | None:
    endpoint = getattr(process.component, "endpoint", None)
    handled = getattr(endpoint, "reliable_handled", None)
    if handled is None:
        return None
    network = cluster.network
    new = network.reliable_new.get(process.address, 0)
    if handled == new:
        return None
    what = "handled a reliable message twice (a copy sent again after a broken " \
        "connection)" if handled > new else "dropped a reliable message it had never handled"
    return ("reliable-message-handled-once",
            f"{process.address} {what}: its endpoint handled {handled} reliable messages, and "
            f"{new} of those the network delivered to it were new (by their sender, session "
            f"and sequence number; {network.reliable_replayed} deliveries in the run were "
            "copies sent again)")


class _RecoveryWatch:
    """What the recovery check keeps between steps: how far it read the
    trace, and the nodes the GCS declared dead (their copies are doomed)."""

    def __init__(self) -> None:
        self.read = 0
        self.dead_nodes: set = set()


def recovery_keeps_good_copies(cluster) -> tuple[str, str] | None:
    trace = cluster.trace
    watch = cluster.__dict__.get("_recovery_watch")
    if watch is None:
        watch = cluster.__dict__["_recovery_watch"] = _RecoveryWatch()
    count = trace.event_count
    if count == watch.read:
        return None
    fresh = min(count - watch.read, len(trace.events))
    watch.read = count
    recoveries, reconstructed = [], {}
    for event in reversed(list(islice(reversed(trace.events), fresh))):
        name = event["event"]
        if name == "object_recovery":
            recoveries.append(event)
        elif name == "task_reconstruct":
            reconstructed[event["object"]] = event
        elif name in ("node_dead", "node_fenced", "kill_node"):
            watch.dead_nodes.add(event.get("node") or event["component"])
    # Exact only when the stores are read in the step that recovered (the
    # simtest validates after every step).
    if not recoveries or cluster.validate_every_steps != 1:
        return None
    for event in recoveries:
        broken = _judge_recovery(cluster, watch, event, reconstructed.get(event["object"]))
        if broken is not None:
            return ("recovery-keeps-good-copies", broken)
    return None


def _good_copies(cluster, watch, object_id: bytes, known: list) -> list:
    """The node ids among ``known`` whose live node still stores the object."""
    good = []
    for node_id in known:
        if node_id in watch.dead_nodes or any(node_id.startswith(prefix) for prefix in
                                              watch.dead_nodes if len(prefix) < len(node_id)):
            continue
        if not cluster.is_alive(node_id):
            continue
        index = cluster._node_ids.index(node_id)
        if cluster.stores[index].contains(object_id):
            good.append(node_id)
    return good


def _judge_recovery(cluster, watch, event: dict, reconstruct: dict | None) -> str | None:
    object_hex = event["object"]
    object_id = bytes.fromhex(object_hex)
    good = _good_copies(cluster, watch, object_id, event.get("known") or [])
    if not good:
        return None
    where = f"object {object_hex[:16]}'s owner {event['owner']} (asked to recover it, copies " \
        f"unreadable at {[n[:8] for n in event.get('lost') or []]})"
    if reconstruct is not None:
        return (f"{where} re-ran its task {str(reconstruct.get('task'))[:16]} although it knew "
                f"of a good copy on live node(s) {[n[:8] for n in good]}")
    process = cluster.processes.get(event["owner"])
    component = getattr(process, "component", None)
    references = getattr(component, "references", None)
    if references is None or not process.alive:
        return None
    entry = references.refs.get(ObjectID(object_id))
    if entry is not None:
        kept = {node for node, _ in entry.locations}
        dropped = [node for node in good if node not in kept]
        if dropped:
            return (f"{where} dropped the good copies on live node(s) "
                    f"{[n[:8] for n in dropped]} from its locations")
    managers = {f"n{cluster._node_ids.index(node)}/raylet": node for node in good}
    outbox = getattr(component, "outbox", None)
    for address, method, args in list(getattr(outbox, "_queue", ())):
        if method == "free_objects" and address in managers and object_id in args[0]:
            return (f"{where} freed the good copy on live node {managers[address][:8]} "
                    f"({address})")
    return None
