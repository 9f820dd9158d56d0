"""A local cluster's session: its directory, token and addresses.

``/tmp/tray-sessions/session-<pid>-<n>/`` holds the Unix sockets, the token (mode
0600), the head's pid and logs; ``/dev/shm/tray-<session>/`` holds the
node's objects. Both are removed when the cluster stops."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import socket

ROOT = os.environ.get("TRAY_SESSION_ROOT", "/tmp/tray-sessions")
SHM_ROOT = "/dev/shm"


class Session:
    def __init__(self, directory: str) -> None:
        self.directory = directory
        self.name = os.path.basename(directory)

    @classmethod
    def create(cls, token: str | None = None) -> Session:
        os.makedirs(ROOT, exist_ok=True)
        for attempt in range(1000):
            directory = os.path.join(ROOT, f"session-{os.getpid()}-{attempt}")
            try:
                os.mkdir(directory, 0o700)
            except FileExistsError:
                continue
            session = cls(directory)
            token = token or secrets.token_hex(32)
            fd = os.open(session.path("token"), os.O_CREAT | os.O_WRONLY | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as file:
                file.write(token)
            return session
        raise RuntimeError(f"cannot create a session directory under {ROOT}")

    def path(self, name: str) -> str:
        return os.path.join(self.directory, name)

    def token(self) -> bytes:
        with open(self.path("token")) as file:
            return file.read().strip().encode()

    @property
    def shm_directory(self) -> str:
        return os.path.join(SHM_ROOT, f"tray-{self.name}")

    def address(self, name: str) -> str:
        return f"unix:{self.path(name + '.sock')}"

    def node_store_directory(self, node_index: int) -> str:
        return os.path.join(self.shm_directory, f"node-{node_index}")

    def node_spill_directory(self, node_index: int) -> str:
        return self.path(f"spill/node-{node_index}")

    def write_info(self, node_index: int, info: dict) -> None:
        temporary = self.path(f"node-{node_index}.json.tmp")
        with open(temporary, "w") as file:
            json.dump(info, file)
        os.rename(temporary, self.path(f"node-{node_index}.json"))

    def read_info(self, node_index: int) -> dict | None:
        try:
            with open(self.path(f"node-{node_index}.json")) as file:
                return json.load(file)
        except FileNotFoundError:
            return None

    def remove(self) -> None:
        shutil.rmtree(self.shm_directory, ignore_errors=True)
        shutil.rmtree(self.directory, ignore_errors=True)


def free_port(ip: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago."""
    with socket.socket() as sock:
        sock.bind((ip, 0))
        return sock.getsockname()[1]


CURRENT_CLUSTER_FILE = os.path.join(ROOT, "current_cluster.json")


def write_current_cluster(info: dict) -> None:
    os.makedirs(ROOT, exist_ok=True)
    temporary = CURRENT_CLUSTER_FILE + ".tmp"
    fd = os.open(temporary, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as file:
        json.dump(info, file)
    os.rename(temporary, CURRENT_CLUSTER_FILE)


def read_current_cluster() -> dict | None:
    try:
        with open(CURRENT_CLUSTER_FILE) as file:
            return json.load(file)
    except (FileNotFoundError, json.JSONDecodeError):
        return None
