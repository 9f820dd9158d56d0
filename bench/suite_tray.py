"""tray's side of the benchmarks: the metrics shared with Ray
(suite_raylike.py) bound to tray, plus what differs: a two-node cluster
and the simulator."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import suite_raylike
from harness import NotAvailable, n, throughput
from harness import metric as _metric

import tray

# No dashboard, as Ray's side (its install has none): the same cluster on both.
METRICS: dict = suite_raylike.bind(tray, include_dashboard=False)
_defs = suite_raylike._defs


def metric(name):
    return _metric(METRICS, name)


@metric("get 80 MB array across two nodes")
def large_across_nodes():
    """Nodes on one machine: the pulling node links the object's file."""
    tray.init(num_nodes=2, num_cpus=1, include_dashboard=False)
    try:
        here = tray.get_runtime_context().get_node_id()
        other = [node["NodeID"] for node in tray.nodes()
                 if node["Alive"] and node["NodeID"] != here][0]
        return suite_raylike.across_nodes(other)
    finally:
        tray.shutdown()


@metric("get 80 MB array across two nodes, copied")
def large_across_nodes_copied():
    """As between machines: sharing on one machine turned off, the object
    crosses the connection in chunks (the nodes inherit the setting)."""
    os.environ["TRAY_SHARE_OBJECTS_ON_MACHINE"] = "0"
    try:
        return large_across_nodes()
    finally:
        del os.environ["TRAY_SHARE_OBJECTS_ON_MACHINE"]


# ------------------------------------------------------------ simulator

@metric("simulated tasks per wall-clock second")
def sim_tasks():
    tray.init(backend="sim", seed=0, num_nodes=3, num_cpus=4)
    try:
        small_value = _defs()[0]
        count = n(2000)

        def body():
            tray.get([small_value.remote() for _ in range(count)])
            return count
        return throughput(body)
    finally:
        tray.shutdown()


@metric("simtest seeds per minute (mixed workload)")
def simtest_seeds():
    from harness import ROUNDS

    command = [sys.executable, "-m", "tray.scripts.cli"]
    if shutil.which("tray"):
        command = ["tray"]
    probe = subprocess.run([*command, "simtest", "run", "--help"], capture_output=True,
                           text=True)
    if probe.returncode != 0:
        raise NotAvailable("not available yet (no `tray simtest run`)")
    values = []
    seeds = n(20)
    for _ in range(ROUNDS):
        result = subprocess.run([*command, "simtest", "run", "--seeds", f"0:{seeds}",
                                 "--workload", "mixed", "--faults", "default", "--json"],
                                capture_output=True, text=True, timeout=600)
        report = json.loads(result.stdout[result.stdout.index("{"):])
        values.append(float(report["seeds_per_minute"]))
    return values
