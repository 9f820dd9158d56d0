"""One-way messages queued from anywhere and sent in order from the loop.

Reference counting must send messages from places that cannot wait: an
``ObjectRef.__del__`` (which may run in the user's thread, or in the middle
of another component's bookkeeping), a finished task's bookkeeping, a lease
given back. They go into this outbox, and one flusher task drains it in
order, so messages to one peer keep the order they were queued in (a
``remove_borrower`` never overtakes the ``add_borrower`` before it). They
are *reliable* one-way messages (``Endpoint.notify_reliable``): a broken
connection does not lose them.
A message addressed to this very process is handled in place by its
handler, still in queue order."""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass

from ..rpc import Endpoint
from .loop_bridge import LoopBridge

logger = logging.getLogger("tray.worker")


@dataclass(frozen=True)
class OutboxStatistics:
    queued: int  # one-way messages waiting for the flusher
    flush_scheduled: bool  # the flusher is started (or about to be)
    shutting_down: bool  # the process is ending: no flusher is started any more


class Outbox:
    def __init__(self, address: str, endpoint: Endpoint, bridge: LoopBridge) -> None:
        self._address = address
        self._endpoint = endpoint
        self._bridge = bridge
        self._queue: deque = deque()
        self._flush_scheduled = False
        self.shutting_down = False

    def __len__(self) -> int:
        return len(self._queue)

    def statistics(self) -> OutboxStatistics:
        return OutboxStatistics(queued=len(self._queue), flush_scheduled=self._flush_scheduled,
                                shutting_down=self.shutting_down)

    def validate_state(self) -> None:
        """The next message to go and the last one queued, each addressed
        and named: O(1) (a burst of ref drops queues thousands, sent one per
        step: walking them all after each step would be quadratic).

        Not asserted: that a queued message always has a flusher coming.
        It has, except where starting one failed because the run or the
        process is ending (and a flusher cancelled then), which a check
        between steps of a live process can still see."""
        if self._queue:
            for address, method, args in (self._queue[0], self._queue[-1]):
                assert type(address) is str and address, (address, method)
                assert type(method) is str and method, (address, method)
                assert type(args) is tuple, (address, method)

    def send_later(self, address: str, method: str, *args) -> None:
        """Queue a one-way message; safe from ``__del__`` and from outside trio."""
        if self._bridge.off_loop_thread():
            # Another thread than the loop's: the queue is the loop's alone.
            try:
                self._bridge.call_soon_from_outside(
                    lambda: self._queue_and_flush(address, method, args, on_loop=True))
            except Exception:  # the run has ended
                pass
            return
        self._queue_and_flush(address, method, args,
                              on_loop=not self._bridge.in_user_thread())

    def _queue_and_flush(self, address: str, method: str, args: tuple, on_loop: bool) -> None:
        self._queue.append((address, method, args))
        if self._flush_scheduled or self.shutting_down:
            return
        self._flush_scheduled = True
        if on_loop:
            self._schedule_flush()
            return
        try:
            self._bridge.call_soon_from_outside(self._schedule_flush)
        except Exception:  # the run has ended
            self._flush_scheduled = False

    def _schedule_flush(self) -> None:
        try:
            self._bridge.start_soon(self._flush)
        except RuntimeError:  # the process is shutting down
            self._flush_scheduled = False

    async def _flush(self) -> None:
        try:
            while self._queue:
                address, method, args = self._queue.popleft()
                if address == self._address:
                    try:
                        self._endpoint.handlers[method](None, *args)
                    except Exception:  # noqa: BLE001 - as a one-way message sent away would
                        logger.exception("one-way %s to this process failed", method)
                else:
                    await self._endpoint.notify_reliable(address, method, *args)
        finally:
            self._flush_scheduled = False
