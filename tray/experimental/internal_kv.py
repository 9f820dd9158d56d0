"""The cluster's key-value store, as Ray's ``ray.experimental.internal_kv``.

Keys and values are bytes (a ``str`` is encoded as UTF-8); an optional
``namespace`` keeps one user's keys apart from another's. The GCS keeps
them in its durable storage, so they outlive a GCS restart where the GCS
keeps its tables in Redis (and in the simulator, whose GCS storage survives
its crashes); Serve keeps its controller's checkpoint here, as Ray Serve
does. Limits (``Config``): ``user_kv_keys_max`` keys (100,000) and values
of ``user_kv_value_bytes_max`` bytes (64 MiB); a put beyond them raises
``ValueError`` and changes nothing.

Every function needs a running cluster (``tray.init()``, or inside a task
or actor), else it raises ``NotInitializedError``; from an async actor's
method call it through ``asyncio.to_thread`` or accept that it blocks the
actor's loop for one round trip to the GCS, as Ray's does."""

from __future__ import annotations

from ..api.blocking import block
from ..api.session import is_initialized
from ..core.context import get_worker

__all__ = ["_internal_kv_del", "_internal_kv_exists", "_internal_kv_get",
           "_internal_kv_initialized", "_internal_kv_list", "_internal_kv_put"]


def _bytes(value, what: str) -> bytes:
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    raise TypeError(f"internal_kv {what} must be str or bytes, got {type(value).__name__}")


def _call(method: str, *args):
    worker = get_worker()  # NotInitializedError when there is no cluster
    return block(worker, worker.gcs_call, method, *args)


def _namespace(namespace) -> bytes:
    return b"" if namespace is None else _bytes(namespace, "namespace")


def _internal_kv_initialized() -> bool:
    """Whether there is a cluster to keep keys in (this process joined one)."""
    return is_initialized()


def _internal_kv_get(key, *, namespace=None) -> bytes | None:
    """The value of ``key``, or None."""
    return _call("user_kv_get", _namespace(namespace), _bytes(key, "key"))


def _internal_kv_exists(key, *, namespace=None) -> bool:
    return _internal_kv_get(key, namespace=namespace) is not None


def _internal_kv_put(key, value, overwrite: bool = True, *, namespace=None) -> bool:
    """Set ``key`` to ``value`` (only if it has no value yet, unless
    ``overwrite``); True if the key existed already."""
    return _call("user_kv_put", _namespace(namespace), _bytes(key, "key"),
                 _bytes(value, "value"), bool(overwrite))


def _internal_kv_del(key, *, del_by_prefix: bool = False, namespace=None) -> int:
    """Delete ``key`` (every key that starts with it, with ``del_by_prefix``);
    how many keys went."""
    return _call("user_kv_del", _namespace(namespace), _bytes(key, "key"), bool(del_by_prefix))


def _internal_kv_list(prefix, *, namespace=None) -> list[bytes]:
    """The keys that start with ``prefix``, sorted."""
    return _call("user_kv_keys", _namespace(namespace), _bytes(prefix, "prefix"))
