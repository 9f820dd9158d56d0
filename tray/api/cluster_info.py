"""What the cluster has: ``nodes``, ``cluster_resources``,
``available_resources``, and ``get_gpu_ids`` of the running task."""

from __future__ import annotations

from ..core.context import current_task, get_worker
from .blocking import block, gcs_call
from .session import ensure_worker

# ================================================================= cluster

def nodes() -> list[dict]:
    """Every node the cluster has known, alive or dead, as in ``ray.nodes()``:
    its resources include ``object_store_memory`` (the store's capacity in
    bytes), as Ray's do."""
    return [{"NodeID": node.node_id, "Alive": node.alive, "alive": node.alive,
             "NodeManagerAddress": node.address,
             "Resources": {**node.resources,
                           "object_store_memory": float(node.object_store_bytes)}}
            for node in gcs_call("get_all_nodes")]


def cluster_resources() -> dict:
    total: dict[str, float] = {}
    for node in nodes():
        if node["Alive"]:
            for name, amount in node["Resources"].items():
                total[name] = total.get(name, 0.0) + amount
    return total


def available_resources() -> dict:
    """Free resources summed over live nodes, asked of each node directly."""
    worker = get_worker()
    alive = [node for node in nodes() if node["Alive"]]

    async def gather():
        stats = []
        for node in alive:
            stats.append(await worker.endpoint.call(node["NodeManagerAddress"],
                                                    "get_node_stats"))
        return stats

    total: dict[str, float] = {}
    for node, stats in zip(alive, block(worker, gather), strict=True):
        free_store = node["Resources"]["object_store_memory"] - stats.store_used_bytes
        total["object_store_memory"] = total.get("object_store_memory", 0.0) + free_store
        for name, amount in stats.available.items():
            if amount > 0:
                total[name] = total.get(name, 0.0) + amount
    return total


def get_gpu_ids() -> list[int]:
    """The GPU device ids reserved for the running task or actor."""
    worker = ensure_worker()
    context = current_task.get(None)
    if context is None:
        return list(worker.actor_gpu_ids)
    return list(context.gpu_ids)

