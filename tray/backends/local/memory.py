"""The real memory a local node's monitor watches, and the settings Ray
users give it through the environment.

Memory used is what cannot be reclaimed: the machine's total less what the
kernel says is available (``psutil``: MemAvailable), or, inside a container
whose cgroup (v2) caps memory below the machine's, the cgroup's current use
less its inactive page cache, against its cap — what the kernel's OOM killer
acts on there.

Ray reads ``RAY_memory_usage_threshold`` (a fraction) and
``RAY_memory_monitor_refresh_ms`` (0 turns the monitor off) from the
environment of the processes it starts; tray reads the same names, and
``TRAY_``-prefixed ones first."""

from __future__ import annotations

import dataclasses
import os

from ...core.interfaces import MemorySnapshot

CGROUP_DIRECTORY = "/sys/fs/cgroup"


def _read(path: str) -> str | None:
    try:
        with open(path) as file:
            return file.read().strip()
    except OSError:
        return None


def _cgroup_memory(total_bytes: int) -> MemorySnapshot | None:
    limit = _read(os.path.join(CGROUP_DIRECTORY, "memory.max"))
    current = _read(os.path.join(CGROUP_DIRECTORY, "memory.current"))
    if limit is None or current is None or not limit.isdigit() or not current.isdigit():
        return None
    if int(limit) >= total_bytes:
        return None  # no cap below the machine's memory
    inactive = 0
    for line in (_read(os.path.join(CGROUP_DIRECTORY, "memory.stat")) or "").splitlines():
        name, _, value = line.partition(" ")
        if name == "inactive_file" and value.isdigit():
            inactive = int(value)
    return MemorySnapshot(used_bytes=max(int(current) - inactive, 0), total_bytes=int(limit))


def machine_memory_bytes() -> int:
    """This machine's physical memory, what a new node's shares are cut
    from (psutil's ``virtual_memory().total``, without importing psutil:
    a driver starting a cluster reads it before it spawns the head node)."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def read_memory() -> MemorySnapshot:
    """This machine's (or container's) memory now."""
    import psutil  # (here: a driver starting a cluster needs the rest of this module sooner)

    memory = psutil.virtual_memory()
    return _cgroup_memory(memory.total) or MemorySnapshot(
        used_bytes=memory.total - memory.available, total_bytes=memory.total)


def _setting(name: str, environ) -> str | None:
    for prefix in ("TRAY_", "RAY_"):
        value = environ.get(prefix + name)
        if value is not None and value.strip():
            return value.strip()
    return None


def config_from_environ(base, environ=None):
    """``base`` (a Config) with the memory monitor's settings from the
    environment; ValueError naming the variable for a bad value."""
    environ = os.environ if environ is None else environ
    changes = {}
    threshold = _setting("memory_usage_threshold", environ)
    if threshold is not None:
        try:
            value = float(threshold)
        except ValueError:
            value = -1.0
        if not 0.0 < value <= 1.0:
            raise ValueError(f"RAY_memory_usage_threshold must be a fraction in (0, 1], got "
                             f"{threshold!r}")
        changes["memory_usage_threshold"] = value
    refresh = _setting("memory_monitor_refresh_ms", environ)
    if refresh is not None:
        if not refresh.isdigit():
            raise ValueError(f"RAY_memory_monitor_refresh_ms must be a non-negative integer "
                             f"(milliseconds; 0 turns the memory monitor off), got {refresh!r}")
        changes["memory_monitor_refresh_s"] = int(refresh) / 1000
    return dataclasses.replace(base, **changes) if changes else base
