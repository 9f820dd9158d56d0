"""The shm object store's capacity accounting (tray/backends/local/store.py):
a process sums the shared directory only when its estimate is stale or near
full, and still never lets puts from several processes overfill the store."""

from __future__ import annotations

import os
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


@pytest.mark.parametrize("kind", ["shm", "sim"])
def test_objects_owned_by_follows_puts_and_deletes(tmp_path, kind):
    # A node frees a dead owner's objects with objects_owned_by. The
    # simulator's store answers from an index by owner (each node hears of
    # every worker's death), the shm store from its files' headers: both
    # must agree with what was put and deleted.
    from tray.backends.sim.stores import MemoryObjectStore

    store = ShmObjectStore(str(tmp_path / "store"), 1024**2) if kind == "shm" else \
        MemoryObjectStore(1024**2)
    for index in range(6):
        store.put(_oid(index), b"z" * 10, [], owner="a" if index % 2 else "b")
    store.delete(_oid(1))
    store.delete(_oid(4))
    assert sorted(store.objects_owned_by("a")) == [_oid(3), _oid(5)]
    assert sorted(store.objects_owned_by("b")) == [_oid(0), _oid(2)]
    for object_id in store.objects_owned_by("a"):
        store.delete(object_id)
    assert store.objects_owned_by("a") == []
    assert store.objects_owned_by("nobody") == []
    assert sorted(store.object_owners()) == [_oid(0), _oid(2)]


def test_a_listing_opens_only_the_objects_new_since_the_last(tmp_path, monkeypatch):
    # Every node lists its store at every worker's death; opening every
    # object's file made that 2.5 s at 100k objects. An object's owner never
    # changes, so a store opens a file once, and follows what other
    # processes of the node put and delete.
    import tray.backends.local.store as store_module

    node = ShmObjectStore(str(tmp_path / "store"), 1024**2)
    worker = ShmObjectStore(str(tmp_path / "store"), 1024**2)  # another process's view
    for index in range(20):
        worker.put(_oid(index), b"w" * 10, [], owner=f"owner{index % 4}")
    opened = []
    real = store_module._read_owner
    monkeypatch.setattr(store_module, "_read_owner", lambda path: opened.append(path) or
                        real(path))
    assert len(node.objects_owned_by("owner1")) == 5
    assert len(opened) == 20
    opened.clear()
    worker.delete(_oid(1))
    worker.put(_oid(100), b"w" * 10, [], owner="owner1")
    assert node.objects_owned_by("owner1") == sorted([_oid(5), _oid(9), _oid(13), _oid(17),
                                                      _oid(100)])
    assert [os.path.basename(path) for path in opened] == [_oid(100).hex()]
    assert len(node.object_owners()) == 20 and len(opened) == 1
