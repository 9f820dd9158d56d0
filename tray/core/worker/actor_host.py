"""The hosted actor: at most one per worker process.

The GCS sends ``create_actor`` to a worker it leased for the actor; the
constructor runs like a task. Calls then arrive straight from their callers.
For a plain actor (``max_concurrency=1``) calls from one caller run in the
caller's sequence order: a call that arrives ahead of its turn waits on an
event of its own, so each step wakes exactly the next call
(``CallerQueue``); calls from different callers are not ordered against
each other (Ray's contract), and its methods never interleave.

One executor. A plain actor's calls run in one long-lived task of its
own, one at a time, in the order their turns came (``_admitted``). A call
whose turn it is when it arrives is admitted by the receive loop itself
(``handle_actor_call`` is a plain handler returning an ``rpc.Deferred``),
and the executor sends its reply; a call that must wait for its turn (or
was re-sent) waits in a task of its own, which replies.
A lock taken by each call's task did the same with more work per call: a
hand-off of the lock, and a greenback portal set up in every call's task
(user code may block in ``tray.get``), which then taxes every later step
of that task; the executor sets one up once.

A *concurrent* actor (``max_concurrency > 1``, or an async actor) runs up to
``max_concurrency`` calls at once, and, as Ray's async and threaded actors,
does not keep the callers' order: a call runs as soon as a slot is free.
``concurrency_groups`` split the slots: each group has its own limit, and a
method runs in the group ``@tray.method(concurrency_group=...)`` (or the
call's ``.options(concurrency_group=...)``) names, else in the default group.

An async actor (one with ``async def`` methods) runs them on an **asyncio**
event loop, as Ray's do, so asyncio code (``asyncio.sleep``, asyncio
primitives and libraries) works inside. The loop is trio-asyncio's: asyncio
on top of this worker's trio loop, so in the simulator asyncio time is the
virtual clock and scheduling stays deterministic. Synchronous methods of a
concurrent actor run in a thread pool where the backend gives one
(``ProcessEnv.run_sync_in_thread``: real processes), else inline, one step
at a time (the simulator: they interleave only where they block in tray).

Each caller sends its *floor* with every call (and alone, in
``actor_floor``, when a call ends without running): every call below it is
finished or abandoned. The host skips ahead to the floor (a gap left by a
call that will never come must not block the queue) and drops the replies
it kept below it. Those replies exist so that a call re-sent after a broken
connection gets the first execution's reply instead of running twice.

Limits, per caller: at most ``actor_pending_calls_max`` calls wait for their
turn; one more is refused (``ActorError``), and its turn is skipped when it
comes, so the calls after it still run. At most as many replies are kept;
beyond that the oldest are forgotten (a call re-sent after that would run
again — it takes that many calls outstanding behind one unfinished call).

Exits. An actor ends *gracefully* (no restart, whatever ``max_restarts``)
in three ways, all ending in ``handle_terminate_actor``: ``exit_actor()``
(or ``sys.exit()``) in a method, a ``__ray_terminate__`` call (queued
behind the caller's earlier calls like any call), and its last handle going
out of scope (the GCS asks). The method that exits finishes; its caller
gets ``ActorDiedError``, as in Ray. The host then refuses new calls and
calls still waiting for their turn (``ActorDiedError``), tells the GCS the
actor is dead (``actor_exiting``), and the GCS calls ``terminate_actor``
back: the host waits for the calls already running (a concurrent actor's)
to finish, replies, runs the ``atexit`` handlers where the worker is a
real process, and ends the process. The GCS kills a worker that has not
answered within ``GRACEFUL_EXIT_TIMEOUT_S`` (a method that never returns)."""

from __future__ import annotations

import heapq
import inspect
import logging
from collections import deque
from dataclasses import dataclass, field

import greenback
import trio

from ... import exceptions
from ..context import TaskContext, current_task
from ..ids import ActorID, ObjectID, TaskID
from ..messages import ActorSpec, FailedResult, TaskReply
from ..rpc import Deferred, PeerDisconnected
from ..scheduling import placement_group_of
from ..serialization import SerializedObject
from ..task_spec import TaskSpec
from .function_table import FunctionTable
from .task_receiver import TaskReceiver

logger = logging.getLogger("tray.worker")

# How long an exiting actor's worker lives on after answering the GCS, so
# that its last replies are out before the process ends.
EXIT_GRACE_S = 0.05
# Methods of a concurrent actor kept ready to run (a class's methods times
# its concurrency groups; the bound keeps getattr-made names from growing it).
RUNNABLES_CACHED_MAX = 1024


class ActorExit(SystemExit):
    """Raised by ``exit_actor()`` in a synchronous method: a SystemExit, so
    an ``except Exception`` in user code does not swallow it (as Ray's)."""


class AsyncioActorExit(Exception):
    """Raised by ``exit_actor()`` in an async method (a SystemExit must not
    cross an asyncio loop); Ray's name."""


_BUILTIN_METHODS = ("__ray_ready__", "__ray_terminate__")


@dataclass
class CallerQueue:
    """Executor-side ordering state for one caller of the hosted actor:
    calls that arrived ahead of their turn wait on an event of their own,
    so each step wakes exactly the next call. A call's turn comes when every
    earlier call ran or was given up by the caller (``next_seq``, which the
    caller's floor moves up) and no earlier call that is here still waits:
    after a floor jump the calls it passed still run one by one, in order.

    The earliest waiter and the started calls below a floor are found
    through min-heaps of sequence numbers (``_waiting_order``,
    ``_started_order``), not by scanning: a burst of calls from one caller
    keeps hundreds waiting and started, and a scan per call made a burst
    quadratic (profile, 1:1 actor calls async, 2026-11-23: ~12% of the
    actor's CPU in ``_turn``, ``_wake`` and ``_advance_floor``). The heaps
    are lazy: an entry whose call has left its table is dropped when it
    reaches the top, and a heap is rebuilt when stale entries outnumber
    live ones, so each stays within about twice its table."""
    next_seq: int = 0
    waiters: dict = field(default_factory=dict)  # seq -> trio.Event
    # Calls that arrived here, and their replies, kept until the caller's
    # floor passes them: a call re-sent after a broken connection gets the
    # first one's reply instead of running twice.
    started: dict = field(default_factory=dict)  # seq -> trio.Event (set when done)
    replies: dict = field(default_factory=dict)  # seq -> reply, in the order they finished
    # Calls refused while waiting (the limit): their turns are skipped.
    refused: dict = field(default_factory=dict)  # seq -> None
    _waiting_order: list = field(default_factory=list)  # heap of seqs of waiters
    _started_order: list = field(default_factory=list)  # heap of seqs of started

    def add_waiter(self, seq: int, event: trio.Event) -> None:
        new = seq not in self.waiters
        self.waiters[seq] = event
        if new:
            heapq.heappush(self._waiting_order, seq)
            _compact(self._waiting_order, self.waiters)

    def first_waiter(self) -> int | None:
        """The lowest sequence number that waits for its turn (None: none)."""
        order = self._waiting_order
        while order and order[0] not in self.waiters:
            heapq.heappop(order)
        return order[0] if order else None

    def add_started(self, seq: int, event: trio.Event) -> None:
        new = seq not in self.started
        self.started[seq] = event
        if new:
            heapq.heappush(self._started_order, seq)
            _compact(self._started_order, self.started)

    def forget_below(self, floor: int) -> None:
        """Drop the started calls (and their replies) below ``floor``."""
        order = self._started_order
        while order and order[0] < floor:
            seq = heapq.heappop(order)
            self.started.pop(seq, None)
            self.replies.pop(seq, None)
        if self.refused:
            for seq in [seq for seq in self.refused if seq < floor]:
                del self.refused[seq]


def _compact(order: list, live: dict) -> None:
    """Rebuild a lazy heap once stale entries outnumber the live ones."""
    if len(order) > 2 * len(live) + 64:
        order[:] = sorted(seq for seq in set(order) if seq in live)


class _Call:
    """A plain actor's call handed to its executor: either a task waits on
    ``done`` to reply (``_call_in_task``), or the executor replies through
    ``deferred`` (admitted by ``handle_actor_call``; ``done`` is then the
    caller queue's mark that the call ended)."""
    __slots__ = ("deferred", "done", "error", "queue", "reply", "spec")

    def __init__(self, spec: TaskSpec, queue: CallerQueue | None = None,
                 done: trio.Event | None = None, deferred: Deferred | None = None) -> None:
        self.spec = spec
        self.queue = queue
        self.done = done if done is not None else trio.Event()
        self.deferred = deferred
        self.reply: TaskReply | None = None
        self.error: BaseException | None = None


@dataclass(frozen=True)
class CallerSummary:
    caller: str
    next_seq: int  # the call this caller's queue runs next
    waiting: tuple  # sequence numbers of calls held back until their turn
    replies_kept: int  # for calls that may be re-sent
    refused: int  # calls refused at the limit whose turn has not come


@dataclass(frozen=True)
class ActorHostStatistics:
    actor_id: str | None
    callers: tuple  # CallerSummary, by caller


class ActorHost:
    def __init__(self, *, name: str, worker_id: str, tracer, config,
                 functions: FunctionTable, receiver: TaskReceiver, nursery: trio.Nursery,
                 run_sync_in_thread=None, gcs=None, exit_process=None,
                 asyncio_loops=None, run_exit_handlers=None) -> None:
        self._nursery = nursery
        self._gcs = gcs
        self._exit_process = exit_process
        self._asyncio_loops = asyncio_loops
        self._run_exit_handlers = run_exit_handlers
        # Why the hosted actor is ending (None while it is not); then it
        # takes no new call.
        self.exiting: str | None = None
        # (task id, reason) of the call that asked the actor to exit.
        self._exit_request: tuple | None = None
        self._running = 0  # calls inside the actor now
        self._idle: trio.Event | None = None  # set when _running drops to 0
        self._exited = False  # the process is on its way out
        # run_sync_in_thread(fn, group) -> awaitable result: a backend's thread
        # pool for synchronous methods of concurrent actors (None: inline).
        self._run_sync_in_thread = run_sync_in_thread
        self.asyncio_loop = None
        self._groups: dict[str, trio.Semaphore] = {}
        self.concurrent = False
        self._name = name
        self._worker_id = worker_id
        self._tracer = tracer
        self._config = config
        self._functions = functions
        self._receiver = receiver
        self.actor_id: str | None = None
        self.instance = None
        self.gpu_ids: list = []
        self.placement_group = None  # the strategy, when it lives in a placement group
        self._slots = None  # a concurrent actor's default group's slots
        # (method name, group) -> the method as the receiver runs it, made
        # once per method (as Ray's actor builds its method table once):
        # inspect.iscoroutinefunction and the wrapper cost a few us a call.
        self._runnables: dict[tuple, object] = {}
        # A plain actor's calls whose turn came, in order, and its executor.
        # Not bounded here: each entry is a call in flight from a caller
        # (bounded by the callers' max_pending_calls and the connection's
        # rpc_pending_calls_max), which waited on a lock before, as many.
        self._admitted: deque[_Call] = deque()
        self._executor_started = False
        self._executor_idle: trio.Event | None = None  # set to wake the idle executor
        self.is_async = False
        self.callers: dict[str, CallerQueue] = {}

    def statistics(self) -> ActorHostStatistics:
        return ActorHostStatistics(self.actor_id, tuple(
            CallerSummary(caller, queue.next_seq, tuple(sorted(queue.waiters)),
                          len(queue.replies), len(queue.refused))
            for caller, queue in sorted(self.callers.items())))

    def validate_state(self) -> None:
        if self.callers:
            assert self.instance is not None, "calls queued at a worker that hosts no actor"
        for caller, queue in self.callers.items():
            # A call waits only until its turn comes; then it is woken (the
            # earliest waiter, once due, has its wake-up on the way).
            if queue.waiters:
                first = min(queue.waiters)
                assert first > queue.next_seq or queue.waiters[first].is_set(), \
                    (caller, queue.next_seq, sorted(queue.waiters))
            assert set(queue.replies) <= set(queue.started), caller
            # The lazy heaps hold every live entry (stale ones too, fewer
            # than twice the table's largest size plus 64: _compact).
            assert set(queue.waiters) <= set(queue._waiting_order), caller
            assert set(queue.started) <= set(queue._started_order), caller
            assert len(queue.waiters) <= self._config.actor_pending_calls_max, caller
            assert len(queue.replies) <= self._config.actor_pending_calls_max, caller
            # A refused call's turn is skipped as soon as it comes.
            assert all(seq > queue.next_seq for seq in queue.refused), caller

    async def handle_create_actor(self, conn, actor: ActorSpec, gpu_ids: list,
                                  incarnation: int) -> SerializedObject | None:
        """Instantiate the hosted actor; None on success, else the
        serialized constructor error."""
        spec: TaskSpec = actor.creation
        self.actor_id = actor.actor_id
        self.gpu_ids = gpu_ids
        self.placement_group = placement_group_of(actor.strategy)
        context = TaskContext(TaskID(spec.task_id), ActorID.from_hex(self.actor_id), gpu_ids,
                              name=spec.name, job_id=spec.job_id, namespace=spec.namespace,
                              placement_group=self.placement_group,
                              attempt=incarnation - 1,  # incarnations count from 1
                              depth=spec.depth)
        cls = await self._functions.load(spec.function_id)
        self.is_async = any(inspect.iscoroutinefunction(member) for _, member in
                            inspect.getmembers(cls, inspect.isfunction))
        concurrency = actor.max_concurrency or (
            self._config.default_max_concurrency_async if self.is_async else 1)
        self.concurrent = concurrency > 1 or bool(actor.concurrency_groups)
        self._slots = trio.Semaphore(concurrency) if self.concurrent else None
        self._runnables = {}
        self._groups = {name: trio.Semaphore(limit)
                        for name, limit in sorted(actor.concurrency_groups.items())}
        if self.is_async and self.asyncio_loop is None:
            self.asyncio_loop = await self._nursery.start(_run_asyncio_loop,
                                                          self._asyncio_loops)
        instance_box = []

        async def construct():
            def make(*args, **kwargs):
                instance_box.append(cls(*args, **kwargs))
            make._tray_runs = cls
            return make

        reply = await self._execute_creation(spec, context, construct)
        if isinstance(reply.results[0], FailedResult):
            return reply.results[0].error
        self.instance = instance_box[0]
        self._tracer.record(self._name, "actor_created", actor=self.actor_id,
                            incarnation=incarnation)
        return None

    async def _execute_creation(self, spec: TaskSpec, context: TaskContext, load) -> TaskReply:
        """Run an actor's constructor as a call of one return."""
        spec = spec.replace(num_returns=1, return_ids=(
            ObjectID.for_return(TaskID(spec.task_id), 1).binary(),))
        return await self._receiver.execute(spec, context, load)

    def handle_actor_call(self, conn, spec: TaskSpec) -> Deferred:
        """A call of the hosted actor; its reply comes later (``Deferred``).

        A plain handler, so it runs in the receive loop, in the order the
        calls arrived. The common call, first arrival of a plain actor's call
        whose turn it is, goes straight into the executor's queue, and the
        executor replies when it has run it: two passes of the loop per
        call. A handler task per call that handed the call to the executor
        and waited to reply took four (profile, 1:1 actor calls, 2026-11-28).
        Every other call (a concurrent actor's, one that waits for its turn,
        a re-sent one) finishes in a task of its own (``_call_in_task``)."""
        if self.instance is None:
            raise exceptions.ActorDiedError(f"no actor lives in worker {self._worker_id}")
        if self.exiting is not None:
            raise self._exiting_error(spec)
        queue = self.callers.get(spec.caller)
        if queue is None:
            queue = self.callers[spec.caller] = CallerQueue()
        self._advance_floor(queue, spec.floor)
        reply = Deferred(conn)
        if self.concurrent or spec.seq in queue.started or spec.seq < queue.next_seq \
                or not self._turn(queue, spec.seq):
            reply.run_soon(self._call_in_task, queue, spec)
            return reply
        done = self._call_started(queue, spec)
        self._admit(queue, _Call(spec, queue, done, reply))
        return reply

    async def _call_in_task(self, queue: CallerQueue, spec: TaskSpec) -> TaskReply:
        if self.exiting is not None:
            raise self._exiting_error(spec)
        first = queue.started.get(spec.seq)
        if first is not None:  # a re-sent call: it arrived here already
            await first.wait()
            if spec.seq in queue.replies:
                return queue.replies[spec.seq]
            # The first copy ended without a reply kept (it failed, or the
            # caller's floor passed it meanwhile): it is not run twice.
            raise exceptions.ActorError(
                f"call #{spec.seq} ({spec.name}) from {spec.caller} was sent to the actor "
                f"{self.actor_id} again, and its first copy ended without a reply to give: "
                "not run twice", self.actor_id)
        if spec.seq < queue.next_seq and not self.concurrent:
            # Behind the caller's floor and not here before: the caller gave
            # up on it (its copies were held up by the network) or it ran
            # long ago. Running it now would run it after later calls, maybe
            # twice (simtest chaos seed 873).
            raise exceptions.ActorError(
                f"call #{spec.seq} ({spec.name}) from {spec.caller} reached the actor "
                f"{self.actor_id} after its caller gave up on it: not run", self.actor_id)
        done = self._call_started(queue, spec)
        reply = error = None
        try:
            try:
                reply = await self._run_call(queue, spec)
            except SystemExit as exit_error:  # sys.exit() or exit_actor() in a method
                error = exit_error
            return self._call_outcome(queue, spec, reply, error)
        finally:
            self._call_ended(done)  # (after its reply is kept, for a re-sent copy)

    def _call_started(self, queue: CallerQueue, spec: TaskSpec) -> trio.Event:
        done = trio.Event()
        queue.add_started(spec.seq, done)
        self._running += 1
        return done

    def _call_ended(self, done: trio.Event) -> None:
        done.set()
        self._running -= 1
        if self._running == 0 and self._idle is not None:
            self._idle.set()
            self._idle = None

    def _exit_if_asked(self, spec: TaskSpec, error: BaseException | None) -> bool:
        """Whether the finished call ``spec`` ended the actor (``exit_actor()``,
        ``sys.exit()``, ``__ray_terminate__``); if so the exit begins: no
        call admitted after it runs (one in its own task used to, while the
        executor ran on before that task replied: a call sent right after
        ``__ray_terminate__`` ran, simtest paths none seed 0)."""
        if isinstance(error, SystemExit):
            if self._exit_request is None or self._exit_request[0] != spec.task_id:
                self._exit_request = (spec.task_id, f"the actor's method {spec.name} "
                                                    "called sys.exit()")
        if self._exit_request is None or self._exit_request[0] != spec.task_id:
            return False
        self.begin_exit(self._exit_request[1])
        return True

    def _call_outcome(self, queue: CallerQueue, spec: TaskSpec, reply: TaskReply | None,
                      error: BaseException | None) -> TaskReply:
        """What the caller of a finished call gets: its reply (kept for a
        re-send), or the error it raises. A call that ended the actor
        (``exit_actor()``, ``sys.exit()``) gets ActorDiedError, as in Ray."""
        if error is not None and not isinstance(error, SystemExit):
            raise error
        if self._exit_if_asked(spec, error):
            raise exceptions.ActorDiedError(
                f"the actor {self.actor_id} exited during {spec.name}: "
                f"{self._exit_request[1]}", self.actor_id)
        # Kept for a re-send — unless the caller's floor passed this call
        # while it ran (the caller gave up on it): then nobody will ask.
        if spec.seq in queue.started:
            queue.replies[spec.seq] = reply
        while len(queue.replies) > self._config.actor_pending_calls_max:
            oldest = next(iter(queue.replies))
            del queue.replies[oldest]
            queue.started.pop(oldest, None)
        return reply

    # ------------------------------------------------------------- exiting

    def _exiting_error(self, spec: TaskSpec) -> Exception:
        return exceptions.ActorDiedError(
            f"the actor {self.actor_id} is exiting ({self.exiting}), so {spec.name} "
            "cannot run", self.actor_id)

    def request_exit(self, reason: str) -> None:
        """``exit_actor()``: the running call ends the actor when it returns."""
        context = current_task.get(None)
        if context is None or context.actor_id is None:
            raise TypeError("exit_actor() can only be called inside an actor's method")
        if self.instance is None:
            raise TypeError("exit_actor() in an actor's constructor is not supported; raise "
                            "an exception there instead (the actor is then dead, and calls "
                            "to it raise ActorDiedError)")
        self._exit_request = (context.task_id.binary(), reason)

    def begin_exit(self, reason: str) -> None:
        """Take no more calls, fail those waiting for their turn, and tell
        the GCS (which calls ``terminate_actor`` back)."""
        if self.exiting is not None:
            return
        self.exiting = reason
        self._tracer.record(self._name, "actor_exiting", actor=self.actor_id, reason=reason)
        for queue in self.callers.values():
            for event in queue.waiters.values():
                event.set()
        if self._gcs is not None:
            self._nursery.start_soon(self._tell_gcs, reason)

    async def _tell_gcs(self, reason: str) -> None:
        try:
            await self._gcs.call("actor_exiting", self.actor_id, self._worker_id, reason)
        except (PeerDisconnected, exceptions.TrayError) as error:
            # No GCS to ask: end anyway (it learns of the worker's exit later).
            logger.warning("actor %s exits without telling the GCS: %s", self.actor_id, error)
            await self.handle_terminate_actor(None, self.actor_id, reason)

    async def handle_terminate_actor(self, conn, actor_id: str, reason: str) -> bool:
        """The GCS ends the hosted actor: the calls running now finish, then
        the process exits (after its atexit handlers on a real process).
        False when this worker does not host that actor."""
        if actor_id != self.actor_id or self.instance is None:
            return False
        self.begin_exit(reason)
        while self._running > 0:
            if self._idle is None:
                self._idle = trio.Event()
            await self._idle.wait()
        if not self._exited:
            self._exited = True
            self._tracer.record(self._name, "actor_exit", actor=self.actor_id)
            self._nursery.start_soon(self._exit_soon)
        return True

    async def _exit_soon(self) -> None:
        await trio.sleep(EXIT_GRACE_S)
        if self._run_exit_handlers is not None:
            try:
                self._run_exit_handlers()
            except Exception:  # noqa: BLE001 - a handler's error must not keep the actor up
                logger.exception("an atexit handler of actor %s failed", self.actor_id)
        if self._exit_process is not None:
            self._exit_process()

    async def _builtin(self, spec: TaskSpec):
        """Methods every actor has (``ActorHandle._BUILTIN_METHODS``)."""
        if spec.method == "__ray_terminate__":
            async def terminate():
                self._exit_request = (spec.task_id, "__ray_terminate__ was called")
            return terminate

        async def ready():
            return True
        return ready

    def handle_actor_floor(self, conn, caller: str, floor: int) -> None:
        """Every call of ``caller`` below ``floor`` is finished or abandoned."""
        queue = self.callers.get(caller)
        if queue is not None:
            self._advance_floor(queue, floor)

    def _advance_floor(self, queue: CallerQueue, floor: int) -> None:
        queue.forget_below(floor)
        if floor > queue.next_seq:
            queue.next_seq = floor
            self._skip_refused(queue)
            self._wake(queue)

    @staticmethod
    def _skip_refused(queue: CallerQueue) -> None:
        while queue.next_seq in queue.refused:
            del queue.refused[queue.next_seq]
            queue.next_seq += 1

    async def _run_call(self, queue: CallerQueue, spec: TaskSpec) -> TaskReply:
        if self.concurrent:
            return await self._run_concurrent(queue, spec)
        if not self._turn(queue, spec.seq):
            limit = self._config.actor_pending_calls_max
            if len(queue.waiters) >= limit:
                queue.refused[spec.seq] = None
                raise exceptions.ActorError(
                    f"the actor {self.actor_id} refused {spec.name} (call #{spec.seq} from "
                    f"{spec.caller}): {len(queue.waiters)} calls from that caller already "
                    f"wait for an earlier call to arrive (actor_pending_calls_max={limit})",
                    self.actor_id)
            while not self._turn(queue, spec.seq) and self.exiting is None:
                event = trio.Event()
                queue.add_waiter(spec.seq, event)
                await event.wait()
            queue.waiters.pop(spec.seq, None)
        call = _Call(spec)
        self._admit(queue, call)
        await call.done.wait()
        if call.error is not None:
            raise call.error
        return call.reply

    def _admit(self, queue: CallerQueue, call: _Call) -> None:
        """A plain actor's call whose turn came: into the executor's queue,
        behind every call admitted before it (from any caller), and the
        caller's next call may follow."""
        seq = call.spec.seq
        if seq >= queue.next_seq:
            queue.next_seq = seq + 1
            self._skip_refused(queue)
        self._admitted.append(call)
        self._wake(queue)
        if self._executor_idle is not None:
            self._executor_idle.set()
            self._executor_idle = None
        elif not self._executor_started:
            self._executor_started = True
            self._nursery.start_soon(self._execute_calls)

    async def _execute_calls(self) -> None:
        """The executor of a plain actor (see "One executor" above): runs
        the admitted calls one at a time, in the order they were admitted,
        for as long as the process."""
        runnable = self._admitted
        # One portal for every call it runs (the task receiver's
        # with_portal_run_sync then just calls the method): a portal set up
        # per call cost more than this task's few steps per call through
        # greenback's shim (actor CPU per call 383-417 -> 313-364 µs,
        # three alternated pairs of 10,000 calls).
        await greenback.ensure_portal()
        while True:
            while runnable:
                call = runnable.popleft()
                try:
                    call.reply = await self._execute(call.spec)
                except (Exception, SystemExit) as error:  # its caller gets it
                    call.error = error
                except BaseException as error:  # the process is ending (a trio cancel)
                    call.error = error
                    if call.deferred is not None:
                        self._call_ended(call.done)  # (no reply: the process ends)
                    else:
                        call.done.set()
                    raise
                if call.deferred is None:
                    # Its task replies, later: a call that ended the actor
                    # ends it now, before the next admitted call can run.
                    self._exit_if_asked(call.spec, call.error)
                    call.done.set()
                    continue
                # Admitted by handle_actor_call: this executor replies.
                try:
                    outcome = True, self._call_outcome(call.queue, call.spec, call.reply,
                                                       call.error)
                except Exception as error:  # noqa: BLE001 - the caller's error
                    outcome = False, error
                self._call_ended(call.done)
                call.deferred.resolve(*outcome)
            self._executor_idle = trio.Event()
            await self._executor_idle.wait()

    def _call_context(self, spec: TaskSpec) -> TaskContext:
        return TaskContext(TaskID(spec.task_id), ActorID.from_hex(self.actor_id), self.gpu_ids,
                           name=spec.name, job_id=spec.job_id, namespace=spec.namespace,
                           placement_group=self.placement_group, attempt=spec.attempt,
                           depth=spec.depth)

    async def _execute(self, spec: TaskSpec) -> TaskReply:
        if self.exiting is not None:
            raise self._exiting_error(spec)
        context = self._call_context(spec)
        instance = self.instance

        async def bound_method():
            if spec.method in _BUILTIN_METHODS:
                return await self._builtin(spec)
            return getattr(instance, spec.method)
        return await self._receiver.execute(spec, context, bound_method)

    async def _run_concurrent(self, queue: CallerQueue, spec: TaskSpec) -> TaskReply:
        """A call of a concurrent actor: no wait for its turn, a slot of its
        group, then the method (async ones on the asyncio loop, synchronous
        ones in the backend's threads when there are any)."""
        queue.next_seq = max(queue.next_seq, spec.seq + 1)
        context = self._call_context(spec)
        group = spec.concurrency_group
        if group and group not in self._groups:
            raise exceptions.ActorError(
                f"the actor {self.actor_id} has no concurrency group {group!r} (it has "
                f"{sorted(self._groups) or 'none'})", self.actor_id)
        slots = self._groups[group] if group else self._slots
        # A free slot is taken without a scheduling step (trio's acquire()
        # always takes one; the call takes its own in execute anyway).
        try:
            slots.acquire_nowait()
        except trio.WouldBlock:
            await slots.acquire()
        try:
            if self.exiting is not None:
                raise self._exiting_error(spec)
            if spec.method in _BUILTIN_METHODS:
                builtin = await self._builtin(spec)

                async def load():
                    return builtin
                return await self._receiver.execute(spec, context, load)
            key = (spec.method, group)
            runnable = self._runnables.get(key)
            if runnable is None:
                runnable = self._runnable(getattr(self.instance, spec.method), group)
                if len(self._runnables) < RUNNABLES_CACHED_MAX:
                    self._runnables[key] = runnable

            async def load():
                return runnable
            return await self._receiver.execute(spec, context, load)
        finally:
            slots.release()

    def _runnable(self, method, group: str):
        """``method`` as the task receiver runs it: a coroutine function."""
        if inspect.iscoroutinefunction(method):
            if self.asyncio_loop is None:
                return method
            loop = self.asyncio_loop
            run_aio_future = self._asyncio_loops.run_aio_future

            async def on_asyncio(*args, **kwargs):
                # A blocking call inside (tray.get, as Ray allows in async
                # methods) suspends this asyncio task through greenback: the
                # task gets its portal before its first step (ensure_portal
                # from inside it cost an extra pass of the asyncio loop,
                # ~45-90 µs a call measured). A trio cancel cancels the task.
                coro = method(*args, **kwargs)
                try:
                    task = loop.create_task(coro)
                except BaseException:
                    coro.close()  # (the loop is closed: no "never awaited" warning)
                    raise
                greenback.bestow_portal(task)
                return await run_aio_future(task)
            on_asyncio._tray_runs = method  # (for the traceback of its errors)
            on_asyncio._tray_no_portal = True  # (the asyncio task has its own)
            on_asyncio._tray_cancellable = True  # (tray.cancel cancels its asyncio task)
            return on_asyncio
        if self._run_sync_in_thread is None:
            return method
        run_in_thread = self._run_sync_in_thread

        async def in_thread(*args, **kwargs):
            return await run_in_thread(lambda: method(*args, **kwargs), group)
        in_thread._tray_runs = method
        in_thread._tray_no_portal = True  # (the task receiver sets up none for it)
        return in_thread

    @staticmethod
    def _turn(queue: CallerQueue, seq: int) -> bool:
        """Whether call ``seq`` may go for the actor's slot now (see CallerQueue)."""
        if seq > queue.next_seq:
            return False
        first = queue.first_waiter()
        return first is None or first >= seq

    @staticmethod
    def _wake(queue: CallerQueue) -> None:
        """Wake the earliest waiting call if its turn came. Only that one: a
        floor that jumped past several waiting calls must not let them race
        for the slot (simtest chaos seeds 480 and 520 ran #3 before #2)."""
        first = queue.first_waiter()
        if first is not None and first <= queue.next_seq:
            queue.waiters[first].set()


async def _run_asyncio_loop(loops, task_status=trio.TASK_STATUS_IGNORED) -> None:
    """An asyncio event loop on this trio loop, for as long as the process
    (``ProcessEnv.asyncio_loops``: opened by the first async actor)."""
    if loops is None:
        raise exceptions.TrayError("this worker has no asyncio loop for async actors "
                                   "(its backend gave none: ProcessEnv.asyncio_loops)")
    async with loops.open_loop() as loop:
        task_status.started(loop)
        await trio.sleep_forever()
