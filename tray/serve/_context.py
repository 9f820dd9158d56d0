"""What Serve keeps per process: the controller's handle, the routers of the
deployments this process calls, and, inside a replica, the replica's
context (``serve.get_replica_context()``)."""

from __future__ import annotations

import atexit
from dataclasses import dataclass

import tray

from ._common import CONTROLLER_NAME, SERVE_NAMESPACE, in_event_loop
from .exceptions import RayServeException


@dataclass(frozen=True)
class ReplicaContext:
    """Where the calling code runs (Ray Serve's ``ReplicaContext``)."""

    app_name: str
    deployment: str
    replica_id: str
    servable_object: object = None

    @property
    def replica_tag(self) -> str:  # Ray's older name
        return self.replica_id


# Per process — and in the simulator, where every node and worker shares this
# one Python process, per simulated worker of the running cluster: the state
# is keyed by worker id and remembers its cluster, so a later simulated
# cluster whose workers have the same ids (same seed) starts afresh.
_states: dict = {}
STATES_MAX = 100_000  # simulated workers remembered; the oldest go first


def _forget_all() -> None:
    _states.clear()


atexit.register(_forget_all)  # refs they hold must not outlive the runtime


def _fresh() -> dict:
    return {"controller": None, "routers": {}, "replica": None, "cluster": None}


def _current_cluster():
    import tray.simtest

    return tray.simtest.cluster() if tray.simtest.is_simulated() else None


def _state() -> dict:
    import weakref

    key = tray.get_runtime_context().get_worker_id()
    cluster = _current_cluster()
    state = _states.get(key)
    if state is None or (state["cluster"] is not None and state["cluster"]() is not cluster):
        # Another cluster's states are of no use any more (and hold its refs).
        for other in [k for k, s in _states.items()
                      if s["cluster"] is not None and s["cluster"]() is not cluster]:
            del _states[other]
        state = _states[key] = _fresh()
        state["cluster"] = weakref.ref(cluster) if cluster is not None else None
        while len(_states) > STATES_MAX:
            del _states[next(iter(_states))]
    return state


def set_controller(handle) -> None:
    _state()["controller"] = handle


def set_replica_context(context: ReplicaContext | None) -> None:
    _state()["replica"] = context


def get_replica_context() -> ReplicaContext:
    context = _state()["replica"]
    if context is None:
        raise RayServeException("`serve.get_replica_context()` may only be called from "
                                "within a Serve replica (a deployment's code)")
    return context


def current_app_name() -> str | None:
    context = _state()["replica"]
    return context.app_name if context is not None else None


def controller_handle(*, required: bool = True):
    """The controller's handle (looked up once per process), or None if
    Serve is not running and ``required`` is false."""
    state = _state()
    handle = state["controller"]
    if handle is not None:
        return handle
    if in_event_loop():
        if required:
            raise RayServeException(
                "this process has no Serve controller handle yet: in asyncio code, call a "
                "handle only inside a Serve replica, or make one first from synchronous code")
        return None
    try:
        handle = tray.get_actor(CONTROLLER_NAME, namespace=SERVE_NAMESPACE)
    except ValueError:
        if required:
            raise RayServeException("Serve is not running on this cluster: call serve.run() "
                                    "or serve.start() first") from None
        return None
    _state()["controller"] = handle
    return handle


def router_registry() -> dict:
    """This process's routers by (application, deployment), the dict itself:
    ``_handle.router_for`` adds to it (the routers live in ``_handle``, which
    imports this module, not the other way round)."""
    return _state()["routers"]


def routers() -> dict:
    return dict(_state()["routers"])


def reset() -> None:
    """Forget everything (serve.shutdown(), or a new controller: routers of
    the old one hold refs of a cluster that is gone)."""
    state = _state()
    state["controller"] = None
    state["routers"] = {}
