"""tray.autoscaler: nodes that come and go with the work.

``start(config)`` starts the autoscaler for the running cluster (simulated:
``backend="sim"``, nodes are virtual machines with seeded boot delays and
failures; local: node processes on this machine), from a cluster YAML path,
a dict of Ray's keys, or an ``AutoscalingConfig``. It returns the
``Monitor``: its ``status`` and ``decisions`` say what it saw and did;
``stop()`` ends it. ``sdk.request_resources`` asks for capacity directly.

Design: ``config`` (the YAML, checked), ``policy`` (a pure state machine:
load in, decisions out), ``providers`` (create / terminate / list nodes),
``monitor`` (the loop between them); demand is aggregated in the GCS
(``tray/core/gcs/demand.py``)."""

from __future__ import annotations

from . import sdk
from .config import AutoscalingConfig, NodeType, from_dict, load
from .monitor import STATUS_KEY, Monitor
from .policy import Autoscaler, AutoscalerStatus, Decision, ProviderNode
from .providers import LocalNodeProvider, SimNodeProvider

__all__ = ["Autoscaler", "AutoscalerStatus", "AutoscalingConfig", "Decision",
           "LocalNodeProvider", "Monitor", "NodeType", "ProviderNode", "SimNodeProvider",
           "format_status", "from_dict", "load", "read_status", "sdk", "start"]


def _as_config(config) -> AutoscalingConfig:
    if isinstance(config, AutoscalingConfig):
        return config
    if isinstance(config, dict):
        return from_dict(config)
    if isinstance(config, str):
        return load(config)
    raise ValueError(f"config must be a path, a dict or an AutoscalingConfig, got "
                     f"{type(config).__name__}")


def start(config) -> Monitor:
    """Start the autoscaler for the running cluster (see the module docstring)."""
    from ..api import state

    config = _as_config(config)
    runtime = state.runtime
    if runtime is None:
        raise RuntimeError("tray.autoscaler.start() needs a running cluster: call "
                           "tray.init() first")
    backend = runtime.info.get("backend")
    if backend == "sim":
        from ..simtest import cluster

        provider = SimNodeProvider(cluster(), config)
    elif backend == "local" and getattr(runtime, "session", None) is not None:
        provider = LocalNodeProvider(runtime.session, runtime.info["gcs_address"], config)
    else:
        raise RuntimeError("the autoscaler starts with a cluster this driver started "
                           "(tray.init(backend='sim' or 'local')); for 'tray start' use "
                           "--autoscaling-config")
    monitor = Monitor(config, provider, runtime.driver)
    runtime.driver.spawn(monitor.run)
    return monitor


def read_status() -> dict | None:
    """The autoscaler's last published status (a dict), or None."""
    import json

    from ..api.blocking import gcs_call

    raw = gcs_call("kv_get", STATUS_KEY)
    return None if raw is None else json.loads(raw)


def format_status(status: dict | None) -> str:
    """The autoscaler part of ``tray status``, as ``ray status`` shows it."""
    if status is None:
        return "Autoscaler: not running"
    lines = ["======== Autoscaler status ========", "Node status", "Healthy:"]
    lines += [f" {count} {name}" for name, count in sorted(status["nodes_by_type"].items())] \
        or [" (no worker nodes)"]
    lines.append("Pending:")
    lines += [f" {name}, {count} launching"
              for name, count in sorted(status["launching_by_type"].items())] or [" (none)"]
    lines.append("Idle:")
    lines += [f" {pid} ({name}): idle {seconds:.0f} s" for pid, name, seconds in status["idle"]] \
        or [" (none)"]
    lines.append(f"Failed boots: {status['failed_boots']}")
    lines.append("Demand:")
    lines += [f" {shape}: {count}+ pending" for shape, count in status["pending_demand"]] or \
        [" (no resource demands)"]
    for shape in status["infeasible"]:
        lines.append(f" {shape}: infeasible (no node type can hold it)")
    lines.append("Recent decisions:")
    lines += [f" t={d['at_s']:.1f} {d['action']} {d['node_type']} x{d['count']}"
              f"{' ' + d['provider_id'] if d['provider_id'] else ''}: {d['reason']}"
              for d in status["decisions"]] or [" (none)"]
    return "\n".join(lines)
