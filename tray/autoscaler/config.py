"""The cluster config: Ray's YAML keys, checked before anything starts.

A config names the node types the autoscaler may launch and the bounds it
keeps to. The keys are Ray's (``max_workers``, ``upscaling_speed``,
``idle_timeout_minutes``, ``available_node_types`` with ``resources``,
``min_workers``, ``max_workers``, ``node_config``; ``head_node_type``;
``provider.type``), so a Ray cluster YAML's autoscaling part reads as is;
keys tray does not use (``auth``, ``setup_commands``, ``docker``...) are
accepted and ignored, as they concern machines tray does not create.
tray adds ``autoscaler_period_s`` (Ray's update interval, 5 s there) and,
under ``provider``, the simulated provider's ``boot_delay_s`` (a range) and
``boot_failure_probability``.

Every mistake a user can make here is a ``ValueError`` naming the key:
an unknown node type, ``max_workers`` below ``min_workers``, a negative
count, a resource amount that is not a number."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

PROVIDER_TYPES = ("sim", "local")


@dataclass(frozen=True)
class NodeType:
    name: str
    resources: dict  # resource name -> amount ("CPU", "GPU", "memory", custom)
    min_workers: int = 0
    max_workers: int = 0
    node_config: dict = field(default_factory=dict)


@dataclass(frozen=True)
class AutoscalingConfig:
    node_types: dict  # name -> NodeType (the head's type included)
    head_node_type: str
    max_workers: int = 2  # the cluster-wide bound on worker nodes (Ray's default)
    upscaling_speed: float = 1.0
    idle_timeout_minutes: float = 5.0
    autoscaler_period_s: float = 5.0
    provider_type: str = "sim"
    boot_delay_s: tuple = (5.0, 15.0)
    boot_failure_probability: float = 0.0
    cluster_name: str = "default"

    @property
    def idle_timeout_s(self) -> float:
        return self.idle_timeout_minutes * 60.0

    def worker_types(self) -> list[NodeType]:
        """The node types the autoscaler launches, by name."""
        return [self.node_types[name] for name in sorted(self.node_types)
                if name != self.head_node_type or self.node_types[name].max_workers > 0]


def _number(where: str, value, *, integer: bool = False, minimum: float = 0.0):
    if isinstance(value, bool) or not isinstance(value, (int, float)) or \
            (isinstance(value, float) and not math.isfinite(value)):
        raise ValueError(f"{where} must be a number, got {value!r}")
    if integer and int(value) != value:
        raise ValueError(f"{where} must be a whole number, got {value!r}")
    if value < minimum:
        raise ValueError(f"{where} must be at least {minimum:g}, got {value!r}")
    return int(value) if integer else float(value)


def _mapping(where: str, value) -> dict:
    if not isinstance(value, dict):
        raise ValueError(f"{where} must be a mapping, got {type(value).__name__}")
    return value


def from_dict(raw: dict) -> AutoscalingConfig:
    """Check a parsed cluster config and build it (ValueError names the key)."""
    raw = _mapping("the cluster config", raw)
    types_raw = _mapping("available_node_types", raw.get("available_node_types"))
    if not types_raw:
        raise ValueError("available_node_types must name at least one node type")
    types = {}
    for name, spec in sorted(types_raw.items()):
        where = f"available_node_types.{name}"
        spec = _mapping(where, spec)
        resources_raw = _mapping(f"{where}.resources", spec.get("resources", {}))
        resources = {}
        for resource, amount in sorted(resources_raw.items()):
            amount = _number(f"{where}.resources.{resource}", amount)
            if amount > 0:
                resources[str(resource)] = amount
        minimum = _number(f"{where}.min_workers", spec.get("min_workers", 0), integer=True)
        maximum = _number(f"{where}.max_workers", spec.get("max_workers", minimum),
                          integer=True)
        if maximum < minimum:
            raise ValueError(f"{where}.max_workers ({maximum}) is below its min_workers "
                             f"({minimum})")
        types[str(name)] = NodeType(str(name), resources, minimum, maximum,
                                    dict(spec.get("node_config") or {}))
    head = raw.get("head_node_type", sorted(types)[0])
    if head not in types:
        raise ValueError(f"head_node_type {head!r} is not one of available_node_types "
                         f"({', '.join(sorted(types))})")
    max_workers = _number("max_workers", raw.get("max_workers", 2), integer=True)
    minimum_total = sum(t.min_workers for name, t in types.items() if name != head)
    if max_workers < minimum_total:
        raise ValueError(f"max_workers ({max_workers}) is below the sum of the node types' "
                         f"min_workers ({minimum_total})")
    upscaling_speed = _number("upscaling_speed", raw.get("upscaling_speed", 1.0))
    if upscaling_speed <= 0:
        raise ValueError("upscaling_speed must be positive")
    idle = _number("idle_timeout_minutes", raw.get("idle_timeout_minutes", 5.0))
    period = _number("autoscaler_period_s", raw.get("autoscaler_period_s", 5.0))
    if period <= 0:
        raise ValueError("autoscaler_period_s must be positive")
    provider = _mapping("provider", raw.get("provider", {"type": "sim"}))
    provider_type = provider.get("type", "sim")
    if provider_type not in PROVIDER_TYPES:
        raise ValueError(f"provider.type {provider_type!r} is not one tray has "
                         f"({', '.join(PROVIDER_TYPES)}); see the README on writing one")
    delay = provider.get("boot_delay_s", [5.0, 15.0])
    if isinstance(delay, (int, float)) and not isinstance(delay, bool):
        delay = [delay, delay]
    if not isinstance(delay, (list, tuple)) or len(delay) != 2:
        raise ValueError(f"provider.boot_delay_s must be a number or [low, high], got "
                         f"{delay!r}")
    low = _number("provider.boot_delay_s[0]", delay[0])
    high = _number("provider.boot_delay_s[1]", delay[1])
    if high < low:
        raise ValueError(f"provider.boot_delay_s: {high} is below {low}")
    failure = _number("provider.boot_failure_probability",
                      provider.get("boot_failure_probability", 0.0))
    if failure >= 1:
        raise ValueError("provider.boot_failure_probability must be below 1")
    return AutoscalingConfig(
        node_types=types, head_node_type=head, max_workers=max_workers,
        upscaling_speed=upscaling_speed, idle_timeout_minutes=idle,
        autoscaler_period_s=period, provider_type=provider_type, boot_delay_s=(low, high),
        boot_failure_probability=failure, cluster_name=str(raw.get("cluster_name",
                                                                   "default")))


def load(path: str) -> AutoscalingConfig:
    """Read and check a cluster YAML file."""
    import yaml

    try:
        with open(path, encoding="utf-8") as file:
            raw = yaml.safe_load(file)
    except OSError as error:
        raise ValueError(f"cannot read the cluster config {path}: {error}") from None
    except yaml.YAMLError as error:
        raise ValueError(f"the cluster config {path} is not valid YAML: {error}") from None
    return from_dict(raw)
