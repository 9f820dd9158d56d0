"""HTTP between the proxy and a replica: what crosses the actor call, and
how a replica runs a request through ASGI.

The proxy (uvicorn + Starlette) reads the request and sends the replica its
ASGI scope (the picklable part) and body. The replica runs an ASGI
application on them: the user's FastAPI/Starlette app for an ``@serve.ingress``
class, else an adapter that gives the deployment's ``__call__`` a
``starlette.requests.Request`` and turns what it returns into a Starlette
response (a ``Response`` as is; ``str`` as text; ``bytes`` as bytes; other
values as JSON). The ASGI messages the application sends go back to the
proxy in batches, through the replica's stream protocol, so a
``StreamingResponse`` streams. An exception before the response started
becomes a 500 whose body is the error's message."""

from __future__ import annotations

import asyncio
import inspect
import logging
from dataclasses import dataclass

logger = logging.getLogger("tray.serve")

# The scope keys a replica needs (the rest belong to the proxy's server).
SCOPE_KEYS = ("type", "asgi", "http_version", "method", "scheme", "path", "raw_path",
              "query_string", "root_path", "headers", "client", "server")


@dataclass(frozen=True)
class HTTPRequestData:
    scope: dict
    body: bytes


def portable_scope(scope: dict, route_prefix: str) -> dict:
    """The scope a replica gets. The route prefix becomes its root_path, as
    in Ray, so an ingress app's routes are relative to it (``/api`` itself
    reaches the app's ``/``)."""
    portable = {key: scope[key] for key in SCOPE_KEYS if key in scope}
    portable["headers"] = [(bytes(k), bytes(v)) for k, v in scope.get("headers", [])]
    portable.setdefault("asgi", {"version": "3.0"})
    portable["type"] = "http"
    if route_prefix != "/":
        portable["root_path"] = route_prefix
        if portable["path"] == route_prefix:
            portable["path"] = route_prefix + "/"
    else:
        portable["root_path"] = ""
    return portable


def to_response(result):
    """What a deployment's ``__call__`` returned, as a Starlette response."""
    from starlette.responses import JSONResponse, PlainTextResponse, Response

    if isinstance(result, Response):
        return result
    if isinstance(result, (bytes, bytearray, memoryview)):
        return Response(content=bytes(result), media_type="application/octet-stream")
    if isinstance(result, str):
        return PlainTextResponse(result)
    try:
        return JSONResponse(result)
    except (TypeError, ValueError) as error:
        raise TypeError(f"an HTTP deployment returned a {type(result).__name__}, which is "
                        f"not JSON-serializable: return a str, bytes, a JSON-serializable "
                        f"value or a starlette Response") from error


def plain_asgi_app(call):
    """An ASGI app that calls ``call(request)`` (a deployment's __call__)."""
    from starlette.requests import Request

    async def app(scope, receive, send):
        request = Request(scope, receive)
        result = call(request)
        if inspect.isawaitable(result):
            result = await result
        await to_response(result)(scope, receive, send)
    return app


def error_messages(error: BaseException) -> list:
    """A 500 response carrying the error's message."""
    text = f"{type(error).__name__}: {error}".encode()
    return [{"type": "http.response.start", "status": 500,
             "headers": [(b"content-type", b"text/plain; charset=utf-8"),
                         (b"content-length", str(len(text)).encode())]},
            {"type": "http.response.body", "body": text, "more_body": False}]


async def run_asgi(app, request: HTTPRequestData, emit) -> None:
    """Run ``app`` on the request; ``emit(message)`` gets each ASGI message
    it sends. Errors before the response started become a 500."""
    body_given = False
    finished = asyncio.Event()
    started = False

    async def receive():
        nonlocal body_given
        if not body_given:
            body_given = True
            return {"type": "http.request", "body": request.body, "more_body": False}
        await finished.wait()  # no disconnect is reported until the app is done
        return {"type": "http.disconnect"}

    async def send(message):
        nonlocal started
        if message["type"] == "http.response.start":
            started = True
        await emit(message)

    try:
        await app(dict(request.scope), receive, send)
    except Exception as error:  # noqa: BLE001 - the user's error, reported as a 500
        logger.warning("request to %s failed: %s: %s", request.scope.get("path"),
                       type(error).__name__, error)
        if started:
            raise
        for message in error_messages(error):
            await emit(message)
    finally:
        finished.set()


def bind_ingress_app(app, cls, instance):
    """An ``@serve.ingress(app)`` class's app with the class's route methods
    bound to the replica's instance (FastAPI routes whose endpoint is a
    function of the class get ``self``)."""
    try:
        from fastapi.routing import APIRoute
    except ImportError:  # a plain ASGI app: nothing to bind
        return app
    routes = getattr(getattr(app, "router", None), "routes", None)
    if routes is None:
        return app
    members = {name: member for name, member in vars(cls).items() if callable(member)}
    for index, route in enumerate(list(routes)):
        if not isinstance(route, APIRoute):
            continue
        endpoint = route.endpoint
        name = getattr(endpoint, "__name__", "")
        if members.get(name) is not endpoint:
            continue
        bound = getattr(instance, name)
        routes[index] = APIRoute(
            route.path, bound, methods=sorted(route.methods or ()), name=route.name,
            response_model=route.response_model, status_code=route.status_code,
            tags=route.tags, dependencies=route.dependencies, summary=route.summary,
            description=route.description, response_description=route.response_description,
            responses=route.responses, deprecated=route.deprecated,
            include_in_schema=route.include_in_schema, response_class=route.response_class,
            dependency_overrides_provider=route.dependency_overrides_provider,
            callbacks=route.callbacks, openapi_extra=route.openapi_extra)
    return app
