"""tray.serve: online serving with Ray Serve's API (``from tray import serve``).

Deployments (``@serve.deployment``) run as replicas — tray actors — managed
by a controller actor; applications (``Deployment.bind``) are deployed with
``serve.run`` and called through ``DeploymentHandle``s or over HTTP (uvicorn
and Starlette, on 127.0.0.1:8000 by default, real processes only). See the
README's "Serve" section; the modules' headers say how it works:
``_controller.py`` (the controller actor and its loop, and a map of its
pieces: ``_deployment_state.py`` for reconcile, rolling updates and health,
``_autoscaling_state.py``, ``_checkpoint.py`` for restarts, ...),
``_handle.py`` (routing), ``_replica.py`` (requests, streams, draining),
``_proxy.py`` (HTTP)."""

from . import exceptions as exceptions
from ._api import delete as delete
from ._api import get_app_handle as get_app_handle
from ._api import get_deployment_handle as get_deployment_handle
from ._api import get_replica_context as get_replica_context
from ._api import ingress as ingress
from ._api import run as run
from ._api import shutdown as shutdown
from ._api import start as start
from ._api import status as status
from ._batching import batch as batch
from ._deployment import Application as Application
from ._deployment import Deployment as Deployment
from ._deployment import deployment as deployment
from ._handle import DeploymentHandle as DeploymentHandle
from ._handle import DeploymentResponse as DeploymentResponse
from ._handle import DeploymentResponseGenerator as DeploymentResponseGenerator
from ._status import ApplicationStatus as ApplicationStatus
from ._status import DeploymentStatus as DeploymentStatus
from ._status import ProxyStatus as ProxyStatus
from ._status import ReplicaState as ReplicaState
from ._status import ServeStatus as ServeStatus
from .config import AutoscalingConfig as AutoscalingConfig
from .config import HTTPOptions as HTTPOptions
from .config import ProxyLocation as ProxyLocation

for _name in ("Application", "Deployment", "DeploymentHandle", "DeploymentResponse",
              "DeploymentResponseGenerator", "AutoscalingConfig", "HTTPOptions",
              "ProxyLocation", "ServeStatus"):
    globals()[_name].__module__ = "tray.serve"
del _name

__all__ = ["deployment", "Deployment", "Application", "run", "start", "status", "delete",
           "shutdown", "get_app_handle", "get_deployment_handle", "get_replica_context",
           "ingress", "batch", "DeploymentHandle", "DeploymentResponse",
           "DeploymentResponseGenerator", "ApplicationStatus", "DeploymentStatus",
           "ProxyStatus", "ReplicaState", "ServeStatus", "AutoscalingConfig", "HTTPOptions",
           "ProxyLocation", "exceptions"]
