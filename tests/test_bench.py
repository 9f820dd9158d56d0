"""Smoke test of the benchmark harness (bench/run.py): tray alone, two tiny
metrics, one quick round. It checks that the JSON and the table come out, not
how fast anything is (speed is measured, not asserted)."""

import json
import os
import socket
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_bench_harness_writes_json_and_table(tmp_path):
    path = tmp_path / "results.json"
    done = subprocess.run(
        [sys.executable, os.path.join(ROOT, "bench", "run.py"), "--quick", "--no-chart",
         "--only", "single client tasks sync,placement group", "--json", str(path)],
        capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    record = json.loads(path.read_text())
    assert record["runtimes"] == ["tray"]
    assert len(record["loadavg_before"]) == 3
    rows = {row["name"]: row["results"]["tray"] for row in record["rows"]}
    assert rows["single client tasks sync"]["median"] > 0
    assert rows["placement group create/removal"]["median"] > 0
    assert "| single client tasks sync | tasks/s |" in done.stdout



def test_floors_measure_the_rpc_layer_and_a_bare_round_trip(tmp_path):
    # bench/floors.py backs the logs' "why not" for the goals not met;
    # this keeps it running (its figures are read there, not asserted here).
    done = subprocess.run(
        [sys.executable, os.path.join(ROOT, "bench", "floors.py"), "--only", "latency,rpc",
         "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    [path] = tmp_path.glob("floors-*.json")
    record = json.loads(path.read_text())
    assert set(record["latency"]) == {"one thread", "handed to a second thread"}
    assert all(len(row["p99_over_p50_by_round"]) == 6 for row in record["latency"].values())
    assert record["rpc"]["sync"]["calls_per_s"] > 0 and record["rpc"]["async"]["calls_per_s"] > 0
    assert "rpc      sync" in done.stdout


def test_floors_split_a_workload_s_cpu_by_process(tmp_path):
    # The "cpu" floor: CPU per operation in the driver, the node and the
    # workers. A task runs in a worker and is submitted by the driver, so
    # both spend CPU on it.
    done = subprocess.run(
        [sys.executable, os.path.join(ROOT, "bench", "floors.py"), "--only", "cpu",
         "--cpu-workloads", "tasks async", "--cpu-rounds", "1", "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    [path] = tmp_path.glob("floors-*.json")
    row = json.loads(path.read_text())["cpu"]["tasks async"]
    assert row["ops_per_s"] > 0
    assert row["driver_us"] > 0 and row["workers_us"] > 0
    assert row["total_us"] >= row["driver_us"] + row["workers_us"]
    assert "cpu      tasks async" in done.stdout


def test_floors_name_the_workloads_when_asked_for_an_unknown_one(tmp_path):
    done = subprocess.run(
        [sys.executable, os.path.join(ROOT, "bench", "floors.py"), "--only", "cpu",
         "--cpu-workloads", "tasks async,no such workload", "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "unknown workloads ['no such workload']" in done.stderr
    assert "'tasks async'" in done.stderr  # (the list of those there are)
    assert not list(tmp_path.glob("floors-*.json"))

# ------------------------------------------------------------ the summary
# bench/summary.py makes the goals table of bench/README.md and
# docs/benchmarks.md from the newest run in bench/results/, and the list of
# the measurement logs there.


def _summary_module():
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "bench_summary", os.path.join(ROOT, "bench", "summary.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # (its dataclass looks its module up there)
    spec.loader.exec_module(module)
    return module


def test_the_bench_summaries_are_generated_from_the_newest_run():
    done = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "summary.py"), "--check"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_summary_judges_each_goal_on_the_run_s_medians():
    summary = _summary_module()

    def row(name, unit, tray, ray=None, higher_is_better=True):
        results = {"tray": {"median": tray}}
        if ray is not None:
            results["ray"] = {"median": ray}
        return {"name": name, "unit": unit, "higher_is_better": higher_is_better,
                "results": results}

    record = {"date": "2026-01-01T00:00:00+00:00", "versions": {"tray": "0"}, "rounds": 1,
              "rows": [row("single client tasks sync", "tasks/s", 3000, 1000),
                       row("nested fan-out (tasks submitting tasks)", "tasks/s", 1840, 614),
                       row("init to first result", "s", 0.31, higher_is_better=False),
                       row("task round trip latency, p50", "ms", 0.5, higher_is_better=False),
                       row("task round trip latency, p99", "ms", 1.0, higher_is_better=False)]}
    goals = {goal.row: goal for goal in summary.GOALS}
    assert summary.evaluate(goals["single client tasks sync"], record) == \
        ("3.00x (3,000 against 1,000)", "yes")
    # 2.997x is not 3x, and must not read as 3.00.
    assert summary.evaluate(goals["nested fan-out (tasks submitting tasks)"], record) == \
        ("2.997x (1,840 against 614)", "no")
    assert summary.evaluate(goals["init to first result"], record) == ("0.31 s", "no")
    assert summary.evaluate(goals["task round trip latency, p99"], record) == \
        ("2.00x (1 / 0.5 ms)", "yes")
    assert summary.evaluate(goals["single client tasks async"], record)[1] == "not measured"
    table = summary.summary(record, "x.json")
    assert "| single client tasks sync | ≥ 3x Ray | 3.00x (3,000 against 1,000) | yes |" in table
    assert table.endswith(f"2 of {len(summary.GOALS)} goals met.")


def test_every_measurement_log_has_a_title():
    for name in os.listdir(os.path.join(ROOT, "bench", "results")):
        if name.endswith(".md"):
            with open(os.path.join(ROOT, "bench", "results", name)) as file:
                assert file.readline().startswith("# "), name

# ------------------------------------------------------------ loopback only
# Every load test, bench and peer run sends traffic to 127.0.0.1 only (issue
# 14): Ray binds and connects to the machine's network address unless told
# otherwise. While a small metric runs, every process of the run (the bench's
# driver and all its descendants: tray's GCS, node managers and workers, or
# Ray's GCS, raylet and workers) is sampled with psutil; none may hold an
# inet socket whose local or remote address is not loopback.

LOOPBACK_SAMPLE_PERIOD_S = 0.05
LOOPBACK_RUN_TIMEOUT_S = 240


def _is_loopback(address) -> bool:
    import ipaddress

    if not address:
        return True  # not connected (a listening or unbound socket has no peer)
    host = address.ip if hasattr(address, "ip") else address[0]
    ip = ipaddress.ip_address(host.split("%")[0])
    if ip.version == 6 and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_loopback


def _sample_sockets(root_pid: int, seen: dict, offending: list, strict: bool) -> None:
    """One look at every process of the run: names of those with sockets
    in ``seen``, non-loopback sockets in ``offending``. With ``strict``, a
    listener on every interface (0.0.0.0 or ::) is one too: tray binds
    127.0.0.1 only; Ray keeps a few such listeners that carry no traffic
    when started on loopback, so for Ray only connections count."""
    import psutil

    try:
        root = psutil.Process(root_pid)
        processes = [root, *root.children(recursive=True)]
    except psutil.Error:
        return
    for process in processes:
        try:
            name = " ".join(process.cmdline()[:2])[-80:] or process.name()
            # Every socket counts as seen (a local tray cluster talks over
            # Unix sockets: with no dashboard it may hold no inet socket at
            # all); only inet ones can be off loopback.
            connections = process.net_connections(kind="all")
        except psutil.Error:
            continue
        for connection in connections:
            seen[name] = seen.get(name, 0) + 1
            if connection.family == socket.AF_UNIX:
                continue
            laddr_ok = _is_loopback(connection.laddr)
            # 0.0.0.0 / :: listeners accept on every interface: not loopback-only.
            unspecified = connection.laddr and connection.laddr.ip in ("0.0.0.0", "::")
            if not laddr_ok and (strict or not unspecified) or \
                    not _is_loopback(connection.raddr):
                offending.append((name, connection.status, connection.laddr,
                                  connection.raddr))


def _run_watching_sockets(command: list, env: dict, strict: bool = True
                          ) -> tuple[object, dict, list]:
    import time

    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True, env=env, cwd=ROOT)
    seen: dict = {}
    offending: list = []
    deadline = time.monotonic() + LOOPBACK_RUN_TIMEOUT_S
    try:
        while process.poll() is None and time.monotonic() < deadline:
            _sample_sockets(process.pid, seen, offending, strict)
            time.sleep(LOOPBACK_SAMPLE_PERIOD_S)
    finally:
        if process.poll() is None:
            process.kill()
        output = process.communicate(timeout=30)[0]
    return process.returncode, {"output": output, "seen": seen}, offending


def _interpreter_with_ray() -> str | None:
    """This interpreter if it has Ray, else the bench's nox environment's
    (``.nox/bench``, where Ray 2.60 is installed) if it exists."""
    import importlib.util

    if importlib.util.find_spec("ray") is not None:
        return sys.executable
    candidate = os.path.join(ROOT, ".nox", "bench", "bin", "python")
    if os.path.exists(candidate):
        found = subprocess.run([candidate, "-c", "import ray, psutil"], capture_output=True,
                               timeout=120)
        if found.returncode == 0:
            return candidate
    return None


def test_the_loopback_check_sees_a_listener_on_every_interface():
    """The check can fail: a child listening on 0.0.0.0 (no traffic sent)."""
    import pytest

    pytest.importorskip("psutil")
    listener = ("import socket, time; s = socket.socket(); s.bind(('0.0.0.0', 0)); "
                "s.listen(); time.sleep(1.5)")
    code, run, offending = _run_watching_sockets(
        [sys.executable, "-c", f"import subprocess, sys; subprocess.run([sys.executable, "
                               f"'-c', {listener!r}])"], dict(os.environ))
    assert code == 0, run["output"]
    assert offending and offending[0][2].ip == "0.0.0.0", (offending, run["seen"])


def test_tray_processes_use_loopback_only(tmp_path):
    import pytest

    pytest.importorskip("psutil")
    # Not --quick: a quick round keeps the cluster up for ~0.3 s, which a
    # loaded CI machine's sampler once missed altogether (nothing seen).
    # A full round keeps it up for ~2 s, some 30 samples.
    code, run, offending = _run_watching_sockets(
        [sys.executable, os.path.join(ROOT, "bench", "run.py"), "--no-chart",
         "--rounds", "1", "--only", "single client tasks sync",
         "--json", str(tmp_path / "results.json")],
        dict(os.environ, PYTHONPATH=ROOT))
    assert code == 0, run["output"][-3000:]
    assert run["seen"], "no process of the run was seen holding a socket: the check saw nothing"
    assert not offending, f"tray sockets off loopback: {offending[:10]}"


def test_ray_peer_uses_loopback_only(tmp_path):
    import pytest

    pytest.importorskip("psutil")
    python = _interpreter_with_ray()
    if python is None:
        pytest.skip("Ray is not installed here nor in .nox/bench (nox -s bench creates it)")
    code, run, offending = _run_watching_sockets(
        [python, os.path.join(ROOT, "bench", "run.py"), "--quick", "--no-chart",
         "--rounds", "1", "--peers", "ray", "--only", "single client tasks sync",
         "--json", str(tmp_path / "results.json")],
        dict(os.environ, PYTHONPATH=ROOT, RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0"), strict=False)
    # Checked first: sockets seen off loopback fail the test even when the
    # run itself failed.
    assert not offending, f"Ray sockets off loopback: {offending[:10]}"
    if code != 0 and "timed out during startup" in run["output"]:
        pytest.skip("Ray did not start in time on this machine (overloaded?)")
    assert code == 0, run["output"][-3000:]
    assert any("raylet" in name or "gcs_server" in name for name in run["seen"]), \
        f"Ray's raylet/GCS were never seen with sockets: {sorted(run['seen'])}"
