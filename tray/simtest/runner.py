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

import gc
import json
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

    def replay_command(self) -> str:
        return (f"tray simtest replay --seed {self.seed} --workload {self.workload} "
                f"--faults {self.faults}")

    def nox_command(self) -> str:
        return (f"nox -s simtest -- --seed {self.seed} --workload {self.workload} "
                f"--faults {self.faults}")

    def failure_dict(self) -> dict:
        return {"seed": self.seed, "workload": self.workload, "faults": self.faults,
                "invariant": self.invariant, "message": self.message, "digest": self.digest,
                "schedule": self.schedule, "replay": self.replay_command()}

    def report(self) -> str:
        lines = [f"FAILED seed {self.seed} (workload {self.workload}, faults {self.faults}): "
                 f"invariant {self.invariant!r} broke",
                 *("    " + line for line in self.message.splitlines()[:60]),
                 f"  fault schedule: {'; '.join(self.schedule) or '(no faults)'}",
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
        # From the trace once the faults stopped (None: it kept too few
        # events to say): retries spent per task and restarts per actor
        # (hex ids), and the actors killed on purpose.
        self.spent: Spent | None = None
        self.not_ready: list[str] = []  # refs wait reported ready that get did not answer
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
               max_restarts: int | None = None, actor=None, **_details) -> None:
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
                                             budget, actor_id))

    def error(self, error_class: type) -> ExpectError:
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
    if program.kills and _is_fault_error(error):
        return
    if program.kills and expectation.app_retries and \
            isinstance(error, workloads.FlakyError):
        return  # a crash used up a retry that the model counted on
    raise InvariantViolation("get-returns-model-value",
                             f"{where}: got the error {type(error).__name__}: {text[:600]}\n"
                             f"the reference model says {expected!r}, and the injected faults "
                             f"(kills={program.kills}) do not permit this error")


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
    try:
        return _run_seed(seed, workload, faults, trace_path, config, started,
                         validate_every_steps)
    finally:
        sim_cluster.HANG_TIMEOUT_S = saved_hang_timeout_s


def _run_seed(seed, workload, faults, trace_path, config, started,
              validate_every_steps) -> SeedResult:
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
            held_twice = workloads.check_gpu_exclusive(ledger)
            if held_twice is not None:
                raise InvariantViolation("gpu-held-by-one-task-at-a-time", held_twice)
            _quiesce(cluster, program)
        except InvariantViolation as violation:
            failure = violation
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
                        [f.describe() for f in schedule]) +
                        [f"buggify {name}={value}" for name, value in sorted(knobs.items())],
                        virtual_time_s=round(virtual_time_s, 6), tasks=tasks,
                        wall_s=time.perf_counter() - started, num_nodes=shape["num_nodes"])
    if failure is not None:
        result.invariant, result.message = failure.invariant, failure.message
    return result


@dataclass
class Spent:
    """What the trace says was spent, by hex id."""

    retries: dict  # task -> retries spent (worker deaths and exceptions, not memory kills)
    restarts: dict  # actor -> restarts
    killed: set  # actors killed by tray.kill


def spent(cluster) -> Spent | None:
    trace = cluster.trace
    if trace.event_count > len(trace.events):
        return None
    result = Spent({}, {}, set())
    for event in trace.events:
        name = event["event"]
        if name == "task_retry" and event.get("reason") != "out of memory":
            result.retries[event["task"]] = result.retries.get(event["task"], 0) + 1
        elif name == "actor_restarting":
            result.restarts[event["actor"]] = result.restarts.get(event["actor"], 0) + 1
        elif name == "actor_kill":
            result.killed.add(event["actor"])
    return result


_GAVE_UP_TASK = re.compile(r"running task \S+ \(([0-9a-f]+)\)")


def _check_budget_spent(program: Program, expectation: Expectation, error: BaseException,
                        where: str) -> None:
    """A crash may fail work with a finite budget only once the budget is
    spent: the task that gave up (named in the error) retried ``budget``
    times, the actor restarted ``max_restarts`` times (or was killed)."""
    cause, ledger = _cause(error), program.spent
    if expectation.budget is None or ledger is None:
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


def _liveness_and_values(cluster, program: Program) -> None:
    program.spent = spent(cluster)
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
