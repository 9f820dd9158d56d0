"""Objects: ``get``, ``put``, ``wait`` and ``cancel``.

On the local backend, where the driver's loop has a thread of its own, the
driver script's small ``put`` does not wait for the loop (it queues its work
for it: ``core/worker/thread_inbox``), and ``get`` of an object already in
the driver's memory reads it without entering the loop."""

from __future__ import annotations

import numbers

from ..core.object_ref import ObjectRef
from .blocking import block, in_loop
from .session import ensure_worker

# ========================================================== get/put/wait

def _check_timeout(timeout) -> None:
    if timeout is not None and (isinstance(timeout, bool) or
                                not isinstance(timeout, numbers.Real) or timeout < 0):
        raise ValueError(f"timeout must be None or a non-negative number of seconds, "
                         f"got {timeout!r}")


def get(object_refs, *, timeout: float | None = None):
    """The value(s) of one ref or a list of refs; raises the task's error."""
    worker = ensure_worker()
    _check_timeout(timeout)
    fast = worker.queues_from_thread()
    if isinstance(object_refs, ObjectRef):
        if fast:
            ready = worker.get_ready([object_refs])
            if ready is None:
                ready = worker.get_from_thread([object_refs], timeout)
            if ready is not None:
                return ready[0]
        return block(worker, worker.get_async, [object_refs], timeout, True)
    if not isinstance(object_refs, (list, tuple)):
        raise TypeError(f"get() expects an ObjectRef or a list of ObjectRefs, "
                        f"got {type(object_refs).__name__}")
    for ref in object_refs:
        if not isinstance(ref, ObjectRef):
            raise TypeError(f"get() expects a list of ObjectRefs, but it contains "
                            f"a {type(ref).__name__}: {ref!r}")
    if not object_refs:
        return []
    if fast:
        # Objects this driver owns, already in its memory: read here, not
        # on the loop (no thread crossing; measured in the H1 report).
        ready = worker.get_ready(object_refs)
        if ready is None:
            # Owned here but not ready: wait on a condition of this thread's
            # own, which the loop notifies (CoreWorker.get_from_thread).
            ready = worker.get_from_thread(list(object_refs), timeout)
        if ready is not None:
            return ready
    return block(worker, worker.get_async, list(object_refs), timeout)


def put(value) -> ObjectRef:
    """Store ``value`` in the object store; returns its ref."""
    worker = ensure_worker()
    if worker.queues_from_thread():
        # The driver's script (local backend): serialized here, stored by
        # the loop later without waiting when small (see CoreWorker.queue_put).
        serialized = worker.serialize_put(value)
        ref = worker.queue_put(serialized)
        return ref if ref is not None else in_loop(worker, worker.put_serialized, serialized)
    return in_loop(worker, worker.put, value)


def wait(object_refs, *, num_returns: int = 1, timeout: float | None = None,
         fetch_local: bool = True):
    """(ready, not_ready): the first ``num_returns`` refs to be ready, in
    the input order, within ``timeout`` seconds."""
    worker = ensure_worker()
    if isinstance(object_refs, ObjectRef):
        raise TypeError("wait() expects a list of ObjectRefs, got a single ObjectRef; "
                        "wrap it in a list")
    if not isinstance(object_refs, (list, tuple)):
        raise TypeError(f"wait() expects a list of ObjectRefs, got {type(object_refs).__name__}")
    for ref in object_refs:
        if not isinstance(ref, ObjectRef):
            raise TypeError(f"wait() expects a list of ObjectRefs, but it contains a "
                            f"{type(ref).__name__}: {ref!r}")
    if not object_refs:
        return [], []
    if len({ref._id._binary for ref in object_refs}) != len(object_refs):  # (bytes hash in C)
        raise ValueError("wait() requires a list of unique ObjectRefs")
    if isinstance(num_returns, bool) or not isinstance(num_returns, int) or num_returns <= 0:
        raise ValueError(f"num_returns must be a positive integer, got {num_returns!r}")
    if num_returns > len(object_refs):
        raise ValueError(f"num_returns ({num_returns}) cannot exceed the number of refs "
                         f"({len(object_refs)})")
    _check_timeout(timeout)
    if worker.queues_from_thread():
        # Objects this driver owns: answered in this thread, waiting (when
        # needed) on a condition the loop notifies (CoreWorker.wait_from_thread).
        answer = worker.wait_from_thread(object_refs, num_returns, timeout, bool(fetch_local))
        if answer is not None:
            return answer
    return block(worker, worker.wait_async, list(object_refs), num_returns, timeout,
                  bool(fetch_local))


def cancel(object_ref: ObjectRef, *, force: bool = False, recursive: bool = True) -> None:
    """Cancel the task that creates ``object_ref``; ``get`` then raises
    TaskCancelledError. ``force=True`` kills the worker running it."""
    worker = ensure_worker()
    if not isinstance(object_ref, ObjectRef):
        raise TypeError(f"cancel() expects an ObjectRef, got {type(object_ref).__name__}")
    block(worker, worker.cancel_async, object_ref, force, recursive)

