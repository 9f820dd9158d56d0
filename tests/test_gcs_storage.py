"""GCS storage: the Redis backend against a real Redis server, and the GCS
recovering its tables from it."""

from __future__ import annotations

import pytest
from redis_server import redis_server

from tray.backends.sim.stores import MemoryStorage
from tray.backends.storage import RedisStorage
from tray.exceptions import TrayError


@pytest.fixture
def redis_address(tmp_path):
    with redis_server(str(tmp_path)) as address:
        yield address


def _exercise(storage) -> None:
    storage.put("actors", "b", b"2")
    storage.put("actors", "a", b"1")
    storage.put("nodes", "a", b"node")
    assert storage.get("actors", "a") == b"1"
    assert storage.get("actors", "missing") is None
    assert storage.scan("actors") == [("a", b"1"), ("b", b"2")]
    storage.delete("actors", "a")
    assert storage.scan("actors") == [("b", b"2")]
    assert storage.scan("empty") == []


def test_memory_storage_contract():
    _exercise(MemoryStorage())


def test_redis_storage_contract(redis_address):
    _exercise(RedisStorage(redis_address, prefix="test"))


def test_redis_storage_survives_a_new_client(redis_address):
    RedisStorage(redis_address, prefix="p").put("kv", "fn:1", b"\x00blob")
    assert RedisStorage(redis_address, prefix="p").get("kv", "fn:1") == b"\x00blob"
    assert RedisStorage(redis_address, prefix="other").get("kv", "fn:1") is None


def test_unreachable_redis_fails_fast_with_the_address():
    with pytest.raises(TrayError, match="127.0.0.1:1"):
        RedisStorage("127.0.0.1:1")


def test_bad_redis_address():
    with pytest.raises(ValueError, match="host:port"):
        RedisStorage("nonsense")


def test_job_table_survives_a_gcs_restart_and_ends_jobs_by_driver():
    """The GCS keeps driver address -> running jobs (no scan of the job table
    per closed connection); a restarted GCS rebuilds it from storage."""
    from tray.core.gcs.kv_store import KvStore
    from tray.core.interfaces import NullTracer

    storage = MemoryStorage()
    kv = KvStore(storage, NullTracer())
    assert [kv.handle_register_job(None, driver) for driver in ("a", "b", "a")] == [1, 2, 3]
    kv.driver_exited("b")
    restarted = KvStore(storage, NullTracer())
    assert restarted.handle_register_job(None, "c") == 4
    restarted.driver_exited("a")
    restarted.driver_exited("a")  # twice: nothing more to end
    assert restarted.handle_list_driver_jobs(None) == [
        (1, "a", True), (2, "b", True), (3, "a", True), (4, "c", False)]
