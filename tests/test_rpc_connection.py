"""A connection whose stream broke is closed at once by the call or notify
that found it broken, so the endpoint never hands it out again (chaos seed
3071: a get's status query retried on the same dead connection, never
yielding to the receive loop that would have closed it — a wall-clock hang)."""

from __future__ import annotations

import random

import pytest
import trio
import trio.testing

from tray.core.config import Config
from tray.core.interfaces import NullTracer, ProcessEnv
from tray.core.rpc import HANDSHAKE_ATTEMPTS, Deferred, Endpoint, PeerDisconnected
from tray.transports.sim import SimNetwork


def _env(network: SimNetwork, address: str) -> ProcessEnv:
    return ProcessEnv(address=address, transport=network.transport(address),
                      rng=random.Random(address), tracer=NullTracer(), config=Config())


@pytest.mark.parametrize("first", ["call", "notify"])
async def test_a_send_on_a_broken_stream_closes_the_connection(first):
    network = SimNetwork(random.Random(0), NullTracer())
    async with trio.open_nursery() as nursery:
        server = Endpoint(_env(network, "n1/server"), {"echo": lambda conn, x: x}, nursery)
        await server.serve()
        client = Endpoint(_env(network, "n0/client"), {}, nursery)
        await client.serve()
        assert await client.call("n1/server", "echo", 1) == 1
        network.reset("n1")  # both ends of every stream of n1 break, now
        if first == "call":
            with pytest.raises(PeerDisconnected):
                await client.call("n1/server", "echo", 2)
        else:
            await client.notify("n1/server", "echo", 2)
        # No yield in between: the receive loop has not run yet.
        assert not client.is_connected("n1/server")
        assert await client.call("n1/server", "echo", 3) == 3  # a new connection
        nursery.cancel_scope.cancel()


class _Recording:
    """The transport as given, keeping each stream it connected."""

    def __init__(self, transport) -> None:
        self._transport = transport
        self.connected: list = []

    async def serve(self, *args, **kwargs):
        return await self._transport.serve(*args, **kwargs)

    async def connect(self, address: str):
        stream = await self._transport.connect(address)
        self.connected.append(stream)
        return stream


async def test_a_stream_whose_handshake_failed_is_closed():
    # Something listens at the address but hangs up before answering the
    # hello: each attempt's stream is closed by the endpoint itself.
    network = SimNetwork(random.Random(0), NullTracer())

    async def hang_up(stream) -> None:
        await stream.aclose()

    async with trio.open_nursery() as nursery:
        await nursery.start(network.transport("n1/rude").serve, "n1/rude", hang_up)
        env = _env(network, "n0/client")
        recording = _Recording(env.transport)
        env.transport = recording
        client = Endpoint(env, {}, nursery)
        with pytest.raises(PeerDisconnected):
            await client.call("n1/rude", "echo", 1)
        assert recording.connected
        assert all(stream.closed for stream in recording.connected)
        nursery.cancel_scope.cancel()


async def test_handshakes_broken_by_resets_leave_a_listening_peer_reachable():
    # Mixed chaos seed 3970: a partition held a worker's handshakes with its
    # owner, and a reset broke each of them; after HANDSHAKE_ATTEMPTS the
    # owner was taken for gone (reachable: False), the worker's argument
    # fetch failed with OwnerDiedError and the node freed the owner's
    # objects. Something listens there: only the connections broke.
    network = SimNetwork(random.Random(0), NullTracer())
    async with trio.open_nursery() as nursery:
        server = Endpoint(_env(network, "n1/server"), {"echo": lambda conn, x: x}, nursery)
        await server.serve()
        client = Endpoint(_env(network, "n0/client"), {}, nursery)
        network.partition(["n0"], ["n1"])
        answers = []

        async def ask() -> None:
            answers.append(await client.reachable("n1/server"))

        nursery.start_soon(ask)
        for _ in range(HANDSHAKE_ATTEMPTS):
            await trio.testing.wait_all_tasks_blocked()  # a handshake held at the partition
            network.reset("n1")
        await trio.testing.wait_all_tasks_blocked()
        assert answers == [True]
        # A process that is gone is unreachable still.
        assert not await client.reachable("n1/nobody")
        nursery.cancel_scope.cancel()


async def test_a_cancelled_call_leaves_nothing_pending():
    network = SimNetwork(random.Random(0), NullTracer())

    async def never(conn):
        await trio.sleep_forever()

    async with trio.open_nursery() as nursery:
        server = Endpoint(_env(network, "n1/server"), {"never": never}, nursery)
        await server.serve()
        client = Endpoint(_env(network, "n0/client"), {}, nursery)
        await client.serve()
        connection = await client.connect("n1/server")
        with trio.move_on_after(1):
            await connection.call("never")
        assert not connection._pending
        nursery.cancel_scope.cancel()


async def test_a_plain_handler_s_deferred_reply_comes_when_resolved():
    # A plain handler returns a Deferred: its reply leaves when the work
    # resolves it (the actor host's executor, later), at once when resolved
    # before the handler returned, and run_soon's task raises as an async
    # handler would.
    network = SimNetwork(random.Random(0), NullTracer())
    later: dict[int, Deferred] = {}

    def slow(conn, x):
        later[x] = Deferred(conn)
        return later[x]

    def ready(conn, x):
        reply = Deferred(conn)
        reply.resolve(True, x * 10)
        return reply

    def fails(conn, x):
        async def refuse():
            await trio.sleep(0)
            raise ValueError(f"not {x}")
        reply = Deferred(conn)
        reply.run_soon(refuse)
        return reply

    results: dict[int, object] = {}
    async with trio.open_nursery() as nursery:
        server = Endpoint(_env(network, "n1/server"),
                          {"slow": slow, "ready": ready, "fails": fails}, nursery)
        await server.serve()
        client = Endpoint(_env(network, "n0/client"), {}, nursery)
        await client.serve()

        async def call(method: str, x: int) -> None:
            try:
                results[x] = await client.call("n1/server", method, x)
            except ValueError as error:
                results[x] = str(error)

        async def until(condition) -> None:  # (the simulated network takes its time)
            with trio.fail_after(30):
                while not condition():
                    await trio.sleep(0.001)

        for method, x in (("slow", 1), ("ready", 2), ("slow", 3), ("fails", 4)):
            nursery.start_soon(call, method, x)
        await until(lambda: len(results) == 2 and len(later) == 2)
        assert results == {2: 20, 4: "not 4"} and sorted(later) == [1, 3]
        later[3].resolve(True, "three")
        await until(lambda: 3 in results)
        assert results[3] == "three" and 1 not in results
        later[1].resolve(False, ValueError("one failed"))
        await until(lambda: 1 in results)
        assert results[1] == "one failed"
        nursery.cancel_scope.cancel()
