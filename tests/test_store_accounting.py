"""The shm object store's capacity accounting (tray/backends/local/store.py):
a process sums the shared directory only when its estimate is stale or near
full, and still never lets puts from several processes overfill the store."""

from __future__ import annotations

import types

import pytest

from tray.backends.local.store import ShmObjectStore
from tray.exceptions import ObjectStoreFullError


def _oid(index: int) -> bytes:
    return index.to_bytes(20, "big")


def test_puts_from_two_processes_never_overfill_the_store(tmp_path):
    capacity = 64 * 1024
    first = ShmObjectStore(str(tmp_path / "store"), capacity)
    second = ShmObjectStore(str(tmp_path / "store"), capacity)  # another process's view
    chunk = b"x" * (20 * 1024)
    first.put(_oid(1), chunk, [])
    second.put(_oid(2), chunk, [])
    # The first's estimate (one chunk) is fresh, but a third chunk takes the
    # store past three quarters: it sums the directory and sees both.
    first.put(_oid(3), chunk, [])
    assert first.used_bytes() <= capacity
    with pytest.raises(ObjectStoreFullError, match="the object store is full"):
        second.put(_oid(4), chunk, [])
    assert second.used_bytes() <= capacity


def test_a_put_does_not_sum_the_directory_while_the_estimate_is_fresh(tmp_path, monkeypatch):
    import tray.backends.local.store as store_module

    now = [1000.0]  # a clock that moves only when told to: no wall-clock dependence
    monkeypatch.setattr(store_module, "time", types.SimpleNamespace(monotonic=lambda: now[0]))
    store = ShmObjectStore(str(tmp_path / "store"), 1024**3)
    store.put(_oid(1), b"y" * 100, [])  # the first put sums
    sums = []
    real = store.used_bytes
    monkeypatch.setattr(store, "used_bytes", lambda: sums.append(1) or real())
    for index in range(2, 50):
        store.put(_oid(index), b"y" * 100, [])
    assert sums == []
    now[0] += store_module.USED_BYTES_RESCAN_S * 2  # stale: the next put sums again
    store.put(_oid(50), b"y" * 100, [])
    assert sums == [1]
