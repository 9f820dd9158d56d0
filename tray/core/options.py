"""Validation of ``@tray.remote(...)`` / ``.options(...)`` arguments.

Every unknown option or invalid value raises ValueError naming it, at the
call site, as Ray does. Every option accepted here does something; Ray's
options tray does not support yet are rejected with the reason
(``NOT_YET``), never accepted and ignored."""

from __future__ import annotations

import numbers

from .scheduling import Strategy

TASK_OPTIONS = {"num_cpus", "num_gpus", "resources", "memory", "num_returns", "max_retries",
                "retry_exceptions", "scheduling_strategy", "name", "runtime_env",
                "accelerator_type", "_metadata"}
ACTOR_OPTIONS = {"num_cpus", "num_gpus", "resources", "memory", "max_restarts",
                 "max_task_retries", "max_concurrency", "name", "namespace", "lifetime",
                 "get_if_exists", "scheduling_strategy", "runtime_env", "accelerator_type",
                 "_metadata", "max_pending_calls", "concurrency_groups"}
METHOD_OPTIONS = {"num_returns", "name", "max_task_retries", "retry_exceptions",
                  "concurrency_group"}

ACCELERATOR_REQUEST = 0.001

# Ray's options that tray rejects for now, and why.
NOT_YET = {
    "runtime_env": "runtime environments are not supported yet: install what tasks need "
                   "on every node (see README, 'Not yet')",
    "_metadata": "_metadata is Ray-internal and not supported",
}
METHOD_NOT_YET = {
    "retry_exceptions": "retrying application errors of actor methods is not supported yet; "
                        "use max_task_retries for actor deaths, or retry in the caller",
}


def _non_negative_number(name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or value < 0:
        raise ValueError(f"option {name} must be a non-negative number, got {value!r}")


def _int_at_least(name: str, value, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"option {name} must be an integer >= {minimum}, got {value!r}")


def validate(options: dict, allowed: set[str], what: str) -> dict:
    for name in options:
        if name not in allowed:
            raise ValueError(f"invalid option {name!r} for {what}; valid options are "
                             f"{', '.join(sorted(allowed))}")
    not_yet = dict(NOT_YET, **(METHOD_NOT_YET if allowed is METHOD_OPTIONS else {}))
    for name, reason in not_yet.items():
        if options.get(name) not in (None, False, {}):
            raise NotImplementedError(f"option {name} of {what}: {reason}")
    accelerator = options.get("accelerator_type")
    if accelerator is not None and (not isinstance(accelerator, str) or not accelerator):
        raise ValueError(f"option accelerator_type must be a non-empty string, got "
                         f"{accelerator!r}")
    for name in ("num_cpus", "num_gpus", "memory"):
        if options.get(name) is not None:
            _non_negative_number(name, options[name])
    gpus = options.get("num_gpus")
    if gpus is not None and gpus > 1 and gpus != int(gpus):
        raise ValueError(f"option num_gpus must be a whole number when above 1, got {gpus!r}")
    resources = options.get("resources")
    if resources is not None:
        if not isinstance(resources, dict):
            raise ValueError(f"option resources must be a dict, got {resources!r}")
        for key, amount in resources.items():
            if key in ("CPU", "GPU", "memory"):
                raise ValueError(f"use num_cpus/num_gpus/memory rather than resources[{key!r}]")
            _non_negative_number(f"resources[{key!r}]", amount)
    if "num_returns" in options:
        _int_at_least("num_returns", options["num_returns"], 0)
    if options.get("max_retries") is not None:
        _int_at_least("max_retries", options["max_retries"], -1)
    if options.get("max_restarts") is not None:
        _int_at_least("max_restarts", options["max_restarts"], -1)
    if options.get("max_task_retries") is not None:
        _int_at_least("max_task_retries", options["max_task_retries"], -1)
    if options.get("max_pending_calls") is not None:
        _int_at_least("max_pending_calls", options["max_pending_calls"], -1)
        if options["max_pending_calls"] == 0:
            raise ValueError("option max_pending_calls must be -1 (no limit) or positive, got 0")
    groups = options.get("concurrency_groups")
    if groups is not None:
        if not isinstance(groups, dict) or not all(
                isinstance(name, str) and name and not isinstance(limit, bool) and
                isinstance(limit, int) and limit >= 1 for name, limit in groups.items()):
            raise ValueError(f"option concurrency_groups must map group names to positive "
                             f"integers, got {groups!r}")
    group = options.get("concurrency_group")
    if group is not None and (not isinstance(group, str) or not group):
        raise ValueError(f"option concurrency_group must be a non-empty string, got {group!r}")
    if options.get("max_concurrency") is not None:
        _int_at_least("max_concurrency", options["max_concurrency"], 1)
    retry = options.get("retry_exceptions")
    if retry is not None and not isinstance(retry, bool):
        if not isinstance(retry, (list, tuple)) or not all(
                isinstance(c, type) and issubclass(c, BaseException) for c in retry):
            raise ValueError("option retry_exceptions must be a bool or a list of exception "
                             f"classes, got {retry!r}")
    lifetime = options.get("lifetime")
    if lifetime is not None and lifetime not in ("detached", "non_detached"):
        raise ValueError(f"option lifetime must be 'detached' or 'non_detached', got {lifetime!r}")
    for name in ("name", "namespace"):
        value = options.get(name)
        if value is not None and (not isinstance(value, str) or (name == "name" and not value)):
            raise ValueError(f"option {name} must be a non-empty string, got {value!r}")
    if "scheduling_strategy" in options:
        to_strategy(options["scheduling_strategy"])
    return options


def to_strategy(value) -> Strategy:
    from ..util.scheduling_strategies import (
        NodeAffinitySchedulingStrategy,
        PlacementGroupSchedulingStrategy,
    )

    if value is None or value == "DEFAULT":
        return Strategy()
    if value == "SPREAD":
        return Strategy("SPREAD")
    if isinstance(value, NodeAffinitySchedulingStrategy):
        return Strategy("NODE_AFFINITY", value.node_id, bool(value.soft))
    if isinstance(value, PlacementGroupSchedulingStrategy):
        return Strategy("PLACEMENT_GROUP", placement_group_id=value.placement_group.id.hex(),
                        bundle_index=value.placement_group_bundle_index,
                        capture_child_tasks=bool(value.placement_group_capture_child_tasks))
    raise ValueError(f"invalid scheduling_strategy {value!r}: use 'DEFAULT', 'SPREAD', "
                     "NodeAffinitySchedulingStrategy(node_id, soft=...) or "
                     "PlacementGroupSchedulingStrategy(placement_group, ...)")


def resources_of(options: dict, default_cpus: float) -> dict:
    resources = dict(options.get("resources") or {})
    cpus = options.get("num_cpus")
    resources["CPU"] = default_cpus if cpus is None else cpus
    if options.get("num_gpus"):
        resources["GPU"] = options["num_gpus"]
    if options.get("memory"):
        resources["memory"] = options["memory"]
    if options.get("accelerator_type"):
        # As Ray: a node with that accelerator has the resource
        # "accelerator_type:<name>", and a task asks for a sliver of it.
        resources[f"accelerator_type:{options['accelerator_type']}"] = ACCELERATOR_REQUEST
    return {name: float(amount) for name, amount in sorted(resources.items()) if amount > 0}
