"""The user's threads waiting in ``get`` or ``wait`` for objects this process owns.

A driver whose loop runs in a thread of its own (the local backend's
driver script) has its user's threads read owned objects without entering
the loop whenever it can: a ready value held in this process's memory is
read in the caller's thread (``get_ready``); otherwise the thread sleeps on
a condition of its own (``ThreadGet``, ``ThreadWait``) and queues a watch
for the loop through the inbox, which wakes it when its refs are ready
(``get_from_thread``, ``wait_from_thread``). Anything else — a ref owned
elsewhere, a value in the node's store or holding refs — answers None and
the caller takes the loop's path (``CoreWorker.get_async`` /
``wait_async``). The condition comes from the backend
(``ProcessEnv.thread_condition``): the core starts and knows no threads,
and without one (the simulator) every call answers None.

State: the threads asleep here now (``_waiters``, woken by ``end_all`` when
the process ends; one entry per thread, so bounded by the user's threads),
and on the loop's side the callbacks each watch left on the entries'
``ReadyEvent``s or in ``ReferenceCounter.ready_listeners``."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import trio

from ... import exceptions
from ..ids import ObjectID
from ..object_ref import ObjectRef
from ..serialization import KIND_ERROR, deserialize
from .object_getter import ObjectGetter, ReadyEvent, split_at
from .reference_counter import ReferenceCounter
from .thread_inbox import ThreadInbox


@dataclass(frozen=True)
class ThreadWaitsStatistics:
    threads_waiting: int  # user's threads asleep in get or wait now
    ending: bool  # the process is ending: no thread waits any more


class ThreadGet:
    """A user's thread waiting in ``get`` for objects this process owns
    (``ThreadWaits.get_from_thread``). The loop sets ``woken`` under the
    condition; ``watched`` and ``pending`` are the loop's alone."""

    __slots__ = ("condition", "refs", "woken", "gave_up", "ended", "pending", "watched")

    def __init__(self, condition, refs: list) -> None:
        self.condition = condition
        self.refs = refs
        self.woken = False
        self.gave_up = False  # get must take the loop's path
        self.ended = False  # tray.shutdown() ended the loop meanwhile
        self.pending = 0  # refs not ready yet
        self.watched: list = []  # (ReadyEvent, callback key)

    def is_woken(self) -> bool:
        return self.woken

    def wake(self, gave_up: bool = False) -> None:
        with self.condition:
            if self.woken:
                return
            self.gave_up = gave_up
            self.woken = True
            self.condition.notify_all()

    def end(self) -> None:
        """The loop is ending (``ThreadWaits.end_all``, from any thread)."""
        with self.condition:
            self.ended = True
            self.woken = True
            self.condition.notify_all()


class ThreadWait(ThreadGet):
    """A user's thread waiting in ``wait`` (``ThreadWaits.wait_from_thread``):
    woken when ``need`` more of its refs are ready here. ``need`` is the
    loop's alone once the thread has queued it."""

    __slots__ = ("num_returns", "need", "fetch_local", "generation", "by_id")

    def __init__(self, condition, refs: list, num_returns: int, ready: int,
                 fetch_local: bool, generation: int) -> None:
        super().__init__(condition, refs)
        self.num_returns = num_returns
        self.need = num_returns - ready  # as the thread counted them
        self.fetch_local = fetch_local
        self.generation = generation  # ReferenceCounter.ready_generation when it counted
        self.by_id = {ref._id._binary: ref for ref in refs}


class ThreadWaits:
    def __init__(self, *, address: str, references: ReferenceCounter, getter: ObjectGetter,
                 inbox: ThreadInbox, store, nursery: trio.Nursery, make_condition) -> None:
        self._address = address
        self._references = references
        self._getter = getter
        self._inbox = inbox
        self._store = store  # this node's object store (``contains``)
        self._nursery = nursery
        # make_condition() -> a lock with a condition, for one sleeping
        # thread (``ProcessEnv.thread_condition``); None: no thread waits here.
        self._make_condition = make_condition
        # The user's threads asleep in get or wait (_sleep_in_thread), woken
        # at shutdown; one entry per thread, so bounded by the user's threads.
        self._waiters: set = set()
        self._ending = False

    def statistics(self) -> ThreadWaitsStatistics:
        return ThreadWaitsStatistics(threads_waiting=len(self._waiters), ending=self._ending)

    def validate_state(self) -> None:
        for listener in self._references.ready_listeners:
            if isinstance(listener, ThreadWait):
                # Listened to only while it needs more refs ready; the
                # last one, or a failed fetch, stops the listening first.
                assert listener.need > 0, listener.need
                assert not listener.gave_up, listener.refs

    def end_all(self) -> None:
        """The process is ending (``CoreWorker.begin_shutdown``, from any
        thread): wake the user's threads waiting in ``get`` or ``wait``,
        which then raise instead of waiting for a loop that is gone."""
        self._ending = True
        for waiter in list(self._waiters):
            waiter.end()

    def get_ready(self, refs: list):
        """The values of ``refs`` when every one is owned here, ready, held
        in this process's memory and free of refs inside (nothing to fetch,
        nothing to register): read without entering the loop, from any
        thread (an entry's value, once ready, is immutable). Raises the
        first error among them, in list order, as ``get`` does. None when
        any one needs the loop."""
        table = self._references.refs
        found = []
        for ref in refs:
            entry = table.get(ref._id)
            if entry is None or not entry.owned or not entry.ready:
                return None
            inline = entry.inline
            if inline is None or inline.contained:
                return None
            found.append(inline)
        values = []
        for serialized in found:
            value = deserialize(serialized)
            if serialized.kind == KIND_ERROR:
                raise value
            values.append(value)
        return values

    def get_from_thread(self, refs: list, timeout: float | None):
        """``get`` from a user's thread (``CoreWorker.queues_from_thread``)
        of objects this process owns that are not ready yet: their values,
        or None when ``get`` must go through the loop
        (``CoreWorker.get_async``): a ref owned elsewhere, a value in the
        node's store or holding refs.

        The thread waits on a condition of its own, which the loop notifies
        when every ref is ready or one failed; the watch is queued through
        the inbox behind the submissions it waits for, so a ``get`` right
        after ``.remote()`` wakes the loop once for both, and needs no trio
        task, no ``from_thread`` round trip and no result queue. Measured
        in a sync loop of ``get(f.remote())`` on a loaded machine: the
        loop thread's CPU per task ~430 -> ~260 us, the caller's ~110 -> ~60."""
        address = self._address
        if self._make_condition is None:
            return None
        for ref in refs:
            if ref._owner != address:
                return None
        waiter = ThreadGet(self._make_condition(), refs)
        if not self._sleep_in_thread(waiter, self._watch_for_thread, timeout,
                                     self._unwatch_for_thread):
            raise exceptions.GetTimeoutError(
                f"get() timed out after {timeout} s waiting for {len(refs)} object(s)")
        if waiter.gave_up:
            return None
        return self._read_ready(refs)

    def _sleep_in_thread(self, waiter: ThreadGet, watch, timeout: float | None,
                         unwatch) -> bool:
        """In a user's thread: queue ``watch(waiter)`` for the loop and sleep
        until the loop wakes ``waiter`` (True) or ``timeout`` passes (False).
        ``unwatch(waiter)`` goes to the loop when the watch may still hold
        callbacks there: timed out, interrupted, or woken by a failure while
        others were pending. Raises TrayError when ``tray.shutdown()`` ends
        the loop meanwhile (``end_all``)."""
        self._waiters.add(waiter)
        try:
            if self._ending:
                waiter.end()
            else:
                try:
                    self._inbox.put(watch, waiter)
                except Exception:
                    if not waiter.ended:  # (the loop ended after end_all: ended)
                        raise
            with waiter.condition:
                woken = waiter.condition.wait_for(waiter.is_woken, timeout)
        finally:
            self._waiters.discard(waiter)
            if not waiter.is_woken() or waiter.pending:
                self._inbox.put_quietly(unwatch, waiter)
        if waiter.ended:
            raise exceptions.TrayError(
                "tray.shutdown() was called while this thread was waiting for objects")
        return woken

    def _read_ready(self, refs: list):
        """Values of owned, ready-or-failed refs (in memory, no refs inside):
        the first error in list order is raised, as ``get`` does; None when
        one is not readable here after all."""
        table = self._references.refs
        found = []
        pending = False
        for ref in refs:
            entry = table.get(ref._id)
            if entry is None or not entry.owned:
                return None
            if not entry.ready:
                pending = True  # (woken by another's failure)
                continue
            inline = entry.inline
            if inline is None or inline.contained:
                return None
            if inline.kind == KIND_ERROR:
                raise deserialize(inline)
            found.append(inline)
        if pending:
            return None
        return [deserialize(serialized) for serialized in found]

    def _watch_for_thread(self, waiter: ThreadGet) -> None:
        """On the loop: wake ``waiter`` (a ``get``) when its refs are ready,
        or one failed, or at once when it must take the loop's path."""
        table = self._references.refs
        for ref in waiter.refs:
            entry = table.get(ref._id)
            if entry is None or not entry.owned:
                waiter.wake(gave_up=True)
                return
            if entry.ready:
                if entry.inline is not None and entry.inline.kind == KIND_ERROR:
                    waiter.wake()
                    return
                continue
            event = entry.event
            if event is None:
                event = entry.event = ReadyEvent()
            waiter.pending += 1
            waiter.watched.append((event, event.add_callback(
                functools.partial(self._thread_ref_ready, waiter, entry))))
        if not waiter.pending:
            waiter.wake()

    @staticmethod
    def _thread_ref_ready(waiter: ThreadGet, entry) -> None:
        waiter.pending -= 1
        if waiter.pending == 0 or (entry.inline is not None and
                                   entry.inline.kind == KIND_ERROR):
            waiter.wake()

    def wait_from_thread(self, refs: list, num_returns: int, timeout: float | None,
                         fetch_local: bool):
        """``wait`` from a user's thread (``CoreWorker.queues_from_thread``)
        over objects this process owns: (ready, not_ready), or None when
        ``wait`` must go through the loop (``CoreWorker.wait_async``): a ref
        owned elsewhere, or, before any waiting, a ready object to fetch
        from another node.

        Ray's loop of one ``wait`` per result over a shrinking list finds its
        first ref ready most of the time: that answer is read here, with no
        thread crossing. Otherwise the thread waits on a condition of its
        own, as ``get_from_thread`` does, which the loop notifies once
        ``num_returns`` are ready here (``_watch_wait_for_thread``). On
        timeout it answers with what is ready here then, as the loop's
        ``wait`` does."""
        if self._make_condition is None:
            return None
        generation = self._references.ready_generation  # read before the entries
        positions, remote = self._ready_for_thread(refs, num_returns, fetch_local)
        if positions is None:
            return None
        if len(positions) < num_returns and timeout != 0:
            if remote:
                return None  # the loop's wait fetches it
            waiter = ThreadWait(self._make_condition(), refs, num_returns,
                                len(positions), fetch_local, generation)
            woken = self._sleep_in_thread(waiter, self._watch_wait_for_thread, timeout,
                                          self._unlisten_for_thread)
            if waiter.gave_up:
                return None
            positions, _remote = self._ready_for_thread(refs, num_returns, fetch_local)
            if positions is None or (woken and len(positions) < num_returns):
                return None  # (not expected: what was counted is ready here)
        return split_at(refs, positions)

    def _ready_for_thread(self, refs: list, num_returns: int,
                          fetch_local: bool) -> tuple[list | None, bool]:
        """(the positions of the first ``num_returns`` refs ready here, is a
        ready one not here), in any thread: None positions when a ref is not
        owned here. It reads entries and this node's store only
        (``ObjectGetter.ready_here``, inlined: this runs once per ref of a
        ``wait`` that finds too few ready)."""
        table = self._references.refs
        contains = self._store.contains
        positions: list = []
        remote = False
        for i, ref in enumerate(refs):
            entry = table.get(ref._id)
            if entry is None or not entry.owned:
                return None, False
            if entry.ready:
                if entry.inline is None and fetch_local and not contains(ref._id._binary):
                    remote = True
                    continue
                positions.append(i)
                if len(positions) >= num_returns:
                    break
        return positions, remote

    def _watch_wait_for_thread(self, waiter: ThreadWait) -> None:
        """On the loop: hear of each object made ready (``ready_listeners``)
        until ``waiter.need`` of its refs are ready here, then wake it. The
        refs are counted again here only when an object became ready since
        the thread counted them (``ready_generation``): no callback per ref
        per call, which cost O(refs) of the loop's time at each of the ~470
        of the bench's 1,000 waits a round that find no ref ready."""
        references = self._references
        if references.ready_generation != waiter.generation:
            positions, remote = self._ready_for_thread(waiter.refs, waiter.num_returns,
                                                       waiter.fetch_local)
            if positions is None or remote:
                waiter.wake(gave_up=True)  # as wait_from_thread would have
                return
            waiter.need = waiter.num_returns - len(positions)
            if waiter.need <= 0:
                waiter.wake()
                return
        references.ready_listeners[waiter] = functools.partial(self._thread_wait_ref_ready,
                                                               waiter)

    def _thread_wait_ref_ready(self, waiter: ThreadWait, object_id: ObjectID, entry) -> None:
        ref = waiter.by_id.get(object_id._binary)
        if ref is None:
            return
        if self._getter.ready_here(ref, waiter.fetch_local):
            self._count_for_thread(waiter)
        else:  # (fetch_local, and every copy is on another node)
            self._nursery.start_soon(self._fetch_for_thread, waiter, ref)

    async def _fetch_for_thread(self, waiter: ThreadWait, ref: ObjectRef) -> None:
        """A ref of a thread's ``wait`` made ready with its copies on other
        nodes: pulled here, then counted (``fetch_local``, as the loop's
        ``wait`` does). A failed fetch sends the thread to the loop's path,
        which says what went wrong."""
        if waiter.woken:
            return
        try:
            await self._getter.fetch(ref._id, ref._owner)
        except Exception:
            self._unlisten_for_thread(waiter)
            waiter.wake(gave_up=True)
            return
        self._count_for_thread(waiter)

    def _unlisten_for_thread(self, waiter: ThreadWait) -> None:
        self._references.ready_listeners.pop(waiter, None)

    def _count_for_thread(self, waiter: ThreadWait) -> None:
        waiter.need -= 1
        if waiter.need <= 0:
            self._unlisten_for_thread(waiter)
            waiter.wake()

    @staticmethod
    def _unwatch_for_thread(waiter: ThreadGet) -> None:
        for event, key in waiter.watched:
            event.remove_callback(key)
        waiter.watched.clear()
