"""Request/response and one-way messages over a Transport stream.

Every component is a set of handlers. A *plain* handler (``def``) runs
inline in the connection's receive loop, so the messages of one connection
are handled strictly in the order they were sent — reference-count updates
and actor submissions rely on that. An ``async def`` handler runs in its own
task and may wait (for a lease, an object, an actor to come alive); its
reply is sent when it returns.

Wire messages are tuples:
``(REQUEST, call_id, method, args)``, ``(REPLY, call_id, ok, value)`` and
``(ONEWAY, 0, method, args)``.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable

import trio

from .interfaces import ConnectionClosed, Stream

logger = logging.getLogger("tray.rpc")

REQUEST, REPLY, ONEWAY = 0, 1, 2


class PeerDisconnected(ConnectionClosed):
    """The process at the other end went away before replying."""

    def __init__(self, address: str, method: str = "") -> None:
        self.address = address
        self.method = method
        super().__init__(f"lost the connection to {address}" + (f" during {method}" if method else ""))


class RemoteError(Exception):
    """A handler failed with an exception that could not be sent back."""


class _Pending:
    __slots__ = ("event", "ok", "value")

    def __init__(self) -> None:
        self.event = trio.Event()
        self.ok = False
        self.value = None


class Connection:
    def __init__(self, stream: Stream, handlers: dict[str, Callable], nursery: trio.Nursery,
                 peer: str, pending_calls_max: int, on_close: Callable | None = None) -> None:
        self._stream = stream
        self._handlers = handlers
        self._nursery = nursery
        self.peer = peer
        self._pending: dict[int, _Pending] = {}
        self._pending_calls_max = pending_calls_max
        self._next_call_id = 1
        self.closed = False
        self._on_close = on_close

    async def call(self, method: str, *args):
        if self.closed:
            raise PeerDisconnected(self.peer, method)
        if len(self._pending) >= self._pending_calls_max:
            raise RuntimeError(f"too many calls in flight to {self.peer} (max {self._pending_calls_max})")
        call_id = self._next_call_id
        self._next_call_id += 1
        pending = self._pending[call_id] = _Pending()
        try:
            await self._stream.send((REQUEST, call_id, method, args))
        except ConnectionClosed:
            self._pending.pop(call_id, None)
            raise PeerDisconnected(self.peer, method) from None
        await pending.event.wait()
        if pending.ok:
            return pending.value
        if isinstance(pending.value, PeerDisconnected):
            raise PeerDisconnected(self.peer, method)
        raise pending.value

    async def notify(self, method: str, *args) -> None:
        """Send a one-way message; it is lost silently if the peer is gone."""
        if self.closed:
            return
        try:
            await self._stream.send((ONEWAY, 0, method, args))
        except ConnectionClosed:
            pass

    async def run(self) -> None:
        """Receive and dispatch until the stream ends."""
        try:
            while True:
                message = await self._stream.receive()
                kind, call_id, a, b = message
                if kind == REPLY:
                    pending = self._pending.pop(call_id, None)
                    if pending is not None:
                        pending.ok, pending.value = a, b
                        pending.event.set()
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
        for pending in self._pending.values():
            pending.ok, pending.value = False, PeerDisconnected(self.peer)
            pending.event.set()
        self._pending.clear()
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
        if inspect.iscoroutinefunction(handler):
            self._nursery.start_soon(self._run_async, handler, kind, call_id, args)
            return
        try:
            value, ok = handler(self, *args), True
        except Exception as error:  # the handler's error goes back to the caller
            value, ok = error, False
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
            await self._reply(call_id, ok, value)
        elif not ok:
            logger.error("one-way %s from %s failed: %r", handler.__name__, self.peer, value)

    async def _reply(self, call_id: int, ok: bool, value) -> None:
        try:
            await self._stream.send((REPLY, call_id, ok, value))
        except ConnectionClosed:
            pass


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
        # Each is called with the address of a peer process that has gone
        # away, in the order they were added.
        self._peer_closed_listeners: list[Callable[[str], None]] = []

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
        peer = hello[1] if isinstance(hello, tuple) and hello and hello[0] == "hello" else "?"
        connection = Connection(stream, self.handlers, self.nursery, peer,
                                self.env.config.rpc_pending_calls_max, self._closed)
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
        for listener in list(self._peer_closed_listeners):
            listener(peer)

    async def reachable(self, address: str) -> bool:
        """Does a process still listen at ``address``? (Connects if need be.)"""
        try:
            await self.connect(address)
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
            await event.wait()
        event = self._connecting[address] = trio.Event()
        try:
            try:
                stream = await self.env.transport.connect(address)
                await stream.send(("hello", self.env.address))
            except ConnectionClosed:
                raise PeerDisconnected(address) from None
            connection = Connection(stream, self.handlers, self.nursery, address,
                                    self.env.config.rpc_pending_calls_max, self._closed)
            self._connections[address] = connection
            self.nursery.start_soon(connection.run)
            return connection
        finally:
            del self._connecting[address]
            event.set()

    async def call(self, address: str, method: str, *args):
        connection = await self.connect(address)
        return await connection.call(method, *args)

    async def notify(self, address: str, method: str, *args) -> None:
        try:
            connection = await self.connect(address)
        except PeerDisconnected:
            return
        await connection.notify(method, *args)

    def peers(self) -> list[str]:
        """Addresses with an open connection, in either direction."""
        return sorted(set(self._connections) | set(self._inbound))

    def drop(self, address: str) -> None:
        """Give up on the process at ``address`` (its machine was declared
        dead): close every connection with it; calls waiting for its replies
        raise PeerDisconnected now, whatever the network does."""
        connections = list(self._inbound.get(address, []))
        if address in self._connections:
            connections.append(self._connections[address])
        for connection in connections:
            connection._close()
            self.nursery.start_soon(connection.aclose)

    def is_connected(self, address: str) -> bool:
        connection = self._connections.get(address)
        return connection is not None and not connection.closed
