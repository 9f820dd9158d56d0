"""Work a user's thread hands to the core worker's loop without waiting.

The local backend's driver runs its trio loop in a thread of its own, and
the user's script calls in from another. Handing each call over with
``trio.from_thread.run_sync`` costs a wake-up of the loop *and* a wait for
its reply: at ~3,200 ``.remote()`` calls per second that crossing was a
third of the driver's time. Nothing a submission does on the loop has an
answer the caller needs (its ids and refs are made on the caller's side),
so the caller queues the operation here and goes on; the loop runs what is
queued in order, in one callback per batch. The loop is woken only when the
queue goes from empty to non-empty: a burst of 100,000 ``.remote()`` calls
costs as many wake-ups as the loop takes turns, not 100,000.

Order is the point. One queue holds every kind of operation from every
thread (a submission, a ref's local reference counted up, one counted
down), so what a thread did first the loop does first: a ref handed from
one thread to another and dropped there is counted down after it was
counted up, and a crossing that waits (``trio.from_thread.run``, a
``get``) is queued on trio's own FIFO after the batch callback, so it sees
every submission made before it.

A drain runs until the queue is empty, and the user's thread may keep
filling it (the two threads take turns with the GIL): a burst of 3,000
``.remote()`` calls is one drain of ~150 ms, and the loop's pass, at whose
end a connection's queued messages are written, ends only after it. So every
``FLUSH_EVERY_OPS`` operations the drain has the transport write what they
queued (``flush``): the calls reach their actor or workers while the burst
goes on, not after it. Measured (1:1 actor calls async, bursts of 3,000
calls): the actor did 0-40 ms of its ~250 ms of work during the burst
before.

The queue is bounded: a thread that finds ``max_queued`` operations
waiting blocks until the loop has run them (backpressure, not an error: the
loop is alive and busy); only if the loop runs none for ``stall_timeout_s``
does the call fail, with a message saying so. (Threads that find room at
the same moment may each add one past the bound: it is a bound per thread
count, not an exact one, as appending takes no lock.)"""

from __future__ import annotations

import collections
import logging
from collections.abc import Callable
from dataclasses import dataclass

from ...exceptions import TrayError
from ..context import current_worker

logger = logging.getLogger("tray.worker")

MAX_QUEUED_OPS = 20_000
STALL_TIMEOUT_S = 60.0
# A draining loop tells threads waiting for room that there is some at
# least this often (and whenever the queue is empty).
ROOM_NOTICE_OPS = 1_000
# A drain has the transport write what its operations queued this often.
FLUSH_EVERY_OPS = 64


@dataclass(frozen=True)
class ThreadInboxStatistics:
    queued: int  # operations waiting for the loop now
    ops: int  # operations run on the loop so far
    batches: int  # wake-ups of the loop that ran them


class SingleThread:
    """The lock and condition of a world with one thread (the simulator's
    driver runs in the loop's own thread): nothing to exclude, and while
    the caller waits nobody else could make room."""

    def __enter__(self) -> SingleThread:
        return self

    def __exit__(self, *exc) -> None:
        return None

    def wait_for(self, predicate: Callable[[], bool], timeout: float | None = None) -> bool:
        return predicate()

    def notify_all(self) -> None:
        return None


class ThreadInbox:
    def __init__(self, worker, call_soon: Callable, *, max_queued: int = MAX_QUEUED_OPS,
                 stall_timeout_s: float = STALL_TIMEOUT_S, condition=None,
                 flush: Callable[[], None] | None = None) -> None:
        self._worker = worker
        self._call_soon = call_soon  # runs a plain function on the loop soon, from any thread
        self._flush = flush  # writes the messages queued so far (on the loop), or None
        self._max_queued = max_queued
        self._stall_timeout_s = stall_timeout_s
        # The backend's (``ProcessEnv.thread_condition``): the core starts and
        # knows no threads. Re-entrant: a ref's __del__ (the garbage
        # collector runs it at any allocation) may queue its count-down
        # while this thread holds it.
        self._taken = condition if condition is not None else SingleThread()
        self._lock = self._taken
        self._ops: collections.deque = collections.deque()
        self._scheduled = False  # a drain callback is queued on the loop or running
        self._ops_run = 0
        self._batches = 0

    def put(self, fn: Callable, *args) -> None:
        """Run ``fn(*args)`` on the loop, after everything queued before it;
        returns at once. Raises if the loop has ended, or (after waiting
        ``stall_timeout_s``) if the queue stays full.

        The operation is appended without the lock (a deque's append and
        ``popleft`` are atomic): the lock is taken only to wake the loop,
        when no drain is scheduled, and to wait for room. A list of 10,000
        refs dropped at once is 10,000 count-downs; taking the lock for
        each was a third of the dropping thread's time."""
        ops = self._ops
        if len(ops) >= self._max_queued:
            self._wait_for_room()
        op = (fn, args)
        ops.append(op)
        if self._scheduled:
            return  # the drain runs it: it re-checks the queue after it stops (_drain)
        with self._lock:
            if self._scheduled:
                return
            self._scheduled = True
            try:
                self._call_soon(self._drain)
            except BaseException:
                self._scheduled = False
                try:
                    ops.remove(op)  # nothing will run it (an equal one is as good)
                except ValueError:
                    pass
                raise

    def _wait_for_room(self) -> None:
        with self._lock:
            if not self._taken.wait_for(lambda: len(self._ops) < self._max_queued,
                                        self._stall_timeout_s):
                raise TrayError(
                    f"the driver's event loop took none of the {len(self._ops)} queued "
                    f"submissions in {self._stall_timeout_s} s; it is stuck or gone")

    def put_quietly(self, fn: Callable, *args) -> None:
        """``put``, for work that has nothing to do once the loop has ended
        (a ref dropped at interpreter exit)."""
        try:
            self.put(fn, *args)
        except Exception:  # noqa: BLE001 - the loop is gone: nothing is left to count
            pass

    def _drain(self) -> None:
        """On the loop: run every queued operation, in order, then stop.

        It says it stopped (``_scheduled``) before it looks at the queue a
        last time, under the lock: a thread that appended after that look
        sees it stopped and wakes the loop again; one that appended before
        it is run here."""
        self._batches += 1
        token = current_worker.set(self._worker)
        ops = self._ops
        flush = self._flush
        run_here = 0
        try:
            while True:
                while ops:
                    fn, args = ops.popleft()
                    self._ops_run += 1
                    run_here += 1
                    try:
                        fn(*args)
                    except Exception:  # noqa: BLE001 - one operation's bug must not end the loop
                        logger.exception("tray: an operation queued from a user thread failed")
                    if not run_here % FLUSH_EVERY_OPS and flush is not None:
                        try:
                            flush()
                        except Exception:  # noqa: BLE001 - the loop's pass writes them instead
                            logger.exception("tray: writing queued messages failed")
                    if not self._ops_run % ROOM_NOTICE_OPS:
                        with self._lock:  # (threads may keep it from emptying: room now)
                            self._taken.notify_all()
                with self._lock:
                    self._taken.notify_all()  # room for threads waiting in put
                    self._scheduled = False
                    if not ops:
                        return
                    self._scheduled = True
        finally:
            current_worker.reset(token)

    def __len__(self) -> int:
        return len(self._ops)

    def statistics(self) -> ThreadInboxStatistics:
        return ThreadInboxStatistics(queued=len(self._ops), ops=self._ops_run,
                                     batches=self._batches)

    def validate_state(self) -> None:
        """From the loop's thread, between its steps: the counters, and
        what is queued has a drain coming. O(1).

        With a condition of the backend's (real threads), a user's thread
        may be between appending and scheduling the drain, or one past the
        bound (see the module header): those two hold exactly only in a
        world of one thread (``SingleThread``: the simulator's)."""
        assert self._ops_run >= 0, self._ops_run
        assert self._batches >= 0, self._batches
        if isinstance(self._taken, SingleThread):
            assert len(self._ops) <= self._max_queued, len(self._ops)
            # (Whoever queues the first operation schedules the drain, and
            # the drain stops only once the queue is empty.)
            assert not self._ops or self._scheduled, len(self._ops)
