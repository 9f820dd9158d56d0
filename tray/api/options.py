"""Validation of ``@tray.remote(...)`` / ``.options(...)`` arguments.

Errors follow Ray's rules (``ray/_private/ray_option_utils.py``), at the
call site: an unknown option raises ValueError naming it; a value of the
wrong type raises TypeError; a value of the right type that is out of range
raises ValueError. tray is stricter than Ray in a few places, always with
the same split: a bool is not a number here (TypeError), and an empty name,
``max_concurrency=0`` or an unknown scheduling strategy string are refused
at once (ValueError) rather than when the task runs. Every option accepted
here does something; Ray's options tray does not support yet are rejected
with the reason (``NOT_YET``), never accepted and ignored."""

from __future__ import annotations

import math
import numbers

from ..core.scheduling import (
    DefaultStrategy,
    NodeAffinityStrategy,
    PlacementGroupStrategy,
    SpreadStrategy,
    Strategy,
)

TASK_OPTIONS = {"num_cpus", "num_gpus", "resources", "memory", "num_returns", "max_retries",
                "retry_exceptions", "scheduling_strategy", "name", "runtime_env",
                "accelerator_type", "_metadata", "max_calls"}
ACTOR_OPTIONS = {"num_cpus", "num_gpus", "resources", "memory", "max_restarts",
                 "max_task_retries", "max_concurrency", "name", "namespace", "lifetime",
                 "get_if_exists", "scheduling_strategy", "runtime_env", "accelerator_type",
                 "_metadata", "max_pending_calls", "concurrency_groups"}
METHOD_OPTIONS = {"num_returns", "name", "max_task_retries", "retry_exceptions",
                  "concurrency_group"}

ACCELERATOR_REQUEST = 0.001

# Ray's options that tray rejects for now, and why.
NOT_YET = {
    "_metadata": "_metadata is Ray-internal and not supported",
}
METHOD_NOT_YET = {
    "retry_exceptions": "retrying application errors of actor methods is not supported yet; "
                        "use max_task_retries for actor deaths, or retry in the caller",
}


def _wrong_type(name: str, value, expected: str) -> TypeError:
    return TypeError(f"option {name} must be {expected}, but got a {type(value).__name__}: "
                     f"{value!r}")


def _non_negative_number(name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise _wrong_type(name, value, "a number")
    if not value >= 0 or value == math.inf:  # (nan compares false to everything)
        raise ValueError(f"option {name} must be a finite non-negative number, got "
                         f"{value!r}")


def _int_at_least(name: str, value, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise _wrong_type(name, value, "an integer")
    if value < minimum:
        raise ValueError(f"option {name} must be an integer >= {minimum}, got {value!r}")


def _string(name: str, value, *, empty_ok: bool = True) -> None:
    if not isinstance(value, str):
        raise _wrong_type(name, value, "a string")
    if not value and not empty_ok:
        raise ValueError(f"option {name} must be a non-empty string, got {value!r}")


def validate(options: dict, allowed: set[str], what: str, *, in_options: bool = False) -> dict:
    """Check ``options`` for ``what``; ``in_options``: they come from
    ``.options()`` (which cannot set ``max_calls``, as in Ray)."""
    for name in options:
        if name not in allowed:
            raise ValueError(f"invalid option {name!r} for {what}; valid options are "
                             f"{', '.join(sorted(allowed))}")
    if in_options and "max_calls" in options:
        raise ValueError("Setting 'max_calls' is not supported in '.options()': set it in "
                         "@tray.remote(max_calls=...)")
    for name in ("runtime_env", "_metadata"):
        if options.get(name) is not None and not isinstance(options[name], dict):
            raise _wrong_type(name, options[name], "a dict")
    if options.get("runtime_env") is not None:
        # Keys and types now; whether its paths exist when it is first used.
        from ..runtime_env import validate as validate_runtime_env

        validate_runtime_env(options["runtime_env"])
    not_yet = dict(NOT_YET, **(METHOD_NOT_YET if allowed is METHOD_OPTIONS else {}))
    for name, reason in not_yet.items():
        if options.get(name) not in (None, False, {}):
            raise NotImplementedError(f"option {name} of {what}: {reason}")
    if options.get("accelerator_type") is not None:
        _string("accelerator_type", options["accelerator_type"], empty_ok=False)
    for name in ("num_cpus", "num_gpus", "memory"):
        if options.get(name) is not None:
            _non_negative_number(name, options[name])
    gpus = options.get("num_gpus")
    if gpus is not None and gpus > 1 and gpus != int(gpus):
        raise ValueError(f"option num_gpus must be a whole number when above 1, got {gpus!r}")
    resources = options.get("resources")
    if resources is not None:
        if not isinstance(resources, dict):
            raise _wrong_type("resources", resources, "a dict of resource name -> amount")
        for key, amount in resources.items():
            if not isinstance(key, str):
                raise _wrong_type("resources' keys", key, "a string")
            if not key:
                raise ValueError("a resource name must not be empty (resources={'': ...})")
            if key in ("CPU", "GPU", "memory"):
                raise ValueError(f"use num_cpus/num_gpus/memory rather than resources[{key!r}]")
            _non_negative_number(f"resources[{key!r}]", amount)
    if "num_returns" in options:
        if options["num_returns"] in ("dynamic", "streaming"):
            raise NotImplementedError(f"option num_returns={options['num_returns']!r} of "
                                      f"{what}: generator tasks are not supported yet")
        _int_at_least("num_returns", options["num_returns"], 0)
    for name in ("max_retries", "max_restarts", "max_task_retries", "max_pending_calls"):
        if options.get(name) is not None:
            _int_at_least(name, options[name], -1)  # -1: no limit
    if options.get("max_pending_calls") == 0:
        raise ValueError("option max_pending_calls must be -1 (no limit) or positive, got 0")
    groups = options.get("concurrency_groups")
    if groups is not None:
        if not isinstance(groups, dict):
            raise _wrong_type("concurrency_groups", groups, "a dict of group name -> limit")
        if not all(isinstance(name, str) and name and not isinstance(limit, bool) and
                   isinstance(limit, int) and limit >= 1 for name, limit in groups.items()):
            raise ValueError(f"option concurrency_groups must map group names to positive "
                             f"integers, got {groups!r}")
    if options.get("concurrency_group") is not None:
        _string("concurrency_group", options["concurrency_group"], empty_ok=False)
    if options.get("max_concurrency") is not None:
        _int_at_least("max_concurrency", options["max_concurrency"], 1)
    if options.get("max_calls") is not None:
        _int_at_least("max_calls", options["max_calls"], 0)  # 0: no limit
    retry = options.get("retry_exceptions")
    if retry is not None and not isinstance(retry, bool):
        if not isinstance(retry, (list, tuple)):
            raise _wrong_type("retry_exceptions", retry, "a bool or a list of exception classes")
        if not all(isinstance(c, type) and issubclass(c, Exception) for c in retry):
            raise ValueError("option retry_exceptions must be a bool or a list of exception "
                             f"classes, got {retry!r}")
    lifetime = options.get("lifetime")
    if lifetime is not None:
        _string("lifetime", lifetime)
        if lifetime not in ("detached", "non_detached"):
            raise ValueError(f"option lifetime must be 'detached' or 'non_detached', got "
                             f"{lifetime!r}")
    if options.get("name") is not None:
        _string("name", options["name"], empty_ok=False)
    if options.get("namespace") is not None:
        _string("namespace", options["namespace"])
    if options.get("get_if_exists") is not None:
        if not isinstance(options["get_if_exists"], bool):
            raise _wrong_type("get_if_exists", options["get_if_exists"], "a bool")
        if options["get_if_exists"] and not options.get("name"):
            raise ValueError("The actor name must be specified to use get_if_exists: "
                             ".options(name=..., get_if_exists=True)")
    if options.get("scheduling_strategy") is not None:
        strategy = options["scheduling_strategy"]
        if not isinstance(strategy, str) and \
                not type(strategy).__name__.endswith("SchedulingStrategy"):
            raise _wrong_type("scheduling_strategy", strategy,
                              "'DEFAULT', 'SPREAD' or a tray.util.scheduling_strategies "
                              "strategy")
        to_strategy(strategy)
    return options


def to_strategy(value) -> Strategy:
    from .scheduling_strategies import (
        NodeAffinitySchedulingStrategy,
        PlacementGroupSchedulingStrategy,
    )

    if value is None or value == "DEFAULT":
        return DefaultStrategy()
    if value == "SPREAD":
        return SpreadStrategy()
    if isinstance(value, NodeAffinitySchedulingStrategy):
        return NodeAffinityStrategy(value.node_id, bool(value.soft))
    if isinstance(value, PlacementGroupSchedulingStrategy):
        return PlacementGroupStrategy(
            value.placement_group.id.hex(), bundle_index=value.placement_group_bundle_index,
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
