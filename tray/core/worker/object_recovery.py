"""Bringing back an object whose copies were lost.

A reader that finds no readable copy of an object asks its owner to recover
it, naming the locations it could not read. The owner (Algorithm):

1. drops the lost locations (and asks their nodes to free the object, in
   case a copy lives on after all); if another copy is known, the reader
   just tries again;
2. otherwise, an object made by ``put`` cannot be re-created: the reader
   gets ``ObjectLostError``;
3. a task's result is re-created by running the task again from its lineage
   (the spec kept by the task manager), within its ``max_retries`` — every
   argument must still be referenced, and holds one more ``submitted``
   count while the re-run is pending; results of actor calls have no
   lineage (``ObjectReconstructionFailedError``);
4. the re-run is submitted like any task; when an argument of it was lost
   too, the re-run's own fetch asks for that argument's recovery, so
   recovery is recursive.

While a re-run is pending the object is not ready, so readers (and further
recovery requests) wait for it."""

from __future__ import annotations

import logging

import trio

from ... import exceptions
from ..ids import ObjectID
from ..rpc import Endpoint, PeerDisconnected
from ..serialization import SerializedObject, serialize_error
from .loop_bridge import LoopBridge
from .normal_task_submitter import NormalTaskSubmitter
from .outbox import Outbox
from .reference_counter import ReferenceCounter
from .task_manager import PendingTask, TaskManager, spend_retry

logger = logging.getLogger("tray.worker")

# A reader whose failed read of a put's copy lost nothing reads again after this.
PUT_REREAD_DELAY_S = 0.01


class ObjectRecoveryManager:
    """Keeps no state of its own (so no ``statistics()`` or
    ``validate_state()``): a recovery under way is a pending task in the
    task manager, its object an entry not ready in the reference counter."""

    def __init__(self, *, address: str, name: str, endpoint: Endpoint, bridge: LoopBridge,
                 outbox: Outbox, tracer, references: ReferenceCounter,
                 task_manager: TaskManager, submitter: NormalTaskSubmitter, config) -> None:
        self._config = config
        self._address = address
        self._name = name
        self._endpoint = endpoint
        self._bridge = bridge
        self._outbox = outbox
        self._tracer = tracer
        self._references = references
        self._task_manager = task_manager
        self._submitter = submitter

    async def recover(self, object_id: ObjectID, owner: str,
                      lost: list) -> SerializedObject | None:
        """Ask the owner to recover the object; None: fetch it again."""
        if owner == self._address:
            failure = self.handle_recover_object(None, object_id.binary(), lost)
        else:
            try:
                failure = await self._endpoint.call(owner, "recover_object",
                                                    object_id.binary(), lost)
            except PeerDisconnected:
                failure = await self._owner_gone(object_id, owner)
        if failure is None and object_id.is_put():
            # Its copy is on a live node that this reader could not read:
            # the reader tries again, a moment later (not in a tight loop).
            await trio.sleep(PUT_REREAD_DELAY_S)
        return failure

    async def _owner_gone(self, object_id: ObjectID, owner: str) -> SerializedObject | None:
        """The owner's connection broke during a recovery request."""
        if await self._endpoint.reachable(owner):
            return None  # only the connection broke (a reset): fetch again
        return serialize_error(exceptions.OwnerDiedError(
            f"the owner of object {object_id.hex()} ({owner}) died, so the object "
            "cannot be retrieved"))

    def handle_recover_object(self, conn, object_id: bytes, lost: list) -> SerializedObject | None:
        """The copies of an object this process owns at ``lost`` could not be
        read. Returns None when the object can be fetched again (another
        copy exists, or its task is re-running), else the error."""
        oid = ObjectID(object_id)
        references = self._references
        entry = references.refs.get(oid)
        if entry is None:
            return serialize_error(exceptions.ObjectLostError(
                f"object {oid.hex()} was freed: no reference to it remained"))
        # What the owner knew when asked: the simtest holds what recovery
        # then does (frees, drops, re-runs) against the copies still good.
        self._tracer.record(self._name, "object_recovery", object=oid, owner=self._address,
                            ready=entry.ready, known=[node for node, _ in entry.locations],
                            lost=sorted({location[0] for location in lost}))
        if not entry.ready:
            return None  # being re-created already
        lost = [tuple(location) for location in lost]
        if oid.is_put() and self._references.has_copy_here(oid):
            # A put cannot be re-created, and its first copy is here, in its
            # owner's node's store: a reader that could not read it (cut off
            # by a partition, a slow node, a reset) lost nothing, and
            # freeing it would (chaos seed 13: a put's only copy freed from
            # the live head node). The reader reads again. (A put's first
            # location is its owner's node: ``store_value``.)
            lost = [location for location in lost if location not in entry.locations[:1]]
        for _node_id, manager in sorted(set(lost) & set(entry.locations)):
            self._outbox.send_later(manager, "free_objects", [object_id])  # if it lives after all
        references.set_locations(oid, entry, tuple(loc for loc in entry.locations if loc not in lost))
        if entry.locations:
            return None
        where = sorted({node_id for node_id, _ in lost})
        if oid.is_put():
            return serialize_error(exceptions.ObjectLostError(
                f"object {oid.hex()} was lost with node(s) {where}; it was created by put(), "
                "so it cannot be re-created (only task results can)"))
        task = self._task_manager.lineage.get(oid.task_id())
        if task is None:
            return serialize_error(exceptions.ObjectReconstructionFailedError(
                f"object {oid.hex()} was lost with node(s) {where} and cannot be re-created: "
                "it was returned by an actor call, or its task's lineage was evicted (at most "
                f"lineage_tasks_max={self._config.lineage_tasks_max} finished tasks are kept)"))
        spec = task.spec
        if task.retries_left == 0:
            return serialize_error(exceptions.ObjectReconstructionFailedError(
                f"object {oid.hex()} (a result of task {spec.name}) was lost with node(s) "
                f"{where} and cannot be re-created: the task's retries are used up "
                f"(max_retries={spec.max_retries}, it ran {spec.attempt + 1} time(s))"))
        holds = []
        for arg in spec.ref_args():
            arg_id = ObjectID(arg.object_id)
            arg_entry = references.refs.get(arg_id)
            if arg_entry is None:
                references.release_submitted(holds)
                return serialize_error(exceptions.ObjectReconstructionFailedError(
                    f"object {oid.hex()} (a result of task {spec.name}) was lost with node(s) "
                    f"{where} and cannot be re-created: its argument {arg.object_id.hex()} "
                    "was freed"))
            arg_entry.submitted += 1
            holds.append(arg_id)
        spend_retry(task)
        spec = task.spec  # (an attempt on)
        for return_id in spec.return_ids:
            returned = references.refs.get(ObjectID(return_id))
            if returned is not None:
                returned.ready, returned.inline = False, None
                references.set_locations(ObjectID(return_id), returned, ())
        again = PendingTask(spec, task.retries_left, tuple(holds))
        self._task_manager.add(again)
        # ``by``: the reader that found no copy, for the simtest's attribution
        # of re-runs (a re-run's own argument, released once only lineage
        # needed it, is re-run in turn: the first re-run's cause is its).
        self._tracer.record(self._name, "task_reconstruct", task=spec.task_id,
                            attempt=spec.attempt, object=oid,
                            by=conn.peer if conn is not None else self._address)
        logger.info("re-running task %s to re-create lost object %s", spec.name, oid.hex())
        self._bridge.start_soon(self._submitter.submit, again)
        return None

