"""The job manager: what the job API's HTTP handlers call, on the head node.

It checks a submission, records it in the GCS as PENDING, and starts the
job's supervisor process (``_supervisor.py``), which does the rest. It keeps
no state of its own that matters: every answer is read from the GCS (and
the driver's log file), so a restarted dashboard, or a second one, serves
the same jobs. The one thing it adds on reading is a liveness check: a job
whose record says PENDING or RUNNING while its supervisor process is gone
(killed, or the machine's processes were) is recorded FAILED, once, rather
than shown running forever, and its driver, orphaned, is killed.

Every method is synchronous and does blocking I/O (GCS calls, files): the
HTTP layer runs them in worker threads."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import psutil

from ._common import (
    ENTRYPOINT_BYTES_MAX,
    JOBS_MAX,
    LOG_BYTES_MAX,
    METADATA_BYTES_MAX,
    PACKAGE_BYTES_MAX,
    JobInfo,
    JobNotFoundError,
    JobStatus,
    JobSubmissionError,
    check_submission_id,
    gcs_call,
    list_job_records,
    new_submission_id,
    read_job,
    write_job,
)
from ._supervisor import log_path, open_log

# Ray's tolerance for a supervisor's start time read back through psutil.
CREATE_TIME_TOLERANCE_S = 0.01


def check_runtime_env(runtime_env, *, uploaded=lambda uri: True) -> dict:
    """The job's runtime_env as it reaches the cluster, checked with
    ``tray.runtime_env.validate`` and for what a job needs besides (its code
    already uploaded: package URIs, not paths on the client's machine), and
    normalized as tasks carry it (``tray.runtime_env.resolve``), so that the
    driver and the job's workers set up one and the same env. Raises
    JobSubmissionError saying what is wrong."""
    from .. import runtime_env as runtime_envs

    try:
        env = runtime_envs.validate(runtime_env)
    except (TypeError, ValueError, NotImplementedError) as error:
        raise JobSubmissionError(f"bad runtime_env: {error}") from None
    code = ([env["working_dir"]] if "working_dir" in env else []) + \
        list(env.get("py_modules") or [])
    for uri in code:
        if not (isinstance(uri, str) and runtime_envs.is_package_uri(uri)):
            raise JobSubmissionError(
                f"{uri!r} is not an uploaded package: local code (working_dir, py_modules) is "
                "packed and uploaded by JobSubmissionClient.submit_job or tray job submit on "
                "the machine that has it")
        if not uploaded(uri):
            raise JobSubmissionError(f"the package {uri} was not uploaded to this cluster")
    pip = env.get("pip")
    if pip is not None:
        packages = pip.get("packages") if isinstance(pip, dict) else pip
        if not isinstance(packages, (list, tuple)):
            raise JobSubmissionError("runtime_env pip must list its requirements (the client "
                                     f"reads a requirements file), got {pip!r}")

    def no_upload(key, data):  # every path was refused above
        raise JobSubmissionError("a job's code must be uploaded by its client")

    try:
        return runtime_envs.resolve(env, no_upload)
    except (TypeError, ValueError) as error:
        raise JobSubmissionError(f"bad runtime_env: {error}") from None


class JobManager:
    def __init__(self, gcs_address: str, token: bytes, session_dir: str) -> None:
        self.gcs_address = gcs_address
        self.token = token
        self.log_dir = os.path.join(session_dir, "logs")
        self.resource_dir = os.path.join(session_dir, "runtime_resources")
        os.makedirs(self.log_dir, 0o700, exist_ok=True)
        os.makedirs(self.resource_dir, 0o700, exist_ok=True)
        self._supervisors: dict[str, subprocess.Popen] = {}
        self._lock = threading.Lock()

    # ------------------------------------------------------------ packages

    def _package_key(self, uri: str) -> str:
        from ..runtime_env import packaging

        return packaging.KV_PREFIX + uri

    def has_package(self, uri: str) -> bool:
        return gcs_call(self.gcs_address, self.token, "kv_get",
                        self._package_key(uri)) is not None

    def put_package(self, uri: str, data: bytes) -> None:
        """Store an uploaded working_dir package under its content name,
        after checking that the name is the content's."""
        import hashlib

        from ..runtime_env import packaging

        if not packaging.is_package_uri(uri):
            raise JobSubmissionError(f"{uri!r} is not a package name "
                                     f"({packaging.URI_PREFIX}<sha256>.zip)")
        if len(data) > PACKAGE_BYTES_MAX:
            raise JobSubmissionError(f"the package is {len(data) / 2**20:.1f} MiB, over the "
                                     f"limit of {PACKAGE_BYTES_MAX / 2**20:.0f} MiB")
        if packaging.package_hash(uri) != hashlib.sha256(data).hexdigest():
            raise JobSubmissionError(f"the package's bytes do not hash to its name {uri}")
        gcs_call(self.gcs_address, self.token, "kv_put", self._package_key(uri), data, False)

    # ------------------------------------------------------------ jobs

    def submit(self, *, entrypoint, submission_id=None, runtime_env=None,
               metadata=None) -> str:
        if not isinstance(entrypoint, str) or not entrypoint.strip():
            raise JobSubmissionError("entrypoint must be a non-empty shell command, e.g. "
                                     "'python script.py'")
        if len(entrypoint.encode()) > ENTRYPOINT_BYTES_MAX:
            raise JobSubmissionError(f"the entrypoint is longer than "
                                     f"{ENTRYPOINT_BYTES_MAX} bytes")
        submission_id = check_submission_id(submission_id or new_submission_id())
        runtime_env = check_runtime_env(runtime_env, uploaded=self.has_package)
        metadata = metadata or {}
        if not isinstance(metadata, dict) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()):
            raise JobSubmissionError(f"metadata must be a dict of strings to strings, got "
                                     f"{metadata!r}")
        if len(json.dumps(metadata)) > METADATA_BYTES_MAX:
            raise JobSubmissionError(f"metadata is larger than {METADATA_BYTES_MAX} bytes")
        records = gcs_call(self.gcs_address, self.token, "job_submission_list")
        if len(records) >= JOBS_MAX:
            raise JobSubmissionError(f"the cluster keeps at most {JOBS_MAX} jobs; delete "
                                     "finished ones (delete_job / tray job delete)")
        info = JobInfo(submission_id=submission_id, status=JobStatus.PENDING,
                       entrypoint=entrypoint, start_time=int(time.time() * 1000),
                       metadata=metadata, runtime_env=runtime_env,
                       message="Job has not started yet: its supervisor is setting up its "
                               "runtime environment.")
        if not write_job(self.gcs_address, self.token, info, create=True):
            raise JobSubmissionError(f"Job with submission_id {submission_id} already exists. "
                                     "Please use a different submission_id.")
        command = [sys.executable, "-m", "tray.job_submission._supervisor",
                   "--submission-id", submission_id, "--gcs", self.gcs_address,
                   "--log-dir", self.log_dir, "--resource-dir", self.resource_dir]
        env = {**os.environ, "TRAY_CLUSTER_TOKEN": self.token.decode()}
        with open_log(os.path.join(self.log_dir, f"job-supervisor-{submission_id}.log")) \
                as output:
            process = subprocess.Popen(command, env=env, stdin=subprocess.DEVNULL,
                                       stdout=output, stderr=subprocess.STDOUT,
                                       start_new_session=True)
        with self._lock:
            self._reap()
            self._supervisors[submission_id] = process
        # Its exit is collected at once, whether or not anyone asks about it.
        threading.Thread(target=process.wait, name=f"reap-{submission_id}",
                         daemon=True).start()
        return submission_id

    def _reap(self) -> None:
        """Collect supervisors that have exited (no zombies left behind)."""
        for submission_id, process in list(self._supervisors.items()):
            if process.poll() is not None:
                del self._supervisors[submission_id]

    def _supervisor_alive(self, info: JobInfo) -> bool:
        with self._lock:
            self._reap()
            process = self._supervisors.get(info.submission_id)
        if process is not None:
            return True
        if info.supervisor_pid is None:
            # Not started by this manager (another dashboard, before a
            # restart) and not yet registered: give it its start time.
            return time.time() * 1000 - (info.start_time or 0) < 60_000
        try:
            found = psutil.Process(info.supervisor_pid)
            return (abs(found.create_time() - info.supervisor_create_time)
                    <= CREATE_TIME_TOLERANCE_S and found.status() != psutil.STATUS_ZOMBIE)
        except psutil.Error:
            return False

    def info(self, submission_id: str) -> JobInfo:
        info = self._checked(read_job(self.gcs_address, self.token, submission_id))
        if info is None:
            raise JobNotFoundError(f"Job {submission_id} does not exist")
        return info

    def _checked(self, info: JobInfo | None) -> JobInfo | None:
        """``info``, or FAILED if it says PENDING/RUNNING while its supervisor
        is gone (written back, so every reader sees the same)."""
        if info is None or info.status.is_terminal() or self._supervisor_alive(info):
            return info
        info = read_job(self.gcs_address, self.token, info.submission_id)  # it may just have ended
        if info is not None and not info.status.is_terminal():
            _kill_orphaned_driver(info)
            info = JobInfo(**{**info.__dict__, "status": JobStatus.FAILED,
                              "end_time": int(time.time() * 1000),
                              "error_type": "JOB_SUPERVISOR_DIED",
                              "message": f"the job's supervisor process (pid "
                                         f"{info.supervisor_pid}) died unexpectedly"})
            write_job(self.gcs_address, self.token, info)
        return info

    def list(self) -> list[JobInfo]:
        """Every job, from one read of the table (and one more per job whose
        supervisor turns out dead)."""
        jobs = (self._checked(job) for job in list_job_records(self.gcs_address, self.token))
        return [job for job in jobs if job is not None]

    def stop(self, submission_id: str) -> bool:
        """Ask the job's supervisor to stop it; False if it already ended."""
        info = self.info(submission_id)
        if info.status.is_terminal():
            return False
        with self._lock:
            process = self._supervisors.get(submission_id)
        # A supervisor handles SIGTERM once it has registered its pid: wait
        # for that (it takes a Python start), so that a stop right after a
        # submit is a stop and not a crash.
        deadline = time.monotonic() + 10.0
        while info.supervisor_pid is None and time.monotonic() < deadline:
            time.sleep(0.05)
            info = self.info(submission_id)
            if info.status.is_terminal():
                return False
        try:
            if process is not None:
                process.terminate()
            elif info.supervisor_pid is not None:
                found = psutil.Process(info.supervisor_pid)
                if abs(found.create_time() - info.supervisor_create_time) \
                        <= CREATE_TIME_TOLERANCE_S:
                    found.terminate()
        except psutil.Error:
            pass
        return True

    def delete(self, submission_id: str) -> bool:
        info = self.info(submission_id)
        if not info.status.is_terminal():
            raise JobSubmissionError(f"Attempted to delete job '{submission_id}', but it is in "
                                     f"a non-terminal state {info.status.value}; stop it first")
        deleted = gcs_call(self.gcs_address, self.token, "job_submission_delete",
                           submission_id)
        for path in (log_path(self.log_dir, submission_id),
                     os.path.join(self.log_dir, f"job-supervisor-{submission_id}.log")):
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
        return deleted

    def log_path(self, submission_id: str) -> str:
        return log_path(self.log_dir, submission_id)

    def logs(self, submission_id: str) -> str:
        self.info(submission_id)  # 404 for an unknown job
        try:
            with open(self.log_path(submission_id), "rb") as file:
                file.seek(0, os.SEEK_END)
                size = file.tell()
                file.seek(max(0, size - LOG_BYTES_MAX))
                return file.read().decode(errors="replace")
        except FileNotFoundError:
            return ""


def _kill_orphaned_driver(info: JobInfo) -> None:
    """The job's supervisor died: its driver (in a session of its own, so
    nothing else stops it) would run on, untracked and unstoppable, holding
    its tasks' resources. Kill its process group — if ``driver_pid`` still
    names that driver: a process that leads its own group and started after
    the job did (not a later process given the same pid)."""
    pid = info.driver_pid
    if pid is None:
        return
    try:
        driver = psutil.Process(pid)
        started_ms = driver.create_time() * 1000
        # (A process's start time, as the kernel gives it, is only good to
        # about a second: the boot time it counts from is in whole seconds.)
        if os.getpgid(pid) != pid or started_ms + 2000 < (info.start_time or 0):
            return
        os.killpg(pid, signal.SIGKILL)
    except (psutil.Error, ProcessLookupError, PermissionError):
        pass
