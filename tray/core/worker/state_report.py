"""What a core worker tells the state API of the objects it references.

``tray.util.state.list_objects`` (and ``tray memory``) ask every worker and
driver for this report, as Ray's state API asks every core worker through
its raylet: references live only in their processes. One call per process
per query, only when someone asks; the report is bounded by
``OBJECT_REPORT_MAX`` entries (a process holding more says how many it left
out)."""

from __future__ import annotations

import os

from ..messages import ObjectReport
from ..task_status import TaskStatus
from .reference_counter import is_actor_handle

# Entries one process reports at most (the rest are counted).
OBJECT_REPORT_MAX = 10_000


def _reference_type(entry) -> str:
    """Ray's reference types, the strongest hold first."""
    if entry.submitted:
        return "USED_BY_PENDING_TASK"
    if entry.local:
        return "LOCAL_REFERENCE"
    if entry.contained:
        return "CAPTURED_IN_OBJECT"
    if entry.borrowers:
        return "BORROWED_BY_OTHERS"
    return "PINNED_IN_MEMORY"


def object_report(*, references, task_manager, store, node_id: str, mode: str,
                  worker_id: str, address: str) -> ObjectReport:
    rows = []
    left_out = 0
    for object_id, entry in sorted(references.refs.items(), key=lambda kv: kv[0].hex()):
        if is_actor_handle(object_id):
            continue
        if len(rows) >= OBJECT_REPORT_MAX:
            left_out += 1
            continue
        size = None
        if entry.inline is not None:
            size = entry.inline.size_bytes()
        elif entry.owned and store is not None and \
                any(location[0] == node_id for location in entry.locations):
            found = store.get(object_id.binary())
            if found is not None:
                data, buffers = found
                size = len(data) + sum(len(buffer) for buffer in buffers)
        task = task_manager.get(object_id.task_id())
        if task is not None:
            status = task.state.value  # (the text: the report is pickled)
        else:
            status = TaskStatus.FINISHED.value if entry.ready else "PENDING"
        rows.append({
            "object_id": object_id.hex(), "object_size": size,
            "reference_type": _reference_type(entry), "owned": entry.owned,
            "owner_address": entry.owner, "task_status": status,
            "local_ref_count": entry.local, "submitted_task_ref_count": entry.submitted,
            "borrowers": len(entry.borrowers),
            "locations": sorted({location[0] for location in entry.locations}),
            "in_memory": entry.inline is not None})
    return ObjectReport(rows=rows, left_out=left_out, pid=os.getpid(), node_id=node_id,
                        worker_type="DRIVER" if mode == "driver" else "WORKER",
                        worker_id=worker_id, address=address)
