"""A submitted job's supervisor: one process per job, on the head node.

The job manager (in the process serving the job API) starts it, in a
session of its own, and returns at once; from then on the supervisor alone
writes the job's record in the GCS until the job ends:

1. it records its pid (so the manager can signal it, and can tell, later,
   whether it still lives);
2. it prepares the job's runtime_env with ``tray.runtime_env.setup``, the
   code and the cache (the head's ``runtime_resources/``) the job's own
   workers use: the uploaded ``working_dir`` and ``py_modules`` fetched
   from the GCS and unpacked once per content hash, ``pip`` requirements
   in a virtualenv per distinct spec (made once, under a file lock, even
   when jobs and workers ask at the same time), ``env_vars`` set. A failure
   here fails the job (``RUNTIME_ENV_SETUP_FAILURE``, with pip's own
   error);
3. it runs the entrypoint with a shell, in a process group of its own, its
   stdout and stderr in ``job-driver-<submission id>.log``, with
   ``TRAY_ADDRESS`` and the token in its environment so that the script's
   ``tray.init()`` joins this cluster (``init`` reads it, as Ray's reads
   ``RAY_ADDRESS``), and records RUNNING;
4. it records how the driver ended: SUCCEEDED (exit 0), FAILED (with the
   exit code and the end of the log), or STOPPED.

Stopping is a SIGTERM to the supervisor: it sends SIGTERM to the driver's
process group, SIGKILL after ``STOP_WAIT_S`` (Ray's 3 s), and records
STOPPED. The driver's death is what frees what it owned: the GCS ends its
non-detached actors and placement groups and the nodes free its objects
and take back the workers leased to it, as for any driver that exits.

Whatever is left in the driver's process group when it ends (a background
child) is killed too: a job owns nothing after it ends. If the GCS stops
answering for ``GCS_LOST_S`` (the cluster was stopped), the supervisor
ends the driver and exits rather than outlive its cluster."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time

import psutil
import trio

from ..exceptions import RuntimeEnvSetupError
from ._common import (
    FAILED_LOG_TAIL_CHARS,
    JobInfo,
    JobStatus,
    gcs_call,
    read_job,
    write_job,
)

STOP_WAIT_S = 3.0
POLL_S = 0.1
GCS_CHECK_S = 2.0
GCS_LOST_S = 30.0


def _now_ms() -> int:
    return int(time.time() * 1000)


def log_path(log_dir: str, submission_id: str) -> str:
    return os.path.join(log_dir, f"job-driver-{submission_id}.log")


def open_log(path: str):
    """A log file for appending, readable by this user alone (a job's output
    may hold secrets)."""
    fd = os.open(path, os.O_CREAT | os.O_APPEND | os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC,
                 0o600)
    return os.fdopen(fd, "ab")


def tail_text(path: str, chars: int) -> str:
    try:
        with open(path, "rb") as file:
            file.seek(0, os.SEEK_END)
            file.seek(max(0, file.tell() - chars * 4))
            return file.read().decode(errors="replace")[-chars:]
    except FileNotFoundError:
        return ""


class Supervisor:
    def __init__(self, submission_id: str, gcs_address: str, token: bytes, log_dir: str,
                 resource_dir: str) -> None:
        self.submission_id = submission_id
        self.gcs_address = gcs_address
        self.token = token
        self.log_dir = log_dir
        self.resource_dir = resource_dir
        self.stop_requested = threading.Event()
        self.info: JobInfo | None = None
        self._setup_scope = None

    # ------------------------------------------------------------ the record

    def _update(self, **fields) -> None:
        """Write the record with ``fields`` changed. The supervisor is its
        only writer but for the driver's job id, which the driver adds
        itself (``tray.init`` calls ``link_driver``): that one is kept from
        the GCS's copy."""
        current = read_job(self.gcs_address, self.token, self.submission_id)
        if current is not None and current.driver_job_id and "driver_job_id" not in fields:
            fields["driver_job_id"] = current.driver_job_id
        self.info = JobInfo(**{**self.info.__dict__, **fields})
        write_job(self.gcs_address, self.token, self.info)

    # ------------------------------------------------------------ setting up

    def _prepare(self, runtime_env: dict):
        """The job's runtime_env set up on this node by the same code, and in
        the same cache, as its tasks' (``tray.runtime_env.setup``): one
        unpacked working_dir and one virtualenv serve the driver and the
        job's workers on the head. Runs until done, failed or stopped."""
        from ..backends.local import query_gcs
        from ..runtime_env import setup

        async def fetch(key: str):
            return await query_gcs(self.gcs_address, self.token, "kv_get", key)

        async def prepare():
            with trio.CancelScope() as scope:
                self._setup_scope = (trio.lowlevel.current_trio_token(), scope)
                if self.stop_requested.is_set():
                    scope.cancel()
                return await setup.prepare_with_timeout(runtime_env, self.resource_dir,
                                                        fetch)
            return None  # stopped

        try:
            return trio.run(prepare)
        finally:
            self._setup_scope = None

    def _environment(self, prepared, runtime_env: dict) -> tuple[dict, str | None]:
        env = dict(os.environ)
        python_path = list(prepared.sys_path)
        if env.get("PYTHONPATH"):
            python_path.append(env["PYTHONPATH"])
        env["PYTHONPATH"] = os.pathsep.join(python_path)
        if runtime_env.get("pip"):
            # `python` in the entrypoint is the job's virtualenv's.
            from ..runtime_env import setup

            venv = os.path.join(self.resource_dir, "pip", setup.pip_hash(runtime_env["pip"]))
            env["VIRTUAL_ENV"] = venv
            env["PATH"] = os.path.join(venv, "bin") + os.pathsep + env.get("PATH", "")
        env.update(prepared.env_vars)
        env["TRAY_ADDRESS"] = self.gcs_address.removeprefix("tcp:")
        env["TRAY_CLUSTER_TOKEN"] = self.token.decode()
        env["TRAY_JOB_SUBMISSION_ID"] = self.submission_id
        env["TRAY_JOB_RUNTIME_ENV"] = json.dumps(runtime_env)
        return env, prepared.cwd

    # ------------------------------------------------------------ running

    def run(self) -> int:
        self.info = read_job(self.gcs_address, self.token, self.submission_id)
        if self.info is None or self.info.status.is_terminal():
            return 1  # deleted, or stopped before this process started
        me = psutil.Process()
        self._update(supervisor_pid=me.pid, supervisor_create_time=me.create_time())
        log = log_path(self.log_dir, self.submission_id)
        runtime_env = self.info.runtime_env
        try:
            prepared = self._prepare(runtime_env)
        except RuntimeEnvSetupError as error:
            self._update(status=JobStatus.FAILED, end_time=_now_ms(),
                         error_type="RUNTIME_ENV_SETUP_FAILURE",
                         message=f"runtime_env setup failed: {error}")
            return 0
        if prepared is None or self.stop_requested.is_set():
            self._update(status=JobStatus.STOPPED, end_time=_now_ms(),
                         message="Job was intentionally stopped.")
            return 0
        env, cwd = self._environment(prepared, runtime_env)
        with open_log(log) as output:
            driver = subprocess.Popen(self.info.entrypoint, shell=True, cwd=cwd, env=env,
                                      stdin=subprocess.DEVNULL, stdout=output,
                                      stderr=subprocess.STDOUT, start_new_session=True)
        self._update(status=JobStatus.RUNNING, driver_pid=driver.pid,
                     message="Job is currently running.")
        exit_code = self._wait(driver)
        _kill_group(driver.pid, signal.SIGKILL)  # what the driver left behind
        if self.stop_requested.is_set():
            self._update(status=JobStatus.STOPPED, end_time=_now_ms(), driver_exit_code=exit_code,
                         message="Job was intentionally stopped.")
        elif exit_code == 0:
            self._update(status=JobStatus.SUCCEEDED, end_time=_now_ms(), driver_exit_code=0,
                         message="Job finished successfully.")
        else:
            self._update(status=JobStatus.FAILED, end_time=_now_ms(),
                         driver_exit_code=exit_code, error_type="JOB_ENTRYPOINT_COMMAND_ERROR",
                         message=f"Job entrypoint command failed with exit code {exit_code}, "
                                 f"last available logs (truncated to "
                                 f"{FAILED_LOG_TAIL_CHARS:,} chars):\n"
                                 f"{tail_text(log, FAILED_LOG_TAIL_CHARS)}")
        return 0

    def _wait(self, driver: subprocess.Popen) -> int:
        last_seen_gcs = next_check = time.monotonic()
        while True:
            try:
                return driver.wait(POLL_S)
            except subprocess.TimeoutExpired:
                pass
            if self.stop_requested.is_set():
                _kill_group(driver.pid, signal.SIGTERM)
                try:
                    return driver.wait(STOP_WAIT_S)
                except subprocess.TimeoutExpired:
                    _kill_group(driver.pid, signal.SIGKILL)
                    return driver.wait()
            now = time.monotonic()
            if now >= next_check:
                next_check = now + GCS_CHECK_S
                try:
                    gcs_call(self.gcs_address, self.token, "job_submission_get",
                             self.submission_id)
                    last_seen_gcs = now
                except Exception:  # noqa: BLE001 - any failure to answer counts
                    if now - last_seen_gcs > GCS_LOST_S:
                        _kill_group(driver.pid, signal.SIGKILL)
                        driver.wait()
                        sys.exit(1)  # no cluster left to record anything in

    def request_stop(self, *_) -> None:
        self.stop_requested.set()
        setup_scope = self._setup_scope
        if setup_scope is not None:  # cancel the setup (trio kills what it runs)
            token, scope = setup_scope
            with contextlib.suppress(trio.RunFinishedError):
                token.run_sync_soon(scope.cancel)


def _kill_group(pid: int, signal_number: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal_number)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tray-job-supervisor")
    parser.add_argument("--submission-id", required=True)
    parser.add_argument("--gcs", required=True, help="the GCS address (tcp:host:port)")
    parser.add_argument("--log-dir", required=True)
    parser.add_argument("--resource-dir", required=True)
    args = parser.parse_args(argv)
    token = os.environ.pop("TRAY_CLUSTER_TOKEN").encode()
    supervisor = Supervisor(args.submission_id, args.gcs, token, args.log_dir,
                            args.resource_dir)
    signal.signal(signal.SIGTERM, supervisor.request_stop)
    signal.signal(signal.SIGINT, supervisor.request_stop)
    return supervisor.run()


if __name__ == "__main__":
    sys.exit(main())
