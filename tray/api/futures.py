"""What Ray's API hands the user's threads and asyncio for a ref.

The core runs on trio only and starts no thread (the layer rule,
``docs/architecture.md`` section 1), but Ray's API hands users objects of
those worlds: ``ref.future()`` is a ``concurrent.futures.Future``,
``ref.as_future()`` an ``asyncio.Future``, and ``await ref`` works in a
driver's ``asyncio.run`` and in an async actor's methods. Those objects are
made here, above the core, and attached to the core's ``ObjectRef`` when
this module is imported (``ObjectRef.user_world``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures

import greenback
import trio

from ..core.context import current_task, current_worker, get_worker
from ..core.object_ref import ObjectRef
from .blocking import block
from .session import ensure_worker


def asyncio_running() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def trio_asyncio_loop():
    """The running asyncio loop when it is trio-asyncio's (async actors'),
    else None."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return None
    return loop if hasattr(loop, "trio_as_future") else None

# ``ref.future()`` (a concurrent.futures.Future), ``ref.as_future()`` and
# ``await ref`` from asyncio code in the driver, as Ray's. A task on the
# worker's own loop waits for the object (as ``get`` would) and resolves
# the future there: on the local backend the loop has a thread of its own,
# so the future completes by itself; in the simulator the loop runs in the
# user's thread only while something runs the simulation — any blocking
# tray call, the driver's ``time.sleep``, the future's own ``result()`` /
# ``exception()``, or an ``await`` of the ref (which runs it in slices of
# virtual time, letting the driver's other asyncio tasks run between them).

# Virtual seconds the simulator runs per slice while asyncio code awaits a ref.
AWAIT_SLICE_S = 1.0


class ObjectRefFuture(concurrent.futures.Future):
    """The future of one ObjectRef. Cancelling it does not cancel the task,
    and ``running()`` is always False, as in Ray. Its callbacks run on
    tray's event loop: they must not block (no ``tray.get`` in them)."""

    def __init__(self, ref: ObjectRef, worker) -> None:
        super().__init__()
        self.object_ref = ref  # holds the object while the future lives, as Ray's
        self._worker = worker
        self._resolved = trio.Event()  # set on the worker's loop

    def result(self, timeout=None):
        if self._run_until_done(timeout):
            timeout = 0  # it ran here: nothing else will complete it meanwhile
        return super().result(timeout)

    def exception(self, timeout=None):
        if self._run_until_done(timeout):
            timeout = 0
        return super().exception(timeout)

    def _run_until_done(self, timeout) -> bool:
        """Where no other thread runs the worker's loop (the simulator's
        driver, or a task on the worker's loop), run it here until the
        future is done or ``timeout`` seconds (virtual ones in the
        simulator) have passed. True if it did."""
        worker = self._worker
        if self.done() or worker.bridge.off_loop_thread():
            return False  # the loop's own thread completes it meanwhile
        if not worker.in_user_thread() and not greenback.has_portal():
            return False
        block(worker, self._wait_async, timeout)
        return True

    async def _wait_async(self, timeout) -> None:
        with trio.move_on_after(float("inf") if timeout is None else timeout):
            await self._resolved.wait()


async def _resolve(future: ObjectRefFuture) -> None:
    current_task.set(None)  # not a task's own wait: it lends no CPU back
    try:
        value = await future._worker.get_async([future.object_ref], None, True)
    except trio.Cancelled:
        _settle(future, exception=_shut_down())
        raise
    except BaseException as error:  # the task's error is the future's
        _settle(future, exception=error)
    else:
        _settle(future, result=value)
    finally:
        future._resolved.set()


def _settle(future, *, result=None, exception=None) -> None:
    if future.done():  # cancelled by its user: nothing to tell
        return
    if exception is not None:
        future.set_exception(exception)
    else:
        future.set_result(result)


def _shut_down():
    from ..exceptions import TrayError

    return TrayError("tray shut down before the object was ready")


def ref_future(ref: ObjectRef) -> ObjectRefFuture:
    worker = ref._worker or ensure_worker()
    future = ObjectRefFuture(ref, worker)
    worker.spawn(_resolve, future)
    return future


async def await_from_asyncio(ref: ObjectRef):
    """``await ref`` in asyncio code (outside tray's own loop)."""
    future = ref_future(ref)
    worker = future._worker
    if not worker.bridge.off_loop_thread():
        # The simulator: run it a slice at a time, yielding to the driver's
        # other asyncio tasks in between.
        while not future.done():
            block(worker, future._wait_async, AWAIT_SLICE_S)
            await asyncio.sleep(0)
        return future.result()
    return await asyncio.wrap_future(future)


def as_asyncio_future(ref: ObjectRef):
    worker = ref._worker or ensure_worker()
    if not worker.bridge.off_loop_thread():  # the simulator's driver
        return asyncio.ensure_future(await_from_asyncio(ref))
    return asyncio.wrap_future(ref_future(ref))


def await_ref(ref: ObjectRef):
    """What ``await ref`` awaits outside tray's own trio code, or None there:
    in an async actor's asyncio code (on trio-asyncio, on the worker's
    loop) the worker's wait through that loop; in other asyncio code (a
    driver under ``asyncio.run``) ``await_from_asyncio``."""
    loop = trio_asyncio_loop()
    if loop is not None and current_worker.get(None) is not None:
        worker = ref._worker or get_worker()
        return loop.trio_as_future(worker.get_async, [ref], None, True)
    if asyncio_running():
        return await_from_asyncio(ref)
    return None


class _UserWorld:
    """``ObjectRef.user_world``: the user's side of a ref."""
    await_ref = staticmethod(await_ref)
    future = staticmethod(ref_future)
    as_future = staticmethod(as_asyncio_future)


ObjectRef.user_world = _UserWorld
