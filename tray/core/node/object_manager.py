"""Moving objects between nodes, and freeing them.

A worker that needs an object with no copy on its node asks its node
manager to *pull* it: the node manager reads it from a node that holds a
copy in chunks of ``object_chunk_bytes`` (each chunk a slice of the object's
packed form, so neither side copies the whole object to serve a chunk),
stores it locally and tells the owner of the new copy (the owner frees every
copy, so it must know of each: that message is a call, re-sent after a
broken connection until the owner answers or is gone, since a copy the owner
never hears of would never be freed). Concurrent pulls of one object share
one transfer.

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
import struct

import trio

from ..rpc import Endpoint, PeerDisconnected

logger = logging.getLogger("tray.node")


def packed_slice(data: bytes, buffers: list, offset: int, size: int) -> tuple[int, bytes]:
    """Bytes ``[offset, offset + size)`` of an object's packed form (a header,
    the pickle, then each buffer) and the packed form's length, copying
    only that slice."""
    parts = [memoryview(data).cast("B"), *(memoryview(b).cast("B") for b in buffers)]
    header = struct.pack(f"<II{len(buffers)}Q", len(data), len(buffers),
                         *(p.nbytes for p in parts[1:]))
    parts.insert(0, memoryview(header))
    total = sum(p.nbytes for p in parts)
    chunk, start = [], 0
    for part in parts:
        end = start + part.nbytes
        if end > offset and start < offset + size:
            chunk.append(part[max(0, offset - start):min(part.nbytes, offset + size - start)])
        start = end
    return total, b"".join(chunk)


def unpack_object(blob: bytes) -> tuple[bytes, list]:
    view = memoryview(blob)
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
                    try:
                        blob = await self._read_remote(address, object_id)
                    except PeerDisconnected:
                        continue
                    if blob is not None:
                        data, buffers = unpack_object(blob)
                        self.store.put(object_id, data, buffers, owner=owner)
                        self._tracer.record(self._trace_name, "object_pulled",
                                            object=object_id, source=node_id, size=len(blob))
                        # The owner frees every copy, so it must know of this one.
                        self._nursery.start_soon(self._tell_owner, owner, object_id)
                        break
                else:
                    return False
            finally:
                del self._pulls[object_id]
                event.set()
        return True

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

    async def _read_remote(self, address: str, object_id: bytes) -> bytes | None:
        chunks, offset = [], 0
        while True:
            reply = await self._endpoint.call(address, "read_object_chunk", object_id, offset,
                                              self._config.object_chunk_bytes)
            if reply is None:
                return None
            total, chunk = reply
            chunks.append(chunk)
            offset += len(chunk)
            if offset >= total:
                return b"".join(chunks)

    def handle_read_object_chunk(self, conn, object_id: bytes, offset: int, size: int):
        entry = self.store.get(object_id)
        if entry is None:
            return None
        return packed_slice(*entry, offset, size)

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
