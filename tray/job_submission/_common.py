"""What the job client, the job manager and each job's supervisor share:
the status names, the job's record (``JobInfo``), ids, limits and the calls
to the GCS's ``job_submissions`` table.

The record is the single source of truth about a submitted job and it lives
in the GCS (in Redis too, for a head started with ``--redis-address``), not
in the process that serves the HTTP API: a client that goes away, or a
dashboard that restarts, loses nothing. It is JSON so that the state API,
the dashboard and ``tray list jobs`` read it without importing this
package's classes."""

from __future__ import annotations

import dataclasses
import enum
import json
import re
import secrets
from typing import Any

import trio

from ..exceptions import TrayError

# Ray's names and limits, unless said otherwise.
SUBMISSION_ID_PREFIX = "traysubmit_"
SUBMISSION_ID_PATTERN = re.compile(r"^[A-Za-z0-9_.\-]{1,128}$")
ENTRYPOINT_BYTES_MAX = 64 * 1024
METADATA_BYTES_MAX = 64 * 1024
# Records kept in the GCS: a submission beyond it fails with a clear error
# (delete finished jobs with delete_job); never an unbounded table.
JOBS_MAX = 10_000
# The working_dir package's limit, as Ray's GCS_STORAGE_MAX_SIZE (100 MiB).
PACKAGE_BYTES_MAX = 100 * 1024 * 1024
# get_job_logs returns at most the last this many bytes of the driver's log
# (Ray returns the whole file, however big).
LOG_BYTES_MAX = 16 * 1024 * 1024
# What a FAILED job's message quotes from the end of its log (Ray: 20,000).
FAILED_LOG_TAIL_CHARS = 20_000
PACKAGE_URI_PREFIX = "gcs://"
PACKAGE_KV_PREFIX = "_tray_job_pkg:"
PACKAGE_NAME_PATTERN = re.compile(r"^_tray_pkg_[0-9a-f]{32}\.zip$")
AUTH_HEADER = "Authorization"


class JobStatus(enum.StrEnum):
    """A submitted job's state, as Ray's ``JobStatus``."""

    PENDING = "PENDING"  # accepted; its supervisor is preparing the environment
    RUNNING = "RUNNING"  # the entrypoint's process runs
    STOPPED = "STOPPED"  # stopped by stop_job
    SUCCEEDED = "SUCCEEDED"  # the entrypoint exited with 0
    FAILED = "FAILED"  # it exited otherwise, or could not start

    def is_terminal(self) -> bool:
        return self in (JobStatus.STOPPED, JobStatus.SUCCEEDED, JobStatus.FAILED)


@dataclasses.dataclass(frozen=True)
class JobInfo:
    """A submitted job, as ``get_job_info`` and ``list_jobs`` return it
    (Ray's ``JobDetails`` fields that tray fills; times in ms since the
    epoch)."""

    submission_id: str
    status: JobStatus
    entrypoint: str
    message: str = ""
    error_type: str | None = None
    start_time: int | None = None
    end_time: int | None = None
    metadata: dict = dataclasses.field(default_factory=dict)
    runtime_env: dict = dataclasses.field(default_factory=dict)
    driver_exit_code: int | None = None
    driver_pid: int | None = None
    # The job id of the entrypoint's driver, once its tray.init() has run.
    driver_job_id: str | None = None
    # The supervisor process (on the head node) that runs the entrypoint.
    supervisor_pid: int | None = None
    supervisor_create_time: float | None = None
    type: str = "SUBMISSION"

    @property
    def job_id(self) -> str | None:
        """As Ray's ``JobDetails.job_id``: the job id of the entrypoint's
        driver (None until its ``tray.init()`` has run, or if it never
        connects)."""
        return self.driver_job_id

    def to_record(self) -> bytes:
        fields = dataclasses.asdict(self)
        fields["status"] = self.status.value
        return json.dumps(fields, sort_keys=True).encode()

    @classmethod
    def from_record(cls, record: bytes | str | dict) -> JobInfo:
        fields = record if isinstance(record, dict) else json.loads(record)
        known = {field.name for field in dataclasses.fields(cls)}
        fields = {key: value for key, value in fields.items() if key in known}
        fields["status"] = JobStatus(fields["status"])
        return cls(**fields)

    def to_json(self) -> dict:
        return {**json.loads(self.to_record()), "job_id": self.job_id}


class JobSubmissionError(TrayError, RuntimeError):
    """A job request refused (bad input, unknown job...). A RuntimeError
    too, which is what Ray's client raises for a refused request."""


class JobNotFoundError(JobSubmissionError):
    pass


def new_submission_id() -> str:
    return SUBMISSION_ID_PREFIX + secrets.token_hex(8)


def check_submission_id(submission_id: Any) -> str:
    if not isinstance(submission_id, str) or not SUBMISSION_ID_PATTERN.match(submission_id):
        raise JobSubmissionError(
            f"submission_id must be 1 to 128 letters, digits, '_', '.' or '-', got "
            f"{submission_id!r}")
    return submission_id


# ----------------------------------------------------------- the GCS calls


def gcs_call(gcs_address: str, token: bytes, method: str, *args):
    """One call to the cluster's GCS from a thread that runs no event loop
    (the HTTP handlers call it in a worker thread)."""
    from ..backends.local import query_gcs

    return trio.run(query_gcs, gcs_address, token, method, *args)


def read_job(gcs_address: str, token: bytes, submission_id: str) -> JobInfo | None:
    record = gcs_call(gcs_address, token, "job_submission_get", submission_id)
    return None if record is None else JobInfo.from_record(record)


def write_job(gcs_address: str, token: bytes, info: JobInfo, *, create: bool = False) -> bool:
    return gcs_call(gcs_address, token, "job_submission_put", info.submission_id,
                    info.to_record(), create)


def list_job_records(gcs_address: str, token: bytes) -> list[JobInfo]:
    return [JobInfo.from_record(record)
            for _, record in gcs_call(gcs_address, token, "job_submission_list")]


def link_driver(gcs_call, submission_id: str, driver_job_id: str) -> None:
    """Put a submitted job's driver's job id into its record (Ray's
    ``JobDetails.job_id``), so a submission and its driver are one job in
    ``tray list jobs``. ``tray.init()`` calls it in a job's driver, with
    ``gcs_call(method, *args)`` blocking on this driver's GCS connection.
    Best effort: a job runs the same without it."""
    try:
        record = gcs_call("job_submission_get", submission_id)
        if record is None:
            return
        fields = json.loads(record)
        fields["driver_job_id"] = driver_job_id
        gcs_call("job_submission_put", submission_id,
                 json.dumps(fields, sort_keys=True).encode(), False)
    except Exception:  # noqa: BLE001 - never fail the user's init for it
        pass
