"""The Serve page's example (docs/serve.md) runs on real processes, answers a
real HTTP request on 127.0.0.1 and prints what it says."""

import os
import pathlib
import socket

import pytest
import readme_examples  # (tests/ is on sys.path)

ROOT = pathlib.Path(__file__).resolve().parent.parent

pytest.importorskip("httpx")
pytest.importorskip("starlette")

pytestmark = pytest.mark.skipif(
    "local" not in os.environ.get("TRAY_TEST_BACKENDS", "sim,local").split(","),
    reason="HTTP needs real processes (the local backend)")


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_readme_serve_example_runs(tmp_path):
    block = readme_examples.block(page="serve.md")
    assert block.count("8000") == 2  # the proxy's port and the request's
    port = _free_port()  # tests run in parallel: not 8000 itself
    result = readme_examples.run(block.replace("8000", str(port)), tmp_path, timeout_s=180)
    assert result.returncode == 0, result.stderr[-4000:]
    assert result.stdout.splitlines() == [
        "200 {'words': 4, 'score': 0.5}",
        "0.5",
        "[('so', False), ('good', True)]",
        "RUNNING",
    ]
