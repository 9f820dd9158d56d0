"""Request/response and one-way messages over a Transport stream.

Every component is a set of handlers. A *plain* handler (``def``) runs inline in the
connection's receive loop, so the messages of one connection are handled strictly in the
order they were sent — reference-count updates and actor submissions rely on that. An ``async
def`` handler runs in its own task and may wait (for a lease, an object, an actor to come
alive); its reply is sent when it returns. A plain handler whose reply comes later returns a
``Deferred``: it runs in order like any plain handler, and the reply leaves when whoever
finishes the work resolves it (an actor's executor, with no task of the handler's waiting in
between).

Wire messages are tuples: ``(REQUEST, call_id, method, args)``, ``(REPLY, call_id, ok,
value)``, ``(ONEWAY, 0, method, args)``, ``(RELIABLE, seq, method, args)`` and ``(ACK, seq,
None, None)``; a connection opens with the connecting side's ``("hello", address, session)``
and the other side's ``(WELCOME, session, None, None)``.

**Reliable one-way messages.** A plain one-way message is lost when its connection breaks
(a reset): fine for a view that the next heartbeat repeats, not for reference counting (a
lost ``remove_borrower`` leaks an object, a lost ``add_borrower`` frees one too early), frees,
lease returns or death notices. Those go with ``notify_reliable``: each gets a sequence number
(increasing, from one counter per process) and stays in the sender's ``unacked`` queue for its
destination until the receiver acknowledges it (acks are cumulative, and sent once per burst).
One task at a time sends a connection's reliable messages, strictly in sequence order; when a
new connection to the destination opens, every unacknowledged message is sent again first.
The receiver handles each message once: it remembers the last sequence number handled per
sender and *session* (a restarted sender has a new one). Messages are for one incarnation of
their receiver: when a new connection finds another process (another session) at the address
— a restarted node manager at its predecessor's address — what was waiting for the old one is
dropped, never delivered to its successor (a ``return_lease`` of lease 5 must not return the
new node's lease 5). A peer that stops answering may only be cut off (a partition), so what
waits for it is kept for ``reliable_retention_s`` and dropped after that, or at once when its
machine is declared dead (``drop``), which also gives up a connection being opened to it. At
most ``reliable_unacked_max`` wait per destination; beyond that the oldest go, with an error
logged.
``call_reliable`` sends one such message and waits for its
acknowledgement, which comes after the receiver's (plain) handler ran: a
call that a reset neither loses nor runs twice, for what must be applied
before the sender goes on (a borrower's registration with the owner).
"""

from __future__ import annotations

import inspect
import logging
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass

import trio

from .interfaces import ConnectionClosed, Stream

logger = logging.getLogger("tray.rpc")

REQUEST, REPLY, ONEWAY, RELIABLE, ACK, WELCOME = 0, 1, 2, 3, 4, 5

# How many senders' last sequence numbers a process remembers (a sender is
# one process; workers come and go, so the table would grow without end).
RECEIVED_SENDERS_MAX = 65_536
# How many times a connection is tried when it breaks before the peer's welcome (a reset in
# the middle of a handshake is not a dead peer).
HANDSHAKE_ATTEMPTS = 3
# How often ``call_reliable`` asks whether a receiver that has not acknowledged its message
# still listens (a dead one never will).
RELIABLE_RECHECK_S = 1.0


class PeerDisconnected(ConnectionClosed):
    """The process at the other end went away before replying."""

    def __init__(self, address: str, method: str = "") -> None:
        self.address = address
        self.method = method
        super().__init__(f"lost the connection to {address}" + (f" during {method}" if method else ""))


class HandshakeBroken(PeerDisconnected):
    """A process listens at the address, but every handshake with it broke (resets while a
    partition held them up): the process lives, only the connections to it broke."""


class RemoteError(Exception):
    """A handler failed with an exception that could not be sent back."""


class _Pending:
    __slots__ = ("event", "ok", "value", "on_reply")

    def __init__(self, on_reply: Callable[[bool, object], None] | None = None) -> None:
        self.event = trio.Event()
        self.ok = False
        self.value = None
        self.on_reply = on_reply  # start_call's callback (None: call() waits on event)

    def settle(self, ok: bool, value) -> None:
        self.ok, self.value = ok, value
        self.event.set()
        if self.on_reply is not None:
            try:
                self.on_reply(ok, value)
            except Exception:  # noqa: BLE001 - the connection's loop must go on
                logger.exception("a reply callback failed")


class Deferred:
    """The reply of a plain handler that is not ready when the handler
    returns: it returns this, and ``resolve(ok, value)`` (from the
    connection's trio run, once) sends the reply then, queued like a plain
    handler's (with whatever else that pass of the loop sends). Resolved
    before the handler returned, it replies at once. ``run_soon(async_fn,
    *args)`` replies with what ``async_fn`` returns or raises, from a task
    of the connection's, as an ``async def`` handler does: for the cases a
    handler cannot finish in order."""

    __slots__ = ("_connection", "_call_id", "_kind", "_result")

    def __init__(self, connection: Connection) -> None:
        self._connection = connection
        self._call_id = 0
        self._kind = -1  # until the receive loop has it (and the call's id)
        self._result: tuple | None = None

    def resolve(self, ok: bool, value) -> None:
        if self._kind >= 0:
            self._connection._deliver(self._kind, self._call_id, ok, value)
        else:
            self._result = (ok, value)

    def run_soon(self, async_fn, *args) -> None:
        self._connection._nursery.start_soon(self._run, async_fn, args)

    async def _run(self, async_fn, args) -> None:
        try:
            value, ok = await async_fn(*args), True
        except Exception as error:
            value, ok = error, False
        if self._kind == REQUEST:  # written from this task, as an async handler's reply
            await self._connection._reply(self._call_id, ok, value)
        else:
            self.resolve(ok, value)

    def _bind(self, kind: int, call_id: int) -> None:
        self._kind, self._call_id = kind, call_id
        if self._result is not None:
            ok, value = self._result
            self._result = None
            self._connection._deliver(kind, call_id, ok, value)


@dataclass(frozen=True)
class ConnectionStatistics:
    peer: str
    closed: bool
    calls_pending: int  # requests sent and not answered yet
    reliable_sent_upto: int  # the highest reliable seq sent on it (-1: none)


@dataclass(frozen=True)
class EndpointStatistics:
    connections_out: int  # one per peer address this process connected to
    connections_in: int  # accepted from peers
    connecting: int  # addresses a connection is being opened to now
    calls_pending: int  # requests in flight, over every connection
    unacked: int  # reliable messages not acknowledged yet, all destinations
    unacked_destinations: int
    reliable_seq: int  # the last reliable sequence number given
    reliable_dropped: int  # reliable messages given up on (limit, replaced receiver)
    senders_known: int  # senders whose last reliable seq is kept (RECEIVED_SENDERS_MAX)
    ack_waiters: int  # call_reliable calls waiting for their acknowledgement
    peers_unreachable: int  # destinations found gone whose messages are kept a while


class Connection:
    def __init__(self, stream: Stream, handlers: dict[str, Callable], nursery: trio.Nursery,
                 peer: str, pending_calls_max: int, on_close: Callable | None = None,
                 endpoint: Endpoint | None = None, peer_session: int = 0) -> None:
        self._stream = stream
        self._handlers = handlers
        self._nursery = nursery
        self.peer = peer
        self._pending: dict[int, _Pending] = {}
        self._pending_calls_max = pending_calls_max
        self._next_call_id = 1
        self.closed = False
        self._on_close = on_close
        self._endpoint = endpoint
        self.peer_session = peer_session  # the sender's session, for inbound connections
        self.reliable_sent_upto = -1  # the highest reliable seq sent on this connection
        self._reliable_sending = False
        self._ack_upto = -1  # the highest reliable seq to acknowledge
        self._ack_scheduled = False
        # method -> (its handler, whether it is an async def); bounded by the
        # handlers' names.
        self._async_methods: dict[str, tuple] = {}

    def statistics(self) -> ConnectionStatistics:
        return ConnectionStatistics(peer=self.peer, closed=self.closed,
                                    calls_pending=len(self._pending),
                                    reliable_sent_upto=self.reliable_sent_upto)

    def validate_state(self) -> None:
        """The calls in flight: within their bound, numbered below the next
        id, none left once closed. O(1). (Facts about calls in flight only:
        its endpoint checks a connection with none no further.)"""
        pending = self._pending
        assert len(pending) <= self._pending_calls_max, (self.peer, len(pending))
        # (Call ids grow and the dict keeps insertion order: its last is its largest.)
        assert not pending or next(reversed(pending)) < self._next_call_id, self.peer
        # (Closing settles every call in flight, and no call starts after.)
        assert not (self.closed and pending), self.peer

    async def call(self, method: str, *args):
        if self.closed:
            raise PeerDisconnected(self.peer, method)
        if len(self._pending) >= self._pending_calls_max:
            raise RuntimeError(f"too many calls in flight to {self.peer} (max {self._pending_calls_max})")
        call_id = self._next_call_id
        self._next_call_id += 1
        pending = self._pending[call_id] = _Pending()
        try:
            try:
                await self._stream.send((REQUEST, call_id, method, args))
            except ConnectionClosed:
                # Closed now, not when the receive loop next runs: until then the endpoint
                # handed this connection out again, and a caller retrying at once never
                # yielded to that loop (chaos seed 3071 spun forever in a get's status
                # query, no virtual time passing).
                self._close()
                raise PeerDisconnected(self.peer, method) from None
            await pending.event.wait()
        finally:
            # (A cancelled call's entry would wait for a reply that may
            # never come, counting against rpc_pending_calls_max.)
            self._pending.pop(call_id, None)
        if pending.ok:
            return pending.value
        if isinstance(pending.value, PeerDisconnected):
            raise PeerDisconnected(self.peer, method)
        raise pending.value

    def start_call(self, method: str, *args,
                   on_reply: Callable[[bool, object], None]) -> bool:
        """Send a request without waiting: queued for the connection's
        writer (after every message sent before it), so that a burst of
        requests leaves in one write, in the order they were started, with
        no task per request. ``on_reply(ok, value)`` is called from this
        connection's receive loop with the reply (ok: the handler's value;
        else the error it raised), or with ``(False, PeerDisconnected)``
        when the connection closes first; it must not block. False, with
        nothing sent, when the request cannot go at once (the connection is
        closed or full): the caller uses ``call`` instead."""
        if self.closed or len(self._pending) >= self._pending_calls_max:
            return False
        call_id = self._next_call_id
        try:
            if not self._stream.send_nowait((REQUEST, call_id, method, args)):
                return False
        except ConnectionClosed:
            return False
        self._next_call_id += 1
        self._pending[call_id] = _Pending(on_reply)
        return True

    async def notify(self, method: str, *args) -> None:
        """Send a one-way message; it is lost silently if the peer is gone."""
        if self.closed:
            return
        try:
            await self._stream.send((ONEWAY, 0, method, args))
        except ConnectionClosed:
            self._close()  # (as in ``call``)

    async def send_reliable(self, unacked: deque) -> None:
        """Send, in order, the messages of ``unacked`` (a destination's
        queue) that this connection has not sent yet. One task sends at a
        time; it goes on while more arrive, so none overtakes another."""
        if self._reliable_sending:
            return
        self._reliable_sending = True
        try:
            while not self.closed:
                batch = [entry for entry in unacked if entry[0] > self.reliable_sent_upto]
                if not batch:
                    return
                for seq, method, args, _ in batch:
                    self.reliable_sent_upto = seq
                    try:
                        await self._stream.send((RELIABLE, seq, method, args))
                    except ConnectionClosed:
                        return  # sent again on the next connection
        finally:
            self._reliable_sending = False

    def acknowledge(self, seq: int) -> None:
        """Acknowledge reliable messages up to ``seq``, once per burst."""
        self._ack_upto = max(self._ack_upto, seq)
        if not self._ack_scheduled and not self.closed:
            self._ack_scheduled = True
            self._nursery.start_soon(self._send_ack)

    async def _send_ack(self) -> None:
        await trio.sleep(0)  # let the rest of a burst arrive first
        self._ack_scheduled = False
        try:
            await self._stream.send((ACK, self._ack_upto, None, None))
        except ConnectionClosed:
            pass  # the sender sends again what it has no ack for

    async def run(self) -> None:
        """Receive and dispatch until the stream ends."""
        try:
            while True:
                message = await self._stream.receive()
                kind, call_id, a, b = message
                if kind == REPLY:
                    pending = self._pending.pop(call_id, None)
                    if pending is not None:
                        pending.settle(a, b)
                elif kind == RELIABLE:
                    if self._endpoint.first_delivery(self, call_id):
                        self._endpoint.reliable_handled += 1
                        self._dispatch(ONEWAY, 0, a, b)
                    self.acknowledge(call_id)
                elif kind == ACK:
                    self._endpoint.acknowledged(self.peer, call_id)
                else:
                    self._dispatch(kind, call_id, a, b)
        except ConnectionClosed:
            pass
        finally:
            self._close()

    def _close(self) -> None:
        if self.closed:
            return
        self.closed = True
        pending_calls = list(self._pending.values())
        self._pending.clear()
        for pending in pending_calls:
            pending.settle(False, PeerDisconnected(self.peer))
        if self._on_close is not None:
            self._on_close(self)

    async def aclose(self) -> None:
        self._close()
        with trio.CancelScope(shield=True):
            await self._stream.aclose()

    def _dispatch(self, kind: int, call_id: int, method: str, args) -> None:
        handler = self._handlers.get(method)
        if handler is None:
            logger.error("no handler for %r from %s", method, self.peer)
            if kind == REQUEST:
                self._nursery.start_soon(self._reply, call_id, False,
                                         RemoteError(f"unknown method {method!r}"))
            return
        # inspect.iscoroutinefunction costs ~1.8 us a message (a lookup here
        # ~0.2 us): asked once per method and connection.
        known = self._async_methods.get(method)
        if known is None or known[0] is not handler:
            known = self._async_methods[method] = (handler,
                                                   inspect.iscoroutinefunction(handler))
        if known[1]:
            self._nursery.start_soon(self._run_async, handler, kind, call_id, args)
            return
        try:
            value, ok = handler(self, *args), True
        except Exception as error:  # the handler's error goes back to the caller
            value, ok = error, False
        if ok and type(value) is Deferred:
            value._bind(kind, call_id)
        else:
            self._deliver(kind, call_id, ok, value, method)

    def _deliver(self, kind: int, call_id: int, ok: bool, value,
                 method: str = "(a deferred reply)") -> None:
        """A plain handler's outcome: its reply, or the error of a one-way message logged."""
        if kind == REQUEST:
            self._send_reply_nowait(call_id, ok, value)
        elif not ok:  # nobody to tell: a one-way message failed here
            logger.error("one-way %s from %s failed: %r", method, self.peer, value)

    def _send_reply_nowait(self, call_id: int, ok: bool, value) -> None:
        try:
            if self._stream.send_nowait((REPLY, call_id, ok, value)):
                return
        except ConnectionClosed:
            return
        self._nursery.start_soon(self._reply, call_id, ok, value)

    async def _run_async(self, handler, kind, call_id, args) -> None:
        try:
            value, ok = await handler(self, *args), True
        except Exception as error:
            value, ok = error, False
        if kind == REQUEST:
            # Written from here, not queued for the writer task: queueing
            # measured slower for tasks async (bench, 2026-11-23, noisy).
            await self._reply(call_id, ok, value)
        elif not ok:
            logger.error("one-way %s from %s failed: %r", handler.__name__, self.peer, value)

    async def _reply(self, call_id: int, ok: bool, value) -> None:
        try:
            await self._stream.send((REPLY, call_id, ok, value))
        except ConnectionClosed:
            pass


def add_handlers(handlers: dict[str, Callable], *tables: dict[str, Callable]) -> None:
    """Serve each component's table of handlers (message name -> its
    ``handle_<name>`` method) in a service's ``handlers``, the dict its
    ``Endpoint`` dispatches from. A name served twice is an error, found
    when the service is built."""
    for table in tables:
        for name, handler in table.items():
            assert name not in handlers, f"two handlers for {name!r}"
            handlers[name] = handler


class Endpoint:
    """A process's connections: it serves its handlers at its address, and
    keeps one outgoing connection per peer address so that messages to a
    peer stay in order."""

    def __init__(self, env, handlers: dict[str, Callable], nursery: trio.Nursery) -> None:
        self.env = env
        self.handlers = handlers
        self.nursery = nursery
        self._connections: dict[str, Connection] = {}
        self._inbound: dict[str, list[Connection]] = {}
        self._connecting: dict[str, trio.Event] = {}
        self._connect_scopes: dict[str, trio.CancelScope] = {}  # (the opener's: ``drop``)
        # Each is called with the address of a peer process that has gone
        # away, in the order they were added.
        self._peer_closed_listeners: list[Callable[[str], None]] = []
        # Reliable one-way messages. This process's session: a restarted
        # process at the same address is a new sender to its peers.
        self.session = env.rng.getrandbits(62)
        self._reliable_seq = 0  # the last sequence number given
        # destination -> deque[(seq, method, args, the destination's session)]
        self._unacked: dict[str, deque] = {}
        # sender -> (its session, the last seq handled). Kept when a sender seems gone (it may
        # only be cut off and send again); the least recently heard of go past RECEIVED_SENDERS_MAX.
        self._received: OrderedDict[str, tuple[int, int]] = OrderedDict()
        self._peer_sessions: dict[str, int] = {}  # destination -> its session, last seen
        self._unreachable_since: dict[str, float] = {}  # destination -> when found gone
        self.reliable_dropped = 0  # messages dropped: the limit, or a replaced receiver
        # Reliable messages received and handled (each once: a copy sent again after a broken
        # connection is not counted). The simulator checks it against its own count.
        self.reliable_handled = 0
        # seq -> [acknowledged?, event] of the messages ``call_reliable``
        # waits on (each is in an ``_unacked`` queue, so as bounded).
        self._ack_waiters: dict[int, list] = {}

    def statistics(self) -> EndpointStatistics:
        """Counts over the connections and the reliable queues: O(connections
        + destinations)."""
        inbound = [connection for connections in self._inbound.values()
                   for connection in connections]
        pending = sum(len(connection._pending) for connection in self._connections.values())
        pending += sum(len(connection._pending) for connection in inbound)
        return EndpointStatistics(
            connections_out=len(self._connections), connections_in=len(inbound),
            connecting=len(self._connecting), calls_pending=pending,
            unacked=self.unacked_count(), unacked_destinations=len(self._unacked),
            reliable_seq=self._reliable_seq, reliable_dropped=self.reliable_dropped,
            senders_known=len(self._received), ack_waiters=len(self._ack_waiters),
            peers_unreachable=len(self._unreachable_since))

    def validate_state(self) -> None:
        """The connection tables (each open, under its peer), each
        connection's own invariants, the reliable queues' bounds and order.
        O(connections + destinations); the queued messages are walked only
        while a ``call_reliable`` waits (then O(unacked))."""
        for address, connection in self._connections.items():
            if connection.peer != address or connection.closed or connection._pending:
                self._validate_connection(address, connection)
        for peer, connections in self._inbound.items():
            assert connections, peer
            for connection in connections:
                if connection.peer != peer or connection.closed or connection._pending:
                    self._validate_connection(peer, connection)
        for address, event in self._connecting.items():
            # (The opener forgets it before it sets it.)
            assert not event.is_set(), address
        if self._unacked:
            unacked_max = self.env.config.reliable_unacked_max
            for address, queue in self._unacked.items():
                assert len(queue) <= unacked_max, (address, len(queue))
                # Sequence numbers are queued in the order they are given.
                assert not queue or 0 < queue[0][0] <= queue[-1][0] <= self._reliable_seq, \
                    address
        assert len(self._received) <= RECEIVED_SENDERS_MAX, len(self._received)
        assert self.reliable_dropped >= 0, self.reliable_dropped
        if self._ack_waiters:
            waiting = [seq for seq, waiter in self._ack_waiters.items()
                       if not waiter[1].is_set()]
            queued = {entry[0] for queue in self._unacked.values() for entry in queue} \
                if waiting else ()
            for seq in waiting:
                # A message is settled (acknowledged or given up) as it
                # leaves its queue: one still waited on is queued.
                assert seq in queued, seq

    @staticmethod
    def _validate_connection(peer: str, connection: Connection) -> None:
        """A connection in the tables, under ``peer``: the facts its
        endpoint's check tests first in one expression (most connections
        are open, idle and under their peer), and its own."""
        assert connection.peer == peer, (peer, connection.peer)
        # (A connection that closes leaves the tables in its on_close.)
        assert not connection.closed, peer
        connection.validate_state()

    def add_peer_closed_listener(self, listener: Callable[[str], None]) -> None:
        """Call ``listener(address)`` when a peer process is gone for good
        (its connection closed and it no longer answers)."""
        self._peer_closed_listeners.append(listener)

    async def serve(self) -> None:
        await self.nursery.start(self.env.transport.serve, self.env.address, self._on_stream)

    async def _on_stream(self, stream: Stream) -> None:
        try:
            hello = await stream.receive()
        except ConnectionClosed:
            return  # the peer left (or sent garbage) before introducing itself
        is_hello = isinstance(hello, tuple) and hello and hello[0] == "hello"
        peer = hello[1] if is_hello else "?"
        session = hello[2] if is_hello and len(hello) > 2 else 0
        try:
            await stream.send((WELCOME, self.session, None, None))
        except ConnectionClosed:
            return
        connection = Connection(stream, self.handlers, self.nursery, peer,
                                self.env.config.rpc_pending_calls_max, self._closed,
                                endpoint=self, peer_session=session)
        self._inbound.setdefault(peer, []).append(connection)
        await connection.run()

    def _closed(self, connection: Connection) -> None:
        if self._connections.get(connection.peer) is connection:
            del self._connections[connection.peer]
        inbound = self._inbound.get(connection.peer)
        if inbound is not None and connection in inbound:
            inbound.remove(connection)
            if not inbound:
                del self._inbound[connection.peer]
        if self._peer_closed_listeners and connection.peer != "?":
            self.nursery.start_soon(self._confirm_gone, connection.peer)

    async def _confirm_gone(self, peer: str) -> None:
        """A connection closed: tell the peer-closed listeners if the process
        behind it is gone — not if only the connection broke (a reset)."""
        await trio.sleep(0)  # not while this process is ending (a cancelled task stops here)
        try:
            if await self.reachable(peer):
                return
        except ValueError:
            return  # not a process's address (a one-off client): nothing to clean up
        self._unreachable_since.setdefault(peer, trio.current_time())
        self.nursery.start_soon(self._expire_unacked, peer)
        for listener in list(self._peer_closed_listeners):
            listener(peer)

    async def _expire_unacked(self, peer: str) -> None:
        """Drop what waits for a peer still unreachable after the retention."""
        await trio.sleep(self.env.config.reliable_retention_s)
        since = self._unreachable_since.get(peer)
        if since is not None and \
                trio.current_time() - since >= self.env.config.reliable_retention_s:
            self._forget_peer(peer)

    def _forget_peer(self, peer: str) -> None:
        """A peer is gone for good: what waits to be sent to it never will be."""
        queue = self._unacked.pop(peer, None)
        self.reliable_dropped += len(queue or ())
        self._settle_waiters(queue or (), acknowledged=False)
        self._peer_sessions.pop(peer, None)
        self._unreachable_since.pop(peer, None)

    async def reachable(self, address: str) -> bool:
        """Does a process still listen at ``address``? (Connects if need be.)"""
        try:
            await self.connect(address)
        except HandshakeBroken:
            # It listens: the handshakes broke, not the process (mixed chaos
            # seed 3970: three resets during a partition, and a worker took
            # its live owner for dead).
            return True
        except PeerDisconnected:
            return False
        return True

    async def connect(self, address: str) -> Connection:
        while True:
            connection = self._connections.get(address)
            if connection is not None and not connection.closed:
                return connection
            event = self._connecting.get(address)
            if event is None:
                break
            scope = self._connect_scopes[address]
            await event.wait()
            if scope.cancel_called:
                raise PeerDisconnected(address)  # its machine was declared dead (drop)
        event = self._connecting[address] = trio.Event()
        scope = self._connect_scopes[address] = trio.CancelScope()
        try:
            with scope:
                stream, session = await self._open(address)
            if scope.cancel_called:
                raise PeerDisconnected(address)  # (held up by a partition, say)
            self._unreachable_since.pop(address, None)
            if self._peer_sessions.get(address) != session:
                # Another process at the address: what was meant for the one
                # before it is moot (what was sent knowing no one is not).
                queue = self._unacked.get(address)
                if queue:
                    kept = deque(entry for entry in queue if entry[3] in (None, session))
                    self.reliable_dropped += len(queue) - len(kept)
                    self._settle_waiters((entry for entry in queue
                                          if entry[3] not in (None, session)),
                                         acknowledged=False)
                    self._unacked[address] = kept
            self._peer_sessions[address] = session
            connection = Connection(stream, self.handlers, self.nursery, address,
                                    self.env.config.rpc_pending_calls_max, self._closed,
                                    endpoint=self)
            self._connections[address] = connection
            self.nursery.start_soon(connection.run)
            # What a broken connection may have lost goes again, first.
            unacked = self._unacked.get(address)
            if unacked:
                await connection.send_reliable(unacked)
            return connection
        finally:
            del self._connecting[address], self._connect_scopes[address]
            event.set()

    async def _open(self, address: str):
        """A new stream to ``address`` after the handshake, and the session
        of the process there (None if it sent none)."""
        for attempt in range(HANDSHAKE_ATTEMPTS):
            try:
                stream = await self.env.transport.connect(address)
            except ConnectionClosed:
                raise PeerDisconnected(address) from None  # nothing listens there
            try:
                await stream.send(("hello", self.env.address, self.session))
                welcome = await stream.receive()
            except BaseException as error:
                # Broken or cancelled half-way: the stream is closed here
                # (its socket and reader), not left to the garbage collector.
                await stream.aclose()
                if not isinstance(error, ConnectionClosed):
                    raise
                if attempt + 1 == HANDSHAKE_ATTEMPTS:
                    raise HandshakeBroken(address) from None
                await trio.sleep(0)
                continue
            session = welcome[1] if isinstance(welcome, tuple) and len(welcome) == 4 and \
                welcome[0] == WELCOME else None
            return stream, session
        raise AssertionError("unreachable")

    async def call(self, address: str, method: str, *args):
        connection = await self.connect(address)
        return await connection.call(method, *args)

    async def notify(self, address: str, method: str, *args) -> None:
        try:
            connection = await self.connect(address)
        except PeerDisconnected:
            return
        await connection.notify(method, *args)

    async def notify_reliable(self, address: str, method: str, *args) -> None:
        """Send a one-way message that survives broken connections: it is
        sent again until acknowledged, and handled once (see the header)."""
        self._queue_reliable(address, method, args)
        try:
            connection = await self.connect(address)
        except PeerDisconnected:
            return  # sent on the next connection (or dropped when the peer is gone)
        unacked = self._unacked.get(address)
        if unacked:
            await connection.send_reliable(unacked)

    def _queue_reliable(self, address: str, method: str, args: tuple) -> int:
        self._reliable_seq += 1
        seq = self._reliable_seq
        queue = self._unacked.setdefault(address, deque())
        # For the process last seen at the address (None: none seen yet).
        queue.append((seq, method, args, self._peer_sessions.get(address)))
        if len(queue) > self.env.config.reliable_unacked_max:
            lost = queue.popleft()
            self.reliable_dropped += 1
            self._settle_waiters((lost,), acknowledged=False)
            logger.error("dropped a %s message to %s: %d are waiting for it to answer",
                         lost[1], address, len(queue))
        return seq

    async def call_reliable(self, address: str, method: str, *args) -> None:
        """A reliable one-way message whose handler has run at the receiver
        when this returns (its acknowledgement came back). A reset in
        between neither loses it nor runs it twice: it is sent again on the
        next connection and handled once. Raises PeerDisconnected when no
        process listens at ``address`` (any more), or another one took its
        place, before it was handled."""
        seq = self._queue_reliable(address, method, args)
        waiter = self._ack_waiters[seq] = [False, trio.Event()]
        try:
            while True:
                try:
                    connection = await self.connect(address)  # re-sends what is unacked
                except HandshakeBroken:
                    pass  # it listens: sent on the next connection that opens
                except PeerDisconnected:
                    self._unqueue(address, seq)
                    raise
                else:
                    unacked = self._unacked.get(address)
                    if unacked:
                        await connection.send_reliable(unacked)
                with trio.move_on_after(RELIABLE_RECHECK_S):
                    await waiter[1].wait()
                if waiter[1].is_set():
                    if waiter[0]:
                        return
                    raise PeerDisconnected(address, method)
        finally:
            self._ack_waiters.pop(seq, None)

    def _unqueue(self, address: str, seq: int) -> None:
        queue = self._unacked.get(address)
        if queue:
            kept = deque(entry for entry in queue if entry[0] != seq)
            if len(kept) != len(queue):
                self._unacked[address] = kept

    def _settle_waiters(self, entries, acknowledged: bool) -> None:
        if not self._ack_waiters:
            return
        for entry in entries:
            waiter = self._ack_waiters.get(entry[0])
            if waiter is not None:
                waiter[0] = acknowledged
                waiter[1].set()

    def first_delivery(self, connection: Connection, seq: int) -> bool:
        """Is reliable message ``seq`` from this connection's peer new here?"""
        peer = connection.peer
        known = self._received.get(peer)
        if known is not None and known[0] == connection.peer_session and seq <= known[1]:
            return False
        self._received[peer] = (connection.peer_session, seq)
        self._received.move_to_end(peer)
        if len(self._received) > RECEIVED_SENDERS_MAX:
            self._received.popitem(last=False)
        return True

    def acknowledged(self, address: str, seq: int) -> None:
        queue = self._unacked.get(address)
        while queue and queue[0][0] <= seq:
            entry = queue.popleft()
            if self._ack_waiters:
                self._settle_waiters((entry,), acknowledged=True)

    def unacked_count(self) -> int:
        return sum(len(queue) for queue in self._unacked.values())

    def peers(self) -> list[str]:
        """Addresses with an open connection, in either direction."""
        return sorted(set(self._connections) | set(self._inbound))

    def drop(self, address: str) -> None:
        """Give up on the process at ``address`` (its machine was declared dead): close its
        connections, and stop opening one (a handshake held up by a partition: restarts default
        seed 2); calls waiting for it raise PeerDisconnected now, whatever the network does."""
        connections = list(self._inbound.get(address, []))
        if address in self._connections:
            connections.append(self._connections[address])
        if address in self._connect_scopes:
            self._connect_scopes[address].cancel()
        self._forget_peer(address)
        for connection in connections:
            connection._close()
            self.nursery.start_soon(connection.aclose)

    def open_connection(self, address: str) -> Connection | None:
        """The open connection to ``address``, if there is one now (for
        ``Connection.start_call``, which does not wait to connect)."""
        connection = self._connections.get(address)
        return connection if connection is not None and not connection.closed else None

    def is_connected(self, address: str) -> bool:
        connection = self._connections.get(address)
        return connection is not None and not connection.closed
