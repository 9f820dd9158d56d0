"""The replicas of each deployment (Ray Serve's ``deployment_state.py``):
start, stop, health, reconfigure, rolling updates.

Once per control-loop step the controller has each deployment

* **reconciled**: replicas of the deployment's current version start until
  there are as many as its target, and the rest stop. A new version (new
  code, arguments or actor options) is a **rolling update**: new replicas
  start beside the old ones, and an old one is stopped only once a new one
  runs in its place, so capacity never drops and no request finds no
  replica; a changed ``user_config`` or ``max_ongoing_requests`` is applied
  to running replicas in place (``reconfigure``).
* **health-checked**: every ``health_check_period_s`` each running
  replica's ``check_health`` runs (the user's, if the class has one); a dead
  replica, ``REPLICA_HEALTH_CHECK_UNHEALTHY_THRESHOLD`` failed checks in a
  row, or one check past ``health_check_timeout_s`` get it replaced. Routers
  that see a replica die report it, which triggers a check at once.

A stopped replica **stops gracefully**: it leaves the routing table first
(routers learn through their long polls), then drains
(``prepare_for_shutdown``), then exits or is killed. A replica whose
constructor raises is retried; after ``MAX_CONSTRUCTOR_FAILURES`` in a row
with none of the version running, the deployment is ``DEPLOY_FAILED`` with
the error. A replica is recorded in the checkpoint *before* it is created,
so a restarted controller finds it and re-attaches it (``reattach``)."""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import tray

from . import _common
from ._aio import await_ref, error_text, loop_time, spawn
from ._autoscaling import LoadSamples, PolicyState
from ._checkpoint import Checkpointer
from ._common import SERVE_NAMESPACE, replica_actor_name
from ._deployment import DeploymentSpec
from ._status import DeploymentStatus, ReplicaState
from .exceptions import RayServeException

logger = logging.getLogger("tray.serve")

MAX_CONSTRUCTOR_FAILURES = 3
REPLICA_HEALTH_CHECK_UNHEALTHY_THRESHOLD = 3
REPLICA_EXIT_TIMEOUT_S = 10.0
DRAINED_REMEMBERED = 1000  # per deployment


# ================================================================== state


@dataclass
class DeploymentReplica:
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
class DeploymentState:
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


def _last_load(replica: DeploymentReplica) -> float:
    if replica.samples is None or not replica.samples.samples:
        return 0.0
    return replica.samples.samples[-1][1]


# ================================================================ manager


class DeploymentStateManager:
    """The lives of the replicas of ``deployments`` (the controller's
    deployments' states, by ``(app, name)``). ``checkpointer`` is told of
    every change; ``publish`` (the long poll's) tells routers of a replica
    that starts or stops. The controller sets ``incarnation`` (the prefix of
    the replicas' ids) and ``controller_handle`` (handed to every replica)
    when it starts."""

    def __init__(self, deployments: dict, checkpointer: Checkpointer,
                 publish: Callable[[], None]) -> None:
        self.deployments: dict[tuple, DeploymentState] = deployments
        self.counter = 0  # replicas made; checkpointed, so ids never repeat
        self.incarnation = ""
        self.controller_handle = None
        self._checkpointer = checkpointer
        self._publish = publish

    # ------------------------------------------------------------ lookups

    def list_replicas(self, app_name: str, deployment: str) -> list:
        dep = self.deployments.get((app_name, deployment))
        if dep is None:
            return []
        return [(r.replica_id, r.actor_name, r.state.value, r.version) for r in dep.replicas]

    def knows_replica(self, app_name: str, deployment: str, replica_id: str) -> bool:
        dep = self.deployments.get((app_name, deployment))
        return dep is not None and any(r.replica_id == replica_id for r in dep.replicas)

    def was_drained(self, app_name: str, deployment: str, replica_id: str) -> bool:
        dep = self.deployments.get((app_name, deployment))
        return dep is not None and replica_id in dep.drained

    def report_dead_replica(self, replica_id: str) -> None:
        for dep in self.deployments.values():
            for replica in dep.replicas:
                if replica.replica_id == replica_id and replica.serving():
                    replica.next_health_s = 0.0

    # ------------------------------------------------------------- deploy

    def deploy(self, spec: DeploymentSpec) -> None:
        """Make the deployment's state, or move it to ``spec``."""
        key = (spec.app_name, spec.name)
        dep = self.deployments.get(key)
        config = spec.config
        if dep is None:
            dep = DeploymentState(app_name=spec.app_name, name=spec.name, spec=spec,
                                  target_num=config.initial_target())
            self.deployments[key] = dep
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

    # ---------------------------------------------------------- reconcile

    def reconcile(self, dep: DeploymentState, now: float) -> None:
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
                           key=lambda i: (new[i].serving(), _last_load(new[i]), -i))
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
                replica.reconfigure_task = spawn(self._reconfigure(dep, replica))

    def _start_replica(self, dep: DeploymentState) -> DeploymentReplica:
        tag = f"{self.incarnation}-{self.counter}"
        self.counter += 1
        replica = DeploymentReplica(replica_id=f"{dep.app_name}#{dep.name}#{tag}",
                                    version=dep.spec.version,
                                    config_version=dep.config_version)
        if dep.spec.config.autoscaling_config is not None:
            replica.samples = LoadSamples(dep.spec.config.autoscaling_config)
        dep.replicas.append(replica)
        self._checkpointer.dirty = True
        replica.start_task = spawn(self._start(dep, replica))
        return replica

    async def _start(self, dep: DeploymentState, replica: DeploymentReplica) -> None:
        from ._replica import ReplicaActor

        spec = dep.spec
        try:
            # Recorded before it exists: a restarted controller finds it.
            if not await self._checkpointer.checkpoint():
                raise RayServeException("the checkpoint could not be written")
            options = dict(spec.actor_options)
            options.setdefault("num_cpus", 1)
            options.update(name=replica.actor_name, namespace=SERVE_NAMESPACE,
                           lifetime="detached", max_restarts=0, max_task_retries=0)
            args = (replica.replica_id, spec.app_name, spec.name, spec.callable_blob,
                    spec.is_function, spec.is_asgi, spec.config.max_ongoing_requests,
                    self.controller_handle)
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
        replica.next_health_s = loop_time() + dep.spec.config.health_check_period_s
        self._publish()

    def _start_failed(self, dep: DeploymentState, replica: DeploymentReplica,
                      error: BaseException, counts: bool) -> None:
        if replica.state == ReplicaState.STOPPING:
            return
        logger.warning("serve controller: replica %s failed to start: %s",
                       replica.replica_id, error_text(error))
        if counts and replica.version == dep.spec.version:
            dep.constructor_failures += 1
            dep.message = (f"The deployment failed to start {dep.constructor_failures} times "
                           f"in a row. This may be due to a problem with its constructor or "
                           f"initial health check failing. Error:\n{error}")
        self._stop_replica(dep, replica, graceful=False)

    def _stop_replica(self, dep: DeploymentState, replica: DeploymentReplica,
                      graceful: bool) -> None:
        if replica.state == ReplicaState.STOPPING:
            return
        was_serving = replica.serving()
        replica.state = ReplicaState.STOPPING
        self._checkpointer.dirty = True
        replica.stop_task = spawn(self._stop(dep, replica, graceful and was_serving))

    async def _stop(self, dep: DeploymentState, replica: DeploymentReplica,
                    graceful: bool) -> None:
        self._publish()  # routers stop sending here before it drains
        await replica.created.wait()
        handle = replica.handle
        config = dep.spec.config
        if handle is not None and graceful:
            try:
                left = await asyncio.wait_for(
                    await_ref(handle.prepare_for_shutdown.remote(
                        config.graceful_shutdown_wait_loop_s,
                        config.graceful_shutdown_timeout_s)),
                    timeout=config.graceful_shutdown_timeout_s +
                    config.graceful_shutdown_wait_loop_s + 5.0)
                if left == 0 and await self._exit_replica(dep, replica):
                    handle = None  # it ends by itself: a kill now could cut its last replies
            except Exception as error:  # noqa: BLE001 - it goes anyway
                logger.info("serve controller: replica %s did not drain: %s",
                            replica.replica_id, error_text(error))
        if handle is not None:
            try:
                await _common.kill_actor.remote(handle)
            except Exception as error:  # noqa: BLE001 - it may be gone already
                logger.info("serve controller: killing %s: %s", replica.replica_id,
                            error_text(error))
        self._remove(dep, replica)

    async def _exit_replica(self, dep: DeploymentState, replica: DeploymentReplica) -> bool:
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
            await asyncio.wait_for(await_ref(replica.handle.exit_gracefully.remote()),
                                   timeout=REPLICA_EXIT_TIMEOUT_S)
        except tray.exceptions.ActorDiedError:
            return True  # its exit: the caller of the exiting method hears this
        except Exception as error:  # noqa: BLE001 - killed instead: not drained then
            logger.info("serve controller: replica %s did not exit: %s", replica.replica_id,
                        error_text(error))
        if replica.replica_id in dep.drained:
            dep.drained.remove(replica.replica_id)
        return False

    def _remove(self, dep: DeploymentState, replica: DeploymentReplica) -> None:
        if replica in dep.replicas:
            dep.replicas.remove(replica)
            self._checkpointer.dirty = True

    async def _reconfigure(self, dep: DeploymentState, replica: DeploymentReplica) -> None:
        config = dep.spec.config
        version = dep.config_version
        try:
            await replica.handle.reconfigure.remote(config.user_config,
                                                    config.user_config is not None,
                                                    config.max_ongoing_requests)
        except Exception as error:  # noqa: BLE001 - a replica that cannot take it is replaced
            logger.warning("serve controller: reconfiguring %s failed: %s",
                           replica.replica_id, error_text(error))
            replica.reconfigure_task = None
            if replica.state == ReplicaState.UPDATING:
                replica.state = ReplicaState.RUNNING
                self._stop_replica(dep, replica, graceful=True)
            return
        replica.reconfigure_task = None
        replica.config_version = version
        self._checkpointer.dirty = True
        if replica.state == ReplicaState.UPDATING:
            replica.state = ReplicaState.RUNNING

    async def reattach(self, dep: DeploymentState, replica: DeploymentReplica,
                       stopping: bool) -> None:
        """After a restart: find the checkpoint's replica by name and take it
        back (``initialize`` is idempotent), or forget it if it is gone."""
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
                           replica.replica_id, error_text(error))
            replica.state = ReplicaState.RUNNING
            self._stop_replica(dep, replica, graceful=False)
            return
        replica.node_id = meta.get("node_id", "")
        replica.state = ReplicaState.RUNNING
        if meta.get("draining"):
            # An earlier incarnation began to stop it, and died before its
            # checkpoint said so: it drains (then refuses every request with
            # ReplicaDrainedError), so it is stopped again, not routed to
            # (chaos seed 98: routers sent to it for good).
            self._stop_replica(dep, replica, graceful=True)
            return
        replica.next_health_s = loop_time() + dep.spec.config.health_check_period_s
        self._publish()  # as _start does: no answer names it under an older version

    # ------------------------------------------------------------- health

    def check_health(self, dep: DeploymentState, now: float) -> None:
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
                    self._health_failed(dep, replica, error_text(error))
                    continue
            if replica.serving() and now >= replica.next_health_s:
                replica.next_health_s = now + config.health_check_period_s
                replica.health_started_s = now
                replica.health_task = spawn(await_ref(replica.handle.check_health.remote()))

    def _health_failed(self, dep: DeploymentState, replica: DeploymentReplica,
                       why: str) -> None:
        replica.health_failures += 1
        logger.warning("serve controller: replica %s failed a health check (%d in a row): %s",
                       replica.replica_id, replica.health_failures, why)
        if replica.health_failures >= REPLICA_HEALTH_CHECK_UNHEALTHY_THRESHOLD:
            dep.unhealthy = True
            dep.message = f"replica {replica.replica_id} failed its health checks: {why}"
            self._stop_replica(dep, replica, graceful=False)

    def _replica_died(self, dep: DeploymentState, replica: DeploymentReplica,
                      error: BaseException) -> None:
        logger.warning("serve controller: replica %s died: %s", replica.replica_id,
                       error_text(error))
        dep.unhealthy = True
        self._stop_replica(dep, replica, graceful=False)

    # ------------------------------------------------------------- status

    def update_status(self, dep: DeploymentState) -> None:
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
