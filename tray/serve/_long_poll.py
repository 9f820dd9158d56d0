"""The controller's side of the long polls (Ray Serve's ``LongPollHost``).

Routers long-poll the controller (``listen_for_change``) for the routing
target of a deployment — its serving replicas and its limits — and proxies
for the route table. A poll is answered at once when the caller's version
is not the current one, else when the next change is published, or after
``LONG_POLL_TIMEOUT_S``. Every change is published at the end of the loop
step that made it (and when a replica starts or stops), under a version
``(incarnation, n)`` that grows across restarts of the controller."""

from __future__ import annotations

import asyncio

from . import _common
from ._common import ReplicaInfo, RouteTable, RoutingTarget
from ._deployment_state import DeploymentState
from ._status import DeploymentStatus


def routing_target(dep: DeploymentState) -> RoutingTarget:
    """What routers see of the deployment: its serving replicas, its limits,
    and why no replica will come, if none will."""
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


class LongPollHost:
    """Publishes the routing targets of ``deployments`` (by ``(app, name)``)
    and the route table of ``apps`` (by name), both the controller's, and
    answers the polls on them: a key is ``("deployment", app, name)`` or
    ``("routes",)``. The controller sets ``incarnation`` when it starts."""

    def __init__(self, deployments: dict, apps: dict) -> None:
        self._deployments = deployments
        self._apps = apps
        self.incarnation = ""
        self._events: dict[tuple, asyncio.Event] = {}
        self._routes = RouteTable(version=(0, 0), routes={})
        self._version_counter = 0
        self.waiting_polls = 0

    async def listen(self, key: tuple, known_version):
        """The key's current value once its version differs from
        ``known_version``, else after LONG_POLL_TIMEOUT_S."""
        current = self.current(key)
        if current.version != known_version:
            return current
        event = self._events.get(key)
        if event is None:
            event = self._events[key] = asyncio.Event()
        self.waiting_polls += 1
        try:
            await asyncio.wait_for(event.wait(), timeout=_common.LONG_POLL_TIMEOUT_S)
        except TimeoutError:
            pass
        finally:
            self.waiting_polls -= 1
        return self.current(key)

    def current_targets(self, app_name: str) -> dict:
        """The routing targets of an application's deployments as of now
        (published first)."""
        self.publish()
        return {dep.name: self.current(dep.key) for dep in self._deployments.values()
                if dep.app_name == app_name}

    def current(self, key: tuple):
        if key[0] == "routes":
            return self._routes
        dep = self._deployments.get((key[1], key[2]))
        if dep is None:
            return RoutingTarget(version=(self.incarnation, -1), exists=False)
        return routing_target(dep)

    def _next_version(self) -> tuple:
        self._version_counter += 1
        return (self.incarnation, self._version_counter)

    def _notify(self, key: tuple) -> None:
        event = self._events.pop(key, None)
        if event is not None:
            event.set()

    def publish(self) -> None:
        """Give every changed routing target and route table a new version,
        and answer the polls waiting on them."""
        for dep in self._deployments.values():
            target = routing_target(dep)
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
