"""The Serve controller: one detached, restartable actor that owns what runs.

It keeps the applications and their deployments, and brings the replicas
to what they ask for in a control loop (every ``CONTROL_LOOP_PERIOD_S``).
As in Ray Serve's ``_private/``, each concern has a module of its own; this
actor holds the state (applications and deployments, by name), owns one
piece of each concern, runs the loop, and answers its callers by
delegating:

* ``_application_state``: applications: deploy, delete, status.
* ``_deployment_state``: each deployment's replicas: reconcile (rolling
  updates, in-place reconfigure), graceful stops, health checks, start
  failures (``DEPLOY_FAILED``).
* ``_autoscaling_state``: deployments with an ``autoscaling_config``: their
  replicas' load, sampled every ``metrics_interval_s``, and the target that
  follows ``_autoscaling.decide`` (Ray's default policy).
* ``_proxy_state``: with HTTP enabled, an HTTP proxy actor per node (or on
  the head only), replaced when it dies.
* ``_long_poll``: routers and proxies long-poll it (``listen_for_change``)
  for the replicas of a deployment and for the route table; every change is
  published at the end of the loop step that made it, under a version
  ``(incarnation, n)`` that grows across restarts of the controller.
* ``_checkpoint`` and ``_snapshot``: **restarts**. The state is
  checkpointed to the GCS's key-value store after every change, and a
  replica is recorded there *before* it is created, so a restarted
  controller (tray restarts it: ``max_restarts=-1``) finds every replica it
  made: it reads the state back, looks each replica up by name, re-attaches
  the live ones and forgets the dead ones.

Everything here runs on the actor's asyncio loop: on trio-asyncio, so in
the simulator on virtual time, deterministically. Decisions iterate dicts
and lists in insertion order, never sets, and draw no randomness."""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

import tray

from . import _common
from ._aio import error_text, loop_time, spawn
from ._application_state import ApplicationState, ApplicationStateManager
from ._autoscaling import CONTROL_LOOP_PERIOD_S
from ._autoscaling_state import autoscale, record_demand, sample_load
from ._checkpoint import Checkpointer
from ._common import SERVE_NAMESPACE, STATE_KEY, RoutingTarget
from ._deployment_state import DeploymentState, DeploymentStateManager
from ._long_poll import LongPollHost
from ._proxy_state import ProxyStateManager
from ._snapshot import restore, snapshot
from ._status import ApplicationStatus, ProxyStatus, ServeStatus
from .config import HTTPOptions, ProxyLocation
from .exceptions import RayServeException

logger = logging.getLogger("tray.serve")

CONTROLLER_CONCURRENCY = 10_000  # long polls of routers and proxies, and client calls
SHUTDOWN_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class ControllerStatistics:
    applications: int
    deployments: int
    replicas: dict  # state -> count
    proxies: int
    long_polls_waiting: int
    loop_iterations: int
    incarnation: str


class ServeController:
    """The controller actor (see the module's header)."""

    def __init__(self, http_options: HTTPOptions, proxy_location: ProxyLocation,
                 head_node_id: str) -> None:
        # The state: the pieces below share these dicts, which are changed
        # in place, never replaced.
        self._apps: dict[str, ApplicationState] = {}
        self._deployments: dict[tuple, DeploymentState] = {}
        self._checkpointer = Checkpointer(self._snapshot, self._deployments)
        self._long_poll = LongPollHost(self._deployments, self._apps)
        self._deployment_states = DeploymentStateManager(self._deployments, self._checkpointer,
                                                         self._long_poll.publish)
        self._application_states = ApplicationStateManager(self._apps, self._deployment_states)
        self._proxy_states = ProxyStateManager(http_options, proxy_location, head_node_id,
                                               self._checkpointer)
        self._incarnation = ""
        self._loop_task: asyncio.Task | None = None
        self._ready: asyncio.Event | None = None
        self._iterations = 0
        self._shutting_down = False
        self._started_s = 0.0

    def _snapshot(self) -> dict:
        return snapshot(self._application_states, self._deployment_states, self._proxy_states)

    # -------------------------------------------------------- lifecycle

    async def _ensure_started(self) -> None:
        if self._loop_task is None:
            self._ready = asyncio.Event()
            self._loop_task = asyncio.get_running_loop().create_task(self._run())
        await self._ready.wait()

    async def _run(self) -> None:
        self._started_s = loop_time()
        # Ids of this incarnation: virtual time in the simulator, so they replay.
        # Fixed width, so that a later incarnation's id sorts after an earlier
        # one's (routers order routing targets by (incarnation, n)).
        self._incarnation = f"{int(time.time() * 1000):012x}"
        self._long_poll.incarnation = self._incarnation
        self._deployment_states.incarnation = self._incarnation
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
                               "again", error_text(error))
                await asyncio.sleep(min(0.05 * 2 ** min(failures, 6), 2.0))
        self._ready.set()
        while True:
            try:
                await self._step()
            except Exception as error:  # noqa: BLE001 - one bad step must not end the loop
                logger.exception("serve controller: control loop step failed: %s", error)
            self._iterations += 1
            await asyncio.sleep(CONTROL_LOOP_PERIOD_S)

    async def _recover(self) -> None:
        """Read the checkpoint back (_snapshot.py's header), or write the
        first one."""
        import cloudpickle

        self._apps.clear()  # what an earlier attempt got before it failed
        self._deployments.clear()
        self._proxy_states.proxies.clear()
        self._checkpointer.forget()
        handle = await _common.lookup_actor.remote(_common.CONTROLLER_NAME, SERVE_NAMESPACE)
        self._deployment_states.controller_handle = handle
        self._proxy_states.controller_handle = handle
        items = await self._checkpointer.read()
        state = items.get(STATE_KEY)
        if state is None:  # a new Serve (or one whose checkpoint was deleted)
            await self._checkpointer.checkpoint()
            return
        lookups = restore(cloudpickle.loads(state), items, self._application_states,
                          self._deployment_states, self._proxy_states)
        for dep, replica, stopping in lookups:
            replica.start_task = spawn(self._deployment_states.reattach(dep, replica, stopping))
        for proxy in self._proxy_states.proxies.values():
            proxy.task = spawn(self._proxy_states.reattach(proxy))
        await self._checkpointer.checkpoint()

    async def ping(self) -> str:
        await self._ensure_started()
        return self._incarnation

    # --------------------------------------------------------- client API

    async def deploy_application(self, name: str, route_prefix: str | None, ingress: str,
                                 specs: list) -> str:
        """Deploy (or update) an application; raises for a route prefix that
        another application uses. Returns the incarnation that took it (a
        later one that does not know it lost it with its checkpoint)."""
        await self._ensure_started()
        if self._shutting_down:
            raise RayServeException("Serve is shutting down")
        self._application_states.deploy(name, route_prefix, ingress, specs)
        self._checkpointer.dirty = True
        await self._checkpointer.checkpoint()
        self._long_poll.publish()
        return self._incarnation

    async def delete_applications(self, names: list) -> None:
        await self._ensure_started()
        self._application_states.delete(names)
        self._checkpointer.dirty = True
        await self._checkpointer.checkpoint()
        self._long_poll.publish()

    async def wait_for_applications(self, names: list, statuses: list,
                                    timeout_s: float) -> dict:
        """Wait until each named application is gone or in one of
        ``statuses``, at most ``timeout_s``; returns their overviews (None:
        gone)."""
        await self._ensure_started()
        deadline = loop_time() + timeout_s
        wanted = [ApplicationStatus(s) for s in statuses]
        while True:
            overviews = {name: self._application_states.overview(self._apps[name])
                         if name in self._apps else None for name in names}
            if all(o is None or o.status in wanted for o in overviews.values()) or \
                    loop_time() >= deadline:
                return overviews
            await asyncio.sleep(CONTROL_LOOP_PERIOD_S)

    async def wait_for_proxies(self, timeout_s: float) -> dict:
        """Wait until every proxy started (or failed to); their details."""
        await self._ensure_started()
        deadline = loop_time() + timeout_s
        while True:
            details = self._proxy_states.details()
            settled = all(d.status != ProxyStatus.STARTING for d in details.values())
            expected = self._proxy_states.proxy_location != ProxyLocation.Disabled
            if (settled and (details or not expected)) or loop_time() >= deadline:
                return details
            await asyncio.sleep(CONTROL_LOOP_PERIOD_S)

    async def get_serve_status(self) -> ServeStatus:
        await self._ensure_started()
        details = self._proxy_states.details()
        return ServeStatus(
            proxies={node: d.status for node, d in details.items()},
            applications={name: self._application_states.overview(app)
                          for name, app in self._apps.items()},
            proxy_details=details)

    async def get_ingress(self, app_name: str):
        await self._ensure_started()
        return self._application_states.ingress(app_name)

    async def get_deployment_names(self, app_name: str) -> list:
        await self._ensure_started()
        return self._application_states.deployment_names(app_name)

    async def get_http_config(self) -> tuple:
        await self._ensure_started()
        return self._proxy_states.http_options, self._proxy_states.proxy_location

    async def list_replicas(self, app_name: str, deployment: str) -> list:
        """(replica id, actor name, state, version) of a deployment's replicas."""
        await self._ensure_started()
        return self._deployment_states.list_replicas(app_name, deployment)

    async def knows_replica(self, app_name: str, deployment: str, replica_id: str) -> bool:
        """Whether the replica is one of this controller's (a replica it does
        not know stops itself: _replica.py's "Orphans")."""
        await self._ensure_started()
        return self._deployment_states.knows_replica(app_name, deployment, replica_id)

    async def was_drained(self, app_name: str, deployment: str, replica_id: str) -> bool:
        """Whether the replica was stopped after draining fully: a request
        that found it dead did not run there."""
        await self._ensure_started()
        return self._deployment_states.was_drained(app_name, deployment, replica_id)

    async def report_dead_replica(self, replica_id: str) -> None:
        """A router saw this replica die: check it now."""
        await self._ensure_started()
        self._deployment_states.report_dead_replica(replica_id)

    async def shutdown(self) -> bool:
        """Delete every application and stop the proxies; True once all is
        gone (within SHUTDOWN_TIMEOUT_S)."""
        await self._ensure_started()
        self._shutting_down = True
        await self.delete_applications(list(self._apps))
        proxies = self._proxy_states.proxies
        for proxy in proxies.values():
            proxy.status = ProxyStatus.DRAINING
        deadline = loop_time() + SHUTDOWN_TIMEOUT_S
        while (self._apps or proxies) and loop_time() < deadline:
            await asyncio.sleep(CONTROL_LOOP_PERIOD_S)
        if self._apps or proxies:
            return False
        # Nothing left: the checkpoint goes, and no write comes after.
        await self._checkpointer.delete()
        return True

    async def statistics(self) -> ControllerStatistics:
        await self._ensure_started()
        states: dict = {}
        for dep in self._deployments.values():
            for replica in dep.replicas:
                states[replica.state.value] = states.get(replica.state.value, 0) + 1
        return ControllerStatistics(
            applications=len(self._apps), deployments=len(self._deployments),
            replicas=states, proxies=len(self._proxy_states.proxies),
            long_polls_waiting=self._long_poll.waiting_polls, loop_iterations=self._iterations,
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
                record_demand(dep, pending, loop_time())
        return await self._long_poll.listen(key, known_version)

    async def current_targets(self, app_name: str) -> dict:
        """The routing targets of an application's deployments as of now
        (published first): ``serve.run`` hands them to the caller's routers,
        so that requests sent after it returned go to the new replicas."""
        await self._ensure_started()
        return self._long_poll.current_targets(app_name)

    async def routing_target(self, app_name: str, deployment: str) -> RoutingTarget:
        """The deployment's routing target as of now, without waiting: a
        router checks with it before it tells a caller that the deployment
        does not exist (its long poll's answer may be an old one)."""
        await self._ensure_started()
        self._long_poll.publish()
        return self._long_poll.current(("deployment", app_name, deployment))

    # -------------------------------------------------------- the loop step

    async def _step(self) -> None:
        now = loop_time()
        deployment_states = self._deployment_states
        for app in list(self._apps.values()):
            for dep_name in list(app.deployments):
                dep = self._deployments[(app.name, dep_name)]
                if autoscale(dep, now):
                    self._checkpointer.dirty = True
                deployment_states.check_health(dep, now)
                sample_load(dep, now)
                deployment_states.reconcile(dep, now)
                deployment_states.update_status(dep)
                if dep.deleting and not dep.replicas:
                    del self._deployments[(app.name, dep_name)]
                    app.deployments.remove(dep_name)
                    self._checkpointer.dirty = True
            self._application_states.update_status(app)
            if app.deleting and not app.deployments:
                del self._apps[app.name]
                self._checkpointer.dirty = True
        self._proxy_states.manage(now, self._shutting_down)
        self._long_poll.publish()
        self._checkpointer.write_if_dirty()


ControllerActor = tray.remote(max_concurrency=CONTROLLER_CONCURRENCY)(ServeController)
