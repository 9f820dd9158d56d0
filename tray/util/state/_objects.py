"""Object references (``list_objects``) and ``memory_summary`` (what ``tray
memory`` prints): every worker and driver is asked for the references it
holds; each node for its object store's use and what it spilled.
"""

from __future__ import annotations

import os
import warnings
from collections import Counter

from ...core.messages import NodeStats, ObjectReport
from ._client import Client
from ._nodes import node_ip, node_table
from ._query import check_query, finish
from ._records import ObjectState


def _process_addresses(client: Client) -> list[tuple[str, str]]:
    """(node id, address) of every worker and driver to ask for objects."""
    nodes = [node for node in node_table(client) if node.alive]
    lists = client._run([(node.address, "list_workers") for node in nodes])
    addresses = []
    for node, workers in zip(nodes, lists, strict=True):
        if isinstance(workers, Exception):
            continue
        for worker in workers:
            if worker.address and worker.state != "dead":
                addresses.append((node.node_id, worker.address))
    for _job, driver, ended in client.gcs_call("list_driver_jobs"):
        if not ended:
            addresses.append(("", driver))
    if client.worker is not None and all(a != client.worker.address for _, a in addresses):
        addresses.append((client.worker.node_id, client.worker.address))
    return addresses


def _object_reports(client: Client) -> list[ObjectReport]:
    targets = _process_addresses(client)
    reports = client._run([(address, "object_report") for _, address in targets])
    # (A driver that is gone is no news: the job table keeps every driver.)
    missing = [address for (node_id, address), report in zip(targets, reports, strict=True)
               if not isinstance(report, ObjectReport) and node_id]
    if missing:
        # A worker that exited between the listing and the question, or one
        # that did not answer: its references are missing (Ray's "partial").
        warnings.warn(f"{len(missing)} of {len(targets)} processes did not report their "
                      f"objects (gone, or not answering): {', '.join(missing[:3])}",
                      stacklevel=3)
    return [report for report in reports if isinstance(report, ObjectReport)]


def list_objects(address: str | None = None, filters: list | None = None,
                 limit: int | None = None, timeout: float | None = None,
                 detail: bool = False, raise_on_missing_output: bool = True
                 ) -> list[ObjectState]:
    """Every object reference held in the cluster: one row per (object,
    process holding it), as Ray's. ``object_size`` is known for values held
    in memory and for stored values on the holder's node; ``call_site`` is
    ``"disabled"`` (tray does not record where refs were made)."""
    checked = check_query(ObjectState, filters, limit)
    client = Client(address, timeout)
    ips = {node.node_id: node_ip(node) for node in node_table(client)}
    records = []
    for report in _object_reports(client):
        for row in report.rows:
            records.append(ObjectState(
                object_id=row["object_id"], object_size=row["object_size"],
                task_status=row["task_status"], reference_type=row["reference_type"],
                call_site="disabled", type=report.worker_type, pid=report.pid,
                ip=ips.get(report.node_id), node_id=report.node_id,
                worker_id=report.worker_id or report.address,
                owner_address=row["owner_address"], owned=row["owned"],
                locations=row["locations"]))
    return finish(ObjectState, records, checked, limit, detail, "object references")


def _directory_bytes(path: str | None) -> int | None:
    """Bytes of the files in ``path`` (a spill directory), None if it is not here."""
    if not path or not os.path.isdir(path):
        return None
    total = 0
    for entry in os.scandir(path):
        if entry.is_file(follow_symlinks=False) and not entry.name.startswith("."):
            total += entry.stat(follow_symlinks=False).st_size
    return total


def memory_summary(address: str | None = None, timeout: float | None = None) -> dict:
    """What ``tray memory`` prints: every reference grouped by the process
    holding it (with its size, reference type and the owner), and each
    node's object store: used and total bytes, and bytes spilled to disk
    (``None`` when the node's spill directory is not on this machine)::

        {"nodes": [{"node_id", "node_ip", "store_used_bytes",
                    "store_total_bytes", "spilled_bytes", "spilled_objects"}],
         "processes": [{"node_id", "pid", "type", "worker_id", "address",
                        "objects": [ObjectState as dict], "left_out"}],
         "totals": {"objects", "object_bytes", "by_reference_type": {...}}}"""
    client = Client(address, timeout)
    nodes = [node for node in node_table(client) if node.alive]
    stats = client._run([(node.address, "get_node_stats") for node in nodes])
    node_rows = []
    for node, stat in zip(nodes, stats, strict=True):
        spill = node.spill_directory
        spilled_objects = None
        if spill and os.path.isdir(spill):
            spilled_objects = sum(1 for entry in os.scandir(spill)
                                  if not entry.name.startswith("."))
        node_rows.append({
            "node_id": node.node_id, "node_ip": node_ip(node),
            "store_used_bytes": stat.store_used_bytes if isinstance(stat, NodeStats) else None,
            "store_total_bytes": node.object_store_bytes,
            "spilled_bytes": _directory_bytes(spill) if spill else 0,
            "spilled_objects": spilled_objects if spill else 0})
    processes = []
    totals = Counter()
    size_total = 0
    for report in _object_reports(client):
        objects = []
        for row in report.rows:
            objects.append({"object_id": row["object_id"], "object_size": row["object_size"],
                            "reference_type": row["reference_type"],
                            "task_status": row["task_status"],
                            "owner_address": row["owner_address"], "owned": row["owned"],
                            "call_site": "disabled"})
            totals[row["reference_type"]] += 1
            size_total += row["object_size"] or 0
        processes.append({"node_id": report.node_id, "pid": report.pid,
                          "type": report.worker_type, "worker_id": report.worker_id,
                          "address": report.address, "objects": objects,
                          "left_out": report.left_out})
    return {"nodes": node_rows, "processes": processes,
            "totals": {"objects": sum(totals.values()), "object_bytes": size_total,
                       "by_reference_type": dict(sorted(totals.items()))}}
