"""Task attempts (``list_tasks``, ``get_task``): the GCS's task event table,
filtered there where it can be, each row made a ``TaskState`` with its
events in state order.
"""

from __future__ import annotations

import os
import warnings

from ...core.messages import TaskEventPage, TaskSummaryReply
from ...core.task_status import STATUS_ORDER, TaskStatus
from ...core.worker.task_events import TaskType
from ._client import Client, job_hex, to_epoch_ms
from ._query import DEFAULT_LIMIT, check_query, finish, normal
from ._records import TaskState

# TaskState fields the GCS's rows hold as they are: filters on them are
# applied there (with the limit, when every filter is one of them).
_ROW_KEYS = {"task_id", "attempt_number", "name", "state", "actor_id", "type",
             "func_or_class_name", "parent_task_id", "node_id", "worker_id", "worker_pid",
             "error_type"}


def _task_reply(client: Client, task_id: str | None = None, filters: list = (),
                limit: int | None = None) -> TaskEventPage:
    client.flush_own_events()
    at_gcs = [(key, predicate, normal(key, value)) for key, predicate, value in filters
              if key in _ROW_KEYS]
    all_there = len(at_gcs) == len(filters)
    return client.gcs_call("get_task_events", task_id, None, at_gcs,
                           limit if all_there else None)


def _task_record(row: dict, now: float) -> TaskState:
    # In the order a task goes through its states, with times made
    # non-decreasing: the owner's and the executor's clocks agree only to
    # within a message's latency, and a fast task's RUNNING could otherwise
    # come after its end.
    events = []
    for state, at in sorted(row["events"].items(), key=lambda item: STATUS_ORDER[item[0]]):
        events.append((state, max(at, events[-1][1]) if events else at))
    times = dict(events)
    start = times.get(TaskStatus.RUNNING)
    end = times.get(TaskStatus.FAILED, times.get(TaskStatus.FINISHED)) \
        if row["state"] in (TaskStatus.FINISHED, TaskStatus.FAILED) else None
    created = events[0][1] if events else None
    return TaskState(
        task_id=row["task_id"], attempt_number=row["attempt_number"],
        name=row["name"] or "", state=row["state"], job_id=job_hex(row["job_id"]),
        actor_id=row["actor_id"], type=row["type"] or TaskType.NORMAL_TASK.value,
        func_or_class_name=row["func_or_class_name"] or "",
        parent_task_id=row["parent_task_id"] or "", node_id=row["node_id"],
        worker_id=row["worker_id"], worker_pid=row["worker_pid"],
        error_type=row["error_type"], language="PYTHON",
        required_resources=row["required_resources"],
        placement_group_id=row["placement_group_id"],
        events=[{"state": state, "created_ms": to_epoch_ms(at, now)} for state, at in events],
        profiling_data=[{"event_name": name, "start_time_ms": to_epoch_ms(start_at, now),
                         "end_time_ms": to_epoch_ms(end_at, now)}
                        for name, start_at, end_at in row["spans"]],
        creation_time_ms=to_epoch_ms(created, now), start_time_ms=to_epoch_ms(start, now),
        end_time_ms=to_epoch_ms(end, now), error_message=row["error_message"])


def warn_dropped(reply: TaskEventPage | TaskSummaryReply) -> None:
    dropped = reply.dropped_at_gcs + reply.dropped_at_sources
    if dropped:
        warnings.warn(f"{dropped} task attempts are missing from the listing: the GCS kept "
                      f"the newest {reply.stored} ({reply.dropped_at_gcs} dropped there, "
                      f"{reply.dropped_at_sources} by full event buffers)", stacklevel=3)


def _check_events_enabled() -> None:
    if os.environ.get("TRAY_TASK_EVENTS", "1") == "0":
        warnings.warn("task events are turned off in this process (TRAY_TASK_EVENTS=0): "
                      "tasks may be missing", stacklevel=3)


def list_tasks(address: str | None = None, filters: list | None = None,
               limit: int | None = None, timeout: float | None = None,
               detail: bool = False, raise_on_missing_output: bool = True
               ) -> list[TaskState]:
    """Task attempts (one row per attempt, as Ray's): the newest ``limit``
    that match, oldest first — the tasks and actor calls every process
    submitted and ran, from the task events (up to ~1 s late). Actor
    constructors appear as ``ACTOR_CREATION_TASK``."""
    checked = check_query(TaskState, filters, limit)
    _check_events_enabled()
    client = Client(address, timeout)
    limit = DEFAULT_LIMIT if limit is None else limit
    reply = _task_reply(client, None, checked, limit)
    warn_dropped(reply)
    records = [_task_record(row, reply.now) for row in reply.rows]
    if reply.more:
        warnings.warn(f"more than {limit} task attempts match, showing the newest {limit} "
                      "(pass limit= to see more)", stacklevel=2)
    return finish(TaskState, records, checked, limit, detail, "task attempts")


def get_task(id: str, address: str | None = None, timeout: float | None = None,
             attempt: int | None = None) -> TaskState | None:
    """A task by hex id (its latest attempt, or ``attempt``), all fields; None if unknown."""
    if not isinstance(id, str) or not id:
        raise ValueError(f"get_task() needs a task id (hex), got {id!r}")
    client = Client(address, timeout)
    reply = _task_reply(client, id)
    rows = [row for row in reply.rows if attempt is None or row["attempt_number"] == attempt]
    if not rows:
        return None
    row = max(rows, key=lambda r: r["attempt_number"])
    return _task_record(row, reply.now)
