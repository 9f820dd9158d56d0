"""ObjectRef: a future for an immutable object, counted by its owner.

Creating an ObjectRef adds a local reference in the process's core worker;
its ``__del__`` removes it. Pickling a ref (into task arguments, return
values or ``put`` objects) reports it to the serialization context so the
owner keeps it alive; unpickling it in another process makes that process a
*borrower*."""

from __future__ import annotations

import contextvars

from .context import current_worker, get_worker
from .ids import ObjectID
from .serialization import report_contained_ref

# Refs created while deserializing; the deserializing call registers them
# with their owners before handing the value to user code.
_new_borrows: contextvars.ContextVar = contextvars.ContextVar("tray_new_borrows")


class ObjectRef:
    __slots__ = ("_id", "_owner", "_worker", "__weakref__")

    def __init__(self, object_id: ObjectID, owner: str, worker=None) -> None:
        self._id = object_id
        self._owner = owner
        self._worker = worker
        if worker is not None:
            worker.add_local_ref(object_id, owner)

    @classmethod
    def counted_by_caller(cls, object_id: ObjectID, owner: str, worker) -> ObjectRef:
        """A ref whose local reference its maker counts itself: a submission
        or ``put`` counts its new refs on the loop, in the same step that
        registers the object (a user's thread queues that step, and the
        ref's count-down, if it is dropped first, is queued after it)."""
        ref = cls.__new__(cls)
        ref._id = object_id
        ref._owner = owner
        ref._worker = worker
        return ref

    def __del__(self) -> None:
        worker = self._worker
        if worker is not None:
            self._worker = None
            worker.remove_local_ref(self._id)

    def __reduce__(self):
        report_contained_ref(self._id.binary(), self._owner)
        return (_rebuild_ref, (self._id.binary(), self._owner))

    def object_id(self) -> ObjectID:
        return self._id

    def binary(self) -> bytes:
        return self._id.binary()

    def hex(self) -> str:
        return self._id.hex()

    def task_id(self):
        return self._id.task_id()

    def owner_address(self) -> str:
        return self._owner

    def __eq__(self, other) -> bool:
        return isinstance(other, ObjectRef) and other._id == self._id

    def __hash__(self) -> int:
        return hash(self._id)

    def __repr__(self) -> str:
        return f"ObjectRef({self._id.hex()})"

    def __await__(self):
        """``await ref``: in an async actor's asyncio code (on trio-asyncio)
        through that loop; in other asyncio code (a driver under
        ``asyncio.run``) through ``future()``; on trio (tasks, the
        simulator's own code) through the core worker directly."""
        from .. import _bridges

        loop = _bridges.trio_asyncio_loop()
        if loop is not None and current_worker.get(None) is not None:
            # asyncio code of an async actor (on trio-asyncio, on the worker's loop)
            worker = self._worker or get_worker()
            return loop.trio_as_future(worker.get_async, [self], None, True).__await__()
        if _bridges.asyncio_running():
            return _bridges.await_from_asyncio(self).__await__()
        worker = self._worker or get_worker()
        return worker.get_async([self], None, single=True).__await__()

    def future(self):
        """A ``concurrent.futures.Future`` of the object's value (or its
        error), as Ray's. Cancelling it does not cancel the task."""
        from .. import _bridges

        return _bridges.ref_future(self)

    def as_future(self):
        """An ``asyncio.Future`` of the object's value, as Ray's
        (``asyncio.wrap_future(ref.future())``)."""
        from .. import _bridges

        return _bridges.as_asyncio_future(self)


def _rebuild_ref(object_id: bytes, owner: str) -> ObjectRef:
    worker = get_worker(required=False)
    oid = ObjectID(object_id)
    if worker is None:
        return ObjectRef(oid, owner, None)
    is_new = owner != worker.address and not worker.knows(oid)
    ref = ObjectRef(oid, owner, worker)
    if is_new:
        pending = _new_borrows.get(None)
        if pending is not None:
            pending.append(ref)
        else:
            worker.register_borrow_later(oid, owner)
    return ref
