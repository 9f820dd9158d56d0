"""The node's object store in shared memory (tmpfs under /dev/shm).

Each sealed object is one file ``<dir>/<object id hex>``: a header (pickle
length, buffer count, buffer sizes), the pickle stream, then the buffers,
each aligned to 64 bytes so NumPy gets aligned views. Writers create
``.<id>.tmp`` and rename it when complete, so a reader never sees a partial
object. ``get`` maps the file read-only: a NumPy array read back is a view of
shared memory, read-only, with no copy. Every process of the node opens the
same directory; deleting a file while it is mapped is safe (the pages stay
until the last view goes).

Capacity is accounted by summing the directory; ``put`` beyond it raises
ObjectStoreFullError. Eviction and spilling to disk are not implemented yet."""

from __future__ import annotations

import mmap
import os
import struct

from ...exceptions import ObjectStoreFullError

ALIGN = 64


def _aligned(offset: int) -> int:
    return (offset + ALIGN - 1) // ALIGN * ALIGN


class ShmObjectStore:
    def __init__(self, directory: str, capacity_bytes: int) -> None:
        self.directory = directory
        self.capacity_bytes = capacity_bytes
        os.makedirs(directory, exist_ok=True)

    def _path(self, object_id: bytes) -> str:
        return os.path.join(self.directory, object_id.hex())

    def contains(self, object_id: bytes) -> bool:
        return os.path.exists(self._path(object_id))

    def used_bytes(self) -> int:
        total = 0
        with os.scandir(self.directory) as entries:
            for entry in entries:
                try:
                    total += entry.stat().st_size
                except FileNotFoundError:
                    pass
        return total

    def put(self, object_id: bytes, data: bytes, buffers: list) -> None:
        path = self._path(object_id)
        if os.path.exists(path):
            return
        views = [memoryview(b).cast("B") for b in buffers]
        header = struct.pack(f"<QI{len(views)}Q", len(data), len(views), *(v.nbytes for v in views))
        offset = _aligned(len(header) + len(data))
        layout = []
        for view in views:
            layout.append(offset)
            offset = _aligned(offset + view.nbytes)
        size = offset
        free = self.capacity_bytes - self.used_bytes()
        if size > free:
            raise ObjectStoreFullError(
                f"the object store is full: {size} bytes requested, {free} of "
                f"{self.capacity_bytes} free")
        temporary = os.path.join(self.directory, f".{object_id.hex()}.{os.getpid()}.tmp")
        fd = os.open(temporary, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o600)
        try:
            os.ftruncate(fd, size)
            os.pwrite(fd, header + bytes(data), 0)
            for view, position in zip(views, layout, strict=True):
                written = 0
                while written < view.nbytes:
                    written += os.pwrite(fd, view[written:], position + written)
        finally:
            os.close(fd)
        os.rename(temporary, path)

    def get(self, object_id: bytes):
        try:
            fd = os.open(self._path(object_id), os.O_RDONLY)
        except FileNotFoundError:
            return None
        try:
            size = os.fstat(fd).st_size
            mapped = mmap.mmap(fd, size, prot=mmap.PROT_READ)
        finally:
            os.close(fd)
        view = memoryview(mapped)
        data_len, count = struct.unpack_from("<QI", view, 0)
        sizes = struct.unpack_from(f"<{count}Q", view, 12)
        start = 12 + 8 * count
        data = bytes(view[start:start + data_len])
        offset = _aligned(start + data_len)
        buffers = []
        for length in sizes:
            buffers.append(view[offset:offset + length])
            offset = _aligned(offset + length)
        return data, buffers

    def delete(self, object_id: bytes) -> None:
        try:
            os.unlink(self._path(object_id))
        except FileNotFoundError:
            pass

    def statistics(self) -> dict:
        return {"used_bytes": self.used_bytes(), "capacity_bytes": self.capacity_bytes}
