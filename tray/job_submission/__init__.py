"""Jobs: hand a cluster a command to run, with its code and dependencies.

As Ray's job submission: ``JobSubmissionClient(address).submit_job(
entrypoint="python script.py", runtime_env={"working_dir": ".", "pip":
[...], "env_vars": {...}})`` packs and uploads the working directory, and
the cluster runs the entrypoint as a supervised process on its head node,
whose ``tray.init()`` joins that cluster. Its status lives in the GCS (it
outlives the submitting client), its output in a log file on the head that
``get_job_logs`` / ``tail_job_logs`` read back, and ``stop_job`` ends the
driver and everything it owned. ``tray job submit|status|logs|stop|list|
delete`` is the same from the shell.

The pieces: ``sdk`` (the client, HTTP), ``tray/dashboard/job_api.py`` (the
routes, served on the head by the dashboard), ``_manager`` (what the routes
do), ``_supervisor`` (one process per job), ``_common`` (the record kept in
the GCS's ``job_submissions`` table)."""

from ._common import JobInfo, JobNotFoundError, JobStatus, JobSubmissionError
from .sdk import JobSubmissionClient

# Ray's name for what get_job_info and list_jobs return.
JobDetails = JobInfo

__all__ = ["JobSubmissionClient", "JobStatus", "JobInfo", "JobDetails", "JobSubmissionError",
           "JobNotFoundError"]
