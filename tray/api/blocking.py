"""How the API blocks on the core: the user's call waits for an async
operation of the core worker, wherever it was made.

Calls from the user's own thread (the driver script) block through the
runtime (which runs the cluster's event loop until the answer is there);
calls from inside a task or actor -- already on a trio task -- block through
greenback, never a thread; calls from a threaded actor's method threads go
through ``trio.from_thread`` to the worker's loop."""

from __future__ import annotations

import contextlib

import greenback
import sniffio
import trio

from .. import _trio_private
from ..core.context import get_worker
from . import state


def in_loop(worker, fn, *args):
    """Run the synchronous ``fn`` where the worker's loop runs (the local
    backend's driver loop has a thread of its own, and a threaded actor's
    methods run in threads)."""
    if worker.bridge.in_worker_thread():
        return trio.from_thread.run_sync(fn, *args, trio_token=worker.bridge.trio_token)
    if worker.in_user_thread():
        with _outside_users_trio_run(worker):
            return state.runtime.run_sync(fn, *args)
    return fn(*args)


def block(worker, async_fn, *args):
    if worker.bridge.in_worker_thread():
        return trio.from_thread.run(async_fn, *args, trio_token=worker.bridge.trio_token)
    if worker.in_user_thread():
        with _outside_users_trio_run(worker):
            return state.runtime.run(async_fn, *args)
    loop = worker.actor_host.asyncio_loop
    if loop is not None and _in_asyncio_task():
        # An async actor's method (an asyncio task on trio-asyncio, with a
        # portal of its own: actor_host): the trio call runs as trio code
        # through the loop, and this method waits for it while the actor's
        # other asyncio tasks go on (Ray blocks the whole event loop instead).
        return greenback.await_(loop.trio_as_future(async_fn, *args))
    return greenback.await_(async_fn(*args))


def _in_asyncio_task() -> bool:
    try:
        return sniffio.current_async_library() == "asyncio"
    except sniffio.AsyncLibraryNotFoundError:
        return False


@contextlib.contextmanager
def _outside_users_trio_run(worker):
    """The driver's code may run inside a trio run of its own: ``asyncio.run``
    does once trio-asyncio is imported (it makes its SyncTrioEventLoop
    asyncio's default, and async actors import it), and so does a user's
    ``trio.run``. A blocking call from there must not look like code on a
    trio loop: the local backend's ``trio.from_thread`` would refuse it, and
    the simulator's steps, which run in this thread, would clobber that
    run's state. So the thread's trio run state is set aside for the call
    and put back after (``_trio_private.run_state_replaced``). In its place
    goes the runtime's own (``run_context``): the simulator's guest run,
    whose state trio-asyncio set aside in turn when it switched to its
    loop's greenlet."""
    if not trio.lowlevel.in_trio_run() or \
            trio.lowlevel.current_root_task() is _root_task(worker.bridge.nursery):
        yield  # no run, or the simulator's own (its loop runs in this thread)
        return
    with _trio_private.run_state_replaced(state.runtime.run_context):
        yield


def _root_task(nursery):
    task = nursery.parent_task
    while task.parent_nursery is not None:
        task = task.parent_nursery.parent_task
    return task


def gcs_call(method_name: str, *args):
    worker = get_worker()

    async def call():
        return await worker.gcs_call(method_name, *args)
    return block(worker, call)

