"""The core worker: the runtime inside every driver and worker process.

This class is a facade. It builds the components below, hands each its
collaborators, serves their handlers on one endpoint, and offers the API
layer (tray/api/) the operations a program performs. The work is in the
components, one concern each (after Ray's core worker):

owner side (the process that called ``.remote()`` or ``put``)
  ``reference_counter``      the object table: counts, borrowers, values
  ``task_manager``           pending tasks, lineage; every task ends in ``complete`` or ``fail``
  ``task_submission``        from ``.remote()`` to a pending task, started in call order
  ``task_args``              a task's arguments: packed into its spec, held while pending
  ``dependency_resolver``    a task waits for its arguments before it is sent
  ``normal_task_submitter``  lease queues per scheduling class; push; retries
  ``actor_task_submitter``   per-actor sequence numbers; actor registration
  ``cancellation``           cancelling a task from its owner (``tray.cancel``)
  ``object_recovery``        re-creating lost objects from lineage
  ``object_getter``          status, fetch, get and wait
  ``thread_waits``           the user's threads waiting in get or wait, off the loop
executor side (a worker running tasks)
  ``task_receiver``          runs a pushed task or actor call
  ``actor_host``             the hosted actor and its per-caller queues
plumbing
  ``loop_bridge``, ``outbox``, ``gcs_client``, ``function_table``,
  ``task_events`` (what the state API shows of tasks, batched to the GCS)

How a task flows through them: ``submit_task`` (``task_submission``) packs
the arguments (``task_args``, holding every ref argument in the reference
counter) and registers a ``PendingTask`` with the task manager; the normal
submitter exports the function, resolves the dependencies, queues the task
in its class, leases a worker and pushes it; the worker's task receiver
runs it and replies; the task manager's ``complete`` stores the results and
releases the arguments. (From the local driver's script, whose loop runs in
another thread, ``submit_task`` builds the spec and refs in the caller's
thread and queues the rest for the loop through ``thread_inbox``: no wait,
one wake-up of the loop per batch.) An actor call skips the lease: the
actor task submitter sends it to the actor's worker, whose actor host
orders it among the caller's calls.

Nothing here knows whether it runs in a real process or in the simulator."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from ... import exceptions
from ..context import TaskContext, current_task, current_worker
from ..ids import JobID, ObjectID, PlacementGroupID, TaskID
from ..messages import ActorInfo, ActorSpec, ObjectReport, PlacementGroupSpec
from ..object_ref import ObjectRef
from ..rpc import Endpoint, EndpointStatistics, PeerDisconnected, add_handlers
from ..serialization import serialize
from ..task_status import TaskStatus
from .actor_host import ActorHost, ActorHostStatistics
from .actor_task_submitter import ActorState, ActorSubmitterStatistics, ActorTaskSubmitter
from .cancellation import TaskCanceller
from .dependency_resolver import DependencyResolver
from .function_table import FunctionTable, FunctionTableStatistics
from .gcs_client import GcsClient
from .loop_bridge import LoopBridge
from .normal_task_submitter import LEASE_IDLE_KEEP_S, NormalTaskSubmitter, SubmitterStatistics
from .object_getter import ObjectGetter
from .object_recovery import ObjectRecoveryManager
from .outbox import Outbox, OutboxStatistics
from .reference_counter import ReferenceCounter, ReferenceStatistics, actor_handle_id
from .state_report import object_report
from .task_args import TaskArgs
from .task_events import TaskEventBuffer, TaskEventBufferStatistics
from .task_manager import TaskManager, TaskManagerStatistics
from .task_receiver import TaskReceiver, TaskReceiverStatistics
from .task_submission import TaskSubmission, TaskSubmissionStatistics
from .thread_inbox import SingleThread, ThreadInbox, ThreadInboxStatistics
from .thread_waits import ThreadWaits, ThreadWaitsStatistics

logger = logging.getLogger("tray.worker")

DRIVER, WORKER = "driver", "worker"


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
    submission: TaskSubmissionStatistics
    thread_waits: ThreadWaitsStatistics  # the user's threads asleep in get or wait
    actor_submitter: ActorSubmitterStatistics
    receiver: TaskReceiverStatistics  # tasks and actor calls running here
    functions: FunctionTableStatistics
    outbox: OutboxStatistics
    task_events: TaskEventBufferStatistics
    endpoint: EndpointStatistics


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
        self._ids_lock = make_condition()  # (used as a lock)
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
            lends_cpu=lambda: self.mode == WORKER and self.actor_host.actor_id is None,
            exit_process=env.exit_process if self.mode == WORKER else None)
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
        self.canceller = canceller = TaskCanceller(
            address=address, name=name, worker=self, endpoint=endpoint, bridge=bridge,
            tracer=tracer, task_manager=task_manager, normal_submitter=submitter,
            actor_submitter=self.actor_submitter)
        self.receiver = receiver = TaskReceiver(
            address=address, name=name, endpoint=endpoint, tracer=tracer,
            store=env.object_store, node_id=env.node_id,
            node_manager_address=env.node_manager_address, config=config,
            functions=functions, references=references, getter=getter,
            before_task=env.before_task, exit_process=env.exit_process,
            cancel_children=canceller.cancel_children, events=task_events,
            task_cost_s=env.task_cost_s)
        self.actor_host = ActorHost(nursery=nursery,
                                    run_sync_in_thread=env.run_sync_in_thread,
                                    name=name, worker_id=worker_id, tracer=tracer,
                                    config=config, functions=functions, receiver=receiver,
                                    gcs=gcs, exit_process=env.exit_process,
                                    asyncio_loops=env.asyncio_loops,
                                    run_exit_handlers=env.run_exit_handlers)
        self.submission = TaskSubmission(
            address=address, name=name, worker=self, tracer=tracer, bridge=bridge,
            inbox=self.inbox, references=references, task_manager=task_manager,
            functions=functions,
            args=TaskArgs(address=address, config=config, references=references,
                          next_put_id=self._next_put_id),
            normal_submitter=submitter, actor_submitter=self.actor_submitter,
            current_context=self.current_context, current_job=self.current_job,
            next_child_id=self._next_child_id, queues_from_thread=self.queues_from_thread)
        self.thread_waits = ThreadWaits(
            address=address, references=references, getter=getter, inbox=self.inbox,
            store=env.object_store, nursery=nursery, make_condition=env.thread_condition)
        # The messages a core worker answers, by component (every handle_*
        # method must be here: tests/test_handler_tables.py).
        add_handlers(handlers, {
            "object_report": self.handle_object_report,
            "flush_task_events": self.handle_flush_task_events,
            "node_died": self.handle_node_died,
        }, {
            "add_location": references.handle_add_location,
            "objects_here": references.handle_objects_here,
            "add_borrower": references.handle_add_borrower,
            "add_borrower_oneway": references.handle_add_borrower_oneway,
            "remove_borrower": references.handle_remove_borrower,
        }, {
            "held_leases": submitter.handle_held_leases,
            "object_status": getter.handle_object_status,
            "recover_object": recovery.handle_recover_object,
            "cancel_remote_task": canceller.handle_cancel_remote_task,
        }, {
            "push_task": receiver.handle_push_task,
            "exit_if_idle": receiver.handle_exit_if_idle,
            "cancel_task": receiver.handle_cancel_task,
        }, {
            "create_actor": self.actor_host.handle_create_actor,
            "actor_call": self.actor_host.handle_actor_call,
            "terminate_actor": self.actor_host.handle_terminate_actor,
            "actor_floor": self.actor_host.handle_actor_floor,
        })
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
        the user's threads waiting in ``get`` or ``wait`` (``thread_waits``),
        which then raise instead of waiting for a loop that is gone."""
        self.outbox.shutting_down = True
        self.thread_waits.end_all()

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
            inbox=self.inbox.statistics(), submission=self.submission.statistics(),
            thread_waits=self.thread_waits.statistics(),
            actor_submitter=self.actor_submitter.statistics(),
            receiver=self.receiver.statistics(), functions=self.functions.statistics(),
            outbox=self.outbox.statistics(), task_events=self.task_events.statistics(),
            endpoint=self.endpoint.statistics())

    def validate_state(self) -> None:
        """Check every component's invariants (the simulator calls this
        after every step of a simtest run)."""
        self.references.validate_state()
        self.task_manager.validate_state()
        self.normal_submitter.validate_state()
        self.actor_submitter.validate_state()
        self.actor_host.validate_state()
        self.submission.validate_state()
        self.thread_waits.validate_state()
        self.receiver.validate_state()
        self.functions.validate_state()
        self.outbox.validate_state()
        self.inbox.validate_state()
        self.task_events.validate_state()
        self.endpoint.validate_state()

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

    # --------------------------------------------------------- submission

    def export_function(self, function_id: str, blob: bytes) -> None:
        self.functions.export(function_id, blob)

    def submit_task(self, **task) -> list[ObjectRef]:
        """``TaskSubmission.submit_task``: a task's refs, at once."""
        return self.submission.submit_task(**task)

    # --------------------------------------------------------------- actors

    def actor_state(self, actor_id: str) -> ActorState:
        return self.actor_submitter.actor_state(actor_id)

    def prepare_actor(self, **actor) -> tuple[ActorSpec, list]:
        """``TaskSubmission.prepare_actor``: the actor's spec, and the
        argument refs its creation holds."""
        return self.submission.prepare_actor(**actor)

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
        self.task_events.task_state(actor.creation, TaskStatus.PENDING_ARGS_AVAIL, info=True,
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

    # In a user's thread, without entering the loop where it can (thread_waits).

    def get_ready(self, refs: list):
        return self.thread_waits.get_ready(refs)

    def get_from_thread(self, refs: list, timeout: float | None):
        return self.thread_waits.get_from_thread(refs, timeout)

    def wait_from_thread(self, refs: list, num_returns: int, timeout: float | None,
                         fetch_local: bool):
        return self.thread_waits.wait_from_thread(refs, num_returns, timeout, fetch_local)

    # --------------------------------------------------------------- cancel

    async def cancel_async(self, ref: ObjectRef, force: bool, recursive: bool) -> None:
        await self.canceller.cancel(ref, force, recursive)

    # ------------------------------------------------------- the state API

    def handle_object_report(self, conn) -> ObjectReport:
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
        dropped |= self.actor_submitter.node_died(node_id)
        for address in sorted(dropped):
            self.endpoint.drop(address)
        self.references.forget_node(node_id)
