"""The state records each ``list_*`` returns (Ray's fields): dataclasses
that also read like dicts (``actor["state"]``). Fields marked detail-only
are ``None`` unless the call passed ``detail=True`` (Ray's columns).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field


def _detail() -> dict:
    return {"detail": True}


class _Record:
    """A state record reads like a dict too (``row["state"]``), as Ray's do."""

    def __getitem__(self, key: str):
        try:
            return getattr(self, key)
        except AttributeError:
            raise KeyError(key) from None

    def get(self, key: str, default=None):
        return getattr(self, key, default)

    def keys(self) -> list[str]:
        return [f.name for f in dataclasses.fields(self)]

    def asdict(self) -> dict:
        return dataclasses.asdict(self)


@dataclass
class NodeState(_Record):
    node_id: str
    node_ip: str
    is_head_node: bool
    state: str  # ALIVE | DEAD
    node_name: str
    resources_total: dict
    resources_available: dict | None = field(default=None, metadata=_detail())
    address: str | None = field(default=None, metadata=_detail())
    object_store_total_bytes: int | None = field(default=None, metadata=_detail())
    session_dir: str | None = field(default=None, metadata=_detail())


@dataclass
class ActorState(_Record):
    actor_id: str
    class_name: str
    state: str  # DEPENDENCIES_UNREADY | PENDING_CREATION | ALIVE | RESTARTING | DEAD
    job_id: str
    name: str
    node_id: str | None
    pid: int | None
    ray_namespace: str
    num_restarts: int
    worker_id: str | None = field(default=None, metadata=_detail())
    required_resources: dict | None = field(default=None, metadata=_detail())
    death_cause: str | None = field(default=None, metadata=_detail())
    # Why a PENDING_CREATION or RESTARTING actor has not started, when a node
    # says ("waiting: worker limit 256 reached on node <id>"), else None.
    pending_reason: str | None = field(default=None, metadata=_detail())
    is_detached: bool | None = field(default=None, metadata=_detail())
    placement_group_id: str | None = field(default=None, metadata=_detail())
    repr_name: str | None = field(default=None, metadata=_detail())
    max_restarts: int | None = field(default=None, metadata=_detail())
    owner_address: str | None = field(default=None, metadata=_detail())
    address: str | None = field(default=None, metadata=_detail())
    # [{"state": ..., "created_ms": ...}] as Ray's task events.
    events: list | None = field(default=None, metadata=_detail())


@dataclass
class TaskState(_Record):
    task_id: str
    attempt_number: int
    name: str
    state: str
    job_id: str
    actor_id: str | None
    type: str  # NORMAL_TASK | ACTOR_TASK | ACTOR_CREATION_TASK
    func_or_class_name: str
    parent_task_id: str
    node_id: str | None
    worker_id: str | None
    worker_pid: int | None
    error_type: str | None
    language: str | None = field(default=None, metadata=_detail())
    required_resources: dict | None = field(default=None, metadata=_detail())
    placement_group_id: str | None = field(default=None, metadata=_detail())
    events: list | None = field(default=None, metadata=_detail())
    profiling_data: list | None = field(default=None, metadata=_detail())
    creation_time_ms: int | None = field(default=None, metadata=_detail())
    start_time_ms: int | None = field(default=None, metadata=_detail())
    end_time_ms: int | None = field(default=None, metadata=_detail())
    error_message: str | None = field(default=None, metadata=_detail())


@dataclass
class ObjectState(_Record):
    object_id: str
    object_size: int | None
    task_status: str
    reference_type: str
    call_site: str
    type: str  # DRIVER | WORKER: the kind of process holding the reference
    pid: int | None
    ip: str | None
    node_id: str | None = field(default=None, metadata=_detail())
    worker_id: str | None = field(default=None, metadata=_detail())
    owner_address: str | None = field(default=None, metadata=_detail())
    owned: bool | None = field(default=None, metadata=_detail())
    locations: list | None = field(default=None, metadata=_detail())


@dataclass
class WorkerState(_Record):
    worker_id: str
    is_alive: bool
    worker_type: str  # WORKER | DRIVER
    exit_type: str | None
    node_id: str | None
    ip: str | None
    pid: int | None
    state: str | None = field(default=None, metadata=_detail())  # tray's: idle|leased|actor...
    address: str | None = field(default=None, metadata=_detail())


@dataclass
class JobState(_Record):
    job_id: str
    submission_id: str | None
    type: str  # DRIVER | SUBMISSION
    status: str
    entrypoint: str
    driver_address: str | None = None
    message: str | None = field(default=None, metadata=_detail())
    start_time: int | None = field(default=None, metadata=_detail())
    end_time: int | None = field(default=None, metadata=_detail())
    metadata: dict | None = field(default=None, metadata=_detail())


@dataclass
class PlacementGroupState(_Record):
    placement_group_id: str
    name: str
    state: str
    strategy: str | None = field(default=None, metadata=_detail())
    bundles: list | None = field(default=None, metadata=_detail())
    is_detached: bool | None = field(default=None, metadata=_detail())
