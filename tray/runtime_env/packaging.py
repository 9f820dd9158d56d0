"""Packing a working_dir (or a py_modules entry) into one zip, named by its content.

A package is built once on the machine that names the directory (a driver,
or a job's submitter): a zip of the directory's files, walked in sorted
order with fixed timestamps and permissions, so the same files give the
same bytes and therefore the same name, ``gcs://_tray_pkg_<sha256>.zip``, on
any machine and at any time. The name is what travels in a task's
``runtime_env``; the bytes are stored once in the cluster (the GCS
key-value store, under ``runtime_env_pkg:<uri>``), and each node unpacks
them once into a cache directory named after the hash (``setup.py``).

``excludes`` are gitignore-style patterns, relative to the directory:
``name`` (no slash) excludes every file or directory of that name at any
depth; ``/a/b`` or ``a/b`` (a slash inside) is anchored at the root; a
trailing ``/`` matches directories only; ``*``, ``?`` and ``[...]`` are
shell wildcards (``fnmatch``; ``*`` may cross ``/`` in anchored patterns).
As Ray does, ``.git`` is not excluded unless asked, and a ``.gitignore`` is
not read.

A directory over ``max_size_bytes`` (100 MiB by default, or
``TRAY_RUNTIME_ENV_MAX_PACKAGE_BYTES``; Ray's limit is
larger, but the package travels in one message to the GCS and sits in its
memory) is refused before any byte is uploaded, with the largest files
named so the user knows what to exclude."""

from __future__ import annotations

import fnmatch
import hashlib
import io
import os
import re
import zipfile
from dataclasses import dataclass

URI_PREFIX = "gcs://_tray_pkg_"
KV_PREFIX = "runtime_env_pkg:"
DEFAULT_MAX_PACKAGE_BYTES = 100 * 1024 * 1024
_FIXED_TIME = (1980, 1, 1, 0, 0, 0)  # zip's epoch: no timestamps in the hash


@dataclass(frozen=True)
class Package:
    """A packed directory: its URI (content-named) and its zip bytes."""
    uri: str
    data: bytes

    @property
    def size_bytes(self) -> int:
        return len(self.data)


_PACKAGE_URI = re.compile(re.escape(URI_PREFIX) + r"[0-9a-f]{64}\.zip")


def is_package_uri(value: str) -> bool:
    """``gcs://_tray_pkg_<sha256 hex>.zip`` exactly: the hash names a cache
    directory on every node, so nothing else (a ``../``) may stand there."""
    return isinstance(value, str) and _PACKAGE_URI.fullmatch(value) is not None


def package_hash(uri: str) -> str:
    """The content hash in a package URI (the name of its cache directory)."""
    if not is_package_uri(uri):
        raise ValueError(f"not a package URI: {uri!r} (gcs://_tray_pkg_<sha256>.zip)")
    return uri[len(URI_PREFIX):-len(".zip")]


def _excluded(relative: str, is_dir: bool, patterns: list[str]) -> bool:
    name = relative.rsplit("/", 1)[-1]
    for raw in patterns:
        pattern = raw.strip()
        if not pattern or pattern.startswith("#"):
            continue
        dirs_only = pattern.endswith("/")
        pattern = pattern.rstrip("/")
        if dirs_only and not is_dir:
            continue
        if "/" in pattern:  # anchored at the root
            if fnmatch.fnmatchcase(relative, pattern.lstrip("/")):
                return True
        elif fnmatch.fnmatchcase(name, pattern):
            return True
    return False


def _files_of(root: str, excludes: list[str]) -> list[tuple[str, str, int]]:
    """(relative posix path, absolute path, size) of every file kept, sorted."""
    kept = []
    for directory, subdirs, files in os.walk(root, followlinks=False):
        base = os.path.relpath(directory, root)
        base = "" if base == "." else base.replace(os.sep, "/") + "/"
        subdirs[:] = sorted(d for d in subdirs if not _excluded(base + d, True, excludes))
        for name in sorted(files):
            relative = base + name
            absolute = os.path.join(directory, name)
            if _excluded(relative, False, excludes) or not os.path.isfile(absolute):
                continue
            kept.append((relative, absolute, os.path.getsize(absolute)))
    return sorted(kept)


def _too_big(what: str, path: str, total: int, limit: int, sizes: list[tuple[int, str]]):
    biggest = sorted(sizes, reverse=True)[:5]
    listing = ", ".join(f"{name} ({size / 2**20:.1f} MiB)" for size, name in biggest)
    return ValueError(
        f"{what} {path!r} is {total / 2**20:.1f} MiB, over the limit of "
        f"{limit / 2**20:.1f} MiB; its largest files: {listing}. Leave out what tasks do not "
        f"need with runtime_env={{'excludes': [...]}} (gitignore-style patterns), or put "
        f"large data in the object store or shared storage")


def max_package_bytes() -> int:
    """The package size limit: ``TRAY_RUNTIME_ENV_MAX_PACKAGE_BYTES`` in the
    packing process's environment, else 100 MiB."""
    return int(os.environ.get("TRAY_RUNTIME_ENV_MAX_PACKAGE_BYTES", DEFAULT_MAX_PACKAGE_BYTES))


def pack_directory(path: str, excludes: list[str] | tuple = (), *,
                   max_size_bytes: int | None = None,
                   what: str = "working_dir", include_parent: bool = False) -> Package:
    """Zip ``path`` (a directory, or an existing ``.zip`` file, taken as is)
    into a content-named ``Package``; nothing is uploaded.

    ``include_parent``: the zip holds the directory itself (``pkg/...``), as a
    ``py_modules`` entry must, so that ``import pkg`` works from the unpacked
    root. Raises ``ValueError`` for a missing path or one over the limit
    (naming its largest files), ``TypeError`` for bad argument types."""
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"{what} must be a path (a string), got a {type(path).__name__}")
    if isinstance(excludes, str) or not all(isinstance(p, str) for p in excludes):
        raise TypeError(f"excludes must be a list of strings, got {excludes!r}")
    path = os.path.abspath(os.fspath(path))
    if max_size_bytes is None:
        max_size_bytes = max_package_bytes()
    if os.path.isfile(path) and path.endswith(".zip"):
        size = os.path.getsize(path)
        if size > max_size_bytes:
            raise _too_big(what, path, size, max_size_bytes, [(size, os.path.basename(path))])
        with open(path, "rb") as handle:
            data = handle.read()
        return Package(f"{URI_PREFIX}{hashlib.sha256(data).hexdigest()}.zip", data)
    if not os.path.isdir(path):
        raise ValueError(f"{what} {path!r} does not exist or is not a directory (or a .zip "
                         f"file)")
    files = _files_of(path, list(excludes))
    total = sum(size for _, _, size in files)
    if total > max_size_bytes:
        raise _too_big(what, path, total, max_size_bytes,
                       [(size, relative) for relative, _, size in files])
    prefix = os.path.basename(path) + "/" if include_parent else ""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for relative, absolute, _ in files:
            info = zipfile.ZipInfo(prefix + relative, date_time=_FIXED_TIME)
            info.compress_type = zipfile.ZIP_DEFLATED
            executable = os.stat(absolute).st_mode & 0o111
            info.external_attr = (0o755 if executable else 0o644) << 16
            with open(absolute, "rb") as handle:
                archive.writestr(info, handle.read())
    data = buffer.getvalue()
    return Package(f"{URI_PREFIX}{hashlib.sha256(data).hexdigest()}.zip", data)


def unpack(data: bytes, target: str, max_bytes: int | None = None) -> None:
    """Unpack a package into ``target`` (a fresh directory), refusing
    entries that would land outside it, and a package that would unpack to
    more than ``max_bytes`` (default: the packing limit, ``max_package_bytes``:
    a small zip may claim gigabytes)."""
    root = os.path.realpath(target)
    limit = max_package_bytes() if max_bytes is None else max_bytes
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        infos = archive.infolist()
        claimed = sum(info.file_size for info in infos)
        if claimed > limit:
            raise ValueError(f"the package unpacks to {claimed} bytes, over the limit of "
                             f"{limit} (TRAY_RUNTIME_ENV_MAX_PACKAGE_BYTES)")
        for info in infos:
            destination = os.path.realpath(os.path.join(root, info.filename))
            if destination != root and not destination.startswith(root + os.sep):
                raise ValueError(f"package entry {info.filename!r} points outside its "
                                 "directory")
            archive.extract(info, root)
            mode = (info.external_attr >> 16) & 0o777
            if mode and not info.is_dir():
                os.chmod(destination, mode)
