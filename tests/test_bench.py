"""Smoke test of the benchmark harness (bench/run.py): tray alone, two tiny
metrics, one quick round. It checks that the JSON and the table come out, not
how fast anything is (speed is measured, not asserted)."""

import json
import os
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
