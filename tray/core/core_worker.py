"""The core worker: the runtime inside every driver and worker process.

Owner side (the process that called ``.remote()`` or ``put``):
  * builds task specs with deterministic ids, serializes arguments (small
    ones inline, large ones into the node's store) and returns refs at once;
  * keeps the reference table: for each object, local refs, refs held by
    submitted tasks, refs held inside other objects (``contained``) and the
    processes borrowing it; when all reach zero every copy is freed;
  * waits for a task's dependencies, leases workers per scheduling class
    (following spillback), pushes tasks to leased workers, keeps a lease
    while it has queued tasks of that class, retries tasks whose worker died;
  * keeps the lineage (spec) of finished tasks whose results live in node
    stores, and re-runs one when every copy of a result is lost;
  * submits actor calls stamped with per-caller sequence numbers.

Executor side (a worker running tasks):
  * resolves arguments (from the owner's reply or the node's store, pulling
    from other nodes through its node manager), runs the function inline in
    its trio task (blocking ``tray.get`` inside suspends through greenback),
    stores results (small inline in the reply, large in the node's store);
  * hosts at most one actor, running calls from each caller in sequence
    order, and answers a call re-sent after a broken connection with the
    first execution's reply;
  * lends its CPU back to its node while a task waits in get/wait.

Nothing here knows whether it runs in a real process or in the simulator."""

from __future__ import annotations

import contextvars
import hashlib
import inspect
import logging
import traceback
from collections import deque
from dataclasses import dataclass, field

import cloudpickle
import greenback
import trio

from .. import exceptions
from .context import current_worker
from .ids import ActorID, JobID, ObjectID, TaskID
from .object_ref import ObjectRef, _new_borrows
from .rpc import Endpoint, PeerDisconnected
from .scheduling import Strategy
from .serialization import (
    KIND_ERROR,
    SerializedObject,
    deserialize,
    serialize,
    serialize_error,
)

logger = logging.getLogger("tray.worker")

DRIVER, WORKER = "driver", "worker"


# =============================================================== task context

@dataclass
class TaskContext:
    task_id: TaskID
    actor_id: ActorID | None = None
    gpu_ids: list = field(default_factory=list)
    name: str = ""
    job_id: int = 0
    namespace: str = ""
    children: int = 0
    puts: int = 0

    def next_child_id(self) -> TaskID:
        self.children += 1
        return TaskID.for_child(self.task_id, self.children)

    def next_put_id(self) -> ObjectID:
        self.puts += 1
        return ObjectID.for_put(self.task_id, self.puts)


current_task: contextvars.ContextVar = contextvars.ContextVar("tray_current_task")


# ============================================================== owner tables

@dataclass
class RefEntry:
    owner: str
    owned: bool
    local: int = 0
    submitted: int = 0
    contained: int = 0
    borrowers: dict = field(default_factory=dict)  # owner side: address -> count
    # The value: inline (value or error) or in node stores.
    ready: bool = False
    inline: SerializedObject | None = None
    locations: list = field(default_factory=list)  # [(node_id, node manager address)]
    contained_refs: list = field(default_factory=list)  # [(oid bytes, owner)] inside the value
    event: trio.Event | None = None

    def total(self) -> int:
        return self.local + self.submitted + self.contained + len(self.borrowers)


@dataclass
class TaskSpec:
    task_id: bytes
    job_id: int
    name: str
    function_id: str
    args: list  # [("v", SerializedObject) | ("r", oid bytes, owner)]
    kwargs: dict  # name -> same as args
    num_returns: int
    return_ids: list  # [oid bytes]
    caller: str
    resources: dict
    strategy: Strategy
    max_retries: int = 0
    retry_exceptions: object = False
    attempt: int = 0
    parent_task_id: bytes = b""
    namespace: str = ""
    actor_id: str | None = None
    method: str | None = None
    seq: int = 0
    floor: int = 0
    actor_creation: dict | None = None


@dataclass
class PendingTask:
    spec: TaskSpec
    retries_left: int
    arg_refs: list  # oids whose submitted count this task holds
    cancelled: bool = False
    pushed_to: str | None = None  # worker address while running
    done: bool = False


@dataclass
class LeaseState:
    lease_id: int
    worker_address: str
    node_manager: str
    node_id: str
    gpu_ids: list
    busy: bool = False


@dataclass
class ClassQueue:
    tasks: deque = field(default_factory=deque)
    leases: list = field(default_factory=list)
    pending_requests: int = 0
    warned: bool = False


@dataclass
class ActorState:
    """Caller-side view of an actor."""
    actor_id: str
    next_seq: int = 0
    unfinished: dict = field(default_factory=dict)  # seq -> True
    info: dict | None = None
    seen_incarnation: int = 0
    refresh: trio.Event | None = None


@dataclass
class CallerQueue:
    """Executor-side ordering state for one caller of the hosted actor:
    calls that arrived ahead of their turn wait on an event of their own,
    so each step wakes exactly the next call."""
    next_seq: int = 0
    waiters: dict = field(default_factory=dict)  # seq -> trio.Event
    # Calls that arrived here, and their replies, kept until the caller's
    # floor passes them: a call re-sent after a broken connection gets the
    # first one's reply instead of running twice.
    started: dict = field(default_factory=dict)  # seq -> trio.Event (set when done)
    replies: dict = field(default_factory=dict)  # seq -> reply


# ================================================================ the worker

class CoreWorker:
    def __init__(self, env, mode: str, nursery: trio.Nursery, *, worker_id: str = "",
                 spawn_from_outside=None) -> None:
        self.env = env
        self.config = env.config
        self.mode = mode
        self.address = env.address
        self.node_id: str = env.node_id
        self.worker_id = worker_id
        self.nursery = nursery
        self.tracer = env.tracer
        self.store = env.object_store
        self.name = f"{mode}:{(worker_id or env.address)[-8:]}"
        # spawn_from_outside(fn) runs fn in trio context soon; the driver's
        # runtime supplies it for calls made from the user's thread.
        self._spawn_from_outside = spawn_from_outside
        self.endpoint = Endpoint(env, {name[len("handle_"):]: getattr(self, name)
                                       for name in dir(self) if name.startswith("handle_")},
                                 nursery)
        self.endpoint.on_peer_closed = self._peer_gone
        self.job_id = JobID.from_int(0)
        self.driver_context: TaskContext | None = None
        self.refs: dict[ObjectID, RefEntry] = {}
        self.tasks: dict[TaskID, PendingTask] = {}
        # Finished tasks whose results live in node stores, kept while any of
        # their results is referenced: what re-creates a lost result.
        self.lineage: dict[TaskID, PendingTask] = {}
        self.queues: dict[tuple, ClassQueue] = {}
        self.actors: dict[str, ActorState] = {}
        self._exported: dict[str, trio.Event | None] = {}
        self._pending_exports: dict[str, bytes] = {}
        self._functions: dict[str, object] = {}
        self._outbox: deque = deque()
        self._outbox_scheduled = False
        self._running: dict[bytes, trio.CancelScope] = {}
        # Executor-side actor state.
        self.actor_id: str | None = None
        self.actor_instance = None
        self.actor_gpu_ids: list = []
        self.actor_slots = None
        self.actor_is_async = False
        self.callers: dict[str, CallerQueue] = {}
        self.shutting_down = False
        # The local backend's driver runs its loop in a thread of its own;
        # the simulator's runs in the user's thread.
        self.loop_in_other_thread = False

    # ------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        await self.endpoint.serve()
        if self.mode == DRIVER:
            job = await self.gcs_call("register_job", self.address)
            self.job_id = JobID.from_int(job)
            self.driver_context = TaskContext(TaskID.for_driver(self.job_id), name="driver")
        else:
            await self.endpoint.call(self.env.node_manager_address, "register_worker",
                                     self.worker_id, self.address)

    async def gcs_call(self, method: str, *args):
        """Call the GCS, riding out a GCS restart: while it is unreachable
        the call is retried for up to ``gcs_reconnect_timeout_s``."""
        deadline = trio.current_time() + self.config.gcs_reconnect_timeout_s
        while True:
            try:
                return await self.endpoint.call(self.env.gcs_address, method, *args)
            except PeerDisconnected:
                if trio.current_time() >= deadline:
                    raise exceptions.TrayError(
                        f"the GCS at {self.env.gcs_address} has been unreachable for "
                        f"{self.config.gcs_reconnect_timeout_s} s (during {method})") from None
                await trio.sleep(self.config.heartbeat_period_s)

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
        """True when called from the driver's own thread, outside trio."""
        return current_worker.get(None) is None

    def spawn(self, async_fn, *args) -> None:
        """Start ``async_fn`` as a task of this process, from anywhere."""
        if self.in_user_thread():
            self._spawn_from_outside(lambda: self.nursery.start_soon(self._in_context,
                                                                     async_fn, *args))
        else:
            self.nursery.start_soon(self._in_context, async_fn, *args)

    async def _in_context(self, async_fn, *args) -> None:
        current_worker.set(self)
        await async_fn(*args)

    # ------------------------------------------------- reference counting

    def add_local_ref(self, object_id: ObjectID, owner: str) -> None:
        entry = self.refs.get(object_id)
        if entry is None:
            entry = self.refs[object_id] = RefEntry(owner=owner, owned=owner == self.address)
        entry.local += 1

    def remove_local_ref(self, object_id: ObjectID) -> None:
        if self.loop_in_other_thread and self.in_user_thread():
            # A ref dropped in the user's thread while the loop runs in its
            # own: count it down there.
            try:
                self._spawn_from_outside(lambda: self._release_local_ref(object_id))
            except Exception:  # the loop has ended
                pass
            return
        self._release_local_ref(object_id)

    def _release_local_ref(self, object_id: ObjectID) -> None:
        entry = self.refs.get(object_id)
        if entry is None:
            return
        entry.local -= 1
        assert entry.local >= 0, object_id
        self._maybe_release(object_id, entry)

    def _maybe_release(self, object_id: ObjectID, entry: RefEntry) -> None:
        if entry.total() > 0 or self.refs.get(object_id) is not entry:
            return
        if entry.owned and not entry.ready and object_id.task_id() in self.tasks:
            return  # the task is still running; its reply releases the object
        del self.refs[object_id]
        if entry.owned:
            self._forget_lineage(object_id.task_id())
            self.tracer.record(self.name, "object_freed", object=object_id)
            by_node: dict[str, list] = {}
            for _node_id, manager in entry.locations:
                by_node.setdefault(manager, []).append(object_id.binary())
            for manager, ids in sorted(by_node.items()):
                self._send_later(manager, "free_objects", ids)
            self._release_contained(entry.contained_refs)
        else:
            self._send_later(entry.owner, "remove_borrower", object_id.binary(), self.address)

    def _forget_lineage(self, task_id: TaskID) -> None:
        task = self.lineage.get(task_id)
        if task is not None and not any(ObjectID(oid) in self.refs
                                        for oid in task.spec.return_ids):
            del self.lineage[task_id]

    def _release_contained(self, contained: list) -> None:
        for oid_bytes, _owner in contained:
            oid = ObjectID(oid_bytes)
            entry = self.refs.get(oid)
            if entry is not None:
                entry.contained -= 1
                self._maybe_release(oid, entry)

    def _hold_contained(self, contained: list) -> None:
        for oid_bytes, owner in contained:
            oid = ObjectID(oid_bytes)
            entry = self.refs.get(oid)
            if entry is None:
                entry = self.refs[oid] = RefEntry(owner=owner, owned=owner == self.address)
            entry.contained += 1

    def _send_later(self, address: str, method: str, *args) -> None:
        """Queue a one-way message; safe from ``__del__`` and from outside trio."""
        self._outbox.append((address, method, args))
        if self._outbox_scheduled or self.shutting_down:
            return
        self._outbox_scheduled = True
        if self.in_user_thread():
            try:
                self._spawn_from_outside(self._schedule_flush)
            except Exception:  # the run has ended
                self._outbox_scheduled = False
        else:
            self._schedule_flush()

    def _schedule_flush(self) -> None:
        try:
            self.nursery.start_soon(self._in_context, self._flush_outbox)
        except RuntimeError:  # the process is shutting down
            self._outbox_scheduled = False

    async def _flush_outbox(self) -> None:
        try:
            while self._outbox:
                address, method, args = self._outbox.popleft()
                if address == self.address:
                    self.endpoint.handlers[method](None, *args)
                else:
                    await self.endpoint.notify(address, method, *args)
        finally:
            self._outbox_scheduled = False

    def handle_add_borrower(self, conn, object_id: bytes, borrower: str) -> bool:
        entry = self.refs.get(ObjectID(object_id))
        if entry is None or not entry.owned:
            return False
        entry.borrowers[borrower] = entry.borrowers.get(borrower, 0) + 1
        return True

    def handle_remove_borrower(self, conn, object_id: bytes, borrower: str) -> None:
        oid = ObjectID(object_id)
        entry = self.refs.get(oid)
        if entry is None or borrower not in entry.borrowers:
            return
        entry.borrowers[borrower] -= 1
        if entry.borrowers[borrower] <= 0:
            del entry.borrowers[borrower]
        self._maybe_release(oid, entry)

    def handle_held_leases(self, conn, node_manager: str, lease_ids: list) -> list:
        """Which of these leases from ``node_manager`` this process holds."""
        held = {lease.lease_id for queue in self.queues.values() for lease in queue.leases
                if lease.node_manager == node_manager}
        return [lease_id for lease_id in lease_ids if lease_id in held]

    def _peer_gone(self, address: str) -> None:
        """A process died: it borrows nothing any more."""
        for object_id, entry in list(self.refs.items()):
            if entry.owned and address in entry.borrowers:
                del entry.borrowers[address]
                self._maybe_release(object_id, entry)

    def register_borrow_later(self, object_id: ObjectID, owner: str) -> None:
        self._send_later(owner, "add_borrower_oneway", object_id.binary(), self.address)

    def handle_add_borrower_oneway(self, conn, object_id: bytes, borrower: str) -> None:
        self.handle_add_borrower(conn, object_id, borrower)

    async def _register_borrows(self, refs: list) -> None:
        async def register(ref: ObjectRef) -> None:
            try:
                await self.endpoint.call(ref._owner, "add_borrower", ref.binary(), self.address)
            except PeerDisconnected:
                pass  # the owner died: get() on this ref reports OwnerDiedError
        if len(refs) == 1:
            await register(refs[0])
            return
        async with trio.open_nursery() as nursery:
            for ref in refs:
                nursery.start_soon(register, ref)

    async def deserialize(self, serialized: SerializedObject):
        """Deserialize, registering this process as borrower of every new
        ref inside before the value reaches user code."""
        borrows: list = []
        token = _new_borrows.set(borrows)
        try:
            value = deserialize(serialized)
        finally:
            _new_borrows.reset(token)
        if borrows:
            await self._register_borrows(borrows)
        return value

    def stats(self) -> dict:
        return {"refs": len(self.refs), "owned": sum(1 for e in self.refs.values() if e.owned),
                "tasks": len(self.tasks), "actors": len(self.actors),
                "outbox": len(self._outbox)}

    # ------------------------------------------------------------------ put

    def put(self, value) -> ObjectRef:
        if isinstance(value, ObjectRef):
            raise TypeError("Calling put() on an ObjectRef is not allowed; "
                            "pass the ObjectRef itself instead")
        serialized = serialize(value)
        object_id = self.current_context().next_put_id()
        ref = ObjectRef(object_id, self.address, self)
        entry = self.refs[object_id]
        self._store_value(object_id, entry, serialized)
        self.tracer.record(self.name, "put", object=object_id, size=serialized.size_bytes())
        return ref

    def _store_value(self, object_id: ObjectID, entry: RefEntry,
                     serialized: SerializedObject) -> None:
        entry.contained_refs = list(serialized.contained)
        self._hold_contained(entry.contained_refs)
        if serialized.size_bytes() <= self.config.inline_object_max_bytes:
            entry.inline = serialized
        else:
            self.store.put(object_id.binary(), serialized.data, serialized.buffers,
                           owner=self.address)
            entry.locations = [(self.node_id, self.env.node_manager_address)]
        self._mark_ready(entry)

    def _mark_ready(self, entry: RefEntry) -> None:
        entry.ready = True
        if entry.event is not None:
            entry.event.set()
            entry.event = None

    # --------------------------------------------------------- submission

    def export_function(self, function_id: str, blob: bytes) -> None:
        """Note a function to export; the first task that uses it uploads it
        to the GCS function table (once per process)."""
        if function_id not in self._exported:
            self._exported[function_id] = None
            self._pending_exports[function_id] = blob

    async def _ensure_exported(self, function_id: str) -> None:
        blob = self._pending_exports.pop(function_id, None)
        if blob is not None:
            event = self._exported[function_id] = trio.Event()
            await self.gcs_call("kv_put", "fn:" + function_id, blob,
                                     False)
            self._exported[function_id] = None
            event.set()
        event = self._exported.get(function_id)
        if event is not None:
            await event.wait()

    def _serialize_args(self, args: tuple, kwargs: dict, name: str) -> tuple[list, dict, list]:
        """Pack arguments; returns them with the oids whose ``submitted``
        count now holds them (released when the task finishes)."""
        holds: list = []

        def hold(oid: ObjectID, owner: str) -> None:
            entry = self.refs.get(oid)
            if entry is None:
                entry = self.refs[oid] = RefEntry(owner=owner, owned=owner == self.address)
            entry.submitted += 1
            holds.append(oid)

        def one(value, label: str):
            if isinstance(value, ObjectRef):
                hold(value.object_id(), value._owner)
                return ("r", value.binary(), value._owner)
            try:
                serialized = serialize(value)
            except TypeError as error:
                raise TypeError(f"Could not serialize the argument {label} of {name}: "
                                f"{error}") from error.__cause__
            if serialized.size_bytes() > self.config.inline_object_max_bytes:
                object_id = self.current_context().next_put_id()
                entry = self.refs[object_id] = RefEntry(owner=self.address, owned=True)
                hold(object_id, self.address)
                self._store_value(object_id, entry, serialized)
                return ("r", object_id.binary(), self.address)
            for oid_bytes, owner in serialized.contained:
                hold(ObjectID(oid_bytes), owner)
            return ("v", serialized)

        try:
            packed_args = [one(value, f"#{i} ({_short(value)})") for i, value in enumerate(args)]
            packed_kwargs = {key: one(value, f"{key!r} ({_short(value)})")
                             for key, value in kwargs.items()}
        except BaseException:
            self._release_holds(holds)
            raise
        return packed_args, packed_kwargs, holds

    def submit_task(self, *, name: str, function_id: str, args: tuple, kwargs: dict,
                    num_returns: int, resources: dict, strategy: Strategy, max_retries: int,
                    retry_exceptions, actor: ActorState | None = None, method: str | None = None,
                    max_task_retries: int = 0) -> list[ObjectRef]:
        """Build a task and start submitting it; returns its refs at once."""
        context = self.current_context()
        task_id = context.next_child_id()
        packed_args, packed_kwargs, holds = self._serialize_args(args, kwargs, name)
        return_ids = [ObjectID.for_return(task_id, i + 1) for i in range(num_returns)]
        spec = TaskSpec(task_id=task_id.binary(), job_id=self.current_job(),
                        namespace=context.namespace,
                        name=name, function_id=function_id, args=packed_args,
                        kwargs=packed_kwargs, num_returns=num_returns,
                        return_ids=[oid.binary() for oid in return_ids], caller=self.address,
                        resources=resources, strategy=strategy, max_retries=max_retries,
                        retry_exceptions=retry_exceptions, parent_task_id=context.task_id.binary())
        if actor is not None:
            spec.actor_id = actor.actor_id
            spec.method = method
            spec.seq = actor.next_seq
            actor.next_seq += 1
            actor.unfinished[spec.seq] = True
        task = PendingTask(spec, max_task_retries if actor is not None else max_retries, holds)
        self.tasks[task_id] = task
        refs = [ObjectRef(oid, self.address, self) for oid in return_ids]
        self.tracer.record(self.name, "task_submitted", task=task_id, name=name)
        if actor is not None:
            self.spawn(self._submit_actor_call, task, actor)
        else:
            self.spawn(self._submit_task, task)
        return refs

    async def _resolve_dependencies(self, task: PendingTask) -> SerializedObject | None:
        """Wait until every ref argument exists; inline the small ones.
        Returns the error of a failed dependency, if any."""
        spec = task.spec

        async def resolve(arg):
            if arg[0] != "r":
                return arg, None
            status = await self._object_status(ObjectID(arg[1]), arg[2])
            if status[0] == "error":
                return arg, status[1]
            if status[0] == "inline" and status[1].size_bytes() <= \
                    self.config.inline_object_max_bytes:
                return ("v", status[1]), None
            return arg, None

        failure = None
        for i, arg in enumerate(spec.args):
            spec.args[i], error = await resolve(arg)
            failure = failure or error
        for key, arg in spec.kwargs.items():
            spec.kwargs[key], error = await resolve(arg)
            failure = failure or error
        return failure

    async def _submit_task(self, task: PendingTask) -> None:
        try:
            await self._ensure_exported(task.spec.function_id)
        except exceptions.TrayError as error:  # the GCS stayed unreachable
            self._finish_task(task, [("error", serialize_error(error))] * task.spec.num_returns)
            return
        failure = await self._resolve_dependencies(task)
        if failure is not None:
            self._finish_task(task, [("error", failure)] * task.spec.num_returns)
            return
        if task.cancelled:
            return
        self._enqueue(task)

    def _class_key(self, spec: TaskSpec) -> tuple:
        return (tuple(sorted(spec.resources.items())), spec.strategy)

    def _enqueue(self, task: PendingTask) -> None:
        key = self._class_key(task.spec)
        queue = self.queues.setdefault(key, ClassQueue())
        queue.tasks.append(task)
        self._pump(key, queue)

    def _pump(self, key: tuple, queue: ClassQueue) -> None:
        for lease in queue.leases:
            if not queue.tasks:
                break
            if not lease.busy:
                lease.busy = True
                self.nursery.start_soon(self._push, key, queue, lease, queue.tasks.popleft())
        wanted = len(queue.tasks) - queue.pending_requests
        while wanted > 0 and queue.pending_requests < self.config.pending_lease_requests_max:
            queue.pending_requests += 1
            wanted -= 1
            self.nursery.start_soon(self._request_lease, key, queue)
        if not queue.tasks:
            for lease in list(queue.leases):
                if not lease.busy:
                    self._return_lease(queue, lease, worker_ok=True)
            if not queue.leases and not queue.pending_requests:
                self.queues.pop(key, None)

    def _return_lease(self, queue: ClassQueue, lease: LeaseState, worker_ok: bool) -> None:
        queue.leases.remove(lease)
        self._send_later(lease.node_manager, "return_lease", lease.lease_id, worker_ok)

    async def _request_lease(self, key: tuple, queue: ClassQueue) -> None:
        manager, hops = self.env.node_manager_address, 0
        try:
            while queue.tasks:
                spec = queue.tasks[0].spec
                request = {"resources": spec.resources, "strategy": spec.strategy,
                           "owner": self.address, "hops": hops}
                try:
                    reply = await self.endpoint.call(manager, "request_lease", request)
                except PeerDisconnected:
                    manager, hops = self.env.node_manager_address, 0
                    await trio.sleep(self.config.heartbeat_period_s)
                    continue
                except exceptions.TrayError as error:  # the node cannot run workers
                    self._fail_queue(queue, exceptions.TaskError(
                        spec.name, f"the task cannot be scheduled: {error}", None))
                    break
                if "spillback" in reply:
                    manager, hops = reply["spillback"], hops + 1
                    continue
                if "infeasible" in reply:
                    if not queue.warned:
                        queue.warned = True
                        logger.warning("task %s is infeasible and stays pending: %s",
                                       spec.name, reply["infeasible"])
                        self.tracer.record(self.name, "infeasible", task=spec.task_id)
                    if spec.strategy.kind == "NODE_AFFINITY" and not spec.strategy.soft and \
                            "not alive" in reply["infeasible"]:
                        self._fail_queue(queue, exceptions.TaskError(
                            spec.name, f"the task cannot be scheduled: {reply['infeasible']}",
                            None))
                        break
                    manager, hops = self.env.node_manager_address, 0
                    await trio.sleep(self.config.infeasible_retry_period_s)
                    continue
                lease = LeaseState(reply["lease_id"], reply["worker_address"], manager,
                                   reply["node_id"], reply["gpu_ids"])
                queue.leases.append(lease)
                break
        except BaseException:
            queue.pending_requests -= 1  # cancelled: the process is going away
            raise
        queue.pending_requests -= 1
        self._pump(key, queue)

    def _fail_queue(self, queue: ClassQueue, error: Exception) -> None:
        while queue.tasks:
            task = queue.tasks.popleft()
            self._finish_task(task, [("error", serialize_error(error))] * task.spec.num_returns)

    async def _push(self, key: tuple, queue: ClassQueue, lease: LeaseState,
                    task: PendingTask) -> None:
        spec = task.spec
        task.pushed_to = lease.worker_address
        try:
            reply = await self.endpoint.call(lease.worker_address, "push_task", spec,
                                             lease.gpu_ids)
        except PeerDisconnected:
            task.pushed_to = None
            queue.leases.remove(lease)
            # Dead, or only cut off from us: either way the worker is done
            # for (its node manager kills it if it lives) and the task retried.
            self._send_later(lease.node_manager, "return_lease", lease.lease_id, False)
            self._task_worker_died(task, lease)
            self._pump(key, queue)
            return
        task.pushed_to = None
        lease.busy = False
        if spec.strategy.kind == "SPREAD":
            # Each SPREAD task takes a fresh lease, so the policy spreads it.
            self._return_lease(queue, lease, worker_ok=True)
        results, app_error = reply
        if app_error and not task.cancelled and self._should_retry_exception(task, results):
            _spend_retry(task)
            self.tracer.record(self.name, "task_retry", task=spec.task_id, attempt=spec.attempt,
                               reason="exception")
            queue.tasks.append(task)
            self._pump(key, queue)
            return
        self._pump(key, queue)  # return or reuse the lease before waking getters
        self._finish_task(task, results)

    def _should_retry_exception(self, task: PendingTask, results: list) -> bool:
        policy = task.spec.retry_exceptions
        if not policy or task.retries_left == 0:
            return False
        if policy is True:
            return True
        try:
            error = deserialize(results[0][1])
        except Exception:
            return False
        cause = getattr(error, "cause", None)
        return isinstance(cause, tuple(policy))

    def _task_worker_died(self, task: PendingTask, lease: LeaseState) -> None:
        spec = task.spec
        if task.cancelled:
            error = exceptions.TaskCancelledError(f"task {spec.name} ({spec.task_id.hex()}) "
                                                  "was cancelled")
        elif task.retries_left != 0:
            _spend_retry(task)
            self.tracer.record(self.name, "task_retry", task=spec.task_id, attempt=spec.attempt,
                               reason="worker died")
            self._enqueue(task)
            return
        else:
            error = exceptions.WorkerCrashedError(
                f"the worker running task {spec.name} ({spec.task_id.hex()}) on node "
                f"{lease.node_id} died, and its retries are used up "
                f"(max_retries={spec.max_retries}, attempts={spec.attempt + 1})")
        self._finish_task(task, [("error", serialize_error(error))] * spec.num_returns)

    def _finish_task(self, task: PendingTask, results: list) -> None:
        """Record a task's outcome: one (kind, payload) per return."""
        if task.done:
            return
        task.done = True
        spec = task.spec
        task_id = TaskID(spec.task_id)
        self.tasks.pop(task_id, None)
        if spec.actor_id is None and any(kind == "store" for kind, _ in results):
            self.lineage[task_id] = task
        for oid_bytes, (kind, payload) in zip(spec.return_ids, results, strict=True):
            oid = ObjectID(oid_bytes)
            entry = self.refs.get(oid)
            if entry is None:
                # Nobody holds the result any more; drop what the worker stored.
                if kind == "store":
                    for _node_id, manager in payload[0]:
                        self._send_later(manager, "free_objects", [oid_bytes])
                    self._balance_contained_borrows(payload[1])
                continue
            if kind == "store":
                entry.locations = list(payload[0])
                self._adopt_contained(entry, payload[1])
            elif kind == "inline":
                entry.inline = payload
                self._adopt_contained(entry, payload.contained)
            else:
                entry.inline = payload
            self._mark_ready(entry)
            self._maybe_release(oid, entry)
        for oid in task.arg_refs:
            entry = self.refs.get(oid)
            if entry is not None:
                entry.submitted -= 1
                self._maybe_release(oid, entry)
        self._forget_lineage(task_id)
        self.tracer.record(self.name, "task_finished", task=task_id,
                           ok=all(kind != "error" for kind, _ in results))

    def _adopt_contained(self, entry: RefEntry, contained: list) -> None:
        """The executor made this process a borrower of each ref inside a
        returned value; hold them while the returned object lives."""
        entry.contained_refs = list(contained)
        for oid_bytes, owner in contained:
            oid = ObjectID(oid_bytes)
            existing = self.refs.get(oid)
            if existing is None:
                self.refs[oid] = RefEntry(owner=owner, owned=owner == self.address, contained=1)
                continue
            existing.contained += 1
            if owner != self.address:
                # Already registered as a borrower: undo the executor's extra registration.
                self._send_later(owner, "remove_borrower", oid_bytes, self.address)
            else:
                self.handle_remove_borrower(None, oid_bytes, self.address)

    def _balance_contained_borrows(self, contained: list) -> None:
        for oid_bytes, owner in contained:
            self._send_later(owner, "remove_borrower", oid_bytes, self.address)

    # ----------------------------------------------------- object status

    async def _object_status(self, object_id: ObjectID, owner: str) -> tuple:
        """("inline", SerializedObject) | ("store", locations) | ("error", SerializedObject)."""
        if owner == self.address:
            entry = self.refs.get(object_id)
            if entry is None:
                error = exceptions.ObjectLostError(
                    f"object {object_id.hex()} was freed: no reference to it remained")
                return ("error", serialize_error(error))
            while not entry.ready:
                if entry.event is None:
                    entry.event = trio.Event()
                await entry.event.wait()
            if entry.inline is not None:
                kind = "error" if entry.inline.kind == KIND_ERROR else "inline"
                return (kind, entry.inline)
            return ("store", list(entry.locations))
        try:
            return await self.endpoint.call(owner, "object_status", object_id.binary())
        except PeerDisconnected:
            error = exceptions.OwnerDiedError(
                f"the owner of object {object_id.hex()} ({owner}) died, so the object "
                "cannot be retrieved")
            return ("error", serialize_error(error))

    def handle_add_location(self, conn, object_id: bytes, node_id: str, manager: str) -> None:
        entry = self.refs.get(ObjectID(object_id))
        if entry is None or not entry.owned:
            self._send_later(manager, "free_objects", [object_id])  # freed meanwhile
            return
        if (node_id, manager) not in entry.locations:
            entry.locations.append((node_id, manager))

    async def handle_object_status(self, conn, object_id: bytes) -> tuple:
        return await self._object_status(ObjectID(object_id), self.address)

    async def _fetch(self, object_id: ObjectID, owner: str) -> SerializedObject:
        key = object_id.binary()
        while True:
            status = await self._object_status(object_id, owner)
            if status[0] != "store":
                return status[1]
            entry = self.store.get(key)
            if entry is None:
                ok = await self.endpoint.call(self.env.node_manager_address, "pull_object", key,
                                              status[1], owner)
                entry = self.store.get(key) if ok else None
            if entry is not None:
                data, buffers = entry
                return SerializedObject(data, buffers)
            # Every known copy is gone: the owner re-creates the object from
            # its lineage (then the loop fetches it again) or says why not.
            failure = await self._recover(object_id, owner, status[1])
            if failure is not None:
                return failure

    async def _recover(self, object_id: ObjectID, owner: str,
                       lost: list) -> SerializedObject | None:
        if owner == self.address:
            return self.handle_recover_object(None, object_id.binary(), lost)
        try:
            return await self.endpoint.call(owner, "recover_object", object_id.binary(), lost)
        except PeerDisconnected:
            return serialize_error(exceptions.OwnerDiedError(
                f"the owner of object {object_id.hex()} ({owner}) died, so the object "
                "cannot be retrieved"))

    def handle_recover_object(self, conn, object_id: bytes, lost: list) -> SerializedObject | None:
        """The copies of an object this process owns at ``lost`` could not be
        read. Returns None when the object can be fetched again (another
        copy exists, or its task is re-running), else the error."""
        oid = ObjectID(object_id)
        entry = self.refs.get(oid)
        if entry is None:
            return serialize_error(exceptions.ObjectLostError(
                f"object {oid.hex()} was freed: no reference to it remained"))
        if not entry.ready:
            return None  # being re-created already
        lost = [tuple(location) for location in lost]
        for _node_id, manager in sorted(set(lost) & set(entry.locations)):
            self._send_later(manager, "free_objects", [object_id])  # if it lives after all
        entry.locations = [loc for loc in entry.locations if loc not in lost]
        if entry.locations:
            return None
        where = sorted({node_id for node_id, _ in lost})
        if oid.is_put():
            return serialize_error(exceptions.ObjectLostError(
                f"object {oid.hex()} was lost with node(s) {where}; it was created by put(), "
                "so it cannot be re-created (only task results can)"))
        task = self.lineage.get(oid.task_id())
        if task is None:
            return serialize_error(exceptions.ObjectReconstructionFailedError(
                f"object {oid.hex()} was lost with node(s) {where} and cannot be re-created: "
                "it was returned by an actor call, or its lineage is gone"))
        spec = task.spec
        if task.retries_left == 0:
            return serialize_error(exceptions.ObjectReconstructionFailedError(
                f"object {oid.hex()} (a result of task {spec.name}) was lost with node(s) "
                f"{where} and cannot be re-created: the task's retries are used up "
                f"(max_retries={spec.max_retries}, it ran {spec.attempt + 1} time(s))"))
        holds = []
        for arg in [*spec.args, *spec.kwargs.values()]:
            if arg[0] != "r":
                continue
            arg_entry = self.refs.get(ObjectID(arg[1]))
            if arg_entry is None:
                self._release_holds(holds)
                return serialize_error(exceptions.ObjectReconstructionFailedError(
                    f"object {oid.hex()} (a result of task {spec.name}) was lost with node(s) "
                    f"{where} and cannot be re-created: its argument {arg[1].hex()} was freed"))
            arg_entry.submitted += 1
            holds.append(ObjectID(arg[1]))
        _spend_retry(task)
        for return_id in spec.return_ids:
            returned = self.refs.get(ObjectID(return_id))
            if returned is not None:
                returned.ready, returned.inline, returned.locations = False, None, []
        again = PendingTask(spec, task.retries_left, holds)
        self.tasks[TaskID(spec.task_id)] = again
        self.tracer.record(self.name, "task_reconstruct", task=spec.task_id,
                           attempt=spec.attempt, object=oid)
        logger.info("re-running task %s to re-create lost object %s", spec.name, oid.hex())
        self.nursery.start_soon(self._in_context, self._submit_task, again)
        return None

    def handle_node_died(self, conn, node_id: str, manager: str) -> None:
        """The GCS declared a node dead: stop waiting for anything on it
        (work running there is retried as if its workers died) and forget
        the copies of objects it held."""
        self.tracer.record(self.name, "node_died", node=node_id)
        dropped = {manager}
        for key, queue in sorted(self.queues.items(), key=lambda item: repr(item[0])):
            for lease in list(queue.leases):
                if lease.node_id == node_id:
                    dropped.add(lease.worker_address)
                    if not lease.busy:
                        queue.leases.remove(lease)
            self._pump(key, queue)
        for state in self.actors.values():
            if state.info is not None and state.info.get("node_id") == node_id and \
                    state.info.get("address"):
                dropped.add(state.info["address"])
        for address in sorted(dropped):
            self.endpoint.drop(address)
        for entry in self.refs.values():
            if entry.owned and entry.locations:
                entry.locations = [loc for loc in entry.locations if loc[0] != node_id]

    # ------------------------------------------------------------ get/wait

    def _blocking(self, blocked: bool) -> None:
        """A task about to wait in get/wait lends its CPU back to its node
        (and takes it again after), so nested tasks cannot starve each other
        of CPUs — as Ray does."""
        if self.mode == WORKER and self.actor_id is None and \
                current_task.get(None) is not None:
            self._send_later(self.env.node_manager_address,
                             "worker_blocked" if blocked else "worker_unblocked",
                             self.worker_id)

    def _ready_here(self, ref: ObjectRef, local: bool = True) -> bool:
        """Is ``ref`` an object this process owns, ready (and, if ``local``,
        in this node's store or in memory)? No waiting needed then."""
        entry = self.refs.get(ref.object_id())
        return entry is not None and entry.owned and entry.ready and (
            entry.inline is not None or not local or self.store.contains(ref.binary()))

    async def get_async(self, refs: list, timeout: float | None, single: bool = False):
        if all(self._ready_here(ref) for ref in refs):
            return await self._get(refs, timeout, single)  # nothing to wait for
        self._blocking(True)
        try:
            return await self._get(refs, timeout, single)
        finally:
            self._blocking(False)

    async def _get(self, refs: list, timeout: float | None, single: bool):
        with trio.move_on_after(timeout if timeout is not None else float("inf")) as scope:
            values = [None] * len(refs)

            async def fetch(i: int, ref: ObjectRef) -> None:
                values[i] = await self._fetch(ref.object_id(), ref._owner)

            if len(refs) == 1:
                await fetch(0, refs[0])
            else:
                async with trio.open_nursery() as nursery:
                    for i, ref in enumerate(refs):
                        nursery.start_soon(fetch, i, ref)
        if scope.cancelled_caught:
            raise exceptions.GetTimeoutError(
                f"get() timed out after {timeout} s waiting for {len(refs)} object(s)")
        results = []
        for serialized in values:
            value = await self.deserialize(serialized)
            if serialized.kind == KIND_ERROR:
                raise value
            results.append(value)
        return results[0] if single else results

    async def wait_async(self, refs: list, num_returns: int, timeout: float | None,
                         fetch_local: bool) -> tuple[list, list]:
        self._blocking(True)
        try:
            return await self._wait(refs, num_returns, timeout, fetch_local)
        finally:
            self._blocking(False)

    async def _wait(self, refs: list, num_returns: int, timeout: float | None,
                    fetch_local: bool) -> tuple[list, list]:
        ready: set = set()
        enough = trio.Event()
        # Objects this process owns that are ready (and local, when asked)
        # need no watcher: a wait loop over many refs stays cheap.
        for ref in refs:
            if self._ready_here(ref, fetch_local):
                ready.add(ref.object_id())
                if len(ready) >= num_returns:
                    enough.set()
                    break

        async def watch(ref: ObjectRef) -> None:
            status = await self._object_status(ref.object_id(), ref._owner)
            if fetch_local and status[0] == "store":
                await self._fetch(ref.object_id(), ref._owner)
            ready.add(ref.object_id())
            if len(ready) >= num_returns:
                enough.set()

        with trio.move_on_after(timeout if timeout is not None else float("inf")):
            async with trio.open_nursery() as nursery:
                for ref in refs:
                    if not enough.is_set() and ref.object_id() not in ready:
                        nursery.start_soon(watch, ref)
                await enough.wait()
                nursery.cancel_scope.cancel()
        done = [ref for ref in refs if ref.object_id() in ready][:num_returns]
        chosen = {ref.object_id() for ref in done}
        return done, [ref for ref in refs if ref.object_id() not in chosen]

    # --------------------------------------------------------------- cancel

    async def cancel_async(self, ref: ObjectRef, force: bool, recursive: bool) -> None:
        task = self.tasks.get(ref.task_id())
        if task is None or task.done:
            return
        if task.spec.actor_id is not None and force:
            raise ValueError("force=True is not supported for actor tasks; "
                             "use tray.kill() to stop the actor")
        task.cancelled = True
        self.tracer.record(self.name, "task_cancel", task=task.spec.task_id, force=force)
        error = exceptions.TaskCancelledError(
            f"task {task.spec.name} ({task.spec.task_id.hex()}) was cancelled")
        if task.pushed_to is None:
            for queue in self.queues.values():
                if task in queue.tasks:
                    queue.tasks.remove(task)
            self._finish_task(task, [("error", serialize_error(error))] * task.spec.num_returns)
            return
        await self.endpoint.notify(task.pushed_to, "cancel_task", task.spec.task_id, force,
                                   recursive)

    async def handle_cancel_task(self, conn, task_id: bytes, force: bool, recursive: bool) -> None:
        if recursive:
            for child in list(self.tasks.values()):
                if child.spec.parent_task_id == task_id:
                    ref = ObjectRef(ObjectID(child.spec.return_ids[0]), self.address, self) \
                        if child.spec.return_ids else None
                    if ref is not None:
                        await self.cancel_async(ref, force, recursive)
        if force:
            self.tracer.record(self.name, "force_exit", task=task_id)
            self.env.extra["exit_process"]()
            return
        scope = self._running.get(task_id)
        if scope is not None:
            scope.cancel()

    # ------------------------------------------------------------ executor

    async def _load_function(self, function_id: str):
        function = self._functions.get(function_id)
        if function is None:
            blob = await self.gcs_call("kv_get", "fn:" + function_id)
            if blob is None:
                raise exceptions.TrayError(f"function {function_id} is not in the function table")
            function = self._functions[function_id] = cloudpickle.loads(blob)
        return function

    async def _resolve_args(self, spec: TaskSpec) -> tuple[list, dict]:
        async def value_of(arg):
            if arg[0] == "v":
                serialized = arg[1]
            else:
                serialized = await self._fetch(ObjectID(arg[1]), arg[2])
            value = await self.deserialize(serialized)
            if serialized.kind == KIND_ERROR:
                raise _ArgumentError(value)
            return value

        args = [await value_of(arg) for arg in spec.args]
        kwargs = {key: await value_of(arg) for key, arg in spec.kwargs.items()}
        return args, kwargs

    async def handle_push_task(self, conn, spec: TaskSpec, gpu_ids: list):
        context = TaskContext(TaskID(spec.task_id), gpu_ids=gpu_ids, name=spec.name,
                              job_id=spec.job_id, namespace=spec.namespace)
        return await self._execute(spec, context,
                                   lambda: self._load_function(spec.function_id))

    async def _execute(self, spec: TaskSpec, context: TaskContext, load):
        """Run a task or actor call; returns (results, app_error)."""
        current_task.set(context)
        await greenback.ensure_portal()
        self.tracer.record(self.name, "task_started", task=spec.task_id, name=spec.name,
                           attempt=spec.attempt)
        with trio.CancelScope() as scope:
            self._running[spec.task_id] = scope
            try:
                on_gpu_ids = self.env.extra.get("on_gpu_ids")
                if on_gpu_ids is not None:
                    on_gpu_ids(context.gpu_ids)
                function = await load()
                args, kwargs = await self._resolve_args(spec)
                if inspect.iscoroutinefunction(function):
                    value = await function(*args, **kwargs)
                else:
                    value = function(*args, **kwargs)
                values = _split_returns(value, spec.num_returns, spec.name)
            except _ArgumentError as failure:
                return self._error_results(spec, serialize_error(failure.error)), False
            except Exception as error:
                return self._error_results(spec, _task_error(spec.name, error)), True
            finally:
                del self._running[spec.task_id]
        if scope.cancelled_caught:
            error = exceptions.TaskCancelledError(f"task {spec.name} ({spec.task_id.hex()}) "
                                                  "was cancelled")
            return self._error_results(spec, serialize_error(error)), False
        try:
            results = [await self._store_result(ObjectID(oid), value, spec.caller)
                       for oid, value in zip(spec.return_ids, values, strict=True)]
        except Exception as error:
            return self._error_results(spec, _task_error(spec.name, error)), True
        self.tracer.record(self.name, "task_done", task=spec.task_id)
        return results, False

    def _error_results(self, spec: TaskSpec, serialized: SerializedObject) -> list:
        self.tracer.record(self.name, "task_failed", task=spec.task_id)
        return [("error", serialized)] * spec.num_returns

    async def _store_result(self, object_id: ObjectID, value, caller: str) -> tuple:
        serialized = serialize(value)
        # The caller becomes a borrower of every ref inside the value before
        # it learns of it, so the owners cannot free them in between.
        for oid_bytes, owner in serialized.contained:
            if owner == caller:
                continue
            if owner == self.address:
                self.handle_add_borrower(None, oid_bytes, caller)
            else:
                try:
                    await self.endpoint.call(owner, "add_borrower", oid_bytes, caller)
                except PeerDisconnected:
                    pass
        if serialized.size_bytes() <= self.config.inline_object_max_bytes:
            return ("inline", serialized)
        self.store.put(object_id.binary(), serialized.data, serialized.buffers, owner=caller)
        return ("store", ([(self.node_id, self.env.node_manager_address)], serialized.contained))

    # --------------------------------------------------------------- actors

    def actor_state(self, actor_id: str) -> ActorState:
        state = self.actors.get(actor_id)
        if state is None:
            state = self.actors[actor_id] = ActorState(actor_id)
        return state

    async def handle_create_actor(self, conn, creation: dict, gpu_ids: list, incarnation: int):
        """Instantiate the hosted actor; None on success, else the
        serialized constructor error."""
        spec: TaskSpec = creation["spec"]
        self.actor_id = creation["actor_id"]
        self.actor_gpu_ids = gpu_ids
        context = TaskContext(TaskID(spec.task_id), ActorID.from_hex(self.actor_id), gpu_ids,
                              name=spec.name, job_id=spec.job_id, namespace=spec.namespace)
        cls = await self._load_function(spec.function_id)
        self.actor_is_async = any(inspect.iscoroutinefunction(member) for _, member in
                                  inspect.getmembers(cls, inspect.isfunction))
        concurrency = creation["max_concurrency"] or (
            self.config.default_max_concurrency_async if self.actor_is_async else 1)
        self.actor_slots = trio.Semaphore(concurrency) if concurrency > 1 else trio.Lock()
        instance_box = []

        async def construct():
            def make(*args, **kwargs):
                instance_box.append(cls(*args, **kwargs))
            return make

        spec.num_returns = 1
        results, _ = await self._execute_creation(spec, context, construct)
        if results[0][0] == "error":
            return results[0][1]
        self.actor_instance = instance_box[0]
        self.tracer.record(self.name, "actor_created", actor=self.actor_id,
                           incarnation=incarnation)
        return None

    async def _execute_creation(self, spec: TaskSpec, context: TaskContext, load):
        saved = spec.return_ids
        spec.return_ids = [ObjectID.for_return(TaskID(spec.task_id), 1).binary()]
        try:
            return await self._execute(spec, context, load)
        finally:
            spec.return_ids = saved

    async def handle_actor_call(self, conn, spec: TaskSpec):
        if self.actor_instance is None:
            raise exceptions.ActorDiedError(f"no actor lives in worker {self.worker_id}")
        queue = self.callers.get(spec.caller)
        if queue is None:
            queue = self.callers[spec.caller] = CallerQueue()
        for seq in [seq for seq in queue.started if seq < spec.floor]:
            del queue.started[seq]
            queue.replies.pop(seq, None)
        first = queue.started.get(spec.seq)
        if first is not None:  # a re-sent call: it arrived here already
            await first.wait()
            if spec.seq in queue.replies:
                return queue.replies[spec.seq]
        done = queue.started[spec.seq] = trio.Event()
        try:
            reply = queue.replies[spec.seq] = await self._run_actor_call(queue, spec)
        finally:
            done.set()
        return reply

    async def _run_actor_call(self, queue: CallerQueue, spec: TaskSpec):
        if spec.floor > queue.next_seq:
            queue.next_seq = spec.floor
            self._wake(queue, all_due=True)
        if spec.seq > queue.next_seq:
            if len(queue.waiters) >= self.config.actor_pending_calls_max:
                raise exceptions.ActorError(f"too many calls waiting at actor {self.actor_id}")
            event = queue.waiters.setdefault(spec.seq, trio.Event())
            while spec.seq > queue.next_seq:
                await event.wait()
        context = TaskContext(TaskID(spec.task_id), ActorID.from_hex(self.actor_id),
                              self.actor_gpu_ids, name=spec.name, job_id=spec.job_id,
                              namespace=spec.namespace)
        async with self.actor_slots:
            if spec.seq >= queue.next_seq:
                queue.next_seq = spec.seq + 1
                self._wake(queue, all_due=False)
            instance = self.actor_instance

            async def bound_method():
                return getattr(instance, spec.method)
            return await self._execute(spec, context, bound_method)

    @staticmethod
    def _wake(queue: CallerQueue, all_due: bool) -> None:
        if all_due:  # the floor jumped: every call at or below it may go
            for seq in sorted(queue.waiters):
                if seq <= queue.next_seq:
                    queue.waiters.pop(seq).set()
            return
        event = queue.waiters.pop(queue.next_seq, None)
        if event is not None:
            event.set()

    async def _actor_info(self, state: ActorState) -> dict:
        while state.info is None or (state.info["state"] != "DEAD" and
                                     state.info["incarnation"] <= state.seen_incarnation):
            if state.refresh is not None:
                await state.refresh.wait()
                continue
            state.refresh = trio.Event()
            try:
                state.info = await self.gcs_call("wait_actor_ready",
                                                      state.actor_id, state.seen_incarnation)
            finally:
                state.refresh.set()
                state.refresh = None
        return state.info

    async def _submit_actor_call(self, task: PendingTask, state: ActorState) -> None:
        spec = task.spec
        failure = await self._resolve_dependencies(task)
        if failure is not None:
            self._finish_actor_call(task, state, [("error", failure)] * spec.num_returns)
            return
        while True:
            try:
                info = await self._actor_info(state)
            except exceptions.TrayError as error:  # the GCS stayed unreachable
                self._finish_actor_call(task, state,
                                        [("error", serialize_error(error))] * spec.num_returns)
                return
            if info["state"] == "DEAD":
                error = _actor_died_error(info, spec.name)
                self._finish_actor_call(task, state,
                                        [("error", serialize_error(error))] * spec.num_returns)
                return
            spec.floor = min(state.unfinished)
            try:
                results, _ = await self.endpoint.call(info["address"], "actor_call", spec)
            except PeerDisconnected:
                # Dead, or (when it still answers) only the connection broke:
                # then the actor lives on, and the call may or may not have run.
                cut_off = await self.endpoint.reachable(info["address"])
                if not cut_off:
                    state.seen_incarnation = max(state.seen_incarnation, info["incarnation"])
                if task.retries_left != 0 and not task.cancelled:
                    _spend_retry(task)
                    self.tracer.record(self.name, "actor_call_retry", task=spec.task_id)
                    continue
                if cut_off:
                    error = exceptions.ActorUnavailableError(
                        f"the connection to actor {state.actor_id} broke during {spec.name}; "
                        "the call may or may not have run, and was not retried "
                        "(max_task_retries=0)", state.actor_id)
                else:
                    error = await self._actor_failure(state, spec)
                self._finish_actor_call(task, state,
                                        [("error", serialize_error(error))] * spec.num_returns)
                return
            self._finish_actor_call(task, state, results)
            return

    async def kill_actor(self, actor_id: str, no_restart: bool) -> None:
        await self.gcs_call("kill_actor", actor_id, no_restart)
        state = self.actors.get(actor_id)
        if state is not None and state.info is not None:
            # Later calls from here wait for the next incarnation (or death).
            state.seen_incarnation = max(state.seen_incarnation, state.info["incarnation"])

    async def _actor_failure(self, state: ActorState, spec: TaskSpec) -> Exception:
        """The error for a call whose actor died under it (not retried)."""
        try:
            info = await self.gcs_call("get_actor", state.actor_id)
        except exceptions.TrayError:
            info = None
        if info is not None and info["state"] == "DEAD":
            state.info = info
            return _actor_died_error(info, spec.name)
        # The GCS may not have heard of the death yet: the actor restarts if
        # its budget allows.
        if info is not None and (info["state"] in ("RESTARTING", "PENDING_CREATION") or
                                 info["max_restarts"] == -1 or
                                 info["restarts"] < info["max_restarts"]):
            return exceptions.ActorUnavailableError(
                f"the actor {state.actor_id} ({info['class_name']}) died while running "
                f"{spec.name} and is restarting; the call was not retried "
                "(max_task_retries=0)", state.actor_id)
        return exceptions.ActorDiedError(
            f"the actor {state.actor_id} died while running {spec.name}; the call was not "
            "retried (max_task_retries=0)", state.actor_id)

    def _finish_actor_call(self, task: PendingTask, state: ActorState, results: list) -> None:
        state.unfinished.pop(task.spec.seq, None)
        self._finish_task(task, results)


def _spend_retry(task: PendingTask) -> None:
    """One more attempt of ``task``, out of its budget (-1: unlimited)."""
    if task.retries_left > 0:
        task.retries_left -= 1
    task.spec.attempt += 1


class _ArgumentError(Exception):
    """An argument of the task was an error; it propagates unchanged."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(str(error))
        self.error = error


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


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


def _task_error(name: str, error: Exception) -> SerializedObject:
    if isinstance(error, exceptions.TaskError):
        return serialize_error(error)  # an upstream failure: keep its story
    text = "".join(traceback.format_exception(type(error), error, error.__traceback__))
    try:
        task_error = exceptions.TaskError(name, text, error).as_instanceof_cause()
    except Exception:  # the user's exception class resists subclassing
        task_error = exceptions.TaskError(name, text, error)
    return serialize_error(task_error)


def _actor_died_error(info: dict, call_name: str) -> Exception:
    reason, cause = info["death_cause"] or ("it died", None)
    cause_error = deserialize(cause) if cause is not None else None
    detail = f"\n{cause_error}" if cause_error is not None else ""
    return exceptions.ActorDiedError(
        f"the actor {info['class_name']} ({info['actor_id']}) is dead, so {call_name} "
        f"cannot run: {reason}{detail}", info["actor_id"], cause_error)


def function_id_of(blob: bytes) -> str:
    return hashlib.blake2b(blob, digest_size=16).hexdigest()


# ==================================================================== actors
# Creation lives here too: the owner registers the actor with the GCS, which
# schedules it; the owner holds the constructor's argument refs until the
# actor is alive or dead.

def _prepare_actor(worker: CoreWorker, *, class_name: str, function_id: str, args: tuple,
                   kwargs: dict, resources: dict, strategy: Strategy, options: dict,
                   namespace: str, method_meta: dict, is_async: bool) -> tuple[dict, list]:
    context = worker.current_context()
    task_id = context.next_child_id()
    actor_id = ActorID.of_creation_task(task_id)
    packed_args, packed_kwargs, holds = worker._serialize_args(args, kwargs,
                                                               f"{class_name}.__init__")
    spec = TaskSpec(task_id=task_id.binary(),
                    job_id=worker.current_job(), namespace=context.namespace,
                    name=f"{class_name}.__init__", function_id=function_id, args=packed_args,
                    kwargs=packed_kwargs, num_returns=0, return_ids=[], caller=worker.address,
                    resources=resources, strategy=strategy,
                    parent_task_id=context.task_id.binary())
    actor = {
        "actor_id": actor_id.hex(), "class_name": class_name, "name": options.get("name"),
        "namespace": namespace, "get_if_exists": bool(options.get("get_if_exists")),
        "owner_address": worker.address, "detached": options.get("lifetime") == "detached",
        "max_restarts": options.get("max_restarts") or 0,
        "max_task_retries": options.get("max_task_retries") or 0,
        "resources": resources, "strategy": strategy, "is_async": is_async,
        "method_meta": method_meta,
        "creation": {"actor_id": actor_id.hex(), "spec": spec,
                     "max_concurrency": options.get("max_concurrency")},
    }
    return actor, holds


async def _register_actor(worker: CoreWorker, actor: dict, holds: list) -> dict | None:
    spec: TaskSpec = actor["creation"]["spec"]
    await worker._ensure_exported(spec.function_id)
    task = PendingTask(spec, 0, holds)
    failure = await worker._resolve_dependencies(task)
    if failure is not None:
        worker._release_holds(holds)
        raise await worker.deserialize(failure)
    reply = await worker.gcs_call("create_actor", actor)
    if reply["existing"] is not None:
        worker._release_holds(holds)
        return reply["existing"]
    worker.tracer.record(worker.name, "actor_submitted", actor=actor["actor_id"])
    worker.spawn(_release_when_created, worker, actor["actor_id"], holds)
    return None


async def _release_when_created(worker: CoreWorker, actor_id: str, holds: list) -> None:
    try:
        await worker._actor_info(worker.actor_state(actor_id))
    except PeerDisconnected:
        pass
    worker._release_holds(holds)


def _release_holds(self: CoreWorker, holds: list) -> None:
    for oid in holds:
        entry = self.refs.get(oid)
        if entry is not None:
            entry.submitted -= 1
            self._maybe_release(oid, entry)


CoreWorker._release_holds = _release_holds
CoreWorker.prepare_actor = _prepare_actor
CoreWorker.register_actor = _register_actor
