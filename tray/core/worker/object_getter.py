"""Getting objects: status from the owner, bytes from a store, get and wait.

To read an object a process asks its owner for the object's status (the
owner answers when the object exists: its inline value, the locations of
its copies, or its error), then reads a stored value from this node's store,
asking the node manager to pull it from another node first when there is no
local copy. When every known copy is gone, the owner is asked to recover the
object (``object_recovery``) and the read starts over.

A task that blocks in ``get`` or ``wait`` lends its CPU back to its node
meanwhile, so nested tasks cannot starve each other of CPUs (Ray does the
same); an actor keeps its resources."""

from __future__ import annotations

import functools

import trio

from ... import exceptions
from ..context import current_task
from ..ids import ObjectID
from ..messages import StoredResult, inline_or_failed
from ..object_ref import ObjectRef
from ..rpc import Endpoint, PeerDisconnected
from ..serialization import KIND_ERROR, SerializedObject, serialize_error
from .outbox import Outbox
from .reference_counter import ReferenceCounter


class ObjectGetter:
    """Keeps no state of its own (so no ``statistics()`` or
    ``validate_state()``): what a read waits on is in the reference
    counter's entries (their ``ReadyEvent``) and in the node's store."""

    def __init__(self, *, address: str, endpoint: Endpoint, references: ReferenceCounter,
                 outbox: Outbox, store, node_manager_address: str, worker_id: str,
                 lends_cpu, exit_process=None) -> None:
        self._address = address
        self._endpoint = endpoint
        self._references = references
        self._outbox = outbox
        self._store = store
        self._node_manager_address = node_manager_address
        self._worker_id = worker_id
        # lends_cpu() -> bool: does a task blocking here give its CPU back?
        self._lends_cpu = lends_cpu
        # A worker (not a driver) ends when its node manager is gone.
        self._exit_process = exit_process
        self._recover = None  # set by the core worker: ObjectRecoveryManager.recover

    def bind_recovery(self, recover) -> None:
        self._recover = recover

    # -------------------------------------------------------------- status

    async def object_status(self, object_id: ObjectID, owner: str):
        """What the owner knows of the object (waits until it exists)."""
        if owner == self._address:
            entry = self._references.refs.get(object_id)
            if entry is None:
                error = exceptions.ObjectLostError(
                    f"object {object_id.hex()} was freed: no reference to it remained")
                return inline_or_failed(serialize_error(error))
            while not entry.ready:
                if entry.event is None:
                    entry.event = ReadyEvent()
                await entry.event.wait()
            if entry.inline is not None:
                return inline_or_failed(entry.inline)
            return StoredResult(list(entry.locations))
        while True:
            try:
                return await self._endpoint.call(owner, "object_status", object_id.binary())
            except PeerDisconnected:
                if not await self._endpoint.reachable(owner):
                    break
                # Only the connection broke (a reset): the owner lives, ask again.
        error = exceptions.OwnerDiedError(
            f"the owner of object {object_id.hex()} ({owner}) died, so the object "
            "cannot be retrieved")
        return inline_or_failed(serialize_error(error))

    async def handle_object_status(self, conn, object_id: bytes):
        return await self.object_status(ObjectID(object_id), self._address)

    async def fetch(self, object_id: ObjectID, owner: str) -> SerializedObject:
        key = object_id.binary()
        while True:
            status = await self.object_status(object_id, owner)
            if not isinstance(status, StoredResult):
                return status.serialized
            entry = self._store.get(key)
            if entry is None:
                try:
                    ok = await self._endpoint.call(self._node_manager_address, "pull_object",
                                                   key, status.locations, owner)
                except PeerDisconnected:
                    # A reset connection (found by the simtest chaos profile):
                    # ask again. A node manager that is gone takes this
                    # process's node with it: a worker ends, as a raylet's
                    # workers do, so its task's owner retries the task (an
                    # error here was the task's own: a max_retries=-1 task
                    # failed with NodeDiedError in a real chaos run).
                    if await self._endpoint.reachable(self._node_manager_address):
                        continue
                    if self._exit_process is not None:
                        self._exit_process()
                        await trio.sleep_forever()  # the process is ending under us
                    raise exceptions.NodeDiedError(
                        f"the node manager of this process ({self._node_manager_address}) is "
                        f"gone: object {object_id.hex()} cannot be fetched") from None
                entry = self._store.get(key) if ok else None
            if entry is not None:
                data, buffers = entry
                return SerializedObject(data, buffers)
            # Every known copy is gone: the owner re-creates the object from
            # its lineage (then the loop fetches it again) or says why not.
            failure = await self._recover(object_id, owner, status.locations)
            if failure is not None:
                return failure

    # ------------------------------------------------------------ get/wait

    def lend_cpu(self, blocked: bool) -> None:
        """A task about to wait (in get/wait, or for its own arguments) lends
        its CPU back to its node, and takes it again after, so tasks waiting
        for objects cannot starve the tasks that make them of CPUs."""
        if self._lends_cpu() and current_task.get(None) is not None:
            self._outbox.send_later(self._node_manager_address,
                                    "worker_blocked" if blocked else "worker_unblocked",
                                    self._worker_id)

    def ready_here(self, ref: ObjectRef, local: bool = True) -> bool:
        """Is ``ref`` an object this process owns, ready (and, if ``local``,
        in this node's store or in memory)? No waiting needed then."""
        entry = self._references.refs.get(ref._id)
        return entry is not None and entry.owned and entry.ready and (
            entry.inline is not None or not local or self._store.contains(ref.binary()))

    async def get(self, refs: list, timeout: float | None, single: bool = False):
        if all(self.ready_here(ref) for ref in refs):
            return await self._get(refs, timeout, single)  # nothing to wait for
        self.lend_cpu(True)
        try:
            return await self._get(refs, timeout, single)
        finally:
            self.lend_cpu(False)

    async def _get(self, refs: list, timeout: float | None, single: bool):
        """Fetch every ref at once. The first error fails the whole get at
        once (as Ray: ``get([a, b])`` raises a's error without waiting for
        b); when several have failed by then, the first in list order wins."""
        values: list = [None] * len(refs)
        with trio.move_on_after(timeout if timeout is not None else float("inf")) as scope:
            if len(refs) == 1:
                values[0] = await self.fetch(refs[0].object_id(), refs[0]._owner)
            else:
                await self._fetch_many(refs, values)
        failed = any(serialized is not None and serialized.kind == KIND_ERROR
                     for serialized in values)
        if scope.cancelled_caught and not failed:
            raise exceptions.GetTimeoutError(
                f"get() timed out after {timeout} s waiting for {len(refs)} object(s)")
        results = []
        for serialized in values:
            if failed and (serialized is None or serialized.kind != KIND_ERROR):
                continue  # not fetched, or fine: the error below is what get raises
            value = await self._references.deserialize(serialized)
            if serialized.kind == KIND_ERROR:
                raise value
            results.append(value)
        return results[0] if single else results

    async def _fetch_many(self, refs: list, values: list) -> None:
        """Fill ``values`` with the serialized values of ``refs``, or stop at
        the first error (the others may be left None then).

        An object this process owns needs no task when its value is inline:
        read at once when ready, else taken by a callback on its entry's
        ``ReadyEvent`` when it is made ready. A task per ref (``fetch``) is
        left for the others: values in a store, refs owned elsewhere. A task
        per ref was ~10% of the CPU of an actor that gets 1,000 results of
        its calls to another."""
        table = self._references.refs
        left = len(refs)  # (nothing below runs before the loop has seen every ref)
        failed = False
        done = trio.Event()
        watched: list = []  # (ReadyEvent, callback key) to take back at the end
        async with trio.open_nursery() as nursery:

            def settle(i: int, serialized: SerializedObject) -> None:
                nonlocal left, failed
                values[i] = serialized
                left -= 1
                if serialized.kind == KIND_ERROR:
                    failed = True
                    nursery.cancel_scope.cancel()  # fail fast: stop waiting for the rest
                elif left == 0:
                    done.set()

            async def fetch(i: int, ref: ObjectRef) -> None:
                settle(i, await self.fetch(ref._id, ref._owner))

            def made_ready(i: int, ref: ObjectRef, entry) -> None:
                # Called by ReadyEvent.set(), in the task that made it ready;
                # the nursery is still open (callbacks go before it closes).
                if entry.inline is not None:
                    settle(i, entry.inline)
                else:
                    nursery.start_soon(fetch, i, ref)  # stored: read or pulled

            try:
                for i, ref in enumerate(refs):
                    entry = table.get(ref._id)
                    if entry is None or not entry.owned or (entry.ready and entry.inline is None):
                        nursery.start_soon(fetch, i, ref)
                    elif entry.ready:
                        settle(i, entry.inline)
                        if failed:
                            break
                    else:
                        event = entry.event
                        if event is None:
                            event = entry.event = ReadyEvent()
                        watched.append((event, event.add_callback(
                            functools.partial(made_ready, i, ref, entry))))
                if not failed:
                    await done.wait()
            finally:
                for event, key in watched:
                    event.remove_callback(key)

    def wait_ready_now(self, refs: list, num_returns: int,
                       fetch_local: bool) -> tuple[list, list] | None:
        """``wait``'s answer when ``num_returns`` of ``refs`` are ready here
        already (owned by this process, ready, and in memory or in this
        node's store when ``fetch_local``): the first ready ones in list
        order, as ``wait`` returns them. None when waiting is needed.

        It only reads entries (an owned entry, once ready, stays ready while
        a ref to it exists): Ray's loop of one ``wait`` per result finds its
        first ref ready most of the time, and then needs no CPU lending
        messages. (A driver's thread reads the same in
        ``CoreWorker.wait_from_thread``, without entering the loop.)"""
        positions = []
        ready_here = self.ready_here
        for i, ref in enumerate(refs):
            if ready_here(ref, fetch_local):
                positions.append(i)
                if len(positions) >= num_returns:
                    return split_at(refs, positions)
        return None

    async def wait(self, refs: list, num_returns: int, timeout: float | None,
                   fetch_local: bool) -> tuple[list, list]:
        answer = self.wait_ready_now(refs, num_returns, fetch_local)
        if answer is not None:
            return answer  # nothing to wait for: no CPU to lend
        self.lend_cpu(True)
        try:
            return await self._wait(refs, num_returns, timeout, fetch_local)
        finally:
            self.lend_cpu(False)

    async def _wait(self, refs: list, num_returns: int, timeout: float | None,
                    fetch_local: bool) -> tuple[list, list]:
        """One pass over ``refs``, then sleep until enough are ready.

        Ray's usual loop calls ``wait`` once per result over a shrinking
        list, so a call must cost O(refs) and no more: a ref this process
        owns that is not ready yet gets a callback on its entry's
        ``ReadyEvent`` (not a task of its own); only refs owned elsewhere, and
        owned ones whose only copies are on other nodes when ``fetch_local``,
        get a task (they need a message). Measured: the bench's 1,000 waits
        over 1,000 refs spent most of their time starting and cancelling a
        trio task per ref per call."""
        ready: set = set()
        enough = trio.Event()

        def mark(object_id: ObjectID) -> None:
            ready.add(object_id)
            if len(ready) >= num_returns:
                enough.set()

        async def watch(ref: ObjectRef) -> None:
            status = await self.object_status(ref.object_id(), ref._owner)
            if fetch_local and isinstance(status, StoredResult):
                await self.fetch(ref.object_id(), ref._owner)
            mark(ref.object_id())

        watched: list = []  # (ReadyEvent, callback key) to take back at the end
        with trio.move_on_after(timeout if timeout is not None else float("inf")):
            async with trio.open_nursery() as nursery:

                def owned_ready(ref: ObjectRef) -> None:
                    # Called by the entry's ReadyEvent.set(), in the task that
                    # stored the value; the nursery is still open (the
                    # callbacks are taken back before it closes).
                    if enough.is_set():
                        return
                    if self.ready_here(ref, fetch_local):
                        mark(ref.object_id())
                    else:
                        nursery.start_soon(watch, ref)  # its copies are elsewhere

                try:
                    for ref in refs:
                        if enough.is_set():
                            break
                        object_id = ref.object_id()
                        if object_id in ready:
                            continue
                        entry = self._references.refs.get(object_id)
                        if entry is not None and entry.owned and not entry.ready:
                            event = entry.event
                            if event is None:
                                event = entry.event = ReadyEvent()
                            watched.append((event, event.add_callback(
                                functools.partial(owned_ready, ref))))
                        elif self.ready_here(ref, fetch_local):
                            mark(object_id)
                        else:
                            nursery.start_soon(watch, ref)
                    await enough.wait()
                finally:
                    for event, key in watched:
                        event.remove_callback(key)
                nursery.cancel_scope.cancel()
        return split_at(refs, [i for i, ref in enumerate(refs) if ref._id in ready][:num_returns])


def split_at(refs: list, positions: list[int]) -> tuple[list, list]:
    """(the refs at ``positions``, the others), each in list order:
    ``positions`` ascending. The others are slices, not a test per ref."""
    rest: list = []
    start = 0
    for i in positions:
        rest += refs[start:i]
        start = i + 1
    rest += refs[start:]
    return [refs[i] for i in positions], rest


class ReadyEvent:
    """The event of an owned entry that is not ready yet (``RefEntry.event``;
    ``ReferenceCounter.mark_ready`` sets it and drops it).

    Tasks wait on it as on a ``trio.Event``; ``wait`` over many refs adds a
    plain callback instead, so a ``wait`` needs no task per ref. Callbacks run
    in ``set()``, in insertion order (deterministic in the simulator), and
    must not block or raise."""

    __slots__ = ("_event", "_callbacks", "_next_key")

    def __init__(self) -> None:
        self._event = trio.Event()
        self._callbacks: dict[int, object] = {}
        self._next_key = 0

    def add_callback(self, callback) -> int:
        key = self._next_key
        self._next_key += 1
        self._callbacks[key] = callback
        return key

    def remove_callback(self, key: int) -> None:
        self._callbacks.pop(key, None)

    def is_set(self) -> bool:
        return self._event.is_set()

    def set(self) -> None:
        self._event.set()
        callbacks, self._callbacks = self._callbacks, {}
        for callback in callbacks.values():
            callback()

    async def wait(self) -> None:
        await self._event.wait()
