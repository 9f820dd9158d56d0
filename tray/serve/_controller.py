"""The Serve controller: one detached, restartable actor that owns what runs.

It keeps the applications and their deployments, and brings the replicas
to what they ask for in a control loop (every ``CONTROL_LOOP_PERIOD_S``):

* **reconcile**: start replicas of the deployment's current version until
  there are as many as its target, and stop the rest. A new version (new
  code, arguments or actor options) is a **rolling update**: new replicas
  start beside the old ones, and an old one is stopped only once a new one
  runs in its place, so capacity never drops and no request finds no
  replica; a changed ``user_config`` or ``max_ongoing_requests`` is applied
  to running replicas in place (``reconfigure``).
* **stop gracefully**: a stopped replica leaves the routing table first
  (routers learn through their long polls), then drains
  (``prepare_for_shutdown``), then is killed.
* **health**: every ``health_check_period_s`` each running replica's
  ``check_health`` runs (the user's, if the class has one); a dead replica,
  ``REPLICA_HEALTH_CHECK_UNHEALTHY_THRESHOLD`` failed checks in a row, or one
  check past ``health_check_timeout_s`` get it replaced. Routers that see a
  replica die report it, which triggers a check at once.
* **autoscale**: for deployments with an ``autoscaling_config``, replicas'
  ongoing requests are sampled every ``metrics_interval_s`` and the target
  follows ``_autoscaling.decide`` (Ray's default policy).
* **start failures**: a replica whose constructor raises is retried; after
  ``MAX_CONSTRUCTOR_FAILURES`` in a row with none of the version running,
  the deployment (and its application) is ``DEPLOY_FAILED`` with the error.
* **proxies**: with HTTP enabled, an HTTP proxy actor per node (or on the
  head only), replaced when it dies.

Routers and proxies long-poll it (``listen_for_change``) for the replicas of
a deployment and for the route table; every change is published at the end
of the loop step that made it, under a version ``(incarnation, n)`` that
grows across restarts of the controller.

**Restarts.** The controller's state is checkpointed to the GCS's
key-value store (``tray.experimental.internal_kv``, namespace ``"serve"``),
as Ray Serve keeps it, after every change, and a replica is recorded there
*before* it is created, so a restarted controller (tray restarts it:
``max_restarts=-1``) finds every replica it made: it reads the state back,
looks each replica up by name, re-attaches the live ones (``initialize`` is
idempotent) and forgets the dead ones. The checkpoint is the key
``controller/state`` (a pickled snapshot) and one key per deployment spec,
``controller/spec/`` and the digest of its bytes: a write puts the specs
the state names first and the state after, so a state never names a
missing spec, and deletes the specs the state no longer names only after
it. Writes go one at a time, each a helper task on the controller's node
(``_common.write_checkpoint``, which makes the blocking key-value calls),
aside from the control loop, which goes on while the GCS restarts; one that
fails (the GCS stayed down past its reconnect timeout) is made again at the
next loop step, and a replica whose record failed is not created. The keys
outlive any actor's death, and GCS restarts where the GCS's storage is
durable (Redis; the simulator's): Serve's state is lost only with the GCS's
own storage, as in Ray. ``serve.shutdown()`` deletes them.

Everything here runs on the actor's asyncio loop: on trio-asyncio, so in
the simulator on virtual time, deterministically. Decisions iterate dicts
and lists in insertion order, never sets, and draw no randomness."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from dataclasses import dataclass, field

import tray

from . import _autoscaling, _common
from ._autoscaling import CONTROL_LOOP_PERIOD_S, LoadSamples, PolicyState
from ._common import (
    PROXY_NAME_PREFIX,
    SERVE_NAMESPACE,
    SPEC_PREFIX,
    STATE_KEY,
    ReplicaInfo,
    RouteTable,
    RoutingTarget,
    replica_actor_name,
)
from ._deployment import DeploymentSpec
from ._status import (
    ApplicationStatus,
    ApplicationStatusOverview,
    DeploymentStatus,
    DeploymentStatusOverview,
    ProxyDetails,
    ProxyStatus,
    ReplicaState,
    ServeStatus,
)
from .config import HTTPOptions, ProxyLocation
from .exceptions import RayServeException

logger = logging.getLogger("tray.serve")

MAX_CONSTRUCTOR_FAILURES = 3
REPLICA_HEALTH_CHECK_UNHEALTHY_THRESHOLD = 3
PROXY_HEALTH_CHECK_PERIOD_S = 10.0
PROXY_RESTART_BACKOFF_S = 5.0
NODES_REFRESH_PERIOD_S = 5.0
CONTROLLER_CONCURRENCY = 10_000  # long polls of routers and proxies, and client calls
SHUTDOWN_TIMEOUT_S = 120.0
REPLICA_EXIT_TIMEOUT_S = 10.0
DRAINED_REMEMBERED = 1000  # per deployment


async def _await(ref):
    return await ref


def _spawn(coroutine) -> asyncio.Task:
    task = asyncio.get_running_loop().create_task(coroutine)
    task.add_done_callback(lambda t: t.cancelled() or t.exception())
    return task


_spec_blobs: dict = {}  # id(spec) -> (spec, key, blob): each spec pickled once


def _spec_blob(spec: DeploymentSpec) -> tuple:
    """(checkpoint key, pickled spec): the key is the digest of the bytes."""
    import hashlib

    import cloudpickle

    cached = _spec_blobs.get(id(spec))
    if cached is None or cached[0] is not spec:
        blob = cloudpickle.dumps(spec)
        cached = (spec, SPEC_PREFIX + hashlib.sha256(blob).hexdigest()[:24], blob)
        _spec_blobs[id(spec)] = cached
        if len(_spec_blobs) > 1024:  # bounded: old specs are pickled again if needed
            del _spec_blobs[next(iter(_spec_blobs))]
    return cached[1], cached[2]


def _error_text(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"


# ================================================================== state


@dataclass
class _Replica:
    replica_id: str
    version: str
    config_version: int
    state: ReplicaState = ReplicaState.STARTING
    handle: object = None
    node_id: str = ""
    created: asyncio.Event = field(default_factory=asyncio.Event)
    start_task: asyncio.Task | None = None
    stop_task: asyncio.Task | None = None
    reconfigure_task: asyncio.Task | None = None
    health_task: asyncio.Task | None = None
    health_started_s: float = 0.0
    next_health_s: float = 0.0
    health_failures: int = 0
    metrics_task: asyncio.Task | None = None
    next_metrics_s: float = 0.0
    samples: LoadSamples | None = None

    @property
    def actor_name(self) -> str:
        return replica_actor_name(self.replica_id)

    def serving(self) -> bool:
        return self.state in (ReplicaState.RUNNING, ReplicaState.UPDATING)


@dataclass
class _Deployment:
    app_name: str
    name: str
    spec: DeploymentSpec
    config_version: int = 0
    target_num: int = 1
    replicas: list = field(default_factory=list)
    status: DeploymentStatus = DeploymentStatus.UPDATING
    message: str = ""
    constructor_failures: int = 0
    policy: PolicyState = field(default_factory=PolicyState)
    deleting: bool = False
    unhealthy: bool = False
    demand_s: float = -1e18  # when a router last waited for any replica
    demand: int = 0
    published: tuple = ()
    routing_version: tuple = (0, 0)
    # Replicas stopped after draining fully (their requests all finished):
    # a request that found one dead did not run and may be sent again.
    drained: deque = field(default_factory=lambda: deque(maxlen=DRAINED_REMEMBERED))

    @property
    def key(self) -> tuple:
        return ("deployment", self.app_name, self.name)


@dataclass
class _Application:
    name: str
    route_prefix: str | None
    ingress: str
    deployments: list  # names
    deployed_at_s: float
    status: ApplicationStatus = ApplicationStatus.DEPLOYING
    message: str = ""
    deleting: bool = False
    was_running: bool = False


@dataclass
class _Proxy:
    node_id: str
    status: ProxyStatus = ProxyStatus.STARTING
    handle: object = None
    message: str = ""
    task: asyncio.Task | None = None
    next_check_s: float = 0.0
    retry_at_s: float = 0.0


@dataclass(frozen=True)
class ControllerStatistics:
    applications: int
    deployments: int
    replicas: dict  # state -> count
    proxies: int
    long_polls_waiting: int
    loop_iterations: int
    incarnation: str


# ========================================================= the checkpoint


def _kv_task(function):
    """``function`` (a helper task of _common's) pinned to the controller's
    node: the controller (its owner) sees the worker that runs it on its own
    node, so a retry goes only after an attempt that died, never beside one
    a partition held back whose write could land after a later one."""
    from ..util.scheduling_strategies import NodeAffinitySchedulingStrategy

    # Asked each time: the simulator runs every process in this interpreter.
    node_id = tray.get_runtime_context().get_node_id()
    return function.options(
        scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False))


# ========================================================== the controller


class ServeController:
    """The controller actor (see the module's header)."""

    def __init__(self, http_options: HTTPOptions, proxy_location: ProxyLocation,
                 head_node_id: str) -> None:
        self._http_options = http_options
        self._proxy_location = proxy_location
        self._head_node_id = head_node_id
        self._apps: dict[str, _Application] = {}
        self._deployments: dict[tuple, _Deployment] = {}
        self._proxies: dict[str, _Proxy] = {}
        self._events: dict[tuple, asyncio.Event] = {}
        self._routes = RouteTable(version=(0, 0), routes={})
        self._counter = 0
        self._version_counter = 0
        self._incarnation = ""
        self._loop_task: asyncio.Task | None = None
        self._ready: asyncio.Event | None = None
        self._self_handle = None
        self._stored_specs: set = set()  # spec keys the GCS holds
        self._maybe_stored_specs: set = set()  # and those it may hold (deleted once stale)
        self._dirty = False
        self._iterations = 0
        self._waiting_polls = 0
        self._alive_nodes: list = []
        self._nodes_refresh_s = -1e18
        self._nodes_task: asyncio.Task | None = None
        self._shutting_down = False
        self._started_s = 0.0
        self._checkpoint_lock: asyncio.Lock | None = None
        self._write_task: asyncio.Task | None = None
        self._checkpoint_off = False  # deleted at shutdown: no more writes

    # -------------------------------------------------------- lifecycle

    async def _ensure_started(self) -> None:
        if self._loop_task is None:
            self._ready = asyncio.Event()
            self._loop_task = asyncio.get_running_loop().create_task(self._run())
        await self._ready.wait()

    def _now(self) -> float:
        return asyncio.get_running_loop().time()

    async def _run(self) -> None:
        self._started_s = self._now()
        # Ids of this incarnation: virtual time in the simulator, so they replay.
        # Fixed width, so that a later incarnation's id sorts after an earlier
        # one's (routers order routing targets by (incarnation, n)).
        self._incarnation = f"{int(time.time() * 1000):012x}"
        failures = 0
        while True:
            try:
                await self._recover()
                break
            except Exception as error:  # noqa: BLE001 - e.g. a lookup task lost to crashes
                # Never give up: a controller whose recovery ended leaves every
                # call waiting forever (chaos seeds 104, 192: lookup_actor
                # used up its retries while the GCS restarted).
                failures += 1
                logger.warning("serve controller: recovering its state failed (%s); trying "
                               "again", _error_text(error))
                await asyncio.sleep(min(0.05 * 2 ** min(failures, 6), 2.0))
        self._ready.set()
        while True:
            try:
                await self._step()
            except Exception as error:  # noqa: BLE001 - one bad step must not end the loop
                logger.exception("serve controller: control loop step failed: %s", error)
            self._iterations += 1
            await asyncio.sleep(CONTROL_LOOP_PERIOD_S)

    async def ping(self) -> str:
        await self._ensure_started()
        return self._incarnation

    # ------------------------------------------------------ checkpointing

    def _snapshot(self) -> dict:
        return {
            "http_options": self._http_options, "proxy_location": self._proxy_location,
            "head_node_id": self._head_node_id, "counter": self._counter,
            "apps": {name: {"route_prefix": app.route_prefix, "ingress": app.ingress,
                            "deployments": list(app.deployments),
                            "deployed_at_s": app.deployed_at_s, "deleting": app.deleting,
                            "was_running": app.was_running}
                     for name, app in self._apps.items()},
            "deployments": [
                {"app": dep.app_name, "name": dep.name, "spec_key": self._spec_key(dep.spec),
                 "config_version": dep.config_version, "target_num": dep.target_num,
                 "deleting": dep.deleting, "failures": dep.constructor_failures,
                 "message": dep.message,
                 "replicas": [(r.replica_id, r.version, r.config_version,
                               r.state == ReplicaState.STOPPING) for r in dep.replicas]}
                for dep in self._deployments.values()],
            "proxies": list(self._proxies),
        }

    @staticmethod
    def _spec_key(spec: DeploymentSpec) -> str:
        return _spec_blob(spec)[0]

    async def _checkpoint(self) -> bool:
        """Write the state; one write at a time, each with the state as it is
        when its turn comes (two writes in flight could land in either order,
        and one could delete a spec the other's state names). Whether it was
        written: a failed write is made again at the next loop step."""
        async with self._lock():
            if self._checkpoint_off:
                return True
            try:
                await self._write_checkpoint()
            except Exception as error:  # noqa: BLE001 - e.g. the GCS stayed down too long
                self._dirty = True
                logger.warning("serve controller: writing the checkpoint failed (%s); "
                               "trying again", _error_text(error))
                return False
            return True

    def _lock(self) -> asyncio.Lock:
        if self._checkpoint_lock is None:
            self._checkpoint_lock = asyncio.Lock()
        return self._checkpoint_lock

    async def _write_checkpoint(self) -> None:
        """The specs the state names that the GCS lacks, then the state,
        then the specs no state names any more (a state never names a spec
        the GCS lacks), in one helper task."""
        import cloudpickle

        self._dirty = False
        blobs = dict(_spec_blob(dep.spec) for dep in self._deployments.values())
        puts = [(key, blob) for key, blob in blobs.items() if key not in self._stored_specs]
        puts.append((STATE_KEY, cloudpickle.dumps(self._snapshot())))
        stale = [key for key in sorted(self._stored_specs | self._maybe_stored_specs)
                 if key not in blobs]
        self._maybe_stored_specs.update(key for key, _blob in puts[:-1])  # if it fails
        await _kv_task(_common.write_checkpoint).remote(puts, stale)
        self._stored_specs.update(key for key, _blob in puts[:-1])
        self._stored_specs.difference_update(stale)
        self._maybe_stored_specs.difference_update(stale)

    async def _recover(self) -> None:
        import cloudpickle

        self._apps.clear()  # what an earlier attempt got before it failed
        self._deployments.clear()
        self._proxies.clear()
        self._stored_specs.clear()
        self._maybe_stored_specs.clear()
        self._self_handle = await _common.lookup_actor.remote(_common.CONTROLLER_NAME,
                                                             SERVE_NAMESPACE)
        items = await _kv_task(_common.read_checkpoint).remote()
        # Every spec key, those of a write cut short included: the ones the
        # state does not name go at the first write.
        self._stored_specs.update(key for key in items if key.startswith(SPEC_PREFIX))
        state = items.get(STATE_KEY)
        if state is None:  # a new Serve (or one whose checkpoint was deleted)
            await self._checkpoint()
            return
        snapshot = cloudpickle.loads(state)
        self._http_options = snapshot["http_options"]
        self._proxy_location = snapshot["proxy_location"]
        self._head_node_id = snapshot["head_node_id"]
        self._counter = snapshot["counter"]
        for name, app in snapshot["apps"].items():
            self._apps[name] = _Application(
                name=name, route_prefix=app["route_prefix"], ingress=app["ingress"],
                deployments=list(app["deployments"]), deployed_at_s=app["deployed_at_s"],
                deleting=app["deleting"], was_running=app["was_running"])
        lookups = []
        for record in snapshot["deployments"]:
            spec_blob = items.get(record["spec_key"])
            if spec_blob is None:
                logger.error("serve controller: the checkpoint lacks the spec of %s/%s",
                             record["app"], record["name"])
                continue
            dep = _Deployment(app_name=record["app"], name=record["name"],
                              spec=cloudpickle.loads(spec_blob),
                              config_version=record["config_version"],
                              target_num=record["target_num"], deleting=record["deleting"],
                              constructor_failures=record["failures"],
                              message=record["message"])
            self._deployments[(dep.app_name, dep.name)] = dep
            for replica_id, version, config_version, stopping in record["replicas"]:
                replica = _Replica(replica_id=replica_id, version=version,
                                   config_version=config_version,
                                   state=ReplicaState.RECOVERING)
                dep.replicas.append(replica)
                lookups.append((dep, replica, stopping))
        for app in list(self._apps.values()):
            lost = [n for n in app.deployments if (app.name, n) not in self._deployments]
            if lost:
                # A state never names a spec the GCS lacks (specs are written
                # before it and deleted after it): only keys deleted from
                # outside get here. The application is lost, as with no
                # checkpoint (serve.run sends it again; its replicas, unknown
                # now, stop themselves).
                logger.error("serve controller: application %r lost deployment(s) %s with "
                             "the checkpoint", app.name, lost)
                for name in app.deployments:
                    dep = self._deployments.pop((app.name, name), None)
                    if dep is not None:
                        lookups = [item for item in lookups if item[0] is not dep]
                del self._apps[app.name]
        for node_id in snapshot["proxies"]:
            self._proxies[node_id] = _Proxy(node_id=node_id)
        for dep, replica, stopping in lookups:
            replica.start_task = _spawn(self._reattach(dep, replica, stopping))
        for proxy in self._proxies.values():
            proxy.task = _spawn(self._reattach_proxy(proxy))
        await self._checkpoint()

    async def _reattach(self, dep: _Deployment, replica: _Replica, stopping: bool) -> None:
        handle = None
        try:
            handle = await _common.lookup_actor.remote(replica.actor_name, SERVE_NAMESPACE)
        except Exception:  # noqa: BLE001 - treated as gone
            handle = None
        replica.handle = handle
        replica.created.set()
        if handle is None:
            self._remove(dep, replica)
            return
        if stopping:
            replica.state = ReplicaState.RUNNING
            self._stop_replica(dep, replica, graceful=True)
            return
        try:
            meta = await handle.initialize.remote(dep.spec.config.user_config,
                                                  dep.spec.config.user_config is not None)
        except Exception as error:  # noqa: BLE001 - dead, or its constructor failed
            logger.warning("serve controller: replica %s did not come back: %s",
                           replica.replica_id, _error_text(error))
            replica.state = ReplicaState.RUNNING
            self._stop_replica(dep, replica, graceful=False)
            return
        replica.node_id = meta.get("node_id", "")
        replica.state = ReplicaState.RUNNING
        replica.next_health_s = self._now() + dep.spec.config.health_check_period_s
        self._publish()  # as _start does: no answer names it under an older version

    async def _reattach_proxy(self, proxy: _Proxy) -> None:
        try:
            proxy.handle = await _common.lookup_actor.remote(PROXY_NAME_PREFIX + proxy.node_id,
                                                             SERVE_NAMESPACE)
        except Exception:  # noqa: BLE001
            proxy.handle = None
        if proxy.handle is None:
            proxy.status = ProxyStatus.UNHEALTHY
            proxy.retry_at_s = self._now()
            return
        await self._proxy_ready(proxy)

    # --------------------------------------------------------- client API

    async def deploy_application(self, name: str, route_prefix: str | None, ingress: str,
                                 specs: list) -> str:
        """Deploy (or update) an application; raises for a route prefix that
        another application uses. Returns the incarnation that took it (a
        later one that does not know it lost it with its checkpoint)."""
        await self._ensure_started()
        if self._shutting_down:
            raise RayServeException("Serve is shutting down")
        if route_prefix is not None:
            for other in self._apps.values():
                if other.name != name and not other.deleting and \
                        other.route_prefix == route_prefix:
                    raise RayServeException(
                        f'Prefix {route_prefix} is being used by application "{other.name}". '
                        f'Failed to deploy application "{name}".')
        app = self._apps.get(name)
        if app is not None and app.deleting:
            raise RayServeException(f"application {name!r} is being deleted; deploy it again "
                                    f"once serve.delete() returned")
        names = [spec.name for spec in specs]
        if app is None:
            app = _Application(name=name, route_prefix=route_prefix, ingress=ingress,
                               deployments=names, deployed_at_s=time.time())
            self._apps[name] = app
        else:
            for old_name in app.deployments:
                if old_name not in names:
                    self._deployments[(name, old_name)].deleting = True
            app.route_prefix = route_prefix
            app.ingress = ingress
            app.deployments = names + [n for n in app.deployments if n not in names]
            app.deployed_at_s = time.time()
            app.was_running = False
            app.message = ""
        app.status = ApplicationStatus.DEPLOYING
        for spec in specs:
            self._deploy(spec)
        self._dirty = True
        await self._checkpoint()
        self._publish()
        return self._incarnation

    def _deploy(self, spec: DeploymentSpec) -> None:
        key = (spec.app_name, spec.name)
        dep = self._deployments.get(key)
        config = spec.config
        if dep is None:
            dep = _Deployment(app_name=spec.app_name, name=spec.name, spec=spec,
                              target_num=config.initial_target())
            self._deployments[key] = dep
            return
        old = dep.spec
        dep.deleting = False
        dep.spec = spec
        if old.version != spec.version:
            dep.constructor_failures = 0
            dep.message = ""
            dep.status = DeploymentStatus.UPDATING
        if old.config != config:
            dep.config_version += 1
            if dep.status == DeploymentStatus.DEPLOY_FAILED:
                dep.constructor_failures = 0
                dep.status = DeploymentStatus.UPDATING
        scaling, old_scaling = config.autoscaling_config, old.config.autoscaling_config
        if scaling is None:
            dep.target_num = config.num_replicas
        elif old_scaling != scaling:
            dep.policy = PolicyState()
            dep.target_num = max(scaling.min_replicas, min(scaling.max_replicas,
                                                           dep.target_num if old_scaling
                                                           else config.initial_target()))
        for replica in dep.replicas:
            if replica.samples is not None and scaling is not None:
                replica.samples = LoadSamples(scaling)

    async def delete_applications(self, names: list) -> None:
        await self._ensure_started()
        for name in names:
            app = self._apps.get(name)
            if app is None:
                continue
            app.deleting = True
            app.status = ApplicationStatus.DELETING
            for dep_name in app.deployments:
                self._deployments[(name, dep_name)].deleting = True
        self._dirty = True
        await self._checkpoint()
        self._publish()

    async def wait_for_applications(self, names: list, statuses: list,
                                    timeout_s: float) -> dict:
        """Wait until each named application is gone or in one of
        ``statuses``, at most ``timeout_s``; returns their overviews (None:
        gone)."""
        await self._ensure_started()
        deadline = self._now() + timeout_s
        wanted = [ApplicationStatus(s) for s in statuses]
        while True:
            overviews = {name: self._app_overview(self._apps[name]) if name in self._apps
                         else None for name in names}
            if all(o is None or o.status in wanted for o in overviews.values()) or \
                    self._now() >= deadline:
                return overviews
            await asyncio.sleep(CONTROL_LOOP_PERIOD_S)

    async def wait_for_proxies(self, timeout_s: float) -> dict:
        """Wait until every proxy started (or failed to); their details."""
        await self._ensure_started()
        deadline = self._now() + timeout_s
        while True:
            details = self._proxy_details()
            settled = all(d.status != ProxyStatus.STARTING for d in details.values())
            expected = self._proxy_location != ProxyLocation.Disabled
            if (settled and (details or not expected)) or self._now() >= deadline:
                return details
            await asyncio.sleep(CONTROL_LOOP_PERIOD_S)

    async def get_serve_status(self) -> ServeStatus:
        await self._ensure_started()
        details = self._proxy_details()
        return ServeStatus(
            proxies={node: d.status for node, d in details.items()},
            applications={name: self._app_overview(app) for name, app in self._apps.items()},
            proxy_details=details)

    async def get_ingress(self, app_name: str):
        await self._ensure_started()
        app = self._apps.get(app_name)
        if app is None or app.deleting:
            return None
        return app.ingress

    async def get_deployment_names(self, app_name: str) -> list:
        await self._ensure_started()
        app = self._apps.get(app_name)
        return [] if app is None else list(app.deployments)

    async def get_http_config(self) -> tuple:
        await self._ensure_started()
        return self._http_options, self._proxy_location

    async def list_replicas(self, app_name: str, deployment: str) -> list:
        """(replica id, actor name, state, version) of a deployment's replicas."""
        await self._ensure_started()
        dep = self._deployments.get((app_name, deployment))
        if dep is None:
            return []
        return [(r.replica_id, r.actor_name, r.state.value, r.version) for r in dep.replicas]

    async def knows_replica(self, app_name: str, deployment: str, replica_id: str) -> bool:
        """Whether the replica is one of this controller's (a replica it does
        not know stops itself: _replica.py's "Orphans")."""
        await self._ensure_started()
        dep = self._deployments.get((app_name, deployment))
        return dep is not None and any(r.replica_id == replica_id for r in dep.replicas)

    async def was_drained(self, app_name: str, deployment: str, replica_id: str) -> bool:
        """Whether the replica was stopped after draining fully: a request
        that found it dead did not run there."""
        await self._ensure_started()
        dep = self._deployments.get((app_name, deployment))
        return dep is not None and replica_id in dep.drained

    async def report_dead_replica(self, replica_id: str) -> None:
        """A router saw this replica die: check it now."""
        await self._ensure_started()
        for dep in self._deployments.values():
            for replica in dep.replicas:
                if replica.replica_id == replica_id and replica.serving():
                    replica.next_health_s = 0.0

    async def shutdown(self) -> bool:
        """Delete every application and stop the proxies; True once all is
        gone (within SHUTDOWN_TIMEOUT_S)."""
        await self._ensure_started()
        self._shutting_down = True
        await self.delete_applications(list(self._apps))
        for proxy in self._proxies.values():
            proxy.status = ProxyStatus.DRAINING
        deadline = self._now() + SHUTDOWN_TIMEOUT_S
        while (self._apps or self._proxies) and self._now() < deadline:
            await asyncio.sleep(CONTROL_LOOP_PERIOD_S)
        if self._apps or self._proxies:
            return False
        # Nothing left: the checkpoint goes, and no write comes after (one
        # landing after serve.shutdown() would hand the next Serve this one's
        # HTTP options).
        async with self._lock():
            self._checkpoint_off = True
            try:
                await _kv_task(_common.delete_checkpoint_task).remote()
            except Exception as error:  # noqa: BLE001 - serve.shutdown() deletes it again
                logger.warning("serve controller: deleting the checkpoint failed: %s",
                               _error_text(error))
        return True

    async def statistics(self) -> ControllerStatistics:
        await self._ensure_started()
        states: dict = {}
        for dep in self._deployments.values():
            for replica in dep.replicas:
                states[replica.state.value] = states.get(replica.state.value, 0) + 1
        return ControllerStatistics(
            applications=len(self._apps), deployments=len(self._deployments),
            replicas=states, proxies=len(self._proxies),
            long_polls_waiting=self._waiting_polls, loop_iterations=self._iterations,
            incarnation=self._incarnation)

    # ---------------------------------------------------------- long poll

    async def listen_for_change(self, key: tuple, known_version, pending: int = 0):
        """The deployment's routing target (or the route table for
        ``("routes",)``) once its version differs from ``known_version``,
        else after LONG_POLL_TIMEOUT_S. ``pending``: requests the caller holds
        waiting for a replica (they count as load: scaling up from zero)."""
        await self._ensure_started()
        if key[0] == "deployment" and pending:
            dep = self._deployments.get((key[1], key[2]))
            if dep is not None:
                dep.demand_s, dep.demand = self._now(), pending
        current = self._current(key)
        if current.version != known_version:
            return current
        event = self._events.get(key)
        if event is None:
            event = self._events[key] = asyncio.Event()
        self._waiting_polls += 1
        try:
            await asyncio.wait_for(event.wait(), timeout=_common.LONG_POLL_TIMEOUT_S)
        except TimeoutError:
            pass
        finally:
            self._waiting_polls -= 1
        return self._current(key)

    async def current_targets(self, app_name: str) -> dict:
        """The routing targets of an application's deployments as of now
        (published first): ``serve.run`` hands them to the caller's routers,
        so that requests sent after it returned go to the new replicas."""
        await self._ensure_started()
        self._publish()
        return {dep.name: self._current(dep.key) for dep in self._deployments.values()
                if dep.app_name == app_name}

    async def routing_target(self, app_name: str, deployment: str) -> RoutingTarget:
        """The deployment's routing target as of now, without waiting: a
        router checks with it before it tells a caller that the deployment
        does not exist (its long poll's answer may be an old one)."""
        await self._ensure_started()
        self._publish()
        return self._current(("deployment", app_name, deployment))

    def _current(self, key: tuple):
        if key[0] == "routes":
            return self._routes
        dep = self._deployments.get((key[1], key[2]))
        if dep is None:
            return RoutingTarget(version=(self._incarnation, -1), exists=False)
        return self._routing_target(dep)

    def _routing_target(self, dep: _Deployment) -> RoutingTarget:
        replicas = tuple(ReplicaInfo(replica_id=r.replica_id, actor=r.handle,
                                     max_ongoing_requests=dep.spec.config.max_ongoing_requests,
                                     node_id=r.node_id)
                         for r in dep.replicas if r.serving() and r.handle is not None)
        reason = ""
        if dep.deleting:
            reason = "it is being deleted"
        elif dep.status == DeploymentStatus.DEPLOY_FAILED:
            reason = f"it failed to deploy: {dep.message[:500]}"
        return RoutingTarget(version=dep.routing_version, exists=True, replicas=replicas,
                             max_queued_requests=dep.spec.config.max_queued_requests,
                             unavailable_reason=reason)

    def _next_version(self) -> tuple:
        self._version_counter += 1
        return (self._incarnation, self._version_counter)

    def _notify(self, key: tuple) -> None:
        event = self._events.pop(key, None)
        if event is not None:
            event.set()

    def _publish(self) -> None:
        for dep in self._deployments.values():
            target = self._routing_target(dep)
            fingerprint = (tuple((r.replica_id, r.max_ongoing_requests) for r in target.replicas),
                           target.max_queued_requests, target.unavailable_reason)
            if fingerprint != dep.published:
                dep.published = fingerprint
                dep.routing_version = self._next_version()
                self._notify(dep.key)
        routes = {app.route_prefix: (app.name, app.ingress)
                  for app in self._apps.values()
                  if app.route_prefix is not None and not app.deleting}
        if routes != self._routes.routes:
            self._routes = RouteTable(version=self._next_version(), routes=routes)
            self._notify(("routes",))
        for key in [k for k in self._events if k[0] == "deployment" and
                    (k[1], k[2]) not in self._deployments]:
            self._notify(key)  # a deleted deployment: its pollers learn it is gone

    # -------------------------------------------------------- the loop step

    async def _step(self) -> None:
        now = self._now()
        for app in list(self._apps.values()):
            for dep_name in list(app.deployments):
                dep = self._deployments[(app.name, dep_name)]
                self._autoscale(dep, now)
                self._check_health(dep, now)
                self._sample_load(dep, now)
                self._reconcile(dep, now)
                self._update_deployment_status(dep)
                if dep.deleting and not dep.replicas:
                    del self._deployments[(app.name, dep_name)]
                    app.deployments.remove(dep_name)
                    self._dirty = True
            self._update_app_status(app)
            if app.deleting and not app.deployments:
                del self._apps[app.name]
                self._dirty = True
        self._manage_proxies(now)
        self._publish()
        if self._dirty and (self._write_task is None or self._write_task.done()):
            # Aside from the loop: while the GCS restarts the write waits for
            # it, and health checks, drains and routing go on meanwhile.
            self._write_task = _spawn(self._checkpoint())

    # ---------------------------------------------------------- reconcile

    def _reconcile(self, dep: _Deployment, now: float) -> None:
        version = dep.spec.version
        active = [r for r in dep.replicas if r.state != ReplicaState.STOPPING]
        new = [r for r in active if r.version == version]
        old = [r for r in active if r.version != version]
        target = 0 if dep.deleting else dep.target_num
        failed = dep.constructor_failures >= MAX_CONSTRUCTOR_FAILURES
        if not failed:
            for _ in range(target - len(new)):
                new.append(self._start_replica(dep))
        if len(new) > target:
            # Stop the extras: those still starting first, then the least
            # loaded (a drain is shortest there), then the newest.
            order = sorted(range(len(new)),
                           key=lambda i: (new[i].serving(), self._last_load(new[i]), -i))
            for index in order[:len(new) - target]:
                self._stop_replica(dep, new[index], graceful=True)
        serving_new = sum(1 for r in new if r.serving())
        keep_old = 0 if dep.deleting else max(0, target - serving_new)
        for replica in old:
            if not replica.serving() and replica.state != ReplicaState.RECOVERING:
                self._stop_replica(dep, replica, graceful=False)
        serving_old = [r for r in old if r.serving()]
        for replica in serving_old[keep_old:]:
            self._stop_replica(dep, replica, graceful=True)
        # Lightweight config changes, in place.
        for replica in new:
            if replica.state == ReplicaState.RUNNING and \
                    replica.config_version != dep.config_version and \
                    replica.reconfigure_task is None:
                replica.state = ReplicaState.UPDATING
                replica.reconfigure_task = _spawn(self._reconfigure(dep, replica))

    @staticmethod
    def _last_load(replica: _Replica) -> float:
        if replica.samples is None or not replica.samples.samples:
            return 0.0
        return replica.samples.samples[-1][1]

    def _start_replica(self, dep: _Deployment) -> _Replica:
        tag = f"{self._incarnation}-{self._counter}"
        self._counter += 1
        replica = _Replica(replica_id=f"{dep.app_name}#{dep.name}#{tag}",
                           version=dep.spec.version, config_version=dep.config_version)
        if dep.spec.config.autoscaling_config is not None:
            replica.samples = LoadSamples(dep.spec.config.autoscaling_config)
        dep.replicas.append(replica)
        self._dirty = True
        replica.start_task = _spawn(self._start(dep, replica))
        return replica

    async def _start(self, dep: _Deployment, replica: _Replica) -> None:
        from ._replica import ReplicaActor

        spec = dep.spec
        try:
            # Recorded before it exists: a restarted controller finds it.
            if not await self._checkpoint():
                raise RayServeException("the checkpoint could not be written")
            options = dict(spec.actor_options)
            options.setdefault("num_cpus", 1)
            options.update(name=replica.actor_name, namespace=SERVE_NAMESPACE,
                           lifetime="detached", max_restarts=0, max_task_retries=0)
            args = (replica.replica_id, spec.app_name, spec.name, spec.callable_blob,
                    spec.is_function, spec.is_asgi, spec.config.max_ongoing_requests,
                    self._self_handle)
            replica.handle = await _common.create_actor.remote(ReplicaActor, options, args,
                                                               "watch_controller")
        except Exception as error:  # noqa: BLE001 - could not even be created
            replica.created.set()
            self._start_failed(dep, replica, error, counts=False)
            return
        replica.created.set()
        try:
            meta = await replica.handle.initialize.remote(spec.config.user_config,
                                                          spec.config.user_config is not None)
        except Exception as error:  # noqa: BLE001 - judged below
            user_error = isinstance(error, tray.exceptions.TaskError)
            self._start_failed(dep, replica, error, counts=user_error)
            return
        if replica.state != ReplicaState.STARTING:
            return  # stopped meanwhile
        replica.node_id = meta.get("node_id", "")
        replica.state = ReplicaState.RUNNING
        replica.config_version = max(replica.config_version, 0)
        if replica.version == dep.spec.version:
            dep.constructor_failures = 0
        replica.next_health_s = self._now() + dep.spec.config.health_check_period_s
        self._publish()

    def _start_failed(self, dep: _Deployment, replica: _Replica, error: BaseException,
                      counts: bool) -> None:
        if replica.state == ReplicaState.STOPPING:
            return
        logger.warning("serve controller: replica %s failed to start: %s",
                       replica.replica_id, _error_text(error))
        if counts and replica.version == dep.spec.version:
            dep.constructor_failures += 1
            dep.message = (f"The deployment failed to start {dep.constructor_failures} times "
                           f"in a row. This may be due to a problem with its constructor or "
                           f"initial health check failing. Error:\n{error}")
        self._stop_replica(dep, replica, graceful=False)

    def _stop_replica(self, dep: _Deployment, replica: _Replica, graceful: bool) -> None:
        if replica.state == ReplicaState.STOPPING:
            return
        was_serving = replica.serving()
        replica.state = ReplicaState.STOPPING
        self._dirty = True
        replica.stop_task = _spawn(self._stop(dep, replica, graceful and was_serving))

    async def _stop(self, dep: _Deployment, replica: _Replica, graceful: bool) -> None:
        self._publish()  # routers stop sending here before it drains
        await replica.created.wait()
        handle = replica.handle
        config = dep.spec.config
        if handle is not None and graceful:
            try:
                left = await asyncio.wait_for(
                    _await(handle.prepare_for_shutdown.remote(
                        config.graceful_shutdown_wait_loop_s,
                        config.graceful_shutdown_timeout_s)),
                    timeout=config.graceful_shutdown_timeout_s +
                    config.graceful_shutdown_wait_loop_s + 5.0)
                if left == 0 and await self._exit_replica(dep, replica):
                    handle = None  # it ends by itself: a kill now could cut its last replies
            except Exception as error:  # noqa: BLE001 - it goes anyway
                logger.info("serve controller: replica %s did not drain: %s",
                            replica.replica_id, _error_text(error))
        if handle is not None:
            try:
                await _common.kill_actor.remote(handle)
            except Exception as error:  # noqa: BLE001 - it may be gone already
                logger.info("serve controller: killing %s: %s", replica.replica_id,
                            _error_text(error))
        self._remove(dep, replica)

    async def _exit_replica(self, dep: _Deployment, replica: _Replica) -> bool:
        """End a drained replica from inside (``exit_actor``), not by a kill:
        its process then sends the replies of the requests that finished
        last before it ends. A kill could cut off the reply of a request
        that ran (the replica counts it finished when its code returns, and
        the reply goes some time later), and the router that then found
        the replica dead would take it for drained and send the request
        again: it ran twice (simtest default seed 39). Whether it exited."""
        # Recorded first: a request that fails because of the exit asks at once.
        dep.drained.append(replica.replica_id)
        try:
            await asyncio.wait_for(_await(replica.handle.exit_gracefully.remote()),
                                   timeout=REPLICA_EXIT_TIMEOUT_S)
        except tray.exceptions.ActorDiedError:
            return True  # its exit: the caller of the exiting method hears this
        except Exception as error:  # noqa: BLE001 - killed instead: not drained then
            logger.info("serve controller: replica %s did not exit: %s", replica.replica_id,
                        _error_text(error))
        if replica.replica_id in dep.drained:
            dep.drained.remove(replica.replica_id)
        return False

    def _remove(self, dep: _Deployment, replica: _Replica) -> None:
        if replica in dep.replicas:
            dep.replicas.remove(replica)
            self._dirty = True

    async def _reconfigure(self, dep: _Deployment, replica: _Replica) -> None:
        config = dep.spec.config
        version = dep.config_version
        try:
            await replica.handle.reconfigure.remote(config.user_config,
                                                    config.user_config is not None,
                                                    config.max_ongoing_requests)
        except Exception as error:  # noqa: BLE001 - a replica that cannot take it is replaced
            logger.warning("serve controller: reconfiguring %s failed: %s",
                           replica.replica_id, _error_text(error))
            replica.reconfigure_task = None
            if replica.state == ReplicaState.UPDATING:
                replica.state = ReplicaState.RUNNING
                self._stop_replica(dep, replica, graceful=True)
            return
        replica.reconfigure_task = None
        replica.config_version = version
        self._dirty = True
        if replica.state == ReplicaState.UPDATING:
            replica.state = ReplicaState.RUNNING

    # ------------------------------------------------------------- health

    def _check_health(self, dep: _Deployment, now: float) -> None:
        config = dep.spec.config
        for replica in list(dep.replicas):
            if not replica.serving():
                continue
            task = replica.health_task
            if task is not None:
                if not task.done():
                    if now - replica.health_started_s > config.health_check_timeout_s:
                        replica.health_task = None  # abandoned: it may never answer
                        self._health_failed(dep, replica, "the health check timed out after "
                                            f"{config.health_check_timeout_s} s")
                    continue
                replica.health_task = None
                error = task.exception()
                if error is None:
                    replica.health_failures = 0
                elif isinstance(error, tray.exceptions.ActorError):
                    self._replica_died(dep, replica, error)
                    continue
                else:
                    self._health_failed(dep, replica, _error_text(error))
                    continue
            if replica.serving() and now >= replica.next_health_s:
                replica.next_health_s = now + config.health_check_period_s
                replica.health_started_s = now
                replica.health_task = _spawn(_await(replica.handle.check_health.remote()))

    def _health_failed(self, dep: _Deployment, replica: _Replica, why: str) -> None:
        replica.health_failures += 1
        logger.warning("serve controller: replica %s failed a health check (%d in a row): %s",
                       replica.replica_id, replica.health_failures, why)
        if replica.health_failures >= REPLICA_HEALTH_CHECK_UNHEALTHY_THRESHOLD:
            dep.unhealthy = True
            dep.message = f"replica {replica.replica_id} failed its health checks: {why}"
            self._stop_replica(dep, replica, graceful=False)

    def _replica_died(self, dep: _Deployment, replica: _Replica, error: BaseException) -> None:
        logger.warning("serve controller: replica %s died: %s", replica.replica_id,
                       _error_text(error))
        dep.unhealthy = True
        self._stop_replica(dep, replica, graceful=False)

    # -------------------------------------------------------- autoscaling

    def _sample_load(self, dep: _Deployment, now: float) -> None:
        scaling = dep.spec.config.autoscaling_config
        if scaling is None:
            return
        for replica in dep.replicas:
            if not replica.serving():
                continue
            if replica.samples is None:
                replica.samples = LoadSamples(scaling)
            task = replica.metrics_task
            if task is not None:
                if not task.done():
                    continue
                replica.metrics_task = None
                if task.exception() is None:
                    replica.samples.add(now, task.result())
            if now >= replica.next_metrics_s:
                replica.next_metrics_s = now + scaling.metrics_interval_s
                replica.metrics_task = _spawn(_await(replica.handle.get_metrics.remote()))

    def _load(self, dep: _Deployment, now: float) -> float:
        scaling = dep.spec.config.autoscaling_config
        total = 0.0
        for replica in dep.replicas:
            if replica.serving() and replica.samples is not None:
                mean = replica.samples.mean(now, scaling.look_back_period_s)
                if mean is not None:
                    total += mean
        if now - dep.demand_s <= scaling.look_back_period_s:
            total += dep.demand
        return total

    def _autoscale(self, dep: _Deployment, now: float) -> None:
        scaling = dep.spec.config.autoscaling_config
        if scaling is None or dep.deleting:
            return
        current = sum(1 for r in dep.replicas if r.serving())
        target = _autoscaling.decide(scaling, dep.policy, dep.target_num, current,
                                     self._load(dep, now))
        if target != dep.target_num:
            logger.info("serve controller: autoscaling %s/%s from %d to %d replicas",
                        dep.app_name, dep.name, dep.target_num, target)
            dep.status = DeploymentStatus.UPSCALING if target > dep.target_num else \
                DeploymentStatus.DOWNSCALING
            dep.target_num = target
            self._dirty = True

    # ------------------------------------------------------------- status

    def _update_deployment_status(self, dep: _Deployment) -> None:
        version = dep.spec.version
        running_new = sum(1 for r in dep.replicas
                          if r.version == version and r.state == ReplicaState.RUNNING)
        others = sum(1 for r in dep.replicas
                     if r.version != version or r.state != ReplicaState.RUNNING)
        if dep.constructor_failures >= MAX_CONSTRUCTOR_FAILURES and running_new == 0:
            dep.status = DeploymentStatus.DEPLOY_FAILED
        elif running_new == dep.target_num and others == 0:
            dep.status = DeploymentStatus.HEALTHY
            dep.unhealthy = False
            if dep.constructor_failures == 0:
                dep.message = ""
        elif dep.unhealthy:
            dep.status = DeploymentStatus.UNHEALTHY
        elif any(r.version != version and (r.serving() or r.state == ReplicaState.RECOVERING)
                 for r in dep.replicas):
            # A rolling update in progress, whatever the autoscaler decided
            # meanwhile: the application is not RUNNING (serve.run waits)
            # while replicas of the old version still take requests, or may
            # once re-attached after a restart (chaos seed 136: serve.run
            # returned, then an old replica came back and took a request).
            dep.status = DeploymentStatus.UPDATING
        elif dep.status not in (DeploymentStatus.UPSCALING, DeploymentStatus.DOWNSCALING):
            dep.status = DeploymentStatus.UPDATING

    def _update_app_status(self, app: _Application) -> None:
        if app.deleting:
            app.status = ApplicationStatus.DELETING
            return
        deps = [self._deployments[(app.name, n)] for n in app.deployments
                if not self._deployments[(app.name, n)].deleting]
        failed = [d for d in deps if d.status == DeploymentStatus.DEPLOY_FAILED]
        if failed:
            app.status = ApplicationStatus.DEPLOY_FAILED
            app.message = "\n".join(f"Deployment '{d.name}' failed to deploy: {d.message}"
                                    for d in failed)
            return
        if all(d.status in (DeploymentStatus.HEALTHY, DeploymentStatus.UPSCALING,
                            DeploymentStatus.DOWNSCALING) for d in deps) and \
                not any(d.deleting for d in self._app_deployments(app)):
            app.status = ApplicationStatus.RUNNING
            app.message = ""
            app.was_running = True
        elif app.was_running and any(d.status == DeploymentStatus.UNHEALTHY for d in deps):
            app.status = ApplicationStatus.UNHEALTHY
            app.message = "\n".join(d.message for d in deps if d.message)
        elif not app.was_running:
            app.status = ApplicationStatus.DEPLOYING

    def _app_deployments(self, app: _Application) -> list:
        return [self._deployments[(app.name, n)] for n in app.deployments]

    def _app_overview(self, app: _Application) -> ApplicationStatusOverview:
        deployments = {}
        for dep in self._app_deployments(app):
            states: dict = {}
            for replica in dep.replicas:
                states[replica.state.value] = states.get(replica.state.value, 0) + 1
            deployments[dep.name] = DeploymentStatusOverview(
                status=dep.status, replica_states=states, message=dep.message,
                target_num_replicas=0 if dep.deleting else dep.target_num)
        return ApplicationStatusOverview(
            status=app.status, message=app.message, last_deployed_time_s=app.deployed_at_s,
            deployments=deployments, route_prefix=app.route_prefix, ingress=app.ingress)

    # ------------------------------------------------------------ proxies

    def _proxy_details(self) -> dict:
        host, port = self._http_options.host, self._http_options.port
        return {node: ProxyDetails(node_id=node, status=proxy.status, host=host, port=port,
                                   message=proxy.message)
                for node, proxy in self._proxies.items()}

    def _wanted_proxy_nodes(self, now: float) -> list:
        if self._shutting_down or self._proxy_location == ProxyLocation.Disabled:
            return []
        if self._proxy_location == ProxyLocation.HeadOnly:
            return [self._head_node_id]
        if now - self._nodes_refresh_s >= NODES_REFRESH_PERIOD_S and \
                (self._nodes_task is None or self._nodes_task.done()):
            if self._nodes_task is not None and self._nodes_task.exception() is None:
                self._alive_nodes = self._nodes_task.result()
            self._nodes_refresh_s = now
            self._nodes_task = _spawn(_await(_common.alive_node_ids.remote()))
        return self._alive_nodes or [self._head_node_id]

    def _manage_proxies(self, now: float) -> None:
        wanted = self._wanted_proxy_nodes(now)
        for node_id in wanted:
            if node_id not in self._proxies:
                self._proxies[node_id] = _Proxy(node_id=node_id)
                self._dirty = True
        for node_id, proxy in list(self._proxies.items()):
            if proxy.task is not None and not proxy.task.done():
                continue
            if node_id not in wanted:
                proxy.status = ProxyStatus.DRAINING
                proxy.task = _spawn(self._stop_proxy(proxy))
            elif proxy.handle is None:
                if now >= proxy.retry_at_s:
                    proxy.status = ProxyStatus.STARTING
                    proxy.task = _spawn(self._start_proxy(proxy))
            elif now >= proxy.next_check_s:
                proxy.next_check_s = now + PROXY_HEALTH_CHECK_PERIOD_S
                proxy.task = _spawn(self._check_proxy(proxy))

    async def _start_proxy(self, proxy: _Proxy) -> None:
        from ..util.scheduling_strategies import NodeAffinitySchedulingStrategy
        from ._proxy import ProxyActor

        try:
            options = dict(name=PROXY_NAME_PREFIX + proxy.node_id, namespace=SERVE_NAMESPACE,
                           lifetime="detached", num_cpus=0, max_restarts=0,
                           scheduling_strategy=NodeAffinitySchedulingStrategy(proxy.node_id,
                                                                              soft=False))
            proxy.handle = await _common.create_actor.remote(
                ProxyActor, options, (proxy.node_id, self._http_options, self._self_handle))
        except Exception as error:  # noqa: BLE001 - tried again after a pause
            proxy.status = ProxyStatus.UNHEALTHY
            proxy.message = _error_text(error)
            proxy.retry_at_s = self._now() + PROXY_RESTART_BACKOFF_S
            return
        await self._proxy_ready(proxy)

    async def _proxy_ready(self, proxy: _Proxy) -> None:
        try:
            await proxy.handle.ready.remote()
        except Exception as error:  # noqa: BLE001 - e.g. the port is taken
            proxy.status = ProxyStatus.UNHEALTHY
            proxy.message = _error_text(error)
            logger.warning("serve controller: the HTTP proxy on node %s failed to start: %s",
                           proxy.node_id, proxy.message)
            handle, proxy.handle = proxy.handle, None
            proxy.retry_at_s = self._now() + PROXY_RESTART_BACKOFF_S
            await _kill_quietly(handle)
            return
        proxy.status = ProxyStatus.HEALTHY
        proxy.message = ""
        proxy.next_check_s = self._now() + PROXY_HEALTH_CHECK_PERIOD_S

    async def _check_proxy(self, proxy: _Proxy) -> None:
        try:
            await asyncio.wait_for(_await(proxy.handle.check_health.remote()),
                                   timeout=PROXY_HEALTH_CHECK_PERIOD_S)
        except Exception as error:  # noqa: BLE001 - replaced
            proxy.status = ProxyStatus.UNHEALTHY
            proxy.message = _error_text(error)
            handle, proxy.handle = proxy.handle, None
            proxy.retry_at_s = self._now()
            await _kill_quietly(handle)

    async def _stop_proxy(self, proxy: _Proxy) -> None:
        handle = proxy.handle
        if handle is not None:
            try:
                await asyncio.wait_for(_await(handle.shutdown.remote()), timeout=10.0)
            except Exception:  # noqa: BLE001 - killed anyway
                pass
            await _kill_quietly(handle)
        self._proxies.pop(proxy.node_id, None)
        self._dirty = True


async def _kill_quietly(handle) -> None:
    if handle is None:
        return
    try:
        await _common.kill_actor.remote(handle)
    except Exception:  # noqa: BLE001 - gone already
        pass


ControllerActor = tray.remote(max_concurrency=CONTROLLER_CONCURRENCY)(ServeController)
