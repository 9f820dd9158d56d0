"""The core worker: the runtime inside every driver and worker process.

This class is a facade. It builds the components below, hands each its
collaborators, serves their handlers on one endpoint, and offers the API
layer (``tray.core.api``) the operations a program performs. The work is in
the components, one concern each (after Ray's core worker):

owner side (the process that called ``.remote()`` or ``put``)
  ``reference_counter``      the object table: counts, borrowers, values
  ``task_manager``           pending tasks, lineage; every task ends in ``finish``
  ``dependency_resolver``    a task waits for its arguments before it is sent
  ``normal_task_submitter``  lease queues per scheduling class; push; retries
  ``actor_task_submitter``   per-actor sequence numbers; actor registration
  ``object_recovery``        re-creating lost objects from lineage
  ``object_getter``          status, fetch, get and wait
executor side (a worker running tasks)
  ``task_receiver``          runs a pushed task or actor call
  ``actor_host``             the hosted actor and its per-caller queues
plumbing
  ``loop_bridge``, ``outbox``, ``gcs_client``, ``function_table``,
  ``task_events`` (what the state API shows of tasks, batched to the GCS)

How a task flows through them: ``submit_task`` packs the arguments (holding
every ref argument in the reference counter) and registers a
``PendingTask`` with the task manager; the normal submitter exports the
function, resolves the dependencies, queues the task in its class, leases
a worker and pushes it; the worker's task receiver runs it and replies;
the task manager's ``finish`` stores the results and releases the
arguments. (From the local driver's script, whose loop runs in another
thread, ``submit_task`` builds the spec and refs in the caller's thread and
queues the rest for the loop through ``thread_inbox``: no wait, one wake-up
of the loop per batch.) An actor call skips the lease: the actor task submitter sends it
to the actor's worker, whose actor host orders it among the caller's calls.

Nothing here knows whether it runs in a real process or in the simulator."""

from __future__ import annotations

import collections
import functools
import logging
from dataclasses import dataclass

import trio

from ... import exceptions
from ..context import TaskContext, current_task, current_worker
from ..ids import ActorID, JobID, ObjectID, PlacementGroupID, TaskID
from ..messages import ActorInfo, ActorSpec, PlacementGroupSpec
from ..object_ref import ObjectRef
from ..rpc import Endpoint, PeerDisconnected
from ..scheduling import Strategy
from ..serialization import KIND_ERROR, deserialize, serialize, serialize_error
from ..task_spec import ArgByRef, ArgByValue, TaskSpec
from .actor_host import ActorHost, ActorHostStatistics
from .actor_task_submitter import ActorState, ActorTaskSubmitter
from .dependency_resolver import DependencyResolver
from .function_table import FunctionTable
from .gcs_client import GcsClient
from .loop_bridge import LoopBridge
from .normal_task_submitter import LEASE_IDLE_KEEP_S, NormalTaskSubmitter, SubmitterStatistics
from .object_getter import ObjectGetter, ReadyEvent, split_at
from .object_recovery import ObjectRecoveryManager
from .outbox import Outbox
from .reference_counter import ReferenceCounter, ReferenceStatistics, actor_handle_id
from .state_report import object_report
from .task_events import TaskEventBuffer
from .task_manager import PendingTask, TaskManager, TaskManagerStatistics
from .task_receiver import TaskReceiver
from .thread_inbox import SingleThread, ThreadInbox, ThreadInboxStatistics

logger = logging.getLogger("tray.worker")

DRIVER, WORKER = "driver", "worker"

# Each component class's handle_* methods, found once per class: dir() of
# the 7 components of every worker was 1-2.5% of a simtest seed, which
# starts dozens of workers. (Bounded by the component classes.)
_handler_names_of: dict[type, tuple[str, ...]] = {}


def _handler_names(kind: type) -> tuple[str, ...]:
    names = _handler_names_of.get(kind)
    if names is None:
        names = tuple(name for name in dir(kind) if name.startswith("handle_"))
        _handler_names_of[kind] = names
    return names

# How often a cancelled task that is still running is told again.
CANCEL_RETRY_PERIOD_S = 0.5


@dataclass(frozen=True)
class CoreWorkerStatistics:
    mode: str
    references: ReferenceStatistics
    tasks: TaskManagerStatistics
    submitter: SubmitterStatistics
    actor_host: ActorHostStatistics
    actors_known: int  # actors this process called or created
    outbox_queued: int
    inbox: ThreadInboxStatistics  # work the user's threads queued for the loop


class _ThreadGet:
    """A user's thread waiting in ``get`` for objects this process owns
    (``CoreWorker.get_from_thread``). The loop sets ``woken`` under the
    condition; ``watched`` and ``pending`` are the loop's alone."""

    __slots__ = ("condition", "refs", "woken", "gave_up", "ended", "pending", "watched")

    def __init__(self, condition, refs: list) -> None:
        self.condition = condition
        self.refs = refs
        self.woken = False
        self.gave_up = False  # get must take the loop's path
        self.ended = False  # tray.shutdown() ended the loop meanwhile
        self.pending = 0  # refs not ready yet
        self.watched: list = []  # (ReadyEvent, callback key)

    def is_woken(self) -> bool:
        return self.woken

    def wake(self, gave_up: bool = False) -> None:
        with self.condition:
            if self.woken:
                return
            self.gave_up = gave_up
            self.woken = True
            self.condition.notify_all()

    def end(self) -> None:
        """The loop is ending (``CoreWorker.begin_shutdown``, from any thread)."""
        with self.condition:
            self.ended = True
            self.woken = True
            self.condition.notify_all()


class _ThreadWait(_ThreadGet):
    """A user's thread waiting in ``wait`` (``CoreWorker.wait_from_thread``):
    woken when ``need`` more of its refs are ready here. ``need`` is the
    loop's alone once the thread has queued it."""

    __slots__ = ("num_returns", "need", "fetch_local", "generation", "by_id")

    def __init__(self, condition, refs: list, num_returns: int, ready: int,
                 fetch_local: bool, generation: int) -> None:
        super().__init__(condition, refs)
        self.num_returns = num_returns
        self.need = num_returns - ready  # as the thread counted them
        self.fetch_local = fetch_local
        self.generation = generation  # ReferenceCounter.ready_generation when it counted
        self.by_id = {ref._id._binary: ref for ref in refs}


def _captured(context: TaskContext, strategy: Strategy) -> Strategy:
    """A task or actor created without a strategy inside a placement group
    that captures its children goes into that group (any bundle), as in Ray."""
    group = context.placement_group
    if strategy.kind == "DEFAULT" and group is not None and group.capture_child_tasks:
        return Strategy("PLACEMENT_GROUP", placement_group_id=group.placement_group_id,
                        bundle_index=-1, capture_child_tasks=True)
    return strategy


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


class CoreWorker:
    def __init__(self, env, mode: str, nursery, *, worker_id: str = "",
                 spawn_from_outside=None, loop_in_other_thread: bool = False) -> None:
        self.env = env
        self.config = config = env.config
        self.mode = mode
        self.address = address = env.address
        self.node_id: str = env.node_id
        self.worker_id = worker_id
        self.tracer = tracer = env.tracer
        self.name = name = f"{mode}:{(worker_id or env.address)[-8:]}"
        self.job_id = JobID.from_int(0)
        self.driver_context: TaskContext | None = None

        handlers: dict = {}
        self.endpoint = endpoint = Endpoint(env, handlers, nursery)
        self.bridge = bridge = LoopBridge(self, nursery,
                                          call_soon_from_outside=spawn_from_outside,
                                          loop_in_other_thread=loop_in_other_thread)
        self.outbox = outbox = Outbox(address, endpoint, bridge)
        # What the user's threads hand the loop without waiting (submissions,
        # ref counts); see ``thread_inbox``. Ids of children and puts are
        # taken from the same TaskContext by those threads and by the loop.
        make_condition = env.thread_condition or SingleThread
        self.inbox = ThreadInbox(self, bridge.call_soon_from_outside,
                                 condition=make_condition(), flush=env.transport.flush_queued)
        self._queued_calls: collections.deque = collections.deque()  # (task, actor) to start
        self._sending_calls = False  # _send_queued_calls runs
        self._ids_lock = make_condition()  # (used as a lock)
        # The user's threads asleep in get or wait (_sleep_in_thread), woken
        # at shutdown; one entry per thread, so bounded by the user's threads.
        self._thread_waiters: set = set()
        self._ending = False
        self.gcs = gcs = GcsClient(endpoint, env.gcs_address, config)
        self.functions = functions = FunctionTable(gcs)
        self.references = references = ReferenceCounter(
            address=address, name=name, endpoint=endpoint, outbox=outbox, bridge=bridge,
            tracer=tracer, store=env.object_store, node_id=env.node_id,
            node_manager_address=env.node_manager_address, config=config,
            task_pending=lambda task_id: self.task_manager.is_pending(task_id),
            lineage_released=lambda task_id: self.task_manager.forget_lineage(task_id),
            actor_out_of_scope=lambda actor_id: self.actor_submitter.actor_out_of_scope(
                actor_id))
        self.task_events = task_events = TaskEventBuffer(
            address=address, node_id=env.node_id, worker_id=worker_id, endpoint=endpoint,
            gcs_address=env.gcs_address, config=config)
        self.task_manager = task_manager = TaskManager(name=name, references=references,
                                                       outbox=outbox, tracer=tracer,
                                                       config=config, events=task_events)
        self.getter = getter = ObjectGetter(
            address=address, endpoint=endpoint, references=references, outbox=outbox,
            store=env.object_store, node_manager_address=env.node_manager_address,
            worker_id=worker_id,
            lends_cpu=lambda: self.mode == WORKER and self.actor_host.actor_id is None)
        resolver = DependencyResolver(getter.object_status, config)
        self.normal_submitter = submitter = NormalTaskSubmitter(
            address=address, name=name, endpoint=endpoint, nursery=nursery, outbox=outbox,
            tracer=tracer, config=config, node_manager_address=env.node_manager_address,
            task_manager=task_manager, resolver=resolver, functions=functions, gcs=gcs,
            lease_idle_keep_s=LEASE_IDLE_KEEP_S if mode == DRIVER else 0.0)
        self.actor_submitter = ActorTaskSubmitter(
            address=address, name=name, endpoint=endpoint, gcs=gcs, bridge=bridge,
            outbox=outbox, tracer=tracer,
            task_manager=task_manager, resolver=resolver, functions=functions,
            references=references, events=task_events)
        self.recovery = recovery = ObjectRecoveryManager(
            address=address, name=name, endpoint=endpoint, bridge=bridge, outbox=outbox,
            tracer=tracer, references=references, task_manager=task_manager,
            submitter=submitter, config=config)
        getter.bind_recovery(recovery.recover)
        self.receiver = receiver = TaskReceiver(
            address=address, name=name, endpoint=endpoint, tracer=tracer,
            store=env.object_store, node_id=env.node_id,
            node_manager_address=env.node_manager_address, config=config,
            functions=functions, references=references, getter=getter,
            before_task=env.before_task, exit_process=env.exit_process,
            cancel_children=self._cancel_children, events=task_events,
            task_cost_s=env.task_cost_s)
        self.actor_host = ActorHost(nursery=nursery,
                                    run_sync_in_thread=env.run_sync_in_thread,
                                    name=name, worker_id=worker_id, tracer=tracer,
                                    config=config, functions=functions, receiver=receiver,
                                    gcs=gcs, exit_process=env.exit_process,
                                    # Real processes (threads for methods) run atexit
                                    # handlers when the actor exits; simulated ones share
                                    # the host interpreter's.
                                    run_atexit=env.run_sync_in_thread is not None)
        for component in (self, references, submitter, getter, recovery, receiver,
                          self.actor_host):
            for attribute in _handler_names(type(component)):
                method = attribute[len("handle_"):]
                assert method not in handlers, f"two handlers for {method!r}"
                handlers[method] = getattr(component, attribute)
        endpoint.add_peer_closed_listener(references.peer_gone)

    # ------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        await self.endpoint.serve()
        self.endpoint.nursery.start_soon(self.task_events.run)
        if self.mode == DRIVER:
            job = await self.gcs_call("register_job", self.address)
            self.job_id = JobID.from_int(job)
            self.driver_context = TaskContext(TaskID.for_driver(self.job_id), name="driver")
        else:
            manager = self.env.node_manager_address
            while True:
                try:
                    await self.endpoint.call(manager, "register_worker", self.worker_id,
                                             self.address)
                    return
                except PeerDisconnected:
                    if await self.endpoint.reachable(manager):
                        continue  # only the connection broke: register again
                    # Its node manager went away before it could register: a
                    # worker without a node has nothing to do.
                    if self.env.exit_process is None:
                        raise
                    self.env.exit_process()
                    return

    def begin_shutdown(self) -> None:
        """The process is ending: queue no more background sends, and wake
        the user's threads waiting in ``get`` or ``wait`` (``_sleep_in_thread``),
        which then raise instead of waiting for a loop that is gone."""
        self.outbox.shutting_down = True
        self._ending = True
        for waiter in list(self._thread_waiters):
            waiter.end()

    async def gcs_call(self, method: str, *args):
        return await self.gcs.call(method, *args)

    def current_context(self) -> TaskContext:
        context = current_task.get(None)
        if context is None:
            context = self.driver_context
        if context is None:
            raise exceptions.TrayError("no task is running in this worker")
        return context

    def current_job(self) -> int:
        context = current_task.get(None)
        if context is not None:
            return context.job_id
        return int.from_bytes(self.job_id.binary(), "big")

    def in_user_thread(self) -> bool:
        return self.bridge.in_user_thread()

    def spawn(self, async_fn, *args) -> None:
        self.bridge.spawn(async_fn, *args)

    @property
    def actor_gpu_ids(self) -> list:
        return self.actor_host.gpu_ids

    def statistics(self) -> CoreWorkerStatistics:
        return CoreWorkerStatistics(
            mode=self.mode, references=self.references.statistics(),
            tasks=self.task_manager.statistics(), submitter=self.normal_submitter.statistics(),
            actor_host=self.actor_host.statistics(),
            actors_known=len(self.actor_submitter.actors), outbox_queued=len(self.outbox),
            inbox=self.inbox.statistics())

    def validate_state(self) -> None:
        """Check every component's invariants (the simulator calls this
        after every step of a simtest run)."""
        self.references.validate_state()
        self.task_manager.validate_state()
        self.normal_submitter.validate_state()
        self.actor_submitter.validate_state()
        self.actor_host.validate_state()

    # ------------------------------------------------- what ObjectRef needs

    def queues_from_thread(self) -> bool:
        """Is the caller a user's thread of a driver whose loop runs in a
        thread of its own (the local backend's driver script)? Its
        submissions, small puts and ref counts are then queued for the loop
        (``inbox``) and never waited for. (The simulator's driver runs the
        loop in its own thread; workers' code runs on the loop.)"""
        return self.bridge.loop_in_other_thread and current_worker.get(None) is None

    def add_local_ref(self, object_id: ObjectID, owner: str) -> None:
        if self.bridge.off_loop_thread():
            # Counted on the loop, in this thread's order (before any later
            # count-down from here).
            self.inbox.put_quietly(self.references.add_local_ref, object_id, owner)
            return
        self.references.add_local_ref(object_id, owner)

    def remove_local_ref(self, object_id: ObjectID) -> None:
        if self.bridge.off_loop_thread():
            # A ref dropped in a thread other than the loop's: counted down on
            # the loop, batched with whatever else the threads queued.
            self.inbox.put_quietly(self.references.remove_local_ref, object_id)
            return
        self.references.remove_local_ref(object_id)

    def knows(self, object_id: ObjectID) -> bool:
        return object_id in self.references.refs

    def register_borrow_later(self, object_id: ObjectID, owner: str) -> None:
        self.references.register_borrow_later(object_id, owner)

    async def deserialize(self, serialized):
        return await self.references.deserialize(serialized)

    def _next_child_id(self, context: TaskContext) -> TaskID:
        # The driver's context hands out ids to the user's threads and the loop.
        with self._ids_lock:
            return context.next_child_id()

    def _next_put_id(self, context: TaskContext) -> ObjectID:
        with self._ids_lock:
            return context.next_put_id()

    # ------------------------------------------------------------------ put

    def put(self, value) -> ObjectRef:
        """Store ``value`` (on the loop); returns its ref."""
        return self.put_serialized(self.serialize_put(value))

    @staticmethod
    def serialize_put(value):
        """``put``'s errors a user can cause, raised in the caller's thread."""
        if isinstance(value, ObjectRef):
            raise TypeError("Calling put() on an ObjectRef is not allowed; "
                            "pass the ObjectRef itself instead")
        return serialize(value)

    def put_serialized(self, serialized) -> ObjectRef:
        """On the loop: store a serialized value as a new object."""
        object_id = self._next_put_id(self.current_context())
        self._store_put(object_id, serialized)
        return ObjectRef.counted_by_caller(object_id, self.address, self)

    def queue_put(self, serialized) -> ObjectRef | None:
        """From a user's thread (``queues_from_thread``): a small value is
        stored in this process's memory by the loop, later; its ref now.
        None for a value that goes to the node's shared-memory store, which
        can be full: that put waits for the loop (``put_serialized``), so
        its error reaches the caller."""
        if serialized.size_bytes() > self.config.inline_object_max_bytes:
            return None
        object_id = self._next_put_id(self.current_context())
        ref = ObjectRef.counted_by_caller(object_id, self.address, self)
        self.inbox.put(self._store_put, object_id, serialized)
        return ref

    def _store_put(self, object_id: ObjectID, serialized) -> None:
        references = self.references
        references.add_local_ref(object_id, self.address)  # the caller's ref
        references.store_value(object_id, references.refs[object_id], serialized)
        self.tracer.record(self.name, "put", object=object_id, size=serialized.size_bytes())

    def get_ready(self, refs: list):
        """The values of ``refs`` when every one is owned here, ready, held
        in this process's memory and free of refs inside (nothing to fetch,
        nothing to register): read without entering the loop, from any
        thread (an entry's value, once ready, is immutable). Raises the
        first error among them, in list order, as ``get`` does. None when
        any one needs the loop."""
        table = self.references.refs
        found = []
        for ref in refs:
            entry = table.get(ref._id)
            if entry is None or not entry.owned or not entry.ready:
                return None
            inline = entry.inline
            if inline is None or inline.contained:
                return None
            found.append(inline)
        values = []
        for serialized in found:
            value = deserialize(serialized)
            if serialized.kind == KIND_ERROR:
                raise value
            values.append(value)
        return values

    def get_from_thread(self, refs: list, timeout: float | None):
        """``get`` from a user's thread (``queues_from_thread``) of objects
        this process owns that are not ready yet: their values, or None when
        ``get`` must go through the loop (``get_async``): a ref owned
        elsewhere, a value in the node's store or holding refs.

        The thread waits on a condition of its own, which the loop notifies
        when every ref is ready or one failed; the watch is queued through
        the inbox behind the submissions it waits for, so a ``get`` right
        after ``.remote()`` wakes the loop once for both, and needs no trio
        task, no ``from_thread`` round trip and no result queue. Measured
        in a sync loop of ``get(f.remote())`` on a loaded machine: the
        loop thread's CPU per task ~430 -> ~260 us, the caller's ~110 -> ~60."""
        address = self.address
        if self.env.thread_condition is None:
            return None
        for ref in refs:
            if ref._owner != address:
                return None
        waiter = _ThreadGet(self.env.thread_condition(), refs)
        if not self._sleep_in_thread(waiter, self._watch_for_thread, timeout,
                                     self._unwatch_for_thread):
            raise exceptions.GetTimeoutError(
                f"get() timed out after {timeout} s waiting for {len(refs)} object(s)")
        if waiter.gave_up:
            return None
        return self._read_ready(refs)

    def _sleep_in_thread(self, waiter: _ThreadGet, watch, timeout: float | None,
                         unwatch) -> bool:
        """In a user's thread: queue ``watch(waiter)`` for the loop and sleep
        until the loop wakes ``waiter`` (True) or ``timeout`` passes (False).
        ``unwatch(waiter)`` goes to the loop when the watch may still hold
        callbacks there: timed out, interrupted, or woken by a failure while
        others were pending. Raises TrayError when ``tray.shutdown()`` ends
        the loop meanwhile (``begin_shutdown``)."""
        self._thread_waiters.add(waiter)
        try:
            if self._ending:
                waiter.end()
            else:
                try:
                    self.inbox.put(watch, waiter)
                except Exception:
                    if not waiter.ended:  # (the loop ended after begin_shutdown: ended)
                        raise
            with waiter.condition:
                woken = waiter.condition.wait_for(waiter.is_woken, timeout)
        finally:
            self._thread_waiters.discard(waiter)
            if not waiter.is_woken() or waiter.pending:
                self.inbox.put_quietly(unwatch, waiter)
        if waiter.ended:
            raise exceptions.TrayError(
                "tray.shutdown() was called while this thread was waiting for objects")
        return woken

    def _read_ready(self, refs: list):
        """Values of owned, ready-or-failed refs (in memory, no refs inside):
        the first error in list order is raised, as ``get`` does; None when
        one is not readable here after all."""
        table = self.references.refs
        found = []
        pending = False
        for ref in refs:
            entry = table.get(ref._id)
            if entry is None or not entry.owned:
                return None
            if not entry.ready:
                pending = True  # (woken by another's failure)
                continue
            inline = entry.inline
            if inline is None or inline.contained:
                return None
            if inline.kind == KIND_ERROR:
                raise deserialize(inline)
            found.append(inline)
        if pending:
            return None
        return [deserialize(serialized) for serialized in found]

    def _watch_for_thread(self, waiter: _ThreadGet) -> None:
        """On the loop: wake ``waiter`` (a ``get``) when its refs are ready,
        or one failed, or at once when it must take the loop's path."""
        table = self.references.refs
        for ref in waiter.refs:
            entry = table.get(ref._id)
            if entry is None or not entry.owned:
                waiter.wake(gave_up=True)
                return
            if entry.ready:
                if entry.inline is not None and entry.inline.kind == KIND_ERROR:
                    waiter.wake()
                    return
                continue
            event = entry.event
            if event is None:
                event = entry.event = ReadyEvent()
            waiter.pending += 1
            waiter.watched.append((event, event.add_callback(
                functools.partial(self._thread_ref_ready, waiter, entry))))
        if not waiter.pending:
            waiter.wake()

    @staticmethod
    def _thread_ref_ready(waiter: _ThreadGet, entry) -> None:
        waiter.pending -= 1
        if waiter.pending == 0 or (entry.inline is not None and
                                   entry.inline.kind == KIND_ERROR):
            waiter.wake()

    def wait_from_thread(self, refs: list, num_returns: int, timeout: float | None,
                         fetch_local: bool):
        """``wait`` from a user's thread (``queues_from_thread``) over objects
        this process owns: (ready, not_ready), or None when ``wait`` must go
        through the loop (``wait_async``): a ref owned elsewhere, or, before
        any waiting, a ready object to fetch from another node.

        Ray's loop of one ``wait`` per result over a shrinking list finds its
        first ref ready most of the time: that answer is read here, with no
        thread crossing. Otherwise the thread waits on a condition of its
        own, as ``get_from_thread`` does, which the loop notifies once
        ``num_returns`` are ready here (``_watch_wait_for_thread``). On
        timeout it answers with what is ready here then, as the loop's
        ``wait`` does."""
        if self.env.thread_condition is None:
            return None
        generation = self.references.ready_generation  # read before the entries
        positions, remote = self._ready_for_thread(refs, num_returns, fetch_local)
        if positions is None:
            return None
        if len(positions) < num_returns and timeout != 0:
            if remote:
                return None  # the loop's wait fetches it
            waiter = _ThreadWait(self.env.thread_condition(), refs, num_returns,
                                 len(positions), fetch_local, generation)
            woken = self._sleep_in_thread(waiter, self._watch_wait_for_thread, timeout,
                                          self._unlisten_for_thread)
            if waiter.gave_up:
                return None
            positions, _remote = self._ready_for_thread(refs, num_returns, fetch_local)
            if positions is None or (woken and len(positions) < num_returns):
                return None  # (not expected: what was counted is ready here)
        return split_at(refs, positions)

    def _ready_for_thread(self, refs: list, num_returns: int,
                          fetch_local: bool) -> tuple[list | None, bool]:
        """(the positions of the first ``num_returns`` refs ready here, is a
        ready one not here), in any thread: None positions when a ref is not
        owned here. It reads entries and this node's store only
        (``ObjectGetter.ready_here``, inlined: this runs once per ref of a
        ``wait`` that finds too few ready)."""
        table = self.references.refs
        contains = self.env.object_store.contains
        positions: list = []
        remote = False
        for i, ref in enumerate(refs):
            entry = table.get(ref._id)
            if entry is None or not entry.owned:
                return None, False
            if entry.ready:
                if entry.inline is None and fetch_local and not contains(ref._id._binary):
                    remote = True
                    continue
                positions.append(i)
                if len(positions) >= num_returns:
                    break
        return positions, remote

    def _watch_wait_for_thread(self, waiter: _ThreadWait) -> None:
        """On the loop: hear of each object made ready (``ready_listeners``)
        until ``waiter.need`` of its refs are ready here, then wake it. The
        refs are counted again here only when an object became ready since
        the thread counted them (``ready_generation``): no callback per ref
        per call, which cost O(refs) of the loop's time at each of the ~470
        of the bench's 1,000 waits a round that find no ref ready."""
        references = self.references
        if references.ready_generation != waiter.generation:
            positions, remote = self._ready_for_thread(waiter.refs, waiter.num_returns,
                                                       waiter.fetch_local)
            if positions is None or remote:
                waiter.wake(gave_up=True)  # as wait_from_thread would have
                return
            waiter.need = waiter.num_returns - len(positions)
            if waiter.need <= 0:
                waiter.wake()
                return
        references.ready_listeners[waiter] = functools.partial(self._thread_wait_ref_ready,
                                                               waiter)

    def _thread_wait_ref_ready(self, waiter: _ThreadWait, object_id: ObjectID, entry) -> None:
        ref = waiter.by_id.get(object_id._binary)
        if ref is None:
            return
        if self.getter.ready_here(ref, waiter.fetch_local):
            self._count_for_thread(waiter)
        else:  # (fetch_local, and every copy is on another node)
            self.endpoint.nursery.start_soon(self._fetch_for_thread, waiter, ref)

    async def _fetch_for_thread(self, waiter: _ThreadWait, ref: ObjectRef) -> None:
        """A ref of a thread's ``wait`` made ready with its copies on other
        nodes: pulled here, then counted (``fetch_local``, as the loop's
        ``wait`` does). A failed fetch sends the thread to the loop's path,
        which says what went wrong."""
        if waiter.woken:
            return
        try:
            await self.getter.fetch(ref._id, ref._owner)
        except Exception:
            self._unlisten_for_thread(waiter)
            waiter.wake(gave_up=True)
            return
        self._count_for_thread(waiter)

    def _unlisten_for_thread(self, waiter: _ThreadWait) -> None:
        self.references.ready_listeners.pop(waiter, None)

    def _count_for_thread(self, waiter: _ThreadWait) -> None:
        waiter.need -= 1
        if waiter.need <= 0:
            self._unlisten_for_thread(waiter)
            waiter.wake()

    @staticmethod
    def _unwatch_for_thread(waiter: _ThreadGet) -> None:
        for event, key in waiter.watched:
            event.remove_callback(key)
        waiter.watched.clear()

    # --------------------------------------------------------- submission

    def export_function(self, function_id: str, blob: bytes) -> None:
        self.functions.export(function_id, blob)

    def _serialize_args(self, args: tuple, kwargs: dict, name: str,
                        context: TaskContext) -> tuple[list, dict, list, list]:
        """Pack arguments, in any thread: returns them, the (oid, owner)
        pairs the task will hold (``_hold_args``, on the loop), and the
        large values to store first as objects of their own (oid, value)."""
        holds: list = []
        stores: list = []

        def one(value, key):
            if isinstance(value, ObjectRef):
                holds.append((value.object_id(), value._owner))
                return ArgByRef(value.binary(), value._owner)
            try:
                serialized = serialize(value)
            except TypeError as error:
                # The label only now: repr() of every argument cost ~5% of a submission.
                label = f"#{key}" if isinstance(key, int) else repr(key)
                raise TypeError(f"Could not serialize the argument {label} ({_short(value)}) "
                                f"of {name}: {error}") from error.__cause__
            if serialized.size_bytes() > self.config.inline_object_max_bytes:
                object_id = self._next_put_id(context)
                holds.append((object_id, self.address))
                stores.append((object_id, serialized))
                return ArgByRef(object_id.binary(), self.address)
            holds.extend((ObjectID(oid_bytes), owner) for oid_bytes, owner in serialized.contained)
            return ArgByValue(serialized)

        packed_args = tuple([one(value, i) for i, value in enumerate(args)])
        packed_kwargs = {key: one(value, key) for key, value in kwargs.items()}
        return packed_args, packed_kwargs, holds, stores

    def _hold_args(self, holds: list, stores: list) -> tuple:
        """On the loop: hold the task's arguments and store its large ones;
        returns the oids held (released when the task finishes)."""
        references = self.references
        held: list = []
        try:
            for oid, owner in holds:
                references.hold_submitted(oid, owner)
                held.append(oid)
            for oid, serialized in stores:
                references.store_value(oid, references.refs[oid], serialized)
        except BaseException:
            references.release_submitted(held)
            raise
        return tuple(held)  # untracked by the collector when empty, as most are

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
        queued = self.queues_from_thread()
        context = self.current_context()
        if actor_id is None:
            strategy = _captured(context, strategy)
        packed_args, packed_kwargs, holds, stores = self._serialize_args(args, kwargs, name,
                                                                         context)
        task_id = self._next_child_id(context)
        if actor_ref is not None:
            # The call keeps its actor alive until it finishes (the actor's
            # handle reference, as an argument would be).
            holds.append((actor_ref.object_id(), actor_ref._owner))
        return_ids = [ObjectID.for_return(task_id, i + 1) for i in range(num_returns)]
        spec = TaskSpec(task_id=task_id.binary(), job_id=self.current_job(),
                        namespace=context.namespace,
                        name=name, function_id=function_id, args=packed_args,
                        kwargs=packed_kwargs, num_returns=num_returns,
                        return_ids=tuple([oid.binary() for oid in return_ids]),
                        caller=self.address,
                        resources=resources, strategy=strategy, max_retries=max_retries,
                        retry_exceptions=retry_exceptions, parent_task_id=context.task_id.binary(),
                        depth=context.depth + 1, runtime_env=runtime_env)
        if actor_id is not None:
            spec.actor_id = actor_id
            spec.method = method
            spec.concurrency_group = concurrency_group
        retries = max_task_retries if actor_id is not None else max_retries
        # The caller's refs: their local references are counted by
        # _start_task, on the loop, before any count-down they may queue.
        refs = [ObjectRef.counted_by_caller(oid, self.address, self) for oid in return_ids]
        start = (spec, return_ids, retries, holds, stores, export, max_pending_calls)
        if not queued:
            self._start_task(*start)
        elif stores or (actor_id is not None and max_pending_calls >= 0):
            run_on_loop(self._start_task, *start)
        else:
            self.inbox.put(self._start_queued_task, start)
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
            actor = self.actor_submitter.actor_state(spec.actor_id)
            self.actor_submitter.check_pending_calls(actor, max_pending_calls)
        if export is not None:
            self.functions.export(*export)
        held = self._hold_args(holds, stores)
        if actor is not None:
            spec.seq = self.actor_submitter.next_call(actor)
        task = PendingTask(spec, retries, held)
        self.task_manager.add(task)
        for oid in return_ids:
            self.references.add_local_ref(oid, self.address)
        self.tracer.record(self.name, "task_submitted", task=TaskID(spec.task_id),
                           name=spec.name)
        if actor is not None and not self._sending_calls and \
                self.actor_submitter.send_now(task, actor):
            pass  # sent now, in call order; its reply ends it
        elif actor is not None and queued and self._sending_calls:
            self._queued_calls.append((task, actor))
        elif actor is not None and queued:
            # The first of a burst starts at once (a lone sync call waits for
            # nothing more); the sender starts the rest after it.
            self._sending_calls = True
            self.spawn(self.actor_submitter.submit, task, actor)
            self.spawn(self._send_queued_calls)
        elif actor is not None:
            self.spawn(self.actor_submitter.submit, task, actor)
        elif self.functions.export_done(spec.function_id) and not spec.ref_args():
            # Nothing to upload or wait for: queued now, with no trio task
            # of its own (a burst of 1,000 ``.remote()`` started 1,000).
            self.normal_submitter.enqueue(task)
        else:
            self.spawn(self.normal_submitter.submit, task)

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
                self.bridge.start_soon(self.actor_submitter.submit, task, actor)
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
                if oid not in self.references.refs:
                    self.references.add_local_ref(oid, self.address)
                    entry = self.references.refs[oid]
                    self.references.store_value(oid, entry, failure)

    # --------------------------------------------------------------- actors

    def actor_state(self, actor_id: str) -> ActorState:
        return self.actor_submitter.actor_state(actor_id)

    def prepare_actor(self, *, class_name: str, function_id: str, args: tuple, kwargs: dict,
                      resources: dict, strategy: Strategy, options: dict, namespace: str,
                      method_meta: dict, is_async: bool,
                      runtime_env: dict | None = None) -> tuple[ActorSpec, list]:
        """The actor's spec, and the argument refs its creation holds."""
        context = self.current_context()
        strategy = _captured(context, strategy)
        task_id = self._next_child_id(context)
        actor_id = ActorID.of_creation_task(task_id)
        packed_args, packed_kwargs, holds, stores = self._serialize_args(
            args, kwargs, f"{class_name}.__init__", context)
        holds = self._hold_args(holds, stores)
        creation = TaskSpec(task_id=task_id.binary(),
                            job_id=self.current_job(), namespace=context.namespace,
                            name=f"{class_name}.__init__", function_id=function_id,
                            args=packed_args, kwargs=packed_kwargs, num_returns=0, return_ids=(),
                            caller=self.address, resources=resources, strategy=strategy,
                            parent_task_id=context.task_id.binary(), depth=context.depth + 1,
                            runtime_env=runtime_env)
        actor = ActorSpec(
            actor_id=actor_id.hex(), class_name=class_name, name=options.get("name"),
            namespace=namespace, get_if_exists=bool(options.get("get_if_exists")),
            owner_address=self.address, detached=options.get("lifetime") == "detached",
            max_restarts=options.get("max_restarts") or 0,
            max_task_retries=options.get("max_task_retries") or 0,
            resources=resources, strategy=strategy, is_async=is_async,
            method_meta=method_meta, creation=creation,
            max_concurrency=options.get("max_concurrency"),
            max_pending_calls=-1 if options.get("max_pending_calls") is None
            else options["max_pending_calls"],
            concurrency_groups=dict(options.get("concurrency_groups") or {}))
        return actor, holds

    def actor_handle_ref(self, actor_id: str, owner: str) -> tuple[ObjectRef, bool]:
        """A ref to the actor's handle reference, and whether this process
        must register as a borrower of it (it is new here and not owned)."""
        object_id = actor_handle_id(actor_id)
        is_new = owner != self.address and not self.knows(object_id)
        return ObjectRef(object_id, owner, self), is_new

    async def register_borrows(self, refs: list) -> None:
        await self.references._register_borrows(refs)

    async def register_actor(self, actor: ActorSpec, holds: list) -> ActorInfo | None:
        # Until the GCS hears of it, the state API shows the actor as
        # DEPENDENCIES_UNREADY from this record of its constructor call.
        self.task_events.task_state(actor.creation, "PENDING_ARGS_AVAIL", info=True,
                                    actor_id=actor.actor_id)
        return await self.actor_submitter.register(actor, holds)

    async def kill_actor(self, actor_id: str, no_restart: bool) -> None:
        await self.actor_submitter.kill_actor(actor_id, no_restart)

    # ------------------------------------------------------ placement groups

    def prepare_placement_group(self, *, bundles: list, strategy: str, name: str,
                                namespace: str, detached: bool) -> PlacementGroupSpec:
        """A new group's spec, its id derived from where it was created."""
        task_id = self._next_child_id(self.current_context())
        return PlacementGroupSpec(
            pg_id=PlacementGroupID.of_creation(task_id).hex(), name=name, namespace=namespace,
            bundles=[dict(bundle) for bundle in bundles], strategy=strategy,
            detached=detached, owner_address=self.address)

    # ------------------------------------------------------------ get/wait

    async def get_async(self, refs: list, timeout: float | None, single: bool = False):
        return await self.getter.get(refs, timeout, single)

    async def wait_async(self, refs: list, num_returns: int, timeout: float | None,
                         fetch_local: bool) -> tuple[list, list]:
        return await self.getter.wait(refs, num_returns, timeout, fetch_local)

    # --------------------------------------------------------------- cancel

    async def cancel_async(self, ref: ObjectRef, force: bool, recursive: bool) -> None:
        if ref._owner != self.address:
            # A borrowed ref: only its owner knows the task, so the owner
            # cancels it (as Ray's RemoteCancelTask). An owner that is gone
            # took its tasks with it: nothing is left to cancel.
            try:
                await self.endpoint.call(ref._owner, "cancel_remote_task", ref.binary(),
                                         force, recursive)
            except PeerDisconnected:
                pass
            return
        await self._cancel_owned(ref.task_id(), force, recursive)

    async def handle_cancel_remote_task(self, conn, object_id: bytes, force: bool,
                                        recursive: bool) -> None:
        """A borrower cancels the task that creates an object this process owns."""
        await self._cancel_owned(ObjectID(object_id).task_id(), force, recursive)

    async def _cancel_owned(self, task_id, force: bool, recursive: bool) -> None:
        task = self.task_manager.get(task_id)
        if task is None or task.done:
            return
        if task.spec.actor_id is not None and force:
            raise ValueError("force=True is not supported for actor tasks; "
                             "use tray.kill() to stop the actor")
        task.cancelled = True
        self.tracer.record(self.name, "task_cancel", task=task.spec.task_id, force=force)
        error = exceptions.TaskCancelledError(
            f"task {task.spec.name} ({task.spec.task_id.hex()}) was cancelled")
        if task.spec.actor_id is not None:
            # An actor call fails here at once, and the actor is told where
            # the call was sent (after it, on the same connection): a call
            # waiting there for its turn is skipped, an async method's
            # asyncio task is cancelled, and a synchronous method runs on
            # (Ray's rules for actor tasks).
            address = self.actor_submitter.address_of_call(task)
            self.task_manager.fail(task, error)
            if address is not None:
                await self.endpoint.notify(address, "cancel_task", task.spec.task_id, False,
                                           recursive)
            return
        if task.pushed_to is None:
            self.normal_submitter.remove_queued(task)
            self.task_manager.fail(task, error)
            return
        await self.endpoint.notify(task.pushed_to, "cancel_task", task.spec.task_id, force,
                                   recursive)
        if not force:
            self.bridge.start_soon(self._cancel_again, task, task.pushed_to, recursive)

    async def _cancel_again(self, task: PendingTask, worker: str, recursive: bool) -> None:
        """A cancel that reaches the worker before the task has started there
        finds nothing to cancel; send it again until the task ends (Ray's
        owner retries a cancel likewise). Bounded by the task's life."""
        while True:
            await trio.sleep(CANCEL_RETRY_PERIOD_S)
            if task.done or task.pushed_to != worker:
                return
            await self.endpoint.notify(worker, "cancel_task", task.spec.task_id, False,
                                       recursive)

    async def _cancel_children(self, task_id: bytes, force: bool) -> None:
        """Cancel the tasks that the task ``task_id`` (running here) submitted."""
        for child in list(self.task_manager.tasks.values()):
            if child.spec.parent_task_id == task_id:
                ref = ObjectRef(ObjectID(child.spec.return_ids[0]), self.address, self) \
                    if child.spec.return_ids else None
                if ref is not None:
                    await self.cancel_async(ref, force, True)

    # ------------------------------------------------------- the state API

    def handle_object_report(self, conn) -> dict:
        """The objects this process references (``tray.util.state.list_objects``)."""
        return object_report(references=self.references, task_manager=self.task_manager,
                             store=self.env.object_store, node_id=self.node_id,
                             mode=self.mode, worker_id=self.worker_id, address=self.address)

    async def handle_flush_task_events(self, conn) -> None:
        """Send the buffered task events now (the state API, before a query)."""
        await self.task_events.flush()

    # ---------------------------------------------------------- membership

    def handle_node_died(self, conn, node_id: str, manager: str) -> None:
        """The GCS declared a node dead: stop waiting for anything on it
        (work running there is retried as if its workers died) and forget
        the copies of objects it held."""
        self.tracer.record(self.name, "node_died", node=node_id)
        dropped = {manager}
        dropped |= self.normal_submitter.node_died(node_id)
        dropped |= self.actor_submitter.addresses_on(node_id)
        for address in sorted(dropped):
            self.endpoint.drop(address)
        self.references.forget_node(node_id)
