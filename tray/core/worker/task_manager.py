"""The owner's table of tasks: pending ones, and the lineage of finished ones.

A task (or actor call) this process submitted is *pending* from
``.remote()`` until its outcome is recorded; its outcome is recorded here,
in ``finish``, whichever path ended it. ``finish`` stores each result in the
reference table (inline values, the locations of stored ones, errors),
wakes getters, and releases the task's hold on its arguments.

A finished normal task whose results live in node stores stays in
``lineage`` for as long as any of its results is referenced: it is what
re-creates a result whose copies were all lost (``object_recovery``)."""

from __future__ import annotations

from dataclasses import dataclass

from ..ids import ObjectID, TaskID
from ..messages import FailedResult, InlineResult, StoredResult
from ..serialization import deserialize
from ..task_spec import TaskSpec
from .outbox import Outbox
from .reference_counter import ReferenceCounter


@dataclass
class PendingTask:
    spec: TaskSpec
    retries_left: int  # -1: unlimited
    arg_refs: list  # oids whose submitted count this task holds
    cancelled: bool = False
    pushed_to: str | None = None  # worker address while running
    done: bool = False


@dataclass(frozen=True)
class PendingTaskSummary:
    task_id: str  # hex
    name: str
    attempt: int
    actor_id: str | None
    seq: int
    pushed_to: str | None  # the worker running it, if it was pushed


@dataclass(frozen=True)
class TaskManagerStatistics:
    pending: tuple  # PendingTaskSummary, by task id
    lineage: int  # finished tasks kept to re-create lost results


def spend_retry(task: PendingTask) -> None:
    """One more attempt of ``task``, out of its budget (-1: unlimited)."""
    if task.retries_left > 0:
        task.retries_left -= 1
    task.spec.attempt += 1


class TaskManager:
    def __init__(self, *, name: str, references: ReferenceCounter, outbox: Outbox,
                 tracer) -> None:
        self._name = name
        self._references = references
        self._outbox = outbox
        self._tracer = tracer
        # Pending tasks: bounded by what the program submits and has not
        # collected (each holds its arguments; results go as they finish).
        self.tasks: dict[TaskID, PendingTask] = {}
        # Finished tasks whose results live in node stores, kept while any of
        # their results is referenced: what re-creates a lost result.
        self.lineage: dict[TaskID, PendingTask] = {}

    def statistics(self) -> TaskManagerStatistics:
        pending = tuple(
            PendingTaskSummary(task_id.hex(), task.spec.name, task.spec.attempt,
                               task.spec.actor_id, task.spec.seq, task.pushed_to)
            for task_id, task in sorted(self.tasks.items(), key=lambda kv: kv[0].hex()))
        return TaskManagerStatistics(pending=pending, lineage=len(self.lineage))

    def validate_state(self) -> None:
        holds: dict = {}
        for task_id, task in self.tasks.items():
            assert not task.done, task.spec.name
            assert task_id.binary() == task.spec.task_id, task.spec.name
            assert task.retries_left >= -1, (task.spec.name, task.retries_left)
            for oid in task.arg_refs:
                holds[oid] = holds.get(oid, 0) + 1
        for oid, count in holds.items():
            entry = self._references.refs.get(oid)
            assert entry is not None, f"a pending task holds {oid.hex()}, which is not referenced"
            # Actor creations and reconstructions hold arguments too.
            assert entry.submitted >= count, (oid, entry.submitted, count)
        for task_id, task in self.lineage.items():
            assert task.done, task.spec.name
            assert task.spec.actor_id is None, task.spec.name
            assert any(ObjectID(oid) in self._references.refs
                       for oid in task.spec.return_ids), \
                f"lineage of {task.spec.name} kept, but none of its results is referenced"

    def add(self, task: PendingTask) -> None:
        self.tasks[TaskID(task.spec.task_id)] = task

    def get(self, task_id: TaskID) -> PendingTask | None:
        return self.tasks.get(task_id)

    def is_pending(self, task_id: TaskID) -> bool:
        return task_id in self.tasks

    def forget_lineage(self, task_id: TaskID) -> None:
        task = self.lineage.get(task_id)
        if task is not None and not any(ObjectID(oid) in self._references.refs
                                        for oid in task.spec.return_ids):
            del self.lineage[task_id]

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

    def finish(self, task: PendingTask, results: list) -> None:
        """Record a task's outcome: one TaskResult per return."""
        if task.done:
            return
        task.done = True
        spec = task.spec
        task_id = TaskID(spec.task_id)
        self.tasks.pop(task_id, None)
        references = self._references
        if spec.actor_id is None and any(isinstance(result, StoredResult) for result in results):
            self.lineage[task_id] = task
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
                entry.locations = list(result.locations)
                references.adopt_contained(entry, result.contained)
            elif isinstance(result, InlineResult):
                entry.inline = result.value
                references.adopt_contained(entry, result.value.contained)
            else:
                entry.inline = result.error
            references.mark_ready(entry)
            references.maybe_release(oid, entry)
        for oid in task.arg_refs:
            entry = references.refs.get(oid)
            if entry is not None:
                entry.submitted -= 1
                references.maybe_release(oid, entry)
        self.forget_lineage(task_id)
        self._tracer.record(self._name, "task_finished", task=task_id,
                            ok=all(not isinstance(result, FailedResult) for result in results))
