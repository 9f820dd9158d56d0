"""Names, small records passed between Serve's actors, and helper tasks.

The controller and the proxies are async actors; they make the blocking
tray calls — creating, looking up and killing actors (``ActorClass.remote``,
``tray.get_actor``, ``tray.kill``), the checkpoint's key-value calls
(``tray.experimental.internal_kv``) — through these tiny zero-CPU tasks,
and await their results: a call lost to a crash is retried
(``max_retries``), and the asyncio tasks the controller spawns could not
make those calls themselves (a blocking call works in an async method's own
task only). Each is idempotent, so a retry after a crash does no harm:
creation uses ``get_if_exists``, killing a dead actor is a no-op, a
checkpoint write puts the same bytes again."""

from __future__ import annotations

from dataclasses import dataclass, field

import tray

SERVE_NAMESPACE = "serve"
CONTROLLER_NAME = "SERVE_CONTROLLER_ACTOR"
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


# The controller's checkpoint in the GCS's key-value store (namespace
# SERVE_NAMESPACE): STATE_KEY the snapshot, SPEC_PREFIX + digest each
# deployment spec it names (_checkpoint.py's header).
CHECKPOINT_PREFIX = "controller/"
STATE_KEY = CHECKPOINT_PREFIX + "state"
SPEC_PREFIX = CHECKPOINT_PREFIX + "spec/"


def delete_checkpoint() -> int:
    """Delete the controller's checkpoint (blocking); how many keys went."""
    from tray.experimental import internal_kv

    return internal_kv._internal_kv_del(CHECKPOINT_PREFIX, del_by_prefix=True,
                                        namespace=SERVE_NAMESPACE)


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
def write_checkpoint(puts: list, deletes: list) -> None:
    """Put ``puts`` ((key, value) pairs) in their order, then delete
    ``deletes``, in the checkpoint's namespace. The controller sends one
    at a time and waits for it; a retry after a crash writes the same again."""
    from tray.experimental import internal_kv

    for key, value in puts:
        internal_kv._internal_kv_put(key, value, True, namespace=SERVE_NAMESPACE)
    for key in deletes:
        internal_kv._internal_kv_del(key, namespace=SERVE_NAMESPACE)


@tray.remote(num_cpus=0, max_retries=3)
def read_checkpoint() -> dict:
    """Every key of the checkpoint and its value."""
    from tray.experimental import internal_kv

    items = {}
    for key in internal_kv._internal_kv_list(CHECKPOINT_PREFIX, namespace=SERVE_NAMESPACE):
        value = internal_kv._internal_kv_get(key, namespace=SERVE_NAMESPACE)
        if value is not None:
            items[key.decode()] = value
    return items


@tray.remote(num_cpus=0, max_retries=3)
def delete_checkpoint_task() -> int:
    return delete_checkpoint()


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
