"""Jobs (``tray.job_submission``, ``tray job``) on a ``tray start --head``
cluster: the entrypoint runs as a supervised process on the head, its
driver joins the cluster by itself, its working_dir, pip requirements and
env_vars are its own, its logs come back, ``stop`` frees what it held, and
every bad input fails with a clear message.

One cluster serves the module (starting one costs seconds of real
processes); each test submits its own jobs with their own ids. Pip installs
run with ``PIP_NO_INDEX=1`` from a wheel built here, so no test depends on
what a package registry serves."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import subprocess
import sys
import time
import zipfile

import httpx
import psutil
import pytest
import trio
from polling import wait_for  # (tests/ is on sys.path)

from tray.backends.local import query_gcs
from tray.backends.local.session import free_port
from tray.job_submission import (
    JobInfo,
    JobNotFoundError,
    JobStatus,
    JobSubmissionClient,
    JobSubmissionError,
)
from tray.job_submission._manager import check_runtime_env
from tray.scripts.job_cli import job as job_group

WAIT_S = 90.0


# ------------------------------------------------------------ helpers


def _make_wheel(directory, name: str, version: str, source: str) -> str:
    """A pure-Python wheel holding ``<name>/__init__.py``, built by hand."""
    dist = f"{name}-{version}.dist-info"
    entries = {f"{name}/__init__.py": source,
               f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
               f"{dist}/WHEEL": "Wheel-Version: 1.0\nGenerator: tray-tests\n"
                                "Root-Is-Purelib: true\nTag: py3-none-any\n"}
    record = []
    for path, text in entries.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=")
        record.append(f"{path},sha256={digest.decode()},{len(text.encode())}")
    entries[f"{dist}/RECORD"] = "\n".join([*record, f"{dist}/RECORD,,"]) + "\n"
    path = os.path.join(directory, f"{name}-{version}-py3-none-any.whl")
    with zipfile.ZipFile(path, "w") as archive:
        for entry, text in entries.items():
            archive.writestr(entry, text)
    return path


def _wait_terminal(client: JobSubmissionClient, submission_id: str,
                   timeout_s: float = WAIT_S) -> JobInfo:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        info = client.get_job_info(submission_id)
        if info.status.is_terminal():
            return info
        time.sleep(0.2)
    raise AssertionError(f"job {submission_id} did not end within {timeout_s} s: "
                         f"{client.get_job_info(submission_id)}")


def _cpus(cluster) -> tuple[float, float]:
    """(total, available) CPUs of the cluster, from its GCS."""
    nodes = trio.run(query_gcs, cluster["gcs"], cluster["token"].encode(), "get_all_nodes")
    live = [node for node in nodes if node.alive]
    return (sum(node.resources.get("CPU", 0) for node in live),
            sum(node.available.get("CPU", 0) for node in live))


def _tray(root, *args, env_extra=None, check=True, timeout=120):
    env = {**os.environ, "TRAY_SESSION_ROOT": str(root), **(env_extra or {})}
    result = subprocess.run([sys.executable, "-m", "tray.scripts.cli", *args], env=env,
                            capture_output=True, text=True, timeout=timeout)
    if check:
        assert result.returncode == 0, result.stdout + result.stderr
    return result


# ------------------------------------------------------------ the cluster


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """A head started with ``tray start --head``; its job API is the
    dashboard's (B's server mounts ``tray/dashboard/job_api.py``) or, where
    ``tray start`` serves no dashboard, the job API served alone."""
    root = tmp_path_factory.mktemp("jobs") / "sessions"
    port, dashboard_port = free_port(), free_port()
    # What the head (and so every job) sees: pip never reaches a registry.
    env = {"PIP_NO_INDEX": "1", "PIP_FIND_LINKS": "", "TRAY_SESSION_ROOT": str(root)}
    started = _tray(root, "start", "--head", "--port", str(port), "--num-cpus", "2",
                    "--dashboard-port", str(dashboard_port), env_extra=env, check=False)
    if started.returncode != 0 and "dashboard-port" in started.stderr:
        started = _tray(root, "start", "--head", "--port", str(port), "--num-cpus", "2",
                        env_extra=env)
    assert started.returncode == 0, started.stdout + started.stderr
    with open(root / "current_cluster.json") as file:
        current = json.load(file)
    server = None
    match = re.search(r"Dashboard:\s+(http://\S+)", started.stdout)
    if match:
        url = match.group(1).rstrip("/")
    else:
        url = f"http://127.0.0.1:{dashboard_port}"
        server = subprocess.Popen(
            [sys.executable, "-m", "tray.dashboard.job_api", "--address", current["address"],
             "--port", str(dashboard_port)],
            env={**os.environ, **env, "TRAY_CLUSTER_TOKEN": current["token"]},
            stdin=subprocess.DEVNULL)
    info = {"root": root, "url": url, "token": current["token"],
            "gcs": "tcp:" + current["address"], "session_dir": current["session_dir"],
            "env": env}
    client = JobSubmissionClient(url, token=current["token"])
    wait_for(lambda: _answers(client), "the job API to answer", timeout_s=30)
    try:
        yield info
    finally:
        leftover = []
        try:
            for job in client.list_jobs():
                if not job.status.is_terminal():
                    client.stop_job(job.submission_id)
                    leftover.append(job.submission_id)
            for submission_id in leftover:
                _wait_terminal(client, submission_id, 20)
        finally:
            if server is not None:
                server.terminate()
                server.wait(10)
            _tray(root, "stop", check=False)


def _answers(client) -> bool:
    try:
        client.list_jobs()
        return True
    except Exception:  # noqa: BLE001 - not up yet
        return False


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> str:
    """A tiny package's wheel: one path for the module, so jobs that ask for
    it share one virtualenv on the head."""
    return _make_wheel(str(tmp_path_factory.mktemp("wheels")), "tinyjobpkg", "1.0",
                       "VALUE = 'tiny 1.0'\n")


@pytest.fixture
def client(cluster) -> JobSubmissionClient:
    return JobSubmissionClient(cluster["url"], token=cluster["token"])


# ------------------------------------------------------------ the job's code

WORKING_DIR_MAIN = """\
import os, sys
import tray
import helper              # from the working_dir
import tinyjobpkg          # from the job's pip requirements
import jobslib             # from the job's py_modules

print("helper:", helper.GREETING, flush=True)
print("pip:", tinyjobpkg.VALUE, flush=True)
print("env:", os.environ.get("JOB_COLOR"), flush=True)
print("py_modules:", jobslib.NAME, flush=True)
print("prefix:", sys.prefix, flush=True)
tray.init()                # no address: joins the cluster the job was submitted to

@tray.remote
def square(x):
    import helper          # the job's working_dir reaches its tasks too
    import jobslib, tinyjobpkg   # and so do its py_modules and pip packages
    assert (jobslib.NAME, tinyjobpkg.VALUE) == ("jobslib", "tiny 1.0")
    return x * x, helper.GREETING

print("tasks:", tray.get([square.remote(i) for i in range(4)]), flush=True)
print("cpus:", tray.cluster_resources()["CPU"], flush=True)
print("job id:", tray.get_runtime_context().get_job_id(), flush=True)
"""


def _working_dir(tmp_path, greeting: str):
    directory = tmp_path / "project"
    directory.mkdir()
    (directory / "helper.py").write_text(f"GREETING = {greeting!r}\n")
    (directory / "main.py").write_text(WORKING_DIR_MAIN)
    (directory / "data.bin").write_bytes(b"x" * 1000)
    return directory


# ------------------------------------------------------------ the API


def test_python_client_runs_a_job_with_working_dir_pip_and_env_vars(cluster, client,
                                                                    tmp_path, wheel):
    directory = _working_dir(tmp_path, "hello from the working_dir")
    library = tmp_path / "lib" / "jobslib"
    library.mkdir(parents=True)
    (library / "__init__.py").write_text("NAME = 'jobslib'\n")
    submission_id = client.submit_job(
        entrypoint="python main.py",
        runtime_env={"working_dir": str(directory), "pip": [wheel], "py_modules": [str(library)],
                     "env_vars": {"JOB_COLOR": "blue"}, "excludes": ["data.bin"]},
        metadata={"owner": "test"})
    # A second job with the same requirements, at the same time: one venv for both.
    twin = client.submit_job(
        entrypoint="python -c 'import sys, tinyjobpkg; print(tinyjobpkg.VALUE, sys.prefix)'",
        runtime_env={"pip": [wheel]})
    assert submission_id.startswith("traysubmit_")
    info = _wait_terminal(client, submission_id)
    logs = client.get_job_logs(submission_id)
    assert info.status is JobStatus.SUCCEEDED, (info, logs)
    assert "helper: hello from the working_dir" in logs
    assert "pip: tiny 1.0" in logs
    assert "env: blue" in logs
    assert "py_modules: jobslib" in logs
    assert "tasks: [(0, 'hello from the working_dir'), (1, 'hello from the working_dir'), " \
           "(4, 'hello from the working_dir'), (9, 'hello from the working_dir')]" in logs
    assert "cpus: 2.0" in logs  # it joined this cluster, it did not start one
    assert info.driver_exit_code == 0 and info.message == "Job finished successfully."
    assert info.metadata == {"owner": "test"} and info.entrypoint == "python main.py"
    assert info.runtime_env["working_dir"].startswith("gcs://_tray_pkg_")
    assert info.start_time <= info.end_time
    # The submission knows its driver's job id (Ray's JobDetails.job_id).
    assert re.search(r"^job id: (\w+)$", logs, flags=re.M).group(1) == info.job_id
    assert client.get_job_status(submission_id) is JobStatus.SUCCEEDED
    # The record lives in the GCS's job table, where the state API reads it.
    records = dict(trio.run(query_gcs, cluster["gcs"], cluster["token"].encode(),
                            "job_submission_list"))
    assert json.loads(records[submission_id])["status"] == "SUCCEEDED"
    # excludes honoured: the unpacked working_dir has no data.bin.
    unpacked = os.path.join(cluster["session_dir"], "runtime_resources", "working_dir")
    assert not any("data.bin" in files for _, _, files in os.walk(unpacked))
    assert _wait_terminal(client, twin).status is JobStatus.SUCCEEDED
    [prefix] = re.findall(r"^prefix: (.*)$", logs, flags=re.M)
    assert prefix != sys.prefix  # a virtualenv of the job's own...
    assert client.get_job_logs(twin) == f"tiny 1.0 {prefix}\n"  # ...made once for both
    assert submission_id in [job.submission_id for job in client.list_jobs()]
    assert client.delete_job(submission_id) is True
    with pytest.raises(JobNotFoundError, match="does not exist"):
        client.get_job_info(submission_id)


async def test_tail_job_logs_streams_until_the_job_ends(client):
    submission_id = client.submit_job(
        entrypoint="python -c \"import time\nfor i in range(5):\n    print('line', i, "
                   "flush=True); time.sleep(0.3)\"")
    chunks = []
    with trio.fail_after(WAIT_S):
        async for text in client.tail_job_logs(submission_id):
            chunks.append(text)
    assert "".join(chunks) == "".join(f"line {i}\n" for i in range(5))
    assert client.get_job_status(submission_id) is JobStatus.SUCCEEDED


def test_stop_ends_the_driver_and_frees_its_resources(cluster, client, tmp_path):
    (tmp_path / "hold.py").write_text(
        "import time, tray\n"
        "tray.init()\n"
        "@tray.remote(num_cpus=1)\n"
        "class Holder:\n"
        "    def ping(self):\n"
        "        return 'pong'\n"
        "@tray.remote(num_cpus=1)\n"
        "def forever():\n"
        "    time.sleep(3600)\n"
        "holder = Holder.remote()\n"
        "print(tray.get(holder.ping.remote()), flush=True)\n"
        "ref = forever.remote()\n"
        "print('holding', flush=True)\n"
        "time.sleep(3600)\n")
    total, available = _cpus(cluster)
    assert available == total == 2.0
    submission_id = client.submit_job(entrypoint="python hold.py",
                                      runtime_env={"working_dir": str(tmp_path)})
    wait_for(lambda: "holding" in client.get_job_logs(submission_id), "the job to hold CPUs", timeout_s=WAIT_S)
    wait_for(lambda: _cpus(cluster)[1] == 0.0, "both CPUs to be taken", timeout_s=WAIT_S)
    driver = psutil.Process(client.get_job_info(submission_id).driver_pid)
    assert client.stop_job(submission_id) is True
    info = _wait_terminal(client, submission_id, 30)
    assert info.status is JobStatus.STOPPED and info.message == "Job was intentionally stopped."
    assert not driver.is_running() or driver.status() == psutil.STATUS_ZOMBIE
    # The actor and the task went with their driver: the CPUs are back.
    wait_for(lambda: _cpus(cluster)[1] == 2.0, "the job's CPUs to be freed", timeout_s=30)
    assert client.stop_job(submission_id) is False  # it had already ended
    with pytest.raises(JobSubmissionError, match="already exists"):
        client.submit_job(entrypoint="true", submission_id=submission_id)


def test_concurrent_jobs_see_only_their_own_env_vars_and_working_dir(client, tmp_path):
    script = ("import os, pathlib, time, tray\n"
              "def seen():\n"
              "    return (os.environ.get('MINE'),\n"
              "            sorted(k for k in os.environ if k.startswith('ONLY_')),\n"
              "            pathlib.Path('which.txt').read_text())\n"
              "tray.init()\n"
              "time.sleep(1)  # both jobs run at once\n"
              "print('driver', *seen(), flush=True)\n"
              "print('task', *tray.get(tray.remote(seen).remote()), flush=True)\n")
    ids = {}
    for name in ("a", "b"):
        directory = tmp_path / name
        directory.mkdir()
        (directory / "which.txt").write_text(f"dir-{name}")
        (directory / "show.py").write_text(script)
        ids[name] = client.submit_job(
            entrypoint="python show.py",
            runtime_env={"working_dir": str(directory),
                         "env_vars": {"MINE": f"env-{name}", f"ONLY_{name.upper()}": "1"}})
    for name, submission_id in ids.items():
        info = _wait_terminal(client, submission_id)
        logs = client.get_job_logs(submission_id)
        assert info.status is JobStatus.SUCCEEDED, logs
        seen = f"env-{name} ['ONLY_{name.upper()}'] dir-{name}"
        assert logs == f"driver {seen}\ntask {seen}\n"  # the driver's and its tasks' view


def test_unauthenticated_requests_get_401_and_do_nothing(cluster, client):
    before = len(client.list_jobs())
    body = {"entrypoint": "touch should-not-exist"}
    for headers in ({}, {"Authorization": "Bearer wrong-token"},
                    {"Authorization": cluster["token"]}):
        response = httpx.post(cluster["url"] + "/api/jobs/", json=body, headers=headers)
        assert response.status_code == 401, response.text
        assert "token" in response.json()["error"]
        assert httpx.get(cluster["url"] + "/api/jobs/", headers=headers).status_code == 401
        assert httpx.put(cluster["url"] + "/api/packages/gcs://_tray_pkg_" + "0" * 64 + ".zip",
                         content=b"zip", headers=headers).status_code == 401
    assert len(client.list_jobs()) == before
    wrong = JobSubmissionClient(cluster["url"], token="wrong-token")
    with pytest.raises(Exception, match="refused this client's token"):
        wrong.list_jobs()


def test_a_killed_supervisor_fails_its_job_instead_of_running_forever(client):
    submission_id = client.submit_job(entrypoint="sleep 600")
    info = wait_for(lambda: (lambda i: i if i.status is JobStatus.RUNNING else None)(
        client.get_job_info(submission_id)), "the job to run", timeout_s=WAIT_S)
    os.kill(info.driver_pid, 9)  # the driver goes too: nothing left running
    os.kill(info.supervisor_pid, 9)
    info = _wait_terminal(client, submission_id, 30)
    assert info.status is JobStatus.FAILED
    assert info.error_type in ("JOB_SUPERVISOR_DIED", "JOB_ENTRYPOINT_COMMAND_ERROR")


def test_a_driver_orphaned_by_its_supervisor_is_killed(client):
    """SIGKILL of the supervisor alone: the job reads FAILED and its driver
    (a session of its own, which nothing else would stop) is killed, not
    left running untracked."""
    import psutil

    submission_id = client.submit_job(entrypoint="sleep 600")
    info = wait_for(lambda: (lambda i: i if i.status is JobStatus.RUNNING else None)(
        client.get_job_info(submission_id)), "the job to run", timeout_s=WAIT_S)
    driver = psutil.Process(info.driver_pid)
    os.kill(info.supervisor_pid, 9)
    info = _wait_terminal(client, submission_id, 30)
    assert info.status is JobStatus.FAILED and info.error_type == "JOB_SUPERVISOR_DIED"
    def ended() -> bool:  # gone, or a zombie (its parent, the supervisor,
        try:              # is dead; whoever inherits it may not reap it at once)
            return driver.status() == psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return True

    deadline = time.monotonic() + 10
    while not ended() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert ended()
    assert client.stop_job(submission_id) is False  # over: nothing left to stop


# ------------------------------------------------------------ bad input


def test_bad_input_fails_with_a_clear_message(cluster, client, tmp_path):
    with pytest.raises(ValueError, match="does not exist or is not a directory"):
        client.submit_job(entrypoint="python x.py",
                          runtime_env={"working_dir": str(tmp_path / "missing")})
    big = tmp_path / "big"
    big.mkdir()
    with open(big / "huge.bin", "wb") as file:
        file.truncate(101 * 1024 * 1024)  # sparse: nothing is written, or read
    (big / "small.py").write_text("x = 1\n")
    with pytest.raises(ValueError, match=r"over the limit of 100\.0 MiB.*huge\.bin"):
        client.submit_job(entrypoint="python small.py", runtime_env={"working_dir": str(big)})
    with pytest.raises(JobSubmissionError, match="entrypoint must be a non-empty"):
        client.submit_job(entrypoint="  ")
    with pytest.raises(JobSubmissionError, match="unknown runtime_env key 'colour'"):
        client.submit_job(entrypoint="true", runtime_env={"colour": "red"})
    with pytest.raises(JobSubmissionError, match="env_vars"):
        client.submit_job(entrypoint="true", runtime_env={"env_vars": {"A": 1}})
    with pytest.raises(JobSubmissionError, match="submission_id must be"):
        client.submit_job(entrypoint="true", submission_id="has space")
    # The server takes only uploaded packages (what a client that skipped the upload sends).
    response = httpx.post(cluster["url"] + "/api/jobs/",
                          json={"entrypoint": "true", "runtime_env": {"working_dir": "/x"}},
                          headers={"Authorization": f"Bearer {cluster['token']}"})
    assert response.status_code == 400 and "not an uploaded package" in response.json()["error"]
    with pytest.raises(ValueError, match="not supported by tray yet"):
        client.submit_job(entrypoint="true", entrypoint_num_cpus=1)
    with pytest.raises(JobNotFoundError, match="Job no-such-job does not exist"):
        client.get_job_status("no-such-job")
    with pytest.raises(JobNotFoundError):
        client.stop_job("no-such-job")

    # A requirement that does not exist: the job fails, with pip's own error.
    bad_pip = client.submit_job(entrypoint="python -c 'print(1)'",
                                runtime_env={"pip": ["tray-no-such-package-xyz==9.9"]})
    # A bad entrypoint: the script is not there.
    bad_script = client.submit_job(entrypoint="python no_such_script.py")
    info = _wait_terminal(client, bad_pip)
    assert info.status is JobStatus.FAILED and info.error_type == "RUNTIME_ENV_SETUP_FAILURE"
    assert re.search(r"pip install .*failed \(exit code 1\)", info.message), info.message
    assert "No matching distribution found for tray-no-such-package-xyz" in info.message
    info = _wait_terminal(client, bad_script)
    assert info.status is JobStatus.FAILED and info.driver_exit_code == 2
    assert info.error_type == "JOB_ENTRYPOINT_COMMAND_ERROR"
    assert "exit code 2" in info.message and "no_such_script.py" in info.message

    running = client.submit_job(entrypoint="sleep 600")
    with pytest.raises(JobSubmissionError, match="non-terminal state"):
        client.delete_job(running)
    assert client.stop_job(running)
    assert _wait_terminal(client, running, 30).status is JobStatus.STOPPED


def test_runtime_env_checks_are_clear():
    uri = "gcs://_tray_pkg_" + "0" * 64 + ".zip"
    with pytest.raises(JobSubmissionError, match="'/home/me/lib' is not an uploaded package"):
        check_runtime_env({"py_modules": [uri, "/home/me/lib"]})
    with pytest.raises(JobSubmissionError, match="was not uploaded"):
        check_runtime_env({"working_dir": uri}, uploaded=lambda uri: False)
    assert check_runtime_env(None) == {}
    # Normalized as tasks carry it, so the driver and its workers share one env.
    assert check_runtime_env({"pip": ["a", "b"], "env_vars": {"X": "1"}, "py_modules": [uri],
                              "config": {"setup_timeout_seconds": 5}}) == {
        "pip": {"packages": ["a", "b"], "pip_check": False, "pip_install_options": []},
        "env_vars": {"X": "1"}, "py_modules": [uri], "config": {"setup_timeout_seconds": 5}}
    info = JobInfo(submission_id="x", status=JobStatus.RUNNING, entrypoint="true")
    assert JobInfo.from_record(info.to_record()) == info
    assert [s.is_terminal() for s in JobStatus] == [False, False, True, True, True]


# ------------------------------------------------------------ the CLI


def test_cli_submit_streams_logs_and_the_other_commands_work(cluster, tmp_path, wheel):
    from click.testing import CliRunner

    directory = tmp_path / "cli"
    directory.mkdir()
    (directory / "mod.py").write_text("WORD = 'from-module'\n")
    (directory / "run.py").write_text(
        "import sys, tray, mod, tinyjobpkg\n"
        "tray.init()\n"
        "print(mod.WORD, sys.argv[1:], tray.get(tray.put(7)), tinyjobpkg.VALUE, flush=True)\n")
    # A requirements file, read by the CLI on this machine.
    (tmp_path / "requirements.txt").write_text(f"# the job's requirements\n{wheel}\n")
    env = {**os.environ, **cluster["env"], "TRAY_CLUSTER_TOKEN": cluster["token"],
           "TRAY_ADDRESS": cluster["url"]}
    # The real command line, as a user types it: waits and streams the logs.
    result = subprocess.run(
        [sys.executable, "-m", "tray.scripts.cli", "job", "submit", "--working-dir",
         str(directory), "--submission-id", "cli-job-1", "--runtime-env-json",
         json.dumps({"env_vars": {"A": "1"}, "pip": str(tmp_path / "requirements.txt")}),
         "--", "python", "run.py", "x y"],
        env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Job 'cli-job-1' submitted successfully" in result.stdout
    assert "from-module ['x y'] 7 tiny 1.0" in result.stdout
    assert "Job 'cli-job-1' succeeded" in result.stdout

    runner = CliRunner(env={"TRAY_CLUSTER_TOKEN": cluster["token"],
                            "TRAY_ADDRESS": cluster["url"]})
    out = runner.invoke(job_group, ["status", "cli-job-1"])
    assert out.exit_code == 0 and "Status for job 'cli-job-1': SUCCEEDED" in out.output
    out = runner.invoke(job_group, ["logs", "cli-job-1"])
    assert out.exit_code == 0 and "from-module ['x y'] 7 tiny 1.0" in out.output
    out = runner.invoke(job_group, ["list"])
    assert out.exit_code == 0 and re.search(r"cli-job-1\s+SUCCEEDED", out.output)
    (tmp_path / "env.yaml").write_text("env_vars:\n  GREETING: from-yaml\n")
    out = runner.invoke(job_group, ["submit", "--runtime-env", str(tmp_path / "env.yaml"),
                                    "--", "echo $GREETING"])
    assert out.exit_code == 0 and "from-yaml" in out.output, out.output
    out = runner.invoke(job_group, ["submit", "--no-wait", "--submission-id", "cli-job-2",
                                    "--", "sleep 600"])
    assert out.exit_code == 0 and "tray job stop cli-job-2" in out.output
    out = runner.invoke(job_group, ["stop", "cli-job-2"])
    assert out.exit_code == 0 and "Job 'cli-job-2' was stopped" in out.output
    out = runner.invoke(job_group, ["delete", "cli-job-1"])
    assert out.exit_code == 0 and "deleted" in out.output
    out = runner.invoke(job_group, ["status", "cli-job-1"])
    assert out.exit_code == 1 and "Job cli-job-1 does not exist" in out.output
    out = runner.invoke(job_group, ["submit", "--working-dir", str(tmp_path / "nope"),
                                    "--", "python", "x.py"])
    assert out.exit_code == 1 and "does not exist or is not a directory" in out.output
    out = runner.invoke(job_group, ["submit", "--runtime-env-json", "{oops", "--", "true"])
    assert out.exit_code == 2 and "not JSON" in out.output
    out = runner.invoke(job_group, ["submit", "--", "python", "missing_script.py"])
    assert out.exit_code == 1 and "failed: Job entrypoint command failed with exit code 2" \
        in out.output


# ------------------------------------------------------------ the docs


def test_readme_jobs_example_runs(cluster, tmp_path):
    """The job example of docs/jobs.md, as written, but for the address of this
    test's cluster; the token comes from the session files alone."""
    import readme_examples

    block = readme_examples.block("JobSubmissionClient(", page="jobs.md")
    assert "http://127.0.0.1:8265" in block
    env = {key: value for key, value in os.environ.items()
           if key not in ("TRAY_CLUSTER_TOKEN", "TRAY_ADDRESS", "TRAY_API_SERVER_ADDRESS")}
    env["TRAY_SESSION_ROOT"] = str(cluster["root"])
    result = readme_examples.run(block.replace("http://127.0.0.1:8265", cluster["url"]),
                                 tmp_path, env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout == "HELLO FROM THE WORKING_DIR blue\n"


def test_stop_during_setup_cancels_pip(client):
    """A job stopped while pip still installs its requirements is STOPPED,
    and pip is gone: its index here takes connections and never answers."""
    import socket

    with socket.socket() as index:
        index.bind(("127.0.0.1", 0))
        index.listen(16)
        url = f"http://127.0.0.1:{index.getsockname()[1]}/simple"
        submission_id = client.submit_job(
            entrypoint="true",
            runtime_env={"pip": {"packages": ["tray-slow-requirement-xyz"],
                                 "pip_install_options": ["--isolated", "--index-url", url,
                                                         "--timeout", "120",
                                                         "--retries", "0"]}})

        def pip_processes():
            found = []
            for process in psutil.process_iter(["cmdline"]):
                if "tray-slow-requirement-xyz" in " ".join(process.info["cmdline"] or []):
                    found.append(process)
            return found

        wait_for(pip_processes, "pip to start", timeout_s=WAIT_S)
        assert client.get_job_status(submission_id) is JobStatus.PENDING
        assert client.stop_job(submission_id) is True
        info = _wait_terminal(client, submission_id, 30)
        assert info.status is JobStatus.STOPPED, info
        wait_for(lambda: not pip_processes(), "pip to be killed", timeout_s=15)


# ------------------------------------------------------------ without a cluster process


def test_the_gcs_job_table_on_both_backends(backend):
    """The GCS's job_submissions table (what the job manager, the state API
    and the dashboard share): ids are created once, records replaced, listed
    by id and deleted, the same on both backends."""
    import tray
    from tray.api import blocking, session

    tray.init(backend=backend, num_cpus=1, **({"seed": 0} if backend == "sim" else {}))
    worker = session.ensure_worker()

    def call(method, *args):
        return blocking.block(worker, worker.gcs_call, method, *args)

    first = JobInfo(submission_id="b", status=JobStatus.PENDING, entrypoint="true")
    assert call("job_submission_put", "b", first.to_record(), True) is True
    assert call("job_submission_put", "b", first.to_record(), True) is False  # taken
    done = JobInfo(submission_id="b", status=JobStatus.SUCCEEDED, entrypoint="true")
    assert call("job_submission_put", "b", done.to_record(), False) is True
    assert call("job_submission_put", "a", first.to_record(), True) is True
    assert [key for key, _ in call("job_submission_list")] == ["a", "b"]
    assert JobInfo.from_record(call("job_submission_get", "b")).status is JobStatus.SUCCEEDED
    assert call("job_submission_delete", "b") is True
    assert call("job_submission_delete", "b") is False
    assert call("job_submission_get", "b") is None


def test_the_job_table_is_bounded(monkeypatch, tmp_path):
    """A submission beyond JOBS_MAX fails, saying what to do, and starts
    nothing."""
    from tray.job_submission import _manager

    calls = []

    def fake_gcs_call(gcs, token, method, *args):
        calls.append(method)
        if method == "job_submission_list":
            return [(f"job-{i}", b"{}") for i in range(3)]
        raise AssertionError(f"unexpected GCS call {method}")

    monkeypatch.setattr(_manager, "gcs_call", fake_gcs_call)
    monkeypatch.setattr(_manager, "JOBS_MAX", 3)
    manager = _manager.JobManager("tcp:127.0.0.1:1", b"token", str(tmp_path))
    with pytest.raises(JobSubmissionError, match="at most 3 jobs; delete finished ones"):
        manager.submit(entrypoint="true")
    assert calls == ["job_submission_list"]


def test_tail_job_logs_under_asyncio(client):
    """Ray's users iterate tail_job_logs under asyncio: it works there too."""
    import asyncio

    submission_id = client.submit_job(entrypoint="echo one; echo two")
    _wait_terminal(client, submission_id)

    async def collect():
        return [text async for text in client.tail_job_logs(submission_id)]

    assert "".join(asyncio.run(collect())) == "one\ntwo\n"


def test_the_local_token_never_goes_to_another_host(monkeypatch, tmp_path):
    """The token kept for the cluster started here is used for a job API on
    this machine only; for another host the client asks for a token."""
    from tray.job_submission import sdk

    monkeypatch.delenv("TRAY_CLUSTER_TOKEN", raising=False)
    monkeypatch.setattr("tray.backends.local.session.read_current_cluster",
                        lambda: {"address": "127.0.0.1:1", "token": "local-secret",
                                 "session_dir": str(tmp_path)})
    assert sdk._find_token("http://127.0.0.1:8265") == "local-secret"
    assert sdk._find_token("http://localhost:8265") == "local-secret"
    # (Something answers there: no probe leaves this machine in a test.)
    monkeypatch.setattr("tray.backends.local.session.nothing_listens_at",
                        lambda host, port, timeout_s=1.0: False)
    with pytest.raises(Exception, match="no token for the job API at http://10.1.2.3:8265"):
        JobSubmissionClient("http://10.1.2.3:8265")
    assert JobSubmissionClient("http://10.1.2.3:8265", token="given")._headers[
        "Authorization"] == "Bearer given"


def test_cli_finds_the_job_api_and_token_of_the_head_started_here(cluster):
    """No --address, no token: on the head's machine, ``tray job`` finds the
    dashboard's URL and the token in the session files."""
    if not os.path.exists(os.path.join(cluster["session_dir"], "dashboard.json")):
        pytest.skip("this head serves no dashboard (the job API runs alone)")
    env = {key: value for key, value in os.environ.items()
           if key not in ("TRAY_CLUSTER_TOKEN", "TRAY_ADDRESS", "TRAY_API_SERVER_ADDRESS")}
    env["TRAY_SESSION_ROOT"] = str(cluster["root"])
    result = subprocess.run([sys.executable, "-m", "tray.scripts.cli", "job", "submit", "--",
                             "echo", "found by itself"],
                            env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "found by itself" in result.stdout and "succeeded" in result.stdout


def test_init_without_an_address_joins_the_cluster_tray_address_names(cluster, tmp_path):
    # As Ray's drivers join RAY_ADDRESS; an http URL there is the job API's
    # (tray job), which init() leaves alone.
    script = tmp_path / "joins.py"
    script.write_text("import tray\nctx = tray.init()\nprint('GCS', ctx['gcs_address'])\n"
                      "tray.shutdown()\n")
    address = cluster["gcs"].removeprefix("tcp:")
    env = {**os.environ, "TRAY_ADDRESS": address, "TRAY_CLUSTER_TOKEN": cluster["token"],
           "TRAY_SESSION_ROOT": str(cluster["root"])}
    env.pop("TRAY_JOB_SUBMISSION_ID", None)
    env.pop("TRAY_JOB_RUNTIME_ENV", None)
    done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"GCS {address}" in done.stdout or f"GCS tcp:{address}" in done.stdout, done.stdout

    from tray.api import session

    for value, expected in ((address, address), ("http://127.0.0.1:8265", None), ("", None)):
        os.environ["TRAY_ADDRESS"] = value
        try:
            assert session._address_from_environment() == expected
        finally:
            del os.environ["TRAY_ADDRESS"]


def test_nothing_listening_is_said_before_a_missing_token(monkeypatch):
    """With no cluster at the address and no token anywhere, the error says
    that nothing answers there, not that a token is missing."""
    import tray
    from tray.backends.local.session import free_port

    monkeypatch.delenv("TRAY_CLUSTER_TOKEN", raising=False)
    monkeypatch.setattr("tray.backends.local.session.read_current_cluster", lambda: None)
    monkeypatch.setattr("tray.backends.local.read_current_cluster", lambda: None)
    port = free_port()
    with pytest.raises(Exception, match=f"nothing answers at http://127.0.0.1:{port}"):
        JobSubmissionClient(f"http://127.0.0.1:{port}")
    with pytest.raises(Exception, match=f"nothing answers at 127.0.0.1:{port}"):
        tray.init(address=f"127.0.0.1:{port}")
    assert not tray.is_initialized()
