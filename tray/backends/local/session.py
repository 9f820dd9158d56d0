"""A local cluster's session: its directory, token and addresses.

``<root>/session-<pid>-<random>/`` holds the Unix sockets, the token, the
node's pid and logs; ``/dev/shm/tray-<session>/`` holds the node's objects.
Both are made 0700 and removed when the cluster stops.

The root is per user: ``$TRAY_SESSION_ROOT`` if set, else
``$XDG_RUNTIME_DIR/tray`` (the user's own 0700 runtime directory, which
systemd removes at logout unless the user lingers), else ``/tmp/tray-<uid>``.
Whatever holds the token must be ours alone, so a root that is not a real
directory owned by this user, or that others may write to, is refused
rather than used: another user who made it first could otherwise plant
symlinks and receive the token, then run code in the cluster as us. Files
are created with ``O_EXCL | O_NOFOLLOW`` and mode 0600, so no planted name
is ever followed or reused."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import stat

from ...exceptions import TrayError

SHM_ROOT = "/dev/shm"


class UnsafeSessionRoot(TrayError):
    """The session root could be controlled by someone else."""


def default_root(environ=os.environ) -> str:
    if environ.get("TRAY_SESSION_ROOT"):
        return environ["TRAY_SESSION_ROOT"]
    if environ.get("XDG_RUNTIME_DIR"):
        return os.path.join(environ["XDG_RUNTIME_DIR"], "tray")
    return f"/tmp/tray-{os.getuid()}"


ROOT = default_root()
CURRENT_CLUSTER_FILE = os.path.join(ROOT, "current_cluster.json")


def check_private_directory(path: str) -> None:
    """Raise UnsafeSessionRoot unless ``path`` is a directory (not a symlink)
    owned by this user that nobody else may write to."""
    info = os.lstat(path)
    advice = ("remove it, or set TRAY_SESSION_ROOT to a directory of your own")
    if stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode):
        raise UnsafeSessionRoot(f"{path} is not a directory (a symlink?): refusing to keep "
                                f"the cluster's token there; {advice}")
    if info.st_uid != os.getuid():
        raise UnsafeSessionRoot(f"{path} belongs to user {info.st_uid}, not to you "
                                f"({os.getuid()}): refusing to keep the cluster's token "
                                f"there; {advice}")
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise UnsafeSessionRoot(f"{path} is writable by others (mode "
                                f"{stat.S_IMODE(info.st_mode):o}): refusing to keep the "
                                f"cluster's token there; {advice}")


def ensure_root(root: str | None = None) -> str:
    """The session root, made 0700 if missing, checked if present."""
    root = root or ROOT
    parent = os.path.dirname(os.path.abspath(root))
    if not os.path.isdir(parent):
        os.makedirs(parent, 0o700, exist_ok=True)
    try:
        os.mkdir(root, 0o700)
    except FileExistsError:
        pass
    check_private_directory(root)
    return root


def create_private_file(path: str, data: bytes | str) -> None:
    """A new file only this user can read; never through a planted symlink,
    never over an existing file."""
    if isinstance(data, str):
        data = data.encode()
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC,
                 0o600)
    try:
        written = 0
        while written < len(data):
            written += os.write(fd, data[written:])
    finally:
        os.close(fd)


def open_private_file(path: str, mode: str = "ab"):
    """A new 0600 file opened for writing (O_EXCL | O_NOFOLLOW), e.g. a log."""
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC,
                 0o600)
    return os.fdopen(fd, mode)


def replace_private_file(path: str, data: bytes | str) -> None:
    """Write ``path`` atomically: a fresh, uniquely named 0600 file renamed over it."""
    temporary = f"{path}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
    create_private_file(temporary, data)
    try:
        os.rename(temporary, path)
    except BaseException:
        os.unlink(temporary)
        raise


def read_private_file(path: str) -> bytes:
    """Read a file that must not be a symlink."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as file:
        return file.read()


# The cluster's processes listen on unix sockets in the session directory:
# a socket's path must fit in sun_path (107 bytes and a NUL). The longest:
LONGEST_SOCKET = os.path.join("session-4194304-00000000", "worker-000000000000.sock")


def _check_socket_room(root: str) -> None:
    longest = os.path.join(os.path.abspath(root), LONGEST_SOCKET)
    if len(longest.encode()) > 107:
        raise ValueError(f"the session root {root!r} is too long: the cluster's unix "
                         f"sockets would not fit in 107 bytes ({longest!r}); use a root of "
                         f"at most {107 - len(LONGEST_SOCKET) - 1} bytes")


def nothing_listens_at(host: str, port: int, timeout_s: float = 1.0) -> bool:
    """Is nothing listening at host:port (the connection refused, or no
    answer within ``timeout_s``)? Asked before an error about a missing
    token, which would send a user looking for a token when the cluster
    is not even running."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return False
    except OSError:
        return True


class Session:
    def __init__(self, directory: str) -> None:
        self.directory = directory
        self.name = os.path.basename(directory)

    @classmethod
    def create(cls, token: str | None = None, root: str | None = None) -> Session:
        if root is not None:
            _check_socket_room(root)
        root = ensure_root(root)
        for _ in range(100):
            # Unpredictable: nobody can make our /dev/shm directory first.
            name = f"session-{os.getpid()}-{secrets.token_hex(4)}"
            directory = os.path.join(root, name)
            try:
                os.mkdir(directory, 0o700)
            except FileExistsError:
                continue
            session = cls(directory)
            try:
                os.mkdir(session.shm_directory, 0o700)
            except FileExistsError:
                os.rmdir(directory)
                continue
            create_private_file(session.path("token"), token or secrets.token_hex(32))
            return session
        raise RuntimeError(f"cannot create a session directory under {root}")

    def path(self, name: str) -> str:
        return os.path.join(self.directory, name)

    def token(self) -> bytes:
        return read_private_file(self.path("token")).strip()

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
        replace_private_file(self.path(f"node-{node_index}.json"), json.dumps(info))

    def read_info(self, node_index: int) -> dict | None:
        try:
            return json.loads(read_private_file(self.path(f"node-{node_index}.json")))
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


def write_current_cluster(info: dict) -> None:
    ensure_root()
    replace_private_file(CURRENT_CLUSTER_FILE, json.dumps(info))


def read_current_cluster() -> dict | None:
    try:
        check_private_directory(ROOT)
        return json.loads(read_private_file(CURRENT_CLUSTER_FILE))
    except (FileNotFoundError, json.JSONDecodeError):
        return None


LOG_SUFFIXES = (".out", ".err", ".log")


def log_files(session_dir: str) -> list[tuple[str, str]]:
    """Every log file of a session on this machine, as (its path relative
    to the session, which is how the dashboard and ``tray logs`` name it;
    its full path): the workers' and nodes' under ``logs/``, then the
    session's own."""
    files = []
    for root in (os.path.join(session_dir, "logs"), session_dir):
        try:
            names = sorted(os.listdir(root))
        except OSError:
            continue
        for name in names:
            path = os.path.join(root, name)
            if name.endswith(LOG_SUFFIXES) and os.path.isfile(path):
                files.append((os.path.relpath(path, session_dir), path))
    return files


def human_bytes(count) -> str:
    """``count`` bytes as people read them (B, KiB, MiB, GiB); ``?`` for None."""
    if count is None:
        return "?"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(count) < 1024 or unit == "GiB":
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1024
    return str(count)
