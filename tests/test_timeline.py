"""tray.timeline() and ``tray simtest replay --timeline``: Chrome traces."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

import tray


@tray.remote
def work(x):
    return x * 2


@tray.remote
def fails():
    raise RuntimeError("the failing task")


@tray.remote
class Adder:
    def add(self, x):
        return x + 1


def test_timeline_tracks_per_worker_per_node(one_node, tmp_path):
    tray.get([work.remote(i) for i in range(3)])
    adder = Adder.remote()
    tray.get(adder.add.remote(1))
    with pytest.raises(RuntimeError):
        tray.get(fails.remote())
    for _ in range(40):  # executors flush their events every second
        events = tray.timeline()
        if sum(e.get("cat") in ("task", "actor_task") for e in events) >= 5:
            break
        time.sleep(0.5)
    spans = [e for e in events if e["ph"] == "X" and e["cat"] in ("task", "actor_task")]
    assert sorted(e["name"] for e in spans) == ["Adder.add", "fails", "work", "work", "work"]
    assert all(e["pid"].startswith("Node ") and e["tid"].startswith("Worker ") for e in spans)
    assert all(e["dur"] >= 0 and e["ts"] > 0 for e in spans)
    failed = [e for e in spans if e["name"] == "fails"][0]
    assert failed["cname"] == "terrible" and "the failing task" in failed["args"]["error_message"]
    names = {e["args"]["name"] for e in events if e["ph"] == "M"}
    assert any(name.startswith("Worker ") for name in names)
    assert any(e.get("cat") == "task_span" and e["name"] == "task:execute" for e in events)
    path = tmp_path / "timeline.json"
    assert tray.timeline(str(path)) is None
    assert json.loads(path.read_text())  # JSON that Perfetto loads: a list of events


def _replay(tmp_path, name: str, *extra: str) -> list:
    path = tmp_path / name
    result = subprocess.run([sys.executable, "-m", "tray.simtest", "replay", "--seed", "3",
                             "--workload", "mixed", "--faults", "chaos", "--timeline",
                             str(path), *extra], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "timeline written to" in result.stdout
    return path.read_bytes()


def test_simtest_replay_timeline_has_faults_and_replays(tmp_path):
    first = _replay(tmp_path, "a.json")
    assert _replay(tmp_path, "b.json") == first  # the same seed, byte for byte
    events = json.loads(first)
    faults = [e for e in events if e.get("cat") == "fault"]
    assert faults and all(e["ph"] == "i" and e["s"] == "g" for e in faults)
    assert any(e["name"] == "FAULT kill_worker" for e in faults)
    tasks = [e for e in events if e.get("cat") == "task"]
    assert tasks and all(e["pid"].startswith("Node ") for e in tasks)
    assert any(e.get("cat") == "object_transfer" for e in events)


def test_failing_invariant_is_marked():
    from tray._timeline import events_from_sim_trace

    trace = [{"t": 0.0, "component": "n0ab", "event": "worker_start", "worker": "f" * 32},
             {"t": 0.1, "component": "worker:ffffffff", "event": "task_started",
              "task": "aa", "name": "f", "attempt": 0},
             {"t": 0.2, "component": "fault", "event": "kill_node", "node": "n0ab"}]
    events = events_from_sim_trace(trace, invariant="no-hang", message="it hung", seed=9)
    marked = [e for e in events if e.get("cat") == "invariant"]
    assert marked[0]["name"] == "INVARIANT BROKEN: no-hang"
    assert marked[0]["args"]["message"] == "it hung" and marked[0]["ts"] == 200_000
    [unfinished] = [e for e in events if e.get("cat") == "task"]
    assert unfinished["args"]["unfinished"] and unfinished["pid"] == "Node n0ab"
