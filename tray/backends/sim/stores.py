"""The simulator's node object store: in-process bytes with the same
capacity accounting as the shared-memory store; and each simulated
machine's memory, which the memory monitor reads. (Its GCS storage is
``backends.storage.MemoryStorage``: it outlives a simulated GCS crash, as
Redis does.)"""

from __future__ import annotations

from dataclasses import dataclass

from ...core.interfaces import MemorySnapshot
from ...exceptions import ObjectStoreFullError
from ..storage import MemoryStorage

__all__ = ["MemoryObjectStore", "MemoryStorage", "ObjectStoreStatistics", "SimulatedMemory"]


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


class SimulatedMemory:
    """A simulated machine's memory, as its node's memory monitor reads it:
    a background use (set by a test, as other programs on a real machine)
    plus what each simulated process on it allocated (freed when the
    process ends, as a killed process gives its memory back)."""

    def __init__(self, total_bytes: int) -> None:
        self.total_bytes = total_bytes
        self.background_bytes = 0
        self._allocated: dict[str, int] = {}  # process address -> bytes

    def allocate(self, address: str, size_bytes: int) -> None:
        if size_bytes < 0:
            raise ValueError(f"size_bytes must be non-negative, got {size_bytes}")
        self._allocated[address] = self._allocated.get(address, 0) + size_bytes

    def free(self, address: str, size_bytes: int | None = None) -> None:
        """Free ``size_bytes`` of what ``address`` allocated (all of it: None)."""
        held = self._allocated.pop(address, 0)
        if size_bytes is not None and held > size_bytes:
            self._allocated[address] = held - size_bytes

    def allocated_by(self, address: str) -> int:
        return self._allocated.get(address, 0)

    def snapshot(self) -> MemorySnapshot:
        used = self.background_bytes + sum(self._allocated.values())
        return MemorySnapshot(used_bytes=min(used, self.total_bytes),
                              total_bytes=self.total_bytes)
