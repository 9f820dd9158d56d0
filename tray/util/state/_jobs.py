"""Jobs (``list_jobs``: drivers' jobs from the GCS's driver table and
submitted jobs from the job manager's) and placement groups
(``list_placement_groups``: the GCS's table).
"""

from __future__ import annotations

from ._client import Client, job_hex
from ._query import check_query, finish
from ._records import JobState, PlacementGroupState


def list_jobs(address: str | None = None, filters: list | None = None,
              limit: int | None = None, timeout: float | None = None,
              detail: bool = False, raise_on_missing_output: bool = True) -> list[JobState]:
    """Drivers' jobs (every ``tray.init`` that joined, by job id) and
    submitted jobs (``tray job submit``, by submission id)."""
    import json

    checked = check_query(JobState, filters, limit)
    client = Client(address, timeout)
    # A driver's job is over once its driver went away (Ray's is_dead: the
    # dashboard shows such a job SUCCEEDED).
    records = [JobState(job_id=job_hex(job), submission_id=None, type="DRIVER",
                        status="SUCCEEDED" if ended else "RUNNING", entrypoint="",
                        driver_address=driver)
               for job, driver, ended in client.gcs_call("list_driver_jobs")]
    try:
        submissions = client.gcs_call("job_submission_list")
    except Exception:  # noqa: BLE001 - a GCS without the job manager's table
        submissions = []
    for submission_id, record in submissions:
        try:
            info = json.loads(record)
        except ValueError:
            continue
        records.append(JobState(
            job_id=submission_id, submission_id=submission_id, type="SUBMISSION",
            status=str(info.get("status", "")), entrypoint=info.get("entrypoint", ""),
            message=info.get("message"), start_time=info.get("start_time"),
            end_time=info.get("end_time"), metadata=info.get("metadata")))
    return finish(JobState, records, checked, limit, detail, "jobs")


# ======================================================= placement groups


def list_placement_groups(address: str | None = None, filters: list | None = None,
                          limit: int | None = None, timeout: float | None = None,
                          detail: bool = False, raise_on_missing_output: bool = True
                          ) -> list[PlacementGroupState]:
    checked = check_query(PlacementGroupState, filters, limit)
    client = Client(address, timeout)
    records = [PlacementGroupState(
        placement_group_id=info.pg_id, name=info.name, state=info.state.value,
        strategy=info.strategy, bundles=[dict(b) for b in info.bundles],
        is_detached=info.detached) for info in client.gcs_call("list_placement_groups")]
    return finish(PlacementGroupState, records, checked, limit, detail, "placement groups")
