"""The GCS's simple tables: the internal key-value store and the job table.

The key-value store holds the function table (``fn:<id>`` -> pickled
function) and whatever else components keep there; jobs are numbered in
the order drivers register. Both live in ``Storage`` only (nothing cached),
so a restarted GCS serves them as they were."""

from __future__ import annotations

T_KV, T_JOBS = "kv", "jobs"


class KvStore:
    def __init__(self, storage, tracer) -> None:
        self._storage = storage
        self._tracer = tracer

    def handle_register_job(self, conn, driver_address: str) -> int:
        job_id = len(self._storage.scan(T_JOBS)) + 1
        self._storage.put(T_JOBS, f"{job_id:08d}", driver_address.encode())
        self._tracer.record("gcs", "job_registered", job=job_id)
        return job_id

    def handle_kv_put(self, conn, key: str, value: bytes, overwrite: bool) -> bool:
        if not overwrite and self._storage.get(T_KV, key) is not None:
            return False
        self._storage.put(T_KV, key, value)
        return True

    def handle_kv_get(self, conn, key: str) -> bytes | None:
        return self._storage.get(T_KV, key)

    def handle_kv_del(self, conn, key: str) -> None:
        self._storage.delete(T_KV, key)
