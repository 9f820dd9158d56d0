"""``tray list|summary|get|memory|logs|timeline`` against a live local
cluster, from outside it (the commands never join it), and the CLI's
answers to bad input."""

from __future__ import annotations

import json
import os

import pytest
from click.testing import CliRunner
from polling import wait_for  # (tests/ is on sys.path)

import tray
from tray.scripts import cli


def _run(*args, check=True):
    result = CliRunner().invoke(cli.cli, list(args), catch_exceptions=False)
    if check:
        assert result.exit_code == 0, result.output
    return result


@pytest.fixture
def cluster_address(monkeypatch):
    context = tray.init(num_cpus=2, include_dashboard=False)
    with open(os.path.join(context["session_dir"], "token")) as file:
        monkeypatch.setenv("TRAY_CLUSTER_TOKEN", file.read().strip())
    yield context["gcs_address"], context
    tray.shutdown()


def test_state_commands_on_a_live_cluster(cluster_address, tmp_path):
    address, context = cluster_address

    @tray.remote
    def add(a, b):
        return a + b

    @tray.remote(max_retries=0)
    def fail():
        raise KeyError("cli must show this")

    @tray.remote
    class Keeper:
        def hold(self):
            print("keeper says hi")
            return tray.get_runtime_context().get_worker_id()

    assert tray.get([add.remote(i, i) for i in range(4)]) == [0, 2, 4, 6]
    with pytest.raises(KeyError):
        tray.get(fail.remote())
    keeper = Keeper.options(name="keeper").remote()
    keeper_worker = tray.get(keeper.hold.remote())
    held = tray.put(b"y" * 100_000)

    def tasks_in():
        rows = json.loads(_run("list", "tasks", "--format", "json", "--address", address,
                               "--limit", "1000").output)
        return rows if sum(1 for r in rows if r["func_or_class_name"].endswith("add")
                           and r["state"] == "FINISHED") == 4 and \
            any(r["state"] == "FAILED" and r["error_type"] for r in rows) else None
    rows = wait_for(tasks_in, "the task events")
    failed = [r for r in rows if r["state"] == "FAILED"]
    assert len(failed) == 1 and failed[0]["func_or_class_name"].endswith("fail")

    # --filter, both predicates; the table format has a header and one line a row.
    only_failed = json.loads(_run("list", "tasks", "--filter", "state=FAILED", "--format",
                                  "json", "--address", address).output)
    assert [r["task_id"] for r in only_failed] == [failed[0]["task_id"]]
    not_finished = json.loads(_run("list", "tasks", "--filter", "state!=FINISHED",
                                   "--format", "json", "--address", address).output)
    assert all(r["state"] != "FINISHED" for r in not_finished) and not_finished
    table = _run("list", "actors", "--address", address).output.splitlines()
    assert table[0].split()[:3] == ["ACTOR_ID", "CLASS_NAME", "STATE"]
    assert any("Keeper" in line and "ALIVE" in line for line in table[1:])

    nodes = json.loads(_run("list", "nodes", "--format", "json", "--address", address).output)
    assert [n["node_id"] for n in nodes] == [context["node_id"]]
    workers = json.loads(_run("list", "workers", "--format", "json", "--address",
                              address).output)
    assert any(w["worker_id"] == keeper_worker for w in workers)

    summary = _run("summary", "tasks", "--address", address).output
    add_line = next(line for line in summary.splitlines() if line.split()[0].endswith("add"))
    assert "4" in add_line.split()
    actors = json.loads(_run("summary", "actors", "--format", "json", "--address",
                             address).output)
    assert actors["cluster"]["summary"]["Keeper"]["state_counts"] == {"ALIVE": 1}

    def failure_told():  # the owner's events say FAILED; the executor's carry the traceback
        got = json.loads(_run("get", "task", failed[0]["task_id"], "--address",
                              address).output)
        return got if got["error_message"] else None
    got = wait_for(failure_told, "the failed task's error message")
    assert got["error_type"] and "cli must show this" in got["error_message"]
    listed = json.loads(_run("list", "actors", "--filter", "name=keeper", "--format", "json",
                             "--address", address).output)
    keeper_id = listed[0]["actor_id"]
    got = json.loads(_run("get", "actor", keeper_id, "--address", address).output)
    assert got["state"] == "ALIVE" and got["name"] == "keeper"
    missing = _run("get", "actor", "ab" * 16, "--address", address, check=False)
    assert missing.exit_code == 1 and "no actor with id" in missing.output

    memory = _run("memory", "--address", address).output
    assert "Object store per node" in memory and held.hex() in memory
    owner_block = memory[memory.index(held.hex()) - 2000:memory.index(held.hex())]
    assert "--- owner " in owner_block  # grouped by owner (the driver owns the put)
    by_process = _run("memory", "--group-by", "process", "--address", address).output
    assert "DRIVER pid" in by_process and held.hex() in by_process

    listing = _run("logs", "--address", address).output
    assert f"logs/worker-{keeper_worker[:12]}.out" in listing
    log = _run("logs", "--actor-id", keeper_id, "--address", address).output
    assert "keeper says hi" in log
    followed = _run("logs", "--worker-id", keeper_worker, "--follow", "--follow-max-s", "0.3",
                    "--address", address).output
    assert "keeper says hi" in followed

    out = tmp_path / "trace.json"
    said = _run("timeline", "-o", str(out), "--address", address).output
    events = json.loads(out.read_text())
    assert f"Wrote {len(events)} trace events" in said
    assert sum(1 for e in events if e.get("ph") == "X" and e["name"].endswith("add")
               and e["cat"] == "task") == 4


def test_bad_input_is_named(cluster_address):
    address, _ = cluster_address
    bad = _run("list", "tasks", "--filter", "state", "--address", address, check=False)
    assert bad.exit_code == 2 and "KEY=VALUE" in bad.output
    unknown = _run("list", "tasks", "--filter", "colour=red", "--address", address,
                   check=False)
    assert unknown.exit_code == 1 and "colour" in unknown.output
    assert _run("list", "bananas", check=False).exit_code == 2
    no_file = _run("logs", "nope.out", "--address", address, check=False)
    assert no_file.exit_code == 1 and "no log file 'nope.out'" in no_file.output


def test_no_cluster_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("TRAY_CLUSTER_TOKEN", "0" * 64)
    result = _run("list", "actors", "--address", "127.0.0.1:1", check=False)
    assert result.exit_code == 1 and "no tray cluster answers" in result.output
