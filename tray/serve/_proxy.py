"""The HTTP proxy: uvicorn serving a Starlette-based ASGI app, in an actor.

The proxy is an async tray actor; uvicorn runs on the actor's asyncio loop
(trio-asyncio), bound to ``http_options.host:port`` (127.0.0.1 unless told
otherwise). For each request it finds the application whose route prefix is
the longest that matches the path (the route table comes from the
controller by long poll), reads the body (at most
``max_request_body_bytes``: 413 beyond, at once when the request declares
more, and the connection closed), and sends the ingress deployment's
replica the scope and body (``handle_http``), choosing the replica with the
same router as handles use. The replica runs the ASGI app and streams the
ASGI messages back; the proxy forwards them as they come.

Status codes the proxy makes itself: 404 for a path no application routes,
503 when the deployment refuses the request (``BackPressureError``: every
replica full and ``max_queued_requests`` reached; or no replica at all), 500
when the replica died mid-request, 408 past ``request_timeout_s``.
uvicorn answers 503 past ``max_concurrent_requests`` connections at once.
A client has ``HEADER_TIMEOUT_S`` to send its headers and must keep a body
coming (``tray.util.http_server``: a half-sent request is answered 408 and
closed; the oldest of too many waiting for their headers is shed), and a
request with both ``Content-Length`` and ``Transfer-Encoding`` is a 400.
``/-/routes`` lists the routes, ``/-/healthz`` answers ``success``.

The proxy opens a real socket, so it only runs where processes are real:
``serve`` starts none in the simulator unless ``http_options`` ask for one."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket

import tray
from tray.util import http_server

from . import _context
from ._common import RequestMetadata, RouteTable
from ._handle import MAX_REQUEST_RETRIES, router_for
from ._http import HTTPRequestData, portable_scope
from .exceptions import BackPressureError, RayServeException

logger = logging.getLogger("tray.serve")

HEADER_TIMEOUT_S = 10.0
BODY_IDLE_TIMEOUT_S = 30.0
WAITING_FOR_HEADERS_MAX = 512  # connections; one more sheds the oldest


def _text_messages(status: int, text: str) -> list:
    body = text.encode()
    return [{"type": "http.response.start", "status": status,
             "headers": [(b"content-type", b"text/plain; charset=utf-8"),
                         (b"content-length", str(len(body)).encode())]},
            {"type": "http.response.body", "body": body, "more_body": False}]


class _BodyTooLarge(Exception):
    pass


class ServeProxy:
    """The proxy actor (see the module's header)."""

    def __init__(self, node_id: str, http_options, controller) -> None:
        self.node_id = node_id
        self.options = http_options
        self.controller = controller
        _context.reset()
        _context.set_controller(controller)
        self._server = None
        self._serve_task: asyncio.Task | None = None
        self._poll_task: asyncio.Task | None = None
        self._routes = RouteTable(version=None, routes={})
        self._routes_known: asyncio.Event | None = None
        self._start_error: BaseException | None = None
        self._requests_total = 0
        self._requests_ongoing = 0

    # ------------------------------------------------------------ control

    async def ready(self) -> tuple:
        """Start serving (once); (host, port) once uvicorn listens."""
        if self._serve_task is None:
            self._start()
        while not self._server.started:
            if self._serve_task.done():
                error = self._start_error or self._serve_task.exception() or \
                    RuntimeError("uvicorn stopped")
                raise RayServeException(f"the HTTP proxy could not serve on "
                                        f"{self.options.host}:{self.options.port}: {error}")
            await asyncio.sleep(0.01)
        return self.options.host, self._port

    def _start(self) -> None:
        import uvicorn

        class _Server(uvicorn.Server):
            @contextlib.contextmanager
            def capture_signals(self):  # the worker process owns its signals
                yield

        self._routes_known = asyncio.Event()
        self._poll_task = asyncio.get_running_loop().create_task(self._poll_routes())
        options = self.options
        config = uvicorn.Config(http_server.refuse_ambiguous_framing(self._asgi),
                                host=options.host, port=options.port,
                                http=http_server.protocol(
                                    header_timeout_s=HEADER_TIMEOUT_S,
                                    body_idle_timeout_s=BODY_IDLE_TIMEOUT_S,
                                    waiting_max=WAITING_FOR_HEADERS_MAX),
                                log_level="warning", access_log=False, lifespan="off",
                                interface="asgi3",
                                limit_concurrency=options.max_concurrent_requests,
                                timeout_keep_alive=int(max(1, options.keep_alive_timeout_s)),
                                root_path=options.root_path)
        self._server = _Server(config)
        try:
            family = socket.AF_INET6 if ":" in options.host else socket.AF_INET
            # IPPROTO_TCP explicitly: asyncio sets TCP_NODELAY only on sockets
            # that say so, and without it small responses wait for delayed ACKs.
            sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((options.host, options.port))
            sock.listen(2048)
            sock.setblocking(False)
            self._port = sock.getsockname()[1]
        except OSError as error:
            self._start_error = bind_error = error

            async def failed():
                raise bind_error
            self._serve_task = asyncio.get_running_loop().create_task(failed())
            return
        self._serve_task = asyncio.get_running_loop().create_task(self._server.serve([sock]))

    async def check_health(self) -> int:
        if self._serve_task is None or self._serve_task.done():
            raise RayServeException("the HTTP proxy is not serving")
        return self._requests_ongoing

    async def statistics(self) -> dict:
        return {"requests_total": self._requests_total,
                "requests_ongoing": self._requests_ongoing,
                "routes": dict(self._routes.routes)}

    async def shutdown(self) -> None:
        """Stop accepting; uvicorn lets requests in flight finish."""
        if self._server is not None:
            self._server.should_exit = True
        if self._serve_task is not None:
            try:
                await asyncio.wait_for(asyncio.shield(self._serve_task), timeout=8.0)
            except Exception:  # noqa: BLE001 - killed next anyway
                pass

    # ------------------------------------------------------------- routes

    async def _poll_routes(self) -> None:
        failures = 0
        while True:
            try:
                table = await self.controller.listen_for_change.remote(("routes",),
                                                                       self._routes.version)
            except tray.exceptions.ActorDiedError:
                return
            except Exception:  # noqa: BLE001 - the controller restarts; ask again
                failures += 1
                await asyncio.sleep(min(0.05 * 2 ** min(failures, 6), 2.0))
                continue
            failures = 0
            self._routes = table
            self._routes_known.set()

    def _match(self, path: str):
        best = None
        for prefix, target in self._routes.routes.items():
            if prefix == "/" or path == prefix or path.startswith(prefix + "/"):
                if best is None or len(prefix) > len(best[0]):
                    best = (prefix, target)
        return best

    # ------------------------------------------------------------ requests

    async def _asgi(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            if scope["type"] == "websocket":
                await send({"type": "websocket.close", "code": 1003})
            return
        self._requests_total += 1
        self._requests_ongoing += 1
        try:
            timeout_s = self.options.request_timeout_s
            if timeout_s is None:
                await self._handle(scope, receive, send)
            else:
                state = {"started": False}

                async def tracking_send(message):
                    if message["type"] == "http.response.start":
                        state["started"] = True
                    await send(message)
                try:
                    await asyncio.wait_for(self._handle(scope, receive, tracking_send),
                                           timeout=timeout_s)
                except TimeoutError:
                    if not state["started"]:
                        for message in _text_messages(
                                408, f"Request timed out after {timeout_s} s"):
                            await send(message)
        finally:
            self._requests_ongoing -= 1

    async def _handle(self, scope, receive, send) -> None:
        from starlette.responses import JSONResponse, PlainTextResponse

        path = scope["path"]
        if path == "/-/healthz":
            await PlainTextResponse("success")(scope, receive, send)
            return
        await self._routes_known.wait()
        if path == "/-/routes":
            routes = {prefix: app for prefix, (app, _) in self._routes.routes.items()}
            await JSONResponse(routes)(scope, receive, send)
            return
        match = self._match(path)
        if match is None:
            await PlainTextResponse(
                f"Path '{path}' not found. Ping http://.../-/routes for available routes.",
                status_code=404)(scope, receive, send)
            return
        prefix, (app_name, ingress) = match
        try:
            body = await self._read_body(scope, receive)
        except _BodyTooLarge:
            # Closed after: the rest of the body is not read, nor waited for.
            await PlainTextResponse(
                f"Request body exceeds {self.options.max_request_body_bytes} bytes",
                status_code=413, headers={"connection": "close"})(scope, receive, send)
            return
        request = HTTPRequestData(portable_scope(scope, prefix), body)
        router = router_for(app_name, ingress)
        meta = RequestMetadata(request_id=router.next_request_id(), is_http=True, route=prefix)
        for attempt in range(MAX_REQUEST_RETRIES + 1):
            try:
                ref, replica = await router.assign_async(meta, "handle_http", (request,), {})
            except (BackPressureError, RayServeException) as error:
                for message in _text_messages(503, str(error)):
                    await send(message)
                return
            state = {"started": False, "stream_id": ""}
            try:
                await self._forward(ref, replica, send, state)
                return
            except OSError:
                # The client went away: stop the stream at the replica.
                if state["stream_id"]:
                    replica.actor.cancel_stream.remote(state["stream_id"])
                return
            except Exception as error:  # noqa: BLE001 - sent again, or reported
                if not state["started"] and attempt < MAX_REQUEST_RETRIES and \
                        await router.retryable_async(replica.replica_id, error):
                    continue
                if not state["started"]:
                    text = f"{type(error).__name__}: {error}"
                    if isinstance(error, tray.exceptions.ActorDiedError):
                        text = f"The replica handling the request died: {error}"
                    for message in _text_messages(500, text):
                        await send(message)
                return
            finally:
                router.finished_async(replica.replica_id)

    async def _read_body(self, scope, receive) -> bytes:
        chunks, size = [], 0
        limit = self.options.max_request_body_bytes
        for name, value in scope.get("headers", ()):
            # A declared length over the limit is refused before any of it comes.
            if name.lower() == b"content-length" and (not value.strip().isdigit()
                                                      or int(value) > limit):
                raise _BodyTooLarge
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                break
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                raise _BodyTooLarge
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        return b"".join(chunks)

    async def _forward(self, ref, replica, send, state: dict) -> None:
        """Send the replica's ASGI messages on as they come; raises the
        request's error (``state["started"]`` says whether the client got a
        response start already)."""
        batch = await ref
        while True:
            state["stream_id"] = batch.stream_id or state["stream_id"]
            for message in batch.items:
                if message["type"] == "http.response.start":
                    state["started"] = True
                await send(message)
            if batch.done:
                if batch.error is not None:
                    raise batch.error
                return
            batch = await replica.actor.next_chunks.remote(state["stream_id"])


ProxyActor = tray.remote(max_concurrency=1_000_000)(ServeProxy)
