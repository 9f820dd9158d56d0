"""``Queue``: a first-in, first-out queue shared by tasks and actors, as
Ray's ``ray.util.queue.Queue``.

The queue lives in one async actor (``_QueueActor``); a ``Queue`` object is
a thin client holding that actor's handle, so it can be passed to tasks and
actors, which all see the same queue.

Blocking without polling. A ``get`` on an empty queue (or a ``put`` on a
full one) is one actor call that stays open until it can be served: the
actor parks the caller in a FIFO line of waiters and the ``put`` (or
``get``) that makes room hands the item over directly and wakes it. The
timeout runs inside the actor, on the actor's clock, so there is no
client-side loop at all, and in the simulator the wait is virtual time
like any other. Ray does the same over an ``asyncio.Queue``.

Why not ``asyncio.Queue`` or ``trio``'s channels: the actor's methods must
run on whichever event loop the runtime gives async actors (trio today; an
asyncio loop is planned), so the waiters are plain ``Event`` objects of the
running library (``sniffio`` tells which), and the queue logic itself is
ordinary code on a ``deque``, the same on both.

Every method of the actor is ``async def``, so all of them run on the
actor's one event loop and never interleave between two statements; the
invariants (``_validate``) hold between any two awaits:

* items waiting and getters waiting are never both non-empty;
* putters wait only while the queue is full (``maxsize > 0``);
* the queue never holds more than ``maxsize`` items.

Limits: ``maxsize`` bounds the items (0 means unbounded, Ray's default,
the caller's explicit choice); callers blocked at once are bounded by the
actor's ``max_concurrency`` (1000 by default for an async actor; further
calls wait at the actor, within ``actor_pending_calls_max``).

A caller that goes away while its ``get`` is parked (its process died) does
not un-park it: the next item is handed to that call and lost with its
reply, as in Ray. A parked call that is cancelled puts its item back.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import numbers
import queue as _stdlib_queue
from collections.abc import Iterable
from typing import Any

import sniffio

import tray

__all__ = ["Queue", "Empty", "Full", "QueueStatistics"]


class Empty(_stdlib_queue.Empty):
    """The queue was empty: ``get(block=False)``, or ``get`` timed out."""


class Full(_stdlib_queue.Full):
    """The queue was full: ``put(block=False)``, or ``put`` timed out."""


# Both are raised inside the actor and travel to the caller; keep the public
# module in their reprs and pickles.
Empty.__module__ = Full.__module__ = "tray.util.queue"


@dataclasses.dataclass(frozen=True)
class QueueStatistics:
    """The queue actor's state at one moment."""
    size: int              # items in the queue
    maxsize: int           # 0: unbounded
    getters_waiting: int   # get calls parked on an empty queue
    putters_waiting: int   # put calls parked on a full queue


# ============================================================ the actor


class _Signal:
    """A one-shot wake-up for the event loop this actor method runs on."""

    def __init__(self) -> None:
        self._library = sniffio.current_async_library()
        if self._library == "trio":
            import trio
            self._event = trio.Event()
        elif self._library == "asyncio":
            import asyncio
            self._event = asyncio.Event()
        else:  # pragma: no cover - tray runs actors on trio or asyncio only
            raise RuntimeError(f"tray.util.queue cannot wait on {self._library!r}")

    def set(self) -> None:
        self._event.set()

    async def wait(self, timeout_s: float | None) -> None:
        """Until set, or ``timeout_s`` seconds have passed (``None``: no limit)."""
        if timeout_s is None:
            await self._event.wait()
        elif self._library == "trio":
            import trio
            with trio.move_on_after(timeout_s):
                await self._event.wait()
        else:
            import asyncio
            try:
                async with asyncio.timeout(timeout_s):
                    await self._event.wait()
            except TimeoutError:
                pass


class _Waiter:
    """A parked ``get`` (item: what it was handed) or ``put`` (item: what it
    brings)."""
    __slots__ = ("signal", "item", "served")

    def __init__(self, item: Any = None) -> None:
        self.signal = _Signal()
        self.item = item
        self.served = False


class _QueueActor:
    """The queue's state. Plain class; ``Queue`` makes it a remote actor."""

    def __init__(self, maxsize: int) -> None:
        self.maxsize = maxsize
        self.items: collections.deque = collections.deque()
        self.getters: collections.deque[_Waiter] = collections.deque()
        self.putters: collections.deque[_Waiter] = collections.deque()
        self.idle_signals: list[_Signal] = []  # graceful shutdowns waiting

    # ------------------------------------------------------------ queries

    async def qsize(self) -> int:
        return len(self.items)

    async def empty(self) -> bool:
        return not self.items

    async def full(self) -> bool:
        return self._full()

    def _full(self) -> bool:
        return 0 < self.maxsize <= len(self.items)

    async def statistics(self) -> QueueStatistics:
        return QueueStatistics(size=len(self.items), maxsize=self.maxsize,
                               getters_waiting=len(self.getters),
                               putters_waiting=len(self.putters))

    # ---------------------------------------------------------------- put

    async def put(self, item, timeout_s: float | None = None) -> None:
        if self._try_put(item):
            return
        if timeout_s == 0:
            raise Full("the queue is full")
        waiter = _Waiter(item)
        self.putters.append(waiter)
        try:
            await waiter.signal.wait(timeout_s)
        finally:
            if not waiter.served:
                self.putters.remove(waiter)
            self._validate()
        if not waiter.served:
            raise Full(f"the queue stayed full (maxsize={self.maxsize}) for {timeout_s} s")

    async def put_nowait(self, item) -> None:
        if not self._try_put(item):
            raise Full(f"the queue is full (maxsize={self.maxsize})")

    async def put_nowait_batch(self, items: list) -> None:
        room = len(self.getters) + (self.maxsize - len(self.items) if self.maxsize > 0
                                    else len(items))
        if len(items) > room:
            raise Full(f"cannot put {len(items)} items in a queue of maxsize {self.maxsize} "
                       f"holding {len(self.items)}; nothing was put")
        for item in items:
            assert self._try_put(item)

    def _try_put(self, item) -> bool:
        """Hand ``item`` to the first parked getter, or append it if there
        is room; False if the queue is full (or putters are ahead)."""
        if self.getters:
            assert not self.items
            getter = self.getters.popleft()
            getter.item, getter.served = item, True
            getter.signal.set()
            return True
        if self._full() or self.putters:
            return False
        self.items.append(item)
        self._validate()
        return True

    # ---------------------------------------------------------------- get

    async def get(self, timeout_s: float | None = None):
        if self.items:
            return self._take()
        if timeout_s == 0:
            raise Empty("the queue is empty")
        waiter = _Waiter()
        self.getters.append(waiter)
        try:
            await waiter.signal.wait(timeout_s)
        except BaseException:
            if waiter.served:  # cancelled after being handed an item: give it back
                self.items.appendleft(waiter.item)
                waiter.served = False
            raise
        finally:
            if not waiter.served and waiter in self.getters:
                self.getters.remove(waiter)
            self._validate()
        if not waiter.served:
            raise Empty(f"the queue stayed empty for {timeout_s} s")
        return waiter.item

    async def get_nowait(self):
        if not self.items:
            raise Empty("the queue is empty")
        return self._take()

    async def get_nowait_batch(self, num_items: int) -> list:
        if num_items > len(self.items):
            raise Empty(f"cannot get {num_items} items from a queue holding "
                        f"{len(self.items)}; nothing was taken")
        return [self._take() for _ in range(num_items)]

    def _take(self):
        item = self.items.popleft()
        if self.putters:  # room now: the first parked put goes in
            putter = self.putters.popleft()
            self.items.append(putter.item)
            putter.served = True
            putter.signal.set()
        self._validate()
        return item

    # ------------------------------------------------------------ shutdown

    async def wait_idle(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for every parked call to be served;
        whether none is left. (Used by a graceful ``shutdown``.)"""
        if not self.getters and not self.putters:
            return True
        signal = _Signal()
        self.idle_signals.append(signal)
        try:
            await signal.wait(timeout_s)
        finally:
            if signal in self.idle_signals:
                self.idle_signals.remove(signal)
        return not self.getters and not self.putters

    def _validate(self) -> None:
        assert not (self.items and self.getters), (len(self.items), len(self.getters))
        assert not self.putters or self.maxsize > 0
        assert self.maxsize <= 0 or len(self.items) <= self.maxsize, \
            (len(self.items), self.maxsize)
        if not self.getters and not self.putters:
            for signal in self.idle_signals:
                signal.set()
            self.idle_signals.clear()


# ============================================================ the client


class Queue:
    """A first-in, first-out queue on the cluster, as ``ray.util.queue.Queue``.

    ``maxsize`` bounds the number of items (0: unbounded). ``actor_options``
    go to the queue actor's ``.options()`` (resources, ``name``, ...).
    ``put``/``get`` block by default, up to ``timeout`` seconds (``None``: no
    limit), and raise ``Full``/``Empty`` when they give up; the ``_nowait``
    forms never block. A ``Queue`` can be passed to tasks and actors.

        q = Queue(maxsize=100)
        q.put(1)
        assert q.get(timeout=5) == 1
    """

    def __init__(self, maxsize: int = 0, actor_options: dict | None = None) -> None:
        if isinstance(maxsize, bool) or not isinstance(maxsize, int):
            raise TypeError(f"maxsize must be an int, got {type(maxsize).__name__}")
        if maxsize < 0:
            raise ValueError(f"maxsize must be >= 0 (0 means unbounded), got {maxsize}")
        if actor_options is not None and not isinstance(actor_options, dict):
            raise TypeError(f"actor_options must be a dict of actor options, got "
                            f"{type(actor_options).__name__}")
        self.maxsize = maxsize
        self.actor = _remote_queue_actor().options(**(actor_options or {})).remote(maxsize)

    def _handle(self):
        if self.actor is None:
            raise RuntimeError("this Queue was shut down (Queue.shutdown()); create a new one")
        return self.actor

    # ------------------------------------------------------------ queries

    def __len__(self) -> int:
        return self.size()

    def size(self) -> int:
        """The number of items in the queue."""
        return tray.get(self._handle().qsize.remote())

    def qsize(self) -> int:
        """The number of items in the queue."""
        return self.size()

    def empty(self) -> bool:
        return tray.get(self._handle().empty.remote())

    def full(self) -> bool:
        return tray.get(self._handle().full.remote())

    def statistics(self) -> QueueStatistics:
        """Items, capacity and parked callers, from the queue actor."""
        return tray.get(self._handle().statistics.remote())

    # ------------------------------------------------------------ put/get

    def put(self, item: Any, block: bool = True, timeout: float | None = None) -> None:
        """Add ``item``. On a full queue: with ``block``, wait up to
        ``timeout`` seconds for room, else raise ``Full``."""
        with _plain_queue_errors():
            tray.get(self._put_ref(item, block, timeout))

    def get(self, block: bool = True, timeout: float | None = None) -> Any:
        """Remove and return the oldest item. On an empty queue: with
        ``block``, wait up to ``timeout`` seconds for one, else raise ``Empty``."""
        with _plain_queue_errors():
            return tray.get(self._get_ref(block, timeout))

    async def put_async(self, item: Any, block: bool = True,
                        timeout: float | None = None) -> None:
        """``put`` for async code (an async actor): awaits instead of blocking."""
        with _plain_queue_errors():
            await self._put_ref(item, block, timeout)

    async def get_async(self, block: bool = True, timeout: float | None = None) -> Any:
        """``get`` for async code (an async actor): awaits instead of blocking."""
        with _plain_queue_errors():
            return await self._get_ref(block, timeout)

    def _put_ref(self, item, block, timeout):
        if not block:
            return self._handle().put_nowait.remote(item)
        return self._handle().put.remote(item, _timeout_s(timeout))

    def _get_ref(self, block, timeout):
        if not block:
            return self._handle().get_nowait.remote()
        return self._handle().get.remote(_timeout_s(timeout))

    def put_nowait(self, item: Any) -> None:
        """``put(item, block=False)``: raises ``Full`` at once on a full queue."""
        self.put(item, block=False)

    def get_nowait(self) -> Any:
        """``get(block=False)``: raises ``Empty`` at once on an empty queue."""
        return self.get(block=False)

    def put_nowait_batch(self, items: Iterable) -> None:
        """Put every item of ``items``, in order, or none: raises ``Full`` if
        they do not all fit."""
        if isinstance(items, (str, bytes)) or not isinstance(items, Iterable):
            raise TypeError(f"items must be an iterable of items, got {type(items).__name__}")
        with _plain_queue_errors():
            tray.get(self._handle().put_nowait_batch.remote(list(items)))

    def get_nowait_batch(self, num_items: int) -> list:
        """The ``num_items`` oldest items, in order, or none: raises
        ``Empty`` if the queue holds fewer."""
        if isinstance(num_items, bool) or not isinstance(num_items, int):
            raise TypeError(f"num_items must be an int, got {type(num_items).__name__}")
        if num_items < 0:
            raise ValueError(f"num_items must be >= 0, got {num_items}")
        with _plain_queue_errors():
            return tray.get(self._handle().get_nowait_batch.remote(num_items))

    # ------------------------------------------------------------ shutdown

    def shutdown(self, force: bool = False, grace_period_s: float = 5) -> None:
        """End the queue actor and release its resources. Unless ``force``,
        calls parked on the queue get up to ``grace_period_s`` seconds to be
        served first; whatever is still parked then fails with
        ``ActorDiedError``, as do later calls through copies of this queue."""
        if isinstance(grace_period_s, bool) or not isinstance(grace_period_s, numbers.Real) \
                or grace_period_s < 0:
            raise ValueError(f"grace_period_s must be a non-negative number of seconds, "
                             f"got {grace_period_s!r}")
        if self.actor is None:
            return
        actor, self.actor = self.actor, None
        if not force:
            try:
                tray.get(actor.wait_idle.remote(float(grace_period_s)))
            except tray.exceptions.TrayError:
                pass  # the actor is gone already
        tray.kill(actor)

    def __repr__(self) -> str:
        state = "shut down" if self.actor is None else repr(self.actor)
        return f"Queue(maxsize={self.maxsize}, {state})"


@contextlib.contextmanager
def _plain_queue_errors():
    """Raise the actor's ``Empty``/``Full`` as themselves: they are answers,
    not failures, and a remote traceback would only hide the message."""
    try:
        yield
    except tray.exceptions.TaskError as error:
        cause = error.cause
        if isinstance(cause, (Empty, Full)):
            raise type(cause)(*cause.args) from None
        raise


def _timeout_s(timeout) -> float | None:
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, numbers.Real):
        raise TypeError(f"'timeout' must be None or a number of seconds, got "
                        f"{type(timeout).__name__}")
    if timeout < 0:
        raise ValueError("'timeout' must be a non-negative number")
    return float(timeout)


_remote_class = None


def _remote_queue_actor():
    """The remote class, made on first use (this module may be imported
    while ``tray`` itself is still importing)."""
    global _remote_class
    if _remote_class is None:
        _remote_class = tray.remote(_QueueActor)
    return _remote_class
