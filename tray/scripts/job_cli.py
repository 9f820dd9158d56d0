"""``tray job``: submit and follow jobs from the shell (Ray's ``ray job``).

    tray job submit [--address URL] [--working-dir DIR] [--runtime-env-json J]
                    [--submission-id ID] [--metadata-json J] [--no-wait] -- python script.py args
    tray job status ID | logs ID [--follow] | stop ID [--no-wait] | list | delete ID

The address is the job API's (the dashboard's) URL: ``--address``, else
``TRAY_API_SERVER_ADDRESS`` or ``TRAY_ADDRESS`` when an http(s) URL, else
the dashboard of the cluster started on this machine, else
http://127.0.0.1:8265. The
token comes from ``--token-file`` (a file only you can read), else
``TRAY_CLUSTER_TOKEN``, else where ``tray start --head`` kept it on this
machine; never from the command line, where every user of the machine
could read it.

``submit`` waits for the job and streams its logs unless ``--no-wait``; as
Ray's, it exits 1 when the job failed, else 0. The
entrypoint is one shell command: a single argument is taken as written
(``-- "python a.py && python b.py"``), several are joined with shell
quoting."""

from __future__ import annotations

import json
import os
import shlex
import stat
import sys
import time

import click

from ..exceptions import TrayError
from ..job_submission import JobStatus, JobSubmissionClient

WAIT_POLL_S = 0.5


def _read_token_file(path: str) -> str:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as error:
        raise click.UsageError(f"cannot read the token file {path}: {error.strerror}") from None
    with os.fdopen(fd, "rb") as file:
        info = os.fstat(file.fileno())
        if info.st_uid != os.getuid() or info.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise click.UsageError(f"the token file {path} must be yours and readable by you "
                                   "alone (chmod 600)")
        return file.read().decode().strip()


def _client(address: str | None, token_file: str | None) -> JobSubmissionClient:
    token = _read_token_file(token_file) if token_file else None
    try:
        return JobSubmissionClient(address, token=token)
    except (TrayError, ValueError) as error:
        raise click.ClickException(str(error)) from None


def _address_options(command):
    command = click.option("--token-file", default=None, metavar="PATH",
                           help="a file (mode 0600) holding the cluster's token")(command)
    return click.option("--address", default=None, metavar="URL",
                        help="the job API's URL (default: $TRAY_API_SERVER_ADDRESS or "
                             "$TRAY_ADDRESS if an http URL, else the dashboard of the cluster "
                             "started here, else http://127.0.0.1:8265)")(command)


def _run(action):
    try:
        return action()
    except (TrayError, ValueError, TypeError) as error:
        raise click.ClickException(str(error)) from None


@click.group(help="submit jobs to a cluster and follow them")
def job() -> None:
    pass


@job.command(context_settings={"ignore_unknown_options": True})
@_address_options
@click.option("--working-dir", default=None, metavar="DIR",
              help="a local directory (or .zip) uploaded with the job: its cwd and first "
                   "sys.path entry (overrides the runtime env's working_dir)")
@click.option("--runtime-env", "runtime_env_file", default=None, metavar="PATH",
              help="a YAML file holding the job's runtime env")
@click.option("--runtime-env-json", default=None, metavar="JSON",
              help='the job\'s runtime env, e.g. \'{"pip": ["x"], "env_vars": {"A": "1"}}\'')
@click.option("--submission-id", default=None, help="the job's id (default: a new one)")
@click.option("--metadata-json", default=None, metavar="JSON",
              help="string-to-string metadata kept with the job")
@click.option("--no-wait", is_flag=True, help="return once submitted: do not stream its logs")
@click.argument("entrypoint", nargs=-1, required=True, type=click.UNPROCESSED)
def submit(address, token_file, working_dir, runtime_env_file, runtime_env_json, submission_id,
           metadata_json, no_wait, entrypoint) -> None:
    """Submit ENTRYPOINT (after --) as a job."""
    if runtime_env_file is not None and runtime_env_json is not None:
        raise click.UsageError("give --runtime-env or --runtime-env-json, not both")
    runtime_env = (_yaml_file("--runtime-env", runtime_env_file) if runtime_env_file
                   else _json_option("--runtime-env-json", runtime_env_json))
    metadata = _json_option("--metadata-json", metadata_json)
    if working_dir is not None:
        runtime_env["working_dir"] = working_dir
    command = entrypoint[0] if len(entrypoint) == 1 else shlex.join(entrypoint)
    client = _client(address, token_file)
    submission_id = _run(lambda: client.submit_job(
        entrypoint=command, runtime_env=runtime_env or None, metadata=metadata or None,
        submission_id=submission_id))
    click.echo(f"Job '{submission_id}' submitted successfully")
    if no_wait:
        click.echo(f"  status: tray job status {submission_id}")
        click.echo(f"  logs:   tray job logs {submission_id} --follow")
        click.echo(f"  stop:   tray job stop {submission_id}")
        return
    click.echo("-" * 40 + f"\nJob '{submission_id}' logs\n" + "-" * 40)
    _follow(client, submission_id)
    info = _run(lambda: client.get_job_info(submission_id))
    click.echo("-" * 40)
    _report(info)
    sys.exit(1 if info.status is JobStatus.FAILED else 0)


def _json_option(name: str, text: str | None) -> dict:
    if text is None:
        return {}
    try:
        value = json.loads(text)
    except ValueError as error:
        raise click.BadParameter(f"not JSON: {error}", param_hint=name) from None
    if not isinstance(value, dict):
        raise click.BadParameter("must be a JSON object", param_hint=name)
    return value


def _yaml_file(name: str, path: str) -> dict:
    try:
        import yaml
    except ImportError:
        raise click.UsageError(f"{name} needs PyYAML (pip install pyyaml); or pass "
                               "--runtime-env-json") from None
    try:
        with open(path) as file:
            value = yaml.safe_load(file)
    except OSError as error:
        raise click.BadParameter(f"cannot read {path}: {error.strerror}",
                                 param_hint=name) from None
    except yaml.YAMLError as error:
        raise click.BadParameter(f"{path} is not YAML: {error}", param_hint=name) from None
    if not isinstance(value, dict):
        raise click.BadParameter(f"{path} must hold a mapping", param_hint=name)
    return value


def _follow(client: JobSubmissionClient, submission_id: str) -> None:
    import trio

    async def stream():
        async for text in client.tail_job_logs(submission_id):
            click.echo(text, nl=False)

    try:
        _run(lambda: trio.run(stream))
    except KeyboardInterrupt:
        # As Ray's: Ctrl-C stops following, not the job.
        click.echo(f"\nStopped following job '{submission_id}'; it goes on (tray job stop "
                   f"{submission_id} ends it)", err=True)
        sys.exit(130)


def _report(info) -> None:
    status = info.status
    if status is JobStatus.SUCCEEDED:
        click.echo(f"Job '{info.submission_id}' succeeded")
    elif status is JobStatus.STOPPED:
        click.echo(f"Job '{info.submission_id}' was stopped")
    elif status is JobStatus.FAILED:
        click.echo(f"Job '{info.submission_id}' failed: {info.message}")
    else:
        click.echo(f"Job '{info.submission_id}' is {status.value}: {info.message}")


@job.command()
@_address_options
@click.argument("submission_id")
def status(address, token_file, submission_id) -> None:
    """Print a job's status."""
    client = _client(address, token_file)
    info = _run(lambda: client.get_job_info(submission_id))
    click.echo(f"Status for job '{submission_id}': {info.status.value}")
    if info.message:
        click.echo(f"Status message: {info.message}")


@job.command()
@_address_options
@click.option("-f", "--follow", is_flag=True, help="keep printing until the job ends")
@click.argument("submission_id")
def logs(address, token_file, follow, submission_id) -> None:
    """Print a job's logs."""
    client = _client(address, token_file)
    if follow:
        _follow(client, submission_id)
    else:
        click.echo(_run(lambda: client.get_job_logs(submission_id)), nl=False)


@job.command()
@_address_options
@click.option("--no-wait", is_flag=True, help="return once asked: do not wait for it to stop")
@click.argument("submission_id")
def stop(address, token_file, no_wait, submission_id) -> None:
    """Stop a job (and everything its driver owns)."""
    client = _client(address, token_file)
    if not _run(lambda: client.stop_job(submission_id)):
        click.echo(f"Job '{submission_id}' had already ended "
                   f"({_run(lambda: client.get_job_status(submission_id)).value})")
        return
    click.echo(f"Asked job '{submission_id}' to stop")
    if no_wait:
        return
    deadline = time.monotonic() + 60.0
    while time.monotonic() < deadline:
        info = _run(lambda: client.get_job_info(submission_id))
        if info.status.is_terminal():
            _report(info)
            return
        time.sleep(WAIT_POLL_S)
    raise click.ClickException(f"job '{submission_id}' did not stop within 60 s")


@job.command(name="list")
@_address_options
def list_(address, token_file) -> None:
    """List the cluster's jobs."""
    client = _client(address, token_file)
    jobs = _run(client.list_jobs)
    if not jobs:
        click.echo("No jobs.")
        return
    click.echo(f"{'SUBMISSION ID':<32} {'STATUS':<10} {'START':<19}  ENTRYPOINT")
    for info in sorted(jobs, key=lambda job: job.start_time or 0):
        started = time.strftime("%Y-%m-%d %H:%M:%S",
                                time.localtime((info.start_time or 0) / 1000))
        click.echo(f"{info.submission_id:<32} {info.status.value:<10} {started:<19}  "
                   f"{info.entrypoint}")


@job.command()
@_address_options
@click.argument("submission_id")
def delete(address, token_file, submission_id) -> None:
    """Delete an ended job's record and logs."""
    client = _client(address, token_file)
    _run(lambda: client.delete_job(submission_id))
    click.echo(f"Job '{submission_id}' deleted")


if __name__ == "__main__":
    job()
