"""Submitting normal tasks: lease queues per scheduling class.

Tasks that need the same resources under the same strategy form a
*scheduling class* and share a queue. For a class with queued tasks the
submitter keeps lease requests outstanding (at most
``pending_lease_requests_max``), following spillback replies from node to
node; each granted lease is a worker that runs one task at a time, pushed
to it directly. A lease is kept while its class has queued tasks and given
back when the queue runs dry (SPREAD tasks take a fresh lease each, so the
policy spreads them). A task in a placement group asks the node that holds
its bundle: where that is comes from the GCS (``wait_placement_group_ready``),
and a task whose group is gone fails with ``TaskPlacementGroupRemoved``.

A push that fails because the worker died (or the connection to it broke)
gives the lease back as broken and retries the task within its budget;
the owner first asks the worker's node why it died. A task whose worker the
node's memory monitor killed is retried, as Ray's, only if it is retriable
(``max_retries != 0``) and was not its owner's last task on that node, on a
budget of its own (``task_oom_retries``) after a growing delay; otherwise it
fails with ``OutOfMemoryError`` (not ``WorkerCrashedError``). An application
error is retried only under ``retry_exceptions``. Any other
error on a task's way (the GCS unreachable, a node that cannot schedule it,
a worker that answers with an error of its own) fails that task — or, for a
lease request, the tasks queued in its class — and never the process."""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass, field

import trio

from ... import exceptions
from .. import scheduling
from ..messages import (
    PG_REMOVED,
    Infeasible,
    LeaseGranted,
    LeaseRequest,
    LeaseWithdrawn,
    Spillback,
)
from ..rpc import Endpoint, PeerDisconnected
from ..task_spec import TaskSpec
from .dependency_resolver import DependencyResolver
from .function_table import FunctionTable
from .gcs_client import GcsClient
from .outbox import Outbox
from .task_manager import (
    PENDING_NODE_ASSIGNMENT,
    SUBMITTED_TO_WORKER,
    PendingTask,
    TaskManager,
    spend_retry,
)

logger = logging.getLogger("tray.worker")


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
    bundle_cursor: int = 0  # placement groups: which bundle the next request tries


@dataclass(frozen=True)
class ClassQueueSummary:
    resources: tuple  # the class's (name, amount) pairs
    strategy: str
    queued: int  # tasks waiting for a lease
    lease_requests: int  # outstanding
    leases: int  # held


@dataclass(frozen=True)
class SubmitterStatistics:
    queues: tuple  # ClassQueueSummary, one per scheduling class with work


def class_key(spec: TaskSpec) -> tuple:
    # Whether its tasks are retried is part of the class: a lease says so to
    # its node (whose memory monitor kills retriable work first), and all the
    # tasks a lease runs must agree with it.
    # So is its runtime_env: a worker set up for one env runs no other.
    return (tuple(sorted(spec.resources.items())), spec.strategy, spec.max_retries != 0,
            spec.runtime_env_hash)


class NormalTaskSubmitter:
    def __init__(self, *, address: str, name: str, endpoint: Endpoint, nursery: trio.Nursery,
                 outbox: Outbox, tracer, config, node_manager_address: str,
                 task_manager: TaskManager, resolver: DependencyResolver,
                 functions: FunctionTable, gcs: GcsClient) -> None:
        self._gcs = gcs
        self._address = address
        self._name = name
        self._endpoint = endpoint
        self._nursery = nursery
        self._outbox = outbox
        self._tracer = tracer
        self._config = config
        self._node_manager_address = node_manager_address
        self._task_manager = task_manager
        self._resolver = resolver
        self._functions = functions
        self.queues: dict[tuple, ClassQueue] = {}

    def statistics(self) -> SubmitterStatistics:
        return SubmitterStatistics(tuple(
            ClassQueueSummary(key[0], key[1].kind, len(queue.tasks), queue.pending_requests,
                              len(queue.leases))
            for key, queue in sorted(self.queues.items(), key=lambda item: repr(item[0]))))

    def validate_state(self) -> None:
        for key, queue in self.queues.items():
            # An empty class (no work, no leases, no requests) is dropped at once.
            assert queue.tasks or queue.leases or queue.pending_requests, key
            assert 0 <= queue.pending_requests <= self._config.pending_lease_requests_max, \
                (key, queue.pending_requests)
            # A lease is either running a task or returned: never held idle.
            assert all(lease.busy for lease in queue.leases), key
            for task in queue.tasks:
                assert not task.done, task.spec.name
                assert task.state == PENDING_NODE_ASSIGNMENT, (task.spec.name, task.state)
                assert task.pushed_to is None, task.spec.name
                assert class_key(task.spec) == key, task.spec.name
            lease_ids = [(lease.node_manager, lease.lease_id) for lease in queue.leases]
            assert len(lease_ids) == len(set(lease_ids)), key

    async def submit(self, task: PendingTask) -> None:
        """Export the function, wait for the arguments, queue the task."""
        try:
            await self._functions.ensure_exported(task.spec.function_id)
            failure = await self._resolver.resolve(task)
        except Exception as error:  # noqa: BLE001 - the GCS unreachable, an owner's error
            self._task_manager.fail(task, error)
            return
        if failure is not None:
            self._task_manager.fail(task, failure)
            return
        if task.done:  # cancelled while its arguments were on their way
            return
        self.enqueue(task)

    def enqueue(self, task: PendingTask) -> None:
        key = class_key(task.spec)
        queue = self.queues.setdefault(key, ClassQueue())
        self._task_manager.set_state(task, PENDING_NODE_ASSIGNMENT)
        queue.tasks.append(task)
        self._pump(key, queue)

    def remove_queued(self, task: PendingTask) -> None:
        """A cancelled task leaves the queues (it was not pushed yet)."""
        for queue in self.queues.values():
            if task in queue.tasks:
                queue.tasks.remove(task)

    def _pump(self, key: tuple, queue: ClassQueue) -> None:
        for lease in queue.leases:
            if not queue.tasks:
                break
            if not lease.busy:
                lease.busy = True
                self._nursery.start_soon(self._push, key, queue, lease, queue.tasks.popleft())
        wanted = len(queue.tasks) - queue.pending_requests
        while wanted > 0 and queue.pending_requests < self._config.pending_lease_requests_max:
            queue.pending_requests += 1
            wanted -= 1
            self._nursery.start_soon(self._request_lease, key, queue)
        if not queue.tasks:
            for lease in list(queue.leases):
                if not lease.busy:
                    self._return_lease(queue, lease, worker_ok=True)
            if not queue.leases and not queue.pending_requests:
                self.queues.pop(key, None)

    def _return_lease(self, queue: ClassQueue, lease: LeaseState, worker_ok: bool) -> None:
        queue.leases.remove(lease)
        self._outbox.send_later(lease.node_manager, "return_lease", lease.lease_id, worker_ok)

    async def _request_lease(self, key: tuple, queue: ClassQueue) -> None:
        try:
            await self._lease_for(queue)
        except Exception as error:  # noqa: BLE001 - a bug here fails the class, not the process
            logger.exception("a lease request for %s failed", key)
            self._fail_queue(queue, error)
        except BaseException:
            queue.pending_requests -= 1  # cancelled: the process is going away
            raise
        queue.pending_requests -= 1
        self._pump(key, queue)

    async def _lease_for(self, queue: ClassQueue) -> None:
        """Ask for a lease until one is granted for the class's tasks, or
        they are failed, or none is left."""
        manager, hops = self._node_manager_address, 0
        while queue.tasks:
            spec = queue.tasks[0].spec
            if spec.strategy.kind == "PLACEMENT_GROUP" and manager == \
                    self._node_manager_address:
                manager = await self._bundle_manager(queue, spec)
                if manager is None:
                    break  # the group is gone: the queue failed
                hops = self._config.spillback_hops_max
            request = LeaseRequest(resources=spec.resources, strategy=spec.strategy,
                                   owner=self._address, hops=hops,
                                   retriable=spec.max_retries != 0,
                                   runtime_env_hash=spec.runtime_env_hash)
            try:
                reply = await self._endpoint.call(manager, "request_lease", request)
            except PeerDisconnected:
                manager, hops = self._node_manager_address, 0
                await trio.sleep(self._config.heartbeat_period_s)
                continue
            except Exception as error:  # noqa: BLE001 - the node cannot run workers
                self._fail_queue(queue, exceptions.TaskError(
                    spec.name, f"the task cannot be scheduled: {error}", None))
                break
            if isinstance(reply, Spillback):
                manager, hops = reply.address, hops + 1
                continue
            if isinstance(reply, LeaseWithdrawn):
                # Granted and released at once (its bundle went): ask again.
                manager, hops = self._node_manager_address, 0
                await trio.sleep(0)
                continue
            if isinstance(reply, Infeasible) and spec.strategy.kind == "PLACEMENT_GROUP":
                # Its bundle moved (a node died) or the group is going:
                # ask the GCS again.
                manager, hops = self._node_manager_address, 0
                await trio.sleep(self._config.heartbeat_period_s)
                continue
            if isinstance(reply, Infeasible):
                if not queue.warned:
                    queue.warned = True
                    logger.warning("task %s is infeasible and stays pending: %s",
                                   spec.name, reply.reason)
                    self._tracer.record(self._name, "infeasible", task=spec.task_id)
                if spec.strategy.kind == "NODE_AFFINITY" and not spec.strategy.soft and \
                        "not alive" in reply.reason:
                    self._fail_queue(queue, exceptions.TaskError(
                        spec.name, f"the task cannot be scheduled: {reply.reason}", None))
                    break
                manager, hops = self._node_manager_address, 0
                await trio.sleep(self._config.infeasible_retry_period_s)
                continue
            assert isinstance(reply, LeaseGranted), reply
            lease = LeaseState(reply.lease_id, reply.worker_address, manager,
                               reply.node_id, reply.gpu_ids)
            queue.leases.append(lease)
            return

    async def _bundle_manager(self, queue: ClassQueue, spec: TaskSpec) -> str | None:
        """The node manager holding a bundle of the task's placement group
        that could run it (waits for the group); None when the queue failed."""
        strategy = spec.strategy
        pg_id = strategy.placement_group_id
        info = await self._gcs.call("wait_placement_group_ready", pg_id, None)
        if info is None or info.state == PG_REMOVED:
            self._fail_queue(queue, exceptions.TaskPlacementGroupRemoved(
                f"the placement group {pg_id} of task {spec.name} was removed"
                if info is not None else f"there is no placement group {pg_id} (of task "
                f"{spec.name})"))
            return None
        indexes = [strategy.bundle_index] if strategy.bundle_index >= 0 else \
            sorted(info.bundle_nodes)
        fitting = [index for index in indexes
                   if scheduling.fits(spec.resources, info.bundles[index])]
        if not fitting:
            which = "any bundle" if strategy.bundle_index < 0 else \
                f"bundle {strategy.bundle_index}"
            self._fail_queue(queue, ValueError(
                f"task {spec.name} needs {spec.resources}, more than {which} of placement "
                f"group {pg_id} holds ({[info.bundles[index] for index in indexes]})"))
            return None
        index = fitting[queue.bundle_cursor % len(fitting)]
        queue.bundle_cursor += 1
        return info.bundle_addresses[index]

    def _fail_queue(self, queue: ClassQueue, error: Exception) -> None:
        while queue.tasks:
            self._task_manager.fail(queue.tasks.popleft(), error)

    async def _push(self, key: tuple, queue: ClassQueue, lease: LeaseState,
                    task: PendingTask) -> None:
        spec = task.spec
        self._task_manager.set_state(task, SUBMITTED_TO_WORKER)
        task.pushed_to = lease.worker_address
        try:
            reply = await self._endpoint.call(lease.worker_address, "push_task", spec,
                                              lease.gpu_ids)
        except PeerDisconnected:
            task.pushed_to = None
            queue.leases.remove(lease)
            # Dead, or only cut off from us: either way the worker is done
            # for (its node manager kills it if it lives) and the task retried.
            self._outbox.send_later(lease.node_manager, "return_lease", lease.lease_id, False)
            self._pump(key, queue)
            # Out of the queues while its node says why the worker died (a
            # retry enqueues it again).
            cause = await self._failure_cause(lease)
            if not task.done:
                await self._task_worker_died(task, lease, cause)
            return
        except Exception as error:  # noqa: BLE001 - the worker failed to take the task
            task.pushed_to = None
            queue.leases.remove(lease)
            self._outbox.send_later(lease.node_manager, "return_lease", lease.lease_id, False)
            self._task_manager.fail(task, error)
            self._pump(key, queue)
            return
        task.pushed_to = None
        lease.busy = False
        if spec.strategy.kind == "SPREAD":
            # Each SPREAD task takes a fresh lease, so the policy spreads it.
            self._return_lease(queue, lease, worker_ok=True)
        results = reply.results
        if reply.application_error and not task.cancelled and \
                self._task_manager.should_retry_exception(task, results):
            spend_retry(task)
            self._tracer.record(self._name, "task_retry", task=spec.task_id,
                                attempt=spec.attempt, reason="exception")
            self._task_manager.set_state(task, PENDING_NODE_ASSIGNMENT)
            queue.tasks.append(task)
            self._pump(key, queue)
            return
        self._pump(key, queue)  # return or reuse the lease before waking getters
        self._task_manager.complete(task, results)

    async def _failure_cause(self, lease: LeaseState) -> dict | None:
        """Why the node says the lease's worker died (its memory monitor
        killed it), or None: unknown, or the node did not answer in time."""
        with trio.move_on_after(self._config.worker_failure_cause_timeout_s):
            try:
                return await self._endpoint.call(lease.node_manager, "worker_failure_cause",
                                                 lease.lease_id)
            except Exception:  # noqa: BLE001 - the node is gone or failed: a plain crash
                return None
        return None

    async def _task_worker_died(self, task: PendingTask, lease: LeaseState,
                                cause: dict | None) -> None:
        spec = task.spec
        out_of_memory = cause is not None and cause.get("kind") == "out_of_memory"
        oom_budget = self._config.task_oom_retries
        if task.cancelled:
            error = exceptions.TaskCancelledError(f"task {spec.name} ({spec.task_id.hex()}) "
                                                  "was cancelled")
        elif out_of_memory:
            if spec.max_retries == 0:
                why = "it is not retried (max_retries=0)"
            elif not cause["should_retry"]:
                why = ("it was the last task of its owner running on that node, so a retry "
                       "would be killed again: it is not retried")
            elif oom_budget != -1 and task.oom_retries >= oom_budget:
                why = f"its retries for memory are used up (task_oom_retries={oom_budget})"
            else:
                await self._retry_after_oom(task)
                return
            error = exceptions.OutOfMemoryError(
                f"task {spec.name} ({spec.task_id.hex()}) failed: its worker was killed "
                f"because {cause['message']}. {why[0].upper()}{why[1:]} "
                f"(attempts={spec.attempt + 1})")
        elif task.retries_left != 0:
            spend_retry(task)
            self._tracer.record(self._name, "task_retry", task=spec.task_id,
                                attempt=spec.attempt, reason="worker died")
            self.enqueue(task)
            return
        else:
            error = exceptions.WorkerCrashedError(
                f"the worker running task {spec.name} ({spec.task_id.hex()}) on node "
                f"{lease.node_id} died, and its retries are used up "
                f"(max_retries={spec.max_retries}, attempts={spec.attempt + 1})")
        self._task_manager.fail(task, error)

    async def _retry_after_oom(self, task: PendingTask) -> None:
        """Run a task killed for memory again, out of its memory budget
        (not ``max_retries``), after a delay that doubles with each such
        kill: a node short of memory is not handed the same work at once."""
        spec = task.spec
        task.oom_retries += 1
        spec.attempt += 1
        self._tracer.record(self._name, "task_retry", task=spec.task_id,
                            attempt=spec.attempt, reason="out of memory")
        await trio.sleep(min(self._config.oom_retry_delay_base_s * 2 ** (task.oom_retries - 1),
                             self._config.oom_retry_delay_max_s))
        if task.done:
            return
        if task.cancelled:
            self._task_manager.fail(task, exceptions.TaskCancelledError(
                f"task {spec.name} ({spec.task_id.hex()}) was cancelled"))
            return
        self.enqueue(task)

    def handle_held_leases(self, conn, node_manager: str, lease_ids: list) -> list:
        """Which of these leases from ``node_manager`` this process holds."""
        held = {lease.lease_id for queue in self.queues.values() for lease in queue.leases
                if lease.node_manager == node_manager}
        return [lease_id for lease_id in lease_ids if lease_id in held]

    def node_died(self, node_id: str) -> set:
        """Forget the idle leases on a dead node; returns the addresses of
        its workers this process leased (calls to them must fail now)."""
        dropped = set()
        for key, queue in sorted(self.queues.items(), key=lambda item: repr(item[0])):
            for lease in list(queue.leases):
                if lease.node_id == node_id:
                    dropped.add(lease.worker_address)
                    if not lease.busy:
                        queue.leases.remove(lease)
            self._pump(key, queue)
        return dropped
