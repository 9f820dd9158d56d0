"""ObjectRef: a future for an immutable object, counted by its owner.

Creating an ObjectRef adds a local reference in the process's core worker;
its ``__del__`` removes it. Pickling a ref (into task arguments, return
values or ``put`` objects) reports it to the serialization context so the
owner keeps it alive; unpickling it in another process makes that process a
*borrower*."""

from __future__ import annotations

import contextvars

from .context import get_worker
from .ids import ObjectID
from .serialization import report_contained_ref

# Refs created while deserializing; the deserializing call registers them
# with their owners before handing the value to user code.
_new_borrows: contextvars.ContextVar = contextvars.ContextVar("tray_new_borrows")


class ObjectRef:
    __slots__ = ("_id", "_owner", "_worker", "__weakref__")

    # What Ray's API hands the user's threads and asyncio for a ref -- a
    # concurrent.futures.Future, an asyncio.Future, ``await ref`` under
    # ``asyncio.run`` -- is made above the core, which knows only trio: the
    # API layer sets this when it is imported (``tray/api/futures.py``).
    user_world = None

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
        """``await ref``: on trio (tasks, the simulator's own code) through
        the core worker directly; in asyncio code through the awaitable the
        API layer makes (``ObjectRef.user_world``)."""
        awaitable = ObjectRef.user_world.await_ref(self) if ObjectRef.user_world else None
        if awaitable is None:
            worker = self._worker or get_worker()
            awaitable = worker.get_async([self], None, single=True)
        return awaitable.__await__()

    def future(self):
        """A ``concurrent.futures.Future`` of the object's value (or its
        error), as Ray's. Cancelling it does not cancel the task."""
        return ObjectRef.user_world.future(self)

    def as_future(self):
        """An ``asyncio.Future`` of the object's value, as Ray's
        (``asyncio.wrap_future(ref.future())``)."""
        return ObjectRef.user_world.as_future(self)


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
