"""What task events cost per task, measured two ways (bench/README.md, "Task events").

1. In-process: the CPU time of the event calls one task makes (its owner's five
   state changes with the task's description, its executor's RUNNING, three
   spans and its end, handed over at once) and of its share of a flush (pickling the batch the GCS
   receives, merging it there), per task, over ``--tasks`` tasks. Stable on a
   loaded machine: it times only that code.
2. The whole cluster's CPU per task: the simulator runs every process of a
   cluster (owner, workers, GCS) in this one process, so the CPU time
   (``time.process_time``, not wall time: steady on a loaded machine) of
   ``--sim-tasks`` tasks, submitted one by one (sync) and all at once (async),
   with events on and off, alternated ``--sim-reps`` times, is the events'
   total cost, flushes and the GCS's merging included.
3. End to end: ``bench/run.py``'s "single client tasks sync/async" with
   ``TRAY_TASK_EVENTS=1`` and ``=0``, alternated ``--pairs`` times (each a fresh
   cluster), medians of each side. Noisy on a shared machine; use it where the
   load is low.

    python3 bench/task_events_overhead.py [--tasks 50000] [--sim-tasks 2000]
                                          [--sim-reps 3] [--pairs 0]
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import statistics
import subprocess
import sys
import tempfile
import time

import trio

from tray.core.config import Config
from tray.core.gcs.task_event_table import TaskEventTable
from tray.core.interfaces import NullTracer
from tray.core.scheduling import DefaultStrategy
from tray.core.task_spec import TaskSpec
from tray.core.task_status import TaskStatus
from tray.core.worker.task_events import TaskEventBuffer


def _specs(count: int) -> list:
    return [TaskSpec(task_id=i.to_bytes(16, "big"), job_id=1, name="f", function_id="fn",
                     args=[], kwargs={}, num_returns=1, return_ids=[b"r" * 20], caller="n0/driver",
                     resources={"CPU": 1.0}, strategy=DefaultStrategy(), parent_task_id=b"p" * 16)
            for i in range(count)]


async def _in_process(count: int) -> dict:
    config = Config()
    owner = TaskEventBuffer(address="n0/driver", node_id="n0", worker_id="", endpoint=None,
                            gcs_address="gcs", config=config)
    executor = TaskEventBuffer(address="n0/w1", node_id="n0", worker_id="w1", endpoint=None,
                               gcs_address="gcs", config=config)
    specs = _specs(count)
    record_s = flush_s = 0.0
    # A flush per 1,000 tasks: a second's worth at tray's task rates (a
    # buffer that is never flushed measures the garbage collector instead).
    for first in range(0, count, 1000):
        started = time.process_time()
        for spec in specs[first:first + 1000]:
            owner.task_state(spec, TaskStatus.PENDING_ARGS_AVAIL, info=True)
            owner.task_state(spec, TaskStatus.PENDING_NODE_ASSIGNMENT)
            owner.task_state(spec, TaskStatus.SUBMITTED_TO_WORKER)
            record = executor.started(spec)
            now = trio.current_time()
            executor.ended(record, [("task:fetch_args", now, now), ("task:execute", now, now),
                                    ("task:store_outputs", now, now)])
            owner.task_state(spec, TaskStatus.FINISHED)
        recorded = time.process_time()
        # A table per flush: the GCS's garbage collection over its 100,000
        # rows is the GCS process's cost, not the tasks' (it is not measured).
        table = TaskEventTable(config=config, tracer=NullTracer())
        for buffer in (owner, executor):
            batch = pickle.loads(pickle.dumps(buffer.take_batch(), protocol=5))
            table.handle_add_task_events(None, batch)
        record_s += recorded - started
        flush_s += time.process_time() - recorded
    return {"tasks": count, "record_us_per_task": record_s / count * 1e6,
            "flush_and_merge_us_per_task": flush_s / count * 1e6}


_SIM_CHILD = """
import sys, time
import tray
from tray.core.config import Config
enabled, count = sys.argv[1] == "on", int(sys.argv[2])
tray.init(backend="sim", seed=0, num_cpus=2, config=Config(task_events_enabled=enabled))

@tray.remote
def f(x):
    return x

tray.get([f.remote(i) for i in range(50)])  # warm-up: workers started, function exported
start = time.process_time()
for i in range(count):
    tray.get(f.remote(i))
sync_s = time.process_time() - start
start = time.process_time()
tray.get([f.remote(i) for i in range(count)])
async_s = time.process_time() - start
tray.shutdown()
print(sync_s / count * 1e6, async_s / count * 1e6)
"""


def _simulated(count: int, reps: int) -> dict:
    """CPU microseconds per task, sync and async, events on and off (medians)."""
    runs: dict = {"on": [], "off": []}
    for _ in range(reps):
        for side in ("on", "off"):
            out = subprocess.run([sys.executable, "-c", _SIM_CHILD, side, str(count)],
                                 check=True, capture_output=True, text=True, timeout=600)
            runs[side].append([float(v) for v in out.stdout.split()[-2:]])
    result = {}
    for side, values in runs.items():
        result[side] = {"sync_cpu_us_per_task": statistics.median(v[0] for v in values),
                        "async_cpu_us_per_task": statistics.median(v[1] for v in values)}
    for kind in ("sync", "async"):
        key = f"{kind}_cpu_us_per_task"
        result[f"{kind}_overhead_percent"] = round(
            (result["on"][key] / result["off"][key] - 1) * 100, 1)
    result["runs"] = runs
    return result


def _end_to_end(pairs: int) -> dict:
    results: dict = {"on": {}, "off": {}}
    here = os.path.dirname(os.path.abspath(__file__))
    for _ in range(pairs):
        for side, flag in (("on", "1"), ("off", "0")):
            with tempfile.NamedTemporaryFile(suffix=".json") as out:
                subprocess.run([sys.executable, os.path.join(here, "run.py"), "--only",
                                "single client tasks sync,single client tasks async",
                                "--rounds", "5", "--no-chart", "--json", out.name],
                               env={**os.environ, "TRAY_TASK_EVENTS": flag}, check=True,
                               capture_output=True, timeout=600)
                record = json.load(open(out.name))
            for row in _rows(record):
                results[side].setdefault(row[0], []).append(row[1])
    return {side: {name: statistics.median(values) for name, values in rows.items()}
            for side, rows in results.items()}


def _rows(record: dict):
    """(metric, median tasks/s) of tray's rows in a bench/run.py record."""
    for name, runtimes in record.get("results", {}).items():
        cell = runtimes.get("tray") if isinstance(runtimes, dict) else None
        if isinstance(cell, dict) and "median" in cell:
            yield name, cell["median"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=50_000)
    parser.add_argument("--sim-tasks", type=int, default=2000)
    parser.add_argument("--sim-reps", type=int, default=3)
    parser.add_argument("--pairs", type=int, default=0)
    args = parser.parse_args()
    print(json.dumps(trio.run(_in_process, args.tasks), indent=2))
    if args.sim_reps:
        print(json.dumps(_simulated(args.sim_tasks, args.sim_reps), indent=2))
    if args.pairs:
        print(json.dumps(_end_to_end(args.pairs), indent=2))


if __name__ == "__main__":
    main()
