"""``tray.simtest.story``: what happened to one task or object in a simulated
run, from its trace (dask's ``story(key)``), and the story a failing seed's
report tells of the task or object its broken invariant names."""

from __future__ import annotations

import json
import time

import pytest
from planting import plant_spurious_retries  # (tests/ is on sys.path)

import tray
import tray.simtest
from tray.simtest import cli, runner, stories, workloads
from tray.simtest.remote_code import leaf

# The task below records the workers that ran it (the simulated workers
# live in this process) through a plain function, which cloudpickle pickles
# by reference (the remote function itself goes by value, with copies of
# its globals).
STARTED_ON: list = []


def _started_on(worker_id: str) -> None:
    STARTED_ON.append(worker_id)


@tray.remote(max_retries=1)
def _slow(x: int) -> int:
    _started_on(tray.get_runtime_context().get_worker_id())
    time.sleep(1.0)  # virtual time
    return x + 1


def _names(events: list) -> list[str]:
    return [event["event"] for event in events]


def test_a_task_s_story_tells_its_runs_the_crash_between_them_and_its_retry():
    STARTED_ON.clear()
    tray.init(backend="sim", seed=7, num_nodes=1, num_cpus=2)
    try:
        ref = _slow.remote(41)
        tray.wait([ref], timeout=0.5)  # (its first run is under way)
        assert len(STARTED_ON) == 1
        tray.simtest.cluster().kill_worker(STARTED_ON[0])
        assert tray.get(ref) == 42
        del ref  # its result is freed
        tray.wait([_slow.remote(0)], timeout=5.0)  # (time for the free to happen)
        task = None
        for event in tray.simtest.cluster().trace.events:
            if event["event"] == "task_submitted" and event.get("name") == "_slow":
                task = event["task"]
                break
        told = tray.simtest.story(task[:10])
        digest = tray.simtest.trace_digest()
    finally:
        tray.shutdown()
    assert _names(told) == [
        "task_submitted",  # by the driver
        "task_started",  # attempt 0
        "kill_worker", "process_kill", "worker_died",  # what befell its worker meanwhile
        "task_retry",
        "task_started",  # attempt 1, on another worker
        "task_done", "task_finished",
        "object_freed",  # its result, once the driver dropped the ref
    ], stories.format_story(told)
    times = [event["t"] for event in told]
    assert times == sorted(times)
    assert [event.get("attempt") for event in told if event["event"] == "task_started"] == [0, 1]
    assert told[2]["worker"] == STARTED_ON[0]
    assert told[-1]["object"].startswith(task)
    # The same story by the whole id, from the last run, and by its result's id
    # (an object's story holds its task's); reading it left the digest alone.
    assert tray.simtest.story(task) == told
    assert tray.simtest.story(told[-1]["object"]) == told
    assert tray.simtest.trace_digest() == digest


def test_a_story_reads_a_trace_written_by_replay_and_replay_prints_it(tmp_path, capsys):
    trace = tmp_path / "trace.jsonl"
    result = runner.run_seed(2, "dag", "none", trace_path=str(trace))
    assert result.ok, result.report()
    first_task = next(json.loads(line)["task"] for line in trace.read_text().splitlines()
                      if '"task_submitted"' in line)
    from_file = tray.simtest.story(first_task, events=trace)
    assert _names(from_file)[:2] == ["task_submitted", "task_started"]
    assert "task_finished" in _names(from_file)
    in_memory = tray.simtest.story(first_task)  # (the last run's)
    assert [json.loads(json.dumps(event, default=str)) for event in in_memory] == from_file
    # And `tray simtest replay --story` prints it.
    assert cli.main(["replay", "--seed", "2", "--workload", "dag", "--faults", "none",
                     "--story", first_task[:8]]) == 0
    out = capsys.readouterr().out
    assert f"the story of {first_task[:8]} ({len(from_file)} events):" in out
    assert "\n    " + stories.format_event(in_memory[0]) + "\n" in out
    with pytest.raises(SystemExit):
        cli.main(["replay", "--seed", "2", "--story", "xyz"])


def test_a_story_is_told_of_a_hex_id_only():
    with pytest.raises(ValueError, match="hex id"):
        tray.simtest.story("not-an-id", events=[])
    with pytest.raises(TypeError, match="hex"):
        tray.simtest.story(12, events=[])


def test_a_worker_s_death_belongs_to_the_story_only_while_it_runs_the_task():
    task, worker = "ab" * 16, "cd" * 16
    events = [
        {"t": 0.0, "component": "n0", "event": "worker_start", "worker": worker},
        {"t": 0.1, "component": "driver:0/driver", "event": "task_submitted", "task": task},
        {"t": 0.2, "component": f"worker:{worker[-8:]}", "event": "task_started",
         "task": task, "attempt": 0},
        {"t": 0.3, "component": f"worker:{worker[-8:]}", "event": "task_done", "task": task},
        {"t": 0.4, "component": "fault", "event": "kill_worker", "worker": worker},
        {"t": 0.5, "component": "driver:0/driver", "event": "object_freed",
         "object": task + "00000001"},
        {"t": 0.6, "component": "driver:0/driver", "event": "object_freed",
         "object": "ef" * 16 + "00000001"},
    ]
    told = stories.story_of(task[:6], events)
    assert _names(told) == ["task_submitted", "task_started", "task_done", "object_freed"]
    assert stories.format_story(told, limit=1) == [
        f"t=0.500000s driver:0/driver object_freed object={task}00000001"]


def _wrong_model(program) -> None:
    # A planted bug in the reference model: leaf(3) is 9, not 10.
    ref = leaf.remote(program.key("leaf"), 3)
    program.expect(ref, 10, label="a planted wrong answer")


def test_a_failing_seed_s_report_tells_the_story_of_the_object_its_invariant_names(
        monkeypatch):
    monkeypatch.setitem(workloads.WORKLOADS, "planted", _wrong_model)
    result = runner.run_seed(0, "planted", "none")
    assert not result.ok and result.invariant == "get-returns-model-value", result.report()
    named = result.message.split("ObjectRef(", 1)[1].split(")", 1)[0]
    assert result.story_of == named
    report = result.report()
    assert len(result.story) == result.story_events  # (fewer than REPORT_EVENTS_MAX)
    assert f"the story of {named} (its {result.story_events} events in the trace):" in report
    lines = [line.strip() for line in report.splitlines()]
    started = lines.index(next(line for line in lines if " task_started " in line))
    assert " task_submitted " in lines[started - 1] and "name=leaf" in lines[started - 1]
    assert any(" task_finished " in line and "ok=True" in line for line in lines[started:])
    assert result.failure_dict()["story"] == result.story
    # The digest is the run's: the same seed, told no story, gives it too.
    monkeypatch.setattr(runner, "failure_story", lambda message, events: ("", 0, []))
    again = runner.run_seed(0, "planted", "none")
    assert again.digest == result.digest and again.story == []


def test_a_planted_spurious_retry_s_report_shows_the_two_runs(monkeypatch):
    # The owner runs each task again after its first success, out of its
    # budget, with no fault behind it (as test_simtest_planted's): the
    # report's story shows the task's two runs and nothing between them.
    plant_spurious_retries(monkeypatch)
    for seed in range(3):
        result = runner.run_seed(seed, "mixed", "default")
        if result.invariant == "every-re-execution-has-a-fault-behind-it":
            break
    else:
        pytest.fail("the planted bug went unnoticed")
    assert result.story_of and result.story_of in result.message
    started = [line for line in result.story if " task_started " in line]
    assert len(started) >= 2 and "attempt=0" in started[0]
    assert "the story of " + result.story_of in result.report()
