"""The fault API of a simulated cluster (``tray.simtest.cluster()``): the
questions a fault injector asks (which nodes, which workers, where an actor
lives) and the faults it injects: killing workers and nodes, restarting
nodes and the GCS, network partitions, stalls and slowdowns, and tasks of
its own inside the simulation (``at``, ``spawn``).

Callable from the driver's code (between tray calls) and from inside the
simulation (``at``/``spawn`` callbacks). Every fault is recorded in the
trace, so a run with faults replays from its seed."""

from __future__ import annotations

import outcome
import trio

from ...core.ids import NodeID
from ...core.messages import ActorStatus
from ...core.node.worker_pool import WorkerState
from ...exceptions import TrayError
from .patches import _in_trio
from .stores import MemoryObjectStore

# How long ``replay_after_reset(None, ...)`` waits for a reliable message
# to pick the process it hits (virtual seconds).
REPLAY_ARMED_S = 2.0


class FaultAPI:
    """``SimCluster``'s fault API (a part of its class, see cluster.py). A
    fault runs inside the trio run (``_apply``); it changes the processes
    (``kill_process``, ``_start_process``), the network and the stores."""

    def node_ids(self) -> list[str]:
        """The current node id of each machine; index 0 is the head (it
        hosts the GCS and the driver). A restarted node has a new id."""
        return list(self._node_ids)

    def is_alive(self, node_id: str) -> bool:
        """Whether this node id is its machine's current node and runs. An
        id no machine holds now (a crashed node, replaced on its machine) is
        not alive, whether or not the GCS knows it: a node added while the
        GCS was down and crashed before it registered is known to nobody
        (the autoscaler workload's node crash asked about one, and raised
        "unknown node": autoscaler chaos seeds 37 and 49)."""
        if node_id not in self._node_ids:
            return False
        index = self._node_ids.index(node_id)
        process = self.processes.get(f"n{index}/raylet")
        return self._node_ids[index] == node_id and process is not None and process.alive

    def workers(self, node_id: str | None = None) -> list[str]:
        """Ids of the registered, live workers (of one node, or all)."""
        indexes = range(self.num_nodes) if node_id is None else [self._index_of(node_id)]
        found = []
        for index in indexes:
            process = self.processes.get(f"n{index}/raylet")
            if process is None or process.component is None or not process.alive:
                continue
            found += [w.worker_id for w in process.component.pool.workers.values()
                      if w.state in (WorkerState.IDLE, WorkerState.LEASED, WorkerState.ACTOR)]
        return sorted(found)

    def worker_of(self, actor) -> str | None:
        """The id of the worker hosting ``actor`` (a handle), or None while
        it is not alive."""
        gcs = self.processes.get(self.gcs_address)
        if gcs is None or gcs.component is None:
            raise TrayError("the GCS is down; worker_of() needs it")
        record = gcs.component.actor_manager.actors.get(actor._actor_id)
        return None if record is None or record.state != ActorStatus.ALIVE else record.worker_id

    def kill_worker(self, worker_id: str) -> None:
        """Kill a worker process, as SIGKILL would."""
        if not isinstance(worker_id, str) or not worker_id:
            raise ValueError(f"kill_worker needs a worker id, got {worker_id!r} (worker_of "
                             "gives None for an actor that is not alive)")
        for index in range(self.num_nodes):
            address = f"n{index}/worker-{worker_id[:12]}"
            if address in self.processes:
                self._apply("kill_worker",
                            lambda address=address: self._kill_worker_now(address, worker_id))
                return
        raise ValueError(f"no live worker {worker_id}")

    def kill_actor_worker(self, actor) -> bool:
        """Kill the worker hosting ``actor`` (a handle), as SIGKILL would;
        False when there is none to kill: the actor is not alive by the GCS,
        or its process is gone already (the GCS has not heard yet). Raises
        TrayError while the GCS is down (as ``worker_of``)."""
        worker = self.worker_of(actor)
        if worker is None:
            return False
        try:
            self.kill_worker(worker)
        except ValueError:
            return False
        return True

    def _kill_worker_now(self, address: str, worker_id: str) -> None:
        self.trace.record("fault", "kill_worker", worker=worker_id)
        self.kill_process(address)

    def kill_node(self, node_id: str, restart_after_s: float | None = None) -> None:
        """Crash a node: its node manager and workers die at once and its
        object store is lost. With ``restart_after_s`` a new node (with a
        new id) starts on the same machine that much virtual time later."""
        index = self._index_of(node_id)
        if index == 0:
            raise ValueError("node 0 hosts the GCS and the driver and cannot be killed; "
                             "use restart_gcs() for GCS faults")
        if restart_after_s is not None and restart_after_s < 0:
            raise ValueError(f"restart_after_s must be >= 0, got {restart_after_s}")
        self._apply("kill_node", lambda: self._kill_node_now(index, restart_after_s, "fault"))

    def _kill_node_now(self, index: int, restart_after_s: float | None, why: str) -> None:
        self.trace.record(why, "kill_node", node=self._node_ids[index],
                          restart_after_s=restart_after_s)
        for address, process in sorted(self.processes.items()):
            if process.node_index == index and address.startswith(f"n{index}/") and \
                    address not in (self.gcs_address, "n0/driver"):
                self.kill_process(address)
        self.stores[index] = MemoryObjectStore(self.object_store_bytes)
        if restart_after_s is not None:
            self._nursery.start_soon(self._restart_later, index, restart_after_s)

    def _fence_node(self, index: int) -> None:
        """The GCS declared this node dead while it lived (a partition): it
        ends itself, as a raylet does."""
        self._kill_node_now(index, None, "node_fenced")

    async def _restart_later(self, index: int, delay_s: float) -> None:
        await trio.sleep(delay_s)
        self._restart_node_now(index)

    def restart_node(self, node_id: str) -> str:
        """Start a fresh node on the machine of dead node ``node_id``;
        returns the new node's id."""
        index = self._index_of(node_id)
        if self.is_alive(self._node_ids[index]):
            raise ValueError(f"node {node_id} is alive")
        return self._apply("restart_node", lambda: self._restart_node_now(index))

    def _restart_node_now(self, index: int) -> str:
        if f"n{index}/raylet" in self.processes:
            return self._node_ids[index]  # restarted already
        self._generation[index] += 1
        node_id = NodeID.from_random(
            self._rng(f"node-id-{index}-{self._generation[index]}")).hex()
        self._node_ids[index] = node_id
        self.stores[index] = MemoryObjectStore(self.object_store_bytes)
        self.trace.record("fault", "restart_node", node=node_id)
        self._nursery.start_soon(self._start_process, f"node-{index}", f"n{index}/raylet",
                                 index, self._node_main)
        return node_id

    def restart_gcs(self, down_for_s: float = 0.0) -> None:
        """Crash the GCS and start it again after ``down_for_s`` on the same
        storage (which models Redis, so its tables survive)."""
        self._apply("restart_gcs", lambda: self._restart_gcs_now(down_for_s))

    def _restart_gcs_now(self, down_for_s: float) -> None:
        self.trace.record("fault", "restart_gcs", down_for_s=down_for_s)
        if self._gcs_down:
            return  # down already: it comes back when the first restart says
        self._gcs_down = True
        self.kill_process(self.gcs_address)

        async def start_again() -> None:
            await trio.sleep(down_for_s)
            while self.gcs_address in self.processes:  # the old one is still ending
                await trio.sleep(0)
            self._gcs_down = False
            await self._start_gcs()
        self._nursery.start_soon(start_again)

    def partition(self, group_a: list[str], group_b: list[str], one_way: bool = False) -> None:
        """Messages between the nodes of ``group_a`` and ``group_b`` stop
        (only from a to b with ``one_way``) until ``heal()``; streams stay
        open and deliver in order afterwards, as TCP does."""
        a, b = self._machines(group_a), self._machines(group_b)
        if set(a) & set(b):
            raise ValueError("a node cannot be on both sides of a partition")
        self._apply("partition", lambda: self._fault("partition", self.network.partition,
                                                     a, b, one_way))

    def heal(self) -> None:
        """End every partition, stall and slowdown."""
        self._apply("heal", lambda: self._fault("heal", self.network.heal))

    def stall(self, node_id: str, seconds: float) -> None:
        """Every stream to and from the node delivers nothing for ``seconds``."""
        machine = self._machines([node_id])[0]
        self._apply("stall", lambda: self._fault("stall", self.network.stall, machine,
                                                 float(seconds)))

    def slow_node(self, node_id: str, factor: float) -> None:
        """Multiply the latency of the node's streams by ``factor`` (1 undoes it)."""
        if factor <= 0:
            raise ValueError(f"factor must be positive, got {factor}")
        machine = self._machines([node_id])[0]
        self._apply("slow_node", lambda: self._fault("slow_node", self.network.set_slow,
                                                     machine, float(factor)))

    def reset_connections(self, node_id: str) -> None:
        """Break every connection of the node's processes (both ends see the
        stream closed); later messages open new connections."""
        machine = self._machines([node_id])[0]
        self._apply("reset_connections",
                    lambda: self._fault("reset_connections", self.network.reset, machine))

    def replay_after_reset(self, address: str | None, seconds: float,
                           on_start=None, skip: int = 0) -> None:
        """Duplicate deliveries, as real networks make them: for ``seconds``
        every message the process at ``address`` sends (to local peers too)
        is held back, then every connection of the process breaks and what
        was held is lost. The process handled the reliable messages that
        reached it, but their acknowledgements were lost on the way back,
        so the senders send every one of them again on the next
        connection: it must handle each once (rpc's duplicate filter). Its
        replies are lost too (the callers see their connection break, as in
        a reset). Nothing is duplicated that a real stream would not.

        ``address`` None: the process that the next reliable message
        reaches, after ``skip`` others (its acknowledgement is then the
        first one lost), within ``REPLAY_ARMED_S``; ``on_start(address)`` is
        called when it starts."""
        if seconds < 0:
            raise ValueError(f"seconds must be >= 0, got {seconds}")
        if address is not None and address not in self.processes:
            raise ValueError(f"no live process at {address!r}")

        async def reset_later(target: str) -> None:
            await trio.sleep(seconds)
            self.network.end_lag(target)
            self.trace.record("fault", "reset_process", process=target)
            self.network.reset_process(target)

        def start(target: str) -> None:
            if target not in self.processes or self._nursery is None:
                return
            self._fault("replay_after_reset", self.network.lag, target, float(seconds))
            self._nursery.start_soon(reset_later, target)
            if on_start is not None:
                on_start(target)

        async def disarm_later(armed) -> None:
            await trio.sleep(REPLAY_ARMED_S)
            if self.network.armed_on_reliable is armed:
                self.network.armed_on_reliable = None

        def now() -> None:
            if address is not None:
                start(address)
                return
            left = [skip]

            def armed(target: str) -> None:
                if left[0] <= 0:
                    start(target)
                    return
                left[0] -= 1
                self.network.armed_on_reliable = armed
            self.network.armed_on_reliable = armed
            self._nursery.start_soon(disarm_later, armed)
        self._apply("replay_after_reset", now)

    def advance(self, seconds: float) -> None:
        """Run the simulation forward ``seconds`` of virtual time (from the
        driver's code)."""
        if _in_trio():
            raise TrayError("advance() is for the driver's code; inside the simulation "
                            "use trio.sleep()")
        self.run(trio.sleep, seconds)

    def at(self, delay_s: float, fn) -> None:
        """Call ``fn()`` inside the simulation ``delay_s`` of virtual time from now."""
        async def later() -> None:
            await trio.sleep(delay_s)
            fn()
        self.spawn(later)

    def spawn(self, async_fn, *args) -> None:
        """Run ``async_fn(*args)`` as a task inside the simulation (outside any
        simulated process): a chaos monkey, for example. An exception from
        it crashes the simulated cluster."""
        self._apply("spawn", lambda: self._nursery.start_soon(async_fn, *args))

    def _fault(self, name: str, action, *args) -> None:
        self.trace.record("fault", name, args=repr(args))
        action(*args)

    def _apply(self, what: str, fn):
        """Run ``fn`` inside the trio run: at once from simulation code, else
        through the host loop."""
        if self._finished is not None or self._nursery is None:
            raise TrayError("the simulated cluster is not running")
        if _in_trio():
            return fn()
        box: list = []
        self.call_soon(lambda: box.append(outcome.capture(fn)))
        self._pump(lambda: bool(box), what)
        return box[0].unwrap()

    def _index_of(self, node_id: str) -> int:
        for index, current in enumerate(self._node_ids):
            if current == node_id:
                return index
        gcs = self.processes.get(self.gcs_address)
        address = None if gcs is None or gcs.component is None else \
            gcs.component.node_table.address_of(node_id)
        if address is not None:
            return int(address.split("/", 1)[0][1:])
        raise ValueError(f"unknown node {node_id!r}")

    def _machines(self, node_ids: list[str]) -> list[str]:
        return [f"n{self._index_of(node_id)}" for node_id in node_ids]
