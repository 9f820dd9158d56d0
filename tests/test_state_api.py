"""The state API (tray.util.state) and the task events behind it, on both backends.

Task events reach the GCS in batches (every ``task_events_flush_period_s``,
1 s), so tests poll until what they expect shows up (virtual time on the
simulator: polling costs nothing there)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import warnings

import pytest

import tray
import tray.simtest
from tray.backends.local.session import free_port
from tray.core.config import Config
from tray.util import state


@tray.remote
def add_one(x):
    return x + 1


@tray.remote
def boom():
    raise ValueError("boom from a task")


@tray.remote
def slow(x, seconds=1.0):
    time.sleep(seconds)
    return x


@tray.remote
class Counter:
    def __init__(self, start=0):
        self.value = start

    def add(self, n):
        self.value += n
        return self.value


def _until(fetch, check, tick_s=0.5, tries=40):
    """Poll ``fetch()`` until ``check(result)`` holds; the last result."""
    result = fetch()
    for _ in range(tries):
        if check(result):
            return result
        time.sleep(tick_s)
        result = fetch()
    raise AssertionError(f"never held; last: {result!r}")


def test_tasks_finished_and_failed_with_error(one_node):
    refs = [add_one.remote(i) for i in range(4)]
    assert tray.get(refs) == [1, 2, 3, 4]
    with pytest.raises(ValueError):
        tray.get(boom.remote())
    tasks = _until(lambda: state.list_tasks(),
                   lambda ts: sum(t.state in ("FINISHED", "FAILED") and t.worker_pid is not None
                                  for t in ts) >= 5)
    by_name = {}
    for task in tasks:
        by_name.setdefault(task.name, []).append(task)
    assert [t.state for t in by_name["add_one"]] == ["FINISHED"] * 4
    failed = by_name["boom"][0]
    assert failed.state == "FAILED" and failed.error_type == "TASK_EXECUTION_EXCEPTION"
    assert failed.type == "NORMAL_TASK" and failed.job_id
    assert failed.error_message is None  # a detail field
    node_ids = {n.node_id for n in state.list_nodes()}
    assert failed.node_id in node_ids and isinstance(failed.worker_pid, int)
    detail = state.get_task(failed.task_id)
    assert "boom from a task" in detail.error_message and "Traceback" in detail.error_message
    states = [e["state"] for e in detail.events]
    assert states[0] == "PENDING_ARGS_AVAIL" and states[-1] == "FAILED", states
    assert {"PENDING_NODE_ASSIGNMENT", "SUBMITTED_TO_WORKER", "RUNNING"} <= set(states)
    assert detail.start_time_ms <= detail.end_time_ms
    assert any(span["event_name"] == "task:execute" for span in detail.profiling_data)
    summary = state.summarize_tasks()["cluster"]
    assert summary["summary_by"] == "func_name" and summary["total_tasks"] == 5
    assert summary["summary"]["add_one"]["state_counts"] == {"FINISHED": 4}
    assert summary["summary"]["boom"]["state_counts"] == {"FAILED": 1}
    # Filters: = and != (state names case-insensitively), and a limit.
    assert len(state.list_tasks(filters=[("state", "=", "failed")])) == 1
    assert {t.name for t in state.list_tasks(filters=[("state", "!=", "FINISHED")])} == {"boom"}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert len(state.list_tasks(limit=2)) == 2
    assert any("showing the newest 2" in str(w.message) for w in caught)


@tray.remote(num_cpus=0.5, resources={"widget": 1})
def parent_of_one():
    return tray.get(add_one.remote(1)), tray.get_runtime_context().get_task_id()


def test_what_a_task_is_reaches_its_row(one_node):
    """The owner sends what a task is (task_info's tuple, INFO_FIELDS in
    order); each field lands in its own column of the row."""
    value, parent_id = tray.get(parent_of_one.options(resources={}).remote())
    assert value == 2
    rows = _until(lambda: state.list_tasks(detail=True),
                  lambda ts: {t.name for t in ts if t.state == "FINISHED"} >=
                  {"parent_of_one", "add_one"})
    parent = next(t for t in rows if t.name == "parent_of_one")
    child = next(t for t in rows if t.name == "add_one")
    assert parent.task_id == parent_id and child.parent_task_id == parent_id
    assert (parent.type, parent.func_or_class_name, parent.actor_id) == \
        ("NORMAL_TASK", "parent_of_one", None)
    assert parent.required_resources == {"CPU": 0.5}
    assert child.required_resources == {"CPU": 1.0} and child.placement_group_id is None
    assert parent.job_id == child.job_id == tray.get_runtime_context().get_job_id()


def test_actors_alive_then_dead_with_cause(one_node):
    counter = Counter.options(name="c1").remote(5)
    assert tray.get(counter.add.remote(1)) == 6
    actors = _until(lambda: state.list_actors(), lambda a: a and a[0].pid is not None)
    [actor] = actors
    assert actor.class_name == "Counter" and actor.state == "ALIVE" and actor.name == "c1"
    assert actor.node_id in {n.node_id for n in state.list_nodes()}
    tray.kill(counter)
    dead = _until(lambda: state.get_actor(actor.actor_id), lambda a: a.state == "DEAD")
    assert "tray.kill" in dead.death_cause
    assert [e["state"] for e in dead.events] == ["PENDING_CREATION", "ALIVE", "DEAD"]
    assert state.summarize_actors()["cluster"]["summary"]["Counter"]["state_counts"] == {"DEAD": 1}
    calls = _until(lambda: state.list_tasks(filters=[("type", "=", "ACTOR_TASK")]),
                   lambda ts: ts and ts[0].state == "FINISHED")
    assert calls[0].name == "Counter.add" and calls[0].actor_id == actor.actor_id
    assert state.get_actor("0" * 32) is None


def test_objects_workers_jobs_and_memory(one_node):
    big = tray.put(b"x" * 300_000)  # in the node's store
    small = tray.put(7)  # in the driver's memory
    objects = state.list_objects(detail=True)
    by_id = {o.object_id: o for o in objects}
    assert by_id[big.hex()].object_size >= 300_000
    assert by_id[small.hex()].reference_type == "LOCAL_REFERENCE"
    assert by_id[big.hex()].type == "DRIVER" and by_id[big.hex()].owned
    summary = state.memory_summary()
    assert summary["nodes"][0]["store_used_bytes"] >= 300_000
    assert summary["nodes"][0]["spilled_bytes"] == 0
    assert summary["totals"]["objects"] >= 2
    assert state.summarize_objects()["cluster"]["summary"]["total_size_bytes"] >= 300_000
    tray.get(add_one.remote(1))
    workers = state.list_workers()
    assert any(w.worker_type == "DRIVER" for w in workers)
    assert any(w.worker_type == "WORKER" and w.is_alive for w in workers)
    [job] = state.list_jobs()
    assert job.type == "DRIVER" and job.job_id == tray.get_runtime_context().get_job_id()
    del big, small


@tray.remote
def make_counter(boxed):
    """Creates an actor whose constructor's argument is not ready yet (the
    creating process waits for it: the driver is free to look meanwhile)."""
    counter = Counter.remote(boxed[0])
    return tray.get(counter.add.remote(1))


def test_pending_states_and_dependencies_unready():
    tray.init(backend="sim", seed=3, num_cpus=3)
    waiting_on = slow.remote(1, 30.0)
    child = add_one.remote(waiting_on)  # waits for its argument
    stuck = add_one.options(resources={"unobtainium": 1}).remote(1)  # no node has it
    made = make_counter.remote([waiting_on])
    tasks = _until(lambda: state.list_tasks(),
                   lambda ts: {t.state for t in ts} >= {"RUNNING", "PENDING_ARGS_AVAIL",
                                                        "PENDING_NODE_ASSIGNMENT"})
    by_id = {t.task_id: t for t in tasks}
    assert by_id[child.task_id().hex()].state == "PENDING_ARGS_AVAIL"
    assert by_id[stuck.task_id().hex()].state == "PENDING_NODE_ASSIGNMENT"
    assert by_id[waiting_on.task_id().hex()].state == "RUNNING"
    [pending_actor] = _until(lambda: state.list_actors(), lambda a: len(a) == 1)
    assert pending_actor.state == "DEPENDENCIES_UNREADY"
    assert pending_actor.class_name == "Counter"
    assert tray.get(made) == 2
    _until(lambda: state.list_actors(), lambda a: a[0].state in ("ALIVE", "DEAD"))
    del stuck


def test_bad_queries_say_what_is_allowed():
    tray.init(backend="sim", seed=0, num_cpus=1)
    with pytest.raises(ValueError, match="unknown filter key 'colour'.*state"):
        state.list_actors(filters=[("colour", "=", "red")])
    with pytest.raises(ValueError, match="unsupported filter predicate '>'"):
        state.list_tasks(filters=[("state", ">", "RUNNING")])
    with pytest.raises(ValueError, match=r"\(key, predicate, value\)"):
        state.list_nodes(filters=["state=ALIVE"])
    with pytest.raises(ValueError, match="limit must be a positive integer"):
        state.list_nodes(limit=0)
    with pytest.raises(ValueError, match="actor id"):
        state.get_actor("")
    with pytest.raises(ValueError, match="timeout must be a positive number"):
        state.list_tasks(timeout=0)
    [node] = state.list_nodes(filters=[("state", "=", "alive")], detail=True)
    assert node.is_head_node and node.resources_total["CPU"] == 1.0
    assert node.resources_available is not None
    assert state.list_nodes(filters=[("state", "!=", "ALIVE")]) == []
    assert node["state"] == "ALIVE"  # records read like dicts too


def test_gcs_table_keeps_the_newest_and_counts_the_rest():
    tray.init(backend="sim", seed=0, num_cpus=2, config=Config(task_events_gcs_max=5))
    tray.get([add_one.remote(i) for i in range(12)])
    time.sleep(2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        tasks = state.list_tasks()
    assert len(tasks) == 5
    assert any("task attempts are missing" in str(w.message) for w in caught)


def test_gcs_table_checks_the_rows_merged_since_its_last_check():
    """The simulator's check of the GCS table reads only the rows merged
    into since the last check (every row was quadratic in a long run); a
    row broken by a merge is still caught, and a real GCS, which is never
    checked, keeps no keys for it."""
    from types import SimpleNamespace

    import trio

    from tray.core.gcs.task_event_table import TaskEventTable

    table = TaskEventTable(config=Config(task_events_gcs_max=4), tracer=None)

    async def merge(*tasks: str, state_: str = "FINISHED") -> None:
        events = [(task, 0, None, {state_: 1.0}, None, None, None, None, None, [])
                  for task in tasks]
        table.handle_add_task_events(None, SimpleNamespace(events=events, dropped=0,
                                                           sender_now=trio.current_time()))

    trio.run(merge, "a", "b", "c")
    assert table._merged_since_check is None  # never checked: nothing kept
    table.validate_state()  # the first check reads every row
    assert table._merged_since_check == set()
    trio.run(lambda: merge("d", state_="RUNNING"))
    assert table._merged_since_check == {("d", 0)}
    table.rows[("d", 0)]["state"] = "NO_SUCH_STATE"  # as a broken merge would leave it
    with pytest.raises(AssertionError, match="NO_SUCH_STATE"):
        table.validate_state()
    table.rows[("d", 0)]["state"] = "RUNNING"
    table.validate_state()
    # More merges between two checks than the table holds rows: the next
    # check reads every row again rather than keep more keys than rows.
    trio.run(merge, *(f"e{index}" for index in range(6)))
    assert table._merged_since_check is None and len(table.rows) == 4
    table.validate_state()


def test_an_ended_jobs_unfinished_attempts_are_marked_failed():
    """When a job's driver exits, the GCS marks the job's attempts that had
    not ended FAILED (WORKER_DIED, Ray's message), as Ray's GCS does; ended
    ones and other jobs' stay as they were."""
    from types import SimpleNamespace

    import trio

    from tray.core.gcs.task_event_table import TaskEventTable

    table = TaskEventTable(config=Config(), tracer=None)
    info = {job: ("f", "NORMAL_TASK", job, None, "p", {}, None, "f", "driver")
            for job in (1, 2)}
    rows = [("pending", 1, "PENDING_NODE_ASSIGNMENT"), ("running", 1, "RUNNING"),
            ("done", 1, "FINISHED"), ("other", 2, "RUNNING")]

    async def merge_then_end() -> None:
        events = [(task, 0, info[job], {state_: 1.0}, None, None, None, None, None, [])
                  for task, job, state_ in rows]
        table.handle_add_task_events(None, SimpleNamespace(events=events, dropped=0,
                                                           sender_now=trio.current_time()))
        table.job_ended(1)

    trio.run(merge_then_end)
    state_of = {key[0]: row["state"] for key, row in table.rows.items()}
    assert state_of == {"pending": "FAILED", "running": "FAILED", "done": "FINISHED",
                        "other": "RUNNING"}
    failed = table.rows[("running", 0)]
    assert failed["error_type"] == "WORKER_DIED"
    assert failed["error_message"] == ("Job finishes (00000001) as driver exits. Marking all "
                                       "non-terminal tasks as failed.")
    assert "FAILED" in failed["events"] and "RUNNING" in failed["events"]
    assert table.rows[("done", 0)]["error_type"] is None
    table.validate_state()


def test_process_buffer_is_bounded_and_counts_drops():
    tray.init(backend="sim", seed=0, num_cpus=2, config=Config(task_events_buffer_max=3))
    tray.get([add_one.remote(i) for i in range(10)])
    from tray.core.context import get_worker

    assert get_worker().task_events.dropped > 0
    time.sleep(2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        state.list_tasks()
    assert any("full event buffers" in str(w.message) for w in caught)


def test_events_can_be_turned_off():
    tray.init(backend="sim", seed=0, num_cpus=2, config=Config(task_events_enabled=False))
    tray.get([add_one.remote(i) for i in range(3)])
    time.sleep(2)
    assert state.list_tasks() == []
    tray.shutdown()
    os.environ["TRAY_TASK_EVENTS"] = "0"
    try:
        tray.init(backend="sim", seed=0, num_cpus=2)
        tray.get(add_one.remote(1))
        time.sleep(2)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert state.list_tasks() == []
        assert any("turned off" in str(w.message) for w in caught)
    finally:
        del os.environ["TRAY_TASK_EVENTS"]


def _digest_of_a_run(seed: int) -> tuple[str, list]:
    tray.init(backend="sim", seed=seed, num_cpus=2, num_nodes=2)
    counter = Counter.remote()
    tray.get([add_one.remote(i) for i in range(5)] + [counter.add.remote(2)])
    with pytest.raises(ValueError):
        tray.get(boom.remote())
    time.sleep(2)
    rows = [(t.task_id, t.state, t.node_id, t.worker_id) for t in state.list_tasks()]
    tray.shutdown()
    return tray.simtest.trace_digest(), rows


def test_events_replay_bit_for_bit():
    first = _digest_of_a_run(7)
    assert _digest_of_a_run(7) == first
    assert len(first[1]) == 8  # 5 tasks, a constructor, a call, a failure


def test_queries_from_a_process_outside_the_cluster(tmp_path, monkeypatch):
    """The CLI's and the dashboard's way in: address="auto" (or host:port)
    from a process that never called tray.init."""
    root = tmp_path / "sessions"
    env = {**os.environ, "TRAY_SESSION_ROOT": str(root)}
    port = free_port()
    subprocess.run([sys.executable, "-m", "tray.scripts.cli", "start", "--head", "--port",
                    str(port), "--num-cpus", "2"], env=env, check=True, timeout=120,
                   capture_output=True)
    try:
        with open(root / "current_cluster.json") as file:
            token = json.load(file)["token"]
        monkeypatch.setenv("TRAY_CLUSTER_TOKEN", token)
        tray.init(address=f"127.0.0.1:{port}")
        counter = Counter.remote()
        tray.get(counter.add.remote(1))
        with pytest.raises(ValueError):
            tray.get(boom.remote())
        script = (
            "import json, time\n"
            "from tray.util import state\n"
            f"address = '127.0.0.1:{port}'\n"
            "for _ in range(40):\n"
            "    tasks = state.list_tasks(address=address)\n"
            "    if any(t.state == 'FAILED' for t in tasks): break\n"
            "    time.sleep(0.25)\n"
            "print(json.dumps({'nodes': len(state.list_nodes(address=address)),\n"
            "  'actors': [a.state for a in state.list_actors(address=address)],\n"
            "  'failed': [t.name for t in tasks if t.state == 'FAILED'],\n"
            "  'jobs': len(state.list_jobs(address=address)),\n"
            "  'objects': len(state.list_objects(address=address))}))\n")
        result = subprocess.run([sys.executable, "-c", script], env={**env,
                                "TRAY_CLUSTER_TOKEN": token}, capture_output=True, text=True,
                                timeout=120)
        assert result.returncode == 0, result.stderr
        seen = json.loads(result.stdout.strip().splitlines()[-1])
        assert seen["nodes"] == 1 and seen["actors"] == ["ALIVE"]
        assert seen["failed"] == ["boom"] and seen["jobs"] == 1
        [job] = state.list_jobs()
        assert job.status == "RUNNING"
        tray.shutdown()  # the driver goes away: its job is over (Ray's is_dead)
        job = _until(lambda: state.list_jobs(address=f"127.0.0.1:{port}")[0],
                     lambda job: job.status == "SUCCEEDED")
        assert job.type == "DRIVER"
        [driver] = [w for w in state.list_workers(address=f"127.0.0.1:{port}")
                    if w.worker_type == "DRIVER"]
        assert not driver.is_alive
    finally:
        if tray.is_initialized():
            tray.shutdown()
        subprocess.run([sys.executable, "-m", "tray.scripts.cli", "stop"], env=env,
                       timeout=120, capture_output=True)
    with pytest.raises(tray.exceptions.TrayError):
        state.list_nodes(address=f"127.0.0.1:{port}")


def test_readme_observability_example_runs(tmp_path):
    import readme_examples

    result = readme_examples.run(readme_examples.block("from tray.util.state import",
                                                               page="observability.md"),
                                 tmp_path)
    assert result.returncode == 0, result.stderr
    assert "broken TASK_EXECUTION_EXCEPTION" in result.stdout
    assert "ValueError: bad input" in result.stdout
    assert "'FINISHED': 4" in result.stdout


def test_state_simtest_workload_passes_and_catches_a_planted_bug(monkeypatch):
    from tray.core.gcs import task_event_table
    from tray.simtest import runner

    result = runner.run_seed(2, "state", "chaos")
    assert result.ok, result.report()
    # A GCS table that loses why a task failed must be caught.
    merge = task_event_table.TaskEventTable._merge

    def forgetful_merge(self, event, shift):
        merge(self, event, shift)
        self.rows[(event[0], event[1])]["error_type"] = None

    monkeypatch.setattr(task_event_table.TaskEventTable, "_merge", forgetful_merge)
    planted = runner.run_seed(2, "state", "default")
    assert not planted.ok
    assert planted.invariant == "failed-tasks-say-why", planted.report()


@tray.remote(max_retries=0)
def die():
    os._exit(1)


def test_a_driver_sends_its_last_events_as_it_exits(tmp_path, monkeypatch):
    # A worker that died never reports; only its task's owner knows the task
    # failed (WORKER_DIED). With a flush period far beyond the test, only the
    # flush at shutdown can tell the GCS.
    import dataclasses

    import tray.backends.local as local_backend

    root = tmp_path / "sessions"
    env = {**os.environ, "TRAY_SESSION_ROOT": str(root)}
    port = free_port()
    subprocess.run([sys.executable, "-m", "tray.scripts.cli", "start", "--head", "--port",
                    str(port), "--num-cpus", "1", "--no-include-dashboard"], env=env,
                   check=True, timeout=120, capture_output=True)
    try:
        with open(root / "current_cluster.json") as file:
            monkeypatch.setenv("TRAY_CLUSTER_TOKEN", json.load(file)["token"])
        monkeypatch.setattr(local_backend, "DEFAULT_CONFIG", dataclasses.replace(
            local_backend.DEFAULT_CONFIG, task_events_flush_period_s=3600.0))
        tray.init(address=f"127.0.0.1:{port}")
        with pytest.raises(tray.exceptions.WorkerCrashedError):
            tray.get(die.remote())
        tray.shutdown()
        failed = state.list_tasks(address=f"127.0.0.1:{port}", filters=[("state", "=", "FAILED")])
        assert [(t.name, t.error_type) for t in failed] == [("die", "WORKER_DIED")]
    finally:
        if tray.is_initialized():
            tray.shutdown()
        subprocess.run([sys.executable, "-m", "tray.scripts.cli", "stop"], env=env,
                       timeout=120, capture_output=True)


def test_the_owner_reports_what_a_killed_worker_never_flushed():
    # The worker that ran a failing task, and the one that ran an actor's
    # constructor, die before their first flush: the owner's own events
    # still say why the task failed and that the constructor finished.
    tray.init(backend="sim", seed=4, num_cpus=2)
    try:
        sim = tray.simtest.cluster()
        with pytest.raises(ValueError):
            tray.get(boom.remote())
        counter = Counter.remote(1)
        assert tray.get(counter.add.remote(1)) == 2
        for worker_id in sim.workers():
            sim.kill_worker(worker_id)
        tasks = _until(lambda: state.list_tasks(detail=True),
                       lambda ts: {t.name for t in ts} >= {"boom", "Counter.__init__"},
                       tick_s=1.0)
        by_name = {t.name: t for t in tasks}
        assert by_name["boom"].state == "FAILED"
        assert "boom from a task" in (by_name["boom"].error_message or "")
        assert by_name["Counter.__init__"].state == "FINISHED"
    finally:
        tray.shutdown()
