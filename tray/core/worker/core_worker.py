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
arguments. An actor call skips the lease: the actor task submitter sends it
to the actor's worker, whose actor host orders it among the caller's calls.

Nothing here knows whether it runs in a real process or in the simulator."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import trio

from ... import exceptions
from ..context import TaskContext, current_task
from ..ids import ActorID, JobID, ObjectID, PlacementGroupID, TaskID
from ..messages import ActorInfo, ActorSpec, PlacementGroupSpec
from ..object_ref import ObjectRef
from ..rpc import Endpoint, PeerDisconnected
from ..scheduling import Strategy
from ..serialization import serialize
from ..task_spec import ArgByRef, ArgByValue, TaskSpec
from .actor_host import ActorHost, ActorHostStatistics
from .actor_task_submitter import ActorState, ActorTaskSubmitter
from .dependency_resolver import DependencyResolver
from .function_table import FunctionTable
from .gcs_client import GcsClient
from .loop_bridge import LoopBridge
from .normal_task_submitter import NormalTaskSubmitter, SubmitterStatistics
from .object_getter import ObjectGetter
from .object_recovery import ObjectRecoveryManager
from .outbox import Outbox
from .reference_counter import ReferenceCounter, ReferenceStatistics, actor_handle_id
from .state_report import object_report
from .task_events import TaskEventBuffer
from .task_manager import PendingTask, TaskManager, TaskManagerStatistics
from .task_receiver import TaskReceiver

logger = logging.getLogger("tray.worker")

DRIVER, WORKER = "driver", "worker"

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
            task_manager=task_manager, resolver=resolver, functions=functions, gcs=gcs)
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
            on_gpu_ids=env.on_gpu_ids, exit_process=env.exit_process,
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
            for attribute in dir(component):
                if attribute.startswith("handle_"):
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
        """The process is ending: queue no more background sends."""
        self.outbox.shutting_down = True

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
            actors_known=len(self.actor_submitter.actors), outbox_queued=len(self.outbox))

    def validate_state(self) -> None:
        """Check every component's invariants (the simulator calls this
        after every step of a simtest run)."""
        self.references.validate_state()
        self.task_manager.validate_state()
        self.normal_submitter.validate_state()
        self.actor_submitter.validate_state()
        self.actor_host.validate_state()

    # ------------------------------------------------- what ObjectRef needs

    def add_local_ref(self, object_id: ObjectID, owner: str) -> None:
        self.references.add_local_ref(object_id, owner)

    def remove_local_ref(self, object_id: ObjectID) -> None:
        self.references.remove_local_ref(object_id)

    def knows(self, object_id: ObjectID) -> bool:
        return object_id in self.references.refs

    def register_borrow_later(self, object_id: ObjectID, owner: str) -> None:
        self.references.register_borrow_later(object_id, owner)

    async def deserialize(self, serialized):
        return await self.references.deserialize(serialized)

    # ------------------------------------------------------------------ put

    def put(self, value) -> ObjectRef:
        if isinstance(value, ObjectRef):
            raise TypeError("Calling put() on an ObjectRef is not allowed; "
                            "pass the ObjectRef itself instead")
        serialized = serialize(value)
        object_id = self.current_context().next_put_id()
        ref = ObjectRef(object_id, self.address, self)
        self.references.store_value(object_id, self.references.refs[object_id], serialized)
        self.tracer.record(self.name, "put", object=object_id, size=serialized.size_bytes())
        return ref

    # --------------------------------------------------------- submission

    def export_function(self, function_id: str, blob: bytes) -> None:
        self.functions.export(function_id, blob)

    def _serialize_args(self, args: tuple, kwargs: dict, name: str) -> tuple[list, dict, list]:
        """Pack arguments; returns them with the oids whose ``submitted``
        count now holds them (released when the task finishes)."""
        references = self.references
        holds: list = []

        def hold(oid: ObjectID, owner: str) -> None:
            references.hold_submitted(oid, owner)
            holds.append(oid)

        def one(value, label: str):
            if isinstance(value, ObjectRef):
                hold(value.object_id(), value._owner)
                return ArgByRef(value.binary(), value._owner)
            try:
                serialized = serialize(value)
            except TypeError as error:
                raise TypeError(f"Could not serialize the argument {label} of {name}: "
                                f"{error}") from error.__cause__
            if serialized.size_bytes() > self.config.inline_object_max_bytes:
                object_id = self.current_context().next_put_id()
                hold(object_id, self.address)
                references.store_value(object_id, references.refs[object_id], serialized)
                return ArgByRef(object_id.binary(), self.address)
            for oid_bytes, owner in serialized.contained:
                hold(ObjectID(oid_bytes), owner)
            return ArgByValue(serialized)

        try:
            packed_args = [one(value, f"#{i} ({_short(value)})") for i, value in enumerate(args)]
            packed_kwargs = {key: one(value, f"{key!r} ({_short(value)})")
                             for key, value in kwargs.items()}
        except BaseException:
            references.release_submitted(holds)
            raise
        return packed_args, packed_kwargs, holds

    def submit_task(self, *, name: str, function_id: str, args: tuple, kwargs: dict,
                    num_returns: int, resources: dict, strategy: Strategy, max_retries: int,
                    retry_exceptions, actor: ActorState | None = None, method: str | None = None,
                    max_task_retries: int = 0, max_pending_calls: int = -1,
                    concurrency_group: str = "",
                    actor_ref: ObjectRef | None = None,
                    runtime_env: dict | None = None) -> list[ObjectRef]:
        """Build a task and start submitting it; returns its refs at once."""
        context = self.current_context()
        if actor is not None:
            self.actor_submitter.check_pending_calls(actor, max_pending_calls)
        else:
            strategy = _captured(context, strategy)
        task_id = context.next_child_id()
        packed_args, packed_kwargs, holds = self._serialize_args(args, kwargs, name)
        if actor_ref is not None:
            # The call keeps its actor alive until it finishes (the actor's
            # handle reference, as an argument would be).
            self.references.hold_submitted(actor_ref.object_id(), actor_ref._owner)
            holds.append(actor_ref.object_id())
        return_ids = [ObjectID.for_return(task_id, i + 1) for i in range(num_returns)]
        spec = TaskSpec(task_id=task_id.binary(), job_id=self.current_job(),
                        namespace=context.namespace,
                        name=name, function_id=function_id, args=packed_args,
                        kwargs=packed_kwargs, num_returns=num_returns,
                        return_ids=[oid.binary() for oid in return_ids], caller=self.address,
                        resources=resources, strategy=strategy, max_retries=max_retries,
                        retry_exceptions=retry_exceptions, parent_task_id=context.task_id.binary(),
                        runtime_env=runtime_env)
        if actor is not None:
            spec.actor_id = actor.actor_id
            spec.method = method
            spec.seq = self.actor_submitter.next_call(actor)
            spec.concurrency_group = concurrency_group
        task = PendingTask(spec, max_task_retries if actor is not None else max_retries, holds)
        self.task_manager.add(task)
        refs = [ObjectRef(oid, self.address, self) for oid in return_ids]
        self.tracer.record(self.name, "task_submitted", task=task_id, name=name)
        if actor is not None:
            self.spawn(self.actor_submitter.submit, task, actor)
        else:
            self.spawn(self.normal_submitter.submit, task)
        return refs

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
        task_id = context.next_child_id()
        actor_id = ActorID.of_creation_task(task_id)
        packed_args, packed_kwargs, holds = self._serialize_args(args, kwargs,
                                                                 f"{class_name}.__init__")
        creation = TaskSpec(task_id=task_id.binary(),
                            job_id=self.current_job(), namespace=context.namespace,
                            name=f"{class_name}.__init__", function_id=function_id,
                            args=packed_args, kwargs=packed_kwargs, num_returns=0, return_ids=[],
                            caller=self.address, resources=resources, strategy=strategy,
                            parent_task_id=context.task_id.binary(), runtime_env=runtime_env)
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
        task_id = self.current_context().next_child_id()
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
