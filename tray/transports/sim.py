"""The simulated network: ordered, reliable streams on virtual time.

Each message is pickled on send and unpickled on delivery, so simulated
processes never share an object by reference. Every message gets a latency
from the network's seeded RNG; a stream delivers in order (a message is
never delivered before the one sent ahead of it), so faults follow the
semantics of a real stream — it can stall or break, but never reorder or
drop a message in the middle.

A stream's end closes when its process ends: messages already sent still
arrive, then the peer's ``receive`` raises ConnectionClosed, and sends to a
closed stream raise it at once.

Network faults (driven by the simulated cluster's fault API) act between
*machines* (the ``nK`` prefix of an address): a partition or a stall holds
back the head of every stream crossing it — and so everything behind it —
until it heals; a slow machine multiplies the latency of its streams; a
reset closes both ends of every stream of a machine at once."""

from __future__ import annotations

import math
import pickle
import random
from collections import deque

import trio

from ..core.interfaces import ConnectionClosed


class _Pipe:
    """One direction of a stream."""

    __slots__ = ("items", "closed", "event", "last_delivery")

    def __init__(self) -> None:
        self.items: deque = deque()
        self.closed = False
        self.event: trio.Event | None = None
        self.last_delivery = 0.0

    def wake(self) -> None:
        if self.event is not None:
            self.event.set()
            self.event = None


class SimStream:
    def __init__(self, network: SimNetwork, owner: str, peer: str, outgoing: _Pipe,
                 incoming: _Pipe, remote: bool) -> None:
        self._network = network
        self.owner = owner
        self.peer = peer
        self._out = outgoing
        self._in = incoming
        self._remote = remote
        self.closed = False
        self.partner: SimStream | None = None
        # Machines, for the network's faults: messages flow from peer to owner.
        self._from = SimNetwork.node_of(peer)
        self._to = SimNetwork.node_of(owner)

    def send_nowait(self, message) -> bool:
        if self.closed or self._out.closed:
            raise ConnectionClosed(f"{self.owner} -> {self.peer}: stream closed")
        data = pickle.dumps(message, protocol=5)
        now = trio.current_time()
        latency = self._network.latency(self._remote) * \
            self._network.slowdown(self._to, self._from)
        deliver_at = max(self._out.last_delivery, now + latency)
        self._out.last_delivery = deliver_at
        self._out.items.append((deliver_at, data))
        self._out.wake()
        return True

    async def send(self, message) -> None:
        self.send_nowait(message)

    async def receive(self):
        pipe = self._in
        while True:
            if self.closed:
                raise ConnectionClosed(f"{self.owner}: stream closed")
            if pipe.items:
                deliver_at, data = pipe.items[0]
                held = self._network.held(self._from, self._to)
                if held is not None:
                    await held
                    continue
                if deliver_at <= trio.current_time():
                    pipe.items.popleft()
                    message = pickle.loads(data)
                    self._network.delivered(self.owner, self.peer, message)
                    return message
                pipe.event = trio.Event()
                with trio.move_on_at(deliver_at):
                    await pipe.event.wait()
                continue
            if pipe.closed:
                raise ConnectionClosed(f"{self.peer} closed the stream to {self.owner}")
            pipe.event = trio.Event()
            await pipe.event.wait()

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self._out.closed = True
        self._out.wake()
        self._in.wake()

    async def aclose(self) -> None:
        self.close()


class SimNetwork:
    """Listeners by address, and the latency model."""

    def __init__(self, rng: random.Random, tracer, latency_local_s: tuple = (20e-6, 100e-6),
                 latency_remote_s: tuple = (100e-6, 1e-3)) -> None:
        self.rng = rng
        self.tracer = tracer
        self.latency_local_s = latency_local_s
        self.latency_remote_s = latency_remote_s
        self._listeners: dict[str, trio.MemorySendChannel] = {}
        self._streams: dict[str, list[SimStream]] = {}
        self.messages_delivered = 0
        self.dead: set[str] = set()  # addresses whose process died
        # Faults between machines ("n0", "n1", ...).
        self.blocked: set[tuple[str, str]] = set()  # (from, to) pairs held back
        self.stalled_until: dict[str, float] = {}  # machine -> virtual time
        self.slow: dict[str, float] = {}  # machine -> latency factor
        self._changed = trio.Event()

    # ------------------------------------------------------------- faults

    def held(self, source: str, target: str):
        """None if a message may cross from machine ``source`` to ``target``
        now, else an awaitable that returns when that may have changed."""
        if source == target:
            return None
        until = max(self.stalled_until.get(source, 0.0), self.stalled_until.get(target, 0.0))
        blocked = (source, target) in self.blocked
        if not blocked and until <= trio.current_time():
            return None
        return self._wait_for_change(None if blocked else until)

    async def _wait_for_change(self, until: float | None) -> None:
        with trio.move_on_at(until if until is not None else math.inf):
            await self._changed.wait()

    def _faults_changed(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    def slowdown(self, a: str, b: str) -> float:
        return max(self.slow.get(a, 1.0), self.slow.get(b, 1.0))

    def partition(self, group_a: list[str], group_b: list[str], one_way: bool = False) -> None:
        """Hold back traffic from machines in ``group_a`` to ``group_b`` (and
        back, unless ``one_way``)."""
        for a in group_a:
            for b in group_b:
                self.blocked.add((a, b))
                if not one_way:
                    self.blocked.add((b, a))
        self._faults_changed()

    def stall(self, machine: str, seconds: float) -> None:
        """Every stream to or from ``machine`` stops delivering for ``seconds``."""
        self.stalled_until[machine] = max(self.stalled_until.get(machine, 0.0),
                                          trio.current_time() + seconds)
        self._faults_changed()

    def set_slow(self, machine: str, factor: float) -> None:
        if factor == 1.0:
            self.slow.pop(machine, None)
        else:
            self.slow[machine] = factor

    def heal(self) -> None:
        """End every partition, stall and slowdown."""
        self.blocked.clear()
        self.stalled_until.clear()
        self.slow.clear()
        self._faults_changed()

    def reset(self, machine: str) -> None:
        """Break every stream of the processes on ``machine``: both ends close."""
        for owner in sorted(self._streams):
            if self.node_of(owner) != machine:
                continue
            for stream in self._streams[owner]:
                stream.close()
                if stream.partner is not None:
                    stream.partner.close()

    def latency(self, remote: bool) -> float:
        low, high = self.latency_remote_s if remote else self.latency_local_s
        return low + (high - low) * self.rng.random()

    def delivered(self, receiver: str, sender: str, message) -> None:
        self.messages_delivered += 1
        if len(message) == 4:
            kind, call_id, method, _ = message
            summary = f"reply#{call_id}" if kind == 1 else f"ack#{call_id}" if kind == 4 \
                else "welcome" if kind == 5 else method
        else:
            summary = str(message[0])
        self.tracer.record(receiver, "recv", peer=sender, msg=summary)

    def transport(self, owner: str) -> SimTransport:
        return SimTransport(self, owner)

    def close_all(self, owner: str) -> None:
        """The process at ``owner`` died: close every stream end it held.
        Until a process serves at that address again, code of the dead one
        still unwinding can open no new stream."""
        self.dead.add(owner)
        for stream in self._streams.pop(owner, []):
            stream.close()
        channel = self._listeners.pop(owner, None)
        if channel is not None:
            channel.close()

    def _track(self, stream: SimStream) -> None:
        streams = self._streams.setdefault(stream.owner, [])
        if len(streams) > 64 and len(streams) % 64 == 0:
            streams[:] = [s for s in streams if not s.closed]
        streams.append(stream)

    @staticmethod
    def node_of(address: str) -> str:
        return address.split("/", 1)[0]


class SimTransport:
    def __init__(self, network: SimNetwork, owner: str) -> None:
        self.network = network
        self.owner = owner

    async def serve(self, address: str, on_stream, *, task_status=trio.TASK_STATUS_IGNORED):
        if address in self.network._listeners:
            raise OSError(f"address {address} is already in use")
        self.network.dead.discard(address)
        send, receive = trio.open_memory_channel(math.inf)
        self.network._listeners[address] = send
        task_status.started()
        try:
            async with trio.open_nursery() as nursery:
                async for stream in receive:
                    nursery.start_soon(self._handle, on_stream, stream)
        finally:
            if self.network._listeners.get(address) is send:
                del self.network._listeners[address]

    @staticmethod
    async def _handle(on_stream, stream: SimStream) -> None:
        try:
            await on_stream(stream)
        finally:
            stream.close()

    async def connect(self, address: str) -> SimStream:
        if self.owner in self.network.dead:
            raise ConnectionClosed(f"{self.owner} has exited")
        channel = self.network._listeners.get(address)
        if channel is None:
            raise ConnectionClosed(f"nothing listens at {address}")
        remote = SimNetwork.node_of(address) != SimNetwork.node_of(self.owner)
        forward, backward = _Pipe(), _Pipe()
        mine = SimStream(self.network, self.owner, address, forward, backward, remote)
        theirs = SimStream(self.network, address, self.owner, backward, forward, remote)
        mine.partner, theirs.partner = theirs, mine
        self.network._track(mine)
        self.network._track(theirs)
        try:
            channel.send_nowait(theirs)
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            raise ConnectionClosed(f"nothing listens at {address}") from None
        return mine
