"""The narrow interfaces through which the core reaches the world.

The core never opens a socket, starts a thread or process, reads the wall
clock or draws global randomness (docs/architecture.md, "The rules"). Backends hand
it implementations of these protocols instead: real ones (TCP, shared
memory, subprocesses, Redis) or simulated ones (virtual network, in-process
bytes, trio task groups, memory that survives a simulated GCS crash).

Time is trio's clock (``trio.current_time``/``trio.sleep``): the real clock
in real processes, the simulator's ``VirtualClock`` (tray/backends/sim/engine.py),
which jumps to the next deadline whenever no simulated task can run.
"""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol


class ProcessExit(BaseException):
    """Ends the (simulated) process the raising code runs in, as ``os._exit``
    does a real one. A backend raises a subclass; the core never catches it as
    a task's or a call's error, it unwinds to the process's root."""


class ConnectionClosed(Exception):
    """The peer of a stream went away (closed, crashed, or the link broke)."""


class Stream(Protocol):
    """An ordered, reliable, bidirectional message stream.

    Messages are Python objects made of plain data (bytes, str, numbers,
    tuples, lists, dicts and the core's dataclasses); the transport encodes
    them, so nothing is ever shared by reference between processes."""

    async def send(self, message: Any) -> None: ...

    def send_nowait(self, message: Any) -> bool:
        """Send without waiting, if this stream can: True when the message
        is on its way (in order with everything sent before), False when
        the stream cannot send without waiting (then use ``send``). Raises
        ConnectionClosed like ``send``."""

    async def receive(self) -> Any:
        """The next message; raises ConnectionClosed when the stream ends."""

    async def aclose(self) -> None: ...


class Transport(Protocol):
    async def serve(self, address: str, on_stream: Callable[[Stream], Awaitable[None]],
                    *, task_status: Any) -> None:
        """Accept streams at ``address`` until cancelled, calling
        ``on_stream`` for each in a new task; report readiness through
        ``task_status``."""

    async def connect(self, address: str) -> Stream:
        """Open a stream to ``address``; raises ConnectionClosed if nobody
        listens there."""

    def flush_queued(self) -> None:
        """Write now what this trio run's streams hold queued for the end of
        the loop's pass (``send_nowait``). Called on the loop from a long
        synchronous stretch of work (a drain of the user's submissions), so
        that its messages leave while it goes on. A transport that sends at
        once has nothing to do."""


class Storage(Protocol):
    """The GCS's durable tables: key -> bytes per table."""

    def put(self, table: str, key: str, value: bytes) -> None: ...

    def get(self, table: str, key: str) -> bytes | None: ...

    def delete(self, table: str, key: str) -> None: ...

    def scan(self, table: str) -> list[tuple[str, bytes]]:
        """Every (key, value) of ``table``, sorted by key."""


class ObjectStore(Protocol):
    """A node's store of large immutable objects.

    ``get`` returns the pickle stream and the out-of-band buffers as
    read-only memoryviews (zero-copy where the store is shared memory)."""

    capacity_bytes: int

    def contains(self, object_id: bytes) -> bool: ...

    def put(self, object_id: bytes, data: bytes, buffers: list, owner: str = "") -> None:
        """Create and seal the object; raises ObjectStoreFullError. ``owner``
        is the address of the process that owns it."""

    def objects_owned_by(self, owner: str) -> list[bytes]:
        """The ids of the objects here that ``owner`` owns."""

    def object_owners(self) -> dict[bytes, str]:
        """Every object here, with its owner's address."""

    def get(self, object_id: bytes) -> tuple[bytes, list[memoryview]] | None: ...

    def delete(self, object_id: bytes) -> None: ...

    def used_bytes(self) -> int: ...

    # Optional (the shared-memory store has them, the simulator's has not):
    # a store whose ``machine_key`` is not None can take an object from
    # another store on its machine without a copy, from what that store's
    # ``share(object_id)`` returns, with ``adopt(object_id, shared) -> bool``.


class Spawner(Protocol):
    """Starts and kills worker processes of one node."""

    def start_worker(self, worker_id_hex: str, env: dict[str, str]) -> None:
        """Start a worker; it registers with its node manager when ready."""

    def kill_worker(self, worker_id_hex: str) -> None: ...


class Tracer(Protocol):
    def record(self, component: str, event: str, **fields: Any) -> None: ...


class AsyncioLoops(Protocol):
    """How a worker runs async actors' methods: an asyncio event loop on its
    trio loop (trio-asyncio on both backends: tray/backends/asyncio_loops.py),
    which the core does not import."""

    def open_loop(self) -> Any:
        """An async context manager: the loop, for as long as it is open."""

    def run_aio_future(self, future: Any) -> Awaitable[Any]:
        """Await an asyncio future (a method's task) from trio."""


class NullTracer:
    def record(self, component: str, event: str, **fields: Any) -> None:
        pass


@dataclass(frozen=True)
class MemorySnapshot:
    """The memory of a node's machine (or its container) now, as the memory
    monitor reads it: ``used_bytes`` counts what cannot be reclaimed (page
    cache excluded), out of ``total_bytes``."""
    used_bytes: int
    total_bytes: int


@dataclass(frozen=True)
class NodeLocation:
    """Where a node keeps things on its machine: what a driver attaching on
    that machine needs (the GCS stores it with the node's record)."""
    hostname: str = ""
    ip: str = ""
    store_directory: str = ""
    spill_directory: str = ""
    session_dir: str = ""


@dataclass
class ProcessEnv:
    """What a component process (GCS, node manager, core worker) is handed
    by its backend: every way it reaches the world."""
    address: str
    transport: Transport
    rng: random.Random
    tracer: Tracer
    config: Any
    node_id: str | None = None
    object_store: ObjectStore | None = None
    spawner: Spawner | None = None
    gcs_address: str = ""
    node_manager_address: str = ""
    storage: Storage | None = None
    resources: dict[str, float] = field(default_factory=dict)
    # Ends this process: a worker told to stop a task by force, a node that
    # was declared dead (it fences itself). None: nothing to end.
    exit_process: Callable[[], None] | None = None
    # Awaited with a task's GPU ids and its TaskSpec before its function is
    # loaded (a real worker sets up the runtime_env the first time, then
    # CUDA_VISIBLE_DEVICES and OMP_NUM_THREADS).
    before_task: Callable[[list, Any], Awaitable[None]] | None = None
    # Simulated workers: the virtual seconds a task or actor call costs once
    # its user code returned (the TaskSpec in; backends/sim/task_cost.py).
    # None: real work takes real time.
    task_cost_s: Callable[[Any], float] | None = None
    # Core workers whose state other threads reach (the local backend's
    # driver, whose script runs beside the loop's thread; workers with
    # threaded actors): makes a re-entrant lock with a condition
    # (``threading.Condition(threading.RLock())``). None: one thread, as in
    # the simulator.
    thread_condition: Callable[[], Any] | None = None
    # Workers: await run_sync_in_thread(fn, concurrency_group) runs a threaded
    # actor's synchronous method in a thread (None: inline, as the simulator).
    run_sync_in_thread: Callable | None = None
    # Workers: the asyncio loop async actors' methods run on. None: no async
    # actor can start here.
    asyncio_loops: AsyncioLoops | None = None
    # Workers: run the process's exit handlers (Python's atexit) when its
    # actor exits. None where processes share one interpreter (the simulator).
    run_exit_handlers: Callable[[], None] | None = None
    # Node managers: where the node keeps things, how long to wait for a GCS
    # started beside it, and how many workers to start at once.
    node_location: NodeLocation = field(default_factory=NodeLocation)
    wait_for_gcs_s: float = 0.0
    prestart_workers: int = 0
    # Node managers: read the machine's memory now (the memory monitor's
    # input). None: no monitor on this node.
    read_memory: Callable[[], MemorySnapshot] | None = None
