"""The dashboard's web server: a Starlette app on uvicorn, one process on
the head node (``python -m tray.dashboard``).

Pages are rendered on the server (plain HTML, a little CSS, no JavaScript
build): the cluster overview, jobs, actors, tasks, objects/memory, logs and
the timeline; each has a JSON twin under ``/api/`` and ``/metrics`` serves
Prometheus's text format. Every page is a read: nothing here changes the
cluster; but the pages show what the job API guards (logs, entrypoints,
failures), so every route but ``/api/healthz`` needs the cluster token or
the cookie of one login, and a ``Host`` that names this machine
(``_auth.py``). The job API (``job_api.routes(gcs_address=, token=,
session_dir=)``, when that module exists) is mounted under ``/api/jobs/``
and checks the cluster token itself. A client has ``HEADER_TIMEOUT_S`` to
send a request's headers, and a body must keep coming
(``tray/util/http_server.py``): a half-sent request holds no connection
for long.

The process lives as long as its cluster: it exits when the process it was
told to follow (the head node for ``tray start``, the driver for
``tray.init()``) is gone, or when the GCS has not answered for
``GCS_LOST_S``; whatever else fails in its watcher (out of file
descriptors, say), and however the server is held up, it ends its own
process ``EXIT_GRACE_S`` later."""

from __future__ import annotations

import argparse
import dataclasses
import html
import json
import os
import socket
import sys
import threading
import time
from collections import Counter
from urllib.parse import quote

import psutil
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from ..backends.local.session import human_bytes
from ..util import http_server
from ..util.http_server import refuse_ambiguous_framing
from . import DEFAULT_PORT, INFO_FILE, SESSION_ENV
from ._auth import DashboardGuard
from .data import ClusterReader

GCS_LOST_S = 10.0
WATCH_INTERVAL_S = 0.5
EXIT_GRACE_S = 5.0  # from the cluster's end to the process's, however busy the server is
HEADER_TIMEOUT_S = 10.0
BODY_IDLE_TIMEOUT_S = 30.0
WAITING_FOR_HEADERS_MAX = 128  # connections; one more sheds the oldest


@dataclasses.dataclass
class DashboardContext:
    """What a route needs to reach the cluster.

    ``gcs_address`` is ``tcp:host:port``, ``token`` the cluster token (bytes),
    ``session_dir`` the head's session directory (logs live under it)."""
    gcs_address: str
    token: bytes
    session_dir: str | None
    reader: ClusterReader


# ================================================================= HTML

_CSS = """
body{font-family:system-ui,sans-serif;margin:0;color:#1d2330;background:#f6f7f9}
header{background:#1d2330;color:#fff;padding:10px 20px;display:flex;gap:18px;align-items:center}
header b{font-size:18px;margin-right:14px}
header a{color:#cfd8ea;text-decoration:none}header a.on{color:#fff;font-weight:600}
main{padding:16px 22px}
table{border-collapse:collapse;background:#fff;margin:8px 0 18px;font-size:13px}
th,td{border:1px solid #dde1e8;padding:4px 8px;text-align:left;vertical-align:top}
th{background:#eef1f5}
pre{background:#fff;border:1px solid #dde1e8;padding:8px;font-size:12px;overflow:auto;
max-height:640px;white-space:pre-wrap}
.ALIVE,.FINISHED,.SUCCEEDED,.RUNNING{color:#137333;font-weight:600}
.DEAD,.FAILED,.STOPPED{color:#b3261e;font-weight:600}
.PENDING_CREATION,.RESTARTING,.PENDING{color:#a56200;font-weight:600}
.bar{display:inline-block;width:120px;height:10px;background:#e3e7ee;vertical-align:middle}
.bar i{display:block;height:10px;background:#3c6fd1}
.note{color:#5b6473;font-size:13px}
"""

_PAGES = (("/", "Overview"), ("/jobs", "Jobs"), ("/actors", "Actors"), ("/tasks", "Tasks"),
          ("/objects", "Objects"), ("/logs", "Logs"), ("/timeline", "Timeline"),
          ("/metrics", "Metrics"))


def _e(value) -> str:
    return html.escape("" if value is None else str(value))


def _page(title: str, path: str, body: str) -> HTMLResponse:
    nav = "".join(f'<a href="{href}" class="{"on" if href == path else ""}">{name}</a>'
                  for href, name in _PAGES)
    return HTMLResponse(
        f"<!doctype html><html><head><meta charset='utf-8'><title>tray · {_e(title)}</title>"
        f"<style>{_CSS}</style></head><body><header><b>tray dashboard</b>{nav}</header>"
        f"<main><h1>{_e(title)}</h1>{body}</main></body></html>")


def _table(headers: list[str], rows: list[list[str]], empty: str = "none") -> str:
    if not rows:
        return f"<p class='note'>{_e(empty)}</p>"
    head = "".join(f"<th>{_e(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{cell}</td>" for cell in row) + "</tr>"
                   for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _state(state) -> str:
    return f"<span class='{_e(state)}'>{_e(state)}</span>"


def _bar(used, total) -> str:
    if not total:
        return ""
    share = max(0.0, min(1.0, (used or 0) / total))
    return f"<span class='bar'><i style='width:{share * 100:.0f}%'></i></span>"


def _short(identifier, length: int = 12) -> str:
    return _e((identifier or "")[:length])


# ================================================================ pages


def _overview(ctx: DashboardContext, request: Request) -> Response:
    nodes = ctx.reader.nodes()
    actors = ctx.reader.actors()
    tasks, _ = ctx.reader.tasks()
    alive = [n for n in nodes if n["state"] == "ALIVE"]
    rows = []
    for node in nodes:
        resources = "<br>".join(
            f"{_e(name)} {node['resources_used'].get(name, 0):g}/{total:g} "
            f"{_bar(node['resources_used'].get(name, 0), total)}"
            for name, total in sorted(node["resources_total"].items())
            if name not in ("memory", "object_store_memory"))
        store = (f"{human_bytes(node['object_store_bytes_used'])} / "
                 f"{human_bytes(node['object_store_bytes_total'])} "
                 f"{_bar(node['object_store_bytes_used'], node['object_store_bytes_total'])}")
        rows.append([_short(node["node_id"], 16), _state(node["state"]), _e(node["node_ip"]),
                     _e(node["node_name"]), resources, store,
                     human_bytes(node["object_store_bytes_spilled"])])
    by_state = Counter(task["state"] for task in tasks)
    summary = (f"<p>{len(alive)} live node(s), {len(nodes) - len(alive)} dead · "
               f"{sum(1 for a in actors if a['state'] == 'ALIVE')} live actor(s) of "
               f"{len(actors)} · tasks: "
               + (", ".join(f"{_state(s)} {n}" for s, n in sorted(by_state.items())) or "none")
               + f"</p><p class='note'>GCS at {_e(ctx.gcs_address.removeprefix('tcp:'))}</p>")
    body = summary + "<h2>Nodes</h2>" + _table(
        ["Node", "State", "IP", "Host", "Resources (used/total)", "Object store", "Spilled"],
        rows)
    return _page("Cluster", "/", body)


def _jobs(ctx: DashboardContext, request: Request) -> Response:
    jobs = ctx.reader.jobs()
    rows = [[_e(j.get("job_id")), _e(j.get("type")), _state(j.get("status")),
             _e(j.get("entrypoint") or j.get("driver_address")), _e(j.get("message")),
             _e(_ms_date(j.get("start_time"))), _e(_ms_date(j.get("end_time")))]
            for j in jobs]
    body = _table(["Job", "Type", "Status", "Entrypoint / driver", "Message", "Started",
                   "Ended"], rows, "no jobs")
    body += ("<p class='note'>Submit one with <code>tray job submit -- python "
             "script.py</code>; its logs: <code>tray job logs ID</code>.</p>")
    return _page("Jobs", "/jobs", body)


def _ms_date(ms) -> str:
    if not ms:
        return ""
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ms / 1000))


def _actors(ctx: DashboardContext, request: Request) -> Response:
    actors = ctx.reader.actors()
    rows = []
    for actor in actors:
        logs = ctx.reader.worker_log_names(actor["worker_id"]) if actor["worker_id"] else []
        links = " ".join(f"<a href='/logs/view?name={quote(n)}'>{_e(n.rsplit('.', 1)[1])}</a>"
                         for n in logs)
        rows.append([_short(actor["actor_id"], 16), _e(actor["class_name"]), _e(actor["name"]),
                     _state(actor["state"]), _short(actor["node_id"]), _e(actor["pid"]),
                     _e(actor["num_restarts"]), _e(actor["death_cause"]), links])
    body = _table(["Actor", "Class", "Name", "State", "Node", "PID", "Restarts",
                   "Death cause", "Logs"], rows, "no actors")
    return _page(f"Actors ({len(actors)})", "/actors", body)


def _tasks(ctx: DashboardContext, request: Request) -> Response:
    tasks, meta = ctx.reader.tasks()
    by_name: dict[str, Counter] = {}
    for task in tasks:
        by_name.setdefault(task.get("func_or_class_name") or task.get("name") or "?",
                           Counter())[task["state"]] += 1
    states = sorted({state for counts in by_name.values() for state in counts})
    summary = _table(["Function", *states, "Total"],
                     [[_e(name), *(str(counts.get(s, 0)) for s in states),
                       str(sum(counts.values()))] for name, counts in sorted(by_name.items())],
                     "no task events yet")
    failed = [t for t in tasks if t["state"] == "FAILED"]
    failures = "".join(
        f"<h3>{_e(t.get('func_or_class_name') or t.get('name'))} "
        f"<span class='note'>task {_short(t['task_id'], 16)} attempt {t['attempt_number']} "
        f"on node {_short(t.get('node_id'))}</span></h3>"
        f"<p>{_state('FAILED')} {_e(t.get('error_type'))}</p>"
        f"<pre>{_e(t.get('error_message'))}</pre>" for t in failed[-50:])
    recent = [[_short(t["task_id"], 16), _e(t.get("func_or_class_name") or t.get("name")),
               _state(t["state"]), _e(t.get("type")), _short(t.get("node_id")),
               _e(t.get("worker_pid")),
               "" if t.get("duration_s") is None else f"{t['duration_s'] * 1000:.1f} ms",
               _e(t.get("error_type"))] for t in tasks[-200:][::-1]]
    note = f"<p class='note'>{meta.get('stored', len(tasks))} task attempt(s) kept"
    note += f"; {_e(meta['warning'])}" if meta.get("warning") else ""
    body = (note + "</p><h2>By function and state</h2>" + summary
            + f"<h2>Failures ({len(failed)})</h2>" + (failures or "<p class='note'>none</p>")
            + "<h2>Recent tasks</h2>"
            + _table(["Task", "Function", "State", "Type", "Node", "PID", "Duration",
                      "Error"], recent, "none"))
    return _page(f"Tasks ({len(tasks)})", "/tasks", body)


def _objects(ctx: DashboardContext, request: Request) -> Response:
    memory = ctx.reader.memory()
    rows = [[_short(n["node_id"], 16), _e(n["node_ip"]), human_bytes(n["store_used_bytes"]),
             human_bytes(n["store_total_bytes"]), _bar(n["store_used_bytes"], n["store_total_bytes"]),
             human_bytes(n["spilled_bytes"]), _e(n["spilled_objects"])] for n in memory["nodes"]]
    body = "<h2>Object store per node</h2>" + _table(
        ["Node", "IP", "Used", "Capacity", "", "Spilled to disk", "Spilled objects"], rows)
    totals = memory["totals"]
    kinds = ", ".join(f"{_e(k)} {v}" for k, v in totals["by_reference_type"].items())
    body += (f"<h2>Object references</h2><p>{totals['objects']} reference(s), "
             f"{human_bytes(totals['object_bytes'])} known" + (f" · {kinds}" if kinds else "")
             + "</p>")
    for process in memory["processes"]:
        if not process["objects"]:
            continue
        body += (f"<h3>{_e(process['type'])} pid {_e(process['pid'])} "
                 f"<span class='note'>node {_short(process['node_id'])} "
                 f"{_e(process['address'])}</span></h3>")
        body += _table(["Object", "Size", "Reference type", "Task status", "Owner",
                        "Call site"],
                       [[_short(o["object_id"], 24), human_bytes(o["object_size"]),
                         _e(o["reference_type"]), _e(o["task_status"]),
                         _e("this process" if o["owned"] else o["owner_address"]),
                         _e(o["call_site"])] for o in process["objects"][:500]])
        if process.get("left_out"):
            body += f"<p class='note'>{_e(process['left_out'])} more not shown</p>"
    return _page("Objects and memory", "/objects", body)


def _logs(ctx: DashboardContext, request: Request) -> Response:
    files = ctx.reader.log_files()
    # Which worker each file is: its pid and state, and the actor it hosts.
    about: dict[str, str] = {}
    for worker in ctx.reader.workers():
        if worker["worker_type"] == "WORKER" and worker["worker_id"]:
            about[worker["worker_id"][:12]] = (
                f"worker pid {worker['pid'] or '?'}, {worker['state'] or '?'}"
                + ("" if worker["is_alive"] else " (exited)"))
    for actor in ctx.reader.actors():
        if actor["worker_id"] and actor["state"] != "DEAD":
            key = actor["worker_id"][:12]
            label = f"actor {actor['class_name']}" + (f" '{actor['name']}'" if actor["name"]
                                                      else "")
            about[key] = f"{label}; {about.get(key, 'worker')}"
    rows = []
    for f in files:
        base = f["name"].rsplit("/", 1)[-1]
        worker = base[len("worker-"):].split(".")[0] if base.startswith("worker-") else ""
        rows.append([f"<a href='/logs/view?name={quote(f['name'])}'>{_e(f['name'])}</a>",
                     _e(about.get(worker, "")), human_bytes(f["size_bytes"])])
    return _page("Logs", "/logs", _table(["File", "Whose", "Size"], rows, "no log files"))


def _log_view(ctx: DashboardContext, request: Request) -> Response:
    name = request.query_params.get("name", "")
    try:
        text = ctx.reader.read_log(name)
    except (FileNotFoundError, IsADirectoryError):
        return _page("Log not found", "/logs", f"<p>No log file {_e(name)}.</p>")
    return _page(f"Log {name}", "/logs", f"<pre>{_e(text)}</pre>")


def timeline_events(ctx: DashboardContext) -> list[dict]:
    """A Chrome trace (Perfetto, chrome://tracing) of the tasks the GCS
    keeps, as ``tray.timeline()`` writes it: one track per worker per node."""
    return ctx.reader.timeline()


def _timeline(ctx: DashboardContext, request: Request) -> Response:
    events = timeline_events(ctx)
    runs = sum(1 for e in events if e.get("ph") == "X" and e.get("cat") != "task_span")
    body = (f"<p>{runs} task execution(s) in the trace. "
            "<a href='/api/timeline' download='tray-timeline.json'>Download the timeline "
            "(JSON)</a> and open it in <a href='https://ui.perfetto.dev'>Perfetto</a> or "
            "chrome://tracing.</p><p class='note'>The same trace: <code>tray timeline -o "
            "out.json</code>.</p>")
    return _page("Timeline", "/timeline", body)


# ================================================================ JSON


def _api(kind: str):
    def endpoint(ctx: DashboardContext, request: Request) -> Response:
        if kind == "nodes":
            return JSONResponse(ctx.reader.nodes())
        if kind == "actors":
            return JSONResponse(ctx.reader.actors())
        if kind == "tasks":
            tasks, meta = ctx.reader.tasks()
            return JSONResponse({"tasks": tasks, **meta})
        if kind == "jobs":
            return JSONResponse(ctx.reader.jobs())
        if kind == "logs":
            return JSONResponse(ctx.reader.log_files())
        if kind == "timeline":
            return Response(json.dumps(timeline_events(ctx)), media_type="application/json",
                            headers={"Content-Disposition":
                                     "attachment; filename=tray-timeline.json"})
        raise AssertionError(kind)
    return endpoint


def _metrics(ctx: DashboardContext, request: Request) -> Response:
    from .metrics import exposition

    body, content_type = exposition(ctx)
    return Response(body, media_type=content_type)


def _health(ctx: DashboardContext, request: Request) -> Response:
    return PlainTextResponse("ok")


# ================================================================= app


def _bind(ctx: DashboardContext, handler):
    # A plain function: Starlette runs it in its thread pool, where each
    # read runs its own short trio loop.
    def endpoint(request: Request) -> Response:
        try:
            return handler(ctx, request)
        except Exception as error:  # the cluster went away, or a bad reply: say so
            return PlainTextResponse(f"tray dashboard: cannot read the cluster: {error}",
                                     status_code=503)
    return endpoint


def create_app(ctx: DashboardContext) -> Starlette:
    routes = [Route(path, _bind(ctx, handler)) for path, handler in (
        ("/", _overview), ("/jobs", _jobs), ("/actors", _actors), ("/tasks", _tasks),
        ("/objects", _objects), ("/logs", _logs), ("/logs/view", _log_view),
        ("/timeline", _timeline), ("/metrics", _metrics), ("/api/healthz", _health),
        *((f"/api/{kind}", _api(kind)) for kind in ("nodes", "actors", "tasks", "logs",
                                                    "timeline")))]
    routes += _job_routes(ctx)
    # Without the job API, the list of jobs (read from the GCS) is still served.
    if not any(getattr(r, "path", None) == "/api/jobs/" for r in routes):
        routes.append(Route("/api/jobs/", _bind(ctx, _api("jobs"))))
    return Starlette(routes=routes)


def _job_routes(ctx: DashboardContext) -> list:
    """The job API's routes (``tray/dashboard/job_api.py``'s ``routes(context)``),
    when that module exists."""
    try:
        from . import job_api
    except ModuleNotFoundError as error:
        if error.name != f"{__package__}.job_api":
            raise
        return []
    return list(job_api.routes(gcs_address=ctx.gcs_address, token=ctx.token,
                               session_dir=ctx.session_dir))


# ============================================================ the process


def _watch(ctx: DashboardContext, follow_pid: int | None, server) -> None:
    """Ends the server once the cluster is gone (see the module's docstring),
    and the process ``EXIT_GRACE_S`` later if the server has not ended it by
    then. Nothing that fails here keeps the process alive: without a file
    descriptor to spare, psutil and the GCS probe fail, but ``os.kill(pid,
    0)`` still says whether the followed process lives."""
    try:
        _wait_for_the_clusters_end(ctx, follow_pid, server)
    finally:
        server.should_exit = True
        time.sleep(EXIT_GRACE_S)
        os._exit(0)


def _wait_for_the_clusters_end(ctx: DashboardContext, follow_pid: int | None, server) -> None:
    started = None
    if follow_pid:
        if not _alive(follow_pid):
            return
        try:
            started = psutil.Process(follow_pid).create_time()
        except (psutil.Error, OSError):
            pass
    last_answer = time.monotonic()
    next_probe = 0.0
    while not server.should_exit:
        time.sleep(WATCH_INTERVAL_S)
        if follow_pid and not _alive(follow_pid, started):
            return
        now = time.monotonic()
        if now >= next_probe:
            next_probe = now + 2.0
            try:
                ctx.reader.call("get_all_nodes")
                last_answer = now
            except Exception:
                if now - last_answer > GCS_LOST_S:
                    return


def _alive(pid: int, started: float | None = None) -> bool:
    """Whether ``pid`` runs (and is the process that started at ``started``,
    when known: not a later one that took its pid). Unsure (psutil out of
    file descriptors, say) counts as alive."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        pass
    try:
        process = psutil.Process(pid)
        if started is not None and abs(process.create_time() - started) > 0.01:
            return False
        return process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
    except (psutil.Error, OSError):
        return True


def main(argv: list[str] | None = None) -> int:
    import uvicorn

    parser = argparse.ArgumentParser(prog="python -m tray.dashboard")
    parser.add_argument("--gcs", required=True, help="the GCS address, tcp:HOST:PORT")
    parser.add_argument("--session", default=os.environ.get(SESSION_ENV),
                        help=f"the head's session directory (default: ${SESSION_ENV})")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT)
    parser.add_argument("--follow-pid", type=int, default=None,
                        help="exit when this process (the head node, or the driver) is gone")
    parser.add_argument("--fd", type=int, default=None,
                        help="serve on this listening socket (from the first stage, _lazy.py)")
    args = parser.parse_args(argv)
    token = os.environ.get("TRAY_CLUSTER_TOKEN")
    if token is None and args.session:
        with open(os.path.join(args.session, "token"), "rb") as file:
            token = file.read().strip().decode()
    if not token:
        print("tray dashboard: no cluster token (TRAY_CLUSTER_TOKEN or --session)",
              file=sys.stderr)
        return 2
    # The state API, which the pages read through, finds the token here
    # (this process's environment is readable by this user alone).
    os.environ["TRAY_CLUSTER_TOKEN"] = token
    ctx = DashboardContext(args.gcs, token.encode(), args.session,
                           ClusterReader(args.gcs, token.encode(), args.session))
    app = DashboardGuard(create_app(ctx), token=token.encode(), bound_host=args.host,
                         port=args.port)
    config = uvicorn.Config(refuse_ambiguous_framing(app), host=args.host, port=args.port,
                            log_level="warning", access_log=False, lifespan="off",
                            http=http_server.protocol(
                                header_timeout_s=HEADER_TIMEOUT_S,
                                body_idle_timeout_s=BODY_IDLE_TIMEOUT_S,
                                waiting_max=WAITING_FOR_HEADERS_MAX))
    server = uvicorn.Server(config)
    threading.Thread(target=_watch, args=(ctx, args.follow_pid, server), daemon=True,
                     name="tray-dashboard-watch").start()
    url = f"http://{args.host}:{args.port}"
    if args.session:
        from ..backends.local.session import replace_private_file

        replace_private_file(os.path.join(args.session, INFO_FILE),
                             json.dumps({"url": url, "pid": os.getpid()}))
    sockets = None if args.fd is None else [socket.socket(fileno=args.fd)]
    server.run(sockets=sockets)
    return 0
