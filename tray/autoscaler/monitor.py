"""The monitor: the loop that carries the policy's decisions out.

Every ``autoscaler_period_s`` it reads the cluster's load from the GCS
(``get_cluster_load``, one call), asks the nodes that look idle how many
bytes their object store holds (a node holding objects is not idle: they
may be the only copy an owner needs), lets ``Autoscaler.update`` decide, and
acts: launches through the provider; terminates only a node that agreed to
drain (its lease manager refuses when anything runs, waits or is reserved
there: the report the decision used may be a period old), then tells the
GCS the node is gone so that nobody waits a heartbeat timeout for it.

The monitor runs on the driver's event loop (in the simulator, inside the
simulation, on virtual time), as Ray's monitor runs beside the head. A
round that fails (the GCS restarting, a node gone mid-call) is logged and
the next round starts from a fresh reading; the policy's state carries
over. The status (``AutoscalerStatus``) is written to the GCS's key-value
store under ``STATUS_KEY`` when it changes, where ``tray status`` reads it."""

from __future__ import annotations

import dataclasses
import json
import logging

import trio

from .policy import Autoscaler, Decision

logger = logging.getLogger("tray.autoscaler")

STATUS_KEY = "__autoscaler_status"
# A node's answer to get_node_stats / drain must come within this.
NODE_CALL_TIMEOUT_S = 5.0


def status_to_json(status, config=None) -> bytes:
    record = dataclasses.asdict(status)
    record["pending_demand"] = [[shape, count] for shape, count in status.pending_demand]
    if config is not None:  # (what a node it may launch could hold: Train asks)
        record["node_types"] = {node_type.name: dict(node_type.resources)
                                for node_type in config.worker_types()}
    return json.dumps(record, sort_keys=True).encode()


class Monitor:
    def __init__(self, config, provider, worker) -> None:
        self.config = config
        self.provider = provider
        self.autoscaler = Autoscaler(config)
        self._worker = worker  # the driver's core worker: its GCS client and endpoint
        self._stopped = False
        self._published = b""
        self.rounds = 0
        self.failed_rounds = 0
        self.drain_refusals = 0
        # The last round's reading: (ClusterLoad, node id -> bytes in its store).
        self.last_load = None

    @property
    def status(self):
        return self.autoscaler.status

    @property
    def decisions(self) -> list[Decision]:
        return list(self.autoscaler.decisions)

    def stop(self) -> None:
        self._stopped = True

    async def _node_call(self, address: str, method: str, *args):
        with trio.fail_after(NODE_CALL_TIMEOUT_S):
            return await self._worker.endpoint.call(address, method, *args)

    async def run(self) -> None:
        while not self._stopped:
            try:
                await self.run_once()
            except trio.Cancelled:
                raise
            except Exception as error:  # noqa: BLE001 - a round fails, the next one reads afresh
                self.failed_rounds += 1
                logger.warning("an autoscaler round failed: %r", error)
            await trio.sleep(self.config.autoscaler_period_s)

    async def run_once(self) -> list[Decision]:
        now = trio.current_time()
        load = await self._worker.gcs_call("get_cluster_load")
        objects_held: dict = {}
        for node in load.nodes:
            if node.leases == 0 and node.bundles == 0:
                try:
                    stats = await self._node_call(node.address, "get_node_stats")
                except Exception:  # noqa: BLE001 - unreachable: not idle as far as we know
                    objects_held[node.node_id] = -1
                    continue
                objects_held[node.node_id] = stats.store_used_bytes
        self.last_load = (load, objects_held)
        decisions = self.autoscaler.update(load, self.provider.nodes(), now, objects_held)
        addresses = {node.node_id: node.address for node in load.nodes}
        provider_nodes = {node.provider_id: node for node in self.provider.nodes()}
        for decision in decisions:
            if decision.action == "launch":
                for _ in range(decision.count):
                    self.provider.create_node(self.config.node_types[decision.node_type])
                logger.info("autoscaler: launching %d %s node(s) (%s)", decision.count,
                            decision.node_type, decision.reason)
            elif decision.action == "node_lost":
                self.provider.terminate_node(decision.provider_id)
            elif decision.action == "terminate":
                node = provider_nodes.get(decision.provider_id)
                if node is None:
                    continue
                address = addresses.get(node.node_id)
                try:
                    agreed = address is not None and \
                        await self._node_call(address, "drain")
                except Exception:  # noqa: BLE001 - gone or slow: try next round
                    agreed = False
                if not agreed:
                    self.drain_refusals += 1
                    continue
                self.provider.terminate_node(decision.provider_id)
                await self._worker.gcs_call("node_removed", node.node_id,
                                            f"removed by the autoscaler: {decision.reason}")
                logger.info("autoscaler: terminated %s (%s)", decision.provider_id,
                            decision.reason)
        self.rounds += 1
        if self.status is not None:
            payload = status_to_json(self.status, self.config)
            if payload != self._published:
                await self._worker.gcs_call("kv_put", STATUS_KEY, payload, True)
                self._published = payload
        return decisions
