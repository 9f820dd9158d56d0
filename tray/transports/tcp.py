"""Streams over Unix sockets (one machine) and TCP (between machines).

Addresses are ``unix:/path/to/socket`` or ``tcp:host:port``.

Framing
-------
Every message is pickled with protocol 5; its out-of-band buffers (NumPy and
Arrow data inside objects) are not copied into the pickle but sent as frames
of their own. On the wire a message is

    header  = u32 frame count N, then N x u64 frame sizes
    frame 0 = the pickle stream, frames 1..N-1 = the buffers

A message larger than ``frame_bytes_max`` or with more than
``frames_per_message_max`` frames is malformed: that connection is closed
with a log line, and the process goes on.

Writing and reading
-------------------
A task or actor call is a few hundred bytes, and what it costs is mostly
syscalls and the wake-ups they cause, not bytes: a small message goes out in
one write (header, pickle and small buffers joined), and messages queued
while a write is in progress go out together in the next one, through one
writer task per connection and its bounded queue (``TcpStream`` says how).
On the other side one read takes whatever the kernel holds and every whole
message in it is parsed without another read.

Authentication
--------------
Messages carry pickles, and loading a pickle runs code, so nothing is loaded
from a peer before it has proved that it knows the cluster's token. The
handshake (docs/security.md gives the argument and compares it with SCRAM,
TLS 1.3 and Noise) is

    client -> server   "TRAY/2 RAW\\n" or "TRAY/2 TLS\\n"     (the client's mode)
    server -> client   the server's mode; different modes end the handshake
                       [TLS: a TLS 1.3 handshake, both sides show certificates]
    client -> server   peer name P (the address it meant to reach), nonce Nc
    server -> client   nonce Ns
    client -> server   HMAC(token, "client" | mode | P | Nc | Ns)
    server -> client   status byte; if accepted, HMAC(token, "server" | mode | P | Nc | Ns)

The client proves first, so the server is never an oracle that answers for
nonces of the caller's choosing before the caller has proved anything; each
proof covers both nonces (fresh in this session), the signer's role (a proof
cannot be reflected back in the other direction) and P, which the server
checks against its own addresses: a client tricked into connecting to a relay
signs the relay's address, which the real server refuses. What the handshake
alone cannot stop is an attacker on the network path taking over a connection
after it was authenticated; between machines on a network you do not trust,
use TLS.

Limits
------
A connection that never finishes its handshake holds a descriptor until
``auth_timeout_s``. At most ``handshakes_per_listener_max`` handshakes are in
progress per listener and ``handshakes_per_source_max`` per source IP; past
that, the oldest is shed (a real peer finishes in milliseconds, so the oldest
are the idle ones), and new clients still get in.

TLS (``tls``) and fork safety (``fork_safety``) live in their own modules."""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import hmac
import ipaddress
import logging
import os
import pickle
import resource
import secrets
import ssl
import struct
from collections import deque

import trio

from ..core.interfaces import ConnectionClosed
from . import fork_safety
from .fork_safety import _exit_forked_child, _track
from .tls import TLS_TOKEN_PREFIX, tls_contexts

logger = logging.getLogger("tray.transport")

NONCE_BYTES = 32
PROOF_BYTES = 32  # HMAC-SHA256
PEER_NAME_BYTES_MAX = 1024
frame_bytes_max = 1 << 34  # 16 GiB: one message, all frames together
frames_per_message_max = 1 << 16
auth_timeout_s = 10.0

_PREAMBLE_RAW = b"TRAY/2 RAW\n"
_PREAMBLE_TLS = b"TRAY/2 TLS\n"
_PREAMBLE_BYTES = len(_PREAMBLE_RAW)
_ACCEPTED, _WRONG_PROOF, _WRONG_PEER = b"\x00", b"\x01", b"\x02"


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


class AuthenticationError(ConnectionClosed):
    """The peer does not know the cluster's token (or the handshake failed)."""


class WrongPeerError(ConnectionClosed):
    """The process that answered is not the one this connection was meant
    for: a relay, or an address that reaches it only through NAT or a proxy.
    (Not an AuthenticationError: the token may well be right.)"""


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


# ================================================================== streams


class _Reader:
    """The bytes received from one stream and not consumed yet.

    One ``receive_some`` takes everything the kernel holds (up to 64 KiB, or
    what the message being read still needs), and ``next_message`` parses as
    many whole messages out of it as there are without another read: a
    burst of small messages costs one syscall, not one per frame. Consumed
    bytes are skipped with an offset and cut off once in a while, not
    moved after every message."""

    # Consumed bytes are cut off the front when they reach this much (or
    # when everything was consumed, which costs nothing).
    _COMPACT_BYTES = 1 << 20

    # A message whose body is at least this large is read frame by frame
    # straight into memory of its own (``recv_into``), not through the
    # buffer: measured, a big frame was copied three times on its way in
    # (the read's bytes, appended to the buffer, sliced out of it).
    _DIRECT_BYTES = 1 << 20

    def __init__(self, stream: trio.abc.Stream) -> None:
        self._stream = stream
        # The socket under a plain stream (TLS records must go through the
        # SSL object: no direct reads there).
        socket = getattr(stream, "socket", None)
        self._socket = socket if isinstance(socket, trio.socket.SocketType) else None
        self._buffer = bytearray()
        self._start = 0  # the first byte not consumed yet
        # A TLS read returns one record (16 KiB) but allocates what it is
        # asked for: ask for little. A socket read returns what it can.
        self._receive_bytes_max = 1 << 18 if isinstance(stream, trio.SSLStream) else 1 << 62

    @property
    def buffered_bytes(self) -> int:
        return len(self._buffer) - self._start

    async def fill(self, size: int) -> None:
        """Receive until at least ``size`` bytes are buffered."""
        while self.buffered_bytes < size:
            chunk = await self._stream.receive_some(
                min(self._receive_bytes_max, max(65536, size - self.buffered_bytes)))
            if not chunk:
                raise ConnectionClosed("the peer closed the connection")
            self._buffer += chunk

    def _consume(self, size: int) -> bytearray:
        data = self._buffer[self._start:self._start + size]
        self._start += size
        if self._start == len(self._buffer):
            self._buffer.clear()
            self._start = 0
        elif self._start >= self._COMPACT_BYTES:
            del self._buffer[:self._start]
            self._start = 0
        return data

    async def exactly(self, size: int) -> bytearray:
        await self.fill(size)
        return self._consume(size)

    async def message(self) -> list:
        """The frames of the next message (waits for all of it). Raises
        MalformedFrame."""
        while True:
            frames, needed = self.next_message()
            if frames is not None:
                return frames
            if needed >= self._DIRECT_BYTES and self._socket is not None and \
                    self._header() is not None:
                return await self._receive_direct()
            await self.fill(needed)

    def _header(self) -> tuple[int, tuple] | None:
        """(header bytes, frame sizes) of the next message, once buffered
        (``next_message`` checked them)."""
        if self.buffered_bytes < 4:
            return None
        (count,) = struct.unpack_from("<I", self._buffer, self._start)
        header_bytes = 4 + 8 * count
        if self.buffered_bytes < header_bytes:
            return None
        return header_bytes, struct.unpack_from(f"<{count}Q", self._buffer, self._start + 4)

    async def _receive_direct(self) -> list:
        header_bytes, sizes = self._header()
        self._consume(header_bytes)
        frames = []
        for size in sizes:
            # (A bytearray, from the heap: measured, fresh anonymous pages per
            # frame cost more in page faults than zeroing reused memory.)
            frame = bytearray(size)
            have = min(self.buffered_bytes, size)
            frame[:have] = self._consume(have)
            view = memoryview(frame)
            while have < size:
                received = await self._socket.recv_into(view[have:], size - have)
                if not received:
                    raise ConnectionClosed("the peer closed the connection")
                have += received
            frames.append(frame)
        return frames

    def next_message(self) -> tuple[list | None, int]:
        """(the frames of the next message, 0) if it is all buffered, else
        (None, how many buffered bytes it needs). Raises MalformedFrame."""
        available = self.buffered_bytes
        if available < 4:
            return None, 4
        buffer, start = self._buffer, self._start
        (count,) = struct.unpack_from("<I", buffer, start)
        if not 1 <= count <= frames_per_message_max:
            raise MalformedFrame(f"{count} frames")
        header_bytes = 4 + 8 * count
        if available < header_bytes:
            return None, header_bytes
        sizes = struct.unpack_from(f"<{count}Q", buffer, start + 4)
        total = sum(sizes)
        if total > frame_bytes_max:
            raise MalformedFrame(f"a message of {total} bytes")
        if available < header_bytes + total:
            return None, header_bytes + total
        self._consume(header_bytes)
        return [self._consume(size) for size in sizes], 0


# trio's SSLStream encrypts all of one send_all in memory before sending
# any: big frames go to it in pieces.
_TLS_SEND_CHUNK_BYTES = 1 << 20
# Out-of-band buffers up to this size are copied into the message's one
# write; larger ones are written from the sender's memory (no copy), and
# their sender waits until they are written (it may free or reuse that
# memory as soon as send returns, as it always could).
_COPY_BUFFER_BYTES_MAX = 1 << 16
# What one connection may hold queued for writing: past it, senders wait
# for the writer (backpressure from a slow peer). A single larger message
# is still taken when nothing else is queued.
outgoing_bytes_max = 8 << 20


def _encode(message) -> tuple[list, bool]:
    """A message as the chunks to write: (chunks, whether a chunk is a view
    of the sender's memory). Small messages are one bytes object, header
    and all."""
    buffers: list = []
    data = pickle.dumps(message, protocol=5, buffer_callback=buffers.append)
    if not buffers:
        return [struct.pack("<IQ", 1, len(data)) + data], False
    frames = [memoryview(data)] + [b.raw() for b in buffers]
    header = struct.pack(f"<I{len(frames)}Q", len(frames), *(f.nbytes for f in frames))
    chunks: list = []
    small = [header]
    for frame in frames:
        if frame.nbytes <= _COPY_BUFFER_BYTES_MAX:
            small.append(frame)
        else:
            chunks.append(b"".join(small))
            small = []
            chunks.append(frame)
    if small:
        chunks.append(b"".join(small))
    return chunks, len(chunks) > 1


class _TickFlush(trio.abc.Instrument):
    """Writes the streams' queued messages at the end of each pass of a trio
    run's event loop, right before it waits for I/O (``before_io_wait``, an
    instrument's hook: trio calls it once a pass, and no other hook of this
    instrument is called). Every message that the pass's tasks queued on a
    connection leaves in one write, and the writer task is woken only for
    what the kernel did not take. Before it, each burst queued woke the
    connection's writer, which wrote it in the next pass: a task step, and a
    pass of latency, per burst. An actor answering a pipelined burst of
    1,000-call batches (its executor queues each reply) wrote 143 times for
    10,053 replies with it, against one write per reply when each call's
    task wrote its own (bench/README.md, 2026-11-28)."""

    _of_run = trio.lowlevel.RunVar("tray_tick_flush")

    def __init__(self) -> None:
        self.streams: list[TcpStream] = []  # those with messages queued in this pass

    @classmethod
    def of_this_run(cls) -> _TickFlush:
        try:
            return cls._of_run.get()
        except LookupError:
            flush = cls()
            cls._of_run.set(flush)
            trio.lowlevel.add_instrument(flush)
            return flush

    def before_io_wait(self, timeout: float) -> None:
        if self.streams and self.flush_now() and timeout > 0:
            # trio chose how long to wait for I/O before this hook, when the
            # tasks woken here were not runnable yet: end that wait at once.
            trio.lowlevel.current_trio_token().run_sync_soon(_nothing)

    def flush_now(self) -> bool:
        """Write what the streams listed so far have queued (one write each);
        True when that woke a task."""
        streams = self.streams
        self.streams = []
        woke = False
        for stream in streams:
            stream._flush_listed = False
            try:
                woke = stream._flush() or woke
            except Exception:  # noqa: BLE001 - an instrument that raises is removed
                logger.exception("flushing the messages to %s failed", stream.peer)
                stream._wake_writer()
                woke = True
        return woke


def _nothing() -> None:
    pass


class TcpStream:
    """A message stream over one socket (or TLS channel).

    Messages are queued on the connection's outgoing queue and leave in
    the order they were sent. ``send_nowait`` (the RPC layer's replies and
    started calls) queues a message and returns. On a plain socket the
    queue is written at the end of the event loop's pass, right before trio
    waits for I/O (``_TickFlush``): every message that the pass's tasks
    queued leaves in one write (the replies to a burst of requests that
    arrived in one read, the calls a driver started from one batch), and a
    write the kernel takes at once costs no task step at all. What the
    kernel does not take at once (a full socket), a large out-of-band
    buffer, and everything on a TLS stream, the connection's writer task
    writes. ``send`` returns once its message is written, as it always did
    (a process may end right after it), and when nothing is queued or being
    written it writes itself, header and payload in one write, with no
    pass of the event loop when the kernel takes it at once
    (``_send_small``). The queue holds at most ``outgoing_bytes_max`` bytes:
    past that, ``send`` waits and ``send_nowait`` declines. Large
    out-of-band buffers (NumPy and Arrow data) are written from the
    sender's memory, never copied into the queue.

    A write that fails (the peer is gone, the connection was reset) fails
    everything queued behind it: the stream closes, later sends raise
    ConnectionClosed, and the reading side ends too (which is how the RPC
    layer learns that calls in flight on it will get no reply — as when a
    send failed before)."""

    def __init__(self, stream: trio.abc.Stream, peer: str, reader: _Reader) -> None:
        self._stream = stream
        self._chunk_bytes = _TLS_SEND_CHUNK_BYTES if isinstance(stream, trio.SSLStream) else 0
        # The socket under a plain stream, which small messages are written
        # to directly (``_send_small``); None under TLS.
        self._socket = reader._socket
        # This trio run's end-of-pass flush (plain sockets only), and whether
        # this stream is on its list for the current pass.
        self._tick_flush = _TickFlush.of_this_run() if self._socket is not None else None
        self._flush_listed = False
        # The handshake's reader: it may already hold the first message's bytes.
        self._reader = reader
        self.peer = peer
        self.closed = False
        self._failure: str | None = None  # why writing stopped
        # Chunks to write: bytes, memoryviews, and trio.Events to set once
        # everything queued before them is written.
        self._outgoing: deque = deque()
        self._outgoing_bytes = 0
        self._writer_started = False
        self._busy = False  # a write is in progress (the writer's or a sender's own)
        self._writer_idle: trio.Event | None = None  # set to wake the idle writer
        self._space = trio.lowlevel.ParkingLot()  # senders waiting for room
        self._drained = trio.lowlevel.ParkingLot()  # aclose waiting for the queue
        self.writes = 0  # socket writes (send_all calls), for tests and benches
        self.messages_sent = 0

    # ------------------------------------------------------------ sending

    def _check_open(self) -> None:
        if fork_safety._forked_child:
            _exit_forked_child()
        if self.closed:
            raise ConnectionClosed(f"sending to {self.peer}: "
                                   f"{self._failure or 'the connection is closed'}")

    def _queue(self, chunks: list, written: trio.Event | None = None) -> None:
        for chunk in chunks:
            self._outgoing.append(chunk)
            self._outgoing_bytes += len(chunk) if isinstance(chunk, bytes) else chunk.nbytes
        if written is not None:
            self._outgoing.append(written)
        self.messages_sent += 1
        if not self._writer_started:
            self._writer_started = True
            trio.lowlevel.spawn_system_task(self._write_loop, name=f"tray writer {self.peer}")
        if self._tick_flush is not None and not self._busy:
            if not self._flush_listed:
                self._flush_listed = True
                self._tick_flush.streams.append(self)
        else:
            self._wake_writer()

    def _flush(self) -> bool:
        """Write the queue's leading small messages in one write (a plain
        socket): at the end of the event loop's pass (``_TickFlush``), or
        first thing in ``send``. What the kernel does not take at once, and
        what follows a large buffer, is left queued for the writer task,
        which waits for room (or meets the error and fails the stream, as
        it does for its own writes). True when it woke a task."""
        outgoing = self._outgoing
        if self._busy or self.closed or not outgoing:
            return False  # (the writer, or a sender writing, takes what is queued)
        joined: list = []
        written: list = []
        while outgoing and not isinstance(outgoing[0], memoryview):
            chunk = outgoing.popleft()
            (written if isinstance(chunk, trio.Event) else joined).append(chunk)
        data = joined[0] if len(joined) == 1 else b"".join(joined)
        sent = 0
        fd = self._socket.fileno()
        if data and fd >= 0:
            self.writes += 1
            try:
                sent = os.write(fd, data)
            except OSError:  # full (the writer waits for room), or broken (it fails)
                pass
        woke = False
        if sent:
            self._outgoing_bytes -= sent
            if self._space:
                woke = True
                self._space.unpark_all()
        if sent < len(data) or outgoing:
            outgoing.extendleft(reversed(written))
            if sent < len(data):
                outgoing.appendleft(data[sent:])
            woke = woke or self._writer_idle is not None
            self._wake_writer()
            return woke
        for event in written:
            event.set()
        if self._drained:
            self._drained.unpark_all()
            woke = True
        return woke or bool(written)

    def _wake_writer(self) -> None:
        if self._writer_idle is not None and self._outgoing:
            self._writer_idle.set()
            self._writer_idle = None

    def _has_room(self) -> bool:
        return self._outgoing_bytes < outgoing_bytes_max

    async def send(self, message) -> None:
        """Returns once the message is written (handed to the kernel), as a
        send always did: a process may end right after it. The fast path,
        nobody writing: the caller writes its message itself, in one write."""
        self._check_open()
        chunks, _ = _encode(message)
        if self._outgoing and not self._busy and self._tick_flush is not None \
                and self._has_room():
            # Messages queued in this pass: it leaves with them, now, in one write.
            written = trio.Event()
            self._queue(chunks, written)
            self._flush()
            if not written.is_set():
                await written.wait()
            self._check_open()
            return
        if not self._busy and not self._outgoing:
            self._busy = True
            self.messages_sent += 1
            try:
                for chunk in chunks:
                    if isinstance(chunk, memoryview):
                        await self._write_large(chunk, counted=False)
                    else:
                        self.writes += 1
                        await self._send_small(chunk)
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as error:
                await self._fail(str(error) or type(error).__name__)
                self._check_open()
            finally:
                self._busy = False
                self._wake_writer()
            return
        while not self._has_room():
            await self._space.park()
            self._check_open()
        written = trio.Event()
        self._queue(chunks, written)
        await written.wait()
        self._check_open()

    def send_nowait(self, message) -> bool:
        """Queue a message, if there is room and it borrows no memory of the
        caller's: True, and the writer task writes it with whatever else is
        queued by then. False when the caller must use ``send``."""
        self._check_open()
        if not self._has_room():
            return False
        chunks, borrowed = _encode(message)
        if borrowed:
            return False
        self._queue(chunks)
        return True

    async def _write_loop(self) -> None:
        """The connection's writer (a system task: no caller's cancel scope
        ends it halfway through a message). Runs until the stream closes or
        a write fails."""
        outgoing = self._outgoing
        written: list = []  # the Events of senders waiting for this batch
        try:
            while True:
                if not outgoing or self._busy:
                    if not outgoing and not self._busy:
                        self._drained.unpark_all()
                    if self.closed:
                        return
                    # Woken by the next message queued, or by a sender that
                    # wrote its own message and found more queued behind it.
                    self._writer_idle = trio.Event()
                    await self._writer_idle.wait()
                    continue
                # Everything queued now, small chunks joined into one write.
                self._busy = True
                joined: list = []
                written = []
                while outgoing:
                    chunk = outgoing.popleft()
                    if isinstance(chunk, trio.Event):
                        written.append(chunk)
                    elif isinstance(chunk, memoryview):
                        await self._write(joined)
                        joined = []
                        await self._write_large(chunk)
                    else:
                        joined.append(chunk)
                await self._write(joined)
                for event in written:
                    event.set()
                written = []
                self._busy = False
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as error:
            await self._fail(str(error) or type(error).__name__, written)
        except trio.Cancelled:
            raise
        except BaseException as error:  # a system task must never crash the process
            logger.exception("the writer to %s failed", self.peer)
            await self._fail(repr(error), written)

    async def _write(self, chunks: list) -> None:
        if not chunks:
            return
        data = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        self.writes += 1
        await self._send_small(data)
        self._outgoing_bytes -= len(data)
        self._space.unpark_all()

    async def _send_small(self, data: bytes) -> None:
        """Write ``data`` whole. On a plain socket it goes to the kernel
        directly: trio's ``send_all`` yields to the scheduler after every
        write that did not block (a checkpoint), one more pass of the event
        loop per message, and the task's next step; here only a full
        socket waits (until it is writable). So a write that the kernel
        takes at once is no checkpoint: the writer task waits for its next
        batch right after, and a caller of ``send`` goes on at once, as after
        ``send_nowait``."""
        sock = self._socket
        if sock is None:
            await self._stream.send_all(data)
            return
        while True:
            fd = sock.fileno()
            if fd < 0:  # (never write to a number that may be another file's by now)
                raise trio.ClosedResourceError("the socket was closed")
            try:
                sent = os.write(fd, data)
            except BlockingIOError:
                sent = 0
            if sent == len(data):
                return
            data = memoryview(data)[sent:]
            await trio.lowlevel.wait_writable(sock)

    async def _write_large(self, frame: memoryview, counted: bool = True) -> None:
        self.writes += 1
        if self._chunk_bytes and frame.nbytes > self._chunk_bytes:
            frame = frame.cast("B")
            for start in range(0, frame.nbytes, self._chunk_bytes):
                await self._stream.send_all(frame[start:start + self._chunk_bytes])
        else:
            await self._stream.send_all(frame)
        if counted:
            self._outgoing_bytes -= frame.nbytes
            self._space.unpark_all()

    async def _fail(self, why: str, waiting: list = ()) -> None:
        """A write failed: what is queued is lost, every waiting sender
        (those of the batch being written, ``waiting``, and those queued)
        learns it, and the stream closes (the reader ends with it)."""
        if self._failure is None:
            self._failure = why
        self.closed = True
        for event in waiting:
            event.set()
        for chunk in self._outgoing:
            if isinstance(chunk, trio.Event):
                chunk.set()  # its sender sees the stream closed
        self._outgoing.clear()
        self._outgoing_bytes = 0
        self._space.unpark_all()
        self._drained.unpark_all()
        with trio.CancelScope(shield=True):
            with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError,
                                     OSError):
                await self._stream.aclose()

    # ---------------------------------------------------------- receiving

    async def receive(self):
        if fork_safety._forked_child:
            _exit_forked_child()
        try:
            frames = await self._reader.message()
            return pickle.loads(frames[0], buffers=frames[1:])
        except MalformedFrame as error:
            logger.error("malformed message from %s (%s): closing the connection", self.peer,
                         error)
            await self.aclose()
            raise
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as error:
            self._reading_ended()
            raise ConnectionClosed(f"receiving from {self.peer}: {error}") from None
        except ConnectionClosed:  # the peer closed the connection
            self._reading_ended()
            raise
        except (pickle.UnpicklingError, EOFError, ValueError, struct.error) as error:
            logger.error("undecodable message from %s (%s): closing the connection",
                         self.peer, error)
            await self.aclose()
            raise MalformedFrame(str(error)) from None

    def _reading_ended(self) -> None:
        """The peer closed the connection (or it broke): nothing more is
        sent on it, and the writer ends once it has tried what is queued (a
        stream nobody closes must not keep its socket through its writer)."""
        self.closed = True
        if self._writer_idle is not None:
            self._writer_idle.set()
            self._writer_idle = None

    async def aclose(self) -> None:
        """Close after what is queued is written (for at most
        ``close_flush_timeout_s``: a peer that reads nothing does not hold
        the close up)."""
        with trio.CancelScope(shield=True):
            if self._outgoing_bytes and self._failure is None and self._writer_started:
                with trio.move_on_after(close_flush_timeout_s):
                    while self._outgoing_bytes and self._failure is None:
                        await self._drained.park()
            self.closed = True
            if self._writer_idle is not None:
                self._writer_idle.set()
                self._writer_idle = None
            try:
                await self._stream.aclose()
            except (trio.BrokenResourceError, OSError):
                pass


# How long closing a stream waits for its queued messages to be written.
close_flush_timeout_s = 1.0


# ================================================================ handshake


def _length_prefixed(*fields: bytes) -> bytes:
    return b"".join(struct.pack("<I", len(field)) + field for field in fields)


def _proof(token: bytes, signer: bytes, mode: bytes, peer: bytes, client_nonce: bytes,
           server_nonce: bytes) -> bytes:
    """What one side signs: the protocol, the signer's role, the mode (TLS or
    not), the server address the client meant to reach, and both nonces.
    Length prefixes keep the fields from sliding into each other."""
    transcript = b"tray handshake/2\0" + _length_prefixed(signer, mode, peer, client_nonce,
                                                          server_nonce)
    return hmac.new(token, transcript, hashlib.sha256).digest()


def _mode_name(preamble: bytes) -> str:
    return "TLS" if preamble == _PREAMBLE_TLS else "no TLS"


async def _server_handshake(stream: trio.abc.Stream, token: bytes,
                            tls: ssl.SSLContext | None, names: frozenset[bytes]
                            ) -> tuple[trio.abc.Stream, _Reader]:
    reader = _Reader(stream)
    theirs = bytes(await reader.exactly(_PREAMBLE_BYTES))
    if theirs not in (_PREAMBLE_RAW, _PREAMBLE_TLS):
        raise AuthenticationError("not a tray/2 handshake (an older tray, or not tray)")
    mine = _PREAMBLE_TLS if tls is not None else _PREAMBLE_RAW
    await stream.send_all(mine)
    if theirs != mine:
        raise AuthenticationError(f"the client speaks {_mode_name(theirs)}, this cluster "
                                  f"{_mode_name(mine)}: its token is not this cluster's")
    if tls is not None:
        assert reader.buffered_bytes == 0, "the client sent TLS bytes before our preamble"
        stream = trio.SSLStream(stream, tls, server_side=True)
        await stream.do_handshake()
        reader = _Reader(stream)
    (peer_bytes,) = struct.unpack("<H", await reader.exactly(2))
    if peer_bytes > PEER_NAME_BYTES_MAX:
        raise AuthenticationError(f"a peer name of {peer_bytes} bytes")
    peer = bytes(await reader.exactly(peer_bytes))
    client_nonce = bytes(await reader.exactly(NONCE_BYTES))
    server_nonce = secrets.token_bytes(NONCE_BYTES)
    await stream.send_all(server_nonce)
    proof = bytes(await reader.exactly(PROOF_BYTES))
    # Nothing that depends on the token leaves this process before the
    # client's proof is checked.
    if peer not in names:
        await stream.send_all(_WRONG_PEER)
        raise WrongPeerError(f"the client meant to reach {peer.decode(errors='replace')}, "
                             f"not this process ({', '.join(sorted(n.decode() for n in names))})"
                             ": a relay, or an address behind NAT or a proxy")
    if not hmac.compare_digest(proof, _proof(token, b"client", mine, peer, client_nonce,
                                             server_nonce)):
        await stream.send_all(_WRONG_PROOF)
        raise AuthenticationError("the client does not know this cluster's token")
    await stream.send_all(_ACCEPTED + _proof(token, b"server", mine, peer, client_nonce,
                                             server_nonce))
    return stream, reader


async def _client_handshake(stream: trio.abc.Stream, token: bytes,
                            tls: ssl.SSLContext | None, peer: bytes
                            ) -> tuple[trio.abc.Stream, _Reader]:
    reader = _Reader(stream)
    mine = _PREAMBLE_TLS if tls is not None else _PREAMBLE_RAW
    await stream.send_all(mine)
    theirs = bytes(await reader.exactly(_PREAMBLE_BYTES))
    if theirs not in (_PREAMBLE_RAW, _PREAMBLE_TLS):
        raise AuthenticationError("the server does not speak tray/2 (an older tray, or not "
                                  "tray)")
    if theirs != mine:
        if theirs == _PREAMBLE_TLS:
            raise AuthenticationError(
                "the cluster uses TLS and this token does not: use the token that "
                "'tray start --head --tls' printed (it begins with 'tls:')")
        raise AuthenticationError("this token asks for TLS but the server does not use it: "
                                  "refusing to talk without TLS")
    if tls is not None:
        stream = trio.SSLStream(stream, tls, server_side=False)
        await stream.do_handshake()
        reader = _Reader(stream)
    client_nonce = secrets.token_bytes(NONCE_BYTES)
    await stream.send_all(struct.pack("<H", len(peer)) + peer + client_nonce)
    server_nonce = bytes(await reader.exactly(NONCE_BYTES))
    await stream.send_all(_proof(token, b"client", mine, peer, client_nonce, server_nonce))
    status = bytes(await reader.exactly(1))
    if status == _WRONG_PEER:
        raise WrongPeerError(f"the process that answered is not {peer.decode()}: the "
                             "connection went through a relay, NAT or a proxy")
    if status != _ACCEPTED:
        raise AuthenticationError("the cluster rejected this token")
    proof = bytes(await reader.exactly(PROOF_BYTES))
    if not hmac.compare_digest(proof, _proof(token, b"server", mine, peer, client_nonce,
                                             server_nonce)):
        raise AuthenticationError("the server does not know this cluster's token")
    return stream, reader


# ================================================================ transport


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
