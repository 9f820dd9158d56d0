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
from dataclasses import dataclass

import trio

from ..messages import TaskEventPage, TaskSummaryReply
from ..task_status import STATUS_ORDER, TaskStatus
from ..worker.task_events import INFO_FIELDS, TaskType

_ENDED = (TaskStatus.FINISHED, TaskStatus.FAILED)

# Workers whose pids are kept (list_workers shows the others without).
WORKER_PIDS_MAX = 10_000

# A new row: copied (one C-level copy) and filled in. A row whose task info
# never came (its batches were lost with a GCS restart) is a normal task, for
# the filters as for the listing and the summary (state chaos seed 53: the
# listing showed NORMAL_TASK where a filter for it found nothing).
_EMPTY_ROW = {"task_id": None, "attempt_number": None, "state": None, "events": None,
              "node_id": None, "worker_id": None, "worker_pid": None, "error_type": None,
              "error_message": None, "spans": None, **dict.fromkeys(INFO_FIELDS),
              "type": TaskType.NORMAL_TASK.value}


@dataclass(frozen=True)
class TaskEventTableStatistics:
    rows: int  # task attempts kept, at most task_events_gcs_max
    dropped_here: int  # rows evicted for newer ones
    dropped_at_sources: int  # attempts the senders' full buffers dropped
    batches: int  # batches merged since the GCS started
    worker_pids: int  # workers whose pid is known (at most WORKER_PIDS_MAX)


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
        # worker id -> its pid, from the executors' events (list_workers),
        # the WORKER_PIDS_MAX most recently seen.
        self.worker_pids: OrderedDict[str, int] = OrderedDict()
        # Keys of the rows merged into since the last validate_state (None:
        # check every row next time): only _merge changes a row, so checking
        # those is checking them all. The whole table, up to
        # task_events_gcs_max rows, at every step of the GCS made a long
        # simulation quadratic in its tasks. Kept only after a check (the
        # simulator's; a real GCS, never checked, keeps nothing), and never
        # more keys than rows.
        self._merged_since_check: set[tuple[str, int]] | None = None

    def statistics(self) -> TaskEventTableStatistics:
        return TaskEventTableStatistics(
            rows=len(self.rows), dropped_here=self.dropped_here,
            dropped_at_sources=self.dropped_at_sources, batches=self.batches,
            worker_pids=len(self.worker_pids))

    def validate_state(self) -> None:
        """The bounds, and the rows merged into since the last check (only
        ``_merge`` changes a row): O(rows merged since). The one exception
        to a check changing nothing: it resets that set of keys, which is
        the checks' own bookkeeping."""
        rows = self.rows
        assert len(rows) <= self._max, len(rows)
        assert len(self.worker_pids) <= WORKER_PIDS_MAX, len(self.worker_pids)
        assert self.dropped_here >= 0, self.dropped_here
        assert self.dropped_at_sources >= 0, self.dropped_at_sources
        merged = self._merged_since_check
        for key in rows if merged is None else merged:
            row = rows.get(key)
            if row is None:
                continue  # evicted since
            assert (row["task_id"], row["attempt_number"]) == key, key
            assert row["state"] in STATUS_ORDER, row["state"]
        self._merged_since_check = set()

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

    def _merge(self, event: tuple, shift: float) -> None:
        (task_id, attempt, info, states, node_id, worker_id, worker_pid, error_type,
         error_message, spans) = event  # TaskAttemptEvents.as_tuple()
        key = (task_id, attempt)
        merged = self._merged_since_check
        if merged is not None:
            merged.add(key)
            if len(merged) > self._max:
                self._merged_since_check = None
        row = self.rows.get(key)
        if row is None:
            row = self.rows[key] = _EMPTY_ROW.copy()
            row["task_id"], row["attempt_number"] = task_id, attempt
            row["events"] = known = {state: at + shift for state, at in states.items()}
            row["spans"] = []
        else:
            known = row["events"]
            for state, at in states.items():
                shifted = at + shift
                if state not in known or shifted < known[state]:
                    known[state] = shifted
        if info is not None:  # task_info's tuple: INFO_FIELDS
            for name, value in zip(INFO_FIELDS, info, strict=True):
                if value is not None:
                    row[name] = value
        if known:
            row["state"] = max(known, key=STATUS_ORDER.__getitem__)
        if node_id is not None:
            row["node_id"], row["worker_id"], row["worker_pid"] = node_id, worker_id, \
                worker_pid
            pids = self.worker_pids
            pids[worker_id] = worker_pid
            pids.move_to_end(worker_id)
            if len(pids) > WORKER_PIDS_MAX:
                pids.popitem(last=False)
        if error_type is not None:
            # The executor's account of an exception (with its traceback)
            # is the better one; the owner's fills in when there is none.
            if row["error_type"] is None or node_id is not None:
                row["error_type"], row["error_message"] = error_type, error_message
        for name, start, end in spans:
            row["spans"].append((name, start + shift, end + shift))

    def job_ended(self, job_id: int) -> None:
        """The job's driver exited: its attempts that had not ended never
        will (nobody waits for them), and are marked failed, as Ray's GCS
        does (``MarkTasksFailedOnJobEnds``), instead of staying pending or
        running in every listing for good."""
        now = trio.current_time()
        message = (f"Job finishes ({job_id:08x}) as driver exits. Marking all non-terminal "
                   f"tasks as failed.")
        for key, row in self.rows.items():
            if row["job_id"] == job_id and row["state"] not in _ENDED:
                if self._merged_since_check is not None:
                    self._merged_since_check.add(key)
                row["events"][TaskStatus.FAILED] = now
                row["state"] = TaskStatus.FAILED
                if row["error_type"] is None:
                    row["error_type"], row["error_message"] = "WORKER_DIED", message

    def handle_get_task_events(self, conn, task_id: str | None = None,
                               job_id: int | None = None, filters: list | None = None,
                               limit: int | None = None) -> TaskEventPage:
        """Rows (all, or one task's attempts, or one job's) matching
        ``filters`` — [(row key, "=" or "!=", value)], values compared as
        ``_normal`` strings — the newest ``limit`` of them, oldest first;
        with the counts of what was dropped, whether more matched than
        ``limit``, and this clock's ``now``. Filtering and limiting here keep
        a query of a full table (100,000 rows, ~175 MB) off this loop."""
        chosen = []
        more = False
        for row in reversed(self.rows.values()):
            if task_id is not None and row["task_id"] != task_id:
                continue
            if job_id is not None and row["job_id"] != job_id:
                continue
            if filters and not all((_normal(key, row.get(key)) == value) == (predicate == "=")
                                   for key, predicate, value in filters):
                continue
            if limit is not None and len(chosen) >= limit:
                more = True
                break
            chosen.append(row)
        chosen.reverse()
        return TaskEventPage(rows=[_copy(row) for row in chosen], now=trio.current_time(),
                             dropped_at_gcs=self.dropped_here, more=more,
                             dropped_at_sources=self.dropped_at_sources, stored=len(self.rows))

    def handle_worker_pids(self, conn) -> dict[str, int]:
        """worker id -> pid, for the workers that ran something lately."""
        return dict(self.worker_pids)

    def handle_summarize_task_events(self, conn) -> TaskSummaryReply:
        """Attempts counted by function and state (``summarize_tasks``),
        without sending the rows."""
        summary: dict = {}
        for row in self.rows.values():
            name = row["func_or_class_name"] or row["name"] or ""
            entry = summary.setdefault(name, {"func_or_class_name": name,
                                              "type": row["type"],
                                              "state_counts": {}})
            counts = entry["state_counts"]
            counts[row["state"]] = counts.get(row["state"], 0) + 1
        return TaskSummaryReply(summary=summary, dropped_at_gcs=self.dropped_here,
                                dropped_at_sources=self.dropped_at_sources,
                                stored=len(self.rows))

# Keys whose values are Ray enum names: compared case-insensitively (the
# state API sends them upper-cased).
_ENUM_KEYS = {"state", "type", "error_type"}


def _normal(key: str, value) -> str:
    """A row's value as the state API's filters compare it (tray.util.state)."""
    text = "" if value is None else str(value)
    if isinstance(value, bool):
        text = text.lower()
    return text.upper() if key in _ENUM_KEYS else text


def _copy(row: dict) -> dict:
    copied = dict(row)
    copied["events"] = dict(row["events"])
    copied["spans"] = list(row["spans"])
    return copied
