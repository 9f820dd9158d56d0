"""Cancelling tasks (``tray.cancel``): the owner's side.

Only a task's owner knows where the task is, so a borrower's cancel goes to
the owner (``cancel_remote_task``, as Ray's RemoteCancelTask). The owner
then acts on where its task stands: a task still queued is taken off its
queue and fails; one pushed to a worker is cancelled there, and told again
every ``CANCEL_RETRY_PERIOD_S`` until it ends (a cancel that arrives before
the task started finds nothing to cancel); an actor call fails at once and
its actor is told (Ray's rules for actor tasks). A recursive cancel that
reaches a worker cancels the tasks the running task submitted
(``cancel_children``, which the task receiver calls). The executing side,
interrupting what runs, is ``task_receiver``'s. No state is kept here: a
re-sent cancel lives as long as its task."""

from __future__ import annotations

import trio

from ... import exceptions
from ..ids import ObjectID
from ..object_ref import ObjectRef
from ..rpc import Endpoint, PeerDisconnected
from .actor_task_submitter import ActorTaskSubmitter
from .loop_bridge import LoopBridge
from .normal_task_submitter import NormalTaskSubmitter
from .task_manager import PendingTask, TaskManager

# How often a cancelled task that is still running is told again.
CANCEL_RETRY_PERIOD_S = 0.5


class TaskCanceller:
    def __init__(self, *, address: str, name: str, worker, endpoint: Endpoint,
                 bridge: LoopBridge, tracer, task_manager: TaskManager,
                 normal_submitter: NormalTaskSubmitter,
                 actor_submitter: ActorTaskSubmitter) -> None:
        self._address = address
        self._name = name
        self._worker = worker  # the core worker, which the refs made here count in
        self._endpoint = endpoint
        self._bridge = bridge
        self._tracer = tracer
        self._task_manager = task_manager
        self._normal_submitter = normal_submitter
        self._actor_submitter = actor_submitter

    async def cancel(self, ref: ObjectRef, force: bool, recursive: bool) -> None:
        """``tray.cancel(ref)``: cancel the task that creates ``ref``'s object."""
        if ref._owner != self._address:
            # A borrowed ref: only its owner knows the task, so the owner
            # cancels it (as Ray's RemoteCancelTask). An owner that is gone
            # took its tasks with it: nothing is left to cancel.
            try:
                await self._endpoint.call(ref._owner, "cancel_remote_task", ref.binary(),
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
        task = self._task_manager.get(task_id)
        if task is None or task.done:
            return
        if task.spec.actor_id is not None and force:
            raise ValueError("force=True is not supported for actor tasks; "
                             "use tray.kill() to stop the actor")
        task.cancelled = True
        self._tracer.record(self._name, "task_cancel", task=task.spec.task_id, force=force)
        error = exceptions.TaskCancelledError(
            f"task {task.spec.name} ({task.spec.task_id.hex()}) was cancelled")
        if task.spec.actor_id is not None:
            # An actor call fails here at once, and the actor is told where
            # the call was sent (after it, on the same connection): a call
            # waiting there for its turn is skipped, an async method's
            # asyncio task is cancelled, and a synchronous method runs on
            # (Ray's rules for actor tasks).
            address = self._actor_submitter.address_of_call(task)
            self._task_manager.fail(task, error)
            if address is not None:
                await self._endpoint.notify(address, "cancel_task", task.spec.task_id, False,
                                            recursive)
            return
        if task.pushed_to is None:
            self._normal_submitter.remove_queued(task)
            self._task_manager.fail(task, error)
            return
        await self._endpoint.notify(task.pushed_to, "cancel_task", task.spec.task_id, force,
                                    recursive)
        if not force:
            self._bridge.start_soon(self._cancel_again, task, task.pushed_to, recursive)

    async def _cancel_again(self, task: PendingTask, worker: str, recursive: bool) -> None:
        """A cancel that reaches the worker before the task has started there
        finds nothing to cancel; send it again until the task ends (Ray's
        owner retries a cancel likewise). Bounded by the task's life."""
        while True:
            await trio.sleep(CANCEL_RETRY_PERIOD_S)
            if task.done or task.pushed_to != worker:
                return
            await self._endpoint.notify(worker, "cancel_task", task.spec.task_id, False,
                                        recursive)

    async def cancel_children(self, task_id: bytes, force: bool) -> None:
        """Cancel the tasks that the task ``task_id`` (running here) submitted."""
        for child in list(self._task_manager.tasks.values()):
            if child.spec.parent_task_id == task_id:
                ref = ObjectRef(ObjectID(child.spec.return_ids[0]), self._address, self._worker) \
                    if child.spec.return_ids else None
                if ref is not None:
                    await self.cancel(ref, force, True)
