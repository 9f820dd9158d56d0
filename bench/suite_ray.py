"""Ray's side of the benchmarks: the metrics shared with tray
(suite_raylike.py) bound to Ray, plus what differs: a two-node cluster
(``ray.cluster_utils``)."""

from __future__ import annotations

import os

# Loopback only: Ray binds and connects to the host's own address unless
# told, and reads this switch when it is imported (its processes inherit it).
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"

import ray  # noqa: E402
import suite_raylike  # noqa: E402
from harness import metric as _metric  # noqa: E402

LOOPBACK = "127.0.0.1"

# No dashboard (``ray`` without ``[default]`` has none anyway), quiet logs.
METRICS: dict = suite_raylike.bind(
    ray, include_dashboard=False, logging_level="ERROR", log_to_driver=False,
    _node_ip_address=LOOPBACK)


def metric(name):
    return _metric(METRICS, name)


@metric("get 80 MB array across two nodes")
def large_across_nodes():
    from ray.cluster_utils import Cluster

    store = 1_000_000_000
    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 1, "object_store_memory": store, "include_dashboard": False,
        "node_ip_address": LOOPBACK})
    cluster.add_node(num_cpus=1, object_store_memory=store, node_ip_address=LOOPBACK)
    ray.init(address=cluster.address, logging_level="ERROR", log_to_driver=False,
             _node_ip_address=LOOPBACK)
    try:
        cluster.wait_for_nodes()
        here = ray.get_runtime_context().get_node_id()
        other = [node["NodeID"] for node in ray.nodes()
                 if node["Alive"] and node["NodeID"] != here][0]
        return suite_raylike.across_nodes(other)
    finally:
        ray.shutdown()
        cluster.shutdown()


# Ray and Dask always copy between nodes: the same measurement.
METRICS["get 80 MB array across two nodes, copied"] = large_across_nodes
