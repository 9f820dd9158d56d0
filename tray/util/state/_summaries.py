"""Summaries: task attempts counted by function (the GCS counts them),
actors by class and state, object references by type and status.

Each is Ray's shape: ``{"cluster": {...}}`` (Ray keys a summary by where it
was made; tray's are always the whole cluster's).
"""

from __future__ import annotations

from collections import Counter

from ...core.worker.task_events import TaskType
from ._actors import list_actors
from ._client import Client
from ._objects import list_objects
from ._tasks import warn_dropped


def summarize_tasks(address: str | None = None, timeout: float | None = None,
                    raise_on_missing_output: bool = True) -> dict:
    """Task attempts counted by function (Ray's ``summary by func_name``):
    ``{"cluster": {"summary": {name: {"func_or_class_name", "type",
    "state_counts"}}, "total_tasks", "total_actor_tasks",
    "total_actor_scheduled", "summary_by": "func_name"}}``."""
    client = Client(address, timeout)
    client.flush_own_events()
    reply = client.gcs_call("summarize_task_events")
    warn_dropped(reply)
    summary = reply.summary
    totals = Counter()
    for entry in summary.values():
        totals[entry["type"]] += sum(entry["state_counts"].values())
    return {"cluster": {"summary": dict(sorted(summary.items())),
                        "total_tasks": totals[TaskType.NORMAL_TASK],
                        "total_actor_tasks": totals[TaskType.ACTOR_TASK],
                        "total_actor_scheduled": totals[TaskType.ACTOR_CREATION_TASK],
                        "summary_by": "func_name"}}


def summarize_actors(address: str | None = None, timeout: float | None = None,
                     raise_on_missing_output: bool = True) -> dict:
    """Actors counted by class: ``{"cluster": {"summary": {class:
    {"class_name", "state_counts"}}, "total_actors", "summary_by": "class"}}``."""
    actors = list_actors(address, limit=10**9, timeout=timeout)
    summary: dict = {}
    for actor in actors:
        entry = summary.setdefault(actor.class_name, {"class_name": actor.class_name,
                                                      "state_counts": {}})
        entry["state_counts"][actor.state] = entry["state_counts"].get(actor.state, 0) + 1
    return {"cluster": {"summary": dict(sorted(summary.items())), "total_actors": len(actors),
                        "summary_by": "class"}}


def summarize_objects(address: str | None = None, timeout: float | None = None,
                      raise_on_missing_output: bool = True) -> dict:
    """Object references counted by reference type and task status, with
    their known total size: ``{"cluster": {"summary": {"total_objects",
    "total_size_bytes", "by_reference_type", "by_task_status"},
    "total_objects", "total_size_mb", "callsite_enabled": False}}`` (Ray's
    summary is by call site, which tray does not record)."""
    objects = list_objects(address, limit=10**9, timeout=timeout)
    by_type = Counter(o.reference_type for o in objects)
    by_status = Counter(o.task_status for o in objects)
    size = sum(o.object_size or 0 for o in objects)
    return {"cluster": {"summary": {"total_objects": len(objects), "total_size_bytes": size,
                                    "by_reference_type": dict(sorted(by_type.items())),
                                    "by_task_status": dict(sorted(by_status.items()))},
                        "total_objects": len(objects), "total_size_mb": size / 2**20,
                        "callsite_enabled": False}}
