"""Small asyncio helpers the controller's pieces share: its clock, spawning
a task whose error is retrieved, awaiting a ref from a task of its own, and
an error's one-line text for logs and statuses.

Everything of the controller runs on its actor's asyncio loop (on
trio-asyncio: in the simulator on virtual time), so its clock is the loop's
and its background work is asyncio tasks."""

from __future__ import annotations

import asyncio


def loop_time() -> float:
    """The controller's clock: the running loop's (virtual time in the simulator)."""
    return asyncio.get_running_loop().time()


async def await_ref(ref):
    return await ref


def spawn(coroutine) -> asyncio.Task:
    """The coroutine as a task of the running loop; its error, if any, is
    retrieved (the task's owner reads it, or nobody needs it)."""
    task = asyncio.get_running_loop().create_task(coroutine)
    task.add_done_callback(lambda t: t.cancelled() or t.exception())
    return task


def error_text(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"
