"""One seed, end to end: build the cluster, run a workload under a fault
schedule, check the invariants, and report.

A seed decides everything: the cluster's shape (``{seed}:cluster``), the
workload (``{seed}:workload``), the fault schedule (``{seed}:faults``) and
the simulation itself (``tray.init(backend="sim", seed=seed)``). So
``run_seed(seed, workload, faults)`` is both the sweep's unit and the replay.

Phases of a run:

1. faults start; the workload submits its work (some pieces block in
   ``get``/``wait`` with timeouts);
2. the fault window: virtual time runs while the work proceeds;
3. liveness: faults stop, partitions heal, crashed nodes return, and every
   expected ref must resolve within ``LIVENESS_S`` of virtual time, else the
   run fails with the wait-for graph (who waits on whom), not a timeout;
4. checks: values against the reference model, execution counts, actor
   ordering;
5. quiescence: the driver drops everything and kills its actors; after
   ``QUIESCE_S`` nothing may leak (objects, leases, resources, busy workers).
"""

from __future__ import annotations

import collections
import gc
import json
import logging
import random
import re
import time
import traceback
from dataclasses import asdict, dataclass, field, replace

import numpy as np

import tray
from tray import exceptions

from . import faults as faults_module
from . import workloads

LIVENESS_S = 120.0  # virtual seconds for all outstanding work once faults stop
QUIESCE_S = 10.0  # virtual seconds for frees, lease returns and orphan reclaims to settle
WAIT_TIMEOUT_S = 5.0
# A ref `wait(fetch_local=True)` reported ready answers `get` within this.
READY_GET_S = 0.05
HANG_S = 300.0  # any single blocking driver call (a hang beyond the liveness bound)
# The whole seed, workload, liveness and quiescence together (virtual
# seconds; seeds take 12-45): a program that polls forever, each call short,
# is a hang too (tune chaos seed 89 swept on for ever; its polling costs
# about a wall-clock second per virtual one, so the bound is not an hour).
PROGRAM_S = 600.0
# The last this many warnings the cluster logged in a seed are kept with its
# result and shown with a failure (not printed as they come: a fault run logs
# the node deaths it causes on purpose).
LOG_LINES = 20
# Every component's validate_state() runs after every this many simulated
# steps (0: never); a broken invariant fails the seed at the step that broke it.
VALIDATE_EVERY_STEPS = 1

# Errors that a fault may cause, and only a fault.
FAULT_ERRORS = (exceptions.WorkerCrashedError, exceptions.ActorDiedError,
                exceptions.ActorUnavailableError, exceptions.ObjectLostError,
                exceptions.NodeDiedError)
# What a runtime that stopped retrying or restarting would raise: never the
# outcome of a call retried and restarted without limit. (Losing an object is
# another matter: a put's only copy, or an actor call's result, can go with
# its node whatever the retry budget.)
GIVING_UP_ERRORS = (exceptions.WorkerCrashedError, exceptions.ActorDiedError,
                    exceptions.ActorUnavailableError)
# This message means a live reference was freed: never a legitimate outcome.
FREED_WHILE_REFERENCED = "no reference to it remained"


class InvariantViolation(Exception):
    def __init__(self, invariant: str, message: str) -> None:
        super().__init__(f"[{invariant}] {message}")
        self.invariant = invariant
        self.message = message


@dataclass
class SeedResult:
    seed: int
    workload: str
    faults: str
    ok: bool
    digest: str
    invariant: str = ""
    message: str = ""
    schedule: list = field(default_factory=list)  # faults as applied
    virtual_time_s: float = 0.0
    tasks: int = 0
    wall_s: float = 0.0
    num_nodes: int = 0
    log: list = field(default_factory=list)  # the cluster's last warnings (LOG_LINES)

    def replay_command(self) -> str:
        return (f"tray simtest replay --seed {self.seed} --workload {self.workload} "
                f"--faults {self.faults}")

    def nox_command(self) -> str:
        return (f"nox -s simtest -- --seed {self.seed} --workload {self.workload} "
                f"--faults {self.faults}")

    def failure_dict(self) -> dict:
        return {"seed": self.seed, "workload": self.workload, "faults": self.faults,
                "invariant": self.invariant, "message": self.message, "digest": self.digest,
                "schedule": self.schedule, "log": self.log, "replay": self.replay_command()}

    def report(self) -> str:
        lines = [f"FAILED seed {self.seed} (workload {self.workload}, faults {self.faults}): "
                 f"invariant {self.invariant!r} broke",
                 *("    " + line for line in self.message.splitlines()[:60]),
                 f"  fault schedule: {'; '.join(self.schedule) or '(no faults)'}",
                 *([f"  the cluster's last {len(self.log)} warnings:"] if self.log else []),
                 *("    " + line for line in self.log),
                 f"  digest: {self.digest}",
                 f"  replay: {self.replay_command()}",
                 f"     or: {self.nox_command()}"]
        return "\n".join(lines)


# ================================================================ the model


class _Sentinel:
    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name


@dataclass
class ExpectError:
    error_class: type


@dataclass
class Expectation:
    ref: object
    expected: object
    label: str
    app_retries: bool = False  # the task retries application errors
    # Retried and restarted without limit (max_retries=-1, or an actor with
    # max_restarts=-1 and max_task_retries=-1): no fault may make it give up
    # (GIVING_UP_ERRORS), only take longer.
    unlimited: bool = False
    # The finite budget of the work behind this ref: a task's max_retries, or
    # an actor's max_restarts for its calls (None: not known or unlimited).
    # Giving up (GIVING_UP_ERRORS) needs the budget spent: so many retries
    # of the task that gave up, or restarts of the actor (``actor``: its id).
    budget: int | None = None
    actor: str | None = None
    # Only the expected outcome will do, whatever the faults (a cancelled
    # task that never started has nothing a fault could change).
    strict: bool = False


class Program:
    """What a workload sees: the seed's RNG, unique keys for execution
    counting, and ``expect`` to record the reference model's answers."""

    ANY_INT = _Sentinel("ANY_INT")
    ANY_LIST = _Sentinel("ANY_LIST")
    CANCELLED_OR_VALUE = _Sentinel("CANCELLED_OR_VALUE")

    def __init__(self, seed: int, kills: bool) -> None:
        self.rng = random.Random(f"{seed}:workload")
        self.kills = kills
        self.wait_timeout_s = WAIT_TIMEOUT_S
        self.expectations: list[Expectation] = []
        self.limits: dict[str, int] = {}  # execution key -> max executions (-1: any)
        self.exact: dict[str, int] = {}
        self.actor_calls: dict[str, dict] = {}  # actor key -> {(caller, seq): limit}
        self.actors: list = []
        self.placement_groups: list = []  # removed at quiescence
        self.laters: list = []
        self.max_restarts: dict[str, int] = {}  # actor key -> its finite max_restarts
        self.cluster = None  # the simulated cluster, once the values are checked
        self.not_ready: list[str] = []  # refs wait reported ready that get did not answer
        self.cancels: list[tuple] = []  # (key, runs when cancelled, force, task id hex)
        self.cancelled_prefixes: list[tuple] = []  # (key prefix, parent task hex)
        self.own_faults: list[str] = []  # faults the workload itself caused (kill_node)
        self._keys = 0
        self._retries = 0

    def key(self, name: str, retries: int | None = None) -> str:
        self._keys += 1
        key = f"{name}-{self._keys}"
        retries = self._retries if retries is None else retries
        self.limits[key] = -1 if retries < 0 else 1 + retries
        return key

    def task_retries(self) -> int:
        self._retries = self.rng.choice([0, 1, 3, -1] if self.kills else [0, 3])
        return self._retries

    def expect(self, ref, expected, *, label: str, app_retries: bool = False,
               unlimited: bool = False, retries: int | None = None,
               max_restarts: int | None = None, actor=None, strict: bool = False,
               **_details) -> None:
        """Record the model's answer for ``ref``. ``retries`` (the
        max_retries every task behind it has at least), or ``max_restarts``
        with the ``actor`` handle for a call, give the finite budget that
        must be spent before it may fail for a crash; ``_details``
        (actor_call=True, nested=True, ...) only document the call site."""
        budget = retries if retries is not None else max_restarts
        if budget is not None and budget < 0:
            budget = None
        actor_id = str(actor._actor_id) if actor is not None else None
        self.expectations.append(Expectation(ref, expected, label, app_retries, unlimited,
                                             budget, actor_id, strict))

    def cancelled_run(self, key: str, runs: int, force: bool, task: str | None = None) -> None:
        """``key``'s task was cancelled while its ``runs``-th run was going:
        it never runs again nor reaches its end, and with ``force`` the
        worker of that run is gone. ``task`` (its id, hex) lets the check
        count a retry that began before the cancel as the run it cancelled."""
        self.cancels.append((key, runs, force, task))

    def cancelled_children(self, prefix: str, task: str | None = None) -> None:
        """A recursive cancel: no child whose key starts with ``prefix``
        reaches its end — if the cancel found its parent (``task``, hex)
        unfinished: a parent that had ended by itself (a child lost with its
        node failed it) is not cancelled, nor are its children, as in Ray
        (mixed default seed 3261)."""
        self.cancelled_prefixes.append((prefix, task))

    def error(self, error_class) -> ExpectError:
        return ExpectError(error_class)

    def actor(self, actor_class, key: str | None = None):
        handle = actor_class.remote(key) if key is not None else actor_class.remote()
        self.actors.append(handle)
        return handle

    def actor_call(self, actor_key: str, caller: str, seq: int, max_task_retries: int) -> None:
        limit = -1 if max_task_retries < 0 else 1 + max_task_retries
        self.actor_calls.setdefault(actor_key, {})[(caller, seq)] = limit

    def check_ready(self, refs: list, label: str) -> None:
        """``wait(fetch_local=True)`` reported ``refs`` ready: ``get`` must
        answer each (a value or its error) without waiting on work or
        transfers."""
        for ref in refs:
            try:
                tray.get(ref, timeout=READY_GET_S)
            except exceptions.GetTimeoutError:
                self.not_ready.append(f"{label}: wait reported {ref!r} ready, and get did not "
                                      f"answer within {READY_GET_S} s of virtual time")
            except Exception:  # noqa: BLE001 - a ready error is ready
                pass

    def actor_restarts(self, actor_key: str, max_restarts: int) -> None:
        """The actor may come back at most ``max_restarts`` times."""
        if max_restarts >= 0:
            self.max_restarts[actor_key] = max_restarts

    def exact_executions(self, key: str, count: int) -> None:
        self.exact[key] = count

    def placement_group(self, bundles: list, strategy: str):
        from ..util import placement_group

        group = placement_group(bundles, strategy=strategy)
        self.placement_groups.append(group)
        return group

    def later(self, fn) -> None:
        self.laters.append(fn)

    def kill_node(self, node_id: str, restart_after_s: float | None) -> None:
        """A workload's own node crash, at a moment the program chose (the
        lineage workload's: after the work on that node finished; the
        autoscaler's: a scaled node mid-burst, never restarted). It is
        recorded like the injector's faults, so the checks attribute what it
        causes, and from then on the errors of killed processes are
        permitted."""
        from . import cluster as current_cluster

        cluster = current_cluster()
        restart = "never" if restart_after_s is None else f"{restart_after_s:.3f}"
        what = (f"t={cluster.clock.current_time():.3f}s node_crash "
                f"restart_after_s={restart} node={node_id[:8]} (by the workload)")
        cluster.trace.record("simtest", "fault", what=what)
        self.own_faults.append(what)
        self.kills = True
        cluster.kill_node(node_id, restart_after_s=restart_after_s)


# ================================================================== checks


def _cause(error: BaseException) -> BaseException:
    cause = getattr(error, "cause", None)
    return cause if isinstance(cause, BaseException) else error


def _is_fault_error(error: BaseException) -> bool:
    return isinstance(error, FAULT_ERRORS) or isinstance(_cause(error), FAULT_ERRORS)


def _check_value(program: Program, expectation: Expectation, value) -> None:
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


def _check_error(program: Program, expectation: Expectation, error: BaseException) -> None:
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
        return
    if program.kills and expectation.app_retries and \
            isinstance(error, workloads.FlakyError):
        return  # a crash used up a retry that the model counted on
    raise InvariantViolation("get-returns-model-value",
                             f"{where}: got the error {type(error).__name__}: {text[:600]}\n"
                             f"the reference model says {expected!r}, and the injected faults "
                             f"(kills={program.kills}) do not permit this error")


def _check_cancels(cluster, program: Program, ledger: workloads.Ledger) -> None:
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
                f"children of a task cancelled with recursive=True ran to their end: {ended}")


def _check_executions(program: Program, ledger: workloads.Ledger) -> None:
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


# ============================================================ introspection


def _components(cluster) -> list:
    return [(address, process.component)
            for address, process in sorted(cluster.processes.items())
            if process.alive and process.component is not None]


DEAD_OWNER = " (DEAD owner)"


def _dead(cluster, address) -> str:
    if not address or address == cluster.gcs_address:
        return ""
    process = cluster.processes.get(address)
    return "" if process is not None and process.alive else DEAD_OWNER


def _statistics(cluster) -> list:
    """(address, statistics) of every live simulated process's core
    component: core workers and node managers (the GCS keeps no work)."""
    found = []
    for address, component in _components(cluster):
        statistics = getattr(component, "statistics", None)
        if statistics is not None:
            found.append((address, statistics()))
    return found


def wait_for_graph(cluster) -> str:
    """Who waits on whom: pending tasks and where they are, queued lease
    requests, actor calls held back for a sequence gap."""
    from ..core.node.node_manager import NodeManagerStatistics
    from ..core.worker.core_worker import CoreWorkerStatistics

    lines = []
    for address, stats in _statistics(cluster):
        if isinstance(stats, CoreWorkerStatistics):
            for task in stats.tasks.pending:
                where = f"running on {task.pushed_to}" if task.pushed_to else \
                    "waiting for its arguments or a lease"
                if task.actor_id:
                    where = f"call #{task.seq} to actor {task.actor_id[:8]}"
                lines.append(f"{address} waits for task {task.name} {task.task_id[:12]} "
                             f"(attempt {task.attempt}): {where}")
            for queue in stats.submitter.queues:
                if queue.queued or queue.lease_requests:
                    lines.append(f"{address} has {queue.queued} queued task(s), "
                                 f"{queue.lease_requests} lease request(s) outstanding, "
                                 f"{queue.leases} lease(s)")
            for caller in stats.actor_host.callers:
                if caller.waiting:
                    lines.append(f"{address} (actor {str(stats.actor_host.actor_id)[:8]}) holds "
                                 f"calls #{list(caller.waiting)} from {caller.caller} until "
                                 f"call #{caller.next_seq} arrives")
        elif isinstance(stats, NodeManagerStatistics):
            for owner, resources in stats.leases.waiting:
                lines.append(f"{address} queues a lease for {owner}{_dead(cluster, owner)} "
                             f"needing {resources} (available {stats.leases.available})")
            for lease in stats.leases.leases:
                lines.append(f"{address} lease {lease.lease_id} (worker {lease.worker_id[:8]}, "
                             f"{lease.resources}) is held by {lease.owner}"
                             f"{_dead(cluster, lease.owner)}"
                             + (f" for actor {lease.for_actor[:8]}" if lease.for_actor else ""))
    return "\n".join(lines) or "(nothing is waiting: the work was lost)"


def leaks(cluster) -> list[str]:
    """What is still held at quiescence and should not be."""
    from ..core.node.node_manager import NodeManagerStatistics
    from ..core.worker.core_worker import CoreWorkerStatistics

    found = []
    for address, stats in _statistics(cluster):
        if isinstance(stats, CoreWorkerStatistics):
            if stats.tasks.pending:
                found.append(f"{address} still tracks {len(stats.tasks.pending)} task(s)")
            owned = [oid[:12] + (f" (borrowers {list(borrowers)})" if borrowers else "")
                     for oid, borrowers in stats.references.owned_objects]
            if owned:
                found.append(f"{address} still owns object(s) nobody references: "
                             f"{owned[:5]}")
        elif isinstance(stats, NodeManagerStatistics):
            if stats.leases.leases:
                found.append(f"{address} has lease(s) not returned: "
                             f"{[lease.lease_id for lease in stats.leases.leases]} (owners "
                             f"{sorted({lease.owner for lease in stats.leases.leases})})")
            for name, total in sorted(stats.leases.total.items()):
                available = stats.leases.available.get(name, 0.0)
                if abs(available - total) > 1e-9:
                    found.append(f"{address} has {available} of {total} {name} available")
            busy = [worker_id[:8] for worker_id in stats.workers.busy_workers]
            if busy:
                found.append(f"{address} has workers still busy: {busy}")
    for index, store in enumerate(cluster.stores):
        if f"n{index}/raylet" not in cluster.processes:
            continue
        left = store.statistics().object_ids
        if left:
            found.append(f"node {index}'s object store still holds {len(left)} object(s) "
                         f"({', '.join(o.hex()[:12] for o in left[:5])})")
    return found


# ================================================================ the run


def _root_cause(error: BaseException) -> str:
    """The first non-Cancelled leaf of an exception (group), for the summary."""
    leaves = [error]
    while leaves:
        current = leaves.pop(0)
        if isinstance(current, BaseExceptionGroup):
            leaves.extend(current.exceptions)
            continue
        if type(current).__name__ != "Cancelled":
            return f"{type(current).__name__}: {current}"
    return f"{type(error).__name__}: {error}"


def _advance(cluster, seconds: float) -> None:
    advance = getattr(cluster, "advance", None)
    if advance is not None:
        advance(seconds)
    else:
        import trio

        cluster.run(trio.sleep, seconds)


def cluster_shape(seed: int) -> dict:
    rng = random.Random(f"{seed}:cluster")
    shape = {"num_nodes": rng.choice([1, 2, 3, 3, 4]), "num_cpus": rng.choice([1, 2, 4, 4, 8])}
    shape["num_gpus"] = rng.choice([0, 0, 1, 2])  # per node (drawn last: shapes stay put)
    return shape


def run_seed(seed: int, workload: str = "mixed", faults: str = "chaos", *,
             trace_path: str | None = None, config=None,
             validate_every_steps: int = VALIDATE_EVERY_STEPS) -> SeedResult:
    """Run one seed and check every invariant; never raises for a failure
    of the system under test (the result says what broke)."""
    if workload not in workloads.WORKLOADS:
        raise ValueError(f"unknown workload {workload!r}; choose from "
                         f"{sorted(workloads.WORKLOADS)}")
    if faults not in faults_module.PROFILES:
        raise ValueError(f"unknown fault profile {faults!r}; choose from "
                         f"{sorted(faults_module.PROFILES)}")
    if tray.is_initialized():
        tray.shutdown()
    started = time.perf_counter()
    # A blocking call in the driver that waits this long in virtual time is
    # a hang (the simulator's default, a day, costs minutes of heartbeats).
    from ..backends.sim import cluster as sim_cluster

    saved_hang_timeout_s = sim_cluster.HANG_TIMEOUT_S
    sim_cluster.HANG_TIMEOUT_S = HANG_S
    log = _SeedLog()
    try:
        result = _run_seed(seed, workload, faults, trace_path, config, started,
                           validate_every_steps)
        result.log = list(log.lines)
        return result
    finally:
        log.close()
        sim_cluster.HANG_TIMEOUT_S = saved_hang_timeout_s


class _SeedLog(logging.Handler):
    """Holds the last ``LOG_LINES`` warnings of tray's loggers while a seed
    runs, in place of their usual way out (stderr, where a sweep's expected
    "node ... is dead" lines buried its progress and failures)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: collections.deque = collections.deque(maxlen=LOG_LINES)
        self._logger = logging.getLogger("tray")
        self._propagate = self._logger.propagate
        self._logger.addHandler(self)
        self._logger.propagate = False

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(f"{record.levelname} {record.name}: {record.getMessage()}")

    def close(self) -> None:
        self._logger.removeHandler(self)
        self._logger.propagate = self._propagate
        super().close()


def _run_seed(seed, workload, faults, trace_path, config, started,
              validate_every_steps) -> SeedResult:
    from ..backends.sim.cluster import SimulationTimeLimit
    from . import cluster as current_cluster

    ledger = workloads.reset_ledger()
    shape = cluster_shape(seed)
    init = dict(backend="sim", seed=seed, validate_every_steps=validate_every_steps, **shape)
    knobs = faults_module.buggify(seed, faults)
    if knobs:
        from ..core.config import Config

        config = replace(config or Config(), **knobs)
    if config is not None:
        init["config"] = config
    tray.init(**init)
    cluster = current_cluster()
    cluster.time_limit_s = cluster.clock.current_time() + PROGRAM_S
    schedule = faults_module.plan(seed, faults, faults_module.available_kinds(cluster),
                                  shape["num_nodes"])
    program = Program(seed, kills=faults_module.kills(schedule))
    injector = faults_module.Injector(cluster, seed, schedule)
    failure: InvariantViolation | None = None
    virtual_time_s = 0.0
    tasks = 0
    try:
        injector.start()
        faults_start_s = cluster.clock.current_time()
        try:
            workloads.WORKLOADS[workload](program)
            if program.not_ready:
                raise InvariantViolation("wait-ready-means-ready", "\n".join(program.not_ready))
            refs = [e.ref for e in program.expectations]
            window_end_s = max([f.at_s for f in schedule], default=0.0) + 0.01
            if refs:
                tray.wait(refs, num_returns=len(refs), timeout=window_end_s, fetch_local=False)
            del refs  # quiescence needs every ref dropped
            # Every planned fault fires, even when the work finished early.
            remaining_s = window_end_s - (cluster.clock.current_time() - faults_start_s)
            if remaining_s > 0:
                _advance(cluster, remaining_s)
            injector.stop()
            while program.laters:  # (no loop variable left holding the last one's refs)
                program.laters.pop(0)()
            _liveness_and_values(cluster, program)
            _check_executions(program, ledger)
            _check_attributed(cluster)
            held_twice = workloads.check_gpu_exclusive(ledger)
            if held_twice is not None:
                raise InvariantViolation("gpu-held-by-one-task-at-a-time", held_twice)
            _quiesce(cluster, program)
            # After quiescence: a cancelled body that was not interrupted
            # has had time to reach its end.
            _check_cancels(cluster, program, ledger)
        except InvariantViolation as violation:
            failure = violation
        except SimulationTimeLimit as error:
            cluster.time_limit_s = float("inf")  # (what follows blocks too)
            failure = InvariantViolation("no-hang", f"{error}; who waits on whom:\n"
                                         + wait_for_graph(cluster))
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as error:  # noqa: BLE001 - the run itself broke
            failure = InvariantViolation(
                "runs-without-crashing", f"the driver program raised {type(error).__name__}: "
                f"{_root_cause(error)}\n" + "".join(traceback.format_exception(error))[-4000:])
        virtual_time_s = cluster.clock.current_time()
        tasks = sum(1 for e in cluster.trace.events if e["event"] == "task_started") \
            if cluster.trace.event_count <= len(cluster.trace.events) else \
            cluster.trace.event_count // 20
        if trace_path is not None:
            write_trace(cluster, trace_path)
    finally:
        cluster.time_limit_s = float("inf")
        program.expectations.clear()
        program.actors.clear()
        program.placement_groups.clear()
        try:
            tray.shutdown()
        except Exception as error:  # noqa: BLE001
            if failure is None:
                failure = InvariantViolation("clean-shutdown",
                                             f"shutdown raised {type(error).__name__}: {error}")
    if cluster.crashes and (failure is None or failure.invariant == "no-hang"):
        lines = []
        for address, error in cluster.crashes[:5]:
            lines.append(f"{address} crashed: {type(error).__name__}: {error}")
            lines.append("".join(traceback.format_exception(error))[-2000:])
        failure = InvariantViolation("no-process-crashes", "\n".join(lines))
    if cluster.invariant_failure is not None:
        # Whatever went wrong after it, this broke first: at a known step.
        failure = InvariantViolation("component-invariants-hold",
                                     str(cluster.invariant_failure))
    from . import trace_digest

    result = SeedResult(seed=seed, workload=workload, faults=faults, ok=failure is None,
                        digest=trace_digest(), schedule=(injector.applied or
                        [f.describe() for f in schedule]) + program.own_faults +
                        [f"buggify {name}={value}" for name, value in sorted(knobs.items())],
                        virtual_time_s=round(virtual_time_s, 6), tasks=tasks,
                        wall_s=time.perf_counter() - started, num_nodes=shape["num_nodes"])
    if failure is not None:
        result.invariant, result.message = failure.invariant, failure.message
    return result


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


# ======================================================= fault attribution
#
# Counting executions against ``1 + max_retries`` lets a runtime re-run work
# for no reason as long as it stays under the budget (a duplicate push, a
# retry of a task whose worker was fine). So every extra execution must have
# a cause in the trace: the execution before it ended in an application
# error that the task retries, or a memory kill, or a fault hit a process it
# depended on while it ran (between its start and the next one's): its
# worker was killed, or its worker's node or its owner's node crashed, was
# reset, stalled, slowed or cut off by a partition. A fault on the head node
# (the GCS's and the driver's) and a GCS restart hit every node: the GCS may
# declare any node dead then, and a node declared dead fences its workers.

# A restarted GCS re-creates the actors it finds pending, and answers
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
        elif kind == "stall":
            end = start + params.get("seconds", 0.0)
        elif kind == "slow_node":
            end = end_of_faults
        elif kind == "gcs_restart":  # down, then recovering its tables and actors
            end = start + params.get("down_for_s", 0.0) + GCS_RECOVERY_S
        node = targets.get("node") or targets.get("isolated")
        spans.append(FaultSpan(start, end, kind, node=node, worker=targets.get("worker"),
                               everywhere=kind == "gcs_restart" or
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
                (next_s, _, next_attempt, _, next_submission, next_open) in \
                zip(runs, runs[1:], strict=False):
            if next_submission != submission or next_open > 1:
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


def _check_attributed(cluster) -> None:
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


def _liveness_and_values(cluster, program: Program) -> None:
    program.cluster = cluster
    deadline = cluster.clock.current_time() + LIVENESS_S
    for expectation in list(program.expectations):
        remaining = max(0.0, deadline - cluster.clock.current_time())
        try:
            value = tray.get(expectation.ref, timeout=remaining)
        except exceptions.GetTimeoutError:
            raise InvariantViolation(
                "no-hang", f"{expectation.label} ({expectation.ref!r}) did not resolve within "
                f"{LIVENESS_S} s of virtual time after the faults stopped; who waits on whom:\n"
                + wait_for_graph(cluster)) from None
        except Exception as error:  # noqa: BLE001 - the task's error, to be judged
            _check_error(program, expectation, error)
            continue
        _check_value(program, expectation, value)


def _quiesce(cluster, program: Program) -> None:
    for handle in program.actors:
        tray.kill(handle)
    from ..util import remove_placement_group

    for group in program.placement_groups:
        remove_placement_group(group)
    program.placement_groups.clear()
    program.expectations.clear()
    program.actors.clear()
    program.laters.clear()
    gc.collect()
    _advance(cluster, QUIESCE_S)
    found = leaks(cluster)
    if found:
        raise InvariantViolation("nothing-leaks-at-quiescence", "\n".join(found))


def write_trace(cluster, path: str) -> None:
    """The run's events as JSON lines (virtual time, component, event, ids)."""
    with open(path, "w", encoding="utf-8") as out:
        for event in cluster.trace.events:
            out.write(json.dumps(event, sort_keys=True, default=str))
            out.write("\n")


def result_dict(result: SeedResult) -> dict:
    return asdict(result)
