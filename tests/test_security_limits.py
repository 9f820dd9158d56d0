"""Issue 11, item 5: idle connections cannot lock clients out, the token
never shows in a process list, and a task's forked child cannot answer for
its parent."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap

import psutil
import pytest
import trio

import tray
from tray.backends.local.session import free_port
from tray.transports.tcp import TcpTransport

TOKEN = b"limits-test-token-" + b"5" * 32

# A server that may hold 64 descriptors, would wait 10 minutes for a
# handshake, and lets through at most LISTENER handshakes in progress (SOURCE
# from one IP).
SERVER = """
import resource, sys, trio
from tray.transports import tcp

tcp.auth_timeout_s = 600.0
tcp.handshakes_per_listener_max = {listener}
tcp.handshakes_per_source_max = {source}
resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))

async def main():
    transport = tcp.TcpTransport({token!r})

    async def echo(stream):
        while True:
            await stream.send(await stream.receive())

    async with trio.open_nursery() as nursery:
        await nursery.start(transport.serve, "tcp:127.0.0.1:{port}", echo)
        print("ready", flush=True)
        await trio.sleep_forever()

trio.run(main)
"""

IDLE_CONNECTIONS = 150  # more than the server has descriptors


@pytest.mark.parametrize("sources,listener,source", [
    ("one source", 1000, 8),  # the per-source limit sheds
    ("many sources", 16, 1000),  # the per-listener limit sheds
])
def test_idle_connections_do_not_lock_new_clients_out(tmp_path, sources, listener, source):
    port = free_port()
    script = tmp_path / "server.py"
    script.write_text(SERVER.format(listener=listener, source=source, token=TOKEN, port=port))
    server = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    idle: list[socket.socket] = []
    try:
        assert server.stdout.readline().strip() == "ready"
        for i in range(IDLE_CONNECTIONS):
            sock = socket.socket()
            if sources == "many sources":
                sock.bind((f"127.0.{1 + i // 250}.{2 + i % 250}", 0))
            sock.connect(("127.0.0.1", port))  # and then say nothing
            idle.append(sock)

        async def client() -> object:
            with trio.fail_after(60):  # the server would hold the idle ones for 600 s
                stream = await TcpTransport(TOKEN).connect(f"tcp:127.0.0.1:{port}")
                await stream.send("a new client")
                answer = await stream.receive()
                await stream.aclose()
                return answer

        assert trio.run(client) == "a new client"
        # The idle connections that were shed were closed by the server.
        closed = 0
        for sock in idle:
            sock.setblocking(False)
            try:
                closed += sock.recv(1) == b""
            except (BlockingIOError, ConnectionResetError):
                pass
        assert closed >= IDLE_CONNECTIONS - min(listener, source) - 1
    finally:
        for sock in idle:
            sock.close()
        server.kill()
        server.wait()


async def test_shedding_is_counted_and_keeps_the_newest(monkeypatch):
    from tray.transports import tcp

    monkeypatch.setattr(tcp, "handshakes_per_source_max", 3)
    monkeypatch.setattr(tcp, "handshakes_per_listener_max", 100)
    transport = TcpTransport(TOKEN)
    address = f"tcp:127.0.0.1:{free_port()}"

    async def echo(stream):
        while True:
            await stream.send(await stream.receive())

    async with trio.open_nursery() as nursery:
        await nursery.start(transport.serve, address, echo)
        idle = [await trio.open_tcp_stream("127.0.0.1", int(address.rpartition(":")[2]))
                for _ in range(10)]
        with trio.fail_after(30):
            while transport.statistics().handshakes_shed < 7:
                await trio.sleep(0.01)
            assert transport.statistics().handshakes_in_progress == 3
            # The oldest went first: the first seven see the server close.
            for stream in idle[:7]:
                assert await stream.receive_some(64) == b""
            stream = await TcpTransport(TOKEN).connect(address)
            await stream.send("in")
            assert await stream.receive() == "in"
        statistics = transport.statistics()
        assert statistics.handshakes_shed == 8  # one more idle one made room
        assert statistics.connections_open == 1
        assert statistics.handshakes_rejected == 0
        await stream.aclose()
        for stream in idle:
            await stream.aclose()
        nursery.cancel_scope.cancel()


# ============================================================ the token


def _cli(root, *args, env_extra=None):
    env = {**os.environ, "TRAY_SESSION_ROOT": str(root)}
    env.pop("TRAY_CLUSTER_TOKEN", None)
    env.update(env_extra or {})
    return subprocess.run([sys.executable, "-m", "tray.scripts.cli", *args], env=env,
                          capture_output=True, text=True, timeout=120)


def test_the_token_is_never_taken_on_the_command_line(tmp_path):
    root = tmp_path / "sessions"
    port = free_port()
    head = _cli(root, "start", "--head", "--port", str(port), "--num-cpus", "1")
    assert head.returncode == 0, head.stderr
    try:
        token = next(line.split("TRAY_CLUSTER_TOKEN=")[1].split()[0]
                     for line in head.stdout.splitlines() if "TRAY_CLUSTER_TOKEN=" in line)
        # --token is refused, with what to do instead, and starts nothing.
        refused = _cli(root, "start", "--address", f"127.0.0.1:{port}", "--token", token)
        assert refused.returncode == 2
        assert "/proc" in refused.stderr and "TRAY_CLUSTER_TOKEN" in refused.stderr
        assert "--token-file" in refused.stderr

        # A token file others can read is refused too.
        token_file = tmp_path / "token"
        token_file.write_text(token)
        os.chmod(token_file, 0o644)
        loose = _cli(root, "start", "--address", f"127.0.0.1:{port}", "--token-file",
                     str(token_file))
        assert loose.returncode == 1 and "chmod 600" in loose.stderr

        os.chmod(token_file, 0o600)
        joined = _cli(root, "start", "--address", f"127.0.0.1:{port}", "--num-cpus", "1",
                      "--token-file", str(token_file))
        assert joined.returncode == 0, joined.stderr
        cluster = [p for p in psutil.process_iter(["cmdline"])
                   if str(root) in " ".join(p.info["cmdline"] or [])]
        assert len(cluster) >= 2  # two node processes (and their workers)
        everyone = [" ".join(p.info["cmdline"] or []) for p in psutil.process_iter(["cmdline"])]
        assert not [cmdline for cmdline in everyone if token in cmdline]
    finally:
        _cli(root, "stop")


def test_tray_start_help_says_where_the_token_comes_from():
    result = subprocess.run([sys.executable, "-m", "tray.scripts.cli", "start", "--help"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0
    text = " ".join(result.stdout.split())
    assert "TRAY_CLUSTER_TOKEN" in text and "--token-file" in text
    assert "/proc/PID/cmdline" in text
    assert "--token " not in text.replace("--token-file", "")


# ============================================================ fork


def test_a_task_whose_forked_child_also_returns_gives_the_parents_value():
    tray.init(num_cpus=1)
    try:
        @tray.remote(max_retries=0)
        def forks(i):
            child = os.fork()
            if child == 0:
                return ("the child", i)  # back into tray, as the parent will
            _, status = os.waitpid(child, 0)
            return ("the parent", i, os.waitstatus_to_exitcode(status))

        results = tray.get([forks.remote(i) for i in range(5)], timeout=60)
        assert results == [("the parent", i, 0) for i in range(5)]

        @tray.remote(max_retries=0)
        def forks_and_leaves_first():
            import time

            child = os.fork()
            if child == 0:
                time.sleep(0.2)  # the parent's answer is long gone
                return "the child"
            return ("the parent", child)

        answer, child = tray.get(forks_and_leaves_first.remote(), timeout=60)
        assert answer == "the parent"

        @tray.remote(max_retries=0)
        def forks_with_a_large_value():
            import numpy as np

            child = os.fork()
            if child == 0:
                return np.full(1_000_000, 1.0)  # 8 MB: through the object store
            os.waitpid(child, 0)
            return np.full(1_000_000, 2.0)

        assert set(tray.get(forks_with_a_large_value.remote(), timeout=60)) == {2.0}

        @tray.remote
        def pid():
            return os.getpid()

        # The worker (one CPU: the same process) goes on serving.
        assert isinstance(tray.get(pid.remote(), timeout=60), int)
        assert tray.get([forks.remote(i) for i in range(5, 7)], timeout=60) == [
            ("the parent", i, 0) for i in range(5, 7)]
    finally:
        tray.shutdown()


def test_a_task_may_use_a_fork_pool():
    tray.init(num_cpus=1)
    try:
        @tray.remote(max_retries=0)
        def pooled():
            import multiprocessing

            with multiprocessing.get_context("fork").Pool(2) as pool:
                return pool.map(abs, [-1, -2, -3, -4])

        assert tray.get(pooled.remote(), timeout=60) == [1, 2, 3, 4]
        assert tray.get(pooled.remote(), timeout=60) == [1, 2, 3, 4]
    finally:
        tray.shutdown()


def test_fork_in_a_driver_leaves_its_connections_alone(tmp_path):
    """The driver's trio loop runs in a thread: a child forked from the main
    thread must not touch the driver's sockets either."""
    script = tmp_path / "driver.py"
    script.write_text(textwrap.dedent("""
        import os, tray
        tray.init(num_cpus=1)

        @tray.remote
        def square(x):
            return x * x

        assert tray.get(square.remote(3)) == 9
        child = os.fork()
        if child == 0:
            os._exit(0)
        os.waitpid(child, 0)
        print(tray.get([square.remote(i) for i in range(4)]))
        tray.shutdown()
    """))
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[0, 1, 4, 9]"
