"""Multi-node clusters built with ``tray start`` on loopback: three node
processes, a driver that connects by address, tasks, actors and objects
across them, ``tray status`` and ``tray stop``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import numpy as np
import psutil
import pytest

import tray
import tray.exceptions as tex
from tray.backends.local.session import free_port
from tray.util.scheduling_strategies import NodeAffinitySchedulingStrategy


def _tray(root, *args, check=True, env_extra=None):
    env = {**os.environ, "TRAY_SESSION_ROOT": str(root), **(env_extra or {})}
    result = subprocess.run([sys.executable, "-m", "tray.scripts.cli", *args], env=env,
                            capture_output=True, text=True, timeout=120)
    if check:
        assert result.returncode == 0, result.stderr
    return result


def _node_processes(root) -> list[psutil.Process]:
    found = []
    for process in psutil.process_iter(["cmdline"]):
        cmdline = process.info["cmdline"] or []
        if any(str(root) in part for part in cmdline) and \
                any("tray.backends.local" in part for part in cmdline):
            found.append(process)
    return found


@pytest.fixture
def cli_cluster(tmp_path, monkeypatch):
    root = tmp_path / "sessions"
    port = free_port()
    _tray(root, "start", "--head", "--port", str(port), "--num-cpus", "2")
    _tray(root, "start", "--address", f"127.0.0.1:{port}", "--num-cpus", "2",
          "--resources", '{"special": 1}')
    _tray(root, "start", "--address", f"127.0.0.1:{port}", "--num-cpus", "1")
    with open(root / "current_cluster.json") as file:
        token = json.load(file)["token"]
    monkeypatch.setenv("TRAY_CLUSTER_TOKEN", token)
    try:
        yield root, f"127.0.0.1:{port}"
    finally:
        if tray.is_initialized():
            tray.shutdown()
        _tray(root, "stop", check=False)


def test_three_nodes_run_tasks_actors_and_transfers(cli_cluster):
    root, address = cli_cluster
    tray.init(address=address)
    nodes = tray.nodes()
    assert len(nodes) == 3 and all(node["Alive"] for node in nodes)
    assert tray.cluster_resources()["CPU"] == 5.0

    @tray.remote
    def where(array):
        return tray.get_runtime_context().get_node_id(), float(array.sum())

    big = tray.put(np.ones(1_000_000))  # 8 MB: moves between nodes in chunks
    results = tray.get([
        where.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"])).remote(big)
        for n in nodes])
    assert [node_id for node_id, _ in results] == [n["NodeID"] for n in nodes]
    assert all(total == 1_000_000.0 for _, total in results)

    @tray.remote(resources={"special": 1})
    class Counter:
        def __init__(self):
            self.value = 0

        def increment(self):
            self.value += 1
            return self.value, tray.get_runtime_context().get_node_id()

    counter = Counter.options(name="shared", namespace="cli-test", lifetime="detached").remote()
    values = tray.get([counter.increment.remote() for _ in range(3)])
    assert [v for v, _ in values] == [1, 2, 3]
    special_node = values[0][1]
    assert nodes[[n["NodeID"] for n in nodes].index(special_node)]["Resources"]["special"] == 1
    tray.shutdown()

    # A detached actor outlives its driver and is found by name from a new one.
    tray.init(address=address)
    again = tray.get_actor("shared", namespace="cli-test")
    assert tray.get(again.increment.remote())[0] == 4

    status = _tray(root, "status", "--address", address).stdout
    assert "3 live node(s)" in status
    assert "Counter" in status and "shared" in status


def test_stop_leaves_no_process_and_no_session(cli_cluster):
    root, _ = cli_cluster
    assert len(_node_processes(root)) >= 3
    result = _tray(root, "stop")
    assert "Stopped 3 tray node(s)" in result.stdout
    deadline = time.monotonic() + 10
    while _node_processes(root) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _node_processes(root) == []
    assert [p for p in os.listdir(root) if p.startswith("session-")] == []
    assert [p for p in os.listdir("/dev/shm") if str(root.name) in p] == []


def test_head_on_a_busy_port_says_so(cli_cluster):
    root, address = cli_cluster
    port = address.rpartition(":")[2]
    result = _tray(root, "start", "--head", "--port", port, check=False)
    assert result.returncode == 1
    assert "busy" in result.stderr


def test_a_port_held_only_by_closed_connections_is_free_for_a_new_head():
    """A crashed head leaves its port's connections in TIME_WAIT: the head
    started again there must not be refused as busy for a minute (the GCS
    listens with SO_REUSEADDR); a port someone listens on stays busy."""
    import socket

    from tray.scripts.cluster import _port_is_free

    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    assert not _port_is_free("127.0.0.1", port)
    client = socket.create_connection(("127.0.0.1", port))
    server_side, _ = listener.accept()
    server_side.close()  # the server closes first: its end waits in TIME_WAIT
    client.recv(1)
    client.close()
    listener.close()
    assert _port_is_free("127.0.0.1", port)


def test_wrong_token_is_named(cli_cluster, monkeypatch):
    _, address = cli_cluster
    monkeypatch.setenv("TRAY_CLUSTER_TOKEN", "0" * 64)
    with pytest.raises(tex.TrayError, match="rejected this token"):
        tray.init(address=address)


def test_dead_cluster_fails_within_seconds(monkeypatch):
    monkeypatch.setenv("TRAY_CLUSTER_TOKEN", "0" * 64)
    start = time.monotonic()
    with pytest.raises(tex.TrayError, match="no tray cluster answers"):
        tray.init(address=f"127.0.0.1:{free_port()}")
    assert time.monotonic() - start < 10


def test_driver_options_belong_to_tray_start(monkeypatch):
    monkeypatch.setenv("TRAY_CLUSTER_TOKEN", "0" * 64)
    with pytest.raises(ValueError, match="tray start"):
        tray.init(address="127.0.0.1:6380", num_cpus=4)


def _object_files(object_hex: str) -> list[str]:
    found = []
    for directory, _, files in os.walk("/dev/shm"):
        if object_hex in files:
            found.append(os.path.join(directory, object_hex))
    return found


def test_objects_of_a_driver_killed_with_sigkill_are_freed(cli_cluster, tmp_path):
    _, address = cli_cluster
    script = tmp_path / "driver.py"
    script.write_text(
        "import sys, time, numpy as np, tray\n"
        f"tray.init(address={address!r})\n"
        "ref = tray.put(np.ones(1_000_000))\n"
        "print(ref.hex(), flush=True)\n"
        "time.sleep(60)\n")
    driver = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        object_hex = driver.stdout.readline().strip()
        assert _object_files(object_hex), "the object should be in a node's shared memory"
        driver.kill()
        driver.wait()
        deadline = time.monotonic() + 10
        while _object_files(object_hex) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _object_files(object_hex) == []
    finally:
        if driver.poll() is None:
            driver.kill()


def test_address_without_a_token_says_where_to_get_one(monkeypatch):
    import socket

    monkeypatch.delenv("TRAY_CLUSTER_TOKEN", raising=False)
    with socket.create_server(("127.0.0.1", 0)) as listener:  # something answers there
        port = listener.getsockname()[1]
        with pytest.raises(tex.TrayError, match="TRAY_CLUSTER_TOKEN"):
            tray.init(address=f"127.0.0.1:{port}")


def test_auto_without_a_cluster_on_this_machine(tmp_path):
    env = {**os.environ, "TRAY_SESSION_ROOT": str(tmp_path / "empty")}
    result = subprocess.run(
        [sys.executable, "-c", "import tray\ntry:\n    tray.init(address='auto')\n"
         "except tray.exceptions.TrayError as e:\n    print(e)"],
        env=env, capture_output=True, text=True, timeout=60)
    assert "tray start --head" in result.stdout, result.stderr
