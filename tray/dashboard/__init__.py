"""tray's dashboard: a web page and a Prometheus endpoint on the head node.

One process per cluster (``python -m tray.dashboard``, see ``server.py``),
started by ``tray start --head`` and, in the background, by the local
backend's ``tray.init()``: the driver only spawns it (a few milliseconds)
and prints its URL, it never waits for it, so ``init()`` is no slower. The
process holds the port at once and imports the web stack only when the
first client connects (``_lazy.py``), so a cluster nobody looks at pays a
bare Python start-up for it.
It binds 127.0.0.1 unless told otherwise and Ray's port 8265 when that
port is free (the next free one otherwise: two clusters on one machine
each get a dashboard).

Every page but ``/api/healthz`` needs the cluster token (``_auth.py``): a
browser logs in once through ``login_url(url, token)``, the URL printed at
start, which carries the *dashboard key* (``dashboard_key``, derived from
the token: it opens the pages and nothing else)."""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import socket
import subprocess
import sys

DEFAULT_PORT = 8265  # Ray's
INFO_FILE = "dashboard.json"
SESSION_ENV = "TRAY_DASHBOARD_SESSION"  # in the session directory: the URL and pid, once serving
COOKIE_PREFIX = "tray_dashboard_"  # + the port: a logged-in browser's cookie

# The first stage (see _lazy.py): holds the port; the server starts on first use.
_LAZY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_lazy.py")

__all__ = ["DEFAULT_PORT", "INFO_FILE", "bind_port", "dashboard_key", "login_url", "read_url",
           "start_dashboard"]


def dashboard_key(token: bytes) -> str:
    """The key that opens the dashboard of the cluster whose token is
    ``token`` (and nothing else: it is not the token, which the job API and
    the cluster's RPC want)."""
    return hmac.new(token, b"tray dashboard key", hashlib.sha256).hexdigest()[:40]


def login_url(url: str, token: bytes) -> str:
    """The dashboard at ``url``, with what logs a browser in (as Jupyter's
    ``?token=``): the first visit sets a cookie and drops the key from the
    address bar."""
    return f"{url.rstrip('/')}/?token={dashboard_key(token)}"


def bind_port(host: str, port: int | None) -> socket.socket:
    """A listening socket for the dashboard, bound here (so that two clusters
    started at once cannot both count on port 8265, and the printed URL is
    always this cluster's): ``port`` when given (busy: a ``ValueError``
    saying so); else 8265, or a free port when 8265 is taken."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    listener = socket.socket(family, socket.SOCK_STREAM)
    try:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            listener.bind((host, DEFAULT_PORT if port is None else port))
        except OSError as error:
            if port is not None:
                raise ValueError(f"the dashboard port {port} on {host} is busy ({error.strerror}"
                                 "); choose another with --dashboard-port") from None
            listener.bind((host, 0))
        listener.listen(128)
    except BaseException:
        listener.close()
        raise
    return listener


def start_dashboard(*, gcs_address: str, session_dir: str, host: str,
                    port: int | None = None, follow_pid: int,
                    log_path: str | None = None) -> tuple[subprocess.Popen, str]:
    """Spawn the dashboard process on a port bound here (``bind_port``);
    returns it and its URL at once (it serves a moment later; a client that
    connects before waits in the socket's queue). The token comes from the
    session directory, never the command line. Nothing here imports the web
    stack: the driver's ``init()`` pays a bind, a fork and an exec."""
    listener = bind_port(host, port)
    port = listener.getsockname()[1]
    command = [sys.executable, "-P", _LAZY, "--gcs", gcs_address, "--host", host,
               "--port", str(port), "--follow-pid", str(follow_pid),
               "--fd", str(listener.fileno())]
    # The session directory goes in the environment, not on the command line:
    # the dashboard is an HTTP server, not one of the cluster's RPC processes
    # (which tools, and the TLS test, find by their --session argument).
    env = {key: value for key, value in os.environ.items() if key != "TRAY_CLUSTER_TOKEN"}
    env[SESSION_ENV] = session_dir
    log = open(log_path or os.path.join(session_dir, "dashboard.log"), "ab")
    try:
        process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                   start_new_session=True, env=env,
                                   pass_fds=(listener.fileno(),))
    finally:
        log.close()
        listener.close()  # the dashboard holds it now
    shown_host = "127.0.0.1" if host in ("0.0.0.0", "") else host
    url = f"http://{shown_host}:{port}"
    try:  # for `tray status`
        from ..backends.local.session import replace_private_file

        replace_private_file(os.path.join(session_dir, INFO_FILE),
                             json.dumps({"url": url, "pid": process.pid}))
    except OSError:
        pass
    return process, url


def read_url(session_dir: str | None) -> str | None:
    """The URL of the dashboard started for the session in ``session_dir``
    (on this machine), or None."""
    if not session_dir:
        return None
    try:
        with open(os.path.join(session_dir, INFO_FILE)) as file:
            return json.load(file).get("url")
    except (OSError, ValueError):
        return None
