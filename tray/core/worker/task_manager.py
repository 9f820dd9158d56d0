"""The owner's table of tasks: pending ones, and the lineage of finished ones.

A task (or actor call) this process submitted is *pending* from
``.remote()`` until its outcome is recorded. Its state is one field, a
``TaskStatus`` (Ray's names, ``task_status.py``):

  PENDING_ARGS_AVAIL       waiting for its by-reference arguments
  PENDING_NODE_ASSIGNMENT  queued for a lease (an actor call: waiting for
                           its actor to be alive)
  SUBMITTED_TO_WORKER      pushed to a worker (sent to its actor)
  FINISHED | FAILED        its outcome is recorded; it is no longer pending

A retry goes back to PENDING_NODE_ASSIGNMENT; a re-run for lineage
reconstruction starts again as a new pending task.

**Every path that ends a task ends it here**, in ``complete`` (the task ran
and returned its results: values, or the error it raised) or ``fail`` (it
ended without results: worker death past its retries, cancellation, a
failed dependency, a lease that cannot be had, the GCS unreachable, an
actor's limit...). Both record each result in the reference table (inline
values, the locations of stored ones, errors), wake getters, and release
the task's hold on its arguments — except an actor call that fails while a
copy of it is at a live actor that has not answered: the actor submitter
keeps its arguments until the call settles there (``args_to_release``). No
path can forget to end a task, and a task is ended once: a second
``complete``/``fail`` is ignored.

A finished normal task whose results live in node stores stays in
``lineage`` for as long as any of its results is referenced, at most
``lineage_tasks_max`` of them (the oldest go first; their results can no
longer be re-created): it is what re-creates a result whose copies were all
lost (``object_recovery``)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from ..ids import ObjectID, TaskID
from ..messages import FailedResult, InlineResult, StoredResult
from ..serialization import SerializedObject, deserialize, serialize_error
from ..task_spec import TaskSpec
from ..task_status import TaskStatus
from .outbox import Outbox
from .reference_counter import ReferenceCounter
from .task_events import TaskEventBuffer

# The states an owner's task goes through (RUNNING is the executor's).
OWNER_STATES = (TaskStatus.PENDING_ARGS_AVAIL, TaskStatus.PENDING_NODE_ASSIGNMENT,
                TaskStatus.SUBMITTED_TO_WORKER, TaskStatus.FINISHED, TaskStatus.FAILED)
_UNFINISHED_STATES = frozenset({TaskStatus.PENDING_ARGS_AVAIL, TaskStatus.PENDING_NODE_ASSIGNMENT,
                                TaskStatus.SUBMITTED_TO_WORKER})


@dataclass
class PendingTask:
    spec: TaskSpec
    retries_left: int  # -1: unlimited
    arg_refs: tuple  # oids whose submitted count this task holds
    state: TaskStatus = TaskStatus.PENDING_ARGS_AVAIL
    cancelled: bool = False  # cancel() was called: never retried
    pushed_to: str | None = None  # the worker running it (normal tasks, while submitted)
    oom_retries: int = 0  # runs the memory monitor killed (their budget is task_oom_retries)
    # In lineage: the owned arguments it pins (``RefEntry.lineage``)
    # so that a re-run can re-create them in turn.
    lineage_pins: tuple = ()
    # An actor call: the incarnation of its actor that holds a copy of it
    # and has not answered (None: no copy is out, or the actor answered, or
    # the process it went to is gone). Such an actor may still run the call
    # and borrow the refs in its arguments (``actor_task_submitter``).
    unanswered_incarnation: int | None = None

    @property
    def done(self) -> bool:
        return self.state in (TaskStatus.FINISHED, TaskStatus.FAILED)


@dataclass(frozen=True)
class PendingTaskSummary:
    task_id: str  # hex
    name: str
    attempt: int
    actor_id: str | None
    seq: int
    pushed_to: str | None  # the worker running it, if it was pushed
    state: TaskStatus


@dataclass(frozen=True)
class TaskManagerStatistics:
    pending: tuple  # PendingTaskSummary, by task id
    lineage: int  # finished tasks kept to re-create lost results


def spend_retry(task: PendingTask) -> None:
    """One more attempt of ``task``, out of its budget (-1: unlimited): its
    spec is replaced by one an attempt on (read ``task.spec`` again)."""
    if task.retries_left > 0:
        task.retries_left -= 1
    next_attempt(task)


def next_attempt(task: PendingTask) -> None:
    """``task``'s spec, one attempt on (a retry outside the retry budget:
    a run killed for memory)."""
    task.spec = task.spec.replace(attempt=task.spec.attempt + 1)


class TaskManager:
    def __init__(self, *, name: str, references: ReferenceCounter, outbox: Outbox,
                 tracer, config, events: TaskEventBuffer | None = None) -> None:
        self._name = name
        # Every state a task enters is recorded here too (the state API's
        # source; None or disabled: not recorded).
        self._events = events if events is not None and events.enabled else None
        self._references = references
        self._outbox = outbox
        self._tracer = tracer
        self._config = config
        # Pending tasks: bounded by what the program submits and has not
        # collected (each holds its arguments; results go as they finish).
        self.tasks: dict[TaskID, PendingTask] = {}
        # Finished tasks whose results live in node stores, kept while any of
        # their results is referenced: what re-creates a lost result. In
        # insertion order, at most lineage_tasks_max (the oldest go first).
        self.lineage: dict[TaskID, PendingTask] = {}
        self.lineage_evicted = 0
        # args_to_release(task) -> the argument holds to release now, for an
        # actor call that fails while its actor may still run it: the actor
        # submitter keeps the others until the call settles there (None:
        # every hold goes at once).
        self.args_to_release = None

    def statistics(self) -> TaskManagerStatistics:
        pending = tuple(
            PendingTaskSummary(task_id.hex(), task.spec.name, task.spec.attempt,
                               task.spec.actor_id, task.spec.seq, task.pushed_to, task.state)
            for task_id, task in sorted(self.tasks.items(), key=lambda kv: kv[0].hex()))
        return TaskManagerStatistics(pending=pending, lineage=len(self.lineage))

    def validate_state(self) -> None:
        # Simtest runs this after every simulated step of the owner: each
        # pending task is first tested by one expression that holds exactly
        # when the asserts of _validate_task do; one that fails it goes
        # through them, which say what broke.
        held: list = []
        for task_id, task in self.tasks.items():
            state = task.state
            if state not in _UNFINISHED_STATES or task_id.binary() != task.spec.task_id \
                    or task.retries_left < -1 or (task.pushed_to is not None and (
                        state != TaskStatus.SUBMITTED_TO_WORKER or task.spec.actor_id is not None)):
                self._validate_task(task_id, task)
            held += task.arg_refs
        for oid, count in Counter(held).items():  # (counted in C)
            entry = self._references.refs.get(oid)
            assert entry is not None, f"a pending task holds {oid.hex()}, which is not referenced"
            # Actor creations and reconstructions hold arguments too.
            assert entry.submitted >= count, (oid, entry.submitted, count)
        assert len(self.lineage) <= self._config.lineage_tasks_max, len(self.lineage)
        pins: dict = {}
        for task in self.lineage.values():
            for oid in task.lineage_pins:
                pins[oid] = pins.get(oid, 0) + 1
        # Every ref's lineage count is its pins: a pinned ref's is its pin
        # count, any other's is 0 (tested without a lookup per ref).
        refs = self._references.refs
        for oid, count in pins.items():
            entry = refs.get(oid)
            if entry is not None:
                assert entry.lineage == count, (oid, entry.lineage, count)
        for oid, entry in refs.items():
            if entry.lineage:
                assert oid in pins, (oid, entry.lineage, 0)
        for task in self.lineage.values():
            assert task.done, task.spec.name
            assert task.spec.actor_id is None, task.spec.name
            return_ids = task.spec.return_ids
            if len(return_ids) == 1 and ObjectID(return_ids[0]) in refs:
                continue  # the common case, without a generator
            assert any(ObjectID(oid) in refs for oid in return_ids), \
                f"lineage of {task.spec.name} kept, but none of its results is referenced"

    @staticmethod
    def _validate_task(task_id: TaskID, task: PendingTask) -> None:
        assert not task.done, task.spec.name
        assert task.state in OWNER_STATES, (task.spec.name, task.state)
        assert task_id.binary() == task.spec.task_id, task.spec.name
        # Only a normal task in a worker's hands says which worker.
        if task.pushed_to is not None:
            assert task.state == TaskStatus.SUBMITTED_TO_WORKER, (task.spec.name, task.state)
            assert task.spec.actor_id is None, task.spec.name
        assert task.retries_left >= -1, (task.spec.name, task.retries_left)

    def add(self, task: PendingTask) -> None:
        self.tasks[TaskID(task.spec.task_id)] = task
        if self._events is not None:
            self._events.task_state(task.spec, task.state, info=True)

    def get(self, task_id: TaskID) -> PendingTask | None:
        return self.tasks.get(task_id)

    def is_pending(self, task_id: TaskID) -> bool:
        return task_id in self.tasks

    def forget_lineage(self, task_id: TaskID) -> None:
        task = self.lineage.get(task_id)
        if task is not None and not any(ObjectID(oid) in self._references.refs
                                        for oid in task.spec.return_ids):
            del self.lineage[task_id]
            self._unpin(task)

    def _unpin(self, task: PendingTask) -> None:
        """A task leaves the lineage: its arguments are no longer needed to
        re-create its results (each may go now, and its own lineage with it)."""
        pins, task.lineage_pins = task.lineage_pins, ()
        for oid in pins:
            entry = self._references.refs.get(oid)
            if entry is not None:
                entry.lineage -= 1
                self._references.maybe_release(oid, entry)

    @staticmethod
    def should_retry_exception(task: PendingTask, results: list) -> bool:
        policy = task.spec.retry_exceptions
        if not policy or task.retries_left == 0:
            return False
        if policy is True:
            return True
        try:
            error = deserialize(results[0].error)
        except Exception:
            return False
        cause = getattr(error, "cause", None)
        return isinstance(cause, tuple(policy))

    def set_state(self, task: PendingTask, state: TaskStatus) -> None:
        assert not task.done, (task.spec.name, task.state, state)
        assert state in _UNFINISHED_STATES, state
        task.state = state
        if self._events is not None:
            self._events.task_state(task.spec, state)

    def complete(self, task: PendingTask, results: list) -> None:
        """The task ran: record one TaskResult per return (a FailedResult
        where it raised)."""
        self._finish(task, results)

    def fail(self, task: PendingTask, error: BaseException | SerializedObject) -> None:
        """The task ended without results: every return raises ``error``."""
        cause = error
        if not isinstance(error, SerializedObject):
            error = serialize_error(error)
        elif self._events is not None and not task.done:
            try:  # (only to say why it failed; failures are the rare path)
                cause = deserialize(error)
            except Exception:  # noqa: BLE001 - an error that cannot be read back
                cause = None
        self._finish(task, [FailedResult(error)] * task.spec.num_returns, cause)

    def _finish(self, task: PendingTask, results: list,
                cause: BaseException | None = None) -> None:
        if task.done:
            return
        task.pushed_to = None
        task.state = TaskStatus.FAILED \
            if any(isinstance(result, FailedResult) for result in results) else TaskStatus.FINISHED
        spec = task.spec
        task_id = TaskID(spec.task_id)
        self.tasks.pop(task_id, None)
        earlier = self.lineage.get(task_id)
        if earlier is not None and earlier is not task:
            # A re-run (object_recovery) ends: its lineage counts its
            # attempts on from its last, as the re-run counted on from the
            # lineage's.
            earlier.spec = spec
        references = self._references
        if spec.actor_id is None and any(isinstance(result, StoredResult) for result in results):
            self._keep_lineage(task_id, task)
        for oid_bytes, result in zip(spec.return_ids, results, strict=True):
            oid = ObjectID(oid_bytes)
            entry = references.refs.get(oid)
            if entry is None:
                # Nobody holds the result any more; drop what the worker stored.
                if isinstance(result, StoredResult):
                    for _node_id, manager in result.locations:
                        self._outbox.send_later(manager, "free_objects", [oid_bytes])
                    references.balance_contained_borrows(result.contained)
                continue
            if isinstance(result, StoredResult):
                references.set_locations(oid, entry, tuple(result.locations))
                references.adopt_contained(entry, result.contained)
            elif isinstance(result, InlineResult):
                entry.inline = result.value
                references.adopt_contained(entry, result.value.contained)
            else:
                entry.inline = result.error
            references.mark_ready(oid, entry)
            references.maybe_release(oid, entry)
        released = task.arg_refs
        if spec.actor_id is not None and task.state == TaskStatus.FAILED and \
                task.unanswered_incarnation is not None and self.args_to_release is not None:
            released = self.args_to_release(task)
        for oid in released:
            entry = references.refs.get(oid)
            if entry is not None:
                entry.submitted -= 1
                references.maybe_release(oid, entry)
        self.forget_lineage(task_id)
        if self._events is not None:
            if cause is None and task.state == TaskStatus.FAILED:
                cause = _error_of(results)
            self._events.task_state(spec, task.state,
                                    error=cause if isinstance(cause, BaseException) else None)
        self._tracer.record(self._name, "task_finished", task=task_id,
                            ok=task.state == TaskStatus.FINISHED)

    def _keep_lineage(self, task_id: TaskID, task: PendingTask) -> None:
        earlier = self.lineage.pop(task_id, None)  # a re-run: now the newest
        if earlier is not None:
            task.lineage_pins, earlier.lineage_pins = earlier.lineage_pins, ()
        elif not task.lineage_pins:
            # Pinned before the task lets go of its arguments (``_finish``
            # releases them next). Only owned objects: a borrowed one is its
            # owner's to keep or re-create.
            pins = []
            for oid in task.arg_refs:
                entry = self._references.refs.get(oid)
                if entry is not None and entry.owned:
                    entry.lineage += 1
                    pins.append(oid)
            task.lineage_pins = tuple(pins)
        self.lineage[task_id] = task
        while len(self.lineage) > self._config.lineage_tasks_max:
            oldest = next(iter(self.lineage))
            self._unpin(self.lineage.pop(oldest))
            self.lineage_evicted += 1
            self._tracer.record(self._name, "lineage_evicted", task=oldest)


def _error_of(results: list) -> BaseException | None:
    """The error a task's first failed return raises (for its FAILED event:
    the owner holds it even when the worker that ran the task never reports,
    killed before its next flush); None if it cannot be read back."""
    for result in results:
        if isinstance(result, FailedResult):
            try:
                error = deserialize(result.error)
            except Exception:  # noqa: BLE001 - an error that cannot be read back
                return None
            return error if isinstance(error, BaseException) else None
    return None
