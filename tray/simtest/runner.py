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

This module runs the phases and keeps their result (``SeedResult``). The
reference model is in ``model``, the checks in ``checks`` (with the trace's
account of the faults in ``attribution``), and the wait-for graph and the
leaks of a live cluster in ``introspection``.
"""

from __future__ import annotations

import collections
import gc
import json
import logging
import random
import time
import traceback
from dataclasses import asdict, dataclass, field, replace

import tray
from tray import exceptions

from . import faults as faults_module
from . import remote_code, workloads
from .checks import (
    check_attributed,
    check_cancels,
    check_error,
    check_executions,
    check_gpu_exclusive,
    check_promises,
    check_value,
)
from .checks_actors import check_actor_deaths, check_one_incarnation
from .introspection import leaks, public_resource_view, wait_for_graph
from .invariants import InvariantViolation
from .liveness import LivenessMonitor
from .model import Program
from .stories import failure_story

LIVENESS_S = 120.0  # virtual seconds for all outstanding work once faults stop
QUIESCE_S = 10.0  # virtual seconds for frees, lease returns and orphan reclaims to settle
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
    # The story of the task or object the failure names (stories.failure_story):
    # its id as named, its length in events, and its last events as lines.
    story_of: str = ""
    story_events: int = 0
    story: list = field(default_factory=list)

    def replay_command(self) -> str:
        return (f"tray simtest replay --seed {self.seed} --workload {self.workload} "
                f"--faults {self.faults}")

    def nox_command(self) -> str:
        return (f"nox -s simtest -- --seed {self.seed} --workload {self.workload} "
                f"--faults {self.faults}")

    def failure_dict(self) -> dict:
        return {"seed": self.seed, "workload": self.workload, "faults": self.faults,
                "invariant": self.invariant, "message": self.message, "digest": self.digest,
                "schedule": self.schedule, "log": self.log, "story_of": self.story_of,
                "story": self.story, "replay": self.replay_command()}

    def report(self) -> str:
        lines = [f"FAILED seed {self.seed} (workload {self.workload}, faults {self.faults}): "
                 f"invariant {self.invariant!r} broke",
                 *("    " + line for line in self.message.splitlines()[:60]),
                 f"  fault schedule: {'; '.join(self.schedule) or '(no faults)'}",
                 *([f"  the story of {self.story_of} ({self._story_size()}):"]
                   if self.story else []),
                 *("    " + line for line in self.story),
                 *([f"  the cluster's last {len(self.log)} warnings:"] if self.log else []),
                 *("    " + line for line in self.log),
                 f"  digest: {self.digest}",
                 f"  replay: {self.replay_command()}",
                 f"     or: {self.nox_command()}"]
        return "\n".join(lines)

    def _story_size(self) -> str:
        if len(self.story) == self.story_events:
            return f"its {self.story_events} events in the trace"
        return f"the last {len(self.story)} of its {self.story_events} events in the trace"


# ================================================================ the run


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
            check_error(program, expectation, error)
            continue
        check_value(program, expectation, value)


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
    found = public_resource_view(cluster)
    if found:
        raise InvariantViolation("resources-view-at-quiescence", "\n".join(found))

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


def driver_thread_path(seed: int) -> bool:
    """Does this seed's driver take the real driver's thread path (its
    loop "in another thread": thread_inbox, thread_waits; see
    tray/backends/sim/processes.SimThreadCondition)? About half do."""
    return random.Random(f"{seed}:driver-path").random() < 0.5


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
    from ..backends.sim import engine as sim_engine

    saved_hang_timeout_s = sim_engine.HANG_TIMEOUT_S
    sim_engine.HANG_TIMEOUT_S = HANG_S
    log = _SeedLog()
    try:
        result = _run_seed(seed, workload, faults, trace_path, config, started,
                           validate_every_steps)
        result.log = list(log.lines)
        return result
    finally:
        log.close()
        sim_engine.HANG_TIMEOUT_S = saved_hang_timeout_s


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
    from ..backends.sim.engine import SimulationTimeLimit
    from . import cluster as current_cluster

    ledger = remote_code.reset_ledger()
    shape = cluster_shape(seed)
    init = dict(backend="sim", seed=seed, validate_every_steps=validate_every_steps,
                _driver_thread_path=driver_thread_path(seed), **shape)
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
    program.schedule = schedule
    injector = faults_module.Injector(cluster, seed, schedule)
    # Liveness and efficiency, in virtual time, all along (see liveness.py);
    # workloads reach it as program.liveness (expect_end).
    monitor = LivenessMonitor(cluster)
    program.liveness = monitor
    if validate_every_steps:
        monitor.install()
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
            check_executions(program, ledger)
            check_one_incarnation(cluster)
            check_attributed(cluster)
            check_promises(cluster, program, ledger)  # placement, wait's timing
            held_twice = check_gpu_exclusive(ledger)
            if held_twice is not None:
                raise InvariantViolation("gpu-never-held-past-its-capacity", held_twice)
            _quiesce(cluster, program)
            monitor.finish()
            # After quiescence: a cancelled body that was not interrupted
            # has had time to reach its end.
            check_cancels(cluster, program, ledger)
            check_actor_deaths(cluster, program)
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
        monitor.uninstall()
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
    if monitor.failure is not None:
        # Raised at the step that showed it (into whatever the driver was
        # doing: a get that reported it as its error, a workload that
        # swallowed it); whatever else failed came after.
        failure = monitor.failure
    if cluster.crashes and (failure is None or failure.invariant == "no-hang"):
        lines = []
        for address, error in cluster.crashes[:5]:
            lines.append(f"{address} crashed: {type(error).__name__}: {error}")
            lines.append("".join(traceback.format_exception(error))[-2000:])
        failure = InvariantViolation("no-process-crashes", "\n".join(lines))
    if cluster.invariant_failure is not None:
        # Whatever went wrong after it, this broke first: at a known step.
        failure = InvariantViolation(getattr(cluster.invariant_failure, "invariant",
                                             "component-invariants-hold"),
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
        # Read from the trace after the digest was taken: a story adds nothing to it.
        result.story_of, result.story_events, result.story = failure_story(
            failure.message, cluster.trace.events)
    return result


def write_trace(cluster, path: str) -> None:
    """The run's events as JSON lines (virtual time, component, event, ids)."""
    with open(path, "w", encoding="utf-8") as out:
        for event in cluster.trace.events:
            out.write(json.dumps(event, sort_keys=True, default=str))
            out.write("\n")


def result_dict(result: SeedResult) -> dict:
    return asdict(result)
