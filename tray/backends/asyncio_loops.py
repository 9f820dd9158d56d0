"""The asyncio loop async actors' methods run on, for both backends:
trio-asyncio's, on the worker's trio loop (``ProcessEnv.asyncio_loops``).

trio-asyncio, and asyncio with it, are imported by the first async actor,
not at a process's start (~30 ms that every node and worker paid).

A method's task is awaited from trio as trio-asyncio's ``run_aio_future``
awaits a future, with one change: trio tells the tasks a cancel reaches one
after the other in the order of sets of them (of trio's tasks and cancel
scopes, hashed by address), and trio-asyncio's cancels each asyncio task on
the spot, which queues its next step on the asyncio loop in that order: a
worker killed with several calls running replayed differently from run to
run (serve simtest seed 108). Here the cancels told at once go together, on
the loop's next turn, in the order their waits began."""

from __future__ import annotations

import itertools
import sys

import outcome
import trio

# When each wait began: the order its future's cancel goes in.
_wait_order = itertools.count()
# Per loop, the cancels waiting for its next turn: {wait order: future}.
_cancels: dict = {}


class TrioAsyncioLoops:
    """``tray.core.interfaces.AsyncioLoops`` on trio-asyncio."""

    @staticmethod
    def open_loop():
        import trio_asyncio

        return trio_asyncio.open_loop()

    @staticmethod
    def run_aio_future(future):
        return _run_aio_future(future)


async def _run_aio_future(future):
    """trio-asyncio's ``run_aio_future`` (0.16), its cancel put in order:
    the future's value, or its error; a trio cancel cancels the future and
    raises Cancelled once it is (its value, if it got one first)."""
    import asyncio

    task = trio.lowlevel.current_task()
    order = next(_wait_order)
    raise_cancel = None

    def done_cb(_future) -> None:
        trio.lowlevel.reschedule(task, outcome.capture(future.result))

    future.add_done_callback(done_cb)

    def abort_cb(raise_cancel_arg) -> trio.lowlevel.Abort:
        nonlocal raise_cancel
        raise_cancel = raise_cancel_arg
        if not future.done():
            _cancel_soon(future, order)
        return trio.lowlevel.Abort.FAILED  # the future's end wakes the task

    try:
        return await trio.lowlevel.wait_task_rescheduled(abort_cb)
    except asyncio.CancelledError as cancelled_there:
        if raise_cancel is None:
            raise  # cancelled in asyncio, not by trio
        try:
            raise_cancel()
        finally:
            sys.exc_info()[1].__cause__ = cancelled_there


def _cancel_soon(future, order: int) -> None:
    loop = future.get_loop()
    pending = _cancels.get(loop)
    if pending is None:
        loop.call_soon(_cancel_pending, loop)
        pending = _cancels[loop] = {}
    pending[order] = future


def _cancel_pending(loop) -> None:
    for _order, future in sorted(_cancels.pop(loop).items()):
        future.cancel()


TRIO_ASYNCIO = TrioAsyncioLoops()
