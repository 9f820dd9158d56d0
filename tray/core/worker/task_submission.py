"""Starting tasks and actor calls: from a ``.remote()`` call to a pending task.

``submit_task`` builds a task's spec in the caller's thread — its id (a
child of the running task), its arguments packed (``task_args``), its
return ids — and hands back its refs at once. The rest happens on the loop
(``_start_task``): the task is registered with the task manager, its
arguments are held, the caller's refs are counted, and its submitter takes
it: the normal task submitter (queued in its class with no trio task of its
own when there is nothing to upload or wait for), or the actor task
submitter (sent at once in call order when it can be). From the local
driver's script, whose loop runs in another thread, that rest is queued
for the loop through the thread inbox without waiting; actor calls a burst
queued are then started one per scheduling step (``_send_queued_calls``),
so they reach their actors in call order. ``prepare_actor`` builds an
actor's spec (its creation task's arguments held likewise).

State: the actor calls a user's thread queued that wait for the sender
(``_queued_calls``), and whether the sender runs."""

from __future__ import annotations

import collections
import logging
from dataclasses import dataclass

import trio

from ..context import TaskContext
from ..ids import ActorID, ObjectID, TaskID
from ..messages import ActorSpec
from ..object_ref import ObjectRef
from ..scheduling import DefaultStrategy, PlacementGroupStrategy, Strategy
from ..serialization import serialize_error
from ..task_spec import TaskSpec
from .actor_task_submitter import ActorTaskSubmitter
from .function_table import FunctionTable
from .loop_bridge import LoopBridge
from .normal_task_submitter import NormalTaskSubmitter
from .reference_counter import ReferenceCounter
from .task_args import TaskArgs
from .task_manager import PendingTask, TaskManager
from .thread_inbox import ThreadInbox

logger = logging.getLogger("tray.worker")


@dataclass(frozen=True)
class TaskSubmissionStatistics:
    calls_queued: int  # actor calls a user's thread queued, not started yet
    sending_calls: bool  # the sender of queued calls runs


def captured(context: TaskContext, strategy: Strategy) -> Strategy:
    """A task or actor created without a strategy inside a placement group
    that captures its children goes into that group (any bundle), as in Ray."""
    group = context.placement_group
    if isinstance(strategy, DefaultStrategy) and group is not None and \
            group.capture_child_tasks:
        return PlacementGroupStrategy(group.placement_group_id, bundle_index=-1,
                                      capture_child_tasks=True)
    return strategy


class TaskSubmission:
    def __init__(self, *, address: str, name: str, worker, tracer, bridge: LoopBridge,
                 inbox: ThreadInbox, references: ReferenceCounter, task_manager: TaskManager,
                 functions: FunctionTable, args: TaskArgs,
                 normal_submitter: NormalTaskSubmitter, actor_submitter: ActorTaskSubmitter,
                 current_context, current_job, next_child_id, queues_from_thread) -> None:
        self._address = address
        self._name = name
        self._worker = worker  # the core worker, which the refs made here count in
        self._tracer = tracer
        self._bridge = bridge
        self._inbox = inbox
        self._references = references
        self._task_manager = task_manager
        self._functions = functions
        self._args = args
        self._normal_submitter = normal_submitter
        self._actor_submitter = actor_submitter
        # The core worker's: the running task's context, its job, a new
        # child task id (under its ids lock), and whether the caller is a
        # user's thread whose work is queued for the loop.
        self._current_context = current_context
        self._current_job = current_job
        self._next_child_id = next_child_id
        self._queues_from_thread = queues_from_thread
        self._queued_calls: collections.deque = collections.deque()  # (task, actor) to start
        self._sending_calls = False  # _send_queued_calls runs

    def statistics(self) -> TaskSubmissionStatistics:
        return TaskSubmissionStatistics(calls_queued=len(self._queued_calls),
                                        sending_calls=self._sending_calls)

    def validate_state(self) -> None:
        if self._queued_calls:
            # Calls are queued only behind a running sender, which runs
            # until the queue is empty.
            assert self._sending_calls, len(self._queued_calls)

    def submit_task(self, *, name: str, function_id: str, args: tuple, kwargs: dict,
                    num_returns: int, resources: dict, strategy: Strategy, max_retries: int,
                    retry_exceptions, actor_id: str | None = None, method: str | None = None,
                    max_task_retries: int = 0, max_pending_calls: int = -1,
                    concurrency_group: str = "",
                    actor_ref: ObjectRef | None = None,
                    runtime_env: dict | None = None,
                    export: tuple | None = None, run_on_loop=None) -> list[ObjectRef]:
        """Build a task (``export``: its function's (id, blob)) and start
        submitting it; returns its refs at once.

        On the loop it all happens here. From a user's thread
        (``queues_from_thread``) the caller's side builds the spec — ids,
        arguments packed, serialization errors raised here — and queues the
        rest for the loop without waiting; only when the rest can fail in a
        way the caller must see (large arguments: the node's store can be
        full; a call to an actor with ``max_pending_calls``) does it run the
        rest through ``run_on_loop(fn, *args)``, which waits."""
        queued = self._queues_from_thread()
        context = self._current_context()
        if actor_id is None:
            strategy = captured(context, strategy)
        packed_args, packed_kwargs, holds, stores = self._args.pack(args, kwargs, name,
                                                                    context)
        task_id = self._next_child_id(context)
        if actor_ref is not None:
            # The call keeps its actor alive until it finishes (the actor's
            # handle reference, as an argument would be).
            holds.append((actor_ref.object_id(), actor_ref._owner))
        return_ids = [ObjectID.for_return(task_id, i + 1) for i in range(num_returns)]
        spec = TaskSpec(task_id=task_id.binary(), job_id=self._current_job(),
                        namespace=context.namespace,
                        name=name, function_id=function_id, args=packed_args,
                        kwargs=packed_kwargs, num_returns=num_returns,
                        return_ids=tuple([oid.binary() for oid in return_ids]),
                        caller=self._address,
                        resources=resources, strategy=strategy, max_retries=max_retries,
                        retry_exceptions=retry_exceptions, parent_task_id=context.task_id.binary(),
                        depth=context.depth + 1, runtime_env=runtime_env, actor_id=actor_id,
                        method=method if actor_id is not None else None,
                        concurrency_group=concurrency_group if actor_id is not None else "")
        retries = max_task_retries if actor_id is not None else max_retries
        # The caller's refs: their local references are counted by
        # _start_task, on the loop, before any count-down they may queue.
        refs = [ObjectRef.counted_by_caller(oid, self._address, self._worker)
                for oid in return_ids]
        start = (spec, return_ids, retries, holds, stores, export, max_pending_calls)
        if not queued:
            self._start_task(*start)
        elif stores or (actor_id is not None and max_pending_calls >= 0):
            run_on_loop(self._start_task, *start)
        else:
            self._inbox.put(self._start_queued_task, start)
        return refs

    def _start_task(self, spec: TaskSpec, return_ids: list, retries: int, holds: list,
                    stores: list, export: tuple | None, max_pending_calls: int,
                    queued: bool = False) -> None:
        """On the loop: register the task, hold its arguments, count the
        caller's refs (``return_ids``: the ObjectIDs its refs hold, shared
        with the owner's entries rather than made again), and start its
        submitter."""
        actor = None
        if spec.actor_id is not None:
            actor = self._actor_submitter.actor_state(spec.actor_id)
            self._actor_submitter.check_pending_calls(actor, max_pending_calls)
        if export is not None:
            self._functions.export(*export)
        held = self._args.hold(holds, stores)
        if actor is not None:
            spec = spec.replace(seq=self._actor_submitter.next_call(actor))
        task = PendingTask(spec, retries, held)
        self._task_manager.add(task)
        for oid in return_ids:
            self._references.add_local_ref(oid, self._address)
        self._tracer.record(self._name, "task_submitted", task=TaskID(spec.task_id),
                            name=spec.name)
        if actor is not None and not self._sending_calls and \
                self._actor_submitter.send_now(task, actor):
            pass  # sent now, in call order; its reply ends it
        elif actor is not None and queued and self._sending_calls:
            self._queued_calls.append((task, actor))
        elif actor is not None and queued:
            # The first of a burst starts at once (a lone sync call waits for
            # nothing more); the sender starts the rest after it.
            self._sending_calls = True
            self._bridge.spawn(self._actor_submitter.submit, task, actor)
            self._bridge.spawn(self._send_queued_calls)
        elif actor is not None:
            self._bridge.spawn(self._actor_submitter.submit, task, actor)
        elif self._functions.export_done(spec.function_id) and not spec.ref_args():
            # Nothing to upload or wait for: queued now, with no trio task
            # of its own (a burst of 1,000 ``.remote()`` started 1,000).
            self._normal_submitter.enqueue(task)
        else:
            self._bridge.spawn(self._normal_submitter.submit, task)

    async def _send_queued_calls(self) -> None:
        """Start the actor calls a user's thread queued, one per scheduling
        step, so they reach their actors in call order. Started together
        from one batch, trio runs them in reverse order half the time (it
        reverses each batch of runnable tasks on purpose), and the actor
        then holds the whole burst until its first call arrives: measured,
        1:1 actor calls async at half the rate of one call per crossing."""
        calls = self._queued_calls
        try:
            while True:
                await trio.lowlevel.checkpoint()  # the call started last runs before the next
                if not calls:
                    return
                task, actor = calls.popleft()
                self._bridge.start_soon(self._actor_submitter.submit, task, actor)
        finally:
            self._sending_calls = False

    def _start_queued_task(self, start: tuple) -> None:
        """``_start_task`` for a task a user's thread queued. Its caller has
        its refs already: whatever fails here (nothing should) becomes
        their error, as a failure found after ``.remote()`` returned does."""
        spec = start[0]
        try:
            self._start_task(*start, queued=True)
        except Exception as error:  # noqa: BLE001 - reported through the task's refs
            logger.exception("tray: starting the task %s failed", spec.name)
            failure = serialize_error(error)
            for oid_bytes in spec.return_ids:
                oid = ObjectID(oid_bytes)
                if oid not in self._references.refs:
                    self._references.add_local_ref(oid, self._address)
                    entry = self._references.refs[oid]
                    self._references.store_value(oid, entry, failure)

    def prepare_actor(self, *, class_name: str, function_id: str, args: tuple, kwargs: dict,
                      resources: dict, strategy: Strategy, options: dict, namespace: str,
                      method_meta: dict, is_async: bool,
                      runtime_env: dict | None = None) -> tuple[ActorSpec, list]:
        """The actor's spec, and the argument refs its creation holds."""
        context = self._current_context()
        strategy = captured(context, strategy)
        task_id = self._next_child_id(context)
        actor_id = ActorID.of_creation_task(task_id)
        packed_args, packed_kwargs, holds, stores = self._args.pack(
            args, kwargs, f"{class_name}.__init__", context)
        holds = self._args.hold(holds, stores)
        creation = TaskSpec(task_id=task_id.binary(),
                            job_id=self._current_job(), namespace=context.namespace,
                            name=f"{class_name}.__init__", function_id=function_id,
                            args=packed_args, kwargs=packed_kwargs, num_returns=0, return_ids=(),
                            caller=self._address, resources=resources, strategy=strategy,
                            parent_task_id=context.task_id.binary(), depth=context.depth + 1,
                            runtime_env=runtime_env)
        actor = ActorSpec(
            actor_id=actor_id.hex(), class_name=class_name, name=options.get("name"),
            namespace=namespace, get_if_exists=bool(options.get("get_if_exists")),
            owner_address=self._address, detached=options.get("lifetime") == "detached",
            max_restarts=options.get("max_restarts") or 0,
            max_task_retries=options.get("max_task_retries") or 0,
            resources=resources, strategy=strategy, is_async=is_async,
            method_meta=method_meta, creation=creation,
            max_concurrency=options.get("max_concurrency"),
            max_pending_calls=-1 if options.get("max_pending_calls") is None
            else options["max_pending_calls"],
            concurrency_groups=dict(options.get("concurrency_groups") or {}),
            owner_node_id=self._worker.node_id)
        return actor, holds
