"""A simulated cluster (see the package docstring): ``SimCluster`` puts
together its parts, each in a module of its own:

* engine.py: the host loop, stepping the guest trio run on virtual time;
* processes.py: the GCS, node managers, workers and driver as processes;
* faults.py: the fault API (kill, restart, partition, ...);
* memory.py: each simulated machine's memory;
* validation.py: checking the components' invariants between steps;
* patches.py: ``time``/``os``/``trio.sleep`` in simulated user code.

``start`` is the backend's entry point (``tray.init(backend="sim")``)."""

from __future__ import annotations

import collections
import random
import threading

import outcome
import trio

from ... import _trio_private
from ...core import config as config_module
from ...core.ids import NodeID
from ...core.trace import Trace
from ...core.worker.core_worker import CoreWorker
from ...exceptions import TrayError
from ...runtime_env.worker_environ import SimWorkerEnv
from ...transports.sim import SimNetwork
from ..environ import with_task_events_setting
from .engine import GuestRunEngine, VirtualClock, _HostInbox, _Timers
from .faults import FaultAPI
from .memory import DEFAULT_MACHINE_MEMORY_BYTES, MemoryAPI, SimulatedMemory
from .processes import (
    DEFAULT_NODE_MEMORY_BYTES,
    DEFAULT_OBJECT_STORE_BYTES,
    ProcessAssembly,
    SimProcess,
)
from .stores import MemoryObjectStore, MemoryStorage
from .task_cost import TaskCostModel
from .validation import InvariantChecks, SimulationInvariantError


class SimCluster(GuestRunEngine, ProcessAssembly, FaultAPI, MemoryAPI, InvariantChecks):
    """A whole cluster in this process, on virtual time. Its methods come
    from its parts (see the module docstring); this class holds the state
    they share, built here in a fixed order (the seed's RNG draws)."""

    def __init__(self, *, seed: int, num_nodes: int, num_cpus: float, num_gpus: float,
                 resources: dict, config=None, object_store_memory: int | None = None,
                 worker_start_delay_s: float = 0.005, validate_every_steps: int = 0,
                 task_cost_s: float | dict | None = None) -> None:
        if num_nodes < 1:
            raise ValueError(f"num_nodes must be at least 1, got {num_nodes}")
        self.seed = seed
        self.num_nodes = num_nodes
        self.task_costs = TaskCostModel(seed, task_cost_s)
        self.config = with_task_events_setting(config or config_module.DEFAULT_CONFIG)
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
        # from inside another trio run here (api/blocking._outside_users_trio_run).
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
          dashboard_port: int | None = None, _driver_thread_path: bool = False,
          **unknown) -> SimRuntime:
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
    cluster.driver_thread_path = bool(_driver_thread_path)  # (processes.SimThreadCondition)
    cluster.start()
    return SimRuntime(cluster)


