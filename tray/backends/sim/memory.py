"""Each simulated machine's memory, as its node's memory monitor reads it,
and the cluster's API over it: a test sets a machine's background use,
a simulated task allocates and frees its share (``tray.simtest.cluster()``
``.set_memory_usage``, ``.allocate_memory``, ...)."""

from __future__ import annotations

from ...core.context import current_worker
from ...core.interfaces import MemorySnapshot
from ...exceptions import TrayError

# Each simulated machine's physical memory (what the memory monitor watches).
DEFAULT_MACHINE_MEMORY_BYTES = 16 * 1024**3


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

    def holders(self) -> dict:
        """Process address -> bytes it holds now (those holding any)."""
        return {address: size for address, size in self._allocated.items() if size}

    def allocated_by(self, address: str) -> int:
        return self._allocated.get(address, 0)

    def snapshot(self) -> MemorySnapshot:
        used = self.background_bytes + sum(self._allocated.values())
        return MemorySnapshot(used_bytes=min(used, self.total_bytes),
                              total_bytes=self.total_bytes)


class MemoryAPI:
    """``SimCluster``'s memory methods (a part of its class, see cluster.py):
    they read and change ``self.memory`` (a ``SimulatedMemory`` per
    machine) and find processes and nodes through the cluster's
    ``processes``, ``_index_of`` and ``_apply``."""

    def set_memory_usage(self, node_id: str, used_bytes: int) -> None:
        """Memory used on a node's machine besides what simulated processes
        allocated (as other programs use a real machine's)."""
        if used_bytes < 0:
            raise ValueError(f"used_bytes must be non-negative, got {used_bytes}")
        index = self._index_of(node_id)

        def apply() -> None:
            self.trace.record("fault", "set_memory_usage", node=node_id, used_bytes=used_bytes)
            self.memory[index].background_bytes = used_bytes

        self._apply("set_memory_usage", apply)

    def memory_usage(self, node_id: str):
        """The node's machine memory now (``MemorySnapshot``)."""
        return self.memory[self._index_of(node_id)].snapshot()

    def allocate_memory(self, size_bytes: int) -> None:
        """Called from a simulated task or actor: its worker process now
        holds ``size_bytes`` more of its machine's memory, until it frees it
        (``free_memory``) or ends."""
        worker = current_worker.get(None)
        process = self.processes.get(getattr(worker, "address", ""))
        if worker is None or process is None or process.node_index is None or \
                process.component is not worker:
            raise TrayError("allocate_memory() is called from inside a simulated task or "
                            "actor")
        self.memory[process.node_index].allocate(process.address, size_bytes)

    def free_memory(self, size_bytes: int | None = None) -> None:
        """Give back memory the calling task's worker allocated (all: None)."""
        worker = current_worker.get(None)
        process = self.processes.get(getattr(worker, "address", ""))
        if process is not None and process.node_index is not None:
            self.memory[process.node_index].free(process.address, size_bytes)
