"""The GCS's simple tables: the internal key-value store and the job table.

The key-value store holds the function table (``fn:<id>`` -> pickled
function) and whatever else components keep there; jobs are numbered in
the order drivers register. Both live in ``Storage`` only (nothing cached),
so a restarted GCS serves them as they were.

Jobs submitted through the job API (``tray.job_submission``) have a table
of their own, ``job_submissions``: submission id -> the job's record as
UTF-8 JSON, the fields of ``tray.job_submission.JobInfo`` (``status`` one
of PENDING, RUNNING, STOPPED, SUCCEEDED, FAILED; ``entrypoint``,
``message``, ``start_time``/``end_time`` in ms, ``driver_exit_code``,
``metadata``, ``runtime_env``...). The job manager creates the record and
each job's supervisor process updates it; the state API and the dashboard
read it. The GCS keeps it opaque: it only creates, replaces, lists and
deletes records (the job manager bounds how many there are)."""

from __future__ import annotations

from dataclasses import dataclass

T_KV, T_JOBS, T_JOB_SUBMISSIONS = "kv", "jobs", "job_submissions"
T_JOBS_ENDED = "jobs_ended"  # job number -> b"" once its driver went away
# Users' keys (``tray.experimental.internal_kv``, Ray's internal KV: Serve
# keeps its controller's checkpoint there): "<namespace hex>:<key hex>" ->
# value, apart from the internal table so that listing a prefix never
# reads a function blob.
T_USER_KV = "user_kv"


def _user_key(namespace: bytes, key: bytes) -> str:
    return f"{namespace.hex()}:{key.hex()}"


@dataclass(frozen=True)
class KvStoreStatistics:
    user_keys: int  # users' keys held (internal_kv), against user_kv_keys_max
    jobs: int  # jobs registered by drivers since the cluster began
    running_jobs: int  # of those, jobs whose driver has not gone away
    drivers: int  # drivers with a running job


class KvStore:
    def __init__(self, storage, tracer, config=None) -> None:
        self._storage = storage
        self._tracer = tracer
        self._config = config
        self._user_keys = len(storage.scan(T_USER_KV))  # the user_kv_keys_max count
        # Driver address -> the keys of its jobs that have not ended: every
        # connection that closes (a worker's too) asks, and scanning the job
        # table each time cost O(jobs) per close. Rebuilt from storage on a
        # (re)start; grows with live drivers' jobs, shrinks as they end.
        self._running_jobs: dict[str, list[str]] = {}
        jobs = storage.scan(T_JOBS)
        self._job_count = len(jobs)
        for key, driver in jobs:
            if storage.get(T_JOBS_ENDED, key) is None:
                self._running_jobs.setdefault(driver.decode(), []).append(key)

    def statistics(self) -> KvStoreStatistics:
        """Counts kept in memory (the tables themselves are in ``Storage``,
        which may be Redis: read none of it here)."""
        return KvStoreStatistics(
            user_keys=self._user_keys, jobs=self._job_count,
            running_jobs=sum(len(keys) for keys in self._running_jobs.values()),
            drivers=len(self._running_jobs))

    def validate_state(self) -> None:
        """The in-memory counts and the running-jobs index (no ``Storage``
        read: it may be Redis). Walks the index: O(running jobs)."""
        assert self._user_keys >= 0, self._user_keys
        if self._config is not None:
            assert self._user_keys <= self._config.user_kv_keys_max, self._user_keys
        assert self._job_count >= 0, self._job_count
        seen: set[str] = set()
        for driver, keys in self._running_jobs.items():
            assert keys, f"driver {driver} indexed with no running job"
            for key in keys:
                assert key not in seen, f"job {key} indexed under two drivers"
                seen.add(key)
                assert 1 <= int(key) <= self._job_count, (driver, key, self._job_count)

    def handle_register_job(self, conn, driver_address: str) -> int:
        self._job_count += 1
        job_id = self._job_count
        key = f"{job_id:08d}"
        self._storage.put(T_JOBS, key, driver_address.encode())
        self._running_jobs.setdefault(driver_address, []).append(key)
        self._tracer.record("gcs", "job_registered", job=job_id)
        return job_id

    def driver_exited(self, address: str) -> list[int]:
        """The driver at ``address`` went away (the GCS saw its connection
        close, which is also when its actors go): its job is over, as in
        Ray's job table (``is_dead``). The jobs that ended."""
        ended = []
        for key in self._running_jobs.pop(address, ()):
            if self._storage.get(T_JOBS_ENDED, key) is None:
                self._storage.put(T_JOBS_ENDED, key, b"")
                self._tracer.record("gcs", "job_ended", job=int(key))
                ended.append(int(key))
        return ended

    def handle_list_driver_jobs(self, conn) -> list:
        """Every job a driver registered: [(job number, driver address,
        whether its driver went away)] (the state API's ``list_jobs``)."""
        return [(int(key), value.decode(), self._storage.get(T_JOBS_ENDED, key) is not None)
                for key, value in self._storage.scan(T_JOBS)]

    def handle_kv_put(self, conn, key: str, value: bytes, overwrite: bool) -> bool:
        if not overwrite and self._storage.get(T_KV, key) is not None:
            return False
        self._storage.put(T_KV, key, value)
        return True

    def handle_kv_get(self, conn, key: str) -> bytes | None:
        return self._storage.get(T_KV, key)

    def handle_kv_del(self, conn, key: str) -> None:
        self._storage.delete(T_KV, key)

    # ------------------------------------------------------------ user keys

    def handle_user_kv_put(self, conn, namespace: bytes, key: bytes, value: bytes,
                           overwrite: bool) -> bool:
        """Whether the key existed already (then it keeps its value unless
        ``overwrite``). Beyond ``user_kv_keys_max`` keys or
        ``user_kv_value_bytes_max`` a value, the put fails (ValueError)."""
        if self._config is not None and len(value) > self._config.user_kv_value_bytes_max:
            raise ValueError(f"an internal_kv value of {len(value)} bytes is larger than "
                             f"user_kv_value_bytes_max ({self._config.user_kv_value_bytes_max})")
        name = _user_key(namespace, key)
        existed = self._storage.get(T_USER_KV, name) is not None
        if existed and not overwrite:
            return True
        if not existed:
            if self._config is not None and \
                    self._user_keys >= self._config.user_kv_keys_max:
                raise ValueError(f"the internal_kv holds {self._user_keys} keys, its limit "
                                 "(user_kv_keys_max): delete some first")
            self._user_keys += 1
        self._storage.put(T_USER_KV, name, value)
        return existed

    def handle_user_kv_get(self, conn, namespace: bytes, key: bytes) -> bytes | None:
        return self._storage.get(T_USER_KV, _user_key(namespace, key))

    def handle_user_kv_keys(self, conn, namespace: bytes, prefix: bytes) -> list[bytes]:
        """The keys of ``namespace`` that start with ``prefix``, sorted."""
        start = _user_key(namespace, prefix)
        return [bytes.fromhex(name.split(":", 1)[1])
                for name, _ in self._storage.scan(T_USER_KV) if name.startswith(start)]

    def handle_user_kv_del(self, conn, namespace: bytes, key: bytes, by_prefix: bool) -> int:
        """How many keys went."""
        names = [_user_key(namespace, found) for found in
                 self.handle_user_kv_keys(conn, namespace, key)] if by_prefix else \
            [_user_key(namespace, key)]
        deleted = 0
        for name in names:
            if self._storage.get(T_USER_KV, name) is not None:
                self._storage.delete(T_USER_KV, name)
                deleted += 1
        self._user_keys -= deleted
        return deleted

    # ------------------------------------------------------ submitted jobs

    def handle_job_submission_put(self, conn, submission_id: str, record: bytes,
                                  create: bool) -> bool:
        """Store a submitted job's record; with ``create``, only if no job has
        that submission id yet (False then): ids are unique cluster-wide."""
        if create and self._storage.get(T_JOB_SUBMISSIONS, submission_id) is not None:
            return False
        self._storage.put(T_JOB_SUBMISSIONS, submission_id, record)
        return True

    def handle_job_submission_get(self, conn, submission_id: str) -> bytes | None:
        return self._storage.get(T_JOB_SUBMISSIONS, submission_id)

    def handle_job_submission_list(self, conn) -> list[tuple[str, bytes]]:
        """Every submitted job's (submission id, record), by submission id."""
        return self._storage.scan(T_JOB_SUBMISSIONS)

    def handle_job_submission_delete(self, conn, submission_id: str) -> bool:
        if self._storage.get(T_JOB_SUBMISSIONS, submission_id) is None:
            return False
        self._storage.delete(T_JOB_SUBMISSIONS, submission_id)
        return True
