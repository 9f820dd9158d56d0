"""The simulated cluster's processes: the GCS, a node manager per machine,
the workers each node manager asks for and the driver's core worker, each
a trio task tree in the one run with its own ``ProcessEnv`` (address,
transport, RNG, the machine's object store); how a process ends (exits,
crashes, is killed); and machines added and removed at runtime."""

from __future__ import annotations

import logging

import trio

from ...core.context import current_worker
from ...core.gcs.gcs_server import GcsServer
from ...core.ids import NodeID
from ...core.interfaces import ProcessEnv
from ...core.node.node_manager import NodeManager
from ...core.worker.core_worker import DRIVER, WORKER, CoreWorker
from ...core.worker.thread_inbox import SingleThread
from ...runtime_env.worker_environ import SimWorkerEnv
from ..asyncio_loops import TRIO_ASYNCIO
from . import engine
from .memory import DEFAULT_MACHINE_MEMORY_BYTES, SimulatedMemory
from .patches import SimulatedProcessExit, _environ_snapshot
from .stores import MemoryObjectStore
from .validation import _current_process

logger = logging.getLogger("tray.sim")

DEFAULT_OBJECT_STORE_BYTES = 2 * 1024**3
# Every simulated node has this much schedulable "memory", as Ray gives each
# node a memory resource by default.
DEFAULT_NODE_MEMORY_BYTES = 8 * 1024**3


class SimProcess:
    """One simulated process: its task tree (cancel scope, nursery), its
    component (a GcsServer, NodeManager or CoreWorker) and how it ended."""

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


class SimThreadCondition(SingleThread):
    """The driver's thread condition on the driver-thread path
    (``ProcessAssembly.driver_thread_path``): the driver's core worker runs
    as the local backend's does, its loop "in another thread"
    (``loop_in_other_thread``), so the user's code takes the real driver's
    way in: submissions, small puts and ref counts queued through the
    inbox (core/worker/thread_inbox), ``get``/``wait`` of owned objects
    answered in the caller's thread (core/worker/thread_waits). There is
    still one thread: the lock excludes nobody (SingleThread's, so the
    inbox keeps its exact one-thread invariants), ``notify_all`` has no one
    to wake, and ``wait_for`` steps the simulated run until the predicate
    holds or its timeout passes in virtual time (``wait_in_thread``) --
    the loop's work a real waiting thread would have let run."""

    def __init__(self, cluster) -> None:
        self._cluster = cluster

    def wait_for(self, predicate, timeout: float | None = None) -> bool:
        if predicate():
            return True
        if current_worker.get(None) is not None:
            return False  # (on the loop: nothing runs while it waits)
        return self._cluster.wait_in_thread(predicate, timeout)


class SimSpawner:
    """How a simulated node manager starts and kills its workers (a real
    one forks them), through its ``cluster`` (the SimCluster)."""

    def __init__(self, cluster, node_index: int) -> None:
        self.cluster = cluster
        self.node_index = node_index

    def start_worker(self, worker_id_hex: str, env: dict) -> None:
        self.cluster.start_worker(self.node_index, worker_id_hex)

    def kill_worker(self, worker_id_hex: str) -> None:
        self.cluster.kill_process(f"n{self.node_index}/worker-{worker_id_hex[:12]}")


class ProcessAssembly:
    """``SimCluster``'s processes (a part of its class, see cluster.py):
    starting each one in the run's nursery, ending it, and the machines
    the autoscaler adds and removes. Each process is a ``SimProcess`` in
    ``self.processes``, by address."""

    # The driver's core worker takes the real driver's thread path
    # (SimThreadCondition); tray.init(backend="sim", _driver_thread_path=True).
    driver_thread_path = False

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

    def _env(self, address: str, node_index: int | None, generation: int = 0,
             **hooks) -> ProcessEnv:
        node_id = self._node_ids[node_index] if node_index is not None else None
        # A restarted node draws new ids (for its workers too), not its predecessor's;
        # a restarted GCS (``generation``: its restarts) a new rpc session, as a real
        # process does: with its predecessor's, its reliable messages were taken for
        # copies of those already handled, and dropped (a node_died notice, lost:
        # restarts chaos seed 8).
        if node_index is not None:
            generation = self._generation[node_index]
        return ProcessEnv(
            address=address, transport=self.network.transport(address),
            rng=self._rng(f"process:{address}:{generation}"), tracer=self.trace,
            config=self.config,
            node_id=node_id, gcs_address=self.gcs_address,
            object_store=self.stores[node_index] if node_index is not None else None,
            node_manager_address=f"n{node_index}/raylet" if node_index is not None else "",
            asyncio_loops=TRIO_ASYNCIO, **hooks)

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
        starts = self._gcs_starts = getattr(self, "_gcs_starts", -1) + 1

        async def gcs_main(process: SimProcess, nursery: trio.Nursery) -> None:
            env = self._env(self.gcs_address, None, starts, storage=self.storage)
            process.component = GcsServer(env, nursery)
            await process.component.run()
        await self._start_process("gcs", self.gcs_address, None, gcs_main)

    async def _node_main(self, process: SimProcess, nursery: trio.Nursery) -> None:
        index = process.node_index
        env = self._env(process.address, index, spawner=SimSpawner(self, index),
                        resources=self._machine_resources.get(index, self.node_resources),
                        exit_process=lambda: self._fence_node(index),
                        wait_for_gcs_s=engine.HANG_TIMEOUT_S,
                        read_memory=self.memory[index].snapshot)
        process.component = NodeManager(env, nursery)
        await process.component.run()

    async def _driver_main(self, process: SimProcess, nursery: trio.Nursery) -> None:
        thread_path = self.driver_thread_path
        env = self._env(process.address, 0, thread_condition=(
            (lambda: SimThreadCondition(self)) if thread_path else None))
        # What the driver's thread queues for its loop changes only the driver.
        worker = CoreWorker(env, DRIVER, nursery,
                            spawn_from_outside=lambda fn: self.call_soon(fn, process),
                            loop_in_other_thread=thread_path)
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
