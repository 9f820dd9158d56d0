"""Serve's HTTP proxy against half-sent, oversized and ambiguous requests,
on real processes (issue 43 item 5): a body declared over the limit is
answered 413 at once (not after waiting for it), a request with both
``Content-Length`` and ``Transfer-Encoding`` is a 400, and a request whose
headers never end is answered 408 and closed within the bound while others
are served."""

from __future__ import annotations

import os
import socket
import time

import pytest
from test_dashboard_guard import _closed_within  # (tests/ is on sys.path)

import tray
from tray import serve
from tray.backends.local.session import free_port
from tray.serve._proxy import HEADER_TIMEOUT_S

httpx = pytest.importorskip("httpx")

pytestmark = pytest.mark.skipif(
    "local" not in os.environ.get("TRAY_TEST_BACKENDS", "sim,local").split(","),
    reason="HTTP needs real processes (the local backend)")


@serve.deployment(ray_actor_options={"num_cpus": 0})
class Size:
    async def __call__(self, request):
        return str(len(await request.body()))


@pytest.fixture
def proxy():
    tray.init(num_cpus=2, include_dashboard=False)
    port = free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    try:
        serve.run(Size.bind(), name="size", route_prefix="/size")
        yield port
    finally:
        serve.shutdown()
        tray.shutdown()


def _send(port: int, raw: bytes) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.sendall(raw)
    return sock


def test_the_proxy_refuses_oversized_ambiguous_and_half_sent_requests(proxy):
    port = proxy
    url = f"http://127.0.0.1:{port}/size"
    assert httpx.post(url, content=b"x" * 1000, timeout=30).text == "1000"

    # 200 MiB declared, past the 100 MiB limit, nothing of it sent: 413 at once.
    started = time.monotonic()
    with _send(port, b"POST /size HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                     b"Content-Length: 209715200\r\n\r\n") as sock:
        answer = _closed_within(sock, 10)
    assert answer is not None and answer.startswith(b"HTTP/1.1 413"), answer
    assert time.monotonic() - started < 5

    # Content-Length and Transfer-Encoding both: refused, never passed on.
    with _send(port, b"POST /size HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 4\r\n"
                     b"Transfer-Encoding: chunked\r\n\r\n4\r\nabcd\r\n0\r\n\r\n") as sock:
        answer = _closed_within(sock, 10)
    assert answer is not None and answer.startswith(b"HTTP/1.1 400"), answer

    # Headers that never end: 408 and closed within the bound; others served meanwhile.
    started = time.monotonic()
    with _send(port, b"GET /size HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ") as held:
        assert httpx.post(url, content=b"abc", timeout=30).text == "3"
        answer = _closed_within(held, HEADER_TIMEOUT_S + 10)
    assert answer is not None, "the half-sent request was held past its bound"
    assert answer.startswith(b"HTTP/1.1 408"), answer
    assert time.monotonic() - started < HEADER_TIMEOUT_S + 10
