"""The transport over Unix sockets (one machine) and TCP (between machines).

Addresses are ``unix:/path/to/socket`` or ``tcp:host:port``. ``TcpTransport``
listens and connects; each connection first runs the token handshake
(``tcp_handshake``, inside TLS when the token asks for it: ``tls``), then
carries messages (``tcp_streams``, framed by ``tcp_framing``). Sockets are
made inert in a child forked inside a task (``fork_safety``).

Limits
------
A connection that never finishes its handshake holds a descriptor until
``auth_timeout_s``. At most ``handshakes_per_listener_max`` handshakes are in
progress per listener and ``handshakes_per_source_max`` per source IP; past
that, the oldest is shed (a real peer finishes in milliseconds, so the oldest
are the idle ones), and new clients still get in."""

from __future__ import annotations

import contextlib
import dataclasses
import ipaddress
import logging
import os
import resource
import ssl

import trio

from ..core.interfaces import ConnectionClosed
from . import fork_safety
from .fork_safety import _exit_forked_child, _track
from .tcp_handshake import AuthenticationError, WrongPeerError, _client_handshake, _server_handshake
from .tcp_streams import TcpStream, _TickFlush
from .tls import TLS_TOKEN_PREFIX, tls_contexts

logger = logging.getLogger("tray.transport")

auth_timeout_s = 10.0


def _default_handshake_limits() -> tuple[int, int]:
    """A quarter of the descriptors this process may open (at most 256, at
    least 16) for handshakes in progress on one listener, a quarter of that
    for one source: idle connections can never take all descriptors."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        soft = 1 << 20
    per_listener = max(16, min(256, soft // 4))
    return per_listener, max(4, per_listener // 4)


# Module-level so that a process (or a test) can lower them before it serves.
handshakes_per_listener_max, handshakes_per_source_max = _default_handshake_limits()


def parse_address(address: str) -> tuple[str, str, int]:
    kind, _, rest = address.partition(":")
    if kind == "unix" and rest:
        return "unix", rest, 0
    if kind == "tcp":
        host, _, port = rest.rpartition(":")
        if host and port.isdigit():
            return "tcp", host, int(port)
    raise ValueError(f"bad address {address!r}: use unix:/path or tcp:host:port")


def _socket_name(sockaddr) -> str:
    """``tcp:IP:PORT`` for a socket address as getsockname/getpeername give
    it; an IPv4 address seen through a dual-stack socket (::ffff:a.b.c.d)
    reads as the IPv4 address, as the other side sees it."""
    host = sockaddr[0]
    with contextlib.suppress(ValueError):
        mapped = getattr(ipaddress.ip_address(host), "ipv4_mapped", None)
        if mapped is not None:
            host = str(mapped)
    return f"tcp:{host}:{sockaddr[1]}"


@dataclasses.dataclass(frozen=True)
class TransportStatistics:
    handshakes_in_progress: int
    handshakes_shed: int  # the oldest, dropped to let a newer one in
    handshakes_rejected: int  # failed: wrong token, wrong peer, timeout, garbage
    connections_open: int  # authenticated, served


class _HandshakeGate:
    """Handshakes in progress on one listener, oldest first."""

    def __init__(self, per_listener_max: int, per_source_max: int) -> None:
        assert per_listener_max >= 1 and per_source_max >= 1
        self.per_listener_max = per_listener_max
        self.per_source_max = per_source_max
        self._in_progress: dict[int, tuple[str | None, trio.CancelScope]] = {}
        self._per_source: dict[str, int] = {}
        self._next_key = 0
        self.shed = 0

    def __len__(self) -> int:
        return len(self._in_progress)

    def admit(self, source: str | None, scope: trio.CancelScope) -> int:
        key = self._next_key
        self._next_key += 1
        self._in_progress[key] = (source, scope)
        if source is not None:
            self._per_source[source] = self._per_source.get(source, 0) + 1
            if self._per_source[source] > self.per_source_max:
                self._shed(next(k for k, (s, _) in self._in_progress.items() if s == source))
        if len(self._in_progress) > self.per_listener_max:
            self._shed(next(iter(self._in_progress)))
        assert len(self._in_progress) <= self.per_listener_max
        return key

    def _shed(self, key: int) -> None:
        self.shed += 1
        self._in_progress[key][1].cancel()
        self.done(key)

    def done(self, key: int) -> None:
        entry = self._in_progress.pop(key, None)
        if entry is not None and entry[0] is not None:
            left = self._per_source[entry[0]] - 1
            if left:
                self._per_source[entry[0]] = left
            else:
                del self._per_source[entry[0]]


class TcpTransport:
    """The real transport; ``token`` authenticates every connection, and a
    token that begins with ``tls:`` puts every TCP connection in TLS 1.3."""

    def __init__(self, token: bytes) -> None:
        if len(token) < 16:
            raise ValueError("the cluster token must have at least 16 bytes")
        self.token = token
        self.uses_tls = token.startswith(TLS_TOKEN_PREFIX)
        self._gates: list[_HandshakeGate] = []
        self._rejected = 0
        self._connections_open = 0

    def statistics(self) -> TransportStatistics:
        return TransportStatistics(
            handshakes_in_progress=sum(len(gate) for gate in self._gates),
            handshakes_shed=sum(gate.shed for gate in self._gates),
            handshakes_rejected=self._rejected, connections_open=self._connections_open)

    def flush_queued(self) -> None:
        """Write what this run's streams queued, now rather than at the end
        of the loop's pass (``_TickFlush``); on the loop only."""
        try:
            flush = _TickFlush._of_run.get()
        except LookupError:
            return  # no stream of this run has queued anything yet
        if flush.streams:
            flush.flush_now()

    def _tls(self, kind: str, server: bool) -> ssl.SSLContext | None:
        if kind != "tcp" or not self.uses_tls:
            return None
        return tls_contexts(self.token)[0 if server else 1]

    async def serve(self, address: str, on_stream, *, task_status=trio.TASK_STATUS_IGNORED):
        kind, host_or_path, port = parse_address(address)
        tls = self._tls(kind, server=True)  # fails here, not per connection, without cryptography
        if kind == "unix":
            if os.path.exists(host_or_path):
                os.unlink(host_or_path)
            sock = trio.socket.socket(trio.socket.AF_UNIX, trio.socket.SOCK_STREAM)
            await sock.bind(host_or_path)
            sock.listen(1024)
            listeners = [trio.SocketListener(sock)]
        else:
            try:
                listeners = await trio.open_tcp_listeners(port, host=host_or_path)
            except OSError as error:
                raise OSError(f"cannot listen on {host_or_path}:{port}: {error.strerror}") from None
        for listener in listeners:
            _track(listener.socket)
        gate = _HandshakeGate(handshakes_per_listener_max, handshakes_per_source_max)
        self._gates.append(gate)
        names = frozenset({address.encode()})
        task_status.started()
        await trio.serve_listeners(
            lambda stream: self._accepted(stream, on_stream, kind, tls, names, gate), listeners)

    async def _accepted(self, stream, on_stream, kind: str, tls, names: frozenset[bytes],
                        gate: _HandshakeGate) -> None:
        _track(stream.socket)
        source = None
        if kind == "tcp":
            try:
                source = stream.socket.getpeername()[0]
                # The address the client reached, as this side sees it: what
                # a client that resolved a host name signs.
                names = names | {_socket_name(stream.socket.getsockname()).encode()}
            except OSError:  # already gone
                await stream.aclose()
                return
        scope = trio.CancelScope(deadline=trio.current_time() + auth_timeout_s)
        key = gate.admit(source, scope)
        failure: BaseException | None = None
        try:
            with scope:
                wrapped_stream, reader = await _server_handshake(stream, self.token, tls,
                                                                 names)
        except (ConnectionClosed, trio.BrokenResourceError, ssl.SSLError, OSError) as error:
            failure = error
        finally:
            gate.done(key)
        shed = failure is None and scope.cancelled_caught and \
            scope.deadline > trio.current_time()
        if failure is None and scope.cancelled_caught and not shed:
            failure = trio.TooSlowError(f"no handshake within {auth_timeout_s} s")
        if shed:
            # Counted by the gate; a flood would make one log line per connection.
            logger.debug("shed a handshake: too many in progress")
        elif failure is not None:
            self._rejected += 1
            logger.warning("rejected a connection: %s", failure)
        if shed or failure is not None:
            with trio.CancelScope(shield=True):
                await stream.aclose()
            return
        wrapped = TcpStream(wrapped_stream, "?", reader)
        self._connections_open += 1
        try:
            await on_stream(wrapped)
        except ConnectionClosed as error:  # one bad connection never takes the node down
            logger.warning("connection closed: %s", error)
        finally:
            self._connections_open -= 1
            await wrapped.aclose()

    async def connect(self, address: str) -> TcpStream:
        if fork_safety._forked_child:
            _exit_forked_child()
        kind, host_or_path, port = parse_address(address)
        tls = self._tls(kind, server=False)
        stream = None
        try:
            if kind == "unix":
                stream = await trio.open_unix_socket(host_or_path)
                peer = address
            else:
                stream = await trio.open_tcp_stream(host_or_path, port)
                peer = _socket_name(stream.socket.getpeername())
            _track(stream.socket)
            with trio.fail_after(auth_timeout_s):
                wrapped_stream, reader = await _client_handshake(stream, self.token, tls,
                                                                 peer.encode())
        except (AuthenticationError, WrongPeerError):
            await _close_quietly(stream)
            raise
        except ssl.SSLError as error:
            await _close_quietly(stream)
            raise AuthenticationError(f"TLS with {address} failed ({error.reason}): the "
                                      "peer is not of this cluster") from None
        except trio.BrokenResourceError as error:
            await _close_quietly(stream)
            if isinstance(error.__cause__, ssl.SSLError):
                raise AuthenticationError(f"TLS with {address} failed "
                                          f"({error.__cause__.reason}): the peer is not of "
                                          "this cluster") from None
            raise ConnectionClosed(f"cannot connect to {address}: {error}") from None
        except (OSError, trio.TooSlowError, ConnectionClosed) as error:
            await _close_quietly(stream)
            raise ConnectionClosed(f"cannot connect to {address}: {error}") from None
        return TcpStream(wrapped_stream, address, reader)


async def _close_quietly(stream) -> None:
    if stream is None:
        return
    with trio.CancelScope(shield=True), contextlib.suppress(trio.BrokenResourceError, OSError):
        await stream.aclose()
