"""The wire (tray/transports/tcp_streams.py): one write per small message, messages
queued in one tick leaving in one write, a bounded outgoing queue, many
messages parsed out of one read, and failures that fail what was queued.

Streams over a Unix socketpair (no handshake: that is
test_security_handshake.py's), and an RPC endpoint over a real listener."""

from __future__ import annotations

import random
import struct
import time
import types

import numpy as np
import psutil
import pytest
import trio
import trio.testing

from tray.core.interfaces import ConnectionClosed
from tray.core.rpc import Endpoint
from tray.transports import tcp_streams
from tray.transports.tcp import TcpTransport
from tray.transports.tcp_framing import MalformedFrame, _Reader
from tray.transports.tcp_streams import TcpStream

TOKEN = b"a-cluster-token-" + b"9" * 32


class _CountingStream(trio.abc.HalfCloseableStream):
    """A trio stream that counts the reads and writes of the one it wraps."""

    def __init__(self, inner: trio.SocketStream) -> None:
        self.inner = inner
        self.socket = inner.socket
        self.reads = 0
        self.writes = 0

    async def send_all(self, data) -> None:
        self.writes += 1
        await self.inner.send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        await self.inner.wait_send_all_might_not_block()

    async def send_eof(self) -> None:
        await self.inner.send_eof()

    async def receive_some(self, max_bytes=None):
        self.reads += 1
        return await self.inner.receive_some(max_bytes)

    async def aclose(self) -> None:
        await self.inner.aclose()


def _pair() -> tuple[TcpStream, TcpStream, _CountingStream, _CountingStream]:
    a, b = trio.socket.socketpair()
    raw_a, raw_b = _CountingStream(trio.SocketStream(a)), _CountingStream(trio.SocketStream(b))
    return (TcpStream(raw_a, "a", _Reader(raw_a)), TcpStream(raw_b, "b", _Reader(raw_b)),
            raw_a, raw_b)


async def test_a_small_message_is_one_write():
    left, right, raw_left, _ = _pair()
    for n in range(5):
        await left.send(("REQUEST", n, "push_task", {"payload": b"x" * 200}))
    assert left.writes == 5  # header and payload together, never apart
    for n in range(5):
        assert await right.receive() == ("REQUEST", n, "push_task", {"payload": b"x" * 200})
    await left.aclose()
    await right.aclose()


async def test_a_small_write_the_kernel_takes_at_once_is_no_pass_of_the_loop():
    # trio's send_all yields after every write; a small message on a plain
    # socket goes to the kernel directly, and only a full socket waits.
    left, right, _, _ = _pair()
    with trio.testing.assert_no_checkpoints():
        await left.send(("REQUEST", 1, "push_task", b"x" * 200))
    assert await right.receive() == ("REQUEST", 1, "push_task", b"x" * 200)
    await left.aclose()
    with pytest.raises(ConnectionClosed):  # closed: nothing more is written
        await left.send(("after", 2))
    await right.aclose()


async def test_messages_queued_in_one_tick_leave_in_one_write_in_order():
    left, right, raw_left, raw_right = _pair()
    # A burst of replies from handlers that ran in one tick: queued, not written.
    for n in range(200):
        assert left.send_nowait(("REPLY", n))
    assert left.writes == 0
    # A send behind them waits for its turn and goes with them.
    await left.send(("last", 200))
    assert left.writes == 1 and left.messages_sent == 201
    received = [await right.receive() for _ in range(201)]
    assert received == [("REPLY", n) for n in range(200)] + [("last", 200)]
    # The whole burst was parsed out of a few reads, not one (or three) per message.
    assert raw_right.reads <= 4
    await left.aclose()
    await right.aclose()


async def test_flush_queued_writes_what_was_queued_before_the_pass_ends():
    # A long synchronous stretch on the loop (the driver draining a burst
    # of submissions) has its queued messages written as it goes.
    left, right, _, _ = _pair()
    transport = TcpTransport(TOKEN)
    with trio.testing.assert_no_checkpoints():
        for n in range(10):
            assert left.send_nowait(("REQUEST", n))
        assert left.writes == 0
        transport.flush_queued()
        assert left.writes == 1  # in one write, with no pass of the loop
        assert left.send_nowait(("REQUEST", 10))
        transport.flush_queued()
        transport.flush_queued()  # (nothing queued: nothing written)
        assert left.writes == 2
    assert [await right.receive() for _ in range(11)] == [("REQUEST", n) for n in range(11)]
    await left.aclose()
    await right.aclose()


async def test_what_the_tasks_of_one_pass_queue_leaves_in_one_write_without_the_writer():
    # The replies of handlers that ran in one pass of the event loop go out
    # together when the pass ends: one write, and no step of the writer task
    # (which used to be woken for every batch, and wrote in the next pass).
    left, right, _, _ = _pair()
    steps: dict[str, int] = {}

    class Steps(trio.abc.Instrument):
        def before_task_step(self, task) -> None:
            steps[task.name] = steps.get(task.name, 0) + 1

    trio.lowlevel.add_instrument(Steps())

    async def reply(n: int) -> None:
        assert left.send_nowait(("REPLY", n))

    for burst in range(2):
        async with trio.open_nursery() as nursery:
            for n in range(20):
                nursery.start_soon(reply, burst * 20 + n)
        # (the nursery ended after the pass its tasks ran in)
        assert left.writes == burst + 1
    received = [await right.receive() for _ in range(40)]
    # (trio runs a pass's tasks in no fixed order: each burst's own 20)
    assert [sorted(received[:20]), sorted(received[20:])] == \
        [[("REPLY", n) for n in range(20)], [("REPLY", n) for n in range(20, 40)]]
    writer_steps = [count for name, count in steps.items() if name.startswith("tray writer")]
    assert writer_steps == [1]  # its start, to wait; never woken for a burst
    await left.aclose()
    await right.aclose()


@pytest.mark.timeout(60)
def test_a_task_woken_by_the_end_of_pass_write_runs_though_the_loop_meant_to_sleep():
    # aclose right after queueing waits for the queue to drain; the write at
    # the pass's end wakes it after trio chose to wait for I/O (here: a day,
    # on a clock that stands still). The flush ends that wait.
    async def main() -> None:
        left, right, _, _ = _pair()
        assert left.send_nowait(("first", 0))
        await trio.testing.wait_all_tasks_blocked()  # (the writer started, and waits)
        for n in range(5):
            assert left.send_nowait(("last words", n))
        await left.aclose()
        assert [await right.receive() for _ in range(6)] == \
            [("first", 0)] + [("last words", n) for n in range(5)]
        await right.aclose()

    trio.run(main, clock=trio.testing.MockClock())


async def test_send_and_send_nowait_from_many_tasks_keep_each_senders_order():
    left, right, _, _ = _pair()
    rng = random.Random(7)

    async def sender(name: str) -> None:
        for n in range(50):
            message = (name, n)
            if rng.random() < 0.5 and left.send_nowait(message):
                continue
            await left.send(message)
            if rng.random() < 0.3:
                await trio.sleep(0)

    async with trio.open_nursery() as nursery:
        for name in "abcd":
            nursery.start_soon(sender, name)
    seen: dict[str, list] = {name: [] for name in "abcd"}
    for _ in range(200):
        name, n = await right.receive()
        seen[name].append(n)
    assert all(numbers == list(range(50)) for numbers in seen.values())
    await left.aclose()
    await right.aclose()


async def test_the_outgoing_queue_is_bounded_and_a_full_queue_makes_senders_wait(monkeypatch):
    monkeypatch.setattr(tcp_streams, "outgoing_bytes_max", 64 * 1024)
    left, right, _, _ = _pair()
    message = b"m" * 10_000
    sent = 0

    async def flood() -> None:
        nonlocal sent
        for _ in range(200):  # far more than the socket's buffers and the queue hold
            await left.send(message)
            sent += 1

    async with trio.open_nursery() as nursery:
        for _ in range(10):  # one writes (and blocks), the others queue behind it
            nursery.start_soon(flood)
        # Nobody reads the other end: the kernel's buffers fill, then the queue.
        await trio.testing.wait_all_tasks_blocked()
        assert sent < 2_000  # the flood waits for room
        assert left._outgoing_bytes <= tcp_streams.outgoing_bytes_max + len(message) + 64
        assert not left.send_nowait(message)  # no room: the caller must wait in send
        # Reading the other end lets everything through, in order, whole.
        for _ in range(2_000):
            assert await right.receive() == message
    assert sent == 2_000
    await left.aclose()
    await right.aclose()


async def test_a_peer_gone_fails_what_is_queued_and_what_is_sent_after():
    left, right, _, _ = _pair()
    for n in range(10):
        assert left.send_nowait(("queued", n))
    await right.aclose()  # the peer goes away before the writer runs
    with pytest.raises(ConnectionClosed), trio.fail_after(60):
        while True:  # the queued write fails, then every send does
            await left.send(("after", 0))
            await trio.sleep(0)
    assert left.closed
    with pytest.raises(ConnectionClosed):
        left.send_nowait(("after", 1))
    # The reading side ends too: that is how calls in flight learn of it.
    with pytest.raises(ConnectionClosed):
        await left.receive()


async def test_large_buffers_travel_out_of_band_whole():
    left, right, raw_left, _ = _pair()
    big = np.arange(600_000, dtype=np.float64)  # 4.8 MB, written from the array's memory
    small = np.arange(10, dtype=np.int32)  # copied into the message's one write
    async with trio.open_nursery() as nursery:
        nursery.start_soon(left.send, ("arrays", big, small))
        name, got_big, got_small = await right.receive()
    assert name == "arrays"
    assert np.array_equal(got_big, big) and np.array_equal(got_small, small)
    # Header and pickle in one write, the big buffer (from the array's own
    # memory) in one, then the small buffer, copied.
    assert left.writes == 3
    await left.aclose()
    await right.aclose()


async def test_a_large_message_is_read_straight_into_its_frames():
    """A message of >= 1 MiB skips the read buffer (recv_into each frame);
    what was buffered before it, and the small messages after it, arrive
    intact and in order, whatever the reads' sizes."""
    left, right, _, raw_right = _pair()
    rng = np.random.default_rng(7)
    big = rng.integers(0, 255, size=3_000_001, dtype=np.uint8)  # odd size: no aligned reads
    async with trio.open_nursery() as nursery:
        async def send_all():
            for i in range(3):
                await left.send(("before", i))
                await left.send(("big", i, big, np.arange(5)))
            await left.send(("after", 3))
        nursery.start_soon(send_all)
        got = [await right.receive() for _ in range(7)]
    assert [m[:2] for m in got] == [("before", 0), ("big", 0), ("before", 1), ("big", 1),
                                    ("before", 2), ("big", 2), ("after", 3)]
    for message in got[1:6:2]:
        assert np.array_equal(message[2], big) and list(message[3]) == list(range(5))
    # The big frames' bytes come through recv_into, not the stream's
    # receive_some (measured: 6 reads this way, 49 through the buffer).
    assert raw_right.reads <= 20, raw_right.reads
    await left.aclose()
    await right.aclose()


async def test_a_frame_larger_than_a_chunk_grows_as_it_arrives_and_arrives_whole():
    """Issue 43 item 6: a frame over 4 MiB is not allocated at its announced
    size but grows with its bytes; whatever the sizes (around the growth's
    doublings, with bytes of it already buffered, several such frames in
    one message, a big pickle in band) every byte arrives in order."""
    left, right, _, _ = _pair()
    rng = np.random.default_rng(11)
    sizes = [(4 << 20) + 1, 8 << 20, (8 << 20) + 7, 21_000_003]
    arrays = [rng.integers(0, 255, size=n, dtype=np.uint8) for n in sizes]
    in_band = rng.bytes(9_000_001)  # bytes pickle in band: frame 0 is this large
    async with trio.open_nursery() as nursery:
        async def send_all():
            await left.send(("small", 0))
            await left.send(("arrays", arrays, in_band))
            await left.send(("small", 1))
        nursery.start_soon(send_all)
        got = [await right.receive() for _ in range(3)]
    assert got[0] == ("small", 0) and got[2] == ("small", 1)
    name, received, received_in_band = got[1]
    assert name == "arrays" and received_in_band == in_band
    assert all(np.array_equal(a, b) for a, b in zip(received, arrays, strict=True))
    received[0][0] = 1  # writable, as before
    await left.aclose()
    await right.aclose()


async def test_an_announced_huge_frame_takes_memory_only_as_its_bytes_arrive():
    """Issue 43 item 6: a peer announces a 2 GiB frame and sends 1,000
    bytes of it. The reader waits for the rest holding a few MiB (it zeroed
    the announced size before: 2 GB more, and the event loop stalled for
    the time that took)."""
    left, right, raw_left, _ = _pair()
    process = psutil.Process()
    before = process.memory_info().rss
    await raw_left.send_all(struct.pack("<IQ", 1, 2 << 30) + b"x" * 1000)
    waiting = trio.CancelScope()

    async def receive():
        with waiting:
            await right.receive()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(receive)
        start = time.monotonic()
        await trio.testing.wait_all_tasks_blocked()  # the reader waits for more bytes
        assert process.memory_info().rss - before < 16 << 20
        assert time.monotonic() - start < 1.0
        waiting.cancel()
    await left.aclose()
    await right.aclose()


async def test_aclose_writes_what_is_queued_first():
    left, right, _, _ = _pair()
    for n in range(100):
        assert left.send_nowait(n)
    await left.aclose()
    assert [await right.receive() for _ in range(100)] == list(range(100))
    with pytest.raises(ConnectionClosed):
        await right.receive()
    await right.aclose()


@pytest.mark.parametrize("garbage", [b"\x00\x00\x00\x00", b"\x01\x00\x00\x00" +
                                     (1 << 40).to_bytes(8, "little")])
async def test_a_malformed_header_closes_the_connection(garbage):
    left, right, raw_left, _ = _pair()
    await raw_left.send_all(garbage)
    with pytest.raises(MalformedFrame):
        await right.receive()
    assert right.closed
    await left.aclose()


# ==================================================================== RPC


def _env(address: str):
    config = types.SimpleNamespace(rpc_pending_calls_max=10_000, reliable_unacked_max=1_000,
                                   reliable_retention_s=60.0)
    return types.SimpleNamespace(transport=TcpTransport(TOKEN), address=address,
                                 rng=random.Random(1), config=config)


async def test_replies_to_a_burst_of_calls_are_coalesced(tmp_path):
    server_address = f"unix:{tmp_path}/server.sock"
    streams: list = []

    def echo(conn, value):
        streams.append(conn._stream)
        return value

    async def slow_echo(conn, value):
        await trio.sleep(0)
        return ("slow", value)

    async with trio.open_nursery() as nursery:
        server = Endpoint(_env(server_address), {"echo": echo, "slow_echo": slow_echo},
                          nursery)
        await server.serve()
        client = Endpoint(_env(f"unix:{tmp_path}/client.sock"), {}, nursery)
        results: dict = {}

        async def call(n: int) -> None:
            results[n] = await client.call(server_address, "echo", n)

        async def slow_call(n: int) -> None:
            results[-n - 1] = await client.call(server_address, "slow_echo", n)

        async with trio.open_nursery() as calls:
            for n in range(300):
                calls.start_soon(call, n)
        stream = streams[0]
        assert stream.messages_sent >= 300 + 1  # the welcome and every reply
        # Replies of handlers that ran in one tick share a write.
        assert stream.writes <= 10
        # An async handler's reply is written as it finishes (a write that
        # the kernel takes at once costs no pass of the event loop).
        async with trio.open_nursery() as calls:
            for n in range(300):
                calls.start_soon(slow_call, n)
        assert all(results[n] == n and results[-n - 1] == ("slow", n) for n in range(300))
        assert stream.messages_sent >= 600 + 1
        nursery.cancel_scope.cancel()


async def test_a_call_in_flight_when_the_peer_goes_fails(tmp_path):
    server_address = f"unix:{tmp_path}/server.sock"

    async def never(conn):
        await trio.sleep_forever()

    async with trio.open_nursery() as nursery:
        server_scope = trio.CancelScope()

        async def run_server() -> None:
            with server_scope:
                async with trio.open_nursery() as server_nursery:
                    await Endpoint(_env(server_address), {"never": never},
                                   server_nursery).serve()
                    await trio.sleep_forever()

        nursery.start_soon(run_server)
        await trio.testing.wait_all_tasks_blocked()
        client = Endpoint(_env(f"unix:{tmp_path}/client.sock"), {}, nursery)
        failure: list = []

        async def call() -> None:
            try:
                await client.call(server_address, "never")
            except ConnectionClosed as error:
                failure.append(error)

        nursery.start_soon(call)
        await trio.testing.wait_all_tasks_blocked()
        server_scope.cancel()  # the server process's loop ends: its sockets close
        with trio.fail_after(30):
            while not failure:
                await trio.sleep(0.01)
        assert "lost the connection" in str(failure[0])
        nursery.cancel_scope.cancel()


async def test_the_writer_ends_with_the_connection_when_nobody_closes_it():
    def writers() -> list:
        return [task for nursery in trio.lowlevel.current_root_task().child_nurseries
                for task in nursery.child_tasks if task.name.startswith("tray writer")]

    left, right, _, _ = _pair()
    assert left.send_nowait("hello")  # starts the writer task
    assert await right.receive() == "hello"
    assert len(writers()) == 1
    await right.aclose()
    with pytest.raises(ConnectionClosed):
        await left.receive()
    await trio.testing.wait_all_tasks_blocked()
    assert writers() == []  # it ended: nothing holds the socket open
