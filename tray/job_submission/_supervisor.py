"""A submitted job's supervisor: one process per job, on the head node.

The job manager (in the process serving the job API) starts it, in a
session of its own, and returns at once; from then on the supervisor alone
writes the job's record in the GCS until the job ends:

1. it records its pid (so the manager can signal it, and can tell, later,
   whether it still lives);
2. it prepares the job's environment: the uploaded ``working_dir`` is
   fetched from the GCS and unpacked once per content hash into the node's
   cache, ``pip`` requirements get a virtualenv per distinct list (made
   once, under a file lock, even when jobs ask at the same time), and
   ``env_vars`` are set. A failure here fails the job
   (``RUNTIME_ENV_SETUP_FAILURE``, with pip's own error);
3. it runs the entrypoint with a shell, in a process group of its own, its
   stdout and stderr in ``job-driver-<submission id>.log``, with
   ``TRAY_ADDRESS`` and the token in its environment so that the script's
   ``tray.init()`` joins this cluster, and records RUNNING;
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
import fcntl
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time

import psutil

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
HOOK_DIRECTORY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_driver_hook")
DEFAULT_SETUP_TIMEOUT_S = 600


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


class SetupError(Exception):
    """The job's runtime_env could not be prepared; the message says why."""


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
        self.setup_process: subprocess.Popen | None = None

    # ------------------------------------------------------------ the record

    def _update(self, **fields) -> None:
        self.info = JobInfo(**{**self.info.__dict__, **fields})
        write_job(self.gcs_address, self.token, self.info)

    # ------------------------------------------------------------ setting up

    def _working_dir(self, uri: str) -> str:
        from ..runtime_env import packaging

        directory = os.path.join(self.resource_dir, "working_dir",
                                 packaging.package_hash(uri))
        if os.path.isdir(directory):
            return directory
        data = gcs_call(self.gcs_address, self.token, "kv_get", packaging.KV_PREFIX + uri)
        if data is None:
            raise SetupError(f"the working_dir package {uri} is not in the cluster (upload "
                             "it with JobSubmissionClient or tray job submit --working-dir)")
        staging = f"{directory}.{os.getpid()}.tmp"
        shutil.rmtree(staging, ignore_errors=True)
        os.makedirs(staging, 0o700)
        packaging.unpack(data, staging)
        try:
            os.rename(staging, directory)
        except OSError:  # another job unpacked the same package first
            shutil.rmtree(staging, ignore_errors=True)
        return directory

    def _pip_env(self, packages: list[str], timeout_s: float) -> str:
        """A virtualenv with ``packages`` installed, made once per distinct
        list; it sees the system's site-packages (tray itself) under them."""
        digest = hashlib.sha256(json.dumps(packages).encode()).hexdigest()[:32]
        root = os.path.join(self.resource_dir, "pip")
        os.makedirs(root, 0o700, exist_ok=True)
        directory = os.path.join(root, digest)
        with open(os.path.join(root, f"{digest}.lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if os.path.exists(os.path.join(directory, ".ready")):
                return directory
            shutil.rmtree(directory, ignore_errors=True)
            deadline = time.monotonic() + timeout_s
            # No pip of its own in the venv (seeding one costs seconds): this
            # Python's pip installs into it (pip --python).
            self._run_setup([sys.executable, "-m", "venv", "--without-pip",
                             "--system-site-packages", directory], deadline,
                            "creating the virtualenv")
            self._run_setup([sys.executable, "-m", "pip", "--python",
                             os.path.join(directory, "bin", "python"), "install",
                             "--disable-pip-version-check", "--no-input", *packages],
                            deadline, "pip install")
            open(os.path.join(directory, ".ready"), "w").close()
        return directory

    def _run_setup(self, command: list[str], deadline: float, what: str) -> None:
        process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                   stderr=subprocess.STDOUT, start_new_session=True)
        self.setup_process = process
        try:
            output, _ = process.communicate(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            _kill_group(process.pid, signal.SIGKILL)
            process.wait()
            raise SetupError(f"{what} took longer than the runtime_env's "
                             "setup_timeout_seconds") from None
        finally:
            self.setup_process = None
        if self.stop_requested.is_set():
            raise SetupError("stopped while the runtime_env was being set up")
        if process.returncode != 0:
            text = output.decode(errors="replace").strip()[-FAILED_LOG_TAIL_CHARS:]
            raise SetupError(f"{what} failed (exit code {process.returncode}):\n{text}")

    def _environment(self, runtime_env: dict) -> tuple[dict, str | None]:
        env = dict(os.environ)
        cwd = None
        python_path = [HOOK_DIRECTORY]
        if runtime_env.get("working_dir"):
            cwd = self._working_dir(runtime_env["working_dir"])
            python_path.append(cwd)
        pip = runtime_env.get("pip")
        if pip:
            from ._manager import pip_arguments

            packages = pip_arguments(pip)
            timeout_s = (runtime_env.get("config") or {}).get("setup_timeout_seconds",
                                                               DEFAULT_SETUP_TIMEOUT_S)
            if timeout_s == -1:
                timeout_s = float("inf")
            venv = self._pip_env(list(packages), timeout_s)
            env["VIRTUAL_ENV"] = venv
            env["PATH"] = os.path.join(venv, "bin") + os.pathsep + env.get("PATH", "")
        if env.get("PYTHONPATH"):
            python_path.append(env["PYTHONPATH"])
        env["PYTHONPATH"] = os.pathsep.join(python_path)
        env.update(runtime_env.get("env_vars") or {})
        env["TRAY_ADDRESS"] = self.gcs_address.removeprefix("tcp:")
        env["TRAY_CLUSTER_TOKEN"] = self.token.decode()
        env["TRAY_JOB_SUBMISSION_ID"] = self.submission_id
        env["TRAY_JOB_RUNTIME_ENV"] = json.dumps(
            {key: value for key, value in runtime_env.items() if key != "config"})
        return env, cwd

    # ------------------------------------------------------------ running

    def run(self) -> int:
        self.info = read_job(self.gcs_address, self.token, self.submission_id)
        if self.info is None or self.info.status.is_terminal():
            return 1  # deleted, or stopped before this process started
        me = psutil.Process()
        self._update(supervisor_pid=me.pid, supervisor_create_time=me.create_time())
        log = log_path(self.log_dir, self.submission_id)
        try:
            env, cwd = self._environment(self.info.runtime_env)
        except SetupError as error:
            status = JobStatus.STOPPED if self.stop_requested.is_set() else JobStatus.FAILED
            self._update(status=status, end_time=_now_ms(),
                         error_type=None if status is JobStatus.STOPPED
                         else "RUNTIME_ENV_SETUP_FAILURE",
                         message="Job was intentionally stopped."
                         if status is JobStatus.STOPPED
                         else f"runtime_env setup failed: {error}")
            return 0
        if self.stop_requested.is_set():
            self._update(status=JobStatus.STOPPED, end_time=_now_ms(),
                         message="Job was intentionally stopped.")
            return 0
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
        process = self.setup_process
        if process is not None:
            _kill_group(process.pid, signal.SIGKILL)


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
