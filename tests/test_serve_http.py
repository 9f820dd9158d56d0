"""tray.serve over HTTP, on real processes: uvicorn + Starlette in the proxy,
Starlette requests in deployments, FastAPI ingress, status codes for errors
and overload, streaming. Every request goes to 127.0.0.1, on a port picked
free for the test (tests run in parallel)."""

from __future__ import annotations

import asyncio
import os
import socket

import pytest

import tray
from tray import serve

httpx = pytest.importorskip("httpx")
pytest.importorskip("starlette")

pytestmark = pytest.mark.skipif(
    "local" not in os.environ.get("TRAY_TEST_BACKENDS", "sim,local").split(","),
    reason="HTTP needs real processes (the local backend)")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def http_serve():
    tray.init(num_cpus=2)
    port = free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        serve.shutdown()
        tray.shutdown()


@serve.deployment(ray_actor_options={"num_cpus": 0})
class Echo:
    async def __call__(self, request):
        from starlette.responses import PlainTextResponse, Response, StreamingResponse

        kind = request.query_params.get("kind", "json")
        body = await request.body()
        if kind == "text":
            return f"{request.method} {request.url.path} {body.decode()}"
        if kind == "bytes":
            return body[::-1]
        if kind == "response":
            return PlainTextResponse("teapot", status_code=418, headers={"x-tray": "yes"})
        if kind == "raise":
            raise KeyError("no such thing")
        if kind == "stream":
            async def numbers():
                for i in range(5):
                    await asyncio.sleep(0.01)
                    yield f"{i}\n"
            return StreamingResponse(numbers(), media_type="text/plain")
        if kind == "nonjson":
            return object()
        if kind == "empty":
            return Response(status_code=204)
        return {"path": request.url.path, "root_path": request.scope["root_path"],
                "query": dict(request.query_params), "length": len(body)}


@serve.deployment(ray_actor_options={"num_cpus": 0})
class Upper:
    def __call__(self, text: str) -> str:
        return text.upper()


@serve.deployment(ray_actor_options={"num_cpus": 0})
class Shout:
    def __init__(self, upper) -> None:
        self.upper = upper

    async def __call__(self, request) -> str:
        return await self.upper.remote((await request.body()).decode())


@serve.deployment(ray_actor_options={"num_cpus": 0}, max_ongoing_requests=1,
                  max_queued_requests=1)
class Slow:
    async def __call__(self, request) -> str:
        await asyncio.sleep(1.0)
        return "slow done"


def test_http_requests_reach_deployments(http_serve):
    serve.run(Echo.bind(), name="echo", route_prefix="/echo")
    serve.run(Shout.bind(Upper.bind()), name="shout", route_prefix="/shout")
    with httpx.Client(base_url=http_serve, timeout=30) as client:
        reply = client.post("/echo/a/b?x=1", content=b"hello")
        assert reply.status_code == 200
        assert reply.json() == {"path": "/echo/a/b", "root_path": "/echo", "query": {"x": "1"},
                                "length": 5}
        assert client.get("/echo").json()["path"] == "/echo/"  # the prefix itself
        assert client.post("/echo/t?kind=text", content=b"hi").text == "POST /echo/t hi"
        reply = client.post("/echo?kind=bytes", content=b"abc")
        assert reply.content == b"cba"
        assert reply.headers["content-type"] == "application/octet-stream"
        reply = client.get("/echo?kind=response")
        assert (reply.status_code, reply.text, reply.headers["x-tray"]) == (418, "teapot", "yes")
        assert client.get("/echo?kind=empty").status_code == 204
        # An error in the deployment: 500 with its message.
        reply = client.get("/echo?kind=raise")
        assert reply.status_code == 500 and "KeyError" in reply.text and \
            "no such thing" in reply.text
        reply = client.get("/echo?kind=nonjson")
        assert reply.status_code == 500 and "not JSON-serializable" in reply.text
        # Streaming: the chunks as the deployment yields them.
        with client.stream("GET", "/echo?kind=stream") as streamed:
            assert streamed.status_code == 200
            assert "".join(streamed.iter_text()) == "0\n1\n2\n3\n4\n"
        # Composition behind HTTP.
        assert client.post("/shout", content=b"quiet").text == "QUIET"
        # The proxy's own answers.
        assert client.get("/nowhere").status_code == 404
        assert client.get("/-/routes").json() == {"/echo": "echo", "/shout": "shout"}
        assert client.get("/-/healthz").text == "success"
        large = client.post("/echo", content=b"x" * (2 * 2**20))
        assert large.json()["length"] == 2 * 2**20
    serve.delete("shout")
    with httpx.Client(base_url=http_serve, timeout=30) as client:
        assert client.post("/shout", content=b"x").status_code == 404
        assert client.get("/-/routes").json() == {"/echo": "echo"}


def test_http_overload_is_503(http_serve):
    serve.run(Slow.bind(), name="slow", route_prefix="/slow")

    async def burst():
        async with httpx.AsyncClient(base_url=http_serve, timeout=60) as client:
            first = [asyncio.ensure_future(client.get("/slow")) for _ in range(2)]
            await asyncio.sleep(0.3)  # one runs, one waits: the queue is full
            extra = await client.get("/slow")
            return [await f for f in first], extra

    accepted, refused = asyncio.run(burst())
    assert refused.status_code == 503 and "max_queued_requests=1" in refused.text
    assert [r.status_code for r in accepted] == [200, 200]
    assert [r.text for r in accepted] == ["slow done"] * 2


def test_the_port_must_be_free():
    tray.init(num_cpus=2)
    blocker = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        blocker.bind(("127.0.0.1", 0))
        blocker.listen(1)
        port = blocker.getsockname()[1]
        with pytest.raises(serve.exceptions.RayServeException, match="could not serve"):
            serve.start(http_options={"port": port})
    finally:
        blocker.close()
        serve.shutdown()
        tray.shutdown()


fastapi = pytest.importorskip("fastapi")
api = fastapi.FastAPI()


@serve.deployment(ray_actor_options={"num_cpus": 0})
@serve.ingress(api)
class Items:
    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.items = {}

    @api.get("/")
    def root(self) -> dict:
        return {"prefix": self.prefix}

    @api.put("/items/{name}")
    def put(self, name: str, value: int) -> dict:
        self.items[name] = value
        return {"stored": name}

    @api.get("/items/{name}")
    async def get(self, name: str) -> dict:
        if name not in self.items:
            raise fastapi.HTTPException(status_code=404, detail=f"no item {name}")
        return {"name": name, "value": self.items[name], "prefix": self.prefix}

    def count(self) -> int:  # not a route: reachable through the handle
        return len(self.items)


def test_fastapi_ingress(http_serve):
    handle = serve.run(Items.bind("p"), name="items", route_prefix="/api")
    with httpx.Client(base_url=http_serve, timeout=30) as client:
        assert client.get("/api").json() == {"prefix": "p"}
        assert client.put("/api/items/a", params={"value": 3}).json() == {"stored": "a"}
        assert client.get("/api/items/a").json() == {"name": "a", "value": 3, "prefix": "p"}
        missing = client.get("/api/items/zz")
        assert missing.status_code == 404 and missing.json() == {"detail": "no item zz"}
        assert client.put("/api/items/b", params={"value": "x"}).status_code == 422
        assert client.get("/api/docs").status_code == 200  # FastAPI's own pages work too
    assert handle.count.remote().result() == 1


# ================================================ bad input, real processes


@serve.deployment(ray_actor_options={"num_cpus": 0})
class Broken:
    def __init__(self) -> None:
        raise RuntimeError("no model file")


@serve.deployment(ray_actor_options={"num_cpus": 0})
class Napper:
    async def __call__(self, request) -> str:
        return "awake"

    async def nap(self, sleep_s: float) -> float:
        await asyncio.sleep(sleep_s)
        return sleep_s


def test_bad_applications_on_real_processes(http_serve):
    # A constructor that raises: serve.run says why, the status keeps it, and
    # HTTP requests to its route are refused with the reason (not left waiting).
    with pytest.raises(serve.exceptions.RayServeException, match="no model file"):
        serve.run(Broken.bind(), name="broken", route_prefix="/broken")
    app = serve.status().applications["broken"]
    assert app.status == serve.ApplicationStatus.DEPLOY_FAILED
    assert "no model file" in app.message
    assert app.deployments["Broken"].status == serve.DeploymentStatus.DEPLOY_FAILED
    with httpx.Client(base_url=http_serve, timeout=30) as client:
        refused = client.get("/broken")
        assert refused.status_code == 503 and "failed to deploy" in refused.text
    # A route prefix another application holds.
    handle = serve.run(Napper.bind(), name="napper", route_prefix="/nap")
    with pytest.raises(serve.exceptions.RayServeException,
                       match='/nap is being used by application "napper"'):
        serve.run(Napper.bind(), name="thief", route_prefix="/nap")
    assert "thief" not in serve.status().applications
    # A result not there in time: TimeoutError, and the call still completes.
    slow = handle.nap.remote(1.0)
    with pytest.raises(TimeoutError):
        slow.result(timeout_s=0.1)
    assert slow.result() == 1.0
    with httpx.Client(base_url=http_serve, timeout=30) as client:
        assert client.get("/nap").text == "awake"
        assert client.get("/-/routes").json() == {"/broken": "broken", "/nap": "napper"}


@serve.deployment(ray_actor_options={"num_cpus": 0}, num_replicas=2,
                  graceful_shutdown_wait_loop_s=0.2)
class Release:
    def __init__(self, version: str) -> None:
        self.version = version

    async def __call__(self, request) -> str:
        await asyncio.sleep(0.01)
        return self.version


def test_rolling_update_over_http_drops_no_request(http_serve):
    """HTTP requests keep flowing from another thread while serve.run rolls
    the deployment over to new code: every one gets a 200, from v1 then v2."""
    import threading

    serve.run(Release.bind("v1"), name="release", route_prefix="/release")
    answers: list = []
    answered = threading.Event()
    stop = threading.Event()

    def load() -> None:
        with httpx.Client(base_url=http_serve, timeout=30) as client:
            for _ in range(2000):  # bounded; stopped once the update is done
                last = stop.is_set()  # (this one starts after the update ended)
                reply = client.get("/release")
                answers.append((reply.status_code, reply.text))
                answered.set()
                if last:
                    return

    loader = threading.Thread(target=load)
    loader.start()
    # The first answer comes before the update starts. (Started at once, the
    # loader's first request could land mid-update, when v1 and v2 replicas
    # both serve: CI, under load, got v2 first, then v1 again.)
    assert answered.wait(30)
    try:
        serve.run(Release.bind("v2"), name="release", route_prefix="/release")
        with httpx.Client(base_url=http_serve, timeout=30) as client:
            assert client.get("/release").text == "v2"
    finally:
        stop.set()
        loader.join(timeout=60)
    assert answers and {status for status, _ in answers} == {200}
    versions = [text for _, text in answers]
    assert set(versions) <= {"v1", "v2"} and versions[0] == "v1" and versions[-1] == "v2"
