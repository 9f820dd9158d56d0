"""Framing: a message as bytes on the wire, and the bytes read back as messages.

Every message is pickled with protocol 5; its out-of-band buffers (NumPy and
Arrow data inside objects) are not copied into the pickle but sent as frames
of their own. On the wire a message is

    header  = u32 frame count N, then N x u64 frame sizes
    frame 0 = the pickle stream, frames 1..N-1 = the buffers

A message larger than ``frame_bytes_max`` (16 GiB, all frames together: far
above the largest legitimate message, an object chunk of a few MiB or a
value passed in a call) or with more than ``frames_per_message_max`` frames
is malformed: that connection is closed with a log line, and the process
goes on. Below that bound, memory follows what arrives, never what the
header announces: a frame larger than ``_Reader._EXACT_FRAME_BYTES`` grows
as its bytes arrive (``_Reader._receive_growing``), so a peer that announces
gigabytes and sends a few bytes costs a few MiB, and each read is one pass
of the event loop, never a stall of the process.

On the reading side one read takes whatever the kernel holds and every whole
message in it is parsed without another read (``_Reader``); on the writing
side a small message is encoded as one chunk, header and all (``_encode``)."""

from __future__ import annotations

import mmap
import pickle
import struct

import trio

from ..core.interfaces import ConnectionClosed

frame_bytes_max = 1 << 34  # 16 GiB: one message, all frames together
frames_per_message_max = 1 << 16


class MalformedFrame(ConnectionClosed):
    """The peer sent bytes that are not a tray message."""


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

    # A frame up to this size is allocated whole before its bytes arrive (an
    # object chunk is 4 MiB: read straight into its memory); a larger one
    # grows with what arrives (``_receive_growing``). So what a peer's
    # announcement alone makes a connection allocate is this much at most.
    _EXACT_FRAME_BYTES = 1 << 22

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
            have = min(self.buffered_bytes, size)
            if size > self._EXACT_FRAME_BYTES:
                frames.append(await self._receive_growing(self._consume(have), size))
                continue
            # (A bytearray, from the heap: measured, fresh anonymous pages per
            # frame cost more in page faults than zeroing reused memory.)
            frame = bytearray(size)
            frame[:have] = self._consume(have)
            view = memoryview(frame)
            while have < size:
                received = await self._socket.recv_into(view[have:], size - have)
                if not received:
                    raise ConnectionClosed("the peer closed the connection")
                have += received
            frames.append(frame)
        return frames

    async def _receive_growing(self, first: bytearray, size: int) -> mmap.mmap:
        """A frame of ``size`` bytes whose first bytes are ``first``, read
        into anonymous memory that doubles as its bytes arrive (``mremap``:
        nothing copied, nothing zeroed), never more than twice what arrived
        (or ``_EXACT_FRAME_BYTES``): the size the peer announced is not
        allocated before it is sent. Pages are taken as the bytes land in
        them. Measured against zeroing the announced size and reading into
        it (100 and 200 MB messages over TCP and a Unix socket, the sender
        another process): a fifth less receiving CPU, the same wall time
        (within the noise of a loaded machine)."""
        have = len(first)
        capacity = min(size, max(self._EXACT_FRAME_BYTES, 2 * have))
        frame = mmap.mmap(-1, capacity, flags=mmap.MAP_PRIVATE)
        frame[:have] = first
        while have < size:
            if have == capacity:
                capacity = min(size, 2 * capacity)
                frame.resize(capacity)
            received = await self._socket.recv_into(memoryview(frame)[have:capacity])
            if not received:
                raise ConnectionClosed("the peer closed the connection")
            have += received
        return frame

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


# Out-of-band buffers up to this size are copied into the message's one
# write; larger ones are written from the sender's memory (no copy), and
# their sender waits until they are written (it may free or reuse that
# memory as soon as send returns, as it always could).
_COPY_BUFFER_BYTES_MAX = 1 << 16


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
