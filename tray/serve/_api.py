"""Serve's client API: ``serve.run``, ``start``, ``status``, ``delete``,
``shutdown``, ``get_app_handle``, ``get_deployment_handle``.

These run in a driver (or a task): they find the controller by name, or
create it (detached, pinned to the caller's node: the head, for a driver;
it checkpoints its state to the GCS's key-value store) — and talk to it
through actor calls.
Waiting (for an application to run, for a deletion) happens in the
controller, in calls that return once the state is reached or a while has
passed, so in the simulator the driver waits on virtual time.

HTTP: proxies start where processes are real (the local backend), on
127.0.0.1:8000 unless ``http_options`` say otherwise; in the simulator,
which has no real sockets to offer without losing determinism, none starts
unless ``serve.start(http_options=...)`` asks for it."""

from __future__ import annotations

import logging
import time

import tray

from . import _context
from ._common import CONTROLLER_NAME, SERVE_NAMESPACE, in_event_loop
from ._deployment import Application, build, validate_route_prefix
from ._handle import DeploymentHandle
from ._status import ApplicationStatus, ProxyStatus, ServeStatus
from .config import HTTPOptions, ProxyLocation
from .exceptions import RayServeException

logger = logging.getLogger("tray.serve")

WAIT_CHUNK_S = 60.0  # one waiting call to the controller; waits repeat
PROXY_READY_TIMEOUT_S = 60.0
# How many times serve.run sends an application again that a restarted
# controller lost (see _wait_for_app).
MAX_REDEPLOYS = 3

_DEFAULT = object()


def _in_simulator() -> bool:
    import tray.simtest

    return tray.simtest.is_simulated()


def _require_sync(what: str) -> None:
    if in_event_loop():
        raise RayServeException(f"serve.{what}() blocks: call it from synchronous code (a "
                                f"driver or a task), not from an asyncio event loop")


def _get(ref):
    """A controller call's result; its errors as raised there (a route
    collision is a RayServeException with its own message, not a TaskError
    carrying the controller's traceback)."""
    try:
        return tray.get(ref)
    except tray.exceptions.TaskError as error:
        if isinstance(error.cause, RayServeException):
            raise error.cause from None
        raise


def _find_controller():
    try:
        return tray.get_actor(CONTROLLER_NAME, namespace=SERVE_NAMESPACE)
    except ValueError:
        return None


def _start_controller(http_options: HTTPOptions, proxy_location: ProxyLocation):
    from ..util.scheduling_strategies import NodeAffinitySchedulingStrategy
    from ._controller import ControllerActor

    # Pinned to this node (a driver's: the head), as Ray pins its controller.
    node_id = tray.get_runtime_context().get_node_id()
    where = NodeAffinitySchedulingStrategy(node_id, soft=False)
    controller = ControllerActor.options(
        name=CONTROLLER_NAME, namespace=SERVE_NAMESPACE, lifetime="detached",
        get_if_exists=True, max_restarts=-1, max_task_retries=-1, num_cpus=0,
        scheduling_strategy=where).remote(http_options, proxy_location, node_id)
    _context.reset()
    _context.set_controller(controller)
    tray.get(controller.ping.remote())
    return controller


def _connect(http_options=None, proxy_location=None, *, explicit: bool = False):
    """The controller, started if none runs."""
    controller = _find_controller()
    if controller is not None:
        known = _context._state()["controller"]
        if known is None or known != controller:
            _context.reset()
            _context.set_controller(controller)
        if explicit:
            running_http, running_location = tray.get(controller.get_http_config.remote())
            wanted_http = HTTPOptions.from_value(http_options) if http_options is not None \
                else running_http
            wanted_location = ProxyLocation.from_value(proxy_location) \
                if proxy_location is not None else running_location
            if (wanted_http, wanted_location) != (running_http, running_location):
                logger.warning("Serve is already running with other HTTP options (%s, %s); "
                               "the new ones are ignored. Call serve.shutdown() first to "
                               "change them.", running_http, running_location.value)
        return controller
    if proxy_location is None:
        if isinstance(http_options, dict) and "location" in http_options:
            proxy_location = http_options["location"]
        elif _in_simulator() and http_options is None:
            proxy_location = ProxyLocation.Disabled  # no real sockets in the simulator
        else:
            proxy_location = ProxyLocation.HeadOnly
    if isinstance(http_options, dict):
        http_options = {k: v for k, v in http_options.items() if k != "location"}
    return _start_controller(HTTPOptions.from_value(http_options),
                             ProxyLocation.from_value(proxy_location))


def _check_proxies(controller) -> None:
    details = tray.get(controller.wait_for_proxies.remote(PROXY_READY_TIMEOUT_S))
    failed = {node: d for node, d in details.items() if d.status == ProxyStatus.UNHEALTHY}
    if failed:
        messages = "; ".join(f"node {node[:8]}: {d.message}" for node, d in failed.items())
        raise RayServeException(f"the HTTP proxy failed to start ({messages}); the controller "
                                f"keeps trying. Another port: serve.start(http_options="
                                f"{{'port': ...}}) after serve.shutdown()")


def start(http_options=None, *, proxy_location=None, detached: bool = True,
          grpc_options=None, logging_config=None, **kwargs) -> None:
    """Start Serve on the cluster (``serve.run`` does it too, with the
    defaults): the controller and, where processes are real, the HTTP proxy."""
    _require_sync("start")
    if grpc_options:
        raise NotImplementedError("gRPC proxies are not supported yet")
    if "http_host" in kwargs or "http_port" in kwargs:
        http_options = dict(http_options or {})
        if "http_host" in kwargs:
            http_options["host"] = kwargs.pop("http_host")
        if "http_port" in kwargs:
            http_options["port"] = kwargs.pop("http_port")
    if kwargs:
        raise TypeError(f"serve.start() got unknown option(s) {sorted(kwargs)}")
    if http_options is not None:
        HTTPOptions.from_value({k: v for k, v in http_options.items() if k != "location"}
                               if isinstance(http_options, dict) else http_options)
    if proxy_location is not None:
        ProxyLocation.from_value(proxy_location)
    controller = _connect(http_options, proxy_location, explicit=True)
    _check_proxies(controller)


def _wait_for_app(controller, name: str, incarnation: str = "", redeploy=None) -> None:
    """Wait until the application runs (or failed to deploy). If it vanished
    because the controller restarted without its checkpoint (the GCS lost
    its storage, or the keys were deleted), ``redeploy`` sends it again, at
    most ``MAX_REDEPLOYS`` times; an application deleted by someone else is
    an error."""
    wanted = [ApplicationStatus.RUNNING.value, ApplicationStatus.DEPLOY_FAILED.value]
    redeploys = 0
    while True:
        overview = tray.get(controller.wait_for_applications.remote(
            [name], wanted, WAIT_CHUNK_S))[name]
        if overview is None:
            now = tray.get(controller.ping.remote())
            if redeploy is None or now == incarnation or redeploys >= MAX_REDEPLOYS:
                raise RayServeException(f"application {name!r} was deleted while it deployed")
            redeploys += 1
            logger.warning("the Serve controller restarted without application %r (its "
                           "checkpoint was lost): deploying it again", name)
            incarnation = redeploy()
            continue
        if overview.status == ApplicationStatus.RUNNING:
            return
        if overview.status == ApplicationStatus.DEPLOY_FAILED:
            raise RayServeException(f"Deploying application {name} failed: "
                                    f"{overview.message}")


def run(target: Application, *, name: str = "default", route_prefix=_DEFAULT,
        blocking: bool = False, logging_config=None, _blocking: bool = True,
        _local_testing_mode: bool = False) -> DeploymentHandle:
    """Deploy an application (or update it: changed deployments are rolled
    over replica by replica), wait until it runs, and return its ingress
    deployment's handle. ``blocking=True`` then keeps the caller here until
    interrupted."""
    _require_sync("run")
    if _local_testing_mode:
        raise NotImplementedError("serve.run(_local_testing_mode=True) is not supported")
    if not isinstance(name, str) or not name:
        raise TypeError(f"an application name must be a non-empty string, got {name!r}")
    route_prefix = validate_route_prefix("/" if route_prefix is _DEFAULT else route_prefix)
    ingress, specs = build(target, name, route_prefix)
    return _deploy(name, route_prefix, ingress, specs, blocking=blocking, wait=_blocking)


def _deploy(name: str, route_prefix, ingress: str, specs: list, *, blocking: bool = False,
            wait: bool = True) -> DeploymentHandle:
    controller = _connect()

    def submit() -> str:
        """Send the application; the controller's incarnation that took it
        (from the call itself: a ping after it may reach the next incarnation,
        which may have lost it: chaos seed 38 then took the loss for a
        deletion)."""
        return _get(controller.deploy_application.remote(name, route_prefix, ingress, specs))

    incarnation = submit()
    handle = DeploymentHandle(ingress, name)
    if wait:
        _wait_for_app(controller, name, incarnation, submit)
        _refresh_routers(controller, name)
        http, location = tray.get(controller.get_http_config.remote())
        if route_prefix is not None and location != ProxyLocation.Disabled:
            _check_proxies(controller)
            logger.info("application %r is ready at http://%s:%d%s", name, http.host,
                        http.port, route_prefix)
    if blocking:
        try:
            while True:
                time.sleep(1.0)
        except KeyboardInterrupt:
            pass
    return handle


def _refresh_routers(controller, app_name: str) -> None:
    """Bring this process's routers of the application up to date: their
    long polls may not have answered yet, and a request sent after
    ``serve.run`` returned must not go to a replica it replaced."""
    mine = {key: router for key, router in _context.routers().items()
            if key[0] == app_name}
    if not mine:
        return
    targets = tray.get(controller.current_targets.remote(app_name))
    for (_app, deployment), router in mine.items():
        if deployment in targets:
            router.apply_target(targets[deployment])


def status() -> ServeStatus:
    """The applications, their deployments and replicas, and the proxies."""
    _require_sync("status")
    controller = _find_controller()
    if controller is None:
        return ServeStatus()
    return tray.get(controller.get_serve_status.remote())


def delete(name: str, _blocking: bool = True) -> None:
    """Delete an application: its replicas drain and stop."""
    _require_sync("delete")
    controller = _find_controller()
    if controller is None:
        return
    tray.get(controller.delete_applications.remote([name]))
    while _blocking:
        if tray.get(controller.wait_for_applications.remote([name], [], WAIT_CHUNK_S))[name] \
                is None:
            return


def shutdown() -> None:
    """Delete every application, stop the proxies and the controller, and
    delete its checkpoint."""
    from ._common import delete_checkpoint

    _require_sync("shutdown")
    controller = _find_controller()
    if controller is not None:
        try:
            if not tray.get(controller.shutdown.remote()):
                logger.warning("serve.shutdown(): some replicas or proxies did not stop in "
                               "time; they are killed with the controller's state")
        except tray.exceptions.ActorDiedError:
            pass
        tray.kill(controller)
    delete_checkpoint()  # after the kill: a controller restarted now starts empty
    _context.reset()


def get_app_handle(name: str) -> DeploymentHandle:
    """The handle of a running application's ingress deployment."""
    _require_sync("get_app_handle")
    controller = _context.controller_handle()
    ingress = tray.get(controller.get_ingress.remote(name))
    if ingress is None:
        raise RayServeException(f"Application '{name}' does not exist.")
    return DeploymentHandle(ingress, name)


def get_deployment_handle(deployment_name: str, app_name: str | None = None,
                          _check_exists: bool = True) -> DeploymentHandle:
    """A handle to a deployment of an application (by default the one
    the calling replica belongs to, else ``"default"``)."""
    app_name = app_name or _context.current_app_name() or "default"
    if _check_exists and not in_event_loop():
        controller = _context.controller_handle()
        names = tray.get(controller.get_deployment_names.remote(app_name))
        if deployment_name not in names:
            raise RayServeException(f"Deployment '{deployment_name}' in application "
                                    f"'{app_name}' does not exist.")
    return DeploymentHandle(deployment_name, app_name)


def get_replica_context() -> _context.ReplicaContext:
    return _context.get_replica_context()


def ingress(app):
    """``@serve.ingress(app)`` on a deployment class: HTTP requests to the
    application go to ``app`` (a FastAPI or other ASGI app), whose route
    functions defined in the class get the replica's instance as ``self``."""
    if not callable(app):
        raise TypeError(f"@serve.ingress takes an ASGI app (FastAPI, Starlette), got {app!r}")
    _make_state_picklable()

    def decorate(cls):
        import inspect

        if not inspect.isclass(cls):
            raise TypeError("@serve.ingress applies to a class (put @serve.deployment above "
                            "it)")
        cls._serve_asgi_app = app
        return cls
    return decorate


def _make_state_picklable() -> None:
    """The app is pickled with its class; Starlette's ``State`` (``app.state``)
    recurses forever when unpickled (its ``__getattr__`` reads an attribute
    that unpickling has not set yet), so it is pickled through its contents."""
    import copyreg

    try:
        from starlette.datastructures import State
    except ImportError:
        return
    copyreg.pickle(State, _reduce_state)


def _reduce_state(state):
    from starlette.datastructures import State

    return (State, (dict(state._state),))


# ----------------------------------------------------------- introspection


def _list_replicas(app_name: str, deployment: str) -> list:
    """(replica id, actor name, state, version) of a deployment's replicas
    (tests and the simtest workload)."""
    controller = _context.controller_handle()
    return tray.get(controller.list_replicas.remote(app_name, deployment))


def _controller_statistics():
    return tray.get(_context.controller_handle().statistics.remote())
