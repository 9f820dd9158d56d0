"""``tray start --head --autoscaling-config cluster.yaml`` and the autoscaler
lines of ``tray status``, on real processes (loopback, one worker node)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import psutil
import pytest

import tray
from tray.backends.local.session import free_port

CONFIG = """\
max_workers: 1
idle_timeout_minutes: 0.05
autoscaler_period_s: 0.5
head_node_type: head
available_node_types:
  head: {resources: {}, max_workers: 0}
  worker: {resources: {CPU: 1, scaled: 1}, max_workers: 1,
           node_config: {object_store_memory: 33554432}}
provider: {type: local}
"""


def _tray(root, *args, check=True):
    env = {**os.environ, "TRAY_SESSION_ROOT": str(root)}
    result = subprocess.run([sys.executable, "-m", "tray.scripts.cli", *args], env=env,
                            capture_output=True, text=True, timeout=120)
    if check:
        assert result.returncode == 0, result.stderr
    return result


def _autoscaler_processes(root) -> list:
    found = []
    for process in psutil.process_iter(["cmdline"]):
        cmdline = process.info["cmdline"] or []
        if any(str(root) in part for part in cmdline) and "tray.autoscaler" in cmdline:
            found.append(process)
    return found


@pytest.mark.timeout(180)
def test_tray_start_with_autoscaling_config_and_status(tmp_path, monkeypatch):
    root = tmp_path / "sessions"
    config = tmp_path / "cluster.yaml"
    config.write_text(CONFIG)
    port = free_port()
    started = _tray(root, "start", "--head", "--port", str(port), "--num-cpus", "1",
                    "--no-include-dashboard", "--autoscaling-config", str(config))
    assert "Autoscaler:" in started.stdout
    try:
        with open(root / "current_cluster.json") as file:
            monkeypatch.setenv("TRAY_CLUSTER_TOKEN", json.load(file)["token"])
        tray.init(address=f"127.0.0.1:{port}")

        @tray.remote(resources={"scaled": 1})
        def on_scaled_node():
            return tray.get_runtime_context().get_node_id()

        try:
            node_id = tray.get(on_scaled_node.remote(), timeout=90)
        except tray.exceptions.GetTimeoutError:
            logs = sorted(root.glob("session-*/autoscaler.log"))
            raise AssertionError("the autoscaled node did not run the task; autoscaler log:\n"
                                 + "".join(p.read_text()[-3000:] for p in logs)) from None
        status = _tray(root, "status", "--address", f"127.0.0.1:{port}").stdout
        assert node_id in status
        assert "======== Autoscaler status ========" in status
        assert "launch worker x1: pending demand" in status
        tray.shutdown()
        deadline = time.monotonic() + 30
        while "terminate worker" not in status and time.monotonic() < deadline:
            time.sleep(0.5)
            status = _tray(root, "status", "--address", f"127.0.0.1:{port}").stdout
        assert "terminate worker x1 local-100: idle for" in status
        assert _autoscaler_processes(root)
    finally:
        if tray.is_initialized():
            tray.shutdown()
        _tray(root, "stop", check=False)
    deadline = time.monotonic() + 10
    while _autoscaler_processes(root) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _autoscaler_processes(root) == []  # it follows the head out


def test_tray_start_rejects_a_bad_autoscaling_config(tmp_path):
    config = tmp_path / "cluster.yaml"
    config.write_text(CONFIG.replace("max_workers: 1,", "min_workers: 2, max_workers: 1,"))
    result = _tray(tmp_path / "sessions", "start", "--head", "--port", str(free_port()),
                   "--autoscaling-config", str(config), check=False)
    assert result.returncode == 2
    assert "available_node_types.worker.max_workers (1) is below its min_workers (2)" in \
        result.stderr
    result = _tray(tmp_path / "sessions", "start", "--address", "127.0.0.1:1",
                   "--autoscaling-config", str(config), check=False)
    assert result.returncode == 2
    assert "--autoscaling-config goes with --head" in result.stderr
