"""Workload pieces over lifecycles the other pieces rarely reach: a
restartable actor crashed with calls in flight (``inflight``), and workers
recycled mid-run (``recycle``: ``max_calls``, idle exit).

``inflight``: an actor (``remote_code.Counter``) with restarts, called in
bursts of slow calls, some with ``max_task_retries=0`` and some retried;
the workload kills the actor's process mid-burst, once or more. Judged
(``inflight-calls-fail-or-retry-by-their-budget``) as tray documents it
(actor_task_submitter: a call cut off is re-sent within
``max_task_retries``, else fails with ``ActorDiedError`` or
``ActorUnavailableError``; a call that finds nothing listening waits for
the next incarnation, it cannot have run):

* a call with ``max_task_retries=0`` sent to an incarnation either ran
  there or fails; it never runs on a later one, and never twice;
* a call made after a crash runs on a later incarnation and succeeds while
  restarts remain (``ActorDiedError`` once they are spent);
* a retried call in flight at a crash comes back with its value (within
  its budget), and every value is exact and names the incarnation whose
  log holds the call's end.

``recycle``: tasks whose function has ``max_calls`` (1, 2, 3) and tasks
without, on fractional CPUs (more workers than CPUs, so idle ones are
reaped), each returning its value and refs it put (owned by its worker,
borrowed by the driver); the driver waits around the idle timeout and
sends more, so workers are leased, used, idle and asked to exit at once;
then it reads every result. Checked: values exact (the refs too, unless
their owner, a worker that retired for ``max_calls``, is gone:
``OwnerDiedError``, never for one reaped as idle, which refuses to exit
while it owns referenced objects), and ``max-calls-worker-retires-after-
exactly-n-calls``: a worker runs at most N calls of a ``max_calls=N``
function, runs nothing after its N-th, and one that exits by itself had
run exactly N."""

from __future__ import annotations

import time

import tray
from tray import exceptions

from . import remote_code
from .invariants import InvariantViolation
from .model import Shaped

_DIED = (exceptions.ActorDiedError, exceptions.ActorUnavailableError)
SEND_S = 0.02  # a call made this long before a crash was sent to the old process


def inflight(program) -> None:
    rng = program.rng
    sim = tray.simtest.cluster()
    key = program.key("counter", retries=-1)
    max_restarts = rng.choice([-1, -1, 1, 2])
    default_retries = rng.choice([0, 0, 1, -1])
    counter = program.actor(remote_code.Counter.options(
        max_restarts=max_restarts, max_task_retries=default_retries, num_cpus=0), key)
    program.actor_restarts(key, max_restarts)
    crashes = rng.randint(1, 2) if max_restarts < 0 else rng.randint(1, max_restarts + 1)
    calls = []  # [round, seq, x, retries, ref, submitted at]
    rounds = []  # [incarnation seen by the round's probe (None: failed), crash time or None]
    seq = 0
    for round_index in range(crashes + 1):
        # The probe: the actor is alive (or dead for good) before the burst.
        x = rng.randint(1, 50)
        probe = counter.step.options(max_task_retries=-1 if max_restarts < 0 else 0).remote(
            "driver", seq, x, 0.0)
        program.actor_call(key, "driver", seq, -1 if max_restarts < 0 else 0)
        try:
            incarnation = tray.get(probe, timeout=60.0)[1]
        except Exception:  # noqa: BLE001 - judged with the calls (dead for good, a fault)
            incarnation = None
        calls.append([round_index, seq, x, -1 if max_restarts < 0 else 0, probe,
                      sim.clock.current_time()])
        seq += 1
        rounds.append([incarnation, None])
        for _ in range(rng.randint(2, 6)):
            x = rng.randint(1, 50)
            retries = rng.choice([default_retries, 0, 0, 1, -1])
            ref = counter.step.options(max_task_retries=retries).remote(
                "driver", seq, x, rng.uniform(0.02, 0.15))
            program.actor_call(key, "driver", seq, retries)
            calls.append([round_index, seq, x, retries, ref, sim.clock.current_time()])
            seq += 1
        if round_index == crashes:
            break
        time.sleep(SEND_S + rng.random() * 0.2)
        try:
            if sim.kill_actor_worker(counter):
                rounds[-1][1] = sim.clock.current_time()
        except tray.exceptions.TrayError:
            pass  # the GCS is restarting: no crash this round
        time.sleep(rng.choice([0.0, rng.random() * 0.05, rng.random() * 0.5]))
    program.later(lambda: _judge_inflight(program, sim, key, max_restarts, calls, rounds))


def _judge_inflight(program, sim, key, max_restarts, calls, rounds) -> None:
    from .checks import check_error
    from .model import Expectation

    ledger = remote_code.LEDGER
    refs = [call[4] for call in calls]
    tray.wait(refs, num_returns=len(refs), timeout=120.0, fetch_local=False)
    del refs
    ran_in: dict = {}  # seq -> incarnations that began it
    for incarnation, caller, seq in ledger.actor_log.get(key, []):
        if caller == "driver":
            ran_in.setdefault(seq, []).append(incarnation)
    crash_times = [crash for _, crash in rounds if crash is not None]
    deadline = sim.clock.current_time() + 120.0
    for round_index, seq, x, retries, ref, submitted in calls:
        label = (f"actor {key}: call #{seq} (round {round_index}, "
                 f"max_task_retries={retries}, made at t={submitted:.4f})")
        incarnation = rounds[round_index][0]
        crash = rounds[round_index][1]
        in_flight = crash is not None and submitted <= crash - SEND_S
        later_crashes = [t for t in crash_times if t >= submitted]
        try:
            value = tray.get(ref, timeout=max(0.0, deadline - sim.clock.current_time()))
        except exceptions.GetTimeoutError:
            raise InvariantViolation("no-hang", f"{label} did not resolve within 120 s of "
                                     "virtual time after the faults stopped") from None
        except Exception as error:  # noqa: BLE001 - judged below
            if program.kills:
                check_error(program, Expectation(ref, (x * x, "any"), label,
                                                 budget=max_restarts if max_restarts >= 0
                                                 else None), error)
                continue
            spent = max_restarts >= 0 and len(crash_times) > max_restarts and \
                submitted >= crash_times[max_restarts] - SEND_S
            may_fail = isinstance(error, _DIED) and (
                spent or (later_crashes and retries == 0) or
                (later_crashes and retries > 0 and len(later_crashes) > retries) or
                (later_crashes and max_restarts >= 0 and len(crash_times) > max_restarts))
            if not may_fail:
                raise InvariantViolation(
                    "inflight-calls-fail-or-retry-by-their-budget",
                    f"{label} failed with {type(error).__name__}: {str(error)[:400]}; "
                    f"the workload's crashes after it was made: {len(later_crashes)}, its "
                    f"retries {retries}, the actor's max_restarts {max_restarts}") from None
            if spent and not isinstance(error, exceptions.ActorDiedError):
                raise InvariantViolation(
                    "inflight-calls-fail-or-retry-by-their-budget",
                    f"{label}, made after the actor's restarts were spent, failed with "
                    f"{type(error).__name__}, not ActorDiedError: {str(error)[:300]}") from None
            if retries == 0 and len(ran_in.get(seq, [])) > 0 and in_flight and \
                    incarnation is not None and max(ran_in[seq]) > incarnation:
                raise InvariantViolation(
                    "inflight-calls-fail-or-retry-by-their-budget",
                    f"{label} was in flight to incarnation {incarnation} at its crash, "
                    f"failed, and ran on incarnation {max(ran_in[seq])} after") from None
            continue
        if not isinstance(value, tuple) or value[0] != x * x:
            raise InvariantViolation("get-returns-model-value",
                                     f"{label}: got {value!r}, the model says ({x * x}, "
                                     "the incarnation that ran it)")
        ended = ledger.executions.get(f"{key}:driver:{seq}:end", 0)
        if value[1] not in ran_in.get(seq, []) or not ended:
            raise InvariantViolation(
                "get-returns-model-value",
                f"{label}: its value names incarnation {value[1]}, and the actor's log shows "
                f"it begun in {ran_in.get(seq, [])} and ended {ended} time(s)")
        if program.kills or incarnation is None:
            continue
        if retries == 0 and in_flight and value[1] > incarnation:
            raise InvariantViolation(
                "inflight-calls-fail-or-retry-by-their-budget",
                f"{label} was sent to incarnation {incarnation} before the workload crashed "
                f"it at t={crash:.4f}, and ran on incarnation {value[1]}: a call with "
                "max_task_retries=0 is never sent again")
        if value[1] < incarnation:
            raise InvariantViolation(
                "inflight-calls-fail-or-retry-by-their-budget",
                f"{label} was made after the actor came back as incarnation {incarnation}, "
                f"and ran on incarnation {value[1]}")


# ================================================================ recycle


def recycle(program) -> None:
    rng = program.rng
    sim = tray.simtest.cluster()
    idle_s = sim.config.idle_worker_timeout_s
    cpus = rng.choice([0.25, 0.5, 1])
    results = []  # (key, x, boxes, ref)
    for _wave in range(rng.randint(2, 4)):
        for _ in range(rng.randint(3, 10)):
            function = rng.choice(sorted(remote_code.RECYCLED) + ["reused", "reused"])
            remote = remote_code.RECYCLED.get(function, remote_code.reused)
            retries = rng.choice([0, 0, 3])
            key = program.key(f"recycled {function}", retries=retries)
            x, boxes = rng.randint(1, 40), rng.randint(0, 3)
            ref = remote.options(max_retries=retries, num_cpus=cpus).remote(key, x, boxes)
            results.append((key, x, boxes, ref, retries))
        # Around the idle timeout: reaped, or asked to exit as the next wave comes.
        pause = rng.choice([0.0, idle_s * rng.uniform(0.8, 1.2), idle_s + rng.uniform(0, 2),
                            rng.uniform(0, 0.5)])
        if rng.random() < 0.5:
            tray.wait([r[3] for r in results], num_returns=len(results), timeout=30.0,
                      fetch_local=False)
        time.sleep(pause)
    for key, x, boxes, ref, retries in results:
        program.expect(ref, Shaped(f"({x * x}, [{boxes} refs])",
                                   lambda value, x=x, boxes=boxes: _recycled(value, x, boxes)),
                       label=f"{key}", retries=retries)

    def read_boxes() -> None:
        for key, x, _boxes, ref, _retries in results:
            try:
                _, refs = tray.get(ref, timeout=120.0)
            except Exception:  # noqa: BLE001 - judged with the expectation
                continue
            for i, inner in enumerate(refs):
                program.expect(inner, x * 10 + i, label=f"{key}: the ref it put #{i}",
                               put=True)
        _check_max_calls(program, sim)
    program.later(read_boxes)


def _recycled(value, x: int, boxes: int) -> bool:
    return isinstance(value, tuple) and len(value) == 2 and value[0] == x * x and \
        isinstance(value[1], list) and len(value[1]) == boxes and \
        all(isinstance(ref, tray.ObjectRef) for ref in value[1])


def _check_max_calls(program, sim) -> None:
    """Per worker: at most N calls of a max_calls=N function, nothing after
    its N-th, and a worker that retires (max_calls_reached) reached some
    function's N."""
    by_worker: dict = {}
    for key, function, worker, address, t in remote_code.LEDGER.runs:
        by_worker.setdefault(worker, []).append((t, function, key, address))
    # Workers that said they retire (their node then lets them go).
    retiring = {event["component"].rsplit(":", 1)[-1] for event in sim.trace.events
                if event["event"] == "max_calls_reached"}
    for worker, runs in sorted(by_worker.items()):
        counts: dict = {}
        retired_at = None
        for t, function, key, _address in runs:
            limit = remote_code.MAX_CALLS.get(function)
            if retired_at is not None:
                raise InvariantViolation(
                    "max-calls-worker-retires-after-exactly-n-calls",
                    f"worker {worker[:8]} ran {key} ({function}) at t={t:.4f} after its "
                    f"{retired_at[1]}-th call of a max_calls={retired_at[1]} function "
                    f"({retired_at[0]})")
            if limit is None:
                continue
            counts[function] = counts.get(function, 0) + 1
            if counts[function] == limit:
                retired_at = (function, limit)
        if worker[-8:] in retiring and retired_at is None and counts:
            raise InvariantViolation(
                "max-calls-worker-retires-after-exactly-n-calls",
                f"worker {worker[:8]} retired after {counts} call(s) of max_calls "
                f"functions {dict((f, remote_code.MAX_CALLS[f]) for f in counts)}, short of "
                "every limit")
