"""The GCS's task event table: the newest task attempts, merged from batches.

Every process sends its task events in batches (``worker/task_events``);
here the owner's record of an attempt (its states from
``PENDING_ARGS_AVAIL`` to ``FINISHED``/``FAILED``, what the task is) and
the executor's (``RUNNING``, where it ran, the spans of the run) become
one row, keyed by (task id, attempt). The row's state is the furthest its
events went, in Ray's order (a failure outranks a finish: an attempt whose
owner saw it fail failed, whatever its worker thought).

Bounded: at most ``task_events_gcs_max`` attempts, the oldest (by first
event received) evicted first and counted; batches also say how many
attempts their senders dropped (a full buffer). The state API shows both
counts, so a listing that is missing tasks says so.

Volatile: the table lives in the GCS's memory only (as Ray's). A GCS
restart empties it; events of tasks that end afterwards arrive again.
Times are the GCS's loop clock (each batch's are moved onto it when it
arrives); ``now`` comes with every query so that the state API can turn
them into dates."""

from __future__ import annotations

from collections import OrderedDict

import trio

# Ray's states in the order a task goes through them; a row's state is the
# furthest of its events.
STATE_ORDER = {"PENDING_ARGS_AVAIL": 0, "PENDING_NODE_ASSIGNMENT": 1,
               "SUBMITTED_TO_WORKER": 2, "RUNNING": 3, "FINISHED": 4, "FAILED": 5}

_INFO_KEYS = ("name", "type", "job_id", "actor_id", "parent_task_id", "required_resources",
              "placement_group_id", "func_or_class_name", "owner")


class TaskEventTable:
    def __init__(self, *, config, tracer, storage=None) -> None:
        self._storage = storage
        self._max = config.task_events_gcs_max
        self._tracer = tracer
        # (task id hex, attempt) -> row (a dict of Ray's TaskState fields),
        # oldest first; at most task_events_gcs_max.
        self.rows: OrderedDict[tuple[str, int], dict] = OrderedDict()
        self.dropped_here = 0  # rows evicted for newer ones
        self.dropped_at_sources = 0  # attempts the senders' full buffers dropped
        self.batches = 0

    def validate_state(self) -> None:
        assert len(self.rows) <= self._max, len(self.rows)
        for (task_id, attempt), row in self.rows.items():
            assert row["task_id"] == task_id and row["attempt_number"] == attempt, task_id
            assert row["state"] in STATE_ORDER, row["state"]

    def handle_add_task_events(self, conn, batch) -> None:
        """A process's batch (``TaskEventBatch``): merge it in."""
        now = trio.current_time()
        shift = now - batch.sender_now  # the sender's clock onto ours
        self.batches += 1
        self.dropped_at_sources += batch.dropped
        for event in batch.events:
            self._merge(event, shift)
        while len(self.rows) > self._max:
            self.rows.popitem(last=False)
            self.dropped_here += 1

    def _merge(self, event, shift: float) -> None:
        key = (event.task_id, event.attempt)
        row = self.rows.get(key)
        if row is None:
            row = self.rows[key] = {
                "task_id": event.task_id, "attempt_number": event.attempt, "state": None,
                "events": {}, "node_id": None, "worker_id": None, "worker_pid": None,
                "error_type": None, "error_message": None, "spans": [],
                **{name: None for name in _INFO_KEYS}}
        if event.info:
            for name in _INFO_KEYS:
                if event.info.get(name) is not None or row[name] is None:
                    row[name] = event.info.get(name)
        for state, at in event.states.items():
            shifted = at + shift
            known = row["events"].get(state)
            if known is None or shifted < known:
                row["events"][state] = shifted
        if row["events"]:
            row["state"] = max(row["events"], key=STATE_ORDER.__getitem__)
        if event.node_id is not None:
            row["node_id"], row["worker_id"], row["worker_pid"] = \
                event.node_id, event.worker_id, event.worker_pid
        if event.error_type is not None:
            # The executor's account of an exception (with its traceback)
            # is the better one; the owner's fills in when there is none.
            if row["error_type"] is None or event.node_id is not None:
                row["error_type"], row["error_message"] = event.error_type, \
                    event.error_message
        for name, start, end in event.spans:
            row["spans"].append((name, start + shift, end + shift))

    def handle_get_task_events(self, conn, task_id: str | None = None,
                               job_id: int | None = None) -> dict:
        """Rows (all, or one task's attempts, or one job's), oldest first,
        with the counts of what was dropped and this clock's ``now``."""
        if task_id is not None:
            rows = [row for (tid, _), row in self.rows.items() if tid == task_id]
        elif job_id is not None:
            rows = [row for row in self.rows.values() if row["job_id"] == job_id]
        else:
            rows = list(self.rows.values())
        return {"rows": [_copy(row) for row in rows], "now": trio.current_time(),
                "dropped_at_gcs": self.dropped_here,
                "dropped_at_sources": self.dropped_at_sources, "stored": len(self.rows)}


    def handle_list_driver_jobs(self, conn) -> list:
        """Every job a driver registered: [(job number, driver address)]
        (the state API's ``list_jobs``; the job table is ``kv_store``'s)."""
        if self._storage is None:
            return []
        return [(int(key), value.decode()) for key, value in self._storage.scan("jobs")]


def _copy(row: dict) -> dict:
    copied = dict(row)
    copied["events"] = dict(row["events"])
    copied["spans"] = list(row["spans"])
    return copied
