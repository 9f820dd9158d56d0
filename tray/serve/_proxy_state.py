"""The HTTP proxies (Ray Serve's ``proxy_state.py``): with HTTP enabled, a
proxy actor per alive node (``ProxyLocation.EveryNode``) or on the head
only (``HeadOnly``), each named ``SERVE_PROXY_ACTOR-<node id>``, detached
and pinned to its node.

Once per control-loop step the controller has them managed: a wanted node
without a proxy gets one (after ``PROXY_RESTART_BACKOFF_S`` when the last
start failed); a running one is health-checked every
``PROXY_HEALTH_CHECK_PERIOD_S`` and replaced when a check fails; one on a
node no longer wanted (gone, or Serve shutting down) drains and is killed,
even while it starts (a start on a dead node would never end).
The alive nodes are asked every ``NODES_REFRESH_PERIOD_S``."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from . import _common
from ._aio import await_ref, error_text, loop_time, spawn
from ._checkpoint import Checkpointer
from ._common import PROXY_NAME_PREFIX, SERVE_NAMESPACE
from ._status import ProxyDetails, ProxyStatus
from .config import HTTPOptions, ProxyLocation

logger = logging.getLogger("tray.serve")

PROXY_HEALTH_CHECK_PERIOD_S = 10.0
PROXY_RESTART_BACKOFF_S = 5.0
NODES_REFRESH_PERIOD_S = 5.0
PROXY_SHUTDOWN_TIMEOUT_S = 10.0


@dataclass
class ProxyState:
    node_id: str
    status: ProxyStatus = ProxyStatus.STARTING
    handle: object = None
    message: str = ""
    task: asyncio.Task | None = None
    next_check_s: float = 0.0
    retry_at_s: float = 0.0
    stopping: bool = False  # its task is the stop


class ProxyStateManager:
    """Every proxy's state (``proxies``, by node id) and the HTTP settings
    they run with: ``http_options``, ``proxy_location``, ``head_node_id``
    (the controller's, checkpointed). Each proxy added or removed sets the
    checkpointer's ``dirty``. The controller sets ``controller_handle``
    (handed to every proxy) when it starts."""

    def __init__(self, http_options: HTTPOptions, proxy_location: ProxyLocation,
                 head_node_id: str, checkpointer: Checkpointer) -> None:
        self.http_options = http_options
        self.proxy_location = proxy_location
        self.head_node_id = head_node_id
        self.proxies: dict[str, ProxyState] = {}
        self.controller_handle = None
        self._checkpointer = checkpointer
        self._alive_nodes: list | None = None  # None: not known yet
        self._nodes_refresh_s = -1e18
        self._nodes_task: asyncio.Task | None = None

    def details(self) -> dict:
        host, port = self.http_options.host, self.http_options.port
        return {node: ProxyDetails(node_id=node, status=proxy.status, host=host, port=port,
                                   message=proxy.message)
                for node, proxy in self.proxies.items()}

    def _wanted_nodes(self, now: float, shutting_down: bool) -> list:
        if shutting_down or self.proxy_location == ProxyLocation.Disabled:
            return []
        if self.proxy_location == ProxyLocation.HeadOnly:
            return [self.head_node_id]
        task = self._nodes_task
        if task is not None and task.done():
            # Taken as soon as it came (not at the next refresh: a node's
            # proxy would outlive it a period longer).
            if not task.cancelled() and task.exception() is None:
                self._alive_nodes = task.result()
            self._nodes_task = None
        if now - self._nodes_refresh_s >= NODES_REFRESH_PERIOD_S and self._nodes_task is None:
            self._nodes_refresh_s = now
            self._nodes_task = spawn(await_ref(_common.alive_node_ids.remote()))
        if self._alive_nodes is None:
            # Not known yet (a controller that just restarted): the proxies it
            # re-attaches stay, rather than drain and start again once known.
            return list(dict.fromkeys([self.head_node_id, *self.proxies]))
        return self._alive_nodes or [self.head_node_id]

    def manage(self, now: float, shutting_down: bool) -> None:
        """Start, check, replace and stop proxies: one per wanted node (none
        once Serve is ``shutting_down``)."""
        wanted = self._wanted_nodes(now, shutting_down)
        for node_id in wanted:
            if node_id not in self.proxies:
                self.proxies[node_id] = ProxyState(node_id=node_id)
                self._checkpointer.dirty = True
        for node_id, proxy in list(self.proxies.items()):
            if proxy.task is not None and not proxy.task.done():
                if node_id in wanted or proxy.stopping:
                    continue
                # Its node went (or Serve shuts down) while it started or was
                # checked: a start on a dead node never ends (its actor waits
                # for that node for good), so it stops now, not never.
                proxy.task.cancel()
            if node_id not in wanted:
                proxy.status = ProxyStatus.DRAINING
                proxy.stopping = True
                proxy.task = spawn(self._stop(proxy))
            elif proxy.handle is None:
                if now >= proxy.retry_at_s:
                    proxy.status = ProxyStatus.STARTING
                    proxy.task = spawn(self._start(proxy))
            elif now >= proxy.next_check_s:
                proxy.next_check_s = now + PROXY_HEALTH_CHECK_PERIOD_S
                proxy.task = spawn(self._check(proxy))

    async def _start(self, proxy: ProxyState) -> None:
        from ..util.scheduling_strategies import NodeAffinitySchedulingStrategy
        from ._proxy import ProxyActor

        try:
            options = dict(name=PROXY_NAME_PREFIX + proxy.node_id, namespace=SERVE_NAMESPACE,
                           lifetime="detached", num_cpus=0, max_restarts=0,
                           scheduling_strategy=NodeAffinitySchedulingStrategy(proxy.node_id,
                                                                              soft=False))
            proxy.handle = await _common.create_actor.remote(
                ProxyActor, options, (proxy.node_id, self.http_options, self.controller_handle))
        except Exception as error:  # noqa: BLE001 - tried again after a pause
            proxy.status = ProxyStatus.UNHEALTHY
            proxy.message = error_text(error)
            proxy.retry_at_s = loop_time() + PROXY_RESTART_BACKOFF_S
            return
        await self._ready(proxy)

    async def _ready(self, proxy: ProxyState) -> None:
        try:
            await proxy.handle.ready.remote()
        except Exception as error:  # noqa: BLE001 - e.g. the port is taken
            proxy.status = ProxyStatus.UNHEALTHY
            proxy.message = error_text(error)
            logger.warning("serve controller: the HTTP proxy on node %s failed to start: %s",
                           proxy.node_id, proxy.message)
            handle, proxy.handle = proxy.handle, None
            proxy.retry_at_s = loop_time() + PROXY_RESTART_BACKOFF_S
            await _kill_quietly(handle)
            return
        proxy.status = ProxyStatus.HEALTHY
        proxy.message = ""
        proxy.next_check_s = loop_time() + PROXY_HEALTH_CHECK_PERIOD_S

    async def _check(self, proxy: ProxyState) -> None:
        try:
            await asyncio.wait_for(await_ref(proxy.handle.check_health.remote()),
                                   timeout=PROXY_HEALTH_CHECK_PERIOD_S)
        except Exception as error:  # noqa: BLE001 - replaced
            proxy.status = ProxyStatus.UNHEALTHY
            proxy.message = error_text(error)
            handle, proxy.handle = proxy.handle, None
            proxy.retry_at_s = loop_time()
            await _kill_quietly(handle)

    async def _stop(self, proxy: ProxyState) -> None:
        handle = proxy.handle
        if handle is None:
            # A start cut short may have made its actor all the same.
            try:
                handle = await _common.lookup_actor.remote(PROXY_NAME_PREFIX + proxy.node_id,
                                                           SERVE_NAMESPACE)
            except Exception:  # noqa: BLE001 - none to stop
                handle = None
        if handle is not None:
            try:
                await asyncio.wait_for(await_ref(handle.shutdown.remote()),
                                       timeout=PROXY_SHUTDOWN_TIMEOUT_S)
            except Exception:  # noqa: BLE001 - killed anyway
                pass
            await _kill_quietly(handle)
        self.proxies.pop(proxy.node_id, None)
        self._checkpointer.dirty = True

    async def reattach(self, proxy: ProxyState) -> None:
        """After a restart: find the checkpoint's proxy by name, or start
        another."""
        try:
            proxy.handle = await _common.lookup_actor.remote(PROXY_NAME_PREFIX + proxy.node_id,
                                                             SERVE_NAMESPACE)
        except Exception:  # noqa: BLE001
            proxy.handle = None
        if proxy.handle is None:
            proxy.status = ProxyStatus.UNHEALTHY
            proxy.retry_at_s = loop_time()
            return
        await self._ready(proxy)


async def _kill_quietly(handle) -> None:
    if handle is None:
        return
    try:
        await _common.kill_actor.remote(handle)
    except Exception:  # noqa: BLE001 - gone already
        pass
