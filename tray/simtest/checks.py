"""The invariant checks of a seed: each judges what the run did against
the reference model (``model``), the ledger the user code kept
(``remote_code``) and the trace (``attribution``), and raises
``InvariantViolation`` naming the invariant that broke.

* ``check_value`` / ``check_error``: a ref's answer is the model's value,
  or an error that the faults and the work's options permit (its budget
  spent, an object lost only when it cannot be rebuilt);
* ``check_executions``: at most ``1 + max_retries`` runs, exact counts
  without crashes, actor calls at most once per retry and in order,
  restarts within ``max_restarts``;
* ``check_attributed``: every re-execution has a fault behind it;
* ``check_cancels``: what ``tray.cancel`` promised;
* ``check_gpu_exclusive``: no GPU held past its capacity (two whole-GPU
  task bodies at once, or fractions summing past one)."""

from __future__ import annotations

import re

import numpy as np

from tray import exceptions

from .attribution import deaths, spent, unattributed_executions, unexplained_failure
from .invariants import (
    FREED_WHILE_REFERENCED,
    GIVING_UP_ERRORS,
    InvariantViolation,
    _cause,
    _is_fault_error,
)
from .model import Expectation, ExpectError, Program
from .remote_code import FlakyError, Ledger


def check_value(program: Program, expectation: Expectation, value) -> None:
    expected = expectation.expected
    where = f"{expectation.label} ({expectation.ref!r})"
    if expected is Program.ANY_INT:
        ok = isinstance(value, int)
    elif expected is Program.ANY_LIST:
        ok = isinstance(value, list)
    elif expected is Program.CANCELLED_OR_VALUE:
        ok = True
    elif isinstance(expected, ExpectError):
        ok = False
    elif isinstance(expected, tuple) and expected[:1] == ("one of",):
        ok = value in expected[1:]
    elif isinstance(expected, tuple) and expected[:1] == ("int between",):
        ok = isinstance(value, int) and expected[1] <= value <= expected[2]
    elif isinstance(expected, tuple) and expected[:1] == ("array",):
        _, size, fill = expected
        ok = isinstance(value, np.ndarray) and value.shape == (size,) and \
            bool(np.all(value == fill))
        value = f"<array shape={getattr(value, 'shape', None)}>"
    else:
        ok = value == expected
    if not ok:
        raise InvariantViolation("get-returns-model-value",
                                 f"{where}: got {value!r}, the reference model says {expected!r}")


def check_error(program: Program, expectation: Expectation, error: BaseException) -> None:
    where = f"{expectation.label} ({expectation.ref!r})"
    expected = expectation.expected
    text = str(error)
    if FREED_WHILE_REFERENCED in text:
        raise InvariantViolation("no-premature-free",
                                 f"{where}: an object was freed while still referenced: "
                                 f"{type(error).__name__}: {text[:400]}")
    if isinstance(expected, ExpectError) and isinstance(error, expected.error_class):
        return
    if expected is Program.CANCELLED_OR_VALUE and \
            isinstance(error, exceptions.TaskCancelledError):
        return
    if expectation.unlimited and isinstance(_cause(error), GIVING_UP_ERRORS):
        raise InvariantViolation("unlimited-retries-never-give-up",
                                 f"{where}: got the error {type(error).__name__}: {text[:600]}\n"
                                 "its task or actor retries and restarts without limit, so no "
                                 "fault may fail it")
    _check_budget_spent(program, expectation, error, where)
    if _check_object_lost(program, error, where) and not expectation.strict:
        return  # its owner died: true whatever the schedule (see _check_object_lost)
    if program.kills and _is_fault_error(error) and not expectation.strict:
        _check_failure_explained(program, error, where)
        return
    if program.kills and expectation.app_retries and \
            isinstance(error, FlakyError):
        return  # a crash used up a retry that the model counted on
    raise InvariantViolation("get-returns-model-value",
                             f"{where}: got the error {type(error).__name__}: {text[:600]}\n"
                             f"the reference model says {expected!r}, and the injected faults "
                             f"(kills={program.kills}) do not permit this error")


def _check_failure_explained(program: Program, error: BaseException, where: str) -> None:
    """A fault error must name what a fault of the schedule hit (its
    worker, node or actor), not merely come from a run that had faults."""
    if program.cluster is None:
        return
    why = unexplained_failure(program.cluster, error)
    if why is not None:
        raise InvariantViolation("every-failure-has-a-fault-behind-it",
                                 f"{where}: got the error {type(error).__name__}: "
                                 f"{str(error)[:400]}\n{why}")


def check_cancels(cluster, program: Program, ledger: Ledger) -> None:
    """What ``tray.cancel`` promised, from inside the cancelled bodies."""
    # Why each worker died: a force cancel's worker exits (or was killed),
    # and it is not merely reaped later as idle (a gentle cancel's would be).
    # A worker killed with its node (a crash the cancel may have come too
    # late for: chaos seed 2036) is gone too, with no worker_died of its own:
    # its process's kill says so. A force cancel lost on the way would
    # leave the task running to its end, which the check above catches.
    died: dict[str, list] = {}
    killed_processes: set = set()  # worker id prefixes, as process names hold them
    for event in cluster.trace.events:
        if event["event"] == "worker_died":
            died.setdefault(event["worker"], []).append(event.get("reason", ""))
        elif event["event"] == "process_kill" and "/worker-" in event["process"]:
            killed_processes.add(event["process"].rsplit("/worker-", 1)[1])
    # A retry that had reached its worker before the cancel was sent is the
    # run the cancel interrupts, although its body had not begun when the
    # workload counted the runs (it was loading the function: default seed
    # 3240). Ray cancels the attempt that is executing; only one that
    # starts after the cancel would be a run "again".
    cancelled_s: dict[str, float] = {}
    attempts_started: dict[str, list] = {}
    for event in cluster.trace.events:
        if event["event"] == "task_cancel" and event["component"].startswith("driver:"):
            cancelled_s.setdefault(event["task"], event["t"])
        elif event["event"] == "task_started":
            attempts_started.setdefault(event["task"], []).append(event["t"])
    for key, runs, force, task in program.cancels:
        got = ledger.executions.get(key, 0)
        if task is not None and task in cancelled_s:
            runs = max(runs, sum(1 for t in attempts_started.get(task, [])
                                 if t <= cancelled_s[task]))
        if got > runs:
            raise InvariantViolation(
                "cancelled-task-never-runs-again",
                f"task {key} was cancelled during its run #{runs} and ran {got} times")
        if ledger.executions.get(f"{key}:end"):
            raise InvariantViolation(
                "cancelled-task-is-interrupted",
                f"task {key}, cancelled while running (force={force}), ran to its end")
        # (The worker of the cancelled run, if its body began.)
        workers = ledger.workers.get(key, [])
        worker = workers[runs - 1] if len(workers) >= runs else None
        reasons = died.get(worker, [])
        killed_with_node = worker is not None and not reasons and \
            any(worker.startswith(prefix) for prefix in killed_processes)
        if force and worker is not None and cluster.trace.event_count <= \
                len(cluster.trace.events) and not killed_with_node and \
                not any(not reason.startswith("idle") for reason in reasons):
            raise InvariantViolation(
                "force-cancel-kills-the-worker",
                f"task {key} was cancelled with force=True, and worker {worker[:12]} that "
                f"ran it did not exit ({'reaped as idle later' if reasons else 'it lives on'})")
    for prefix, task in program.cancelled_prefixes:
        if task is not None and task not in cancelled_s:
            continue  # it had ended before the cancel: nothing was cancelled
        ended = sorted(key for key in ledger.executions
                       if key.startswith(prefix) and key.endswith(":end"))
        if ended:
            raise InvariantViolation(
                "recursive-cancel-cancels-children",
                f"descendants of a task cancelled with recursive=True ran to their end: {ended}")
    # A plain cancel (recursive=False) cancels the task alone: none of its
    # children is cancelled (whatever the faults do to them otherwise).
    cancel_events = {str(event["task"]) for event in cluster.trace.events
                     if event["event"] == "task_cancel"}
    for prefix, _task in program.uncancelled_prefixes:
        hit = sorted(key for key, ids in ledger.tasks.items() if key.startswith(prefix)
                     and any(task_id in cancel_events for task_id in ids))
        if hit:
            raise InvariantViolation(
                "plain-cancel-leaves-children-alone",
                f"children of a task cancelled with recursive=False were cancelled: {hit}")


def check_executions(program: Program, ledger: Ledger) -> None:
    for key, limit in sorted(program.limits.items()):
        count = ledger.executions.get(key, 0)
        if limit >= 0 and count > limit:
            raise InvariantViolation(
                "task-executes-at-most-1+max_retries",
                f"task {key} executed {count} times; its max_retries allows {limit}")
    for key, count in sorted(program.exact.items()):
        got = ledger.executions.get(key, 0)
        if got != count:
            raise InvariantViolation(
                "retry-count-exact", f"task {key} executed {got} times; without crashes its "
                f"retry policy gives exactly {count}")
    for actor_key, calls in sorted(program.actor_calls.items()):
        for (caller, seq), limit in sorted(calls.items()):
            count = ledger.executions.get(f"{actor_key}:{caller}:{seq}", 0)
            if limit >= 0 and count > limit:
                raise InvariantViolation(
                    "actor-call-executes-at-most-1+max_task_retries",
                    f"actor {actor_key}: call #{seq} from {caller} executed {count} times; "
                    f"max_task_retries allows {limit}")
    for actor_key, max_restarts in sorted(program.max_restarts.items()):
        # A constructor that ran on a worker that died before the actor was
        # ALIVE is a rescheduled creation, not a restart: count the
        # incarnations that served calls.
        served = {incarnation for incarnation, _, _ in ledger.actor_log.get(actor_key, [])}
        if len(served) > 1 + max_restarts:
            raise InvariantViolation(
                "actor-restarts-at-most-max_restarts",
                f"actor {actor_key} served calls in {len(served)} incarnations "
                f"{sorted(served)}; max_restarts={max_restarts} allows {1 + max_restarts}")
    for actor_key in sorted(program.actor_calls):
        last: dict = {}
        for incarnation, caller, seq in ledger.actor_log.get(actor_key, []):
            previous = last.get((incarnation, caller))
            if previous is not None and seq <= previous:
                log = [f"{c}#{s}@{i}" for i, c, s in ledger.actor_log[actor_key]]
                raise InvariantViolation(
                    "actor-calls-in-submission-order",
                    f"actor {actor_key} (incarnation {incarnation}) ran call #{seq} from "
                    f"{caller} after call #{previous}; execution log: {' '.join(log)}")
            last[(incarnation, caller)] = seq


def check_attributed(cluster) -> None:
    found = unattributed_executions(cluster)
    if found:
        raise InvariantViolation("every-re-execution-has-a-fault-behind-it",
                                 "\n".join(found[:10]))


_GAVE_UP_TASK = re.compile(r"running task \S+ \(([0-9a-f]+)\)")


def _check_budget_spent(program: Program, expectation: Expectation, error: BaseException,
                        where: str) -> None:
    """A crash may fail work with a finite budget only once the budget is
    spent: the task that gave up (named in the error) retried ``budget``
    times, the actor restarted ``max_restarts`` times (or was killed)."""
    if expectation.budget is None or program.cluster is None:
        return
    # Read from the trace now, not once the faults stopped: the error may
    # have come after, with a retry spent since (wait seed 300: a retry and
    # the failure of the retried attempt at the instant the faults stopped).
    cause, ledger = _cause(error), spent(program.cluster)
    if ledger is None:
        return
    if isinstance(cause, exceptions.WorkerCrashedError):
        match = _GAVE_UP_TASK.search(str(cause))
        if match is None:
            return
        used = ledger.retries.get(match.group(1), 0)
        what = f"task {match.group(1)} gave up after {used} retries"
    elif isinstance(cause, exceptions.ActorDiedError) and expectation.actor is not None:
        if expectation.actor in ledger.killed:
            return
        used = ledger.restarts.get(expectation.actor, 0)
        what = f"its actor died for good after {used} restarts"
    else:
        return
    if used < expectation.budget:
        raise InvariantViolation(
            "gives-up-only-when-the-budget-is-spent",
            f"{where}: got the error {type(error).__name__}: {str(error)[:600]}\n"
            f"{what}, and its budget is {expectation.budget}")


_LOST_WITH = re.compile(r"lost with node\(s\) \[([^\]]*)\]")
_OWNER_DIED = re.compile(r"\(([^()\s]+)\) died")
_RETRIES_USED = re.compile(r"object ([0-9a-f]+) \(a result of task .*max_retries=(-?\d+)")


def _check_object_lost(program: Program, error: BaseException, where: str) -> bool:
    """An object may be reported lost only when it is: every copy was on
    nodes that died, and it cannot be re-created (a put; a task result whose
    task has no retries left, per the trace's runs of it; an actor call's
    result, which tray does not re-create; lineage evicted for capacity);
    its owner died for ``OwnerDiedError``. Never because an argument of its
    task was freed: lineage keeps what it needs.

    True for an ``OwnerDiedError`` whose owner the trace shows dead, which
    the caller accepts whatever the fault schedule: a worker that owns refs
    (the ``returns`` workload's ``make_refs``: the puts inside its result)
    can die without a killing fault in the schedule, by a force cancel of a
    later task it ran (default seeds 2108, 2397), or as a duplicate actor
    worker a restarted GCS gives up (seed 2951). Ray does not recover an
    object whose owner died (its docs, "Object fault tolerance": recovering
    from owner failure is not supported, and ``get`` raises
    ``OwnerDiedError``). An owner reaped as idle while it owned referenced
    objects is a bug, though: a worker that owns objects in scope refuses to
    exit idle, as Ray's does."""
    cause = _cause(error)
    if not isinstance(cause, exceptions.ObjectLostError) or program.cluster is None:
        return False
    found = deaths(program.cluster)  # now: the gets themselves re-run tasks
    if found is None:
        return False
    text = str(cause)

    def wrong(why: str) -> None:
        raise InvariantViolation("object-lost-only-when-it-cannot-be-rebuilt",
                                 f"{where}: got the error {type(error).__name__}: "
                                 f"{str(error)[:600]}\n{why}")

    if isinstance(cause, exceptions.OwnerDiedError):
        match = _OWNER_DIED.search(text)
        if match is None:
            return False
        owner = match.group(1)
        if owner not in found.processes:
            wrong(f"its owner {owner} never died (the trace shows no kill or exit)")
        prefix = owner.rsplit("/worker-", 1)[1] if "/worker-" in owner else None
        reasons = [event.get("reason", "") for event in program.cluster.trace.events
                   if prefix is not None and event["event"] == "worker_died"
                   and event["worker"].startswith(prefix)]
        if reasons and all(reason.startswith("idle") for reason in reasons):
            wrong(f"its owner {owner} was reaped as idle while it owned a referenced object")
        return True
    match = _LOST_WITH.search(text)
    if match is None:
        return False  # (a freed object: the no-premature-free check's)
    nodes = [node.strip(" '\"") for node in match.group(1).split(",") if node.strip()]
    alive = [node for node in nodes if node not in found.nodes]
    if alive:
        wrong(f"node(s) {alive} that it names as lost never died")
    if "was freed" in text:
        wrong("an argument of its task was freed, but the lineage of a referenced object "
              "keeps its arguments")
    match = _RETRIES_USED.search(text)
    if "retries are used up" in text and match is not None:
        budget = int(match.group(2))
        used = found.retries.get(match.group(1)[:32], 0)
        if budget < 0 or used < budget:
            wrong(f"its task was retried or re-run {used} time(s) by the trace, and "
                  f"max_retries={budget}: it can still be re-created")
    return False


def check_gpu_exclusive(ledger: Ledger) -> str | None:
    """Why the ledger shows a GPU held past its capacity at some moment —
    two whole-GPU tasks at once, or fractions summing past one — or None."""
    for (node_id, gpu), spans in sorted(ledger.gpu_spans.items()):
        # Ends before starts at the same instant: a device handed on.
        events = sorted([(start, 1, amount, start, end) for start, end, amount in spans] +
                        [(end, 0, -amount, start, end) for start, end, amount in spans])
        held, holding = 0.0, []
        for _at, _kind, change, start, end in events:
            held += change
            if change > 0:
                holding.append((start, end, change))
            else:
                holding.remove((start, end, -change))
            if held > 1.0 + 1e-9:
                spans_text = ", ".join(f"{a:g} of it [{s0:.6f}, {s1:.6f})"
                                       for s0, s1, a in holding)
                return (f"GPU {gpu} of node {node_id[:8]} was held past its capacity "
                        f"({held:g} at once): {spans_text}")
    return None


# ============================================================ wait's timing

# How long after the num_returns-th ref became ready (its task finished, in
# the driver's trace) a wait may still be waiting: the driver wakes in the
# same instant of virtual time, give or take its own scheduling (its thread
# path hands the answer over through the loop).
WAIT_RETURN_S = 0.02
_EPSILON_S = 1e-6


def _finished_at(cluster) -> dict:
    """task hex -> the virtual time the driver marked it finished (its
    results ready: a value or the error)."""
    found: dict = {}
    for event in cluster.trace.events:
        if event["event"] == "task_finished" and event["component"].startswith("driver:"):
            found.setdefault(str(event["task"]), event["t"])
    return found


def check_waits(cluster, program: Program) -> None:
    """What ``tray.wait`` promised for every call the workload timed
    (``Program.timed_wait``), as Ray's ``ray.wait`` documents it:

    * it returns ``(ready, pending)``: every ref once, each list in the order
      given, at most ``num_returns`` ready (``wait-returns-refs-in-order``);
    * it returns with fewer than ``num_returns`` ready only once its
      timeout passed, never with ``timeout=None`` (``wait-never-returns-early``);
    * for small results (ready in the driver the instant their task
      finished, while results that small are inlined): it returns within ``WAIT_RETURN_S`` once ``num_returns``
      were ready (``wait-returns-once-enough-are-ready``), and what it
      returns is the first of them in the order given, as many as it asked
      for or as were ready (``wait-returns-the-first-ready-refs``)."""
    finished = _finished_at(cluster) if cluster.trace.event_count <= \
        len(cluster.trace.events) else None
    # Small results live in the driver only while they are inlined (chaos
    # may set the limit to 0: then they live in a node's store, and can be
    # lost with it and rebuilt, ready again later).
    inline_results = getattr(getattr(cluster, "config", None), "inline_object_max_bytes",
                             0) >= 1024
    for call in program.waits:
        where = (f"{call.label}: wait(num_returns={call.num_returns}, timeout={call.timeout}, "
                 f"fetch_local={call.fetch_local}) over {len(call.tasks)} refs, called at "
                 f"t={call.started_s:.6f}, returned at t={call.returned_s:.6f} with ready "
                 f"positions {call.ready}, pending {call.pending}")
        positions = call.ready + call.pending
        if sorted(positions) != list(range(len(call.tasks))) or \
                call.ready != sorted(call.ready) or call.pending != sorted(call.pending) or \
                len(call.ready) > call.num_returns:
            raise InvariantViolation("wait-returns-refs-in-order",
                                     f"{where}: not every ref once, each list in the order "
                                     f"given, at most num_returns ready")
        waited = call.returned_s - call.started_s
        if len(call.ready) < call.num_returns and \
                (call.timeout is None or waited < call.timeout - _EPSILON_S):
            raise InvariantViolation("wait-never-returns-early",
                                     f"{where}: it returned {len(call.ready)} ready of the "
                                     f"{call.num_returns} it asked for after {waited:.6f} s, "
                                     f"before its timeout")
        if not call.inline or not inline_results or finished is None:
            continue
        ready_s = sorted(finished[task] for task in call.tasks if task in finished)
        if len(ready_s) >= call.num_returns:
            enough_s = max(call.started_s, ready_s[call.num_returns - 1])
            if call.returned_s > enough_s + WAIT_RETURN_S:
                raise InvariantViolation(
                    "wait-returns-once-enough-are-ready",
                    f"{where}: {call.num_returns} of its refs were ready at t={enough_s:.6f} "
                    f"(their tasks finished), and it returned "
                    f"{call.returned_s - enough_s:.6f} s later")
        for position, task in enumerate(call.tasks):
            at = finished.get(task)
            if position in call.ready:
                if at is None or at > call.returned_s + _EPSILON_S:
                    raise InvariantViolation(
                        "wait-returns-the-first-ready-refs",
                        f"{where}: it returned position {position} ready, and its task had "
                        f"not finished")
            elif at is not None and at <= call.returned_s - WAIT_RETURN_S and \
                    (len(call.ready) < call.num_returns or max(call.ready) > position):
                raise InvariantViolation(
                    "wait-returns-the-first-ready-refs",
                    f"{where}: position {position} was ready since t={at:.6f} and it "
                    f"returned it pending, although it returned "
                    f"{'fewer than num_returns' if len(call.ready) < call.num_returns else 'a later position'} ready")


# ============================================================ placement


def _node_faults(cluster) -> list:
    """(virtual time, node id prefix) of every fault that killed a node, cut
    it off or declared it dead (a soft affinity may leave such a node)."""
    found = []
    for event in cluster.trace.events:
        name = event["event"]
        if name in ("kill_node", "node_dead", "node_fenced", "node_died"):
            found.append((event["t"], str(event.get("node") or event["component"])[:8]))
        elif name == "fault" and "node=" in str(event.get("what", "")):
            found.append((event["t"], str(event["what"]).split("node=", 1)[1][:8]))
        elif event["component"] == "fault" and name in ("partition", "stall", "slow_node"):
            for value in event.values():
                if isinstance(value, str) and re.fullmatch(r"[0-9a-f]{8,}", value):
                    found.append((event["t"], value[:8]))
    return found


def _group_placements(cluster, program: Program) -> dict:
    """placement group hex -> [(virtual time, node prefix, bundle indexes)]
    of its bundles' commits, and checks each group's strategy as it goes:
    STRICT_SPREAD never puts two of its bundles on one node, STRICT_PACK
    keeps all of them on one (``placement-group-strategy-honoured``)."""
    commits: dict = {}
    current: dict = {}  # pg -> {index: node prefix}
    for event in cluster.trace.events:
        name = event["event"]
        if name == "node_dead":
            dead = str(event["node"])[:8]
            for bundles in current.values():
                for index in [i for i, node in bundles.items() if node == dead]:
                    del bundles[index]
        elif name == "placement_group_removed":
            current.pop(str(event["pg"]), None)
        elif name in ("bundles_released", "bundle_reclaimed"):
            bundles = current.get(str(event["pg"]), {})
            for index in event.get("bundles") or [event.get("bundle")]:
                if bundles.get(index) == event["component"][:8]:
                    del bundles[index]
        elif name == "bundles_committed":
            pg, node = str(event["pg"]), event["component"][:8]
            commits.setdefault(pg, []).append((event["t"], node, list(event["bundles"])))
            bundles = current.setdefault(pg, {})
            for index in event["bundles"]:
                bundles[index] = node
            strategy = program.group_strategies.get(pg)
            nodes = list(bundles.values())
            if (strategy == "STRICT_SPREAD" and len(set(nodes)) < len(nodes)) or \
                    (strategy == "STRICT_PACK" and len(set(nodes)) > 1):
                raise InvariantViolation(
                    "placement-group-strategy-honoured",
                    f"placement group {pg} ({strategy}) has its bundles on nodes "
                    f"{dict(sorted(bundles.items()))} at t={event['t']:.6f}")
    return commits


def check_placements(cluster, program: Program, ledger: Ledger) -> None:
    """Where work ran, against its scheduling strategy (Ray's documented
    semantics), from the nodes the bodies saw (``Ledger.where``):

    * in a placement group: on a node that held its bundle (any of the
      group's for index -1) by then (``placement-group-work-runs-in-its-bundle``);
    * NodeAffinity, hard: on that node only; soft: there, unless that node
      had died or been cut off by then (the tasks need no resources, so
      the node always has room) (``node-affinity-honoured``);
    * DEFAULT, from the driver, needing no CPU, submitted while the
      driver's node was idle: there, unless that node granted a lease or
      took a bundle before it ran (``default-strategy-runs-locally-first``);
    * SPREAD, a batch of tasks one after the other that need no resources
      (so every node has room): each of the nodes alive throughout runs
      its share, no node more than one past an even share while another
      alive node ran none (``spread-tasks-spread-over-the-nodes``).

    Nothing is judged once the trace dropped events (it cannot say where
    bundles were)."""
    if not program.placements or cluster.trace.event_count > len(cluster.trace.events):
        return
    commits = _group_placements(cluster, program)
    faults = _node_faults(cluster)
    batches: dict = {}
    for key, kind, target, detail in program.placements:
        runs = ledger.where.get(key, [])
        if kind == "group":
            for node, at in runs:
                held = [(t, n, indexes) for t, n, indexes in commits.get(target, [])
                        if t <= at and node.startswith(n) and (detail < 0 or detail in indexes)]
                if not held:
                    raise InvariantViolation(
                        "placement-group-work-runs-in-its-bundle",
                        f"{key} (placement group {target}, bundle {detail}) ran on node "
                        f"{node[:8]} at t={at:.6f}; the group's bundles were committed on "
                        f"{[(round(t, 6), n, i) for t, n, i in commits.get(target, [])]}")
        elif kind == "node":
            for node, at in runs:
                if node == target:
                    continue
                if detail and any(n == target[:8] and t <= at for t, n in faults):
                    continue
                raise InvariantViolation(
                    "node-affinity-honoured",
                    f"{key}, pinned to node {target[:8]} (soft={detail}), ran on node "
                    f"{node[:8]} at t={at:.6f}" + ("" if not detail else
                                                    "; that node was alive, with room"))
        elif kind == "local" and runs:
            node, at = runs[0]
            busy = [event for event in cluster.trace.events if detail <= event["t"] <= at
                    and event["component"] == target[:8]
                    and event["event"] in ("lease_granted", "bundles_committed")]
            if node != target and not busy:
                raise InvariantViolation(
                    "default-strategy-runs-locally-first",
                    f"{key} (DEFAULT, from the driver, needing no CPU) ran on node "
                    f"{node[:8]} at t={at:.6f}; the driver's node {target[:8]} was idle when "
                    f"it was submitted (t={detail:.6f}) and granted nothing since")
        elif kind == "spread" and runs:
            batches.setdefault(target, (detail, []))[1].append(runs[0])
    for _batch, (alive, runs) in sorted(batches.items()):
        start, end = min(at for _, at in runs), max(at for _, at in runs)
        steady = [node for node in alive
                  if not any(n == node[:8] and t <= end for t, n in faults)]
        if len(steady) < 2:
            continue
        counts = {node: 0 for node in steady}
        for node, _ in runs:
            if node in counts:
                counts[node] += 1
        share = -(-len(runs) // len(alive))
        if min(counts.values()) == 0 and max(counts.values()) > share + 1:
            raise InvariantViolation(
                "spread-tasks-spread-over-the-nodes",
                f"{len(runs)} SPREAD tasks of one driver, one after the other, needing no "
                f"resources, ran {dict((n[:8], c) for n, c in counts.items())} on the nodes "
                f"alive throughout (t={start:.6f}..{end:.6f}; {len(alive)} alive at the start)")


def check_promises(cluster, program: Program, ledger: Ledger) -> None:
    """The checks of where work ran and when ``wait`` returned."""
    check_waits(cluster, program)
    check_placements(cluster, program, ledger)
