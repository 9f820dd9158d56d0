"""Node providers: where the autoscaler's nodes come from.

One small interface, shaped after Ray's ``NodeProvider`` but cut to what the
policy needs:

  ``create_node(node_type) -> provider id``  start booting a node (returns at once)
  ``terminate_node(provider id)``            stop it for good (idempotent)
  ``nodes() -> [ProviderNode]``              what exists: launching, running
                                             (with its tray node id once it
                                             registered), failed (reported once)

Calls never block on a boot: a provider boots in the background and
``nodes()`` says how far it got, which is what a cloud API gives too.

Two providers ship:

* ``SimNodeProvider``: virtual machines in the simulated cluster. A boot
  takes a seeded delay in ``provider.boot_delay_s`` and fails with
  probability ``boot_failure_probability`` (seeded), so a run replays
  bit for bit. It also checks, at each termination, that the node runs
  nothing and holds no object (``violations``): the simtest invariant.
* ``LocalNodeProvider``: node processes on this machine (as Ray's fake
  multi-node provider), started the way ``tray.init(num_nodes=K)`` starts
  its extra nodes, ended with SIGTERM.

A cloud or Kubernetes provider plugs in the same way (see README,
"Autoscaling"): ``create_node`` calls the cloud's "run instance" (or creates
a pod) with the node type's ``node_config`` and a start command of
``tray start --address <head>`` plus the type's resources, and tags the
instance with the cluster name and node type; ``nodes()`` lists instances
by that tag (pending -> launching; running -> running, with the tray node
id the instance reports, e.g. as a tag its ``tray start`` writes back; a
boot error -> failed); ``terminate_node`` deletes the instance. Nothing
else in the autoscaler changes."""

from __future__ import annotations

import dataclasses
import logging
import random
import signal

import trio

from .config import AutoscalingConfig, NodeType
from .policy import FAILED, LAUNCHING, RUNNING, TERMINATED, ProviderNode

logger = logging.getLogger("tray.autoscaler")

# Provider nodes remembered (terminated ones are forgotten; this bounds the rest).
PROVIDER_NODES_MAX = 100_000


class SimNodeProvider:
    def __init__(self, cluster, config: AutoscalingConfig) -> None:
        self._cluster = cluster
        self._config = config
        self._rng = random.Random(f"{cluster.seed}:autoscaler-provider")
        self._nodes: dict[str, ProviderNode] = {}
        self._created = 0
        # Nodes terminated while they ran work or held objects (must stay empty).
        self.violations: list[str] = []
        self.terminated: list[tuple] = []  # (virtual time, provider id, node id)

    def create_node(self, node_type: NodeType) -> str:
        if len(self._nodes) >= PROVIDER_NODES_MAX:
            raise RuntimeError(f"the simulated provider holds {PROVIDER_NODES_MAX} nodes")
        self._created += 1
        provider_id = f"sim-{self._created}"
        self._nodes[provider_id] = ProviderNode(provider_id, node_type.name, LAUNCHING)
        low, high = self._config.boot_delay_s
        delay_s = self._rng.uniform(low, high)
        fails = self._rng.random() < self._config.boot_failure_probability
        self._cluster.trace.record("autoscaler", "create_node", node=provider_id,
                                   type=node_type.name, delay_s=delay_s, fails=fails)
        self._cluster.spawn(self._boot, provider_id, node_type, delay_s, fails)
        return provider_id

    async def _boot(self, provider_id: str, node_type: NodeType, delay_s: float,
                    fails: bool) -> None:
        await trio.sleep(delay_s)
        node = self._nodes.get(provider_id)
        if node is None or node.state != LAUNCHING:
            return  # terminated while booting
        if fails:
            self._nodes[provider_id] = dataclasses.replace(
                node, state=FAILED, error="the machine failed to boot (injected)")
            return
        node_id = self._cluster.add_node(node_type.resources)
        self._nodes[provider_id] = dataclasses.replace(node, state=RUNNING, node_id=node_id)

    def terminate_node(self, provider_id: str) -> None:
        node = self._nodes.pop(provider_id, None)
        if node is None:
            return
        self._cluster.trace.record("autoscaler", "terminate_node", node=provider_id)
        if node.node_id is not None and self._cluster.is_alive(node.node_id):
            self._check_empty(provider_id, node.node_id)
            self._cluster.remove_node(node.node_id)
        self.terminated.append((self._cluster.clock.current_time(), provider_id, node.node_id))
        del self.terminated[:-1000]

    def _check_empty(self, provider_id: str, node_id: str) -> None:
        index = self._cluster._index_of(node_id)
        store = self._cluster.stores[index]
        process = self._cluster.processes.get(f"n{index}/raylet")
        leases = process.component.leases.leases if process and process.component else {}
        if leases:
            self.violations.append(f"{provider_id} ({node_id[:8]}) terminated with "
                                   f"{len(leases)} lease(s)")
        if store.used_bytes():
            self.violations.append(f"{provider_id} ({node_id[:8]}) terminated holding "
                                   f"{store.used_bytes()} bytes of objects")

    def nodes(self) -> list[ProviderNode]:
        found = [node for _, node in sorted(self._nodes.items()) if node.state != TERMINATED]
        for node in found:
            if node.state == FAILED:
                del self._nodes[node.provider_id]  # reported once
        return found


class LocalNodeProvider:
    """Node processes on this machine, joined to the driver's local cluster."""

    # Node indexes from here on (tray.init's own nodes count up from 0).
    FIRST_INDEX = 100

    def __init__(self, session, gcs_address: str, config: AutoscalingConfig,
                 node_ip: str | None = None) -> None:
        # node_ip: nodes listen on TCP at this IP (a cluster of tray start);
        # None: on Unix sockets in the session (a cluster of tray.init).
        self._node_ip = node_ip
        self._session = session
        self._gcs_address = gcs_address
        self._config = config
        self._nodes: dict[str, ProviderNode] = {}
        self._processes: dict[str, object] = {}
        self._indexes: dict[str, int] = {}
        self._next_index = self.FIRST_INDEX

    def create_node(self, node_type: NodeType) -> str:
        from ..backends.local import _start_node

        index = self._next_index
        self._next_index += 1
        provider_id = f"local-{index}"
        resources = dict(node_type.resources)
        cpus = resources.pop("CPU", 0.0)
        gpus = resources.pop("GPU", 0.0)
        memory_bytes = int(resources.pop("memory", 1024**3))
        store_bytes = int(node_type.node_config.get("object_store_memory", 64 * 1024**2))
        if self._node_ip is None:
            process = _start_node(self._session, index, self._gcs_address, cpus=cpus,
                                  gpus=gpus, resources=resources, memory_bytes=memory_bytes,
                                  store_bytes=store_bytes)
        else:
            process = self._start_tcp_node(index, cpus, gpus, resources, memory_bytes,
                                           store_bytes)
        self._processes[provider_id] = process
        self._indexes[provider_id] = index
        self._nodes[provider_id] = ProviderNode(provider_id, node_type.name, LAUNCHING)
        return provider_id

    def _start_tcp_node(self, index: int, cpus: float, gpus: float, resources: dict,
                        memory_bytes: int, store_bytes: int):
        """As ``tray start --address`` starts a node (TCP on ``node_ip``),
        exiting with this process."""
        import json
        import os
        import subprocess
        import sys

        from ..backends.local.session import free_port

        command = [sys.executable, "-P", "-m", "tray.backends.local.node",
                   "--session", self._session.directory, "--node-index", str(index),
                   "--gcs", self._gcs_address,
                   "--node-address", f"tcp:{self._node_ip}:{free_port(self._node_ip)}",
                   "--listen-ip", self._node_ip, "--num-cpus", str(cpus),
                   "--num-gpus", str(gpus), "--resources", json.dumps(resources),
                   "--memory-bytes", str(memory_bytes),
                   "--object-store-bytes", str(store_bytes), "--prestart", str(int(cpus)),
                   "--exit-with-driver", str(os.getpid())]
        return subprocess.Popen(command, stdin=subprocess.DEVNULL, start_new_session=True)

    def terminate_node(self, provider_id: str) -> None:
        import os

        self._nodes.pop(provider_id, None)
        process = self._processes.pop(provider_id, None)
        self._indexes.pop(provider_id, None)
        if process is not None and process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(5.0)
            except Exception:  # noqa: BLE001 - subprocess.TimeoutExpired: kill it
                pass
            try:
                os.killpg(process.pid, signal.SIGKILL)  # its workers too
            except (ProcessLookupError, PermissionError):
                pass

    def nodes(self) -> list[ProviderNode]:
        found = []
        for provider_id, node in sorted(self._nodes.items()):
            process = self._processes[provider_id]
            if node.state == LAUNCHING:
                info = self._session.read_info(self._indexes[provider_id])
                if info is not None:
                    node = dataclasses.replace(node, state=RUNNING, node_id=info["node_id"])
                elif process.poll() is not None:
                    node = dataclasses.replace(
                        node, state=FAILED,
                        error=f"the node process exited with code {process.returncode}")
                self._nodes[provider_id] = node
            found.append(node)
            if node.state == FAILED:
                del self._nodes[provider_id]
                self._processes.pop(provider_id, None)
        return found

    def terminate_all(self) -> None:
        for provider_id in sorted(self._nodes):
            self.terminate_node(provider_id)
