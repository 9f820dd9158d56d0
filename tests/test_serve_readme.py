"""The README's Serve section: its example runs on real processes, answers a
real HTTP request on 127.0.0.1 and prints what it says."""

import os
import pathlib
import re
import socket
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent

pytest.importorskip("httpx")
pytest.importorskip("starlette")

pytestmark = pytest.mark.skipif(
    "local" not in os.environ.get("TRAY_TEST_BACKENDS", "sim,local").split(","),
    reason="HTTP needs real processes (the local backend)")


def _serve_section() -> str:
    text = (ROOT / "README.md").read_text()
    start = text.index("\n## Serve\n")
    end = text.index("\n## ", start + 1)
    return text[start:end]


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_readme_serve_example_runs(tmp_path):
    [block] = re.findall(r"```python\n(.*?)```", _serve_section(), flags=re.S)
    assert block.count("8000") == 2  # the proxy's port and the request's
    port = _free_port()  # tests run in parallel: not 8000 itself
    script = tmp_path / "serve_example.py"
    script.write_text(block.replace("8000", str(port)))
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                            timeout=180, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-4000:]
    assert result.stdout.splitlines() == [
        "200 {'words': 4, 'score': 0.5}",
        "0.5",
        "[('so', False), ('good', True)]",
        "RUNNING",
    ]
