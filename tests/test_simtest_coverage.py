"""``tray simtest run --coverage``: the sweep's coverage of tray, per file and
component, with the goals; the same from ``--jobs`` processes; runs that
append to one data file report their union; and measuring changes no
seed's digest. (Small sweeps: dag without faults, 2 seeds, a few seconds
each under coverage.)"""

from __future__ import annotations

import json
import re

import pytest

from tray.scripts import cli
from tray.simtest import cli as simtest_cli
from tray.simtest import coverage as simtest_coverage
from tray.simtest import runner


def _hit_lines(data_file: str, prefix: str) -> dict:
    """{file: executed lines} of the files under ``prefix``, from coverage.py."""
    import coverage

    measured = coverage.Coverage(data_file=data_file, config_file=False)
    measured.load()
    data = measured.get_data()
    found = {}
    for name in data.measured_files():
        path = simtest_coverage._relative(name)
        if path.startswith(prefix):
            found[path] = set(data.lines(name) or ())
    return found


def test_a_sweep_with_coverage_prints_the_table_and_appends_to_its_data(tmp_path, capsys):
    data_file = str(tmp_path / "sweeps.coverage")
    code = cli.main(["simtest", "run", "--seeds", "0:2", "--workload", "dag", "--faults",
                     "none", "--determinism-every", "0", "--coverage", "--coverage-data",
                     data_file, "--coverage-missing"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "simtest: 2 seeds (workload dag, faults none), 0 failed" in out
    # The core's files, then each control loop, with totals and the goals.
    core = out.index("\ntray/core\n")
    assert core < out.index("\nTune controller\n") < out.index("\nServe controller\n") \
        < out.index("\nData executor\n") < out.index("\nTrain worker group\n") \
        < out.index("\nAutoscaler policy\n") < out.index("the rest of tray")
    row = re.search(r"\n  node/lease_manager\.py +(\d+)/(\d+) +([\d.]+)% +(\d+)/(\d+) +"
                    r"([\d.]+)% +([\d.]+)%", out)
    assert row, out[:3000]
    hit, lines = int(row.group(1)), int(row.group(2))
    assert 0.3 * lines < hit < lines  # a dag sweep grants leases, and never drains a node
    total = re.search(r"\n  total +(\d+)/(\d+) +([\d.]+)% +(\d+)/(\d+) +([\d.]+)% +[\d.]+%  "
                      r"goal lines >= 90%, branches >= 80%: (met|NOT MET)", out)
    assert total, out[:3000]
    assert 40.0 < float(total.group(3)) < 90.0 and total.group(7) == "NOT MET"
    # Both numbers for the core: all of it, and without the real backend's own files.
    simulated = re.search(r"\n  total without thread_inbox, thread_waits +(\d+)/(\d+) ", out)
    assert int(simulated.group(2)) < int(total.group(2))
    assert int(total.group(1)) - int(simulated.group(1)) < \
        int(total.group(2)) - int(simulated.group(2))  # (the sim runs little of them)
    # A control loop no seed ran shows at most the lines its import runs
    # (none, unless an earlier test in this process imported it).
    monitor = re.search(r"\nAutoscaler policy\n  tray/autoscaler/monitor\.py +(\d+)/(\d+) ", out)
    assert monitor and int(monitor.group(1)) < 0.3 * int(monitor.group(2)), out[:3000]
    assert "goals met: 0 of 6" in out
    # --coverage-missing: what the files under their goal missed, by function.
    assert re.search(r"\ntray/core/node/lease_manager\.py: \d+ lines, \d+ branches missed\n"
                     r"    never run: [^\n]*LeaseManager\.handle_drain", out)

    # The file holds that run; a second run (another workload) adds to it,
    # and `tray simtest coverage FILE` reports the union.
    host = re.search(r"\n  worker/actor_host\.py +(\d+)/", out)
    session = simtest_coverage.Session(data_file)
    try:
        simtest_cli.sweep(range(1), "actors", "none", determinism_every=0, coverage=session)
        session.finish()
    finally:
        session.close()
    code = cli.main(["simtest", "coverage", data_file, "--json"])
    union = json.loads(capsys.readouterr().out)
    assert code == 0 and union["goals"] == 6
    assert union["files"]["tray/core/node/lease_manager.py"]["lines_hit"] >= hit
    assert union["files"]["tray/core/worker/actor_host.py"]["lines_hit"] > int(host.group(1))
    assert simtest_coverage.report(data_file, rest=False)["files"].keys() == {
        path for path in union["files"] if path.startswith("tray/core/")
        or simtest_coverage._group_of(path) in dict(simtest_coverage.CONTROL_LOOPS)}


def test_jobs_processes_are_measured_and_combined(tmp_path, monkeypatch):
    # One seed per unit of work: both processes run one.
    monkeypatch.setattr(simtest_cli, "JOB_CHUNK_SEEDS", 1)
    fanned_file = str(tmp_path / "fanned")
    session = simtest_coverage.Session(fanned_file)
    try:
        fanned = simtest_cli.sweep(range(2), "dag", "none", determinism_every=0, jobs=2,
                                   coverage=session)
        session.finish()
    finally:
        session.close()
    alone_file = str(tmp_path / "alone")
    session = simtest_coverage.Session(alone_file)
    try:
        alone = simtest_cli.sweep(range(2), "dag", "none", determinism_every=0,
                                  coverage=session)
        session.finish()
    finally:
        session.close()
    assert fanned["digests"] == alone["digests"] and fanned["failures"] == []
    # What the seeds ran in the core, measured in the --jobs processes,
    # is what they ran measured here (import-time lines come from the
    # import pass in both).
    fanned_lines = _hit_lines(fanned_file, "tray/core/")
    alone_lines = _hit_lines(alone_file, "tray/core/")
    submitter = "tray/core/worker/normal_task_submitter.py"
    assert len(alone_lines[submitter]) > 150
    both = sum(len(alone_lines[p] & fanned_lines.get(p, set())) for p in alone_lines)
    assert both >= 0.97 * sum(len(lines) for lines in alone_lines.values())
    assert sum(len(lines) for lines in fanned_lines.values()) >= \
        0.97 * sum(len(lines) for lines in alone_lines.values())


def test_coverage_leaves_the_digest_as_it_was(tmp_path):
    plain = runner.run_seed(3, "mixed", "default")
    session = simtest_coverage.Session(str(tmp_path / "one-seed"))
    try:
        measured = simtest_cli.sweep([3], "mixed", "default", determinism_every=0,
                                     coverage=session)
    finally:
        session.close()
    assert plain.ok, plain.report()
    assert measured["digests"] == {"3": plain.digest}


def test_workload_lists_and_all():
    parse = simtest_cli._workload_list
    assert parse("dag, actors,dag") == ["dag", "actors"]
    assert parse("all") == sorted(simtest_cli.workloads.WORKLOADS)
    with pytest.raises(Exception, match="unknown workload nope"):
        parse("dag,nope")
