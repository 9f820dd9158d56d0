"""The node's object store in shared memory (tmpfs under /dev/shm).

Each sealed object is one file ``<dir>/<object id hex>``: a header (pickle
length, buffer count, owner length, buffer sizes, the owner's address), the
pickle stream, then the buffers,
each aligned to 64 bytes so NumPy gets aligned views. Writers create
``.<id>.tmp`` and rename it when complete, so a reader never sees a partial
object. ``get`` maps the file read-only: a NumPy array read back is a view of
shared memory, read-only, with no copy. Every process of the node opens the
same directory; deleting a file while it is mapped is safe (the pages stay
until the last view goes).

Capacity is accounted by summing the directory: every process of the node
writes there, so no one process's count is the truth. Summing it on every
``put`` made a put cost O(objects stored) (100k live objects: the scan is
the put), so a process sums it again only when its last sum is older than
``USED_BYTES_RESCAN_S`` or its estimate (that sum plus its own puts since)
comes within a quarter of the capacity; below that, other processes would
have to fill a quarter of the store within the rescan period for a put to
overshoot it. When a ``put`` does not fit,
the least recently used objects are *spilled*: moved to the node's spill
directory on disk. ``get`` reads a spilled object transparently (a read-only
mapping of the file, served from the page cache). ObjectStoreFullError is
raised only when nothing more can be spilled, or the object alone is larger
than the store. The owner frees objects as soon as nobody references them,
so what remains in the store is referenced: spilling, not eviction, is what
makes room.

Nodes on one machine share objects instead of copying them: a pulling node
whose store lives on the same tmpfs as the source's (``machine_key``: the
kernel's boot id and the file system's device) hard-links the source's file
into its own directory (``share`` / ``adopt``). An object is immutable and
a file outlives every link but the last, so each node frees its own link as
before; each directory counts the object's size (conservatively, as two
copies). Across machines, or where linking fails, the node manager reads
the object in chunks."""

from __future__ import annotations

import mmap
import os
import shutil
import struct
import time

from ...exceptions import ObjectStoreFullError

ALIGN = 64
# A process sums the store directory again at most this often, unless the
# store is within a quarter of full (see the module header).
USED_BYTES_RESCAN_S = 0.1
HEADER_FIXED_BYTES = struct.calcsize("<QIH")


def _aligned(offset: int) -> int:
    return (offset + ALIGN - 1) // ALIGN * ALIGN


def _read_owner(path: str) -> str | None:
    """The owner's address in an object file's header (None: it is gone)."""
    try:
        with open(path, "rb") as file:
            _, count, owner_len = struct.unpack("<QIH", file.read(HEADER_FIXED_BYTES))
            file.seek(HEADER_FIXED_BYTES + 8 * count)
            return file.read(owner_len).decode()
    except (FileNotFoundError, struct.error, ValueError):
        return None


def _machine_key(directory: str) -> str | None:
    """Stores with the same key are on one machine and one file system, so a
    file of one can be linked into the other; None where this kernel does
    not say which boot it is, or ``TRAY_SHARE_OBJECTS_ON_MACHINE=0`` (then
    nothing is shared: every pull copies, as across machines)."""
    if os.environ.get("TRAY_SHARE_OBJECTS_ON_MACHINE", "1") == "0":
        return None
    try:
        with open("/proc/sys/kernel/random/boot_id") as file:
            boot = file.read().strip()
        return f"{boot}:{os.stat(directory).st_dev}"
    except OSError:
        return None


class ShmObjectStore:
    def __init__(self, directory: str, capacity_bytes: int, spill_directory: str | None = None
                 ) -> None:
        self.directory = directory
        self.capacity_bytes = capacity_bytes
        self.spill_directory = spill_directory
        os.makedirs(directory, exist_ok=True)
        if spill_directory:
            os.makedirs(spill_directory, exist_ok=True)
        self.spilled_objects = 0
        self.machine_key = _machine_key(directory)
        self.objects_adopted = 0  # objects shared by another node's store on this machine
        # The directory's size at the last sum plus this process's puts since.
        self._used_estimate = 0
        self._summed_at = -float("inf")  # time.monotonic() of the last sum
        # File name -> owner, and owner -> file names, of the objects the
        # last listing found (bounded by what the store holds). An object's
        # owner never changes, so a listing opens only the files it has not
        # seen before: every node lists its store at every worker's death
        # (objects_owned_by), and opening every file cost 175 ms at 10k
        # objects, 2.5 s at 100k, with the node's loop blocked.
        self._owner_by_name: dict[str, str] = {}
        self._names_by_owner: dict[str, set[str]] = {}

    def _path(self, object_id: bytes) -> str:
        return os.path.join(self.directory, object_id.hex())

    def _spill_path(self, object_id: bytes) -> str | None:
        if not self.spill_directory:
            return None
        return os.path.join(self.spill_directory, object_id.hex())

    def contains(self, object_id: bytes) -> bool:
        spill = self._spill_path(object_id)
        return os.path.exists(self._path(object_id)) or (spill is not None and
                                                         os.path.exists(spill))

    def _make_room(self, size: int) -> None:
        """Spill least recently used objects until ``size`` bytes fit."""
        if size > self.capacity_bytes:
            raise ObjectStoreFullError(
                f"an object of {size} bytes is larger than the whole object store "
                f"({self.capacity_bytes} bytes)")
        if time.monotonic() - self._summed_at > USED_BYTES_RESCAN_S or \
                self._used_estimate + size > self.capacity_bytes * 3 // 4:
            self.used_bytes()
        free = self.capacity_bytes - self._used_estimate
        if size <= free:
            self._used_estimate += size
            return
        candidates = []
        with os.scandir(self.directory) as entries:
            for entry in entries:
                if not entry.name.startswith("."):
                    try:
                        stat = entry.stat()
                    except FileNotFoundError:
                        continue
                    candidates.append((stat.st_mtime_ns, entry.name, stat.st_size))
        candidates.sort()
        for _, name, file_size in candidates:
            if size <= free:
                break
            if self.spill_directory is None:
                break
            try:
                shutil.copyfile(os.path.join(self.directory, name),
                                os.path.join(self.spill_directory, f".{name}.tmp"))
                os.rename(os.path.join(self.spill_directory, f".{name}.tmp"),
                          os.path.join(self.spill_directory, name))
                os.unlink(os.path.join(self.directory, name))
            except FileNotFoundError:
                continue  # deleted or spilled by another process meanwhile
            free += file_size
            self.spilled_objects += 1
        if size > free:
            raise ObjectStoreFullError(
                f"the object store is full: {size} bytes requested, {free} of "
                f"{self.capacity_bytes} free, and nothing more can be spilled")
        self._used_estimate = self.capacity_bytes - free + size

    def used_bytes(self) -> int:
        """The store directory's size now (a sum: O(objects stored))."""
        total = 0
        with os.scandir(self.directory) as entries:
            for entry in entries:
                try:
                    total += entry.stat().st_size
                except FileNotFoundError:
                    pass
        self._used_estimate, self._summed_at = total, time.monotonic()
        return total

    def put(self, object_id: bytes, data: bytes, buffers: list, owner: str = "") -> None:
        if self.contains(object_id):
            return
        path = self._path(object_id)
        views = [memoryview(b).cast("B") for b in buffers]
        owner_bytes = owner.encode()
        header = struct.pack(f"<QIH{len(views)}Q", len(data), len(views), len(owner_bytes),
                             *(v.nbytes for v in views)) + owner_bytes
        offset = _aligned(len(header) + len(data))
        layout = []
        for view in views:
            layout.append(offset)
            offset = _aligned(offset + view.nbytes)
        size = offset
        self._make_room(size)
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

    def share(self, object_id: bytes) -> tuple | None:
        """What another store on this machine needs to ``adopt`` the object
        (None: not here, or spilled to disk, which is another file system)."""
        path = self._path(object_id)
        if self.machine_key is None or not os.path.exists(path):
            return None
        return self.machine_key, path

    def adopt(self, object_id: bytes, shared: tuple) -> bool:
        """Make the object ``share`` described (in another store) one of
        this store's by linking its file: no copy. False where that cannot
        be done (another machine, the source freed or spilled it meanwhile):
        the caller copies it instead."""
        key, source = shared
        if self.machine_key is None or key != self.machine_key:
            return False
        if self.contains(object_id):
            return True
        try:
            size = os.stat(source).st_size
        except OSError:
            return False
        self._make_room(size)
        temporary = os.path.join(self.directory, f".{object_id.hex()}.{os.getpid()}.tmp")
        try:
            os.link(source, temporary)
            os.rename(temporary, self._path(object_id))
        except OSError:
            try:
                os.unlink(temporary)
            except OSError:
                pass
            return False
        self.objects_adopted += 1
        return True

    def get(self, object_id: bytes):
        fd = self._open(object_id)
        if fd is None:
            return None
        try:
            size = os.fstat(fd).st_size
            mapped = mmap.mmap(fd, size, prot=mmap.PROT_READ)
        finally:
            os.close(fd)
        view = memoryview(mapped)
        data_len, count, owner_len = struct.unpack_from("<QIH", view, 0)
        sizes = struct.unpack_from(f"<{count}Q", view, HEADER_FIXED_BYTES)
        start = HEADER_FIXED_BYTES + 8 * count + owner_len
        data = bytes(view[start:start + data_len])
        offset = _aligned(start + data_len)
        buffers = []
        for length in sizes:
            buffers.append(view[offset:offset + length])
            offset = _aligned(offset + length)
        return data, buffers

    def _open(self, object_id: bytes) -> int | None:
        path = self._path(object_id)
        try:
            fd = os.open(path, os.O_RDONLY)
            os.utime(path)  # recently used: spilled last
            return fd
        except FileNotFoundError:
            pass
        spill = self._spill_path(object_id)
        if spill is None:
            return None
        try:
            return os.open(spill, os.O_RDONLY)
        except FileNotFoundError:
            return None

    def objects_owned_by(self, owner: str) -> list[bytes]:
        self._list_owners()
        return [bytes.fromhex(name) for name in sorted(self._names_by_owner.get(owner, ()))]

    def object_owners(self) -> dict[bytes, str]:
        self._list_owners()
        return {bytes.fromhex(name): owner
                for name, owner in sorted(self._owner_by_name.items())}

    def _list_owners(self) -> None:
        """Bring the owner indexes up to the directories' listing: set
        differences, and a header read for each object new since the last."""
        listed: set[str] = set()
        for directory in (self.directory, self.spill_directory):
            if directory:
                listed.update(os.listdir(directory))
        known, by_owner = self._owner_by_name, self._names_by_owner
        for name in known.keys() - listed:
            owner = known.pop(name)
            by_owner[owner].discard(name)
            if not by_owner[owner]:
                del by_owner[owner]
        for name in listed - known.keys():
            if name.startswith("."):
                continue  # being written
            owner = _read_owner(os.path.join(self.directory, name))
            if owner is None and self.spill_directory:
                owner = _read_owner(os.path.join(self.spill_directory, name))
            if owner is not None:
                known[name] = owner
                by_owner.setdefault(owner, set()).add(name)

    def delete(self, object_id: bytes) -> None:
        for path in (self._path(object_id), self._spill_path(object_id)):
            if path is None:
                continue
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass

    def statistics(self) -> dict:
        return {"used_bytes": self.used_bytes(), "capacity_bytes": self.capacity_bytes,
                "spilled_objects": self.spilled_objects,
                "objects_adopted": self.objects_adopted}
