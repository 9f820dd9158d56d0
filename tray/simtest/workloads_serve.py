"""tray.serve under faults: a stream of handle calls while replicas are
killed and a rolling update runs, with an autoscaling deployment.

The program deploys ``SimWorker`` (``v1``), starts 1-3 caller tasks that
each send a sequence of requests through a ``DeploymentHandle`` (and fetch
each result), kills some replicas (the seed picks which and when), sends a
burst from the driver, redeploys the application with ``v2`` (a rolling
update) while the callers still run, then holds some long requests to make
the autoscaler scale up, and lets them end to make it scale down.

Reference model and invariants:

* **every request gets exactly one response**: each caller returns one
  outcome per request, in order — a value, or an error the faults permit
  (the replica it went to died: a replica this program killed, or any with
  the profile's killing faults); never a hang, never a lost request;
* a value is ``(request id, version)`` with the version ``v1`` or ``v2``;
  requests sent after ``serve.run`` of ``v2`` returned get ``v2``;
* **at most once**: every replica records the request ids it ran (the
  simulator is one process, so a module-level ledger sees all of them); no
  id runs twice, and every request that got a value ran exactly once;
* **the replica count converges to the autoscaler's target**: with ``h``
  long requests held, the target becomes ``ceil(h / target_ongoing_requests)``
  bounded by ``max_replicas``, and as many ``v2`` replicas run (unless a
  fault failed a held request: that load was never there); once they end,
  it returns to ``min_replicas``, with nothing else left running;
* **one healthy HTTP proxy per wanted node** (``serve-proxies-follow-the-nodes``):
  a third of the seeds start Serve with HTTP (on port 0; ``EveryNode`` or
  ``HeadOnly``), and at the end the proxies are exactly the alive nodes'
  (or the head's), all ``HEALTHY``, each actor alive on its node and
  answering; then a proxy's worker is killed (a new actor replaces it), the
  controller is killed (it re-attaches the same proxy actors, none
  replaced), a node joins (it gets one) and leaves (its proxy goes); after
  ``serve.shutdown`` no proxy actor is left;
* **replicas recover** (``serve-replicas-recover``): in the fixed
  deployment, a replica made to fail its health checks is replaced (a new
  one, as many as the target, ``HEALTHY`` again), and a controller killed
  meanwhile re-attaches the replicas it had (the same ones, without killing
  faults), none of them ``RUNNING`` by the controller yet dead by the GCS;
* **back-pressure as limited** (``serve-backpressure-as-limited``): half
  the seeds (a draw of their own) send a burst of long requests from one
  handle to a fixed deployment with small ``max_ongoing_requests`` and
  ``max_queued_requests``: the requests past replicas x ongoing + queued,
  and only those, fail at once with ``BackPressureError`` and never run;
  the others are served once (``model_serve.backpressure_model``).
"""

from __future__ import annotations

import asyncio
import collections
import math
import random
import sys
import time

import tray
from tray import serve

# Imported here, not once the seed runs: a module imported mid-run is heap
# the collector sees in the first run of a process only (the determinism
# check's rerun differed: chaos seed 10).
from . import model_serve, serve_requests

APP = "serve-simtest"
TARGET_ONGOING = 2
MIN_REPLICAS, MAX_REPLICAS = 1, 4
CONVERGE_S = 30.0  # virtual seconds allowed to reach a target
HOLD_S = 8.0  # how long the held requests run: the scale-up must come sooner
EXECUTIONS: dict = {}  # request id -> times a replica ran it
RAN_ON: dict = {}  # request id -> the replica that ran it (last)
ONGOING: dict = {}  # replica id -> requests it runs now
MOST_ONGOING: dict = {}  # replica id -> the most it ran at once
FIXED_APP = "serve-simtest-fixed"
BROKEN_APP = "serve-simtest-broken"
MAX_ONGOING = 4
SPREAD_REQUESTS = 40  # sequential requests: each of 2-3 replicas gets some


class _SimWorker:
    def __init__(self, version: str) -> None:
        self.version = version

    async def __call__(self, request_id: str, sleep_s: float):
        from tray.simtest import workloads_serve

        ledger = workloads_serve.EXECUTIONS
        ledger[request_id] = ledger.get(request_id, 0) + 1
        with workloads_serve.running(request_id):
            await asyncio.sleep(sleep_s)
        return request_id, self.version


class _running:
    """Counts the requests a replica runs at once (its ledger: one process
    in the simulator), and which replica ran each request."""

    def __init__(self, request_id: str) -> None:
        self.request_id = request_id

    def __enter__(self):
        replica = serve.get_replica_context().replica_id
        self.replica = replica
        RAN_ON[self.request_id] = replica
        ONGOING[replica] = ONGOING.get(replica, 0) + 1
        MOST_ONGOING[replica] = max(MOST_ONGOING.get(replica, 0), ONGOING[replica])
        return self

    def __exit__(self, *exc) -> None:
        ONGOING[self.replica] -= 1


running = _running


class _Fixed:
    """A deployment with a fixed number of replicas and a user_config."""

    def __init__(self, version: str) -> None:
        self.version = version
        self.tag = None
        self.sick = None  # "always", or "alternate": every other check
        self.checks = 0

    def reconfigure(self, config: dict) -> None:
        self.tag = config["tag"]

    def check_health(self) -> None:
        self.checks += 1
        if self.sick == "always" or (self.sick == "alternate" and self.checks % 2):
            raise RuntimeError(f"made sick by the workload ({self.sick}; the model says so)")

    def sicken(self, mode: str = "always") -> str:
        """Fail every health check from now on (``always``), or every other
        one (``alternate``); this replica's id."""
        self.sick = mode
        return serve.get_replica_context().replica_id

    async def __call__(self, request_id: str, sleep_s: float):
        from tray.simtest import workloads_serve

        ledger = workloads_serve.EXECUTIONS
        ledger[request_id] = ledger.get(request_id, 0) + 1
        with workloads_serve.running(request_id):
            await asyncio.sleep(sleep_s)
        return request_id, self.version, self.tag


class _Broken:
    def __init__(self) -> None:
        raise RuntimeError("this constructor always fails (the model says so)")

    def __call__(self, *args):
        return None


# The class keeps a module-level name of its own, so it is pickled by
# reference. Pickled by value (were its name the Deployment's), the
# simulator's replicas, in this same process, would unpickle it onto the
# original class (cloudpickle tracks it), replacing its methods with copies
# that pickle differently: the next run of a seed in this process differed
# (chaos seed 60's determinism check).
SimWorker = serve.deployment(
    name="SimWorker", ray_actor_options={"num_cpus": 0},
    max_ongoing_requests=MAX_ONGOING,
    autoscaling_config={"min_replicas": MIN_REPLICAS, "max_replicas": MAX_REPLICAS,
                        "initial_replicas": 2, "target_ongoing_requests": TARGET_ONGOING,
                        "metrics_interval_s": 0.25, "look_back_period_s": 1.0,
                        "upscale_delay_s": 0.5, "downscale_delay_s": 1.0},
    health_check_period_s=1.0, health_check_timeout_s=3.0,
    graceful_shutdown_wait_loop_s=0.2, graceful_shutdown_timeout_s=20.0)(_SimWorker)


Fixed = serve.deployment(
    name="Fixed", ray_actor_options={"num_cpus": 0}, max_ongoing_requests=MAX_ONGOING,
    health_check_period_s=1.0, health_check_timeout_s=3.0,
    graceful_shutdown_wait_loop_s=0.2, graceful_shutdown_timeout_s=20.0)(_Fixed)
Broken = serve.deployment(name="Broken", ray_actor_options={"num_cpus": 0})(_Broken)


def _outcome(response) -> tuple:
    replica = response._replica.replica_id if response._replica is not None else ""
    try:
        return ("ok", response.result(timeout_s=120.0), replica)
    except Exception as error:  # noqa: BLE001 - judged by the driver
        # The replica the request last went to (a retry may have moved it).
        replica = response._replica.replica_id if response._replica is not None else replica
        return ("error", error, replica)


@tray.remote(max_retries=0, num_cpus=0)
def _caller(name: str, count: int, sleep_s: float, gap_s: float) -> list:
    handle = serve.get_app_handle(APP)
    outcomes = []
    for i in range(count):
        outcomes.append((f"{name}-{i}", *_outcome(handle.remote(f"{name}-{i}", sleep_s))))
        time.sleep(gap_s)
    from tray.serve import _context

    _context.reset()  # nothing of this worker's routers outlives the program
    return outcomes


def _violation(invariant: str, message: str):
    from .invariants import InvariantViolation

    return InvariantViolation(invariant, message)


def _killed_replicas(program, sim, count: int) -> list:
    """Kill ``count`` running replicas' workers now; their ids."""
    from tray.serve import _api

    killed = []
    replicas = [r for r in _api._list_replicas(APP, "SimWorker") if r[2] == "RUNNING"]
    for replica_id, actor_name, _state, _version in replicas[:count]:
        try:
            # (Not alive by the GCS, chaos seed 269: nothing to kill.)
            if not sim.kill_actor_worker(tray.get_actor(actor_name, namespace="serve")):
                continue
        except (ValueError, tray.exceptions.TrayError):  # no such actor; the GCS is down
            continue
        killed.append(replica_id)
    return killed


def _judge(program, outcomes: list, killed: set, after_update: bool) -> None:
    for request_id, kind, value, replica in outcomes:
        if kind == "ok":
            ok = isinstance(value, tuple) and value[0] == request_id and \
                value[1] in (("v2",) if after_update else ("v1", "v2"))
            if not ok:
                raise _violation("serve-response-is-the-model's",
                                 f"request {request_id} got {value!r}")
            continue
        from .invariants import _is_fault_error

        permitted = (program.kills and _is_fault_error(value)) or \
            (replica in killed and isinstance(value, tray.exceptions.ActorError))
        if not permitted:
            raise _violation("serve-request-fails-only-by-fault",
                             f"request {request_id} (replica {replica}) failed with "
                             f"{type(value).__name__}: {str(value)[:600]} (kills={program.kills},"
                             f" replicas killed by the program: {sorted(killed)})")


def _check_executions(outcomes: list) -> None:
    for request_id, count in sorted(EXECUTIONS.items()):
        if count > 1:
            raise _violation("serve-request-runs-at-most-once",
                             f"request {request_id} ran {count} times")
    for request_id, kind, _value, _replica in outcomes:
        if kind == "ok" and EXECUTIONS.get(request_id, 0) != 1:
            raise _violation("serve-request-runs-at-most-once",
                             f"request {request_id} got a value but ran "
                             f"{EXECUTIONS.get(request_id, 0)} times")


def _wait_for_replicas(expected: int, what: str, excused=None) -> None:
    """Virtual time passes until the deployment's target is ``expected`` and
    exactly that many v2 replicas run, and nothing else. ``excused()``, asked
    once the time is up, says whether the load the target follows was lost
    to a fault (then it need not have come)."""
    import tray.simtest
    from tray.serve import _context

    clock = tray.simtest.cluster().clock  # virtual time: the driver's own clock is real
    controller = _context.controller_handle()
    deadline = clock.current_time() + CONVERGE_S
    seen = None
    while True:
        status = tray.get(controller.get_serve_status.remote()).applications[APP]
        deployment = status.deployments["SimWorker"]
        replicas = tray.get(controller.list_replicas.remote(APP, "SimWorker"))
        states = sorted((state, version) for _id, _name, state, version in replicas)
        versions = {version for _state, version in states}
        seen = (deployment.target_num_replicas, states)
        if not MIN_REPLICAS <= deployment.target_num_replicas <= MAX_REPLICAS:
            raise _violation("serve-replicas-converge-to-the-target",
                             f"{what}: the target is {deployment.target_num_replicas}, outside "
                             f"min_replicas={MIN_REPLICAS}..max_replicas={MAX_REPLICAS}")
        if deployment.target_num_replicas == expected and len(states) == expected and \
                all(state == "RUNNING" for state, _version in states) and len(versions) == 1:
            return
        if clock.current_time() > deadline:
            if excused is not None and excused():
                return
            raise _violation("serve-replicas-converge-to-the-target",
                             f"{what}: expected the target and the running replicas to be "
                             f"{expected}; after {CONVERGE_S} s the target is {seen[0]} and the "
                             f"replicas are {seen[1]}")
        # Let virtual time pass (a controller call that waits).
        tray.get(controller.wait_for_applications.remote([APP], [], 0.5))


def _check_ongoing() -> None:
    for replica, most in sorted(MOST_ONGOING.items()):
        if most > MAX_ONGOING:
            raise _violation("serve-replica-runs-at-most-max_ongoing_requests",
                             f"replica {replica} ran {most} requests at once "
                             f"(max_ongoing_requests={MAX_ONGOING})")


def _running_replicas(app: str, deployment: str) -> list:
    from tray.serve import _api

    return sorted(r[0] for r in _api._list_replicas(app, deployment) if r[2] == "RUNNING")


def _fixed_phase(program, recorder) -> None:
    """A deployment of a fixed size: requests spread over its replicas (power
    of two choices), a user_config change applied in place (the same
    replicas answer with the new config once serve.run returns), a
    scale up or down by redeploying (the count follows), then a replica
    failing its health checks and a controller restart
    (model_serve.fixed_recovery)."""
    rng = program.rng
    size = rng.randint(2, 3)
    handle = serve.run(Fixed.options(num_replicas=size, user_config={"tag": "t1"}).bind("f1"),
                       name=FIXED_APP, route_prefix=None)
    recorder.raise_first()
    before = _running_replicas(FIXED_APP, "Fixed")
    outcomes = []
    for i in range(SPREAD_REQUESTS):  # one at a time: every load is 0, ties decide
        outcomes.append((f"s-{i}", *_outcome(handle.remote(f"s-{i}", 0.0))))
    after = _running_replicas(FIXED_APP, "Fixed")
    served = collections.Counter(RAN_ON.get(rid) for rid, kind, _v, _r in outcomes
                                 if kind == "ok")
    steady = [r for r in before if r in after]
    if len(steady) >= 2 and all(kind == "ok" for _rid, kind, _v, _r in outcomes):
        idle = [r for r in steady if served.get(r, 0) == 0]
        if idle:
            raise _violation("serve-requests-spread-over-replicas",
                             f"{SPREAD_REQUESTS} requests sent one after another to "
                             f"{len(steady)} running replicas; {idle} got none "
                             f"(spread: {dict(served)})")
    # A burst of long requests to two replicas: each goes to the less loaded.
    if size == 2 and len(steady) == 2 and steady == before == after:
        burst = [(f"sb-{i}", handle.remote(f"sb-{i}", 0.5)) for i in range(2 * rng.randint(1, 2))]
        burst_outcomes = [(rid, *_outcome(r)) for rid, r in burst]
        del burst
        counts = collections.Counter(RAN_ON.get(rid) for rid, kind, _v, _r in burst_outcomes
                                     if kind == "ok")
        if all(kind == "ok" for _rid, kind, _v, _r in burst_outcomes) and \
                max(counts.values()) - min(counts.get(r, 0) for r in steady) > 1:
            raise _violation("serve-requests-spread-over-replicas",
                             f"a burst of {len(burst_outcomes)} long requests to 2 replicas "
                             f"went {dict(counts)}: not to the less loaded one")
        outcomes += burst_outcomes
    # user_config only: reconfigured in place.
    serve.run(Fixed.options(num_replicas=size, user_config={"tag": "t2"}).bind("f1"),
              name=FIXED_APP, route_prefix=None)
    recorder.raise_first()
    reconfigured = [(f"r-{i}", *_outcome(handle.remote(f"r-{i}", 0.0))) for i in range(4)]
    for rid, kind, value, replica in reconfigured:
        if kind == "ok" and value != (rid, "f1", "t2"):
            raise _violation("serve-response-is-the-model's",
                             f"request {rid} after the user_config update got {value!r} "
                             f"(from replica {replica}); the model says {(rid, 'f1', 't2')}")
    # Scale by redeploying.
    new_size = rng.choice([s for s in (1, 2, 3, 4) if s != size])
    serve.run(Fixed.options(num_replicas=new_size, user_config={"tag": "t2"}).bind("f1"),
              name=FIXED_APP, route_prefix=None)
    recorder.raise_first()
    status = serve.status().applications[FIXED_APP].deployments["Fixed"]
    if status.target_num_replicas != new_size:
        raise _violation("serve-replica-count-follows-the-target",
                         f"redeployed with num_replicas={new_size}, the target is "
                         f"{status.target_num_replicas}")
    scaled = [(f"n-{i}", *_outcome(handle.remote(f"n-{i}", 0.0))) for i in range(3)]
    for rid, kind, value, replica in scaled:
        if kind == "ok" and value != (rid, "f1", "t2"):
            raise _violation("serve-response-is-the-model's",
                             f"request {rid} after scaling got {value!r} (replica {replica})")
    _judge_fixed(program, outcomes + reconfigured + scaled)
    model_serve.fixed_recovery(program, handle, FIXED_APP, "Fixed", new_size)
    del handle
    serve.delete(FIXED_APP)
    if FIXED_APP in serve.status().applications:
        raise _violation("serve-delete-removes-the-application",
                         f"{FIXED_APP} is still there after serve.delete returned")


def _judge_fixed(program, outcomes: list) -> None:
    from .invariants import _is_fault_error

    for rid, kind, value, replica in outcomes:
        if kind == "ok":
            if not (isinstance(value, tuple) and value[0] == rid and value[1] == "f1"):
                raise _violation("serve-response-is-the-model's", f"request {rid} got {value!r}")
        elif not (program.kills and _is_fault_error(value)):
            raise _violation("serve-request-fails-only-by-fault",
                             f"request {rid} (replica {replica}) failed with "
                             f"{type(value).__name__}: {str(value)[:600]}")


def _broken_phase(recorder) -> None:
    """A deployment whose constructor always raises: serve.run raises, and
    the status says DEPLOY_FAILED with the error (the recorder's model
    permits DEPLOY_FAILED here only)."""
    from tray.serve.exceptions import RayServeException

    try:
        serve.run(Broken.bind(), name=BROKEN_APP, route_prefix=None)
    except RayServeException as error:
        if "always fails" not in str(error):
            raise _violation("serve-status-follows-the-rollout",
                             f"serve.run of a failing deployment raised without its error: "
                             f"{error}") from None
    else:
        raise _violation("serve-status-follows-the-rollout",
                         "serve.run of a deployment whose constructor fails returned")
    status = serve.status().applications[BROKEN_APP]
    if status.status != "DEPLOY_FAILED" or \
            status.deployments["Broken"].status != "DEPLOY_FAILED":
        raise _violation("serve-status-follows-the-rollout",
                         f"a failed deployment's status: {status}")
    recorder.raise_first()
    serve.delete(BROKEN_APP)


def serve_stream(program) -> None:
    from .invariants import InvariantViolation

    for ledger in (EXECUTIONS, RAN_ON, ONGOING, MOST_ONGOING):
        ledger.clear()
    from tray.backends.sim.engine import SimulationTimeLimit

    with model_serve.RolloutRecorder(apps=(APP, FIXED_APP, BROKEN_APP, model_serve.QUEUED_APP),
                         failing={(BROKEN_APP, "Broken")}) as recorder:
        try:
            location = model_serve.start_http(program)
            _stream(program, recorder)
            if program.rng.random() < 0.6:
                _fixed_phase(program, recorder)
            # (Its draws of their own: the others stay what they were.)
            queued = random.Random(f"{tray.simtest.cluster().seed}:serve-backpressure")
            if queued.random() < model_serve.QUEUED_P:
                model_serve.backpressure_phase(program, recorder, Fixed, queued,
                                               sys.modules[__name__])
            batching = random.Random(f"{tray.simtest.cluster().seed}:serve-batch")
            if batching.random() < serve_requests.BATCH_P:
                serve_requests.batch_phase(program, batching)
            if program.rng.random() < 0.25:
                _broken_phase(recorder)
            if location is not None:
                model_serve.proxy_phase(program, location)
        except (SimulationTimeLimit, InvariantViolation):
            recorder.raise_first()  # what the recorder saw first, if it saw anything
            raise
        _check_ongoing()
        recorder.raise_first()
    serve.shutdown()
    if location is not None:
        model_serve.check_no_proxies()
    program.expect(tray.put(True), True, label="serve: the stream, the update and scaling")


def _stream(program, recorder) -> None:
    import tray.simtest

    rng = program.rng
    sim = tray.simtest.cluster()
    serve.run(SimWorker.bind("v1"), name=APP, route_prefix=None)
    recorder.raise_first()
    callers = [_caller.remote(f"c{c}", rng.randint(5, 25), rng.choice([0.0, 0.05, 0.2]),
                              rng.choice([0.0, 0.05]))
               for c in range(rng.randint(1, 3))]
    killed: set = set()
    handle = serve.get_app_handle(APP)
    burst = [(f"d-{i}", handle.remote(f"d-{i}", rng.choice([0.0, 0.1])))
             for i in range(rng.randint(0, 12))]
    if rng.random() < 0.7:
        killed.update(_killed_replicas(program, sim, rng.randint(1, 2)))
    driver_outcomes = [(rid, *_outcome(response)) for rid, response in burst]
    del burst
    # The rolling update, while the callers still send.
    serve.run(SimWorker.bind("v2"), name=APP, route_prefix=None)
    recorder.raise_first()
    after = [(f"u-{i}", handle.remote(f"u-{i}", 0.0)) for i in range(rng.randint(1, 6))]
    after_outcomes = [(rid, *_outcome(response)) for rid, response in after]
    del after
    caller_outcomes = []
    for ref in callers:
        try:
            caller_outcomes.extend(tray.get(ref))
        except Exception as error:  # noqa: BLE001 - only a fault may lose a caller task
            from .invariants import _is_fault_error

            if not (program.kills and _is_fault_error(error)):
                raise _violation("serve-callers-finish", f"a caller task failed: "
                                 f"{type(error).__name__}: {error}") from None
    del callers
    _judge(program, driver_outcomes + caller_outcomes, killed, after_update=False)
    _judge(program, after_outcomes, killed, after_update=True)
    for outcomes in (driver_outcomes, after_outcomes):
        ids = [o[0] for o in outcomes]
        if len(ids) != len(set(ids)):
            raise _violation("serve-one-response-per-request", f"duplicate responses: {ids}")
    # Autoscaling: once idle scaled it down to the minimum (so no downscale
    # decided on the idle past lands on the held requests), hold long
    # requests, then let them end.
    _wait_for_replicas(MIN_REPLICAS, "idle after the stream")
    held = rng.randint(3, 11)  # (over 8 the target would pass max_replicas)
    expected = max(MIN_REPLICAS, min(MAX_REPLICAS, math.ceil(held / TARGET_ONGOING)))
    long_requests = [(f"h-{i}", handle.remote(f"h-{i}", HOLD_S)) for i in range(held)]
    held_outcomes: list = []

    def held_lost(requests=long_requests, outcomes=held_outcomes) -> bool:
        # A held request that failed (judged below: only a fault may fail
        # it) held no load: e.g. it went to a replica that had died, which
        # the controller could not know yet (chaos seed 6: the GCS was down
        # when its worker crashed), so the target had nothing to follow.
        # (Arguments, not a closure: the names are deleted below.)
        outcomes[:] = [(rid, *_outcome(r)) for rid, r in requests]
        return any(kind == "error" for _rid, kind, _value, _replica in outcomes)

    _wait_for_replicas(expected, f"{held} requests held", excused=held_lost)
    del held_lost
    if not held_outcomes:
        held_outcomes = [(rid, *_outcome(r)) for rid, r in long_requests]
    del long_requests
    _judge(program, held_outcomes, killed, after_update=True)
    _wait_for_replicas(MIN_REPLICAS, "no requests")
    _check_executions(driver_outcomes + caller_outcomes + after_outcomes + held_outcomes)
    del handle, driver_outcomes, caller_outcomes, after_outcomes, held_outcomes
    recorder.raise_first()
    serve.delete(APP)


WORKLOADS = {"serve": serve_stream}
