"""Bounds on what a client may make tray's HTTP servers wait for.

The dashboard and Serve's proxy run on uvicorn, whose HTTP/1.1 protocol
(h11) waits for a request's headers and body as long as the client likes:
a connection that sends half a request line and stops is held forever, and
a thousand of them use up the process's file descriptors (the dashboard and
the job API then answer nobody). ``protocol(...)`` returns uvicorn's h11
protocol with three bounds, for ``uvicorn.Config(http=...)``:

* the headers of a request must arrive within ``header_timeout_s`` of its
  first byte (of the connection, for the first request; a keep-alive
  connection's idle wait is uvicorn's ``timeout_keep_alive``);
* a body must keep arriving: ``body_idle_timeout_s`` without a byte while
  the application waits for one ends the connection (time the server itself
  stops reading, because the application is slow, does not count);
* at most ``waiting_max`` connections may wait for their headers at once:
  one more sheds the oldest of them, as the node's RPC listener sheds its
  oldest unauthenticated connection.

A request cut off so is answered ``408 Request Timeout`` and closed.

``refuse_ambiguous_framing(app)`` wraps an ASGI application so that a
request with both ``Content-Length`` and ``Transfer-Encoding`` (a request
smuggling vector: two servers may read different bodies from it) is a 400,
never passed on."""

from __future__ import annotations

import asyncio

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

HEADER_TIMEOUT_S = 10.0
BODY_IDLE_TIMEOUT_S = 30.0
WAITING_MAX = 256

_TIMED_OUT = (b"HTTP/1.1 408 Request Timeout\r\ncontent-type: text/plain; charset=utf-8\r\n"
              b"content-length: 36\r\nconnection: close\r\n\r\nthe request did not arrive in time\r\n")


def protocol(*, header_timeout_s: float = HEADER_TIMEOUT_S,
             body_idle_timeout_s: float = BODY_IDLE_TIMEOUT_S,
             waiting_max: int = WAITING_MAX) -> type[asyncio.Protocol]:
    """uvicorn's h11 protocol with the bounds of the module's docstring."""
    assert header_timeout_s > 0
    assert body_idle_timeout_s > 0
    assert waiting_max >= 1

    class BoundedH11Protocol(H11Protocol):
        _header_timer: asyncio.TimerHandle | None = None
        _body_timer: asyncio.TimerHandle | None = None

        def _waiting(self) -> dict:
            # The connections of this server that wait for headers, oldest
            # first (a dict keeps insertion order); one per server.
            waiting = getattr(self.server_state, "_tray_waiting_for_headers", None)
            if waiting is None:
                waiting = {}
                self.server_state._tray_waiting_for_headers = waiting
            return waiting

        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            self._arm_header_timer()

        def connection_lost(self, exc) -> None:
            self._cancel_timers()
            super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            if self.transport.is_closing():
                self._cancel_timers()
                return
            state = self.conn.their_state
            if state is h11.IDLE:
                if data and self._header_timer is None:
                    self._arm_header_timer()  # the next request of a kept-alive connection
                return
            self._cancel_header_timer()
            if state is h11.SEND_BODY:
                self._arm_body_timer()
            elif self._body_timer is not None:
                self._body_timer.cancel()
                self._body_timer = None

        # ---------------------------------------------------------- timers

        def _arm_header_timer(self) -> None:
            self._header_timer = self.loop.call_later(header_timeout_s, self._time_out)
            waiting = self._waiting()
            waiting[self] = None
            while len(waiting) > waiting_max:
                oldest = next(iter(waiting))
                oldest._time_out()

        def _arm_body_timer(self) -> None:
            if self._body_timer is not None:
                self._body_timer.cancel()
            self._body_timer = self.loop.call_later(body_idle_timeout_s, self._body_idle)

        def _body_idle(self) -> None:
            self._body_timer = None
            if self.flow is not None and self.flow.read_paused:
                self._arm_body_timer()  # the application is slow, not the client
                return
            if self.conn.their_state is h11.SEND_BODY:
                self._close()

        def _time_out(self) -> None:
            self._cancel_header_timer()
            if self.conn.their_state is h11.IDLE:  # (else its application answers it)
                self._close(_TIMED_OUT)

        def _close(self, reply: bytes = b"") -> None:
            self._cancel_timers()
            if not self.transport.is_closing():
                if reply and (self.cycle is None or self.cycle.response_complete):
                    self.transport.write(reply)
                self.transport.close()
            if self.cycle is not None and not self.cycle.response_complete:
                self.cycle.disconnected = True
                self.cycle.message_event.set()

        def _cancel_header_timer(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None
            self._waiting().pop(self, None)

        def _cancel_timers(self) -> None:
            self._cancel_header_timer()
            if self._body_timer is not None:
                self._body_timer.cancel()
                self._body_timer = None

    return BoundedH11Protocol


def refuse_ambiguous_framing(app):
    """``app`` (ASGI), answering 400 to a request that declares both a
    ``Content-Length`` and a ``Transfer-Encoding``."""
    async def guarded(scope, receive, send):
        if scope["type"] == "http":
            names = {name.lower() for name, _ in scope.get("headers", ())}
            if b"content-length" in names and b"transfer-encoding" in names:
                body = b"a request may not carry both Content-Length and Transfer-Encoding"
                await send({"type": "http.response.start", "status": 400,
                            "headers": [(b"content-type", b"text/plain; charset=utf-8"),
                                        (b"content-length", str(len(body)).encode()),
                                        (b"connection", b"close")]})
                await send({"type": "http.response.body", "body": body})
                return
        await app(scope, receive, send)
    return guarded
