"""Applications (Ray Serve's ``application_state.py``): deploying one (its
route prefix, its ingress, its deployments), deleting one, and its status,
which follows its deployments'.

An application is ``DEPLOYING`` until every deployment of it is healthy,
then ``RUNNING``; ``DEPLOY_FAILED`` once one of them failed to deploy;
``UNHEALTHY`` when one of a once-running application's deployments is;
``DELETING`` until its deployments' replicas are all gone (the control loop
then forgets it)."""

from __future__ import annotations

import time
from dataclasses import dataclass

from ._deployment_state import DeploymentStateManager
from ._status import (
    ApplicationStatus,
    ApplicationStatusOverview,
    DeploymentStatus,
    DeploymentStatusOverview,
)
from .exceptions import RayServeException


@dataclass
class ApplicationState:
    name: str
    route_prefix: str | None
    ingress: str
    deployments: list  # names
    deployed_at_s: float
    status: ApplicationStatus = ApplicationStatus.DEPLOYING
    message: str = ""
    deleting: bool = False
    was_running: bool = False


class ApplicationStateManager:
    """Deploys, deletes and judges ``apps`` (the controller's applications'
    states, by name); their deployments are ``deployment_states``'. The
    controller checkpoints and publishes after a deploy or a delete."""

    def __init__(self, apps: dict, deployment_states: DeploymentStateManager) -> None:
        self.apps: dict[str, ApplicationState] = apps
        self._deployment_states = deployment_states
        self._deployments = deployment_states.deployments

    def deploy(self, name: str, route_prefix: str | None, ingress: str, specs: list) -> None:
        """Deploy (or update) an application; raises for a route prefix that
        another application uses."""
        if route_prefix is not None:
            for other in self.apps.values():
                if other.name != name and not other.deleting and \
                        other.route_prefix == route_prefix:
                    raise RayServeException(
                        f'Prefix {route_prefix} is being used by application "{other.name}". '
                        f'Failed to deploy application "{name}".')
        app = self.apps.get(name)
        if app is not None and app.deleting:
            raise RayServeException(f"application {name!r} is being deleted; deploy it again "
                                    f"once serve.delete() returned")
        names = [spec.name for spec in specs]
        if app is None:
            app = ApplicationState(name=name, route_prefix=route_prefix, ingress=ingress,
                                   deployments=names, deployed_at_s=time.time())
            self.apps[name] = app
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
            self._deployment_states.deploy(spec)

    def delete(self, names: list) -> None:
        """Mark the applications (those that exist) and their deployments
        deleting: the control loop stops their replicas, then forgets them."""
        for name in names:
            app = self.apps.get(name)
            if app is None:
                continue
            app.deleting = True
            app.status = ApplicationStatus.DELETING
            for dep_name in app.deployments:
                self._deployments[(name, dep_name)].deleting = True

    def ingress(self, app_name: str):
        app = self.apps.get(app_name)
        if app is None or app.deleting:
            return None
        return app.ingress

    def deployment_names(self, app_name: str) -> list:
        app = self.apps.get(app_name)
        return [] if app is None else list(app.deployments)

    def update_status(self, app: ApplicationState) -> None:
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

    def _app_deployments(self, app: ApplicationState) -> list:
        return [self._deployments[(app.name, n)] for n in app.deployments]

    def overview(self, app: ApplicationState) -> ApplicationStatusOverview:
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
