"""The simulator's node object store: in-process bytes with the same
capacity accounting as the shared-memory store. (Its GCS storage is
``backends.storage.MemoryStorage``: it outlives a simulated GCS crash, as
Redis does; each simulated machine's memory is in memory.py.)"""

from __future__ import annotations

from dataclasses import dataclass

from ...exceptions import ObjectStoreFullError
from ..storage import MemoryStorage

__all__ = ["MemoryObjectStore", "MemoryStorage", "ObjectStoreStatistics"]


@dataclass(frozen=True)
class ObjectStoreStatistics:
    objects: int
    used_bytes: int
    capacity_bytes: int
    object_ids: tuple  # sorted


class MemoryObjectStore:
    """Immutable objects as bytes; ``get`` hands out read-only views, so a
    NumPy array read back is read-only, as from shared memory."""

    def __init__(self, capacity_bytes: int) -> None:
        self.capacity_bytes = capacity_bytes
        self._objects: dict[bytes, tuple[bytes, list[bytes]]] = {}
        self._owners: dict[bytes, str] = {}
        # owner -> its objects here: an owner's death frees them without a
        # scan of the store (every node hears of every worker's death).
        self._by_owner: dict[str, set[bytes]] = {}
        self._used_bytes = 0

    def contains(self, object_id: bytes) -> bool:
        return object_id in self._objects

    def put(self, object_id: bytes, data: bytes, buffers: list, owner: str = "") -> None:
        if object_id in self._objects:
            # One id, one owner: each execution makes its own ids
            # (TaskID.for_attempt), so a second copy has the first one's owner.
            assert self._owners[object_id] == owner, (object_id.hex(), self._owners[object_id],
                                                      owner)
            return
        copies = [bytes(memoryview(b).cast("B")) for b in buffers]
        size = len(data) + sum(len(c) for c in copies)
        if self._used_bytes + size > self.capacity_bytes:
            raise ObjectStoreFullError(
                f"the object store is full: {size} bytes requested, "
                f"{self.capacity_bytes - self._used_bytes} of {self.capacity_bytes} free")
        self._objects[object_id] = (bytes(data), copies)
        self._owners[object_id] = owner
        self._by_owner.setdefault(owner, set()).add(object_id)
        self._used_bytes += size

    def object_owners(self) -> dict[bytes, str]:
        return dict(sorted(self._owners.items()))

    def objects_owned_by(self, owner: str) -> list[bytes]:
        return sorted(self._by_owner.get(owner, ()))

    def get(self, object_id: bytes):
        entry = self._objects.get(object_id)
        if entry is None:
            return None
        data, buffers = entry
        return data, [memoryview(b) for b in buffers]

    def delete(self, object_id: bytes) -> None:
        entry = self._objects.pop(object_id, None)
        owner = self._owners.pop(object_id, None)
        if owner is not None:
            owned = self._by_owner[owner]
            owned.discard(object_id)
            if not owned:
                del self._by_owner[owner]
        if entry is not None:
            self._used_bytes -= len(entry[0]) + sum(len(b) for b in entry[1])

    def used_bytes(self) -> int:
        return self._used_bytes

    def statistics(self) -> ObjectStoreStatistics:
        return ObjectStoreStatistics(objects=len(self._objects), used_bytes=self._used_bytes,
                                     capacity_bytes=self.capacity_bytes,
                                     object_ids=tuple(sorted(self._objects)))

