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

T_KV, T_JOBS, T_JOB_SUBMISSIONS = "kv", "jobs", "job_submissions"
T_JOBS_ENDED = "jobs_ended"  # job number -> b"" once its driver went away


class KvStore:
    def __init__(self, storage, tracer) -> None:
        self._storage = storage
        self._tracer = tracer
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

    def handle_register_job(self, conn, driver_address: str) -> int:
        self._job_count += 1
        job_id = self._job_count
        key = f"{job_id:08d}"
        self._storage.put(T_JOBS, key, driver_address.encode())
        self._running_jobs.setdefault(driver_address, []).append(key)
        self._tracer.record("gcs", "job_registered", job=job_id)
        return job_id

    def driver_exited(self, address: str) -> None:
        """The driver at ``address`` went away (the GCS saw its connection
        close, which is also when its actors go): its job is over, as in
        Ray's job table (``is_dead``)."""
        for key in self._running_jobs.pop(address, ()):
            if self._storage.get(T_JOBS_ENDED, key) is None:
                self._storage.put(T_JOBS_ENDED, key, b"")
                self._tracer.record("gcs", "job_ended", job=int(key))

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
