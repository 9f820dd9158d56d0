"""Streams over Unix sockets (one machine) and TCP (between machines).

Addresses are ``unix:/path/to/socket`` or ``tcp:host:port``.

Framing: every message is pickled with protocol 5; its out-of-band buffers
(NumPy and Arrow data inside objects) are not copied into the pickle but sent
as frames of their own. On the wire a message is

    header  = u32 frame count N, then N x u64 frame sizes
    frame 0 = the pickle stream, frames 1..N-1 = the buffers

A message larger than ``frame_bytes_max`` or with more than
``frames_per_message_max`` frames is malformed: that connection is closed
with a log line, and the process goes on.

Authentication: messages carry pickles, so no pickle is loaded from a peer
before it proves it knows the cluster's token. Both sides send a random
nonce and answer the other's with HMAC-SHA256(token, role + nonce)."""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import pickle
import secrets
import struct

import trio

from ..core.interfaces import ConnectionClosed

logger = logging.getLogger("tray.transport")

NONCE_BYTES = 32
frame_bytes_max = 1 << 34  # 16 GiB: one message, all frames together
frames_per_message_max = 1 << 16
auth_timeout_s = 10.0


class AuthenticationError(ConnectionClosed):
    """The peer does not know the cluster's token."""


class MalformedFrame(ConnectionClosed):
    """The peer sent bytes that are not a tray message."""


def parse_address(address: str) -> tuple[str, str, int]:
    kind, _, rest = address.partition(":")
    if kind == "unix" and rest:
        return "unix", rest, 0
    if kind == "tcp":
        host, _, port = rest.rpartition(":")
        if host and port.isdigit():
            return "tcp", host, int(port)
    raise ValueError(f"bad address {address!r}: use unix:/path or tcp:host:port")


class _Reader:
    def __init__(self, stream: trio.abc.Stream) -> None:
        self._stream = stream
        self._buffer = bytearray()

    async def exactly(self, size: int) -> bytearray:
        while len(self._buffer) < size:
            chunk = await self._stream.receive_some(max(65536, size - len(self._buffer)))
            if not chunk:
                raise ConnectionClosed("the peer closed the connection")
            self._buffer += chunk
        data = self._buffer[:size]
        del self._buffer[:size]
        return data


class TcpStream:
    def __init__(self, stream: trio.abc.Stream, peer: str, reader: _Reader) -> None:
        self._stream = stream
        # The handshake's reader: it may already hold the first message's bytes.
        self._reader = reader
        self._send_lock = trio.Lock()
        self.peer = peer
        self.closed = False

    async def send(self, message) -> None:
        buffers: list = []
        data = pickle.dumps(message, protocol=5, buffer_callback=buffers.append)
        frames = [memoryview(data)] + [b.raw() for b in buffers]
        header = struct.pack(f"<I{len(frames)}Q", len(frames), *(f.nbytes for f in frames))
        async with self._send_lock:
            try:
                await self._stream.send_all(header)
                for frame in frames:
                    await self._stream.send_all(frame)
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as error:
                self.closed = True
                raise ConnectionClosed(f"sending to {self.peer}: {error}") from None

    async def receive(self):
        try:
            (count,) = struct.unpack("<I", await self._reader.exactly(4))
            if not 1 <= count <= frames_per_message_max:
                raise MalformedFrame(f"{count} frames")
            sizes = struct.unpack(f"<{count}Q", await self._reader.exactly(8 * count))
            if sum(sizes) > frame_bytes_max:
                raise MalformedFrame(f"a message of {sum(sizes)} bytes")
            frames = [await self._reader.exactly(size) for size in sizes]
            return pickle.loads(frames[0], buffers=frames[1:])
        except MalformedFrame as error:
            logger.error("malformed message from %s (%s): closing the connection", self.peer,
                         error)
            await self.aclose()
            raise
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as error:
            self.closed = True
            raise ConnectionClosed(f"receiving from {self.peer}: {error}") from None
        except (pickle.UnpicklingError, EOFError, ValueError, struct.error) as error:
            logger.error("undecodable message from %s (%s): closing the connection",
                         self.peer, error)
            await self.aclose()
            raise MalformedFrame(str(error)) from None

    async def aclose(self) -> None:
        self.closed = True
        with trio.CancelScope(shield=True):
            try:
                await self._stream.aclose()
            except (trio.BrokenResourceError, OSError):
                pass


def _answer(token: bytes, role: bytes, nonce: bytes) -> bytes:
    return hmac.new(token, role + nonce, hashlib.sha256).digest()


async def _handshake(stream: trio.abc.Stream, token: bytes, server: bool) -> _Reader:
    reader = _Reader(stream)
    mine = secrets.token_bytes(NONCE_BYTES)
    with trio.fail_after(auth_timeout_s):
        await stream.send_all(mine)
        theirs = bytes(await reader.exactly(NONCE_BYTES))
        my_role, their_role = (b"server", b"client") if server else (b"client", b"server")
        await stream.send_all(_answer(token, my_role, theirs))
        proof = bytes(await reader.exactly(32))
    if not hmac.compare_digest(proof, _answer(token, their_role, mine)):
        raise AuthenticationError("the peer does not know this cluster's token")
    return reader


class TcpTransport:
    """The real transport; ``token`` authenticates every connection."""

    def __init__(self, token: bytes) -> None:
        if len(token) < 16:
            raise ValueError("the cluster token must have at least 16 bytes")
        self.token = token

    async def serve(self, address: str, on_stream, *, task_status=trio.TASK_STATUS_IGNORED):
        kind, host_or_path, port = parse_address(address)
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
        task_status.started()
        await trio.serve_listeners(lambda stream: self._accepted(stream, on_stream), listeners)

    async def _accepted(self, stream, on_stream) -> None:
        try:
            reader = await _handshake(stream, self.token, server=True)
        except (ConnectionClosed, trio.TooSlowError, trio.BrokenResourceError, OSError) as error:
            logger.warning("rejected a connection: %s", error)
            with trio.CancelScope(shield=True):
                await stream.aclose()
            return
        wrapped = TcpStream(stream, "?", reader)
        try:
            await on_stream(wrapped)
        except ConnectionClosed as error:  # one bad connection never takes the node down
            logger.warning("connection closed: %s", error)
        finally:
            await wrapped.aclose()

    async def connect(self, address: str) -> TcpStream:
        kind, host_or_path, port = parse_address(address)
        try:
            if kind == "unix":
                stream = await trio.open_unix_socket(host_or_path)
            else:
                stream = await trio.open_tcp_stream(host_or_path, port)
            reader = await _handshake(stream, self.token, server=False)
        except AuthenticationError:
            raise
        except (OSError, trio.BrokenResourceError, trio.TooSlowError, ConnectionClosed) as error:
            raise ConnectionClosed(f"cannot connect to {address}: {error}") from None
        return TcpStream(stream, address, reader)
