"""``/metrics``: the cluster's metrics in Prometheus's text format.

Computed when scraped, from the same reads as the pages (no sampling loop of
our own: Prometheus's scrape interval is the sampling interval). Ray's names
where Ray has the metric:

* ``ray_tasks{State,Name}``: task attempts the GCS keeps, by state and function;
* ``ray_actors{State,Name}``: actors by state and class;
* ``ray_resources{Name,State,NodeId}``: USED and AVAILABLE per node, and
  ``tray_node_resources_total{Name,NodeId}``;
* ``ray_object_store_memory{Location,NodeId}``: bytes in the shared-memory
  store (``MMAP_SHM``) and spilled to disk (``SPILLED``), per node;
* ``ray_cluster_active_nodes`` / ``tray_cluster_dead_nodes``;
* ``tray_workers{NodeId,State}``: live worker processes per node, by state
  (idle, leased, actor...: the node managers' own account);
* ``tray_task_duration_seconds`` (histogram): run time (RUNNING to
  FINISHED/FAILED) of the kept task attempts, and
  ``tray_task_scheduling_seconds``: from submission to RUNNING.

User metrics (``tray.util.metrics``) are appended, aggregated across the
processes that recorded them (see that module), when the cluster has any."""

from __future__ import annotations

from collections import Counter

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily

DURATION_BUCKETS_S = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 60.0, 300.0)


def _histogram(name: str, documentation: str, values: list[float]) -> HistogramMetricFamily:
    family = HistogramMetricFamily(name, documentation)
    counts, total = [], 0
    for bound in DURATION_BUCKETS_S:
        counts.append((repr(bound), sum(1 for v in values if v <= bound)))
    counts.append(("+Inf", len(values)))
    total = sum(values)
    family.add_metric([], counts, total)
    return family


class _Collector:
    def __init__(self, ctx) -> None:
        self.ctx = ctx

    def collect(self):
        reader = self.ctx.reader
        nodes = reader.nodes()
        actors = reader.actors()
        tasks, _ = reader.tasks()

        family = GaugeMetricFamily("ray_tasks", "Task attempts by state and function",
                                   labels=["State", "Name"])
        for (state, name), count in sorted(Counter(
                (t["state"], t.get("func_or_class_name") or t.get("name") or "?")
                for t in tasks).items()):
            family.add_metric([state, name], count)
        yield family

        family = GaugeMetricFamily("ray_actors", "Actors by state and class",
                                   labels=["State", "Name"])
        for (state, name), count in sorted(Counter((a["state"], a["class_name"])
                                                   for a in actors).items()):
            family.add_metric([state, name], count)
        yield family

        used = GaugeMetricFamily("ray_resources", "Logical resources per node",
                                 labels=["Name", "State", "NodeId"])
        total = GaugeMetricFamily("tray_node_resources_total", "Each node's resources",
                                  labels=["Name", "NodeId"])
        store = GaugeMetricFamily("ray_object_store_memory", "Object store bytes per node",
                                  labels=["Location", "NodeId"])
        capacity = GaugeMetricFamily("tray_object_store_capacity_bytes",
                                     "Object store capacity per node", labels=["NodeId"])
        for node in nodes:
            if node["state"] != "ALIVE":
                continue
            node_id = node["node_id"]
            for name, amount in sorted(node["resources_total"].items()):
                in_use = node["resources_used"].get(name, 0)
                used.add_metric([name, "USED", node_id], in_use)
                used.add_metric([name, "AVAILABLE", node_id], amount - in_use)
                total.add_metric([name, node_id], amount)
            if node["object_store_bytes_used"] is not None:
                store.add_metric(["MMAP_SHM", node_id], node["object_store_bytes_used"])
            if node["object_store_bytes_spilled"] is not None:
                store.add_metric(["SPILLED", node_id], node["object_store_bytes_spilled"])
            capacity.add_metric([node_id], node["object_store_bytes_total"])
        yield from (used, total, store, capacity)

        alive = sum(1 for n in nodes if n["state"] == "ALIVE")
        yield GaugeMetricFamily("ray_cluster_active_nodes", "Live nodes", value=alive)
        yield GaugeMetricFamily("tray_cluster_dead_nodes", "Dead nodes",
                                value=len(nodes) - alive)

        family = GaugeMetricFamily("tray_workers", "Live worker processes per node and state",
                                   labels=["NodeId", "State"])
        for (node_id, state), count in sorted(Counter(
                (w["node_id"], w["state"] or "?") for w in reader.workers()
                if w["is_alive"] and w["worker_type"] == "WORKER").items()):
            family.add_metric([node_id, state], count)
        yield family

        yield _histogram("tray_task_duration_seconds", "Task run time (kept attempts)",
                         [t["duration_s"] for t in tasks if t.get("duration_s") is not None])
        scheduling = []
        for task in tasks:
            times = {e["state"]: e["created_ms"] for e in task.get("events", [])}
            first = min(times.values(), default=None)
            if "RUNNING" in times and first is not None:
                scheduling.append(max(0, times["RUNNING"] - first) / 1000)
        yield _histogram("tray_task_scheduling_seconds",
                         "From submission to RUNNING (kept attempts)", scheduling)

        yield from _user_metrics(self.ctx)


def _user_metrics(ctx):
    """User metrics, if ``tray.util.metrics`` can read them from here."""
    try:
        from ..util.metrics import prometheus_families
    except ImportError:
        return []
    return prometheus_families(ctx)


def exposition(ctx) -> tuple[bytes, str]:
    """The text Prometheus scrapes, and its content type."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Collector(ctx))
    return generate_latest(registry), CONTENT_TYPE_LATEST
