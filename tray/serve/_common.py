"""Names, small records passed between Serve's actors, and helper tasks.

The helper tasks exist because an async actor's methods cannot yet make the
blocking tray calls that create, look up or kill actors (``ActorClass.remote``,
``tray.get_actor``, ``tray.kill`` wait through greenback, which an asyncio
task has no portal for). The controller and the proxies are async actors, so
they submit these tiny zero-CPU tasks, which may block, and await their
results. Each is idempotent, so a retry after a crash does no harm:
creation uses ``get_if_exists``, killing a dead actor is a no-op."""

from __future__ import annotations

from dataclasses import dataclass, field

import tray

SERVE_NAMESPACE = "serve"
CONTROLLER_NAME = "SERVE_CONTROLLER_ACTOR"
CHECKPOINT_NAME = "SERVE_CHECKPOINT_ACTOR"
PROXY_NAME_PREFIX = "SERVE_PROXY_ACTOR-"
REPLICA_NAME_PREFIX = "SERVE_REPLICA::"

# How long a router's long poll waits at the controller for a change before
# it is answered anyway (and sent again): bounds how stale a router whose
# answer was lost (a broken connection) can be.
LONG_POLL_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class RequestMetadata:
    request_id: str
    method_name: str = "__call__"
    is_streaming: bool = False
    is_http: bool = False
    route: str = ""


@dataclass(frozen=True)
class ReplicaInfo:
    """A running replica as routers see it."""

    replica_id: str
    actor: object  # its ActorHandle
    max_ongoing_requests: int
    node_id: str = ""


@dataclass(frozen=True)
class RoutingTarget:
    """What a router needs of a deployment: its running replicas and its
    limits; ``version`` grows with every change (the long poll's key)."""

    version: int
    exists: bool
    replicas: tuple = ()
    max_queued_requests: int = -1
    unavailable_reason: str = ""  # set when no replica will come (deploy failed, deleting)


@dataclass(frozen=True)
class RouteTable:
    """The proxies' view: route prefix -> (application, ingress deployment)."""

    version: int
    routes: dict = field(default_factory=dict)


@dataclass(frozen=True)
class StreamBatch:
    """Items of a streamed response that were ready; ``done`` once the stream
    ended (``error`` set when it ended by raising)."""

    items: list
    done: bool
    stream_id: str = ""
    error: BaseException | None = None


def replica_actor_name(replica_id: str) -> str:
    return REPLICA_NAME_PREFIX + replica_id


# The controller's checkpoint is kept by this many CheckpointStore actors
# (_controller.py), so that one restarting (empty) while the controller is
# down too loses nothing: the state is lost only if every copy is.
CHECKPOINT_COPIES = 2


def checkpoint_store_names() -> list:
    return [CHECKPOINT_NAME] + [f"{CHECKPOINT_NAME}_{i}" for i in range(1, CHECKPOINT_COPIES)]


# ============================================================ helper tasks


@tray.remote(num_cpus=0, max_retries=3)
def create_actor(actor_class, options: dict, args: tuple, then: str = ""):
    """Create (or find, when a retry runs after the first attempt did) a
    named actor; returns its handle. ``then`` names a method to call on it
    at once, from here, without waiting: it runs even if the caller (the
    controller) dies before it gets the handle."""
    handle = actor_class.options(get_if_exists=True, **options).remote(*args)
    if then:
        getattr(handle, then).remote()
    return handle


@tray.remote(num_cpus=0, max_retries=3)
def kill_actor(handle) -> None:
    try:
        tray.kill(handle)
    except Exception:  # noqa: BLE001 - already gone: nothing to do
        pass


@tray.remote(num_cpus=0, max_retries=3)
def lookup_actor(name: str, namespace: str):
    try:
        return tray.get_actor(name, namespace=namespace)
    except ValueError:
        return None


@tray.remote(num_cpus=0, max_retries=3)
def alive_node_ids() -> list:
    return sorted(node["NodeID"] for node in tray.nodes() if node["Alive"])


def in_event_loop() -> bool:
    """True where an asyncio loop runs this code (a replica, a proxy): there
    blocking calls would stall the loop."""
    import asyncio

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True
