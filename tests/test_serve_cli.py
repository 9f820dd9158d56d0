"""``tray serve`` on real processes, HTTP on 127.0.0.1: ``run`` serves an
application until interrupted; ``deploy`` a config file onto a cluster made
with ``tray start``, ``status``, ``shutdown``."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

httpx = pytest.importorskip("httpx")
yaml = pytest.importorskip("yaml")

pytestmark = pytest.mark.skipif(
    "local" not in os.environ.get("TRAY_TEST_BACKENDS", "sim,local").split(","),
    reason="the CLI runs real processes")


def free_port() -> int:
    """A port free on 127.0.0.1 now (tests run in parallel: not 8000)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]

APP_MODULE = '''
from tray import serve


@serve.deployment(ray_actor_options={"num_cpus": 0})
class Greeter:
    def __init__(self, greeting: str = "hello") -> None:
        self.greeting = greeting

    def reconfigure(self, config: dict) -> None:
        self.greeting = config.get("greeting", self.greeting)

    async def __call__(self, request) -> str:
        return f"{self.greeting} {request.query_params.get('name', 'world')}"


app = Greeter.bind()


def build(args: dict):
    return Greeter.bind(args.get("greeting", "hi"))
'''


def _cli(root, *args, check=True, input_text=None, timeout=180):
    env = {**os.environ, "TRAY_SESSION_ROOT": str(root)}
    result = subprocess.run([sys.executable, "-m", "tray.scripts.cli", *args], env=env,
                            capture_output=True, text=True, timeout=timeout, cwd=root.parent,
                            input=input_text)
    if check:
        assert result.returncode == 0, result.stdout + result.stderr
    return result


def _get(url: str, deadline_s: float = 60.0) -> httpx.Response:
    end = time.monotonic() + deadline_s
    while True:
        try:
            return httpx.get(url, timeout=10)
        except httpx.TransportError:
            if time.monotonic() > end:
                raise
            time.sleep(0.2)


def test_serve_run_serves_until_interrupted(tmp_path):
    (tmp_path / "greeter_app.py").write_text(APP_MODULE)
    port = free_port()
    env = dict(os.environ)  # its own cluster, in the default (short) session root
    process = subprocess.Popen(
        [sys.executable, "-m", "tray.scripts.cli", "serve", "run", "greeter_app:build",
         "--arg", "greeting=howdy", "--port", str(port), "--route-prefix", "/greet"],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = process.stdout.readline()
        assert "is running at" in line, line + process.stderr.read()
        reply = _get(f"http://127.0.0.1:{port}/greet?name=tray")
        assert (reply.status_code, reply.text) == (200, "howdy tray")
    finally:
        process.send_signal(signal.SIGINT)
        out, err = process.communicate(timeout=60)
    assert process.returncode == 0, err
    assert "Shutting down Serve." in out


def test_serve_deploy_status_shutdown_on_a_cluster(tmp_path, monkeypatch):
    (tmp_path / "greeter_app.py").write_text(APP_MODULE)
    root = tmp_path / "sessions"
    gcs_port, http_port = free_port(), free_port()
    _cli(root, "start", "--head", "--port", str(gcs_port), "--num-cpus", "2")
    try:
        with open(root / "current_cluster.json") as file:
            monkeypatch.setenv("TRAY_CLUSTER_TOKEN", json.load(file)["token"])
        config = {
            "proxy_location": "HeadOnly",
            "http_options": {"host": "127.0.0.1", "port": http_port},
            "applications": [
                {"name": "plain", "route_prefix": "/plain", "import_path": "greeter_app:app"},
                {"name": "built", "route_prefix": "/built", "import_path": "greeter_app:build",
                 "args": {"greeting": "hey"},
                 "deployments": [{"name": "Greeter", "num_replicas": 2,
                                  "user_config": {"greeting": "bonjour"}}]},
            ],
        }
        config_path = tmp_path / "serve.yaml"
        config_path.write_text(yaml.safe_dump(config))
        deployed = _cli(root, "serve", "deploy", str(config_path), "--app-dir", str(tmp_path))
        assert "Deployed built, plain." in deployed.stdout
        assert _get(f"http://127.0.0.1:{http_port}/plain?name=a").text == "hello a"
        assert _get(f"http://127.0.0.1:{http_port}/built?name=b").text == "bonjour b"
        status = yaml.safe_load(_cli(root, "serve", "status").stdout)
        assert status["applications"]["plain"]["status"] == "RUNNING"
        built = status["applications"]["built"]["deployments"]["Greeter"]
        assert built["replica_states"] == {"RUNNING": 2}
        # A config without "plain" deletes it (the file is the whole truth).
        config["applications"] = config["applications"][1:]
        config_path.write_text(yaml.safe_dump(config))
        _cli(root, "serve", "deploy", str(config_path), "--app-dir", str(tmp_path))
        assert set(yaml.safe_load(_cli(root, "serve", "status").stdout)["applications"]) == \
            {"built"}
        assert _get(f"http://127.0.0.1:{http_port}/plain").status_code == 404
        bad = tmp_path / "bad.yaml"
        bad.write_text(yaml.safe_dump({"applications": [{"name": "x"}]}))
        refused = _cli(root, "serve", "deploy", str(bad), check=False)
        assert refused.returncode != 0 and "import_path" in refused.stderr
        assert _cli(root, "serve", "shutdown", check=False, input_text="n\n").returncode == 1
        _cli(root, "serve", "shutdown", "-y")
        assert yaml.safe_load(_cli(root, "serve", "status").stdout)["applications"] == {}
    finally:
        _cli(root, "stop", check=False)
