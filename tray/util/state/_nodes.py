"""Nodes (``list_nodes``, ``get_node``: the GCS's node table, and each live
node's available resources when ``detail=True``) and the worker processes
on them (``list_workers``: each live node's manager, and the GCS's
drivers).
"""

from __future__ import annotations

from ...core.messages import NodeStats
from ._client import Client
from ._query import check_query, finish
from ._records import NodeState, WorkerState


def node_table(client: Client) -> list:
    return client.gcs_call("get_all_nodes")


def node_ip(node) -> str:
    if node.ip and node.ip != "local":
        return node.ip
    address = node.address
    if address.startswith("tcp:"):
        return address[4:].rpartition(":")[0]
    return "127.0.0.1"


def list_nodes(address: str | None = None, filters: list | None = None,
               limit: int | None = None, timeout: float | None = None,
               detail: bool = False, raise_on_missing_output: bool = True) -> list[NodeState]:
    """Every node the cluster has known (alive and dead), the first
    registered marked as the head."""
    checked = check_query(NodeState, filters, limit)
    client = Client(address, timeout)
    nodes = node_table(client)
    stats = client._run([(node.address, "get_node_stats") for node in nodes if node.alive]) \
        if detail else []
    available = {}
    for node, stat in zip([n for n in nodes if n.alive], stats, strict=False):
        if isinstance(stat, NodeStats):
            available[node.node_id] = stat.available
    records = [NodeState(
        node_id=node.node_id, node_ip=node_ip(node), is_head_node=index == 0,
        state="ALIVE" if node.alive else "DEAD", node_name=node.hostname or node_ip(node),
        resources_total={**node.resources,
                         "object_store_memory": float(node.object_store_bytes)},
        resources_available=available.get(node.node_id), address=node.address,
        object_store_total_bytes=node.object_store_bytes,
        session_dir=node.session_dir or None) for index, node in enumerate(nodes)]
    return finish(NodeState, records, checked, limit, detail, "nodes")


def get_node(id: str, address: str | None = None, timeout: float | None = None
             ) -> NodeState | None:
    found = list_nodes(address, filters=[("node_id", "=", id)], detail=True, limit=1,
                       timeout=timeout)
    return found[0] if found else None


# ================================================================ workers


def list_workers(address: str | None = None, filters: list | None = None,
                 limit: int | None = None, timeout: float | None = None,
                 detail: bool = False, raise_on_missing_output: bool = True
                 ) -> list[WorkerState]:
    """Every worker process each live node knows (and every driver), with
    its pid where a task it ran said so."""
    checked = check_query(WorkerState, filters, limit)
    client = Client(address, timeout)
    nodes = [node for node in node_table(client) if node.alive]
    lists = client._run([(node.address, "list_workers") for node in nodes])
    try:
        pids = client.gcs_call("worker_pids")
    except Exception:  # noqa: BLE001 - pids are a nicety
        pids = {}
    records = []
    for node, workers in zip(nodes, lists, strict=True):
        if isinstance(workers, Exception):
            continue
        for worker in workers:
            alive = worker.state != "dead"
            records.append(WorkerState(
                worker_id=worker.worker_id, is_alive=alive, worker_type="WORKER",
                exit_type=None if alive else "SYSTEM_ERROR", node_id=node.node_id,
                ip=node_ip(node), pid=pids.get(worker.worker_id), state=worker.state,
                address=worker.address))
    for _job, driver, ended in client.gcs_call("list_driver_jobs"):
        records.append(WorkerState(worker_id=driver, is_alive=not ended, worker_type="DRIVER",
                                   exit_type="INTENDED_USER_EXIT" if ended else None,
                                   node_id=None, ip=None, pid=None, address=driver))
    return finish(WorkerState, records, checked, limit, detail, "workers")
