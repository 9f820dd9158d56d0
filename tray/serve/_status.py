"""``serve.status()``'s records, with Ray Serve's names and states."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field


class ApplicationStatus(enum.StrEnum):
    NOT_STARTED = "NOT_STARTED"
    DEPLOYING = "DEPLOYING"
    DEPLOY_FAILED = "DEPLOY_FAILED"
    RUNNING = "RUNNING"
    UNHEALTHY = "UNHEALTHY"
    DELETING = "DELETING"


class DeploymentStatus(enum.StrEnum):
    UPDATING = "UPDATING"
    HEALTHY = "HEALTHY"
    UNHEALTHY = "UNHEALTHY"
    DEPLOY_FAILED = "DEPLOY_FAILED"
    UPSCALING = "UPSCALING"
    DOWNSCALING = "DOWNSCALING"


class ReplicaState(enum.StrEnum):
    STARTING = "STARTING"
    UPDATING = "UPDATING"
    RECOVERING = "RECOVERING"
    RUNNING = "RUNNING"
    STOPPING = "STOPPING"


class ProxyStatus(enum.StrEnum):
    STARTING = "STARTING"
    HEALTHY = "HEALTHY"
    UNHEALTHY = "UNHEALTHY"
    DRAINING = "DRAINING"


@dataclass(frozen=True)
class DeploymentStatusOverview:
    status: DeploymentStatus
    replica_states: dict = field(default_factory=dict)  # state name -> count
    message: str = ""
    target_num_replicas: int = 0


@dataclass(frozen=True)
class ApplicationStatusOverview:
    status: ApplicationStatus
    message: str = ""
    last_deployed_time_s: float = 0.0
    deployments: dict = field(default_factory=dict)  # name -> DeploymentStatusOverview
    route_prefix: str | None = None
    ingress: str = ""


@dataclass(frozen=True)
class ProxyDetails:
    node_id: str
    status: ProxyStatus
    host: str = ""
    port: int = 0
    message: str = ""


@dataclass(frozen=True)
class ServeStatus:
    proxies: dict = field(default_factory=dict)  # node id -> ProxyStatus
    applications: dict = field(default_factory=dict)  # name -> ApplicationStatusOverview
    target_capacity: float | None = None
    proxy_details: dict = field(default_factory=dict)  # node id -> ProxyDetails

    def to_dict(self) -> dict:
        """A plain mapping (what ``tray serve status`` prints as YAML)."""
        return {
            "proxies": {node: status.value for node, status in self.proxies.items()},
            "applications": {
                name: {
                    "status": app.status.value, "message": app.message,
                    "last_deployed_time_s": app.last_deployed_time_s,
                    "route_prefix": app.route_prefix,
                    "deployments": {
                        dep_name: {"status": dep.status.value, "message": dep.message,
                                   "replica_states": dict(dep.replica_states),
                                   "target_num_replicas": dep.target_num_replicas}
                        for dep_name, dep in app.deployments.items()}}
                for name, app in self.applications.items()},
            "target_capacity": self.target_capacity,
        }
