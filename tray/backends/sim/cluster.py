"""Assembling and driving a simulated cluster (see the package docstring)."""

from __future__ import annotations

import collections
import gc
import heapq
import logging
import math
import random
import sys
import threading

import outcome
import trio

from ... import _trio_private
from ...core import config as config_module
from ...core.context import current_worker
from ...core.gcs.gcs_server import GcsServer
from ...core.ids import NodeID
from ...core.interfaces import ProcessEnv
from ...core.node.node_manager import NodeManager
from ...core.trace import Trace
from ...core.worker.core_worker import DRIVER, WORKER, CoreWorker
from ...exceptions import TrayError
from ...runtime_env.worker_environ import SimWorkerEnv
from ...transports.sim import SimNetwork
from .faults import FaultAPI
from .memory import DEFAULT_MACHINE_MEMORY_BYTES, MemoryAPI, SimulatedMemory
from .patches import (
    SimulatedProcessExit,
    _active,
    _environ_snapshot,
    _install_patches,
    _remove_patches,
)
from .stores import MemoryObjectStore, MemoryStorage
from .task_cost import TaskCostModel
from .validation import (
    InvariantChecks,
    SimulationInvariantError,
    _ChangeTracker,
    _current_process,
)

logger = logging.getLogger("tray.sim")

# A blocking call waiting longer than this in virtual time is a hang.
HANG_TIMEOUT_S = 24 * 3600.0
# The cyclic garbage collector is off during a run (when it runs would
# depend on allocation counts, which differ between a cold and a warm
# process, and collecting a cycle holding an ObjectRef frees an object);
# it runs instead at deterministic points: every this many host ticks, over
# the young generations (what survived since the last collection: a cost
# that follows the work done), and every FULL_GC_EVERY-th time over the
# whole heap (a cycle reaching into older objects waits for that one).
# Every collection was a full one: its cost followed the heap, so a run
# holding N pending tasks paid O(N) every period, O(N^2) in all (1M
# simulated tasks: ~0.74 ms of CPU per task in collections alone).
GC_EVERY_TICKS = 200_000
FULL_GC_EVERY = 16
DEFAULT_OBJECT_STORE_BYTES = 2 * 1024**3
# Every simulated node has this much schedulable "memory", as Ray gives each
# node a memory resource by default.
DEFAULT_NODE_MEMORY_BYTES = 8 * 1024**3

# When this process starts a simulated cluster that checks invariants
# (simtest's sweeps: a cluster per seed) with modules imported since it last
# did (the first time; and after a seed imported a library lazily: pandas,
# pyarrow, torch), the objects alive then (modules, classes, the program's
# own state) are moved out of the cyclic collector's sight (gc.freeze):
# every deterministic gc.collect() of a run (at start, every GC_EVERY_TICKS,
# simtest's quiescence) then walks only what the simulations allocated:
# ~2 ms instead of ~40-80 ms with numpy, trio and all of tray imported, and
# ~100 ms with pandas and pyarrow. The cost: a cycle among those objects
# that becomes garbage later is never collected (refcounting still frees
# everything else), a set bounded by the imports; a plain
# tray.init(backend="sim") program does not pay it.
_heap_frozen = {"modules": 0}


class SimulationTimeLimit(BaseException):
    """The simulated program ran past ``SimCluster.time_limit_s`` of virtual
    time (set by a harness: a program that polls forever is a hang no single
    blocking call shows). A BaseException, as KeyboardInterrupt: an
    ``except Exception`` in the program must not swallow it and poll on."""


class _DriverExceptionHidden(Exception):
    """The exception the simulated processes see as being handled while the
    driver's code runs the simulation from inside an ``except`` block (a
    ``tray.get`` in a handler). In a real cluster every process handles its
    own exceptions; here the processes' coroutines run in the driver's
    thread, and an exception raised in one chained to the driver's
    (``__context__``), with its traceback, its frames and every ref in them.
    A process that kept such an exception (a coroutine awaiting inside its
    ``except`` block, as the GCS's actor scheduler does after a lost lease
    request) kept the driver's refs alive past their last use: tune chaos
    seed 86 leaked the returns of the runners' ``serve`` calls, held by the
    driver's ``except`` frame of a lost runner. This stand-in is raised
    and caught around those steps instead, with no context and no
    traceback: what chains to it holds nothing."""


class VirtualClock(trio.abc.Clock):
    """Virtual time that jumps straight to the next deadline when no task
    can run, as ``MockClock(autojump_threshold=0)`` does, one guest tick
    sooner and with no clock arithmetic on real time.

    MockClock autojumps in a tick of its own: the tick that finds every task
    blocked polls for I/O, the next one sees nothing came and jumps, the one
    after that expires the deadlines and runs their tasks (three host ticks
    per point of virtual time). Here the run loop's question "how long until
    the next deadline?" records the deadline and answers 0; the host loop
    (``SimCluster._pump``) moves the time there right before the next tick,
    unless the driver queued work meanwhile (then that work runs first, at
    the time it was queued, and the jump is asked again). Measured on a
    3-node sim of 20,000 trivial tasks: about 30% fewer host ticks."""

    def __init__(self) -> None:
        self._now_s = 0.0
        self.next_deadline_s: float | None = None  # a jump the run loop asked for
        # The network's next delivery to a parked receiver (SimNetwork's
        # host-driven delivery): a deadline trio does not know about.
        self.next_delivery_s = lambda: math.inf

    def start_clock(self) -> None:
        pass

    def current_time(self) -> float:
        return self._now_s

    def deadline_to_sleep_time(self, deadline: float) -> float:
        # Never a positive timeout: the guest run would then wait for I/O in
        # a thread, and the host loop would find its queue empty meanwhile.
        deadline = min(deadline, self.next_delivery_s())
        if deadline != math.inf and deadline > self._now_s:
            self.next_deadline_s = deadline
        return 0.0

    def jump_to_next_deadline(self) -> None:
        if self.next_deadline_s is not None and self.next_deadline_s > self._now_s:
            self._now_s = self.next_deadline_s
        self.next_deadline_s = None

    def jump(self, seconds: float) -> None:
        """Move virtual time forward by ``seconds`` (MockClock's API)."""
        if seconds < 0:
            raise ValueError("time can't go backwards")
        self._now_s += seconds


class _HostInbox:
    """What the host thread (the driver's code, between guest ticks) queues
    for the run: ``SimCluster.call_soon``.

    trio's own way in, ``run_sync_soon``, writes a byte to its wake-up
    socket per call and makes the next tick poll for it (a syscall each: the
    driver's calls queue one per ``.remote()``, ~8% of a 3-node sim of
    trivial tasks). The host and the run share a thread here, so a
    callback needs no more than a deque and a parked task: ``put`` appends
    and reschedules that task (as the network wakes a parked receiver); the
    task runs what was queued, in order, in the next tick, as the entry
    queue's task would have."""

    def __init__(self) -> None:
        self.queue: collections.deque = collections.deque()  # emptied every tick it is woken
        self.task = None  # the parked task; None while it runs (or before it starts)
        self.reschedule = None  # the trio runner's

    def put(self, fn) -> None:
        self.queue.append(fn)
        task = self.task
        if task is not None:
            self.task = None
            self.reschedule(task)

    async def run(self) -> None:
        self.task = None
        me = trio.lowlevel.current_task()

        def abort(_raise_cancel) -> trio.lowlevel.Abort:
            if self.task is me:
                self.task = None
            return trio.lowlevel.Abort.SUCCEEDED

        while True:
            for _ in range(len(self.queue)):  # bounded: what they queue runs next time
                self.queue.popleft()()
            if self.queue:
                await trio.lowlevel.cancel_shielded_checkpoint()
                continue
            self.task = me
            await trio.lowlevel.wait_task_rescheduled(abort)


class _Timers:
    """``trio.sleep`` in simulated code (a task's cost, heartbeats, the
    memory monitor, user code's ``time.sleep``): the task parks in this
    heap and the host loop wakes it right after it moves the virtual clock
    there, as it wakes a receiver whose message arrived.

    trio's own sleep is a cancel scope with a deadline: its end cancels the
    scope and raises Cancelled through the sleeping task's frames, ~20 us
    where a reschedule costs ~3 (that wake-up path was ~8% of a 3-node sim
    of trivial tasks, one sleep each). A sleep here is cancellable as
    trio's (the abort marks its entry dead) and wakes in the same host tick
    trio's deadline would have."""

    def __init__(self) -> None:
        self.heap: list = []  # [wake_at, seq, task or None once aborted]
        self._seq = 0
        self.reschedule = None  # the trio runner's

    async def sleep_until(self, wake_at: float) -> None:
        self._seq += 1
        entry = [wake_at, self._seq, trio.lowlevel.current_task()]
        heapq.heappush(self.heap, entry)

        def abort(_raise_cancel) -> trio.lowlevel.Abort:
            entry[2] = None
            return trio.lowlevel.Abort.SUCCEEDED

        await trio.lowlevel.wait_task_rescheduled(abort)

    def next_s(self) -> float:
        heap = self.heap
        while heap and heap[0][2] is None:
            heapq.heappop(heap)
        return heap[0][0] if heap else math.inf

    def wake_due(self, now: float) -> None:
        heap = self.heap
        while heap and heap[0][0] <= now:
            task = heapq.heappop(heap)[2]
            if task is not None:
                self.reschedule(task)


class SimProcess:
    def __init__(self, name: str, address: str, node_index: int | None) -> None:
        self.name = name
        self.address = address
        self.node_index = node_index
        self.scope: trio.CancelScope | None = None
        self.nursery: trio.Nursery | None = None
        self.alive = True
        self.changed = False  # ran since its invariants were last checked
        self.component = None
        self.on_exit = None  # on_exit(exit_code) when the process has ended, however it ended
        self.exit_code = 0  # -9 when killed, 1 when it crashed, else what it exited with


class SimSpawner:
    def __init__(self, cluster: SimCluster, node_index: int) -> None:
        self.cluster = cluster
        self.node_index = node_index

    def start_worker(self, worker_id_hex: str, env: dict) -> None:
        self.cluster.start_worker(self.node_index, worker_id_hex)

    def kill_worker(self, worker_id_hex: str) -> None:
        self.cluster.kill_process(f"n{self.node_index}/worker-{worker_id_hex[:12]}")


class SimCluster(FaultAPI, MemoryAPI, InvariantChecks):
    def __init__(self, *, seed: int, num_nodes: int, num_cpus: float, num_gpus: float,
                 resources: dict, config=None, object_store_memory: int | None = None,
                 worker_start_delay_s: float = 0.005, validate_every_steps: int = 0,
                 task_cost_s: float | dict | None = None) -> None:
        if num_nodes < 1:
            raise ValueError(f"num_nodes must be at least 1, got {num_nodes}")
        self.seed = seed
        self.num_nodes = num_nodes
        self.task_costs = TaskCostModel(seed, task_cost_s)
        self.config = config or config_module.DEFAULT_CONFIG
        self.clock = VirtualClock()
        # Virtual time past which any blocking call of the program raises
        # SimulationTimeLimit (a harness's bound on the whole program).
        self.time_limit_s = float("inf")
        self.trace = Trace(self.clock.current_time)
        self.storage = MemoryStorage()
        self.network = SimNetwork(self._rng("network"), self.trace)
        node_resources = {"CPU": float(num_cpus), "memory": float(DEFAULT_NODE_MEMORY_BYTES),
                          **{k: float(v) for k, v in resources.items()}}
        if num_gpus:
            node_resources["GPU"] = float(num_gpus)
        self.node_resources = node_resources
        # Each simulated worker's os.environ (runtime_env.worker_environ), by address.
        self.worker_environs: dict[str, SimWorkerEnv] = {}
        self.object_store_bytes = object_store_memory or DEFAULT_OBJECT_STORE_BYTES
        self.worker_start_delay_s = worker_start_delay_s
        # Machines added at runtime (add_node) with resources of their own.
        self._machine_resources: dict[int, dict] = {}
        self._node_ids = [NodeID.from_random(self._rng(f"node-id-{i}")).hex()
                          for i in range(num_nodes)]
        self._generation = [0] * num_nodes  # restarts of each machine's node
        self.stores = [MemoryObjectStore(self.object_store_bytes) for _ in range(num_nodes)]
        self.memory = [SimulatedMemory(DEFAULT_MACHINE_MEMORY_BYTES) for _ in range(num_nodes)]
        self.processes: dict[str, SimProcess] = {}
        self.gcs_address = "n0/gcs"
        self._host_queue: collections.deque = collections.deque()
        self._inbox = _HostInbox()
        self._timers = _Timers()
        self._finished: outcome.Outcome | None = None
        self._ready = False
        self._nursery: trio.Nursery | None = None
        self._token = None
        self.driver: CoreWorker | None = None
        self._scheduler_state = None
        self._failure_reported = False
        self._gcs_down = False
        # Check every component's invariants after every this many steps
        # (host ticks) of the run; 0: never.
        self.validate_every_steps = validate_every_steps
        self.invariant_failure: SimulationInvariantError | None = None
        self._all_changed = True  # every process to check at the next validation
        self._changed_processes: list[SimProcess] = []  # else these (a step marked them)
        # (address, exception) of every simulated process that crashed.
        self.crashes: list = []
        self._stopping = False

    def _rng(self, name: str) -> random.Random:
        return random.Random(f"{self.seed}:{name}")

    # ----------------------------------------------------------- host loop

    def start(self) -> None:
        self._scheduler_state = _trio_private.scheduling_state()
        _trio_private.schedule_deterministically(f"{self.seed}:trio")
        trio.lowlevel.start_guest_run(
            self._main, run_sync_soon_threadsafe=self._host_queue.append,
            done_callback=self._done, clock=self.clock, host_uses_signal_set_wakeup_fd=True)
        guest = _trio_private.take_over_guest_run(self._host_queue.popleft(), self._done)
        self._ticker = guest.ticks
        self._entry_queue = guest.entry_queue
        self.network.drive_deliveries(guest.reschedule)
        self._inbox.reschedule = self._timers.reschedule = guest.reschedule
        network, timers = self.network, self._timers
        self.clock.next_delivery_s = lambda: min(network.next_delivery_s(), timers.next_s())
        if self.validate_every_steps:
            tracker = _ChangeTracker(self)
            guest.instruments.add_instrument(tracker)
            guest.instruments.step_tracker = tracker
        _install_patches()
        self._gc_was_enabled = gc.isenabled()
        gc.collect()
        if self.validate_every_steps and len(sys.modules) != _heap_frozen["modules"]:
            _heap_frozen["modules"] = len(sys.modules)
            gc.freeze()
        gc.disable()
        self._ticks = 0
        _active["cluster"] = self
        _active["last"] = self
        try:
            self._pump(lambda: self._ready, "cluster start")
        except BaseException:
            self.shutdown()
            raise

    def _done(self, result: outcome.Outcome) -> None:
        self._finished = result

    def _pump(self, condition, what: str) -> None:
        if sys.exception() is None:
            self._steps(condition, what)
            return
        # The driver's code is handling an exception: the simulated
        # processes must not see it (see _DriverExceptionHidden).
        handled = sys.exception()
        handled_context = handled.__context__
        try:
            raise _DriverExceptionHidden("(the driver's code was handling an exception)")
        except _DriverExceptionHidden as stand_in:
            stand_in.__context__ = stand_in.__traceback__ = None
            try:
                self._steps(condition, what)
            except BaseException as error:
                if error.__context__ is stand_in:
                    # What it would chain to, raised in the driver's handler
                    # (where the one handled keeps its own).
                    error.__context__ = handled_context if error is handled else handled
                raise
        finally:
            del handled, handled_context

    def _steps(self, condition, what: str) -> None:
        deadline = min(self.clock.current_time() + HANG_TIMEOUT_S, self.time_limit_s)
        ticker = self._ticker
        # The driver's code ran since the last step: it changed the driver's
        # state (what it changes elsewhere, it changes through call_soon or
        # the fault API, whose steps run outside every process: all are
        # checked then).
        driver = self.processes.get("n0/driver")
        if driver is None:
            self._all_changed = True
        elif not driver.changed:
            driver.changed = True
            self._changed_processes.append(driver)
        # (The loop's objects in locals: this runs once per host tick, ~7
        # per simulated task.)
        clock, network, timers = self.clock, self.network, self._timers
        inbox_queue, entry = self._inbox.queue, self._entry_queue
        entry_queue_pending = _trio_private.entry_queue_pending
        host_queue, due, sleeping = self._host_queue, network._due, timers.heap
        while not condition():
            if self._finished is not None:
                self._raise_if_failed()
                raise TrayError(f"the simulated cluster stopped during {what}")
            if host_queue or ticker.finished:
                # trio handed the host a callback: it wants to poll in a
                # thread, which this loop never does (see GuestTicks).
                raise TrayError(f"the simulation stalled during {what}")
            if inbox_queue or entry_queue_pending(entry):
                clock.next_deadline_s = None  # the driver's work runs first, now
            else:
                clock.jump_to_next_deadline()
            if due:
                network.deliver_due(clock._now_s)
            if sleeping:
                timers.wake_due(clock._now_s)
            ticker.tick()
            self._ticks += 1
            ticks = self._ticks
            if self.validate_every_steps and ticks % self.validate_every_steps == 0 \
                    and (self._all_changed or self._changed_processes):
                self.validate_components(changed_only=True)
            if ticks % GC_EVERY_TICKS == 0:
                gc.collect(2 if ticks % (GC_EVERY_TICKS * FULL_GC_EVERY) == 0 else 1)
                self._all_changed = True  # finalizers may have run anywhere
            if clock._now_s > deadline:
                if clock._now_s > self.time_limit_s:
                    raise SimulationTimeLimit(
                        f"the program ran past {self.time_limit_s:.0f} s of virtual time "
                        f"(during {what}): it makes no progress (a hang)")
                raise TrayError(f"{what} waited {HANG_TIMEOUT_S} s of virtual time: the "
                                "simulated cluster cannot make progress (a hang)")

    def run(self, async_fn, *args):
        """Run ``async_fn`` as a task of the driver; block until it returns."""
        if self._finished is not None:
            raise TrayError("the simulated cluster has shut down")
        box: list = []

        async def runner() -> None:
            box.append(await outcome.acapture(async_fn, *args))

        self.driver.spawn(runner)
        self._pump(lambda: bool(box), getattr(async_fn, "__name__", "a call"))
        return box[0].unwrap()

    def call_soon(self, fn, process: SimProcess | None = None) -> None:
        """Run ``fn`` in the trio run soon; callable from the driver's thread.
        ``process``: the one process whose state ``fn`` may change (None:
        any), for the change tracker."""

        def picked_up() -> None:
            fn()

        picked_up.changes_process = process
        self._inbox.put(picked_up)

    def shutdown(self) -> None:
        try:
            if self._finished is None and self._token is not None:
                # Processes are torn down mid-step from here on: their state
                # is not expected to hold together any more.
                self.validate_every_steps = 0
                self._stopping = True
                if self.driver is not None:
                    self.driver.begin_shutdown()
                self._token.run_sync_soon(self._nursery.cancel_scope.cancel)
                self._pump(lambda: self._finished is not None, "shutdown")
        finally:
            if self._finished is None and self._token is not None:
                # The run could not end (a hang or a crash during shutdown,
                # already raising): abandon it as trio does a finished one,
                # so this process can start another cluster, not fail every
                # later one with "run() from inside a run()".
                _trio_private.abandon_run()
            self.trace.close()
            _active["cluster"] = None
            _remove_patches()
            if getattr(self, "_gc_was_enabled", False):
                gc.enable()
            if self._scheduler_state is not None:
                _trio_private.restore_scheduling(self._scheduler_state)
                self._scheduler_state = None
        self._raise_if_failed()

    def _raise_if_failed(self) -> None:
        if isinstance(self._finished, outcome.Error) and not self._failure_reported:
            self._failure_reported = True
            raise TrayError("the simulated cluster crashed") from self._finished.error

    # ------------------------------------------------------------ processes

    async def _main(self) -> None:
        self._token = trio.lowlevel.current_trio_token()
        trio.lowlevel.spawn_system_task(self._inbox.run, name="tray-sim-host-inbox")
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            await self._start_gcs()
            for index in range(self.num_nodes):
                await self._start_process(f"node-{index}", f"n{index}/raylet", index,
                                          self._node_main)
            await self._start_process("driver", "n0/driver", 0, self._driver_main)
            self._ready = True
            self.trace.record("cluster", "ready", nodes=self.num_nodes, seed=self.seed)

    def _env(self, address: str, node_index: int | None, **hooks) -> ProcessEnv:
        node_id = self._node_ids[node_index] if node_index is not None else None
        # A restarted node draws new ids (for its workers too), not its predecessor's.
        generation = self._generation[node_index] if node_index is not None else 0
        return ProcessEnv(
            address=address, transport=self.network.transport(address),
            rng=self._rng(f"process:{address}:{generation}"), tracer=self.trace,
            config=self.config,
            node_id=node_id, gcs_address=self.gcs_address,
            object_store=self.stores[node_index] if node_index is not None else None,
            node_manager_address=f"n{node_index}/raylet" if node_index is not None else "",
            **hooks)

    async def _start_process(self, name: str, address: str, node_index: int | None, main):
        process = SimProcess(name, address, node_index)
        self.processes[address] = process
        await self._nursery.start(self._run_process, process, main)
        return process

    async def _run_process(self, process: SimProcess, main, task_status) -> None:
        _current_process.set(process)  # this task's and those it spawns
        self.trace.record("cluster", "process_start", process=process.address)
        started = False
        try:
            with trio.CancelScope() as scope:
                process.scope = scope
                if not process.alive:
                    scope.cancel()  # killed before it began to run
                async with trio.open_nursery() as nursery:
                    process.nursery = nursery
                    await main(process, nursery)
                    started = True
                    task_status.started(process)
        except* SimulatedProcessExit as group:
            exit_ = group.exceptions[0]
            process.exit_code = exit_.args[0] if exit_.args else 0
            self.trace.record("cluster", "process_exit", process=process.address,
                              code=exit_.args[0] if exit_.args else None)
        except* Exception as group:
            # An exception escaped the process: a real one would exit with a
            # traceback; this one ends alone, and the crash is kept for the
            # report (simtest fails the seed on it).
            error = group.exceptions[0]
            self.trace.record("cluster", "process_crashed", process=process.address,
                              error=type(error).__name__)
            self.crashes.append((process.address, error))
            process.exit_code = 1
            logger.error("simulated process %s crashed", process.address,
                         exc_info=(type(error), error, error.__traceback__))
        finally:
            process.alive = False
            self.network.close_all(process.address)
            if process.node_index is not None:
                self.memory[process.node_index].free(process.address)
            if self.processes.get(process.address) is process:
                del self.processes[process.address]
            if process.on_exit is not None:
                process.on_exit(process.exit_code)
        if not started:
            task_status.started(process)

    def kill_process(self, address: str) -> None:
        process = self.processes.get(address)
        if process is None or not process.alive:
            return
        self.trace.record("cluster", "process_kill", process=address)
        process.alive = False
        process.exit_code = -9
        self.network.close_all(address)
        if process.scope is not None:  # else it has not begun to run: it ends as it begins
            process.scope.cancel()

    async def _start_gcs(self) -> None:
        async def gcs_main(process: SimProcess, nursery: trio.Nursery) -> None:
            env = self._env(self.gcs_address, None, storage=self.storage)
            process.component = GcsServer(env, nursery)
            await process.component.run()
        await self._start_process("gcs", self.gcs_address, None, gcs_main)

    async def _node_main(self, process: SimProcess, nursery: trio.Nursery) -> None:
        index = process.node_index
        env = self._env(process.address, index, spawner=SimSpawner(self, index),
                        resources=self._machine_resources.get(index, self.node_resources),
                        exit_process=lambda: self._fence_node(index),
                        wait_for_gcs_s=HANG_TIMEOUT_S, read_memory=self.memory[index].snapshot)
        process.component = NodeManager(env, nursery)
        await process.component.run()

    async def _driver_main(self, process: SimProcess, nursery: trio.Nursery) -> None:
        env = self._env(process.address, 0)
        # What the driver's thread queues for its loop changes only the driver.
        worker = CoreWorker(env, DRIVER, nursery,
                            spawn_from_outside=lambda fn: self.call_soon(fn, process))
        process.component = worker
        current_worker.set(worker)
        await worker.start()
        self.driver = worker

    def start_worker(self, node_index: int, worker_id: str) -> None:
        address = f"n{node_index}/worker-{worker_id[:12]}"

        async def worker_main(process: SimProcess, nursery: trio.Nursery) -> None:
            # Its node manager learns of its end, as a real one reaps its child.
            process.on_exit = lambda code: self._worker_exited(node_index, worker_id, code)
            environ = self.worker_environs[address] = SimWorkerEnv(
                _environ_snapshot(),
                self._machine_resources.get(node_index, self.node_resources).get("GPU", 0.0))
            env = self._env(address, node_index,
                            exit_process=lambda: self.kill_process(address),
                            before_task=environ.before_task,
                            task_cost_s=self.task_costs.cost_s)
            worker = CoreWorker(env, WORKER, nursery, worker_id=worker_id)
            process.component = worker
            current_worker.set(worker)
            await trio.sleep(self.worker_start_delay_s)
            await worker.start()

        self._nursery.start_soon(self._start_process, f"worker-{worker_id[:12]}", address,
                                 node_index, worker_main)

    def _worker_exited(self, node_index: int, worker_id: str, exit_code: int) -> None:
        self.worker_environs.pop(f"n{node_index}/worker-{worker_id[:12]}", None)
        if self._stopping:
            return  # everything is ending: nobody is left to tell
        node = self.processes.get(f"n{node_index}/raylet")
        if node is not None and node.alive and node.component is not None:
            self._all_changed = True  # the node changes in the worker's task, not its own
            node.component.worker_process_exited(worker_id, exit_code)

    # ------------------------------------------------------ nodes at runtime
    # For the autoscaler's simulated provider (tray/autoscaler/providers.py).

    def add_node(self, resources: dict | None = None) -> str:
        """Start a node on a new machine and return its id (it registers
        with the GCS shortly after). ``resources`` replace the cluster's
        node resources for this machine (``memory`` is added as usual)."""
        return self._apply("add_node", lambda: self._add_node_now(resources))

    def _add_node_now(self, resources: dict | None) -> str:
        index = self.num_nodes
        self.num_nodes += 1
        node_id = NodeID.from_random(self._rng(f"node-id-{index}")).hex()
        self._node_ids.append(node_id)
        self._generation.append(0)
        self.stores.append(MemoryObjectStore(self.object_store_bytes))
        self.memory.append(SimulatedMemory(DEFAULT_MACHINE_MEMORY_BYTES))
        if resources is not None:
            self._machine_resources[index] = {
                "memory": float(DEFAULT_NODE_MEMORY_BYTES),
                **{name: float(amount) for name, amount in resources.items()}}
        self.trace.record("cluster", "add_node", node=node_id)
        self._nursery.start_soon(self._start_process, f"node-{index}", f"n{index}/raylet",
                                 index, self._node_main)
        return node_id

    def remove_node(self, node_id: str) -> None:
        """Stop a node for good (the autoscaler terminating its machine)."""
        index = self._index_of(node_id)
        if index == 0:
            raise ValueError("node 0 hosts the GCS and the driver and cannot be removed")
        self._apply("remove_node", lambda: self._kill_node_now(index, None, "autoscaler"))

    # ------------------------------------------------------------ inspection

    def digest(self) -> str:
        return self.trace.digest()


class SimRuntime:
    """What ``tray.init(backend="sim")`` hands the API layer."""

    def __init__(self, cluster: SimCluster) -> None:
        self.cluster = cluster
        self.driver = cluster.driver
        self.namespace = ""
        self.info = {"backend": "sim", "seed": cluster.seed, "num_nodes": cluster.num_nodes,
                     "node_id": cluster.node_ids()[0]}
        # The guest run's state in this thread between steps, for a call
        # from inside another trio run here (api._outside_users_trio_run).
        self.run_context = _trio_private.run_context_snapshot()
        self._thread = threading.get_ident()

    def run(self, async_fn, *args):
        if threading.get_ident() != self._thread:
            self._refuse_thread()
        return self.cluster.run(async_fn, *args)

    def run_sync(self, fn, *args):
        if threading.get_ident() != self._thread:
            self._refuse_thread()
        return fn(*args)  # the loop runs in the user's thread

    def _refuse_thread(self) -> None:
        raise TrayError(
            f"this call came from thread {threading.current_thread().name!r}, but a simulated "
            "cluster runs in the thread that started it (tray.init(backend='sim')): the "
            "simulator has no threads, so that a run depends on its seed alone and not on "
            "how the OS schedules threads. Call tray from that thread.")

    def shutdown(self) -> None:
        self.cluster.shutdown()


def start(*, address=None, num_cpus=None, num_gpus=None, resources=None, seed: int = 0,
          num_nodes: int = 1, object_store_memory: int | None = None, config=None,
          validate_every_steps: int = 0, task_cost_s: float | dict | None = None,
          include_dashboard: bool | None = None, dashboard_host: str | None = None,
          dashboard_port: int | None = None, **unknown) -> SimRuntime:
    # A simulated cluster serves no dashboard (it needs real sockets): Ray
    # programs' include_dashboard=False & co. are accepted and mean nothing.
    del include_dashboard, dashboard_host, dashboard_port
    if unknown:
        raise ValueError(f"unknown option(s) for the sim backend: {', '.join(sorted(unknown))}")
    if address is not None:
        raise ValueError("the sim backend starts its own cluster; it takes no address")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ValueError(f"seed must be an integer, got {seed!r}")
    if isinstance(num_nodes, bool) or not isinstance(num_nodes, int) or num_nodes < 1:
        raise ValueError(f"num_nodes must be a positive integer, got {num_nodes!r}")
    if isinstance(validate_every_steps, bool) or not isinstance(validate_every_steps, int) \
            or validate_every_steps < 0:
        raise ValueError(f"validate_every_steps must be a non-negative integer, got "
                         f"{validate_every_steps!r}")
    cluster = SimCluster(seed=seed, num_nodes=num_nodes,
                         num_cpus=4 if num_cpus is None else num_cpus,
                         num_gpus=num_gpus or 0, resources=resources or {}, config=config,
                         object_store_memory=object_store_memory,
                         validate_every_steps=validate_every_steps, task_cost_s=task_cost_s)
    cluster.start()
    return SimRuntime(cluster)
