"""Message streams over one socket (or TLS channel): writing and reading.

A task or actor call is a few hundred bytes, and what it costs is mostly
syscalls and the wake-ups they cause, not bytes: a small message goes out in
one write (header, pickle and small buffers joined), and messages queued
while a write is in progress go out together in the next one, through one
writer task per connection and its bounded queue (``TcpStream`` says how).
On the other side one read takes whatever the kernel holds and every whole
message in it is parsed without another read.

A plain socket's queued messages are written at the end of each pass of the
trio loop (``_TickFlush``)."""

from __future__ import annotations

import contextlib
import logging
import os
import pickle
import struct
from collections import deque

import trio

from ..core.interfaces import ConnectionClosed
from . import fork_safety
from .fork_safety import _exit_forked_child
from .tcp_framing import MalformedFrame, _encode, _Reader

logger = logging.getLogger("tray.transport")

# trio's SSLStream encrypts all of one send_all in memory before sending
# any: big frames go to it in pieces.
_TLS_SEND_CHUNK_BYTES = 1 << 20
# What one connection may hold queued for writing: past it, senders wait
# for the writer (backpressure from a slow peer). A single larger message
# is still taken when nothing else is queued.
outgoing_bytes_max = 8 << 20


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
