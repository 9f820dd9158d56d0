"""Moving objects between nodes, and freeing them.

A worker that needs an object with no copy on its node asks its node
manager to *pull* it: the node manager reads it from a node that holds a
copy in chunks of ``object_chunk_bytes`` (each chunk a slice of the object's
packed form, so neither side copies the whole object to serve a chunk),
stores it locally and tells the owner of the new copy (the owner frees every
copy, so it must know of each: that message is a call, re-sent after a
broken connection until the owner answers or is gone, since a copy the owner
never hears of would never be freed). Concurrent pulls of one object share
one transfer. Where both stores are on one machine (the store's
``machine_key``: several nodes of a local cluster), the source's store
shares the object and this one adopts it (a hard link in shared memory):
no chunk is read.

Objects leave a store when their owner frees them (``free_objects``) or
when their owner dies (``owner_died``: nobody else could free them). And,
since a copy can exist that its owner never heard of (a task attempt stored
its result, its reply was lost, and the task ran again elsewhere), every
``object_reconcile_period_s`` the node asks each owner which of its objects
that were here at the previous round it still knows here (``objects_here``),
and frees the rest: no copy outlives its owner's knowledge by more than two
periods."""

from __future__ import annotations

import logging
import mmap
import pickle
import struct
from dataclasses import dataclass

import trio

from ..rpc import Endpoint, PeerDisconnected

logger = logging.getLogger("tray.node")

# Chunk requests of one pull in flight at once: enough to keep the source
# serving while the previous chunk crosses the socket and this side copies it
# (4 x object_chunk_bytes of buffers in flight per pull at most).
PULL_CHUNKS_IN_FLIGHT = 4
# A location whose connection broke mid-pull but whose node still listens is
# read again, this many times in all (a reset, not a death).
PULL_ATTEMPTS_PER_LOCATION = 3


def _write_pieces(view: memoryview, offset: int, pieces: list) -> int:
    """Copy a chunk's pieces (bytes, bytearrays or memoryviews, whatever the
    transport delivered) into ``view`` at ``offset``; returns the end."""
    for piece in pieces:
        piece = memoryview(piece).cast("B")
        view[offset:offset + piece.nbytes] = piece
        offset += piece.nbytes
    return offset


def packed_parts(data: bytes, buffers: list) -> list[memoryview]:
    """An object's packed form (a header, the pickle, then each buffer) as
    views of its parts: nothing is copied."""
    parts = [memoryview(data).cast("B"), *(memoryview(b).cast("B") for b in buffers)]
    header = struct.pack(f"<II{len(buffers)}Q", len(data), len(buffers),
                         *(p.nbytes for p in parts[1:]))
    parts.insert(0, memoryview(header))
    return parts


def packed_slice_views(data: bytes, buffers: list, offset: int,
                       size: int) -> tuple[int, list[memoryview]]:
    """Bytes ``[offset, offset + size)`` of an object's packed form, as views
    of its parts (one per part the range touches), and the packed form's
    length. Views, so that serving a chunk copies nothing: sent as pickle-5
    buffers, they go out of band, straight from the store's mapping to the
    socket."""
    parts = packed_parts(data, buffers)
    total = sum(p.nbytes for p in parts)
    chunk, start = [], 0
    for part in parts:
        end = start + part.nbytes
        if end > offset and start < offset + size:
            chunk.append(part[max(0, offset - start):min(part.nbytes, offset + size - start)])
        start = end
    return total, chunk


def packed_slice(data: bytes, buffers: list, offset: int, size: int) -> tuple[int, bytes]:
    """``packed_slice_views`` joined into one ``bytes`` (one copy of the slice)."""
    total, views = packed_slice_views(data, buffers, offset, size)
    return total, b"".join(views)


def unpack_object(blob) -> tuple[bytes, list]:
    view = memoryview(blob).cast("B")
    data_len, count = struct.unpack_from("<II", view, 0)
    sizes = struct.unpack_from(f"<{count}Q", view, 8)
    offset = 8 + 8 * count
    data = bytes(view[offset:offset + data_len])
    offset += data_len
    buffers = []
    for size in sizes:
        buffers.append(view[offset:offset + size])
        offset += size
    return data, buffers


@dataclass(frozen=True)
class ObjectManagerStatistics:
    pulls_in_progress: int  # objects being copied here now (one transfer each)
    objects_last_round: int  # objects here at the last reconciliation round
    reconciling: bool  # owners are being asked about this node's objects now


class ObjectManager:
    def __init__(self, *, node_id: str, address: str, endpoint: Endpoint, tracer, config,
                 store, nursery: trio.Nursery) -> None:
        self._nursery = nursery
        self._node_id = node_id
        self._trace_name = node_id[:8]
        self._address = address
        self._endpoint = endpoint
        self._tracer = tracer
        self._config = config
        self.store = store
        # Pulls under way, one per object: bounded by the objects this
        # node's workers wait for.
        self._pulls: dict[bytes, trio.Event] = {}
        # Reconciliation: what was here at the last round, and when it was.
        self._last_round: set = set()
        self._last_round_at = 0.0
        self._reconciling = False

    def pulls_in_progress(self) -> int:
        return len(self._pulls)

    def statistics(self) -> ObjectManagerStatistics:
        return ObjectManagerStatistics(pulls_in_progress=len(self._pulls),
                                       objects_last_round=len(self._last_round),
                                       reconciling=self._reconciling)

    def validate_state(self) -> None:
        """The pulls under way: each waits on an event not set yet (a pull
        leaves the table before it sets its event, which wakes the pulls
        of the same object). O(pulls)."""
        for object_id, event in self._pulls.items():
            assert isinstance(object_id, bytes), object_id
            assert not event.is_set(), object_id.hex()
        assert self._last_round_at >= 0.0, self._last_round_at

    async def handle_pull_object(self, conn, object_id: bytes, locations: list,
                                 owner: str) -> bool:
        """Make ``object_id`` local, copying it from one of ``locations``
        ((node id, node manager address) pairs); False if no copy could be read."""
        while not self.store.contains(object_id):
            event = self._pulls.get(object_id)
            if event is not None:
                await event.wait()
                continue
            event = self._pulls[object_id] = trio.Event()
            try:
                for node_id, address in sorted(locations):
                    if node_id == self._node_id:
                        continue
                    if await self._adopt_from(address, object_id):
                        self._tracer.record(self._trace_name, "object_pulled",
                                            object=object_id, source=node_id, shared=True)
                        self._nursery.start_soon(self._tell_owner, owner, object_id)
                        break
                    blob = await self._read_remote_again(address, object_id)
                    if blob is not None:
                        data, buffers = unpack_object(blob)
                        self.store.put(object_id, data, buffers, owner=owner)
                        self._tracer.record(self._trace_name, "object_pulled",
                                            object=object_id, source=node_id, size=memoryview(blob).nbytes)
                        # The owner frees every copy, so it must know of this one.
                        self._nursery.start_soon(self._tell_owner, owner, object_id)
                        break
                else:
                    return False
            finally:
                del self._pulls[object_id]
                event.set()
        return True

    async def _adopt_from(self, address: str, object_id: bytes) -> bool:
        """Take the object from a store on this machine without a copy
        (False: not on this machine, or not shared; the chunks go then)."""
        if getattr(self.store, "machine_key", None) is None:
            return False
        try:
            shared = await self._endpoint.call(address, "share_object", object_id,
                                               self.store.machine_key)
        except PeerDisconnected:
            return False  # the chunked read finds out whether it lives
        return shared is not None and self.store.adopt(object_id, shared)

    def handle_share_object(self, conn, object_id: bytes, machine_key: str):
        """What a store on the same machine needs to adopt the object, or
        None (another machine, or not here in shared memory)."""
        if getattr(self.store, "machine_key", None) != machine_key:
            return None
        return self.store.share(object_id)

    async def _tell_owner(self, owner: str, object_id: bytes) -> None:
        while True:
            try:
                await self._endpoint.call(owner, "add_location", object_id, self._node_id,
                                          self._address)
                return
            except PeerDisconnected:
                if not await self._endpoint.reachable(owner):
                    return  # gone: the copies of what it owned are freed with it
            except Exception as error:  # noqa: BLE001 - the owner failed the message
                logger.warning("owner %s failed to note a copy of %s: %s", owner,
                               object_id.hex(), error)
                return

    async def _read_remote_again(self, address: str, object_id: bytes):
        """``_read_remote``, read again while the node there still listens
        (a reset broke the connection, not the node): giving up on a live
        copy made its reader ask for a re-creation that may not be allowed
        (chaos seeds 3260 and restarts 226: ObjectReconstructionFailedError
        for an actor call's result on a node that never died). None when
        the copy is gone or the node does not answer."""
        for _ in range(PULL_ATTEMPTS_PER_LOCATION):
            try:
                return await self._read_remote(address, object_id)
            except PeerDisconnected:
                if not await self._endpoint.reachable(address):
                    return None
        return None

    async def _read_remote(self, address: str, object_id: bytes):
        """The object's packed form, read from ``address`` in chunks.

        The first chunk says how large the object is; the rest are asked for
        ``PULL_CHUNKS_IN_FLIGHT`` at a time (pipelined: the source serves one
        while the last one crosses the socket), each written straight into
        one buffer at its offset: the only copy on this side besides the
        store's own write. Measured (80 MB between two local nodes): joining
        the chunks at the end and serving each as a fresh ``bytes`` (pickled
        in band) were most of the pull's CPU."""
        chunk_bytes = self._config.object_chunk_bytes
        first = await self._read_chunk(address, object_id, 0, chunk_bytes)
        if first is None:
            return None
        total, pieces = first
        # Anonymous memory rather than bytearray(total), which zeroes all of
        # it first (measured: as costly as the copies themselves); these pages
        # are touched once, by the chunks' copies.
        blob = mmap.mmap(-1, max(1, total))
        view = memoryview(blob)[:total]
        offset = _write_pieces(view, 0, pieces)
        if offset >= total:
            return view
        failure: list = []  # None (the object was freed meanwhile) or a PeerDisconnected
        offsets = iter(range(offset, total, chunk_bytes))

        async def pull_some(nursery: trio.Nursery) -> None:
            for start in offsets:
                try:
                    reply = await self._read_chunk(address, object_id, start, chunk_bytes)
                except PeerDisconnected as error:
                    reply = error
                if reply is None or isinstance(reply, PeerDisconnected):
                    failure.append(reply)
                    nursery.cancel_scope.cancel()  # the others' chunks are of no use
                    return
                _write_pieces(view, start, reply[1])

        async with trio.open_nursery() as nursery:
            for _ in range(min(PULL_CHUNKS_IN_FLIGHT, (total - offset - 1) // chunk_bytes + 1)):
                nursery.start_soon(pull_some, nursery)
        if failure:
            if failure[0] is not None:
                raise failure[0]
            return None
        return view

    async def _read_chunk(self, address: str, object_id: bytes, offset: int, size: int):
        return await self._endpoint.call(address, "read_object_chunk", object_id, offset, size)

    def handle_read_object_chunk(self, conn, object_id: bytes, offset: int, size: int):
        """(total length, [pickle-5 buffers of the slice]): views of the
        store's mapping, so a transport that sends buffers out of band copies
        nothing into the message."""
        entry = self.store.get(object_id)
        if entry is None:
            return None
        total, views = packed_slice_views(*entry, offset, size)
        return total, [pickle.PickleBuffer(v) for v in views]

    def reconcile(self) -> None:
        """Every ``object_reconcile_period_s``, ask owners about the objects
        that were here at the previous round too (younger copies may be
        on their way to being known)."""
        now = trio.current_time()
        if self._reconciling or now - self._last_round_at < \
                self._config.object_reconcile_period_s:
            return
        owners = self.store.object_owners()
        by_owner: dict[str, list] = {}
        for object_id, owner in owners.items():
            if object_id in self._last_round and object_id not in self._pulls:
                by_owner.setdefault(owner, []).append(object_id)
        self._last_round = set(owners)
        self._last_round_at = now
        if by_owner:
            self._reconciling = True
            self._nursery.start_soon(self._ask_owners, by_owner)

    async def _ask_owners(self, by_owner: dict) -> None:
        try:
            for owner, object_ids in sorted(by_owner.items()):
                try:
                    held = await self._endpoint.call(owner, "objects_here", self._node_id,
                                                     self._address, object_ids)
                except PeerDisconnected:
                    if await self._endpoint.reachable(owner):
                        continue  # only the connection broke: next round
                    held = []  # gone: nobody can free what it owned
                except Exception as error:  # noqa: BLE001 - the owner failed to answer
                    logger.warning("%s failed to say which objects it keeps: %s", owner,
                                   error)
                    continue
                orphans = sorted(set(object_ids) - set(held))
                for object_id in orphans:
                    self.store.delete(object_id)
                if orphans:
                    self._tracer.record(self._trace_name, "orphan_objects_freed", owner=owner,
                                        count=len(orphans))
        finally:
            self._reconciling = False

    def handle_free_objects(self, conn, object_ids: list) -> None:
        for object_id in object_ids:
            self.store.delete(object_id)

    def handle_owner_died(self, conn, owner: str) -> None:
        """Free the objects a dead process owned: nobody can free them now."""
        freed = self.store.objects_owned_by(owner)
        for object_id in freed:
            self.store.delete(object_id)
        if freed:
            self._tracer.record(self._trace_name, "owner_objects_freed", owner=owner,
                                count=len(freed))
