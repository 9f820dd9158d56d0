"""The executing side: running a pushed task (or an actor call) in this worker.

A task runs inline in the trio task that received it: its arguments are
fetched (zero-copy from this node's store, pulled from other nodes if need
be) and deserialized, the user's function runs (a blocking ``tray.get``
inside suspends through greenback, so the worker keeps serving its peers),
and each return value is stored — small ones inline in the reply, large
ones in this node's store with the location in the reply.

A task whose stored arguments are not on this node yet lends its CPU back
while it waits for them (as a task blocked in ``get`` does): an argument
lost with a node is made again by a task that needs a CPU, and a node full
of tasks holding theirs while they wait would never give it one (Ray's
raylet resolves arguments before it dispatches a task; this is the same
guarantee from the worker's side).

Before the caller learns of a returned value, it is registered as a
borrower of every ref inside it, so the owners cannot free those objects in
between. Cancellation cancels the running task's trio scope; ``force``
ends the whole worker process."""

from __future__ import annotations

import dataclasses
import inspect
import traceback
from collections import OrderedDict
from dataclasses import dataclass

import greenback
import trio

from ... import exceptions
from ..context import TaskContext, current_task
from ..ids import ObjectID, TaskID
from ..interfaces import ProcessExit
from ..messages import FailedResult, InlineResult, StoredResult, TaskReply
from ..rpc import Endpoint, PeerDisconnected
from ..scheduling import placement_group_of
from ..serialization import KIND_ERROR, SerializedObject, serialize, serialize_error
from ..task_spec import ArgByValue, TaskSpec
from .function_table import FunctionTable
from .object_getter import ObjectGetter
from .reference_counter import ReferenceCounter
from .task_events import TaskAttemptEvents, TaskEventBuffer

# How long a worker that reached a function's max_calls lives on after its
# last reply, so that the reply is out before the process ends.
RETIRE_GRACE_S = 0.05
# Cancels that found no task running here are remembered, this many at most
# (the oldest forgotten first): see ``TaskReceiver._cancelled_early``.
CANCELLED_EARLY_MAX = 1024


@dataclass(frozen=True)
class TaskReceiverStatistics:
    running: int  # tasks and actor calls running here now
    uninterruptible: int  # of those, actor calls a cancel must not interrupt
    cancel_requested: int  # of those, the ones a cancel reached
    cancelled_early: int  # cancels that came before their task (CANCELLED_EARLY_MAX)
    functions_counted: int  # functions with max_calls whose calls are counted here
    retiring: bool  # this worker reached a max_calls and is exiting


class _ArgumentError(Exception):
    """An argument of the task was an error; it propagates unchanged."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(str(error))
        self.error = error


def _split_returns(value, num_returns: int, name: str) -> list:
    if num_returns == 1:
        return [value]
    if num_returns == 0:
        return []
    try:
        values = list(value)
    except TypeError:
        raise ValueError(f"task {name} has num_returns={num_returns} but returned a "
                         f"{type(value).__name__}, which is not a sequence") from None
    if len(values) != num_returns:
        raise ValueError(f"task {name} has num_returns={num_returns} but returned "
                         f"{len(values)} values")
    return values


def _is_cancellation(error: BaseException) -> bool:
    """trio's own cancellation or a process exit (alone or inside a group):
    never the task's error."""
    if isinstance(error, (trio.Cancelled, ProcessExit)):
        return True
    if isinstance(error, BaseExceptionGroup):
        return any(_is_cancellation(inner) for inner in error.exceptions)
    return False


class _Traced(Exception):
    """An exception's traceback as text (what the task events keep of it)."""


def _traced(error: BaseException) -> BaseException:
    text = "".join(traceback.format_exception(type(error), error, error.__traceback__))
    return _Traced(text.rstrip())


def _user_code(function):
    """The code object of the user's function or method that ``function``
    runs (a wrapper of tray's names it in ``_tray_runs``; a class, its
    ``__init__``), or None."""
    function = getattr(function, "_tray_runs", function)
    if isinstance(function, type):
        function = function.__init__
    function = getattr(function, "__func__", function)  # a bound method
    return getattr(function, "__code__", None)


def _from_user_code(tb, code):
    """The traceback from the user's frame (``code``) on: the frames of the
    worker, greenback, trio and asyncio that ran it say nothing to the user
    (Ray's tracebacks start at the user's function too). All of it when the
    user's frame is not there (the error came before the user's code ran)."""
    start = tb
    while start is not None and start.tb_frame.f_code is not code:
        start = start.tb_next
    return tb if start is None or code is None else start


def _task_error(name: str, error: BaseException, function=None) -> SerializedObject:
    if isinstance(error, exceptions.TaskError):
        return serialize_error(error)  # an upstream failure: keep its story
    tb = _from_user_code(error.__traceback__, _user_code(function))
    text = "".join(traceback.format_exception(type(error), error, tb))
    try:
        task_error = exceptions.TaskError(name, text, error).as_instanceof_cause()
    except Exception:  # the user's exception class resists subclassing
        task_error = exceptions.TaskError(name, text, error)
    return serialize_error(task_error)


class TaskReceiver:
    def __init__(self, *, address: str, name: str, endpoint: Endpoint, tracer, store,
                 node_id: str, node_manager_address: str, config, functions: FunctionTable,
                 references: ReferenceCounter, getter: ObjectGetter, before_task,
                 exit_process, cancel_children, events: TaskEventBuffer | None = None,
                 task_cost_s=None) -> None:
        self._address = address
        self._task_cost_s = task_cost_s  # (simulated workers: see ProcessEnv)
        # RUNNING, the run's spans and its end are recorded here (None or
        # disabled: not recorded).
        self._events = events if events is not None and events.enabled else None
        self._name = name
        self._endpoint = endpoint
        self._tracer = tracer
        self._store = store
        self._node_id = node_id
        self._node_manager_address = node_manager_address
        self._config = config
        self._functions = functions
        self._references = references
        self._getter = getter
        # Backend hooks: await before_task(ids, spec) before the function is
        # loaded (the runtime_env, CUDA_VISIBLE_DEVICES and OMP_NUM_THREADS
        # in a real process); exit_process() ends it.
        self._before_task = before_task
        self._exit_process = exit_process
        # cancel_children(task_id, force): cancel the tasks this one submitted.
        self._cancel_children = cancel_children
        # task id -> scope of the task running it: at most one per trio task
        # running user code (one, or max_concurrency for an actor).
        self.running: dict[bytes, trio.CancelScope] = {}
        # The running actor calls that a cancel must not interrupt (Ray's
        # rule: a regular or threaded actor's method runs on, as the actor's
        # state would be left half-changed; an async actor's method is an
        # asyncio task, cancelled as asyncio cancels). A subset of running.
        self._uninterruptible: set[bytes] = set()
        # The running ones a cancel reached: the code may ask
        # (``get_runtime_context().is_canceled()``, Ray's flag). A subset of
        # running.
        self._cancel_requested: set[bytes] = set()
        # Tasks cancelled (force=False) before they began here. A push and
        # the cancel that follows it may arrive together, and the cancel be
        # handled while the push is still on its way into ``running``
        # (simtest default seeds 1278, 2649: a retry or a child ran although
        # the cancel had reached its worker). Such a task never starts, as
        # Ray's executor drops a queued task that is cancelled; a cancelled
        # task is never run again by its owner, so a stale entry (its task
        # ended here before the cancel came) starts nothing it should not.
        self._cancelled_early: OrderedDict[bytes, None] = OrderedDict()
        # max_calls: calls run per function id (one entry per distinct
        # function with max_calls: bounded by the program's code), and
        # whether this worker is exiting for having reached one.
        self._calls: dict[str, int] = {}
        self._retiring = False

    def statistics(self) -> TaskReceiverStatistics:
        return TaskReceiverStatistics(
            running=len(self.running), uninterruptible=len(self._uninterruptible),
            cancel_requested=len(self._cancel_requested),
            cancelled_early=len(self._cancelled_early), functions_counted=len(self._calls),
            retiring=self._retiring)

    def validate_state(self) -> None:
        """The cancels against the running tasks, and the bounds: O(cancels
        requested + the fewer of running tasks and early cancels). (The uninterruptible calls are
        not checked against ``running``: an earlier attempt of a re-sent
        actor call may mark itself after a later one ended and left the
        table, so that is no invariant.)"""
        running = self.running
        for task_id in self._cancel_requested:
            # (A cancel is noted only for a running task, and leaves with it.)
            assert task_id in running, task_id.hex()
        early = self._cancelled_early
        if early:
            assert len(early) <= CANCELLED_EARLY_MAX, len(early)
            # (A task that starts takes its early cancel; a cancel of a
            # running one is requested instead.)
            assert running.keys().isdisjoint(early.keys()), \
                sorted(task_id.hex() for task_id in running if task_id in early)
        for function_id, calls in self._calls.items():
            assert calls > 0, function_id

    async def handle_push_task(self, conn, spec: TaskSpec, gpu_ids: list) -> TaskReply:
        if self._retiring:
            # This worker ran its last call under max_calls and is about to
            # exit; it runs nothing more (the owner retries the task elsewhere).
            self._exit_process()
            await trio.sleep_forever()
        context = TaskContext(TaskID(spec.task_id), gpu_ids=gpu_ids, name=spec.name,
                              job_id=spec.job_id, namespace=spec.namespace,
                              placement_group=placement_group_of(spec.strategy),
                              attempt=spec.attempt, depth=spec.depth)
        loaded: list = []

        async def load():
            loaded.append(await self._functions.load(spec.function_id))
            return loaded[0]

        reply = await self.execute(spec, context, load)
        max_calls = getattr(loaded[0], "__tray_max_calls__", 0) if loaded else 0
        if max_calls and self._count_call(spec, max_calls):
            # The owner returns the lease rather than push another task
            # here (CI: a queue of max_calls tasks, each reaching a worker
            # that was exiting, spent its retries).
            reply = dataclasses.replace(reply, worker_exiting=True)
        return reply

    def _count_call(self, spec: TaskSpec, max_calls: int) -> bool:
        """``@tray.remote(max_calls=N)``: after its N-th call of that
        function, this worker exits (releasing its resources), as Ray's does.
        It exits a short grace period after replying, so that the reply gets
        out first. True when this call made it retire."""
        calls = self._calls.get(spec.function_id, 0) + 1
        self._calls[spec.function_id] = calls
        if calls >= max_calls and not self._retiring and self._exit_process is not None:
            self._retiring = True
            self._tracer.record(self._name, "max_calls_reached", task=spec.task_id,
                                calls=calls)

            async def retire() -> None:
                await trio.sleep(RETIRE_GRACE_S)
                self._exit_process()

            self._endpoint.nursery.start_soon(retire)
            return True
        return False

    def handle_exit_if_idle(self, conn) -> bool:
        """May this idle worker be reaped? Not while it owns objects (or
        actors) that others may still use: they die with their owner (Ray's
        worker refuses to exit then, CoreWorker::HandleExit), nor while a
        task runs here. Its node kills it when it says yes."""
        return not self.running and not any(entry.owned
                                            for entry in self._references.refs.values())

    async def handle_cancel_task(self, conn, task_id: bytes, force: bool, recursive: bool) -> None:
        if recursive:
            await self._cancel_children(task_id, force)
        if force:
            self._tracer.record(self._name, "force_exit", task=task_id)
            self._exit_process()
            return
        scope = self.running.get(task_id)
        if scope is not None:
            self._cancel_requested.add(task_id)
            if task_id not in self._uninterruptible:
                scope.cancel()
            return
        self._cancelled_early[task_id] = None
        while len(self._cancelled_early) > CANCELLED_EARLY_MAX:
            self._cancelled_early.popitem(last=False)

    def is_cancel_requested(self, task_id: bytes) -> bool:
        """Has a cancel reached the running task or actor call ``task_id``?
        (Read from any thread: a threaded actor's method asks from its own.)"""
        return task_id in self._cancel_requested

    def _args_here(self, spec: TaskSpec) -> bool:
        """Are the task's stored arguments in this node's store already?"""
        return all(self._store.contains(arg.object_id) for arg in spec.ref_args())

    async def _resolve_args(self, spec: TaskSpec) -> tuple[list, dict]:
        async def value_of(arg):
            if isinstance(arg, ArgByValue):
                serialized = arg.value
            else:
                serialized = await self._getter.fetch(ObjectID(arg.object_id), arg.owner)
            value = await self._references.deserialize(serialized)
            if serialized.kind == KIND_ERROR:
                raise _ArgumentError(value)
            return value

        args = [await value_of(arg) for arg in spec.args]
        kwargs = {key: await value_of(arg) for key, arg in spec.kwargs.items()}
        return args, kwargs

    async def execute(self, spec: TaskSpec, context: TaskContext, load) -> TaskReply:
        """Run a task or actor call: its results, and whether it raised."""
        events = self._events
        if events is None:
            return await self._execute(spec, context, load, None)
        # The record of this attempt (None: the buffer is full), and the
        # spans of the run, handed over once at its end.
        record = events.started(spec, context.actor_id.hex()
                                if context.actor_id is not None else None)
        return await self._execute(spec, context, load, record)

    async def _execute(self, spec: TaskSpec, context: TaskContext, load,
                       record: TaskAttemptEvents | None) -> TaskReply:
        spans = [] if record is not None else None
        current_task.set(context)
        if spec.task_id in self._cancelled_early:
            del self._cancelled_early[spec.task_id]
            error = exceptions.TaskCancelledError(f"task {spec.name} ({spec.task_id.hex()}) "
                                                  "was cancelled before it started")
            if record is not None:
                self._events.ended(record, spans, error)
            return TaskReply(self._error_results(spec, serialize_error(error)))
        self._tracer.record(self._name, "task_started", task=spec.task_id, name=spec.name,
                            attempt=spec.attempt)
        function = None
        with trio.CancelScope() as scope:
            self.running[spec.task_id] = scope
            try:
                if self._before_task is not None:
                    await self._before_task(context.gpu_ids, spec)
                function = await load()
                if spec.actor_id is not None and \
                        not getattr(function, "_tray_cancellable", False):
                    self._uninterruptible.add(spec.task_id)
                waits = not self._args_here(spec)
                if waits:  # (for a pull, or for a lost argument to be made again)
                    self._getter.lend_cpu(True)
                fetch_start = trio.current_time()
                try:
                    args, kwargs = await self._resolve_args(spec)
                finally:
                    if waits:
                        self._getter.lend_cpu(False)
                run_start = trio.current_time()
                if spans is not None and (spec.args or spec.kwargs):
                    spans.append(("task:fetch_args", fetch_start, run_start))
                try:
                    # A greenback portal for the user's code only (a blocking
                    # tray.get inside suspends through it): one set up for the
                    # whole trio task, as before, taxed each of its later steps
                    # too (~9% of the simulator's CPU per task); an actor's
                    # executor task has its own, which these reuse.
                    if getattr(function, "_tray_no_portal", False):
                        # (A method that runs in a thread of its own, or as an
                        # asyncio task with a portal of its own, never blocks
                        # this task: no portal here.)
                        value = await function(*args, **kwargs)
                    elif inspect.iscoroutinefunction(function):
                        value = await greenback.with_portal_run(function, *args, **kwargs)
                    else:
                        value = await greenback.with_portal_run_sync(function, *args, **kwargs)
                    if self._task_cost_s is not None:
                        await trio.sleep(self._task_cost_s(spec))
                finally:
                    if spans is not None:
                        spans.append(("task:execute", run_start, trio.current_time()))
                values = _split_returns(value, spec.num_returns, spec.name)
            except _ArgumentError as failure:
                if record is not None:
                    self._events.ended(record, spans, failure.error)
                return TaskReply(self._error_results(spec, serialize_error(failure.error)))
            except Exception as error:
                if record is not None:
                    self._events.ended(record, spans, _traced(error), "TASK_EXECUTION_EXCEPTION")
                return TaskReply(self._error_results(spec, _task_error(spec.name, error,
                                                                       function)), True)
            except BaseException as error:
                return await self._base_exception_reply(spec, error)
            finally:
                # Another attempt of the task may run here too (its owner
                # re-pushed it after a reset cut the first one off): it owns
                # the entry then (simtest chaos seed 160).
                if self.running.get(spec.task_id) is scope:
                    del self.running[spec.task_id]
                    self._uninterruptible.discard(spec.task_id)
                    self._cancel_requested.discard(spec.task_id)
        if scope.cancelled_caught:
            error = exceptions.TaskCancelledError(f"task {spec.name} ({spec.task_id.hex()}) "
                                                  "was cancelled")
            if record is not None:
                self._events.ended(record, spans, error)
            return TaskReply(self._error_results(spec, serialize_error(error)))
        store_start = trio.current_time()
        try:
            results = [await self._store_result(ObjectID(oid), value, spec.caller)
                       for oid, value in zip(spec.return_ids, values, strict=True)]
        except Exception as error:
            if record is not None:
                self._events.ended(record, spans, _traced(error), "TASK_EXECUTION_EXCEPTION")
            return TaskReply(self._error_results(spec, _task_error(spec.name, error)), True)
        if record is not None:
            spans.append(("task:store_outputs", store_start, trio.current_time()))
            self._events.ended(record, spans)
        self._tracer.record(self._name, "task_done", task=spec.task_id)
        return TaskReply(results)

    async def _base_exception_reply(self, spec: TaskSpec, error: BaseException) -> TaskReply:
        """User code raised a BaseException that is not an Exception. Ray's
        rules: ``KeyboardInterrupt`` cancels the task (``TaskCancelledError``,
        no retry); ``SystemExit`` in a task ends the worker process, so the
        owner sees a worker death and retries the task within ``max_retries``
        (``WorkerCrashedError`` after that); any other (a user's
        ``BaseException`` subclass) is an application error, like an
        ``Exception``. trio's cancellation passes through, and so does an
        actor method's ``SystemExit``: an actor's exit is its lifecycle's
        business (``exit_actor``), not a call's result."""
        if _is_cancellation(error) or (isinstance(error, SystemExit)
                                       and spec.actor_id is not None):
            raise error
        if isinstance(error, KeyboardInterrupt):
            cancelled = exceptions.TaskCancelledError(
                f"task {spec.name} ({spec.task_id.hex()}) was cancelled: it raised "
                "KeyboardInterrupt")
            return TaskReply(self._error_results(spec, serialize_error(cancelled)))
        if isinstance(error, SystemExit) and self._exit_process is not None:
            self._tracer.record(self._name, "system_exit", task=spec.task_id)
            self._exit_process()
            await trio.sleep_forever()  # the process is ending under us
        return TaskReply(self._error_results(spec, _task_error(spec.name, error)), True)

    def _error_results(self, spec: TaskSpec, serialized: SerializedObject) -> list:
        self._tracer.record(self._name, "task_failed", task=spec.task_id)
        return [FailedResult(serialized)] * spec.num_returns

    async def _store_result(self, object_id: ObjectID, value, caller: str):
        serialized = serialize(value)
        # The caller becomes a borrower of every ref inside the value before
        # it learns of it, so the owners cannot free them in between.
        for oid_bytes, owner in serialized.contained:
            if owner == caller:
                continue
            if owner == self._address:
                self._references.handle_add_borrower(None, oid_bytes, caller)
            else:
                try:  # (reliable: see ReferenceCounter._register_borrows)
                    await self._endpoint.call_reliable(owner, "add_borrower_oneway", oid_bytes,
                                                       caller)
                except PeerDisconnected:
                    pass
        if serialized.size_bytes() <= self._config.inline_object_max_bytes:
            return InlineResult(serialized)
        self._store.put(object_id.binary(), serialized.data, serialized.buffers, owner=caller)
        return StoredResult([(self._node_id, self._node_manager_address)], serialized.contained)
