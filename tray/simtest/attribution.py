"""Fault attribution: what the trace says the faults did, and what they cost.

Counting executions against ``1 + max_retries`` lets a runtime re-run work
for no reason as long as it stays under the budget (a duplicate push, a
retry of a task whose worker was fine). So every extra execution must have
a cause in the trace: the execution before it ended in an application
error that the task retries, or a memory kill, or a fault hit a process it
depended on while it ran (between its start and the next one's): its
worker was killed, or its worker's node or its owner's node crashed, was
reset, stalled, slowed or cut off by a partition. A fault on the head node
(the GCS's and the driver's) and a GCS restart hit every node: the GCS may
declare any node dead then, and a node declared dead fences its workers.

``fault_spans`` turns the injector's records into spans of time and target,
``unattributed_executions`` finds the re-runs no span explains; ``spent``
(retries and restarts used) and ``deaths`` (nodes and processes that died)
are the ledgers the error checks hold an error against. Each returns None
when the trace kept too few events to say."""

from __future__ import annotations

import re
from dataclasses import dataclass

# requests made before it went down, for a while after it is back up.
GCS_RECOVERY_S = 0.5
# The messages that hand a worker a task to run (an actor's creation, a call).
_TASK_MESSAGES = frozenset({"push_task", "create_actor", "actor_call"})
_FAULT_WHAT = re.compile(r"t=[0-9.]+s (\w+)(.*)")
_FAULT_TARGET = re.compile(r"\b(node|worker|isolated)=([0-9a-f]+)")
_FAULT_PARAM = re.compile(r"\b(seconds|down_for_s)=([0-9.]+)")


@dataclass(frozen=True)
class FaultSpan:
    """A fault as the trace shows it: when it acted, and on what (a node id
    prefix, a worker id prefix, or everything)."""

    start_s: float
    end_s: float
    kind: str
    node: str | None = None  # node id prefix
    worker: str | None = None  # worker id prefix
    everywhere: bool = False

    def hits(self, worker_id: str, nodes: tuple) -> bool:
        if self.worker is not None:
            return worker_id.startswith(self.worker) or self.worker.startswith(worker_id)
        return self.everywhere or any(node and node.startswith(self.node) for node in nodes)


def fault_spans(events, head_node: str) -> list[FaultSpan]:
    """The faults the injector recorded, with how long each acted."""
    raw, heals, stopped_s = [], [], None
    spans = []
    for event in events:
        if event["event"] == "faults_stopped":
            stopped_s = event["t"]
        elif event["event"] == "kill_worker" and event["component"] == "fault":
            # Every worker killed, whoever asked: the schedule, or a workload
            # through ``kill_worker`` (rllib's default seed 253 killed an env
            # runner so, and its constructor's second run had no cause).
            spans.append(FaultSpan(event["t"], event["t"], "kill_worker",
                                   worker=event["worker"]))
        elif event["event"] == "kill_node" and event["component"] == "node_fenced":
            # A node the GCS declared dead ended itself (a partition past
            # the death timeout): what its processes ran until then, calls
            # held up by the partition and delivered at its heal included,
            # was cut off by that fault (restarts default seed 2).
            spans.append(FaultSpan(event["t"], event["t"], "kill_node",
                                   node=event["node"][:8]))
        elif event["event"] == "memory_kill":
            # A node's memory monitor killed a worker (pieces_memory): its
            # task is retried, and its actor restarts, for that cause.
            spans.append(FaultSpan(event["t"], event["t"], "memory_kill",
                                   worker=event["worker"]))
        elif event["event"] == "fault" and event["component"] == "simtest":
            if event["what"] == "heal":
                heals.append(event["t"])
            else:
                raw.append(event)
    end_of_faults = stopped_s if stopped_s is not None else float("inf")
    for event in raw:
        match = _FAULT_WHAT.match(event["what"])
        if match is None:
            continue
        kind, rest, start = match.group(1), match.group(2), event["t"]
        params = {name: float(value) for name, value in _FAULT_PARAM.findall(rest)}
        targets = dict(_FAULT_TARGET.findall(rest))
        end = start
        if kind == "partition":  # until the next heal (each heals every partition)
            end = min([t for t in heals if t >= start] + [end_of_faults])
        elif kind in ("stall", "duplicate"):  # (a duplicate's lag ends in a reset)
            end = start + params.get("seconds", 0.0)
        elif kind == "slow_node":
            end = end_of_faults
        elif kind == "gcs_restart":  # down, then recovering its tables and actors
            end = start + params.get("down_for_s", 0.0) + GCS_RECOVERY_S
        node, worker = targets.get("node") or targets.get("isolated"), targets.get("worker")
        # A fault whose target the record does not name (a duplicate on a
        # node the autoscaler added, known by its address alone: autoscaler
        # chaos seed 237) may have hit anything.
        spans.append(FaultSpan(start, end, kind, node=node, worker=worker,
                               everywhere=kind == "gcs_restart" or
                               (node is None and worker is None) or
                               (node is not None and head_node.startswith(node))))
    return spans


def unattributed_executions(cluster) -> list[str] | None:
    """Executions (task_started events) after which the same task ran again
    with no cause in the trace; None when the trace kept too few events."""
    trace = cluster.trace
    if trace.event_count > len(trace.events):
        return None
    events = list(trace.events)
    head_node = cluster.node_ids()[0]
    spans = fault_spans(events, head_node)
    worker_node: dict[str, str] = {}  # worker id -> its node's id prefix
    owner_of: dict[str, str] = {}  # task -> the component that submitted it
    # task -> [(t, worker component, attempt, name, submission, open)]: a
    # re-run parent submits its children again under the same ids (a new
    # submission), and the two runs of a parent cut off by a reset may both
    # submit them (``open`` submissions at once): runs of different or of
    # overlapping submissions are not re-executions of one another.
    starts: dict[str, list] = {}
    submissions: dict[str, int] = {}
    open_by: dict[str, set] = {}
    excused: set = set()  # (task, attempt that followed an error, a memory kill, a loss)
    first_node_death_s = None
    dead_at: dict[str, float] = {}  # node id prefix -> declared dead by the GCS at
    # A run begins when its task reaches the worker, not when its body
    # starts: fetching the function and the arguments is part of it, and a
    # fault then cuts it off as well (chaos seed 2650: a reset cut the GCS's
    # create_actor call after the worker received it and before the
    # constructor began; the GCS gave that worker up and created the actor
    # on another, so the constructor ran twice, a fault behind it).
    delivered_s: dict[str, float] = {}  # "worker-<id[:12]>" -> its last task received
    worker_by_suffix: dict[str, str] = {}  # a worker's "worker:<id[-8:]>" suffix -> its id
    running_attempt: dict[str, int] = {}  # "worker-<id[:12]>" -> attempt of its last run
    for event in events:
        name = event["event"]
        if name == "recv":
            if event["msg"] in _TASK_MESSAGES:
                delivered_s[event["component"].rsplit("/", 1)[-1]] = event["t"]
            continue
        if name == "worker_start":
            worker_node[event["worker"]] = event["component"]
            worker_by_suffix[event["worker"][-8:]] = event["worker"]
        elif name == "task_submitted":
            task = event["task"]
            owner_of.setdefault(task, event["component"])
            submissions[task] = submissions.get(task, 0) + 1
            open_by.setdefault(task, set()).add(event["component"])
        elif name == "task_finished":
            open_by.get(event["task"], set()).discard(event["component"])
        elif name == "task_started":
            task = event["task"]
            worker = worker_by_suffix.get(event["component"].split(":", 1)[-1])
            began_s = delivered_s.get(f"worker-{worker[:12]}", event["t"]) \
                if worker is not None else event["t"]
            if worker is not None:
                running_attempt[f"worker-{worker[:12]}"] = event.get("attempt") or 0
            starts.setdefault(task, []).append(
                (began_s, event["component"], event.get("attempt"), event.get("name"),
                 submissions.get(task, 0), len(open_by.get(task, ()))))
        elif name == "task_retry" and event.get("reason") in ("exception", "out of memory"):
            excused.add((event["task"], event.get("attempt")))
        elif name == "task_reconstruct" and (
                first_node_death_s is not None or
                running_attempt.get(str(event.get("by", "")).rsplit("/", 1)[-1], 0) > 0):
            # A re-run for lineage: its value was lost with a node, or
            # released once only lineage needed it and now wanted by the
            # re-run of a result lost with a node. Either way a node died.
            # Or the reader that found no copy (``by``) was running a re-run
            # of its own task (a retry, or a re-run for lineage of a result
            # a fault made unreadable), which needs its arguments again:
            # one released once only lineage needed it is made again, the
            # first re-run's fault behind it too (default seed 2638); that
            # re-run is attributed on its own.
            excused.add((event["task"], event.get("attempt")))
        elif name in ("kill_node", "node_dead") and first_node_death_s is None:
            first_node_death_s = event["t"]
        if name == "node_dead":
            dead_at.setdefault(event["node"][:8], event["t"])

    def where(component: str) -> tuple[str, tuple]:
        """A component's worker id (suffix) and the node(s) it may live on."""
        if component.startswith("driver:"):
            return "", (head_node,)
        suffix = component.split(":", 1)[-1]
        nodes = tuple(node for worker, node in worker_node.items() if worker.endswith(suffix))
        return suffix, nodes

    found = []
    for task, runs in starts.items():
        # In the order the runs began (their tasks reached the workers),
        # which is not always the order their bodies started: a creation
        # delivered before a GCS restart may start its constructor after the
        # re-created actor's (returns seed 86 under default: the pair came
        # out reversed, and no fault lies between a later start and an
        # earlier one).
        runs = sorted(runs, key=lambda run: run[0])
        owner = owner_of.get(task)
        _, owner_nodes = where(owner) if owner else ("", ())
        for (start_s, component, attempt, fn, submission, _), \
                (next_s, next_component, next_attempt, _, next_submission, next_open) in \
                zip(runs, runs[1:], strict=False):
            if next_submission != submission or next_open > 1:
                continue
            if any(dead_at.get(node, float("inf")) <= next_s
                   for node in where(next_component)[1]):
                # It began on a node the GCS had declared dead (cut off, and
                # not fenced yet): a call held up by the partition and
                # delivered at its heal (restarts default seed 2).
                continue
            if (task, next_attempt) in excused and next_attempt != attempt:
                continue
            if isinstance(attempt, int) and isinstance(next_attempt, int) and any(
                    (task, between) in excused for between in range(attempt + 1, next_attempt)):
                # An attempt between the two was excused and never began (its
                # worker died with the task on its way, say): this run is that
                # retry's (default seed 9811: attempt 0 raised, attempt 1's
                # worker died before it began, and attempt 2 ran).
                continue
            suffix, nodes = where(component)
            full_ids = [worker for worker in worker_node if worker.endswith(suffix)]
            if any(span.start_s <= next_s and span.end_s >= start_s and
                   (any(span.hits(worker, nodes + owner_nodes) for worker in full_ids) or
                    (not full_ids and span.hits(suffix, nodes + owner_nodes)))
                   for span in spans):
                continue
            found.append(f"task {fn} {task[:12]} ran again at t={next_s:.6f} (attempt "
                         f"{next_attempt}) after its run at t={start_s:.6f} (attempt "
                         f"{attempt}) on {component}, and no fault hit that worker, its node "
                         f"or its owner's ({owner}) in between")
    return found


@dataclass
class Spent:
    """What the trace says was spent, by hex id."""

    # task -> retries spent: worker deaths, exceptions and re-runs for
    # lineage, not memory kills. A re-run for lineage spends one of
    # ``max_retries`` as in Ray (TaskManager::ResubmitTask decrements
    # num_retries_left; ObjectReconstructionFailedMaxAttemptsExceededError),
    # so a task re-run once for a lost result and then hit by a crash may
    # give up with max_retries=1 (chaos seeds 1305, 1586).
    retries: dict
    restarts: dict  # actor -> restarts
    killed: set  # actors killed by tray.kill


def spent(cluster) -> Spent | None:
    trace = cluster.trace
    if trace.event_count > len(trace.events):
        return None
    result = Spent({}, {}, set())
    for event in trace.events:
        name = event["event"]
        if name == "task_reconstruct" or \
                (name == "task_retry" and event.get("reason") != "out of memory"):
            result.retries[event["task"]] = result.retries.get(event["task"], 0) + 1
        elif name == "actor_restarting":
            result.restarts[event["actor"]] = result.restarts.get(event["actor"], 0) + 1
        elif name == "actor_kill":
            result.killed.add(event["actor"])
    return result


@dataclass
class Deaths:
    """What died, from the trace: nodes (killed, or declared dead by the
    GCS) and processes (killed, exited, crashed), and the runs of each task."""

    nodes: set
    processes: set
    retries: dict  # task id hex -> retries and re-runs for lineage (not memory kills)


def deaths(cluster) -> Deaths | None:
    trace = cluster.trace
    if trace.event_count > len(trace.events):
        return None
    found = Deaths(set(), set(), {})
    for event in trace.events:
        name = event["event"]
        if name in ("kill_node", "node_dead"):
            found.nodes.add(event["node"])
        elif name in ("process_kill", "process_exit", "process_crashed"):
            found.processes.add(event["process"])
        elif name == "task_reconstruct" or (name == "task_retry" and
                                            event.get("reason") != "out of memory"):
            found.retries[event["task"]] = found.retries.get(event["task"], 0) + 1
    return found


# ====================================================== failures a user sees

# Fault spans that can kill or cut off a process (a stall or a slow node
# only delays: the GCS takes 10 s of silence to declare a node dead).
_KILLING_SPANS = frozenset({"worker_crash", "kill_worker", "node_crash", "kill_node",
                            "partition", "reset", "duplicate", "memory_kill", "node_dead",
                            "force_exit", "gcs_restart"})
_CRASHED_TASK = re.compile(r"running task .* \(([0-9a-f]{32})\) on node ([0-9a-f]+) died")
_ACTOR_ID = re.compile(r"actor ([0-9a-f]{16,})")
_NODE_MANAGER_GONE = re.compile(r"node manager of this process \((n\d+)/raylet\) is gone")


def unexplained_failure(cluster, error: BaseException) -> str | None:
    """Why the trace explains no fault error a user got (a WorkerCrashedError,
    ActorDiedError, ActorUnavailableError or NodeDiedError): the worker,
    node or actor it names was hit by no injected fault (a worker or node
    killed, its node cut off, reset, or declared dead, a memory kill, a
    force cancel, the actor killed, a GCS restart for an actor) before it.
    None when a fault explains it, or the trace kept too few events, or
    the error names nothing to check."""
    from tray import exceptions

    trace = cluster.trace
    if trace.event_count > len(trace.events):
        return None
    events = list(trace.events)
    now = cluster.clock.current_time()
    spans = [span for span in fault_spans(events, cluster.node_ids()[0])
             if span.kind in _KILLING_SPANS and span.start_s <= now]
    workers: dict[str, str] = {}  # worker id -> its node id prefix
    task_workers: dict[str, set] = {}  # task -> workers' id suffixes that started it
    submitted_s: dict[str, float] = {}
    owners: dict[str, str] = {}  # task -> the component that submitted it
    actor_workers: dict[str, set] = {}  # actor -> suffixes of its workers and owner
    actor_nodes: dict[str, set] = {}
    for event in events:
        name = event["event"]
        if name == "worker_start":
            workers[event["worker"]] = event["component"]
        elif name == "task_started":
            task_workers.setdefault(event["task"], set()).add(
                event["component"].split(":", 1)[-1])
        elif name == "task_submitted":
            submitted_s.setdefault(event["task"], event["t"])
            owners.setdefault(event["task"], event["component"])
        elif name == "actor_created":
            actor_workers.setdefault(event["actor"], set()).add(
                event["component"].split(":", 1)[-1])
        elif name == "actor_submitted":
            actor_workers.setdefault(event["actor"], set()).add(
                event["component"].split(":", 1)[-1])
        elif name == "actor_alive":
            actor_nodes.setdefault(event["actor"], set()).add(event["node"])
        elif name in ("kill_node", "node_dead", "node_fenced"):
            node = event.get("node") or event["component"]
            spans.append(FaultSpan(event["t"], event["t"], "node_dead", node=node))
        elif name == "force_exit":
            for suffix in task_workers.get(event["task"], ()):
                spans.append(FaultSpan(event["t"], event["t"], "force_exit", worker=suffix))
        elif name == "actor_kill":
            spans.append(FaultSpan(event["t"], event["t"], "actor_kill",
                                   worker=f"actor:{event['actor']}"))

    def full_ids(suffixes) -> dict:
        return {worker: node for worker, node in workers.items()
                if any(worker.endswith(suffix) for suffix in suffixes)}

    def hit(span: FaultSpan, since_s: float, worker_ids: dict, nodes: set) -> bool:
        if span.end_s < since_s:
            return False
        if span.worker is not None:
            return any(worker.startswith(span.worker) or worker.endswith(span.worker)
                       for worker in worker_ids)
        return span.node is not None and any(
            node and (node.startswith(span.node) or span.node.startswith(node))
            for node in nodes)

    cause = getattr(error, "cause", None)
    cause = cause if isinstance(cause, BaseException) else error
    text = str(cause)
    if isinstance(cause, exceptions.WorkerCrashedError):
        match = _CRASHED_TASK.search(text)
        if match is None:
            return None
        task, node = match.group(1), match.group(2)
        ran_on = full_ids(task_workers.get(task, ()))
        # (A fault on its owner's node counts: the owner's connection to the
        # worker broke there, and it gave the worker up as broken.)
        owner = owners.get(task, "")
        owner_nodes = {cluster.node_ids()[0]} if owner.startswith("driver:") else \
            set(full_ids([owner.split(":", 1)[-1]]).values()) if owner else set()
        nodes = {node, *ran_on.values(), *owner_nodes}
        since_s = submitted_s.get(task, 0.0)
        # A worker killed on the node it names may have been the one: a run
        # cut off before its body began leaves no task_started (lineage
        # chaos seed 204: a worker crash on the node the task was pushed to).
        candidates = {**ran_on, **{worker: where for worker, where in workers.items()
                                   if where and node.startswith(where)}}
        if any(hit(span, since_s, candidates, nodes) for span in spans):
            return None
        return (f"task {task[:16]} failed as if its worker died, and no injected fault hit "
                f"node {node[:8]} or a worker that ran it ({sorted(w[:8] for w in ran_on)}) "
                f"after it was submitted (t={since_s:.6f})")
    if isinstance(cause, exceptions.ActorPlacementGroupRemoved):
        return None  # the program removed the group
    if isinstance(cause, (exceptions.ActorDiedError, exceptions.ActorUnavailableError)):
        actor = getattr(cause, "actor_id", None)
        if actor is None:
            match = _ACTOR_ID.search(text)
            actor = match.group(1) if match else None
        if actor is None:
            return None
        actor = str(actor)
        hosts = full_ids(actor_workers.get(actor, ()))
        nodes = set(actor_nodes.get(actor, ())) | set(hosts.values())
        if isinstance(cause, exceptions.ActorUnavailableError):
            nodes.add(cluster.node_ids()[0])  # the caller's connection, the driver's
        for span in spans:
            if span.kind == "gcs_restart" or span.worker == f"actor:{actor}" or \
                    hit(span, 0.0, hosts, nodes):
                return None
        return (f"{type(cause).__name__} for actor {actor[:16]}, and no injected fault hit "
                f"its workers ({sorted(w[:8] for w in hosts)}) or nodes "
                f"({sorted(n[:8] for n in nodes)}), nor was it killed")
    if isinstance(cause, exceptions.NodeDiedError):
        if _NODE_MANAGER_GONE.search(text) and not any(span.kind == "node_dead"
                                                       for span in spans):
            return f"{text[:200]}, and no node died in the trace"
    return None
