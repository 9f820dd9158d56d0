"""The transport's handshake against relays, reflection and oracles, and TLS
(docs/security.md). Real sockets on 127.0.0.1, an attacker in between."""

from __future__ import annotations

import argparse
import contextlib
import os
import pickle
import struct
import subprocess
import sys

import numpy as np
import psutil
import pytest
import trio

import tray
from tray.backends.local.session import free_port
from tray.transports import tcp, tcp_handshake, tls
from tray.transports.tcp import TcpTransport
from tray.transports.tcp_handshake import AuthenticationError, WrongPeerError

TOKEN = b"a-cluster-token-" + b"7" * 32
TLS_TOKEN = b"tls:" + TOKEN

# What a pickle planted by the attacker appends to, if it ever runs here.
PLANTED: list[str] = []


def _plant(note: str) -> None:
    PLANTED.append(note)


class _Planted:
    def __reduce__(self):
        return (_plant, ("the attacker's pickle ran in the server",))


def _frame(message) -> bytes:
    data = pickle.dumps(message, protocol=5)
    return struct.pack("<IQ", 1, len(data)) + data


PLANTED_FRAME = _frame(_Planted())


class Server:
    """A real TcpTransport server that loads whatever authenticated peers
    send (as every tray process does) and echoes it."""

    def __init__(self, token: bytes) -> None:
        self.transport = TcpTransport(token)
        self.received: list = []
        self.sessions = 0
        self.address = f"tcp:127.0.0.1:{free_port()}"

    async def _on_stream(self, stream) -> None:
        self.sessions += 1
        while True:
            message = await stream.receive()
            self.received.append(message)
            await stream.send(("echo", message))

    async def start(self, nursery) -> Server:
        await nursery.start(self.transport.serve, self.address, self._on_stream)
        return self

    @property
    def port(self) -> int:
        return int(self.address.rpartition(":")[2])


class Relay:
    """The attacker: a listener on 127.0.0.1 that forwards every connection,
    byte for byte, to the real server (optionally rewriting the client's
    bytes), and can then write a planted frame into the server side."""

    def __init__(self, target_port: int, rewrite=None) -> None:
        self.target_port = target_port
        self.rewrite = rewrite
        self.inject = trio.Event()
        self.injected = trio.Event()
        self.server_side_closed = trio.Event()
        self.port = 0

    async def start(self, nursery) -> Relay:
        listeners = await nursery.start(trio.serve_tcp, self._relay, 0)
        self.port = listeners[0].socket.getsockname()[1]
        return self

    @property
    def address(self) -> str:
        return f"tcp:127.0.0.1:{self.port}"

    async def _relay(self, client_side) -> None:
        server_side = await trio.open_tcp_stream("127.0.0.1", self.target_port)
        sending_to_server = trio.Lock()

        async def pipe(source, sink, rewrite) -> None:
            try:
                while True:
                    data = await source.receive_some(65536)
                    if not data:
                        break
                    async with sending_to_server if sink is server_side else _nothing():
                        await sink.send_all(rewrite(data) if rewrite else data)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                pass
            if source is server_side:
                self.server_side_closed.set()

        async def inject() -> None:
            await self.inject.wait()
            try:
                async with sending_to_server:
                    await server_side.send_all(PLANTED_FRAME)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                pass
            self.injected.set()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(pipe, client_side, server_side, self.rewrite)
            nursery.start_soon(pipe, server_side, client_side, None)
            nursery.start_soon(inject)


@contextlib.asynccontextmanager
async def _nothing():
    yield


async def _attack(server: Server, relay: Relay, client_token: bytes):
    """The victim connects to the relay (it was given the relay's address);
    returns what its connect raised, or None if it got a session."""
    outcome = None
    try:
        await TcpTransport(client_token).connect(relay.address)
    except (AuthenticationError, WrongPeerError) as error:
        outcome = error
    relay.inject.set()
    # On the old protocol the planted pickle ran within milliseconds; here the
    # server has already closed its side.
    with trio.move_on_after(5):
        while not PLANTED and not relay.server_side_closed.is_set():
            await trio.sleep(0.01)
    return outcome


@pytest.mark.parametrize("token", [TOKEN, TLS_TOKEN], ids=["plain", "tls"])
async def test_a_relay_between_real_sockets_gets_no_session(token):
    """The attack of issue 11: forward the victim's handshake to the real
    server and the server's back. The old protocol authenticated both ends
    and the relay then planted a pickle that the server loaded."""
    PLANTED.clear()
    async with trio.open_nursery() as nursery:
        server = await Server(token).start(nursery)
        relay = await Relay(server.port).start(nursery)
        outcome = await _attack(server, relay, token)
        nursery.cancel_scope.cancel()
    assert PLANTED == []
    assert server.sessions == 0
    assert server.received == []
    assert isinstance(outcome, WrongPeerError), outcome
    assert server.transport.statistics().handshakes_rejected == 1


async def test_a_relay_that_rewrites_the_peer_name_gets_no_session():
    """A smarter relay puts the server's own address in the victim's hello;
    the victim's proof covers the name it meant, so the proof fails."""
    PLANTED.clear()
    async with trio.open_nursery() as nursery:
        server = await Server(TOKEN).start(nursery)
        relay = Relay(server.port)
        relay.rewrite = lambda data: data.replace(
            f":{relay.port}".encode(), f":{server.port}".encode())
        await relay.start(nursery)
        outcome = await _attack(server, relay, TOKEN)
        nursery.cancel_scope.cancel()
    assert PLANTED == []
    assert server.sessions == 0
    assert isinstance(outcome, AuthenticationError), outcome


async def test_the_server_proves_nothing_before_the_client_has():
    """A caller without the token learns the server's nonce and one status
    byte, never an answer it could replay elsewhere (the old server answered
    any nonce at once: an oracle for fake servers)."""
    async with trio.open_nursery() as nursery:
        server = await Server(TOKEN).start(nursery)
        stream = await trio.open_tcp_stream("127.0.0.1", server.port)
        peer = server.address.encode()
        await stream.send_all(b"TRAY/2 RAW\n" + struct.pack("<H", len(peer)) + peer +
                              os.urandom(tcp_handshake.NONCE_BYTES))
        received = b""
        with trio.fail_after(10):
            while len(received) < 11 + tcp_handshake.NONCE_BYTES:
                received += await stream.receive_some(4096)
            assert received[:11] == b"TRAY/2 RAW\n"
            await stream.send_all(b"\0" * tcp_handshake.PROOF_BYTES)  # a guess
            rest = received[11 + tcp_handshake.NONCE_BYTES:]
            while chunk := await stream.receive_some(4096):
                rest += chunk
        assert rest == b"\x01"  # "wrong proof", then the server closed
        await stream.aclose()
        nursery.cancel_scope.cancel()
    assert server.sessions == 0


def test_each_proof_binds_role_mode_peer_and_both_nonces():
    base = dict(token=TOKEN, signer=b"client", mode=b"TRAY/2 RAW\n", peer=b"tcp:10.0.0.1:6380",
                client_nonce=b"c" * 32, server_nonce=b"s" * 32)
    reference = tcp_handshake._proof(**base)
    for field, other in [("signer", b"server"), ("mode", b"TRAY/2 TLS\n"),
                         ("peer", b"tcp:10.0.0.2:6380"), ("client_nonce", b"C" * 32),
                         ("server_nonce", b"S" * 32), ("token", b"another-token-0123456789")]:
        assert tcp_handshake._proof(**{**base, field: other}) != reference, field
    # Fields cannot slide into each other: moving bytes from one to the next
    # changes the proof.
    slid = {**base, "peer": base["peer"] + b"c", "client_nonce": b"c" * 31}
    assert tcp_handshake._proof(**slid) != reference


def test_peer_names_read_alike_from_both_ends():
    # A dual-stack server sees an IPv4 client's target as ::ffff:a.b.c.d.
    assert tcp._socket_name(("::ffff:10.0.0.5", 6380, 0, 0)) == "tcp:10.0.0.5:6380"
    assert tcp._socket_name(("10.0.0.5", 6380)) == "tcp:10.0.0.5:6380"
    assert tcp._socket_name(("::1", 6380, 0, 0)) == "tcp:::1:6380"


async def test_authenticated_round_trip_and_a_wrong_token():
    async with trio.open_nursery() as nursery:
        server = await Server(TOKEN).start(nursery)
        stream = await TcpTransport(TOKEN).connect(server.address)
        await stream.send({"x": 1})
        assert await stream.receive() == ("echo", {"x": 1})
        await stream.aclose()
        with pytest.raises(AuthenticationError, match="rejected this token"):
            await TcpTransport(b"another-token-0123456789").connect(server.address)
        # A host name resolves to the address the server listens on.
        stream = await TcpTransport(TOKEN).connect(f"tcp:localhost:{server.port}")
        await stream.aclose()
        nursery.cancel_scope.cancel()


# ====================================================================== TLS


async def test_tls_round_trip_of_a_large_array():
    async with trio.open_nursery() as nursery:
        server = await Server(TLS_TOKEN).start(nursery)
        stream = await TcpTransport(TLS_TOKEN).connect(server.address)
        assert isinstance(stream._stream, trio.SSLStream)
        assert stream._stream.version() == "TLSv1.3"
        array = np.arange(2_000_000, dtype=np.float64)  # 16 MB: sent in pieces
        await stream.send(array)
        kind, echoed = await stream.receive()
        assert kind == "echo" and np.array_equal(echoed, array)
        await stream.aclose()
        nursery.cancel_scope.cancel()


async def test_tls_and_plain_do_not_mix_and_say_why():
    async with trio.open_nursery() as nursery:
        tls_server = await Server(TLS_TOKEN).start(nursery)
        plain_server = await Server(TOKEN).start(nursery)
        with pytest.raises(AuthenticationError, match="uses TLS"):
            await TcpTransport(TOKEN).connect(tls_server.address)
        with pytest.raises(AuthenticationError, match="refusing to talk without TLS"):
            await TcpTransport(TLS_TOKEN).connect(plain_server.address)
        # Another cluster's TLS token: its certificates are not this CA's.
        with pytest.raises(AuthenticationError, match="TLS"):
            await TcpTransport(b"tls:another-cluster-token-0123456789").connect(
                tls_server.address)
        assert tls_server.sessions == 0 and plain_server.sessions == 0
        nursery.cancel_scope.cancel()


def test_tls_certificates_are_derived_from_the_token():
    """Every process holding the token builds the same CA: nothing to copy."""
    first = tls.tls_contexts(TLS_TOKEN)
    tls.tls_contexts.cache_clear()
    second = tls.tls_contexts(TLS_TOKEN)
    assert first is not second
    assert first[1].get_ca_certs() == second[1].get_ca_certs()
    other = tls.tls_contexts(b"tls:another-cluster-token-0123456789")
    assert other[1].get_ca_certs() != first[1].get_ca_certs()


def test_a_process_without_cryptography_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "cryptography", None)  # import fails
    with pytest.raises(tls.TlsUnavailableError, match=r"pip install 'tray\[tls\]'"):
        tls.tls_contexts(b"tls:a-token-never-seen-before-0123456789")


def test_tls_is_the_default_off_loopback_and_its_absence_is_warned(capsys):
    from tray.scripts import cluster

    def head(**options):
        return cluster._head_token(argparse.Namespace(
            **{"token_file": None, "tls": None, "node_ip": "127.0.0.1", **options}))

    assert not head().startswith("tls:")  # loopback: nobody on the path
    assert head(node_ip="10.1.2.3").startswith("tls:")
    assert head(tls=True).startswith("tls:")
    assert capsys.readouterr().err == ""
    assert not head(node_ip="10.1.2.3", tls=False).startswith("tls:")
    assert "use --tls" in capsys.readouterr().err


def test_a_joining_node_follows_the_heads_tls_choice(tmp_path):
    result = _cli(tmp_path / "sessions", "start", "--address", "127.0.0.1:6380", "--tls")
    assert result.returncode == 2
    assert "chosen by the head" in result.stderr


def _cli(root, *args, env_extra=None):
    env = {**os.environ, "TRAY_SESSION_ROOT": str(root), **(env_extra or {})}
    env.pop("TRAY_CLUSTER_TOKEN", None)
    env.update(env_extra or {})
    return subprocess.run([sys.executable, "-m", "tray.scripts.cli", *args], env=env,
                          capture_output=True, text=True, timeout=120)


def test_tray_start_tls_cluster_runs_tasks_and_refuses_plain_peers(tmp_path, monkeypatch):
    root = tmp_path / "sessions"
    port = free_port()
    started = _cli(root, "start", "--head", "--tls", "--port", str(port), "--num-cpus", "1")
    assert started.returncode == 0, started.stderr
    assert "(TLS)" in started.stdout
    try:
        token = next(line.split("TRAY_CLUSTER_TOKEN=")[1].split()[0]
                     for line in started.stdout.splitlines() if "TRAY_CLUSTER_TOKEN=" in line)
        assert token.startswith("tls:")
        joined = _cli(root, "start", "--address", f"127.0.0.1:{port}", "--num-cpus", "1",
                      env_extra={"TRAY_CLUSTER_TOKEN": token})
        assert joined.returncode == 0, joined.stderr

        # Every TCP listener of the cluster asks for TLS.
        async def preamble_of(port_: int) -> bytes:
            stream = await trio.open_tcp_stream("127.0.0.1", port_)
            await stream.send_all(b"TRAY/2 RAW\n")
            with trio.fail_after(10):
                answer = await stream.receive_some(64)
            await stream.aclose()
            return answer

        assert trio.run(preamble_of, port) == b"TRAY/2 TLS\n"
        node_ports = {conn.laddr.port for process in psutil.process_iter()
                      if str(root) in " ".join(_cmdline(process))
                      for conn in _listening(process)}
        assert len(node_ports) >= 3  # GCS, two node managers (and workers)
        assert {trio.run(preamble_of, p) for p in node_ports} == {b"TRAY/2 TLS\n"}

        monkeypatch.setenv("TRAY_CLUSTER_TOKEN", token)
        tray.init(address=f"127.0.0.1:{port}")
        try:
            @tray.remote
            def total(array):
                return float(array.sum())

            refs = [total.remote(np.ones(500_000)) for _ in range(4)]
            assert tray.get(refs) == [500_000.0] * 4
            assert len(tray.nodes()) == 2
        finally:
            tray.shutdown()
    finally:
        _cli(root, "stop")


def _cmdline(process: psutil.Process) -> list[str]:
    try:
        return process.cmdline()
    except psutil.Error:
        return []


def _listening(process: psutil.Process) -> list:
    try:
        return [c for c in process.net_connections("tcp") if c.status == psutil.CONN_LISTEN]
    except psutil.Error:
        return []
