"""A model of a Serve rollout, checked at the end of every step of the
controller's control loop (for the ``serve`` workload).

``RolloutRecorder`` wraps ``ServeController._step`` (and notes which
replicas the step stopped, gracefully or not) for the length of a workload,
and restores it after. At the end of a step nothing runs between the
reconcile that decided the replicas and the status it computed (the step
has no ``await``), so the controller's state there is one consistent
picture; the recorder reads it (it changes nothing: the digest is the same
with or without it) and judges it against what Ray Serve documents:

* **statuses** (``serve-status-follows-the-rollout``): a deployment is
  ``HEALTHY`` exactly when its target number of replicas of the current
  version run and nothing else does (no old version, none starting or
  stopping); while a replica of an older version still takes requests
  it is neither ``HEALTHY`` nor ``UPSCALING``/``DOWNSCALING``, and its
  application is not ``RUNNING``; an application is ``RUNNING`` only when
  each of its deployments is healthy (or scaling); ``DEPLOY_FAILED`` only
  for a deployment whose constructor the workload made fail (and such a
  deployment never ``HEALTHY``); ``UNHEALTHY`` only after a replica of it
  was stopped for dying or failing its health checks, since it last was
  ``HEALTHY``;
* **proxies** (``serve-proxies-follow-the-nodes``): a ``HEALTHY`` proxy
  has an actor; none is kept (other than ``DRAINING``) where the location
  wants none (``HeadOnly``: off the head; ``Disabled``: anywhere); a
  ``DRAINING`` proxy is never taken back;
* **replica counts** (``serve-replica-count-follows-the-target``): as many
  replicas of the current version are starting or serving as the target
  (not one more or less: extras stop, missing ones start, in the same
  step); old-version replicas that still serve are at most the target less
  the new ones that serve (an old one goes once a new one serves in its
  place), and an old one is stopped gracefully only if the step leaves at
  least the target serving (capacity never drops in a rolling update).
"""

from __future__ import annotations

from dataclasses import dataclass, field

SCALING = ("UPSCALING", "DOWNSCALING")
PROXIES = "serve-proxies-follow-the-nodes"
RECOVERS = "serve-replicas-recover"
RECOVER_S = 30.0  # virtual seconds to replace a sick replica, or to re-attach
# How long a replica failing every other health check is watched (its
# deployment checks every second: 4 failures, never 2 in a row).
ALTERNATE_S = 8.0
SLOWING_FAULTS = ("slow_node", "stall", "partition", "reset", "duplicate")
HTTP_P = 0.35  # the seeds that start Serve with HTTP proxies (they cost 2-3x the CPU)
PROXIES_CONVERGE_S = 60.0  # virtual seconds for the proxies to follow a change


def _where(app, dep) -> str:
    from tray.serve._aio import loop_time

    replicas = [(r.replica_id.split("#")[-1], r.version[:8], r.state.value)
                for r in dep.replicas]
    return (f"t={loop_time():.3f}s {app.name}/{dep.name}: status {dep.status.value} (app "
            f"{app.status.value}), target {0 if dep.deleting else dep.target_num}, current "
            f"version {dep.spec.version[:8]}, replicas {replicas}")


@dataclass
class RolloutRecorder:
    apps: tuple  # the applications to judge
    failing: set = field(default_factory=set)  # (app, deployment) made to fail
    violations: list = field(default_factory=list)  # (invariant, message)
    _stops: list = field(default_factory=list)
    _explained: set = field(default_factory=set)  # deployments whose UNHEALTHY is explained
    _saved: tuple = ()
    _cluster: object = None
    _draining_proxies: dict = field(default_factory=dict)  # id -> proxy seen DRAINING

    # -- installing
    def __enter__(self) -> RolloutRecorder:
        import tray.simtest
        from tray.serve._controller import ServeController
        from tray.serve._deployment_state import DeploymentStateManager

        self._cluster = tray.simtest.cluster()
        step, stop = ServeController._step, DeploymentStateManager._stop_replica
        self._saved = (step, stop)
        recorder = self

        async def observed_step(controller):
            recorder._stops.clear()
            await step(controller)
            recorder.observe(controller)

        def noted_stop(manager, dep, replica, graceful):
            if replica.state != "STOPPING":
                recorder._stops.append((dep.app_name, dep.name, replica.replica_id,
                                        replica.version, replica.serving(), graceful, ""))
            return stop(manager, dep, replica, graceful)

        ServeController._step = observed_step
        DeploymentStateManager._stop_replica = noted_stop
        return self

    def __exit__(self, *exc) -> None:
        from tray.serve._controller import ServeController
        from tray.serve._deployment_state import DeploymentStateManager

        ServeController._step, DeploymentStateManager._stop_replica = self._saved

    # -- judging one step
    def _fail(self, invariant: str, message: str) -> None:
        if len(self.violations) < 20:
            self.violations.append((invariant, message))
        if self._cluster is not None:
            # Fail fast: the driver's blocking call ends now (a wrong status
            # may keep serve.run waiting forever); the workload raises this.
            self._cluster.time_limit_s = min(self._cluster.time_limit_s,
                                             self._cluster.clock.current_time())

    def observe(self, controller) -> None:
        """Judge the end of a step. It allocates as little as it can (counts,
        no copies, the message only on a failure): the collector's timing
        follows allocations, and what it frees may show in the trace."""
        for app_name in self.apps:
            app = controller._apps.get(app_name)
            if app is not None:
                self._observe_app(controller, app_name, app)
        self._observe_proxies(controller._proxy_states)

    def _observe_proxies(self, manager) -> None:
        location = manager.proxy_location.value
        draining = self._draining_proxies
        for node_id, proxy in manager.proxies.items():
            status = proxy.status.value
            if status == "DRAINING":
                draining[id(proxy)] = proxy
                continue
            where = f"the proxy on node {node_id[:8]} is {status} ({location})"
            if id(proxy) in draining and draining[id(proxy)] is proxy:
                self._fail(PROXIES, f"{where} after it was DRAINING")
            if status == "HEALTHY" and proxy.handle is None:
                self._fail(PROXIES, f"{where} with no actor")
            if location == "Disabled" or \
                    (location == "HeadOnly" and node_id != manager.head_node_id):
                self._fail(PROXIES, f"{where}: that location wants no proxy there")

    def _observe_app(self, controller, app_name: str, app) -> None:
        from tray.serve._deployment_state import MAX_CONSTRUCTOR_FAILURES
        from tray.serve._status import ReplicaState

        stops = self._stops
        app_status = app.status.value
        healthy_deps = True
        for dep_name in app.deployments:
            dep = controller._deployments.get((app_name, dep_name))
            if dep is None:
                continue
            key = (app_name, dep_name)
            version = dep.spec.version
            target = 0 if dep.deleting else dep.target_num
            status = dep.status.value
            active_new = serving_new = serving_old = running_new = 0
            for r in dep.replicas:
                if r.version == version:
                    active_new += r.state != ReplicaState.STOPPING
                    serving_new += r.serving()
                    running_new += r.state == ReplicaState.RUNNING
                else:
                    serving_old += r.serving()
            others = len(dep.replicas) - running_new
            failed = dep.constructor_failures >= MAX_CONSTRUCTOR_FAILURES
            old_stopped = 0
            for s_app, s_dep, _rid, s_version, serving, graceful, _state in stops:
                if s_app == app_name and s_dep == dep_name and serving:
                    if not graceful:
                        self._explained.add(key)
                    elif s_version != version:
                        old_stopped += 1
            if dep.deleting:
                continue
            if status not in ("HEALTHY", *SCALING):
                healthy_deps = False
            # Statuses.
            exact = running_new == target and others == 0
            if status == "HEALTHY" and not exact:
                self._fail("serve-status-follows-the-rollout",
                           f"HEALTHY before the target ran alone: {_where(app, dep)}")
            if exact and not failed and status != "HEALTHY" and key not in self.failing:
                self._fail("serve-status-follows-the-rollout",
                           f"exactly the target of the current version runs, yet not "
                           f"HEALTHY: {_where(app, dep)}")
            if serving_old and (status in ("HEALTHY", *SCALING) or app_status == "RUNNING"):
                self._fail("serve-status-follows-the-rollout",
                           f"an old-version replica still serves: {_where(app, dep)}")
            if status == "DEPLOY_FAILED" and key not in self.failing:
                self._fail("serve-status-follows-the-rollout",
                           f"DEPLOY_FAILED, though no constructor of it fails: "
                           f"{_where(app, dep)}")
            if key in self.failing and (status == "HEALTHY" or app_status == "RUNNING"):
                self._fail("serve-status-follows-the-rollout",
                           f"a deployment whose constructor always fails is healthy: "
                           f"{_where(app, dep)}")
            if status == "UNHEALTHY" and key not in self._explained:
                self._fail("serve-status-follows-the-rollout",
                           f"UNHEALTHY, though no replica of it died or failed its health "
                           f"checks since it was last HEALTHY: {_where(app, dep)}")
            if status == "HEALTHY":
                self._explained.discard(key)
            # Replica counts.
            if not failed and active_new != target:
                self._fail("serve-replica-count-follows-the-target",
                           f"{active_new} replicas of the current version start or serve, "
                           f"for a target of {target}: {_where(app, dep)}")
            if serving_old > max(0, target - serving_new):
                self._fail("serve-replica-count-follows-the-target",
                           f"{serving_old} old-version replicas still serve beside "
                           f"{serving_new} new ones, for a target of {target}: "
                           f"{_where(app, dep)}")
            if old_stopped and serving_new + serving_old < target:
                self._fail("serve-replica-count-follows-the-target",
                           f"{old_stopped} old replicas stopped before new ones served in "
                           f"their place: {serving_new} new and {serving_old} old serve, for "
                           f"a target of {target}: {_where(app, dep)}")
        if app_status == "RUNNING" and not healthy_deps:
            self._fail("serve-status-follows-the-rollout",
                       f"application {app_name} RUNNING while a deployment of it is not "
                       f"healthy")

    def raise_first(self) -> None:
        from .invariants import InvariantViolation

        if self.violations:
            invariant, message = self.violations[0]
            more = f" (and {len(self.violations) - 1} more)" if len(self.violations) > 1 else ""
            raise InvariantViolation(invariant, message + more)


# ====================================================== HTTP proxies


def _violation(message: str):
    from .invariants import InvariantViolation

    return InvariantViolation(PROXIES, message)


def start_http(program) -> str | None:
    """Start Serve with HTTP proxies on some seeds (their location), or not
    (None). Port 0: the proxies bind real sockets, each its own port."""
    from tray import serve
    from tray.serve.exceptions import RayServeException

    rng = program.rng
    if rng.random() >= HTTP_P:
        return None
    location = rng.choice(["EveryNode", "EveryNode", "HeadOnly"])
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": 0}, proxy_location=location)
    except RayServeException as error:
        # A proxy that failed to start (its node crashed meanwhile) is
        # started again: judged once it had the time to (proxy_phase).
        if not program.kills:
            raise _violation(f"serve.start with HTTP raised: {error}") from None
    return location


def _proxy_actors() -> dict:
    """node id -> (actor id, state, node id) of every ServeProxy actor not
    DEAD, by its name."""
    from tray.serve._common import PROXY_NAME_PREFIX
    from tray.util.state import list_actors

    found = {}
    for actor in list_actors(limit=100_000):
        if actor.class_name == "ServeProxy" and actor.state != "DEAD" and \
                (actor.name or "").startswith(PROXY_NAME_PREFIX):
            found[actor.name[len(PROXY_NAME_PREFIX):]] = (actor.actor_id, actor.state,
                                                          actor.node_id)
    return found


def _proxies_converge(location: str, what: str, joined: str = "") -> dict:
    """Virtual time passes until the proxies are exactly the wanted nodes'
    (the alive nodes', or the head's), all HEALTHY, each actor ALIVE on its
    node and answering its health check; node id -> actor id."""
    import tray
    import tray.simtest
    from tray.serve import _context
    from tray.serve._common import PROXY_NAME_PREFIX

    cluster = tray.simtest.cluster()
    controller = _context.controller_handle()
    head = tray.get_runtime_context().get_node_id()  # the driver's: the controller's
    deadline = cluster.clock.current_time() + PROXIES_CONVERGE_S
    while True:
        alive = sorted(n["NodeID"] for n in tray.nodes() if n["Alive"])
        wanted = alive if location == "EveryNode" else [head]
        statuses = {node: s.value for node, s in
                    tray.get(controller.get_serve_status.remote()).proxies.items()}
        actors = _proxy_actors()
        problem = None
        if joined and joined not in alive:
            problem = f"the node that joined ({joined[:8]}) is not alive"
        elif sorted(statuses) != wanted:
            problem = f"the proxies' nodes are {sorted(n[:8] for n in statuses)}"
        elif any(s != "HEALTHY" for s in statuses.values()):
            problem = f"the proxies are {statuses}"
        elif sorted(actors) != wanted or \
                any(state != "ALIVE" or node != where
                    for where, (_id, state, node) in actors.items()):
            problem = f"the proxy actors (node: (id, state, node)) are {actors}"
        else:
            for node in wanted:
                try:
                    # (By name: it may have died since the listing, chaos seed 16.)
                    proxy = tray.get_actor(PROXY_NAME_PREFIX + node, namespace="serve")
                    tray.get(proxy.check_health.remote(), timeout=5.0)
                except Exception as error:  # noqa: BLE001 - judged below
                    problem = f"the proxy on {node[:8]} failed its check: {error!r}"
                    break
        if problem is None:
            return {node: actor_id for node, (actor_id, _s, _n) in actors.items()}
        if cluster.clock.current_time() > deadline:
            raise _violation(f"{what}: after {PROXIES_CONVERGE_S} s {problem}; the wanted "
                             f"nodes ({location}) are {[n[:8] for n in wanted]}")
        cluster.advance(0.5)


def proxy_phase(program, location: str) -> None:
    """The proxies follow the nodes, the deaths of their actors and a
    controller restart (see workloads_serve's header)."""
    import tray
    import tray.simtest
    from tray.serve import _context
    from tray.serve._common import PROXY_NAME_PREFIX

    rng = program.rng
    sim = tray.simtest.cluster()
    before = _proxies_converge(location, "the proxies after the applications ran")
    victim = rng.choice(sorted(before))
    try:
        actor = tray.get_actor(PROXY_NAME_PREFIX + victim, namespace="serve")
    except ValueError:  # died since
        actor = None
    if actor is not None and sim.kill_actor_worker(actor):
        after = _proxies_converge(location, f"the proxy on {victim[:8]} was killed")
        if after.get(victim) == before[victim]:
            raise _violation(f"the proxy on {victim[:8]} was killed, and its actor "
                             f"{before[victim][:8]} is still the one named there")
        before = after
    if rng.random() < 0.5:
        controller = _context.controller_handle()
        if sim.kill_actor_worker(controller):  # it restarts (max_restarts=-1)
            after = _proxies_converge(location, "the controller restarted")
            replaced = sorted(n[:8] for n in before if after.get(n) != before[n])
            if replaced:
                raise _violation(f"a restarted controller replaced the proxies on {replaced}"
                                 f" rather than re-attach them")
    if location == "EveryNode":
        added = sim.add_node()
        _proxies_converge(location, f"node {added[:8]} joined", joined=added)
        program.kill_node(added, restart_after_s=None)
        _proxies_converge(location, f"node {added[:8]} left")


def check_no_proxies() -> None:
    """After serve.shutdown: no proxy actor is left."""
    left = _proxy_actors()
    if left:
        raise _violation(f"serve.shutdown() returned and proxy actors are left: {left}")


# ============================================= health checks, controller restarts


def _replicas_settle(program, app: str, deployment: str, size: int, what: str,
                     gone: str = "", same: tuple = ()) -> list:
    """Virtual time passes until the deployment is HEALTHY with ``size``
    RUNNING replicas, each an ALIVE actor, none of them ``gone`` (and, with
    ``same`` and no killing faults, exactly those); their ids."""
    import tray
    import tray.simtest
    from tray.serve import _context
    from tray.util.state import list_actors

    cluster = tray.simtest.cluster()
    controller = _context.controller_handle()
    deadline = cluster.clock.current_time() + RECOVER_S
    while True:
        status = tray.get(controller.get_serve_status.remote()).applications[app]
        dep_status = status.deployments[deployment].status.value
        replicas = tray.get(controller.list_replicas.remote(app, deployment))
        running = sorted(r[0] for r in replicas if r[2] == "RUNNING")
        alive = {a.name for a in list_actors(limit=100_000) if a.state == "ALIVE"}
        ghosts = [r[0] for r in replicas if r[2] == "RUNNING" and r[1] not in alive]
        problem = None
        if dep_status != "HEALTHY" or len(running) != size or len(replicas) != size:
            problem = f"the deployment is {dep_status} with replicas {replicas}"
        elif ghosts:
            problem = f"replicas {ghosts} are RUNNING by the controller, dead by the GCS"
        elif gone and gone in running:
            problem = f"replica {gone} still runs"
        elif same and not program.kills and tuple(running) != tuple(same):
            problem = f"the replicas are {running}, not the same {list(same)}"
        if problem is None:
            return running
        if cluster.clock.current_time() > deadline:
            from .invariants import InvariantViolation

            raise InvariantViolation(RECOVERS, f"{what}: after {RECOVER_S} s {problem} "
                                     f"(target {size})")
        cluster.advance(0.5)


def _never_failed_for_health(program, app: str, deployment: str, replica: str) -> None:
    """For ``ALTERNATE_S`` of virtual time, the controller never says that
    ``replica`` — failing every other check, never twice in a row — failed
    its health checks. Judged where no fault can make a passing check time
    out or break (a slow or stalled node, a cut or reset connection: these
    last until the program ends)."""
    import tray
    import tray.simtest
    from tray.serve import _context

    if any(fault.kind in SLOWING_FAULTS for fault in program.schedule):
        tray.simtest.cluster().advance(ALTERNATE_S)
        return

    cluster = tray.simtest.cluster()
    controller = _context.controller_handle()
    until = cluster.clock.current_time() + ALTERNATE_S
    while cluster.clock.current_time() < until:
        cluster.advance(0.5)
        status = tray.get(controller.get_serve_status.remote()).applications[app]
        message = status.deployments[deployment].message or ""
        if f"replica {replica} failed its health checks" in message:
            from .invariants import InvariantViolation

            raise InvariantViolation(RECOVERS, f"replica {replica} fails every other health "
                                     f"check, never two in a row, and the controller stopped "
                                     f"it: {message!r}")


def fixed_recovery(program, handle, app: str, deployment: str, size: int) -> None:
    """A replica made to fail its health checks is replaced (a new one, the
    same count, HEALTHY again); a restarted controller re-attaches the
    replicas (the same ones without killing faults) and they answer."""
    import tray
    import tray.simtest

    rng = program.rng
    before = _replicas_settle(program, app, deployment, size, "before the checks")
    if rng.random() < 0.5:
        # Failing every other check, a replica never fails the threshold's
        # number in a row (Ray counts consecutive failures): it stays.
        mode = rng.choice(["always", "alternate"])
        try:
            sick = handle.sicken.remote(mode).result(timeout_s=60.0)
        except Exception as error:  # noqa: BLE001 - only a fault may fail it
            from .invariants import InvariantViolation, _is_fault_error

            if not (program.kills and _is_fault_error(error)):
                raise InvariantViolation("serve-request-fails-only-by-fault",
                                         f"sicken failed: {error!r}") from None
            sick = ""
        if sick and mode == "always":
            before = _replicas_settle(program, app, deployment, size,
                                      f"replica {sick} failed its health checks", gone=sick)
        elif sick:
            _never_failed_for_health(program, app, deployment, sick)
            before = _replicas_settle(program, app, deployment, size,
                                      f"replica {sick} failed every other health check for "
                                      f"{ALTERNATE_S:g} s", same=tuple(before))
    if rng.random() < 0.5:
        sim = tray.simtest.cluster()
        controller = tray.get_actor("SERVE_CONTROLLER_ACTOR", namespace="serve")
        if sim.kill_actor_worker(controller):  # it restarts (max_restarts=-1)
            _replicas_settle(program, app, deployment, size, "the controller restarted",
                             same=tuple(before))


# ====================================================== back-pressure

QUEUED_APP = "serve-simtest-queued"
BACKPRESSURE = "serve-backpressure-as-limited"
QUEUED_P = 0.5  # the seeds that run the back-pressure phase (a draw of its own)
QUEUED_SLEEP_S = 2.0  # each request of the burst runs this long: none ends during the burst


def backpressure_model(replicas: int, max_ongoing: int, max_queued: int, burst: int) -> list:
    """Which of a burst of long requests, sent from one handle in this order
    while none of them ends, are refused with ``BackPressureError`` (True)
    and which are served (False). Ray Serve: each replica runs at most
    ``max_ongoing_requests`` at once, and a caller (a handle's router) keeps
    at most ``max_queued_requests`` waiting for a slot (-1: no limit); a
    request that would queue past it fails at once. So the first
    ``replicas * max_ongoing + max_queued`` are served, the rest refused.
    Exact in Ray too where the router knows the replicas' loads: here it
    counts its own requests in flight (the only caller), and Ray's counts
    come from the replicas themselves (a replica at capacity rejects), the
    same numbers while nothing ends. Not exact in Ray, nor modelled: the
    order in which the queued requests get a slot once one frees (Ray's
    router queue is FIFO but for locality and multiplexing; tray's replica
    queue), and when the refusal shows (tray raises it from ``.remote()``
    in synchronous code, Ray from ``.result()``: either is taken)."""
    accepted = burst if max_queued == -1 else min(burst, replicas * max_ongoing + max_queued)
    return [i >= accepted for i in range(burst)]


def backpressure_phase(program, recorder, deployment, rng, ledgers) -> None:
    """A deployment of a fixed size with small ``max_ongoing_requests`` and
    ``max_queued_requests``; a burst of long requests from one handle past
    both: exactly the model's are refused (the last ones, at once, never
    run), every other one is served exactly once, no replica runs more than
    its limit. Exact when the replicas stayed the same and nothing failed
    (the seeds' faults come early; a replica lost or replaced changes the
    capacity): otherwise only a limited deployment may refuse, and only a
    fault may fail a request. ``ledgers``: the workload's records of the
    replicas' runs (``RAN_ON``, ``EXECUTIONS``, ``MOST_ONGOING``)."""
    import tray
    import tray.simtest
    from tray import serve
    from tray.serve import _api
    from tray.serve.exceptions import BackPressureError

    from .invariants import InvariantViolation, _is_fault_error

    size, ongoing = rng.randint(1, 2), rng.randint(1, 2)
    limit = -1 if rng.random() < 0.2 else rng.randint(1, 3)
    burst = size * ongoing + max(0, limit) + rng.randint(1, 3)
    handle = serve.run(deployment.options(
        num_replicas=size, max_ongoing_requests=ongoing, max_queued_requests=limit,
        user_config={"tag": "q"}).bind("q1"), name=QUEUED_APP, route_prefix=None)
    recorder.raise_first()

    def running() -> list:
        return sorted(r[0] for r in _api._list_replicas(QUEUED_APP, "Fixed")
                      if r[2] == "RUNNING")

    clock = tray.simtest.cluster().clock
    before = running()
    start = clock.current_time()
    sent = []  # (request id, response or None, its error at .remote(), when)
    for i in range(burst):
        try:
            sent.append((f"q-{i}", handle.remote(f"q-{i}", QUEUED_SLEEP_S), None, 0.0))
        except Exception as error:  # noqa: BLE001 - judged below
            sent.append((f"q-{i}", None, error, clock.current_time() - start))
    sending_s = clock.current_time() - start
    refused = backpressure_model(size, ongoing, limit, burst)
    outcomes = {}
    # Those the model refuses first: a refusal comes before any slot frees.
    for i in sorted(range(burst), key=lambda i: not refused[i]):
        rid, response, error, at = sent[i]
        if response is not None:
            try:
                outcomes[i] = ("ok", response.result(timeout_s=120.0), 0.0)
            except Exception as failed:  # noqa: BLE001 - judged below
                outcomes[i] = ("error", failed, clock.current_time() - start)
        else:
            outcomes[i] = ("error", error, at)
    del sent
    after = running()
    served_on = {ledgers.RAN_ON.get(f"q-{i}") for i, (kind, _v, _at) in outcomes.items()
                 if kind == "ok"}
    faulted = any(kind == "error" and not isinstance(value, BackPressureError)
                  for kind, value, _at in outcomes.values())
    exact = before == after and len(before) == size and served_on <= set(before) and \
        sending_s < QUEUED_SLEEP_S and not faulted
    setup = (f"{size} replica(s), max_ongoing_requests={ongoing}, max_queued_requests={limit},"
             f" a burst of {burst} requests of {QUEUED_SLEEP_S:g} s from one handle")
    got = "".join("x" if k == "error" and isinstance(v, BackPressureError) else
                  "!" if k == "error" else "." for _i, (k, v, _a) in sorted(outcomes.items()))
    model = "".join("x" if r else "." for r in refused)
    for i, (kind, value, at) in sorted(outcomes.items()):
        rid = f"q-{i}"
        runs = ledgers.EXECUTIONS.get(rid, 0)
        if kind == "error" and isinstance(value, BackPressureError):
            problem = None
            if limit == -1:
                problem = "refused with no max_queued_requests"
            elif exact and not refused[i]:
                problem = "refused, the model serves it"
            elif exact and at >= QUEUED_SLEEP_S:
                problem = f"refused only {at:g} s after the burst began, not at once"
            elif runs:
                problem = f"refused, yet it ran {runs} time(s)"
            if problem:
                raise InvariantViolation(BACKPRESSURE, f"{setup}: request {rid} {problem} "
                                         f"(served . refused x failed !: got {got}, the "
                                         f"model {model})")
        elif kind == "error":
            if not (program.kills and _is_fault_error(value)):
                raise InvariantViolation("serve-request-fails-only-by-fault",
                                         f"{setup}: request {rid} failed with "
                                         f"{type(value).__name__}: {str(value)[:600]}")
        else:
            if value != (rid, "q1", "q"):
                raise InvariantViolation("serve-response-is-the-model's",
                                         f"{setup}: request {rid} got {value!r}")
            if exact and refused[i]:
                raise InvariantViolation(BACKPRESSURE, f"{setup}: request {rid} was served, "
                                         f"the model refuses it (served . refused x failed "
                                         f"!: got {got}, the model {model})")
            if runs != 1:
                raise InvariantViolation("serve-request-runs-at-most-once",
                                         f"{setup}: request {rid} got a value and ran {runs} "
                                         f"times")
    for replica in sorted(served_on):
        most = ledgers.MOST_ONGOING.get(replica, 0)
        if most > ongoing:
            raise InvariantViolation("serve-replica-runs-at-most-max_ongoing_requests",
                                     f"{setup}: replica {replica} ran {most} requests at "
                                     f"once")
    del handle
    serve.delete(QUEUED_APP)
