"""The dashboard on a live local cluster, seen through headless Chromium
(Debian's ``chromium`` driven by playwright, no downloaded browser), its
JSON twins, ``/metrics`` and its lifecycle (``include_dashboard=False``,
``tray start --head``/``tray stop``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.error
import urllib.request

import pytest
from polling import wait_for  # (tests/ is on sys.path)
from prometheus_client.parser import text_string_to_metric_families

import tray
from tray.backends.local.session import free_port
from tray.dashboard.data import ClusterReader

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu",
                  "--disable-background-networking", "--disable-component-update",
                  "--disable-sync", "--no-first-run"]
SCREENSHOT_DIR = os.environ.get("TRAY_DASHBOARD_SCREENSHOTS")


def _get(url: str, token: str | None = None, timeout_s: float = 10.0) -> str:
    """The page at ``url``, asked with the cluster's token (every route but
    the health check needs it)."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    request = urllib.request.Request(url, headers=headers)
    with urllib.request.urlopen(request, timeout=timeout_s) as response:
        return response.read().decode()


def _token(session_dir: str) -> str:
    with open(os.path.join(session_dir, "token")) as file:
        return file.read().strip()


@pytest.fixture
def live_cluster():
    """(One cluster for every check of the pages: the suite's autouse
    teardown ends a cluster after each test.) A local cluster with finished tasks, a failed task, a live named
    actor that printed to its log, and a killed actor."""
    context = tray.init(num_cpus=2, dashboard_port=free_port())
    try:
        assert context.dashboard_url == context["webui_url"]
        url = "http://" + context["webui_url"]
        token = _token(context["session_dir"])

        @tray.remote
        def square(x):
            from tray.util.metrics import Counter

            Counter("app_squares", description="squares computed").inc()
            return x * x

        @tray.remote(max_retries=0)
        def explode():
            raise ValueError("the dashboard must show this failure")

        @tray.remote
        class Greeter:
            def greet(self, name):
                print(f"hello {name} from the greeter's log")
                return f"hello {name}"

        @tray.remote
        class Doomed:
            def ping(self):
                return "pong"

        assert tray.get([square.remote(i) for i in range(6)]) == [0, 1, 4, 9, 16, 25]
        with pytest.raises(ValueError):
            tray.get(explode.remote())
        greeter = Greeter.options(name="front-desk").remote()
        assert tray.get(greeter.greet.remote("ada")) == "hello ada"

        def tasks_reported():
            tasks = json.loads(_get(url + "/api/tasks", token))["tasks"]
            # (worker_pid: the executor's own events arrived too, which the
            # timeline's bars are made of; the owner's FINISHED or FAILED may
            # come first.)
            failed = [t for t in tasks if t["state"] == "FAILED" and t["error_message"]
                      and t.get("worker_pid")]
            squares = [t for t in tasks if "square" in (t["func_or_class_name"] or "")
                       and t["state"] == "FINISHED" and t.get("worker_pid")]
            return failed and len(squares) == 6
        # The executor's events (the traceback) leave with its next flush: the
        # doomed actor below may reuse that worker, so it is killed only after.
        wait_for(tasks_reported, "the task events to reach the dashboard", retry_on=(OSError,))
        doomed = Doomed.remote()
        assert tray.get(doomed.ping.remote()) == "pong"
        tray.kill(doomed)

        def killed():
            actors = json.loads(_get(url + "/api/actors", token))
            return [a for a in actors if a["class_name"] == "Doomed" and a["state"] == "DEAD"]
        wait_for(killed, "the killed actor to show DEAD", retry_on=(OSError,))
        held = tray.put(b"x" * 300_000)  # the objects page lists the driver's reference
        yield url, context, held
    finally:
        tray.shutdown()


# The browser runs in a process of its own: playwright's sync API drives
# asyncio, which trio-asyncio (imported once a cluster runs async actors)
# has taken over in this one.
_BROWSER_SCRIPT = r"""
import json, os, sys
from playwright.sync_api import sync_playwright
spec = json.load(sys.stdin)
out = []
with sync_playwright() as playwright:
    browser = playwright.chromium.launch(executable_path=spec["chromium"], args=spec["flags"],
                                         headless=True)
    # One browser context: the login's cookie serves every visit after it.
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    for visit in spec["visits"]:
        page = context.new_page()
        response = page.goto(spec["url"] + visit["path"], wait_until="load", timeout=30000)
        if spec["screenshots"]:
            page.screenshot(path=os.path.join(spec["screenshots"], visit["name"] + ".png"),
                            full_page=True)
        result = {"status": response.status, "text": page.inner_text("body"),
                  "rows": [row.inner_text() for row in page.query_selector_all("tr")]}
        if visit.get("click"):
            page.click(visit["click"])
            page.wait_for_load_state("load")
            result["clicked_text"] = page.inner_text("body")
        out.append(result)
        page.close()
    browser.close()
json.dump(out, sys.stdout)
"""


def _in_chromium(url: str, visits: list[dict]) -> dict:
    """Each visit's page as headless Chromium rendered it: its text, its
    table rows, and (with ``click``) the text of the page a click led to."""
    if not os.path.exists(CHROMIUM):
        pytest.skip("Debian's chromium is not installed (apt-get install -y chromium)")
    pytest.importorskip("playwright.sync_api")
    spec = {"chromium": CHROMIUM, "flags": CHROMIUM_FLAGS, "url": url, "visits": visits,
            "screenshots": SCREENSHOT_DIR}
    done = subprocess.run([sys.executable, "-c", _BROWSER_SCRIPT], input=json.dumps(spec),
                          capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(done.stdout)
    for visit, result in zip(visits, results, strict=True):
        assert result["status"] == 200, visit
    return {visit["name"]: result for visit, result in zip(visits, results, strict=True)}


def test_the_dashboard_shows_the_live_cluster(live_cluster):
    _every_page_shows_the_live_cluster_in_chromium(live_cluster)
    _timeline_json_is_a_chrome_trace_with_a_track_per_worker(live_cluster)
    _metrics_endpoint_has_ray_names_and_live_values(live_cluster)
    _a_log_name_outside_the_session_is_refused(live_cluster)


def _every_page_shows_the_live_cluster_in_chromium(live_cluster):
    url, context, held = live_cluster
    from tray.dashboard import dashboard_key

    key = dashboard_key(_token(context["session_dir"]).encode())
    pages = _in_chromium(url, [
        {"name": "login", "path": f"/?token={key}"},  # as tray.init() printed it
        {"name": "overview", "path": "/"},
        {"name": "actors", "path": "/actors",
         "click": "tr:has-text('front-desk') >> a:has-text('out')"},
        {"name": "tasks", "path": "/tasks"},
        {"name": "objects", "path": "/objects"},
        {"name": "logs", "path": "/logs"},
        {"name": "timeline", "path": "/timeline"},
        {"name": "jobs", "path": "/jobs"}])

    text = pages["overview"]["text"]
    assert "1 live node(s)" in text
    assert context["node_id"][:16] in text
    assert "CPU" in text and "Object store" in text

    rows = pages["actors"]["rows"]
    greeter = [r for r in rows if "Greeter" in r]
    doomed = [r for r in rows if "Doomed" in r]
    assert greeter and "front-desk" in greeter[0] and "ALIVE" in greeter[0]
    assert doomed and "DEAD" in doomed[0] and "kill" in doomed[0].lower()
    # The greeter's log is one click away and holds what it printed.
    assert "hello ada from the greeter's log" in pages["actors"]["clicked_text"]

    text = pages["tasks"]["text"]
    assert "Failures (1)" in text
    assert "the dashboard must show this failure" in text
    assert "ValueError" in text and "Traceback" in text
    square = [r for r in pages["tasks"]["rows"] if r.split("\t")[0].endswith("square")]
    assert square and square[0].split("\t")[-1].strip() == "6", square  # 6 FINISHED in all

    assert "Object store per node" in pages["objects"]["text"]
    assert held.hex()[:24] in pages["objects"]["text"]
    assert context["node_id"][:16] in pages["objects"]["text"]
    assert "logs/worker-" in pages["logs"]["text"]
    greeter_logs = [r for r in pages["logs"]["rows"] if "actor Greeter 'front-desk'" in r]
    assert len(greeter_logs) == 2  # its stdout and stderr, named by whose they are
    assert "Download the timeline" in pages["timeline"]["text"]
    # This test's own driver is a job of the cluster.
    assert any("DRIVER" in row and "RUNNING" in row for row in pages["jobs"]["rows"])


def _timeline_json_is_a_chrome_trace_with_a_track_per_worker(live_cluster):
    url, context, _ = live_cluster
    events = json.loads(_get(url + "/api/timeline", _token(context["session_dir"])))
    squares = [e for e in events if "square" in e["name"] and e["cat"] == "task"]
    assert len(squares) == 6
    for event in squares:
        assert event["ph"] == "X" and event["dur"] >= 0 and event["ts"] > 0
        assert event["pid"].startswith("Node ") and event["tid"].startswith("Worker ")
    failed = [e for e in events if "explode" in e["name"] and e["cat"] == "task"]
    assert failed and failed[0]["args"]["state"] == "FAILED"


def _metrics_endpoint_has_ray_names_and_live_values(live_cluster):
    url, context, _ = live_cluster
    token = _token(context["session_dir"])
    families = {f.name: f for f in text_string_to_metric_families(_get(url + "/metrics",
                                                                         token))}
    tasks = {(s.labels["State"], s.labels["Name"]): s.value
             for s in families["ray_tasks"].samples}
    assert tasks[("FAILED", next(n for (_, n) in tasks if "explode" in n))] == 1
    assert sum(v for (state, name), v in tasks.items()
               if state == "FINISHED" and "square" in name) == 6
    actors = {(s.labels["State"], s.labels["Name"]): s.value
              for s in families["ray_actors"].samples}
    assert actors[("ALIVE", "Greeter")] == 1 and actors[("DEAD", "Doomed")] == 1
    cpu = {s.labels["State"]: s.value for s in families["ray_resources"].samples
           if s.labels["Name"] == "CPU" and s.labels["NodeId"] == context["node_id"]}
    assert cpu["USED"] + cpu["AVAILABLE"] == 2
    assert families["ray_cluster_active_nodes"].samples[0].value == 1
    counts = [s for s in families["tray_task_duration_seconds"].samples
              if s.name.endswith("_count")]
    assert counts and counts[0].value >= 7
    assert "ray_object_store_memory" in families
    workers = {s.labels["State"]: s.value for s in families["tray_workers"].samples
               if s.labels["NodeId"] == context["node_id"]}
    assert workers.get("actor", 0) >= 1  # the greeter's worker
    # A user metric, aggregated over the workers that recorded it (flushed
    # within a second).

    def user_metric():
        text = _get(url + "/metrics", token)
        found = {f.name: f for f in text_string_to_metric_families(text)}.get("app_squares")
        return found and [s.value for s in found.samples if s.name == "app_squares_total"]
    assert wait_for(user_metric, "the user metric in /metrics", timeout_s=15) == [6.0]


def _a_log_name_outside_the_session_is_refused(live_cluster):
    url, context, _ = live_cluster
    page = _get(url + "/logs/view?name=../token", _token(context["session_dir"]))
    assert "No log file" in page
    reader = ClusterReader(context["gcs_address"], b"unused", context["session_dir"])
    assert os.path.exists(os.path.join(context["session_dir"], "token"))
    with pytest.raises(FileNotFoundError):
        reader.read_log("token")
    with pytest.raises(FileNotFoundError):
        reader.read_log("../etc/passwd.log")


def test_include_dashboard_false_starts_none():
    context = tray.init(num_cpus=1, include_dashboard=False)
    try:
        assert context["webui_url"] is None
        session = context["session_dir"]
        assert not os.path.exists(os.path.join(session, "dashboard.log"))
    finally:
        tray.shutdown()


def test_the_simulator_accepts_rays_dashboard_options_and_serves_none():
    # Ray programs pass include_dashboard=False; a simulated cluster has no
    # sockets to serve one on.
    context = tray.init(backend="sim", seed=1, include_dashboard=False, dashboard_port=8265)
    try:
        assert context.address_info.get("webui_url") is None
        assert context.dashboard_url is None
        assert tray.get(tray.put(3)) == 3
    finally:
        tray.shutdown()


def test_tray_start_head_serves_the_dashboard_until_stop(tmp_path):
    root = tmp_path / "sessions"
    env = {**os.environ, "TRAY_SESSION_ROOT": str(root)}
    env.pop("TRAY_CLUSTER_TOKEN", None)
    dashboard_port = free_port()

    def cli(*args):
        return subprocess.run([sys.executable, "-m", "tray.scripts.cli", *args], env=env,
                              capture_output=True, text=True, timeout=120)
    started = cli("start", "--head", "--port", str(free_port()), "--num-cpus", "1",
                  "--dashboard-port", str(dashboard_port))
    try:
        assert started.returncode == 0, started.stderr
        url = f"http://127.0.0.1:{dashboard_port}"
        # Printed with the key that logs a browser in, by start, status and dashboard.
        assert f"Dashboard:                 {url} (log in: {url}/?token=" in started.stdout
        login = started.stdout.split("(log in: ", 1)[1].split(")")[0]
        assert f"Dashboard: {url} (log in: {login})" in cli("status").stdout
        assert cli("dashboard").stdout.strip() == login
        browser = urllib.request.build_opener(urllib.request.HTTPCookieProcessor())

        def logged_in():
            with browser.open(login, timeout=10) as response:  # a cookie, then the page
                return response.read().decode()
        page = wait_for(logged_in, "the dashboard to serve", retry_on=(OSError,))
        assert "1 live node(s)" in page
        with pytest.raises(urllib.error.HTTPError) as refused:
            _get(url + "/")
        assert refused.value.code == 401
        # The job API is mounted and wants the token.
        with pytest.raises(urllib.error.HTTPError) as refused:
            _get(url + "/api/jobs/")
        assert refused.value.code == 401
    finally:
        stopped = cli("stop")
    assert stopped.returncode == 0

    def gone():
        try:
            _get(url + "/api/healthz", timeout_s=1)  # (needs no token)
        except OSError:
            return True
        return False
    wait_for(gone, "the dashboard to exit with its head node", timeout_s=15)


def test_a_busy_dashboard_port_is_named_and_8265_taken_means_another():
    from tray import dashboard

    with __import__("socket").socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        sock.listen()
        with pytest.raises(ValueError, match=f"dashboard port {port} on 127.0.0.1 is busy"):
            dashboard.bind_port("127.0.0.1", port)
    # Two dashboards asked for the default port at once get two ports.
    first = dashboard.bind_port("127.0.0.1", None)
    second = dashboard.bind_port("127.0.0.1", None)
    try:
        assert first.getsockname()[1] != second.getsockname()[1]
    finally:
        first.close()
        second.close()

