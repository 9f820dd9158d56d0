"""The dashboard's doors, on a live local cluster (issue 43 items 4 and 5):
every route but the health check wants the cluster token (a header, or
the cookie of one login through the URL printed at start), a ``Host`` that
does not name this machine is refused, a half-sent request is answered 408
and closed within the bound, and a crowd of them sheds the oldest instead of
using up the process's file descriptors."""

from __future__ import annotations

import http.cookiejar
import json
import os
import re
import socket
import time
import urllib.error
import urllib.request

import pytest
from polling import wait_for  # (tests/ is on sys.path)

import tray
from tray.backends.local.session import free_port
from tray.dashboard import dashboard_key
from tray.dashboard.server import HEADER_TIMEOUT_S, WAITING_FOR_HEADERS_MAX

pytestmark = pytest.mark.skipif(
    "local" not in os.environ.get("TRAY_TEST_BACKENDS", "sim,local").split(","),
    reason="the dashboard needs real processes (the local backend)")


def _request(url: str, headers: dict | None = None, opener=None):
    """(status, headers, body text) of a GET, errors included."""
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with (opener or urllib.request.urlopen)(request, timeout=10) as response:
            return response.status, response.headers, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.headers, error.read().decode()


@pytest.fixture
def dashboard(capfd):
    context = tray.init(num_cpus=1, dashboard_port=free_port())
    try:
        url = "http://" + context["webui_url"]
        wait_for(lambda: _request(url + "/api/healthz")[0] == 200, "the dashboard to serve",
                 retry_on=(OSError,))
        with open(os.path.join(context["session_dir"], "token")) as file:
            token = file.read().strip()
        printed = capfd.readouterr().err
        yield url, token, context, printed
    finally:
        tray.shutdown()


def test_pages_and_logs_need_the_token_or_the_login_cookie(dashboard):
    url, token, context, printed = dashboard

    @tray.remote
    def speak():
        print("a line only the token holders may read")
        return os.getpid()
    tray.get(speak.remote())
    bearer = {"Authorization": f"Bearer {token}"}

    def worker_log():
        files = json.loads(_request(url + "/api/logs", bearer)[2])
        for entry in files:
            if entry["name"].endswith(".out"):
                status, _, text = _request(url + "/logs/view?name=" + entry["name"], bearer)
                if status == 200 and "a line only the token holders" in text:
                    return entry["name"]
        return None
    log = wait_for(worker_log, "the worker's output in the dashboard")
    view = url + "/logs/view?name=" + log

    # Without a credential, or with a wrong one: nothing but the refusal.
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Cookie": "tray_dashboard_1=x"}):
        for path in ("/", "/logs", "/jobs", "/tasks", "/api/logs", "/api/tasks", "/metrics"):
            status, _, text = _request(url + path, headers)
            assert status == 401, (path, headers, status)
        status, _, text = _request(view, headers)
        assert status == 401 and "a line only the token holders" not in text
    assert "token" in json.loads(_request(url + "/api/logs")[2])["error"]
    assert "<form" in _request(url + "/logs")[2]  # a browser is shown the login form

    # The URL printed at start logs a browser in: a cookie, then every page.
    printed_url = re.search(r"view the dashboard at (\S+)", printed).group(1)
    assert printed_url == f"{url}/?token={dashboard_key(token.encode())}"
    assert token not in printed  # the key, not the cluster's token
    jar = http.cookiejar.CookieJar()
    browser = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar)).open
    status, _, text = _request(printed_url, opener=browser)
    assert status == 200 and "1 live node(s)" in text
    [cookie] = list(jar)
    assert cookie.has_nonstandard_attr("HttpOnly")
    status, _, text = _request(view, opener=browser)
    assert status == 200 and "a line only the token holders may read" in text
    # The header works as well, and the health check needs nothing.
    assert _request(view, bearer)[0] == 200
    status, _, text = _request(url + "/api/healthz")
    assert (status, text) == (200, "ok")

    # The login form, with the cluster's token, leads back to the page asked for.
    form = urllib.request.Request(url + "/login", data=f"token={token}&next=/tasks".encode())
    other = urllib.request.build_opener(urllib.request.HTTPCookieProcessor()).open
    with other(form, timeout=10) as response:
        assert response.status == 200 and response.url.endswith("/tasks")
    wrong = urllib.request.Request(url + "/login", data=b"token=nope&next=/tasks")
    with pytest.raises(urllib.error.HTTPError) as refused:
        other(wrong, timeout=10)
    assert refused.value.code == 401
    assert _request(url + "/tasks?token=nope")[0] == 401

    # The key opens the pages, not the job API (that runs commands: the token only).
    key_bearer = {"Authorization": f"Bearer {dashboard_key(token.encode())}"}
    assert _request(url + "/api/tasks", key_bearer)[0] == 200
    assert _request(url + "/api/jobs/", key_bearer)[0] == 401
    assert _request(url + "/api/jobs/", bearer)[0] == 200


def test_a_host_that_does_not_name_this_machine_is_refused(dashboard):
    url, token, _, _ = dashboard
    port = url.rsplit(":", 1)[1]
    bearer = {"Authorization": f"Bearer {token}"}
    for host in (f"rebound.example.com:{port}", "evil.test", f"10.9.9.9:{port}"):
        status, _, text = _request(url + "/logs", {**bearer, "Host": host})
        assert status == 403, host
        assert "does not name this machine" in text
    assert _request(url + "/api/healthz", {"Host": "rebound.example.com"})[0] == 403
    for host in (f"127.0.0.1:{port}", f"localhost:{port}", "localhost:9000"):
        assert _request(url + "/logs", {**bearer, "Host": host})[0] == 200, host


def _half_sent(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.sendall(b"GET /api/healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
    return sock


def _closed_within(sock: socket.socket, timeout_s: float) -> bytes | None:
    """What the server sent before closing, or None if it kept it open."""
    sock.settimeout(timeout_s)
    received = b""
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            chunk = sock.recv(4096)
            if not chunk:
                return received
            received += chunk
    except TimeoutError:
        return None
    except ConnectionResetError:
        return received
    return None


def test_a_half_sent_request_is_closed_within_the_bound(dashboard):
    url, token, _, _ = dashboard
    port = int(url.rsplit(":", 1)[1])
    started = time.monotonic()
    held = _half_sent(port)
    # Meanwhile the dashboard serves others.
    assert _request(url + "/logs", {"Authorization": f"Bearer {token}"})[0] == 200
    answer = _closed_within(held, HEADER_TIMEOUT_S + 10)
    took = time.monotonic() - started
    assert answer is not None, "the half-sent request was held past its bound"
    assert answer.startswith(b"HTTP/1.1 408"), answer
    assert HEADER_TIMEOUT_S - 1 < took < HEADER_TIMEOUT_S + 10
    held.close()


def test_a_crowd_of_half_sent_requests_sheds_the_oldest(dashboard):
    url, token, _, _ = dashboard
    port = int(url.rsplit(":", 1)[1])
    extra = 20
    crowd = []
    try:
        for _ in range(WAITING_FOR_HEADERS_MAX + extra):
            crowd.append(_half_sent(port))
        # The oldest are let go at once, not after the header bound.
        assert all(_closed_within(sock, 5) is not None for sock in crowd[:extra])
        assert _request(url + "/api/healthz")[0] == 200
        assert _request(url + "/logs", {"Authorization": f"Bearer {token}"})[0] == 200
    finally:
        for sock in crowd:
            sock.close()


def test_the_dashboard_exits_with_its_head_even_out_of_file_descriptors():
    """Half-sent connections past the process's descriptor limit (its
    watcher's psutil then fails with EMFILE): the followed process's end
    still ends the dashboard, within EXIT_GRACE_S and a poll."""
    import resource
    import subprocess
    import sys

    from tray.dashboard.server import EXIT_GRACE_S

    context = tray.init(num_cpus=1, include_dashboard=False)
    follow = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    port = free_port()

    def few_descriptors():
        resource.setrlimit(resource.RLIMIT_NOFILE, (48, 48))
    dashboard = subprocess.Popen(
        [sys.executable, "-m", "tray.dashboard", "--gcs", context["gcs_address"],
         "--session", context["session_dir"], "--port", str(port),
         "--follow-pid", str(follow.pid)],
        preexec_fn=few_descriptors, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL)
    crowd = []
    try:
        wait_for(lambda: _request(f"http://127.0.0.1:{port}/api/healthz")[0] == 200,
                 "the dashboard to serve", retry_on=(OSError,))
        for _ in range(80):
            try:
                crowd.append(_half_sent(port))
            except OSError:
                break
        time.sleep(1.0)  # its watcher polls while out of descriptors
        follow.kill()
        follow.wait()
        dashboard.wait(timeout=EXIT_GRACE_S + 10)
    finally:
        for sock in crowd:
            sock.close()
        follow.kill()
        dashboard.kill()
        dashboard.wait()
        follow.wait()
        tray.shutdown()
