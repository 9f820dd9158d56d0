"""The autoscaler on real processes: the local provider starts node processes
on this machine for work the head cannot run, and stops them when idle.
Small on purpose (one worker node at a time)."""

from __future__ import annotations

import time

import pytest

import tray
import tray.autoscaler as autoscaler

LOCAL_CONFIG = {
    "max_workers": 1, "idle_timeout_minutes": 0.05, "autoscaler_period_s": 0.5,
    "head_node_type": "head",
    "available_node_types": {
        "head": {"resources": {}, "max_workers": 0},
        "worker": {"resources": {"CPU": 1, "scaled": 1}, "max_workers": 1,
                   "node_config": {"object_store_memory": 32 * 1024**2}},
    },
    "provider": {"type": "local"},
}


@tray.remote(resources={"scaled": 1})
def where_am_i() -> str:
    return tray.get_runtime_context().get_node_id()


def _alive_scaled_nodes() -> list:
    return [n["NodeID"] for n in tray.nodes() if n["Alive"] and n["Resources"].get("scaled")]


@pytest.mark.timeout(120)
def test_local_provider_starts_a_node_process_for_work_and_stops_it_when_idle():
    tray.init(backend="local", num_cpus=1)
    try:
        head = tray.get_runtime_context().get_node_id()
        monitor = autoscaler.start(LOCAL_CONFIG)
        node_id = tray.get(where_am_i.remote(), timeout=60)
        assert node_id != head  # it ran on the node the autoscaler started
        assert _alive_scaled_nodes() == [node_id]
        assert [d.action for d in monitor.decisions][:1] == ["launch"]
        deadline = time.monotonic() + 30
        while _alive_scaled_nodes() and time.monotonic() < deadline:
            time.sleep(0.25)
        assert _alive_scaled_nodes() == []  # idle for 3 s: terminated
        assert "terminate" in [d.action for d in monitor.decisions]
        assert monitor.provider.nodes() == []
        monitor.stop()
    finally:
        tray.shutdown()
