"""Task events: what each process saw of each task attempt, batched to the GCS.

The state API (``tray.util.state.list_tasks``), the timeline and the
dashboard answer "what ran where, when, and why did it fail" from these.
Two kinds of process see a task:

* its **owner** (the process that called ``.remote()``) records every state
  transition with Ray's names — ``PENDING_ARGS_AVAIL``,
  ``PENDING_NODE_ASSIGNMENT``, ``SUBMITTED_TO_WORKER``, ``FINISHED``,
  ``FAILED`` (with the error type and message) — and what the task is (its
  name, type, job, actor, parent, resources);
* its **executor** (the worker that ran it) records ``RUNNING`` and its own
  ``FINISHED``/``FAILED``, where (node, worker, pid), and the spans of the
  run (fetching the arguments, running the user's code, storing results).

Why batched, and why here: Ray's design (its ``TaskEventBuffer``) and the
issue's rule: never one message per event, never a poll of every process
per query. Each process keeps one record per task attempt in a buffer and
merges later transitions into it, so a task that goes through five states
between two flushes costs one record. A timer (``task_events_flush_period_s``)
sends the buffer to the GCS in one-way messages of at most
``FLUSH_BATCH_MAX`` records, the loop free between them; the GCS merges the
owner's and the executor's records of an attempt (``gcs/task_event_table``).
Events are best effort: a batch sent while the GCS is away is lost (the
state API then shows a task in an earlier state), never retried without end.

Bounded: at most ``task_events_buffer_max`` attempts wait in a process's
buffer; records of further attempts are dropped and counted (the count
travels with the next batch and the state API shows it).

Time: each process stamps events with its own loop clock (virtual in the
simulator), and every batch says what that clock read when it was sent;
the GCS moves the stamps onto its own clock (off by the message's latency,
milliseconds on one machine). The core reads no wall clock, so turning the
GCS's clock into dates is the state API's business, outside the core.

Off switch: ``Config(task_events_enabled=False)`` (the backends set it from ``TRAY_TASK_EVENTS=0``)
in the environment of the processes (set before ``tray.init``): nothing is
recorded or sent, and the state API says so instead of listing no tasks."""

from __future__ import annotations

import enum
import itertools
import os
from dataclasses import dataclass, field

import trio

from ..scheduling import placement_group_id_of
from ..task_status import TaskStatus

# Ray's names for why a task failed (its ErrorType), by tray's exception.
_ERROR_TYPES = {
    "TaskCancelledError": "TASK_CANCELLED",
    "WorkerCrashedError": "WORKER_DIED",
    "NodeDiedError": "NODE_DIED",
    "ActorDiedError": "ACTOR_DIED",
    "ActorPlacementGroupRemoved": "ACTOR_DIED",
    "ActorUnavailableError": "ACTOR_UNAVAILABLE",
    "OutOfMemoryError": "OUT_OF_MEMORY",
    "ObjectLostError": "OBJECT_LOST",
    "OwnerDiedError": "OWNER_DIED",
    "ObjectReconstructionFailedError": "OBJECT_UNRECONSTRUCTABLE",
    "ObjectStoreFullError": "OBJECT_STORE_FULL",
    "TaskPlacementGroupRemoved": "TASK_PLACEMENT_GROUP_REMOVED",
    "PendingCallsLimitExceeded": "PENDING_CALLS_LIMIT_EXCEEDED",
    "GetTimeoutError": "GET_TIMEOUT",
}

# Spans kept per task attempt (an attempt re-run in the same worker adds more).
SPANS_MAX = 16

# An error message longer than this is cut (a traceback of a deep recursion).
ERROR_MESSAGE_MAX_CHARS = 8 * 1024



class TaskType(enum.StrEnum):
    """What a task is, in Ray's words (its ``TaskType``); as ``TaskStatus``,
    valued by the names, and what leaves the process is the text."""
    NORMAL_TASK = "NORMAL_TASK"  # a remote function's call
    ACTOR_CREATION_TASK = "ACTOR_CREATION_TASK"  # an actor's constructor
    ACTOR_TASK = "ACTOR_TASK"  # an actor method's call


def error_type_of(error: BaseException) -> str:
    """Ray's ErrorType name for an exception ending a task."""
    for cls in type(error).__mro__:
        found = _ERROR_TYPES.get(cls.__name__)
        if found is not None:
            return found
    if type(error).__name__ == "TaskError" or any(
            cls.__name__ == "TaskError" for cls in type(error).__mro__):
        return "TASK_EXECUTION_EXCEPTION"
    return type(error).__name__


def error_message_of(error: BaseException) -> str:
    text = str(error)
    if len(text) > ERROR_MESSAGE_MAX_CHARS:
        text = text[:ERROR_MESSAGE_MAX_CHARS] + f"... ({len(text)} characters)"
    return text


@dataclass(slots=True)
class TaskAttemptEvents:
    """What one process saw of one task attempt (merged with the others'
    in the GCS). Times are this process's loop clock until the GCS moves
    them onto its own."""
    task_id: bytes  # (hex when it travels)
    attempt: int
    info: tuple | None = None  # what the task is: task_info's INFO_FIELDS
    states: dict = field(default_factory=dict)  # TaskStatus's text -> time it was entered
    node_id: str | None = None  # where it ran (the executor's records)
    worker_id: str | None = None
    worker_pid: int | None = None
    error_type: str | None = None
    error_message: str | None = None
    # Spans of the run, for the timeline: [(name, start, end)].
    spans: list = field(default_factory=list)
    buffered: bool = True  # in the buffer (False once flushed)

    def as_tuple(self) -> tuple:
        """The record as it travels (a tuple pickles in a third of the time
        of a dataclass, and the GCS reads it back as fast): the fields in
        their order here."""
        return (self.task_id.hex(), self.attempt, self.info, self.states, self.node_id,
                self.worker_id, self.worker_pid, self.error_type, self.error_message,
                self.spans)


@dataclass(frozen=True)
class TaskEventBatch:
    """One flush: the records, how many were dropped since the last one,
    and the sender's clock when it sent them."""
    events: list  # [TaskAttemptEvents.as_tuple()]
    dropped: int
    sender_now: float
    sender: str


@dataclass(frozen=True)
class TaskEventBufferStatistics:
    buffered: int  # task attempts waiting for the next flush
    dropped: int  # task attempts dropped since the start (buffer full)
    sent_batches: int


def events_enabled(config) -> bool:
    return bool(getattr(config, "task_events_enabled", True))


# At most this many task attempts per message to the GCS. A driver's sync
# loop buffers ~750 a second; flushed as one batch, turning them into
# tuples and pickling them held its loop ~4 ms, and the calls in flight
# waited that long (the tail of task latency). A chunk takes ~0.6 ms, and
# the GCS merges each on its own too.
FLUSH_BATCH_MAX = 128


class TaskEventBuffer:
    """This process's buffer of task events (see the module header)."""

    def __init__(self, *, address: str, node_id: str | None, worker_id: str, endpoint,
                 gcs_address: str, config) -> None:
        self._address = address
        self._node_id = node_id
        self._worker_id = worker_id or address
        self._endpoint = endpoint
        self._gcs_address = gcs_address
        self._period_s = config.task_events_flush_period_s
        self._max = config.task_events_buffer_max
        self.enabled = events_enabled(config)
        self._events: dict[tuple[str, int], TaskAttemptEvents] = {}
        self._dropped_unsent = 0
        self.dropped = 0
        self.sent_batches = 0
        self._pid = os.getpid()
        # Set when the buffer gets its first record: the flusher sleeps on
        # it, so an idle process does not wake every period for nothing (a
        # third of the host's samples while 1,000 simulated actors sat idle
        # on one node).
        self._has_events = trio.Event()

    def statistics(self) -> TaskEventBufferStatistics:
        return TaskEventBufferStatistics(len(self._events), self.dropped, self.sent_batches)

    def validate_state(self) -> None:
        """The buffer within its bound, the drop counts, and the oldest and
        newest records (the next to be sent, the last one added) each under
        its attempt and marked buffered: O(1). (The simulator runs this
        after every step of a process; walking a flush period's records
        each time was about a twentieth of a mixed sweep's CPU.)"""
        events = self._events
        assert len(events) <= self._max, len(events)
        assert self.enabled or not events, "a disabled buffer holds records"
        assert 0 <= self._dropped_unsent <= self.dropped, (self._dropped_unsent, self.dropped)
        if events:
            oldest = next(iter(events))
            self._validate_record(oldest, events[oldest])
            newest = next(reversed(events))
            self._validate_record(newest, events[newest])

    @staticmethod
    def _validate_record(key: tuple, record: TaskAttemptEvents) -> None:
        assert key == (record.task_id, record.attempt), key
        # (Taking a batch marks its records unbuffered as they leave.)
        assert record.buffered, key
        # (A record is made for the state its maker enters at once.)
        assert record.states, key
        assert len(record.spans) <= SPANS_MAX, (key, len(record.spans))

    def _record_of(self, task_id: bytes, attempt: int) -> TaskAttemptEvents | None:
        key = (task_id, attempt)
        record = self._events.get(key)
        if record is None:
            if len(self._events) >= self._max:
                self.dropped += 1
                self._dropped_unsent += 1
                return None
            if not self._events:
                self._has_events.set()
            record = self._events[key] = TaskAttemptEvents(task_id, attempt)
        return record

    # ------------------------------------------------------------ the owner

    def task_state(self, spec, state: TaskStatus, *, error: BaseException | None = None,
                   info: bool = False, actor_id: str | None = None) -> None:
        """The owner saw ``spec``'s current attempt enter ``state`` (``actor_id``:
        the actor whose constructor ``spec`` is)."""
        if not self.enabled:
            return
        record = self._record_of(spec.task_id, spec.attempt)
        if record is None:
            return
        # The text, not the member: a member pickles as a reference to its class.
        record.states.setdefault(state.value, trio.current_time())
        if info or record.info is None:
            record.info = task_info(spec, actor_id)
        if error is not None:
            record.error_type = error_type_of(error)
            record.error_message = error_message_of(error)
        elif state == TaskStatus.FAILED and record.error_type is None:
            # It ran and returned an error (the executor's events say which).
            record.error_type = "TASK_EXECUTION_EXCEPTION"

    # --------------------------------------------------------- the executor

    def started(self, spec, actor_id: str | None = None) -> TaskAttemptEvents | None:
        """This worker begins running ``spec`` (RUNNING); ``actor_id``: the
        actor whose constructor (or method) it is. The record to hand to
        ``ended`` (None: disabled, or the buffer is full)."""
        if not self.enabled:
            return None
        record = self._record_of(spec.task_id, spec.attempt)
        if record is None:
            return None
        record.states.setdefault(TaskStatus.RUNNING.value, trio.current_time())
        record.node_id, record.worker_id, record.worker_pid = \
            self._node_id, self._worker_id, self._pid
        if record.info is None:
            record.info = task_info(spec, actor_id)
        return record

    def ended(self, record: TaskAttemptEvents, spans: list,
              error: BaseException | None = None, error_type: str | None = None) -> None:
        """The executor finished running the attempt of ``record`` (from
        ``started``; FAILED when it raised), with the spans of the run:
        [(name, start, end)]. A record flushed since it started goes back
        into the buffer with what is new (the GCS merges both)."""
        if not record.buffered:
            if len(self._events) >= self._max:
                self.dropped += 1
                self._dropped_unsent += 1
                return
            record.buffered = True
            if not self._events:
                self._has_events.set()
            self._events[(record.task_id, record.attempt)] = record
        state = TaskStatus.FINISHED if error is None and error_type is None else TaskStatus.FAILED
        record.states.setdefault(state.value, trio.current_time())
        record.spans.extend(spans[:SPANS_MAX - len(record.spans)])
        if error is not None:
            record.error_type = error_type or error_type_of(error)
            record.error_message = error_message_of(error)

    # ---------------------------------------------------------------- flush

    def take_batch(self, limit: int | None = None) -> TaskEventBatch | None:
        """The oldest ``limit`` records (None: all) as a batch, out of the
        buffer; None when there is nothing to send."""
        if not self._events and not self._dropped_unsent:
            return None
        if limit is None or len(self._events) <= limit:
            records = self._events.values()
            self._events = {}
        else:
            records = [self._events.pop(key) for key in list(itertools.islice(self._events,
                                                                              limit))]
        events = []
        for record in records:
            events.append(record.as_tuple())
            # What was sent stays as it is (the batch is pickled later): a
            # record that gets more (its end) starts over with new containers.
            record.states, record.spans, record.info, record.buffered = {}, [], None, False
        batch = TaskEventBatch(events, self._dropped_unsent, trio.current_time(), self._address)
        self._dropped_unsent = 0
        return batch

    async def flush(self) -> None:
        """Send what is buffered to the GCS now, as one-way messages of at
        most ``FLUSH_BATCH_MAX`` records each, the loop free between them.
        Records buffered meanwhile wait for the next flush."""
        left = len(self._events)
        while True:
            batch = self.take_batch(min(left, FLUSH_BATCH_MAX))
            if batch is None:
                break
            left -= len(batch.events)
            self.sent_batches += 1
            await self._endpoint.notify(self._gcs_address, "add_task_events", batch)
            if left <= 0:
                break
            await trio.lowlevel.checkpoint()  # (a send that did not block did not yield)
        if self._events:
            self._has_events.set()  # (records added meanwhile did not: the buffer was not empty)

    async def run(self) -> None:
        """For the process's life: once the buffer holds a record, wait
        ``task_events_flush_period_s`` (what arrives meanwhile joins the
        batch), then flush. An empty buffer costs no wake-up."""
        if not self.enabled:
            return
        while True:
            await self._has_events.wait()
            await trio.sleep(self._period_s)
            # A fresh event before the batch is taken (take_batch runs
            # before flush's first await): a record buffered after it sets it.
            self._has_events = trio.Event()
            await self.flush()


# What a task is, in the state API's (Ray's) words: the fields of
# ``task_info``'s tuple, in its order (the GCS's rows have them by name).
INFO_FIELDS = ("name", "type", "job_id", "actor_id", "parent_task_id", "required_resources",
               "placement_group_id", "func_or_class_name", "owner")


def task_info(spec, actor_id: str | None = None) -> tuple:
    """What a task is: the values of ``INFO_FIELDS`` (a tuple: one is made
    per task, and the GCS unpickles and merges every one). An actor's
    constructor call carries no actor id in its spec: ``actor_id`` says it."""
    if spec.actor_id is None and actor_id is None:
        kind = TaskType.NORMAL_TASK.value  # (the text: task events are pickled)
    elif spec.method is None:
        kind = TaskType.ACTOR_CREATION_TASK.value
    else:
        kind = TaskType.ACTOR_TASK.value
    return (spec.name, kind, spec.job_id, spec.actor_id or actor_id, spec.parent_task_id.hex(),
            dict(spec.resources), placement_group_id_of(spec.strategy), spec.name, spec.caller)
