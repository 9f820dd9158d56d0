"""What only the local backend has: real processes, sockets, shared memory,
authentication, and a clean exit."""

from __future__ import annotations

import json
import os
import signal
import struct
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import psutil
import pytest
import trio

import tray
import tray.exceptions as tex
from tray.backends.local.session import ROOT as SESSION_ROOT
from tray.core.interfaces import ConnectionClosed
from tray.experimental.internal_kv import _internal_kv_get, _internal_kv_put
from tray.transports.tcp import TcpTransport
from tray.transports.tcp_framing import frame_bytes_max
from tray.transports.tcp_handshake import AuthenticationError


def _tray_processes() -> list[psutil.Process]:
    found = []
    for process in psutil.process_iter(["cmdline"]):
        cmdline = process.info["cmdline"] or []
        if any("tray.backends.local" in part for part in cmdline):
            found.append(process)
    return found


def _session_dirs(session_dir: str) -> list[str]:
    name = os.path.basename(session_dir)
    return [path for path in (session_dir, f"/dev/shm/tray-{name}") if os.path.exists(path)]


def _our_processes(session_dir: str) -> list[psutil.Process]:
    return [p for p in _tray_processes()
            if any(session_dir in part for part in (p.info["cmdline"] or []))]


def _wait_until(condition, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return condition()


def test_shutdown_leaves_no_process_and_no_shared_memory():
    info = tray.init(num_cpus=2, num_nodes=2)
    session_dir = info["session_dir"]
    ref = tray.put(np.ones(1_000_000))
    assert tray.get(ref).sum() == 1_000_000
    assert _our_processes(session_dir), "the cluster should run real processes"
    assert _session_dirs(session_dir)
    tray.shutdown()
    assert _wait_until(lambda: not _our_processes(session_dir))
    assert _session_dirs(session_dir) == []


def test_driver_killed_with_sigkill_leaves_nothing_behind(tmp_path):
    # (CI, regression: a worker the zygote forked as the node stopped, the
    # node's prestarted ones, outlived it and made the session's store
    # directory again after the node removed it; failed 2 runs in 3.)
    script = tmp_path / "driver.py"
    script.write_text(textwrap.dedent("""
        import sys, time, numpy as np, tray
        info = tray.init(num_cpus=2)
        ref = tray.put(np.ones(1_000_000))
        print(info["session_dir"], flush=True)
        time.sleep(60)
    """))
    driver = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    session_dir = driver.stdout.readline().strip()
    assert session_dir.startswith(SESSION_ROOT)
    assert _our_processes(session_dir)
    driver.send_signal(signal.SIGKILL)
    driver.wait()
    assert _wait_until(lambda: not _our_processes(session_dir))
    assert _wait_until(lambda: _session_dirs(session_dir) == [])


def test_large_array_is_a_read_only_view_of_shared_memory():
    tray.init(num_cpus=1)
    try:
        array = np.arange(2_000_000, dtype=np.float64)
        value = tray.get(tray.put(array))
        assert np.array_equal(value, array)
        assert not value.flags.writeable
        assert not value.flags.owndata  # a view of the mapped segment, not a copy
    finally:
        tray.shutdown()


def test_worker_killed_mid_task_is_detected_and_retried():
    tray.init(num_cpus=1)
    try:
        @tray.remote
        def pid():
            return os.getpid()

        @tray.remote(max_retries=1)
        def die_once(marker):
            if not os.path.exists(marker):
                open(marker, "w").close()
                os.kill(os.getpid(), signal.SIGKILL)
            return "second attempt"

        marker = f"/tmp/tray-test-marker-{os.getpid()}"
        try:
            start = time.monotonic()
            assert tray.get(die_once.remote(marker)) == "second attempt"
            assert time.monotonic() - start < 10  # detected through the socket, not a timeout
        finally:
            if os.path.exists(marker):
                os.unlink(marker)
        assert tray.get(pid.remote()) != os.getpid()
    finally:
        tray.shutdown()


def test_worker_crash_without_retries_raises_worker_crashed():
    tray.init(num_cpus=1)
    try:
        @tray.remote(max_retries=0)
        def crash():
            os._exit(3)

        with pytest.raises(tex.WorkerCrashedError):
            tray.get(crash.remote())
    finally:
        tray.shutdown()


def test_connection_with_wrong_token_is_rejected():
    info = tray.init(num_cpus=1)
    try:
        gcs = f"unix:{info['session_dir']}/gcs.sock"

        async def connect_with(token: bytes):
            return await TcpTransport(token).connect(gcs)

        with pytest.raises(AuthenticationError):
            trio.run(connect_with, b"x" * 32)
        # The cluster is unharmed.
        assert tray.get(tray.put(5)) == 5
    finally:
        tray.shutdown()


def test_malformed_frame_closes_that_connection_only():
    info = tray.init(num_cpus=1)
    try:
        gcs = f"unix:{info['session_dir']}/gcs.sock"
        token = open(os.path.join(info["session_dir"], "token")).read().strip().encode()

        async def send_garbage():
            stream = await TcpTransport(token).connect(gcs)
            await stream._stream.send_all(b"\xff\xff\xff\xff" + b"garbage" * 10)
            with pytest.raises(ConnectionClosed):
                with trio.fail_after(5):
                    await stream.receive()

        trio.run(send_garbage)
        assert tray.get(tray.put("still fine")) == "still fine"
        assert len(tray.nodes()) == 1
    finally:
        tray.shutdown()


def test_a_huge_announced_message_neither_takes_the_heads_memory_nor_stalls_it():
    """Issue 43 item 6: a peer with the token announces a 4 GiB message to
    the GCS and sends 100 bytes of it. The head neither grows (it zeroed
    4 GiB before: 4 GB of RSS) nor stalls (that took seconds, during which
    the GCS answered nobody); a legitimate 50 MB value still crosses whole
    both ways; past ``frame_bytes_max`` only that connection is closed."""
    info = tray.init(num_cpus=1)
    try:
        session_dir = info["session_dir"]
        gcs = f"unix:{session_dir}/gcs.sock"
        token = open(os.path.join(session_dir, "token")).read().strip().encode()
        with open(os.path.join(session_dir, "node-0.json")) as file:
            head = psutil.Process(json.load(file)["pid"])  # the GCS runs in it
        assert len(tray.nodes()) == 1
        before = head.memory_info().rss
        announced, finished = threading.Event(), threading.Event()

        def peer() -> None:
            async def main() -> None:
                stream = await TcpTransport(token).connect(gcs)
                await stream._stream.send_all(struct.pack("<IQ", 1, 4 << 30) + b"x" * 100)
                announced.set()
                await trio.to_thread.run_sync(finished.wait)  # the rest never comes
                await stream.aclose()
            trio.run(main)

        thread = threading.Thread(target=peer)
        thread.start()
        try:
            assert announced.wait(30)
            time.sleep(0.3)  # the head has read the header
            start = time.monotonic()
            assert len(tray.nodes()) == 1
            assert time.monotonic() - start < 1.0
            assert head.memory_info().rss - before < 32 << 20
            value = os.urandom(50_000_000)
            assert _internal_kv_put(b"big", value) is False  # (a new key)
            assert _internal_kv_get(b"big") == value
        finally:
            finished.set()
            thread.join(30)

        async def past_the_bound() -> None:
            stream = await TcpTransport(token).connect(gcs)
            await stream._stream.send_all(struct.pack("<IQ", 1, frame_bytes_max + 1))
            with pytest.raises(ConnectionClosed):
                with trio.fail_after(10):
                    await stream.receive()

        trio.run(past_the_bound)
        assert tray.get(tray.put("still fine")) == "still fine"
    finally:
        tray.shutdown()


def test_full_object_store_spills_to_disk_and_reads_back():
    info = tray.init(num_cpus=1, object_store_memory=12 * 1024 * 1024)
    try:
        arrays = [np.full(1_000_000, i, dtype=np.float64) for i in range(4)]  # 8 MB each
        refs = [tray.put(a) for a in arrays]  # 32 MB through a 12 MB store
        spill_dir = os.path.join(info["session_dir"], "spill", "node-0")
        assert len(os.listdir(spill_dir)) >= 2
        for i, ref in enumerate(refs):
            value = tray.get(ref)
            assert value[0] == i and value[-1] == i
    finally:
        tray.shutdown()


def test_object_larger_than_the_store_raises_object_store_full():
    tray.init(num_cpus=1, object_store_memory=4 * 1024 * 1024)
    try:
        with pytest.raises(tex.ObjectStoreFullError, match="larger than"):
            tray.put(np.ones(1_000_000))
    finally:
        tray.shutdown()


def test_workers_that_cannot_start_fail_the_task_with_the_reason(monkeypatch):
    # Worker processes that exit at once, before registering.
    monkeypatch.setenv("TRAY_WORKER_PYTHON", "/bin/false")
    tray.init(num_cpus=1)
    try:
        @tray.remote
        def f():
            return 1

        with pytest.raises(tex.TaskError, match="fail to start"):
            tray.get(f.remote(), timeout=60)
    finally:
        tray.shutdown()


def test_worker_output_reaches_the_driver_prefixed_and_is_logged(capfd):
    info = tray.init(num_cpus=1)
    try:
        @tray.remote
        def speak():
            print("hello from a worker", flush=True)
            return os.getpid()

        pid = tray.get(speak.remote())
        assert _wait_until(lambda: "hello from a worker" in capfd.readouterr().out or
                           _logged(info["session_dir"], "hello from a worker"))
        assert _logged(info["session_dir"], "hello from a worker")
        del pid
    finally:
        tray.shutdown()


def _logged(session_dir: str, text: str) -> bool:
    logs = os.path.join(session_dir, "logs")
    if not os.path.isdir(logs):
        return False
    return any(text in open(os.path.join(logs, name)).read() for name in os.listdir(logs))


def test_gpu_ids_are_visible_to_cuda_in_the_worker():
    tray.init(num_cpus=2, num_gpus=2)
    try:
        @tray.remote(num_gpus=1)
        def visible():
            return tray.get_gpu_ids(), os.environ.get("CUDA_VISIBLE_DEVICES")

        ids, variable = tray.get(visible.remote())
        assert len(ids) == 1 and ids[0] in (0, 1)
        assert variable == str(ids[0])
    finally:
        tray.shutdown()


def _get_from_the_other_node(size: int):
    """A task on the second node puts an array and returns its ref; the
    driver (on the first) gets it: a pull from one node's store into the
    other's. Returns the value and the link counts of the store files."""
    from tray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    info = tray.init(num_cpus=1, num_nodes=2)
    try:
        here = tray.get_runtime_context().get_node_id()
        other = [node["NodeID"] for node in tray.nodes()
                 if node["Alive"] and node["NodeID"] != here][0]

        @tray.remote
        def make(n):
            return [tray.put(np.arange(n, dtype=np.float64))]

        [ref] = tray.get(make.options(scheduling_strategy=NodeAffinitySchedulingStrategy(
            other, soft=False)).remote(size // 8))
        value = tray.get(ref)
        shm = f"/dev/shm/tray-{os.path.basename(info['session_dir'])}"
        links = sorted(os.stat(os.path.join(root, name)).st_nlink
                       for root, _, names in os.walk(shm) for name in names
                       if not name.startswith("."))
        return value, links
    finally:
        tray.shutdown()


def test_nodes_on_one_machine_share_an_object_without_copying_it():
    value, links = _get_from_the_other_node(16 * 1024 * 1024)
    assert np.array_equal(value, np.arange(2 * 1024 * 1024, dtype=np.float64))
    assert not value.flags.writeable
    # One file, linked into both nodes' stores: two names, one inode.
    assert links == [2, 2], links


def test_object_sharing_turned_off_copies_the_object_in_chunks(monkeypatch):
    monkeypatch.setenv("TRAY_SHARE_OBJECTS_ON_MACHINE", "0")
    value, links = _get_from_the_other_node(16 * 1024 * 1024)
    assert np.array_equal(value, np.arange(2 * 1024 * 1024, dtype=np.float64))
    assert links == [1, 1], links  # two copies
