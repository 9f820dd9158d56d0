"""Timelines as Chrome traces (the JSON that Perfetto and chrome://tracing load).

Two sources, one format — one track per worker per node (``pid``: the node,
``tid``: the worker), complete events (``"ph": "X"``) for work, instant
events (``"ph": "i"``) for what happened at a moment:

* ``tray.timeline()``: a live cluster's task events, through the state API
  (``tray.util.state.list_tasks``): every task attempt and actor call that
  ran, with its spans (fetching the arguments — where a pull from another
  node shows up —, running the user's code, storing the results) nested
  inside it, its failure marked. Times are milliseconds since the epoch,
  written as Chrome's microseconds.
* ``tray simtest replay --seed N --timeline out.json``: a simulated seed's
  event trace (``tray/core/trace.py``), in *virtual* time from 0: every task
  run from the workers' ``task_started``/``task_done``, object transfers
  between nodes (``object_pulled``) on the pulling node's track, every
  injected fault (node killed, partition, GCS restart, ...) as a global
  instant event, and the failing invariant (if the seed failed) marked at
  the end. The same seed gives the same file, byte for byte.

Chrome's format: https://docs.google.com/document/d/1CvAClvFfyA5R-PhYUmn5OOQtYMH4h6I0nSsKchNAySU
"""

from __future__ import annotations

import json

_US_PER_S = 1_000_000


def _metadata(pid: str, tid: str | None, pid_names: dict, tid_names: dict) -> None:
    pid_names.setdefault(pid, pid)
    if tid is not None:
        tid_names.setdefault((pid, tid), tid)


def _with_metadata(events: list, pid_names: dict, tid_names: dict) -> list:
    meta = [{"name": "process_name", "ph": "M", "pid": pid, "args": {"name": name}}
            for pid, name in sorted(pid_names.items())]
    meta += [{"name": "thread_name", "ph": "M", "pid": pid, "tid": tid, "args": {"name": name}}
             for (pid, tid), name in sorted(tid_names.items())]
    return meta + events


def _write(events: list, filename: str | None) -> list | None:
    if filename is None:
        return events
    with open(filename, "w", encoding="utf-8") as out:
        json.dump(events, out, sort_keys=True)
    return None


# ============================================================ a live cluster


def events_from_tasks(tasks: list) -> list:
    """Chrome trace events from ``TaskState`` records (detail=True)."""
    events: list = []
    pid_names: dict = {}
    tid_names: dict = {}
    for task in tasks:
        if task.start_time_ms is None or task.node_id is None:
            continue  # it never ran (or its executor's events were lost)
        pid = f"Node {task.node_id[:8]}"
        tid = f"Worker {(task.worker_id or '?')[:8]}" + \
            (f" (pid {task.worker_pid})" if task.worker_pid else "")
        _metadata(pid, tid, pid_names, tid_names)
        end_ms = task.end_time_ms if task.end_time_ms is not None else task.start_time_ms
        category = {"ACTOR_TASK": "actor_task", "ACTOR_CREATION_TASK": "actor_creation"}.get(
            task.type, "task")
        args = {"task_id": task.task_id, "attempt": task.attempt_number, "state": task.state,
                "job_id": task.job_id}
        if task.actor_id:
            args["actor_id"] = task.actor_id
        if task.error_type:
            args["error_type"] = task.error_type
            args["error_message"] = (task.error_message or "")[-2000:]
        event = {"name": task.name, "cat": category, "ph": "X", "pid": pid, "tid": tid,
                 "ts": task.start_time_ms * 1000, "dur": max(end_ms - task.start_time_ms, 0)
                 * 1000, "args": args}
        if task.state == "FAILED":
            event["cname"] = "terrible"
        events.append(event)
        for span in task.profiling_data or []:
            if span["start_time_ms"] is None:
                continue
            events.append({"name": span["event_name"], "cat": "task_span", "ph": "X",
                           "pid": pid, "tid": tid, "ts": span["start_time_ms"] * 1000,
                           "dur": max((span["end_time_ms"] or span["start_time_ms"])
                                      - span["start_time_ms"], 0) * 1000,
                           "args": {"task_id": task.task_id}})
    events.sort(key=lambda e: (e["ts"], e["pid"], e["tid"], e["name"]))
    return _with_metadata(events, pid_names, tid_names)


def timeline(filename: str | None = None, *, address: str | None = None) -> list | None:
    """The cluster's timeline as a Chrome trace, as Ray's ``ray.timeline``:
    the list of trace events, or (with ``filename``) written there as JSON
    (open it in https://ui.perfetto.dev or chrome://tracing). Covers the
    task attempts the GCS still holds (the newest 100,000); tasks still
    running show as instants at their start. ``address`` as in
    ``tray.util.state`` (None: this driver's cluster)."""
    from .util.state import list_tasks

    tasks = list_tasks(address=address, detail=True, limit=10**9)
    return _write(events_from_tasks(tasks), filename)


# ====================================================== a simulated seed


def _fault_args(event: dict) -> dict:
    return {key: value for key, value in sorted(event.items())
            if key not in ("t", "component", "event")}


def events_from_sim_trace(trace: list, *, invariant: str = "", message: str = "",
                          seed: int | None = None) -> list:
    """Chrome trace events from a simulated run's event trace (the dicts
    ``cluster.trace.events`` holds, or the lines ``--trace`` writes), in
    virtual time."""
    node_of_worker: dict = {}  # worker id suffix (8 hex) -> node short id
    for event in trace:
        if event["event"] == "worker_start" and "worker" in event:
            node_of_worker[event["worker"][-8:]] = event["component"]
    events: list = []
    pid_names: dict = {}
    tid_names: dict = {}
    running: dict = {}  # (component, task) -> the start event
    last_us = 0

    def track(component: str) -> tuple[str, str]:
        kind, _, suffix = component.partition(":")
        if kind == "worker":
            node = node_of_worker.get(suffix, "?")
            return f"Node {node}", f"Worker {suffix}"
        if kind == "driver":
            return "Driver", component
        return f"Node {component}", "node manager"

    for event in trace:
        ts = int(round(event["t"] * _US_PER_S))
        last_us = max(last_us, ts)
        component, name = event["component"], event["event"]
        if name == "task_started" and component.startswith("worker:"):
            running[(component, event["task"])] = (ts, event)
        elif name in ("task_done", "task_failed") and component.startswith("worker:"):
            started = running.pop((component, event["task"]), None)
            if started is None:
                continue
            start_us, start = started
            pid, tid = track(component)
            _metadata(pid, tid, pid_names, tid_names)
            task_name = start.get("name", "task")
            item = {"name": task_name, "cat": "actor_task" if "." in task_name else "task",
                    "ph": "X", "pid": pid, "tid": tid, "ts": start_us,
                    "dur": ts - start_us, "args": {"task_id": event["task"],
                                                   "attempt": start.get("attempt", 0),
                                                   "failed": name == "task_failed"}}
            if name == "task_failed":
                item["cname"] = "terrible"
            events.append(item)
        elif name == "object_pulled":
            pid, tid = f"Node {component}", "object transfers"
            _metadata(pid, tid, pid_names, tid_names)
            events.append({"name": "object pulled", "cat": "object_transfer", "ph": "i",
                           "s": "t", "pid": pid, "tid": tid, "ts": ts,
                           "args": _fault_args(event)})
        elif component == "fault":
            events.append({"name": f"FAULT {name}", "cat": "fault", "ph": "i", "s": "g",
                           "pid": "Faults", "tid": "injected", "ts": ts,
                           "args": _fault_args(event), "cname": "terrible"})
            _metadata("Faults", "injected", pid_names, tid_names)
        elif component == "cluster" and name in ("process_crashed", "process_kill",
                                                  "process_exit"):
            events.append({"name": name, "cat": "process", "ph": "i", "s": "p",
                           "pid": "Processes", "tid": "lifecycle", "ts": ts,
                           "args": _fault_args(event)})
            _metadata("Processes", "lifecycle", pid_names, tid_names)
    for (component, task), (start_us, start) in sorted(running.items()):
        pid, tid = track(component)  # still running (or its worker died under it)
        _metadata(pid, tid, pid_names, tid_names)
        events.append({"name": start.get("name", "task"), "cat": "task", "ph": "X",
                       "pid": pid, "tid": tid, "ts": start_us, "dur": last_us - start_us,
                       "args": {"task_id": task, "attempt": start.get("attempt", 0),
                                "unfinished": True}})
    if invariant:
        events.append({"name": f"INVARIANT BROKEN: {invariant}", "cat": "invariant",
                       "ph": "i", "s": "g", "pid": "Faults", "tid": "injected",
                       "ts": last_us, "cname": "terrible",
                       "args": {"invariant": invariant, "message": message[-4000:],
                                "seed": seed}})
        _metadata("Faults", "injected", pid_names, tid_names)
    events.sort(key=lambda e: (e["ts"], str(e["pid"]), str(e.get("tid")), e["name"]))
    return _with_metadata(events, pid_names, tid_names)


def write_sim_timeline(trace: list, filename: str, **details) -> None:
    _write(events_from_sim_trace(trace, **details), filename)
