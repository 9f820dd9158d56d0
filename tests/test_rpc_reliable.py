"""Reliable one-way messages (rpc.Endpoint.notify_reliable): across broken
connections every message is handled exactly once, in order; a restarted
sender is a new session; messages to a peer found gone are dropped."""

from __future__ import annotations

import random

import trio

from tray.core.config import Config
from tray.core.interfaces import NullTracer, ProcessEnv
from tray.core.rpc import Endpoint, PeerDisconnected
from tray.transports.sim import SimNetwork


def _env(network: SimNetwork, address: str, seed: int, **config) -> ProcessEnv:
    return ProcessEnv(address=address, transport=network.transport(address),
                      rng=random.Random(f"{seed}:{address}"), tracer=NullTracer(),
                      config=Config(**config))


async def _pair(nursery, network, handled, *, sender_seed=1, **config):
    receiver = Endpoint(_env(network, "n1/receiver", 2, **config),
                        {"note": lambda conn, n: handled.append(n)}, nursery)
    await receiver.serve()
    sender = Endpoint(_env(network, "n0/sender", sender_seed, **config), {}, nursery)
    await sender.serve()
    return sender, receiver


async def test_every_message_is_handled_once_in_order_across_resets():
    network = SimNetwork(random.Random(0), NullTracer())
    handled: list = []
    async with trio.open_nursery() as nursery:
        sender, _ = await _pair(nursery, network, handled)
        for n in range(300):
            await sender.notify_reliable("n1/receiver", "note", n)
            if n % 37 == 5:
                network.reset("n1")  # both ends see their streams break
            if n % 11 == 0:
                await trio.sleep(0.001)
        with trio.fail_after(30):
            while len(handled) < 300 or sender.unacked_count():
                await trio.sleep(0.01)
                if sender.unacked_count() and not sender.is_connected("n1/receiver"):
                    await sender.connect("n1/receiver")  # what reconnecting senders do
        nursery.cancel_scope.cancel()
    assert handled == list(range(300))


async def test_a_plain_notify_is_lost_in_a_reset_where_a_reliable_one_is_not():
    network = SimNetwork(random.Random(1), NullTracer())
    handled: list = []
    async with trio.open_nursery() as nursery:
        sender, _ = await _pair(nursery, network, handled)
        await sender.connect("n1/receiver")
        await sender.notify("n1/receiver", "note", "plain")
        await sender.notify_reliable("n1/receiver", "note", "reliable")
        network.reset("n1")  # before either arrives
        await trio.sleep(0.1)
        await sender.connect("n1/receiver")
        await trio.sleep(0.1)
        nursery.cancel_scope.cancel()
    assert handled == ["reliable"]


async def test_messages_beyond_the_limit_drop_the_oldest():
    network = SimNetwork(random.Random(2), NullTracer())
    handled: list = []
    async with trio.open_nursery() as nursery:
        sender = Endpoint(_env(network, "n0/sender", 1, reliable_unacked_max=3), {}, nursery)
        await sender.serve()
        for n in range(5):  # nobody listens: all wait
            await sender.notify_reliable("n1/receiver", "note", n)
        assert sender.unacked_count() == 3
        assert sender.reliable_dropped == 2
        receiver = Endpoint(_env(network, "n1/receiver", 2),
                            {"note": lambda conn, n: handled.append(n)}, nursery)
        await receiver.serve()
        await sender.connect("n1/receiver")  # a new connection sends them first
        await trio.sleep(0.1)
        nursery.cancel_scope.cancel()
    assert handled == [2, 3, 4]


async def test_messages_for_a_replaced_receiver_are_not_delivered_to_its_successor():
    # A node manager restarted at its predecessor's address must not get the
    # return_lease of the old one's lease 5: its own lease 5 is another.
    network = SimNetwork(random.Random(3), NullTracer())
    old: list = []
    new: list = []
    async with trio.open_nursery() as nursery:
        with trio.CancelScope() as first_life:
            async with trio.open_nursery() as old_nursery:
                receiver = Endpoint(_env(network, "n1/receiver", 2),
                                    {"note": lambda conn, n: old.append(n)}, old_nursery)
                await receiver.serve()
                sender = Endpoint(_env(network, "n0/sender", 1), {}, nursery)
                await sender.serve()
                await sender.notify_reliable("n1/receiver", "note", "delivered")
                await trio.sleep(0.1)
                network.stall("n1", 1.0)  # what is sent now waits in the network...
                await sender.notify_reliable("n1/receiver", "note", "meant for the old one")
                network.close_all("n1/receiver")  # ...and the old receiver dies
                first_life.cancel()
        successor = Endpoint(_env(network, "n1/receiver", 5),
                             {"note": lambda conn, n: new.append(n)}, nursery)
        network.heal()
        await successor.serve()
        await sender.connect("n1/receiver")
        await sender.notify_reliable("n1/receiver", "note", "for the new one")
        await trio.sleep(0.1)
        nursery.cancel_scope.cancel()
    assert old == ["delivered"]
    assert new == ["for the new one"]
    assert sender.reliable_dropped == 1


async def test_concurrent_senders_never_overtake_or_skip_each_other():
    # Regression (simtest mixed seed 93, chaos): a message sent while a
    # reconnect was still sending the backlog marked the backlog as sent.
    network = SimNetwork(random.Random(4), NullTracer())
    handled: list = []
    async with trio.open_nursery() as nursery:
        sender, _ = await _pair(nursery, network, handled)
        await sender.notify_reliable("n1/receiver", "note", -1)
        network.stall("n1", 0.05)
        for n in range(40):
            nursery.start_soon(sender.notify_reliable, "n1/receiver", "note", n)
            await trio.sleep(0)
            if n == 10:
                network.reset("n1")
                nursery.start_soon(sender.connect, "n1/receiver")
        with trio.fail_after(30):
            while len(handled) < 41 or sender.unacked_count():
                await trio.sleep(0.01)
                if sender.unacked_count() and not sender.is_connected("n1/receiver"):
                    await sender.connect("n1/receiver")
        nursery.cancel_scope.cancel()
    assert handled == list(range(-1, 40))


async def test_a_peer_that_stops_answering_keeps_its_messages_for_the_retention():
    network = SimNetwork(random.Random(5), NullTracer())
    handled: list = []
    gone: list = []
    async with trio.open_nursery() as nursery:
        sender, _ = await _pair(nursery, network, handled, reliable_retention_s=0.5)
        sender.add_peer_closed_listener(gone.append)
        await sender.connect("n1/receiver")
        listener = network._listeners.pop("n1/receiver")  # it stops answering...
        network.reset("n1")
        await sender.notify_reliable("n1/receiver", "note", "kept")
        await trio.sleep(0.2)
        assert gone == ["n1/receiver"] and handled == []
        network._listeners["n1/receiver"] = listener  # ...and answers again, the same process
        await sender.connect("n1/receiver")
        await trio.sleep(0.1)
        assert handled == ["kept"]
        # Unreachable for longer than the retention: what waits is dropped.
        network._listeners.pop("n1/receiver")
        network.reset("n1")
        await sender.notify_reliable("n1/receiver", "note", "dropped")
        await trio.sleep(0.8)
        assert sender.unacked_count() == 0 and sender.reliable_dropped == 1
        nursery.cancel_scope.cancel()


async def test_call_reliable_returns_once_handled_and_survives_resets_without_repeats():
    # A borrower's registration with an owner (ReferenceCounter._register_borrows):
    # a reset on its way once made the borrower take the live owner for dead,
    # unregistered (the owner could free what it borrowed); a plain re-send
    # could apply it twice (a leak). Each call returns only after its handler
    # ran, and every message is handled exactly once.
    network = SimNetwork(random.Random(6), NullTracer())
    handled: list = []
    returned: list = []
    async with trio.open_nursery() as nursery:
        sender, _ = await _pair(nursery, network, handled)

        async def one(n: int) -> None:
            await sender.call_reliable("n1/receiver", "note", n)
            assert n in handled, n  # handled before the call returned
            returned.append(n)

        with trio.fail_after(30):
            async with trio.open_nursery() as calls:
                for n in range(30):
                    calls.start_soon(one, n)
                    await trio.sleep(0)
                    if n in (3, 17):
                        network.reset("n1")  # both ends see their streams break
        nursery.cancel_scope.cancel()
    assert sorted(handled) == list(range(30)) and len(handled) == 30
    assert sorted(returned) == list(range(30))
    assert sender.unacked_count() == 0 and not sender._ack_waiters


async def test_call_reliable_to_nobody_fails_at_once_and_keeps_nothing():
    network = SimNetwork(random.Random(7), NullTracer())
    async with trio.open_nursery() as nursery:
        sender = Endpoint(_env(network, "n0/sender", 1), {}, nursery)
        await sender.serve()
        with trio.fail_after(0.5):  # not RELIABLE_RECHECK_S, nor the retention
            try:
                await sender.call_reliable("n1/receiver", "note", 1)
            except PeerDisconnected:
                pass
            else:
                raise AssertionError("a call to an address nobody listens at returned")
        assert sender.unacked_count() == 0 and not sender._ack_waiters
        nursery.cancel_scope.cancel()
