"""Where a core worker's trio loop is, and how work gets onto it.

A worker process runs its core worker on a trio loop. Most calls into the
core already run on that loop (handlers, background tasks, user code inside
tasks, which runs inline in its trio task). The driver is different: the
user's script runs outside trio — in the simulator on the same thread as
the (guest-mode) loop, in the local backend on a thread of its own beside
the loop's thread — and calls in through the API layer. A worker's threaded
actor runs synchronous methods in threads of its own (the backend's
``run_sync_in_thread``), which call in the same way. This bridge is the one
place that knows the difference: components ask it to start a task "from
anywhere", and it picks the right way.

Every task it starts runs with ``current_worker`` set to its core worker,
which the simulator needs: every simulated process shares one OS process,
and the contextvar is how code finds its own."""

from __future__ import annotations

from collections.abc import Callable

import trio

from ..context import current_worker


class LoopBridge:
    def __init__(self, worker, nursery: trio.Nursery, *,
                 call_soon_from_outside: Callable | None,
                 loop_in_other_thread: bool) -> None:
        self._worker = worker
        self.nursery = nursery
        # call_soon_from_outside(fn) runs fn on the loop soon; the driver's
        # runtime supplies it for calls made from the user's thread, and the
        # loop's token serves a worker's threads.
        # (A worker's method threads call into the loop with this token:
        # they are not trio's own threads, which know it by themselves.)
        self.trio_token = trio.lowlevel.current_trio_token()
        if call_soon_from_outside is None:
            call_soon_from_outside = self.trio_token.run_sync_soon
        self._call_soon_from_outside = call_soon_from_outside
        # The local backend's driver runs its loop in a thread of its own;
        # the simulator's runs in the user's thread.
        self.loop_in_other_thread = loop_in_other_thread

    def in_user_thread(self) -> bool:
        """True when called from outside this worker's trio tasks: the
        driver's own code, or a thread of a threaded actor."""
        return current_worker.get(None) is None or not trio.lowlevel.in_trio_run()

    def in_worker_thread(self) -> bool:
        """True in a thread a worker runs a synchronous method in."""
        return current_worker.get(None) is not None and not trio.lowlevel.in_trio_run()

    def off_loop_thread(self) -> bool:
        """True where the loop runs in another thread than the caller's (the
        local backend's driver code, a worker's method threads): state is
        then changed on the loop, never from here."""
        if current_worker.get(None) is None:
            return self.loop_in_other_thread
        return not trio.lowlevel.in_trio_run()

    def call_soon_from_outside(self, fn: Callable[[], object]) -> None:
        """Run the plain function ``fn`` on the loop soon (from the user's
        thread); raises if the loop has ended."""
        self._call_soon_from_outside(fn)

    def spawn(self, async_fn, *args) -> None:
        """Start ``async_fn`` as a task of this process, from anywhere."""
        if self.in_user_thread():
            self._call_soon_from_outside(lambda: self.nursery.start_soon(self.in_context,
                                                                         async_fn, *args))
        else:
            self.nursery.start_soon(self.in_context, async_fn, *args)

    def start_soon(self, async_fn, *args) -> None:
        """Start ``async_fn`` as a task of this process, from the loop."""
        self.nursery.start_soon(self.in_context, async_fn, *args)

    async def in_context(self, async_fn, *args) -> None:
        current_worker.set(self._worker)
        await async_fn(*args)
