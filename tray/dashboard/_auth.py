"""Who may read the dashboard: the cluster token's holders, through a name
of this machine.

The pages show what the job API guards (drivers' logs, entrypoints, failure
messages, every worker's output, any log file under the session
directory), so every route but the health check needs a credential:

* ``Authorization: Bearer <token>``, as the job API and
  ``JobSubmissionClient`` send it (for scripts, Prometheus, curl);
* or a cookie, set after one login: the URL that ``tray start`` and
  ``tray.init()`` print (``/?token=<key>``, as Jupyter does), or the login
  form any page shows without one. The cookie is HttpOnly and
  SameSite=Strict, and named after the port (browsers share cookies
  between the ports of one host: two clusters' dashboards must not clash).

Either may be the cluster token itself or the *dashboard key*, an HMAC of
the token (``dashboard_key``): the key opens the dashboard's pages, and
only them (the job API, which runs commands, still wants the token), so
the URL printed at start hands out no more than the pages.

Before any of that, the ``Host`` header must name this machine: a loopback
address, ``localhost``, the address the dashboard is bound to (or, bound to
every address, one of this machine's addresses or its host name); any other
is a 403. That stops DNS rebinding, where a web page re-points its own
name at 127.0.0.1 and reads the answers as same-origin. The port is not
checked: it is not part of what rebinding changes, and an SSH tunnel
(``ssh -L 9000:127.0.0.1:8265``) arrives with its own."""

from __future__ import annotations

import hashlib
import hmac
import html
import ipaddress
import json
import socket
from urllib.parse import parse_qs, urlencode

from . import COOKIE_PREFIX, dashboard_key

LOGIN_PATH = "/login"
LOGIN_BODY_BYTES_MAX = 4096
PUBLIC_PATHS = ("/api/healthz",)


def allowed_host_names(bound_host: str) -> frozenset[str]:
    """The names a request's ``Host`` may carry (lower case, without the
    port), for a dashboard bound to ``bound_host``."""
    names = {"localhost", bound_host.lower().strip("[]")}
    if bound_host in ("0.0.0.0", "::", ""):
        names.add(socket.gethostname().lower())
        names.add(socket.getfqdn().lower())
        try:
            import psutil

            for addresses in psutil.net_if_addrs().values():
                names.update(a.address.split("%")[0].lower() for a in addresses
                             if a.family in (socket.AF_INET, socket.AF_INET6))
        except (ImportError, OSError):
            pass
    return frozenset(names)


def _host_name(host_header: str) -> str:
    host = host_header.strip().lower()
    if host.startswith("["):  # [::1]:8265
        return host[1:host.find("]")] if "]" in host else ""
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


def host_allowed(host_header: str | None, names: frozenset[str]) -> bool:
    if not host_header:
        return False
    name = _host_name(host_header)
    if name in names:
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


class DashboardGuard:
    """ASGI middleware: the ``Host`` check, then a credential (see the
    module's docstring); ``/login`` and ``?token=`` log a browser in."""

    def __init__(self, app, *, token: bytes, bound_host: str, port: int) -> None:
        self.app = app
        self._secrets = (token, dashboard_key(token).encode())
        self._names = allowed_host_names(bound_host)
        self._cookie = f"{COOKIE_PREFIX}{port}"
        # What the cookie holds: a value derived from the key, not the key.
        self._cookie_value = hashlib.sha256(b"cookie:" + self._secrets[1]).hexdigest()

    def _is_secret(self, given: str) -> bool:
        given_bytes = given.encode()
        # Both compared, in constant time, whichever matches.
        return any([hmac.compare_digest(given_bytes, secret) for secret in self._secrets])

    def _authenticated(self, headers: dict[bytes, bytes]) -> bool:
        authorization = headers.get(b"authorization", b"").decode("latin-1")
        if authorization.startswith("Bearer ") and self._is_secret(authorization[7:]):
            return True
        for part in headers.get(b"cookie", b"").decode("latin-1").split(";"):
            name, _, value = part.strip().partition("=")
            if name == self._cookie and hmac.compare_digest(value.encode(),
                                                            self._cookie_value.encode()):
                return True
        return False

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or ())
        host = headers.get(b"host", b"").decode("latin-1")
        if not host_allowed(host, self._names):
            await _send(send, 403, "text/plain; charset=utf-8",
                        f"tray dashboard: the Host {host!r} does not name this machine "
                        "(open the dashboard by its address, 127.0.0.1 or localhost)")
            return
        path = scope["path"]
        if path in PUBLIC_PATHS:
            await self.app(scope, receive, send)
            return
        if path == LOGIN_PATH and scope["method"] == "POST":
            await self._login_form(scope, receive, send)
            return
        query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
        if "token" in query:
            await self._login(send, query.pop("token")[-1], path, urlencode(query, doseq=True))
            return
        if self._authenticated(headers):
            await self.app(scope, receive, send)
            return
        await self._refuse(send, path)

    async def _login(self, send, given: str, path: str, query: str) -> None:
        if not self._is_secret(given):
            await _send(send, 401, "text/html; charset=utf-8",
                        _login_page(path, "That is not this cluster's token or dashboard key."))
            return
        target = (path if path != LOGIN_PATH else "/") + (f"?{query}" if query else "")
        await send({"type": "http.response.start", "status": 303, "headers": [
            (b"location", target.encode()), (b"content-length", b"0"),
            (b"cache-control", b"no-store"),
            (b"set-cookie", f"{self._cookie}={self._cookie_value}; Path=/; HttpOnly; "
                            "SameSite=Strict".encode())]})
        await send({"type": "http.response.body", "body": b""})

    async def _login_form(self, scope, receive, send) -> None:
        body, size = b"", 0
        while True:
            message = await receive()
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > LOGIN_BODY_BYTES_MAX:
                await _send(send, 413, "text/plain; charset=utf-8", "the login form is too big")
                return
            body += chunk
            if message["type"] == "http.disconnect" or not message.get("more_body"):
                break
        form = parse_qs(body.decode("latin-1"))
        target = form.get("next", ["/"])[-1]
        if not target.startswith("/") or target.startswith("//"):
            target = "/"  # only a page of this dashboard
        path, _, query = target.partition("?")
        await self._login(send, form.get("token", [""])[-1], path, query)

    async def _refuse(self, send, path: str) -> None:
        message = ("this dashboard needs the cluster's token: open the URL that 'tray start' "
                   "or tray.init() printed (or 'tray dashboard' prints), or send "
                   "Authorization: Bearer <token>")
        if path.startswith("/api/") or path == "/metrics":
            await _send(send, 401, "application/json", json.dumps({"error": message}),
                        [(b"www-authenticate", b"Bearer")])
            return
        await _send(send, 401, "text/html; charset=utf-8", _login_page(path, ""))


async def _send(send, status: int, content_type: str, text: str,
                extra: list[tuple[bytes, bytes]] = ()) -> None:
    body = text.encode()
    await send({"type": "http.response.start", "status": status, "headers": [
        (b"content-type", content_type.encode()), (b"content-length", str(len(body)).encode()),
        (b"cache-control", b"no-store"), *extra]})
    await send({"type": "http.response.body", "body": body})


def _login_page(path: str, error: str) -> str:
    note = f"<p style='color:#b3261e'>{html.escape(error)}</p>" if error else ""
    return (
        "<!doctype html><html><head><meta charset='utf-8'><title>tray · log in</title></head>"
        "<body style='font-family:system-ui,sans-serif;margin:40px'><h1>tray dashboard</h1>"
        f"{note}<p>This dashboard needs the cluster's token. Open the URL that "
        "<code>tray start</code> or <code>tray.init()</code> printed, or run <code>tray "
        "dashboard</code> on the head's machine; or paste the token (the head's session "
        "directory holds it, in <code>token</code>) or the dashboard key:</p>"
        f"<form method='post' action='{LOGIN_PATH}'><input type='hidden' name='next' "
        f"value='{html.escape(path, quote=True)}'><input type='password' name='token' "
        "size='70' autofocus> <button type='submit'>Log in</button></form></body></html>")
