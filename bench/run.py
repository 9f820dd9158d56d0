"""tray's benchmarks (a first set; see bench/README.md for the method).

    python bench/run.py [--only NAME] [--rounds N] [--json PATH]

Each metric runs in a fresh process (so one cannot warm up another), with a
warm-up round first, then ``--rounds`` measured rounds; the table shows the
median and the spread (min-max). Results go to bench/results/<date>.json."""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))

# name -> (unit, code run in a fresh process; it prints one number per round)
METRICS: dict[str, tuple[str, str]] = {}


def metric(name: str, unit: str):
    def register(function):
        METRICS[name] = (unit, function.__name__)
        return function
    return register


# ---------------------------------------------------------------- metrics

@metric("init to first result (local)", "s")
def init_to_first_result(rounds: int) -> list[float]:
    import tray

    results = []
    for _ in range(rounds + 1):
        start = time.perf_counter()
        tray.init()

        @tray.remote
        def one():
            return 1

        assert tray.get(one.remote()) == 1
        results.append(time.perf_counter() - start)
        tray.shutdown()
    return results[1:]


@metric("shutdown (local)", "s")
def shutdown_time(rounds: int) -> list[float]:
    import tray

    results = []
    for _ in range(rounds + 1):
        tray.init()
        start = time.perf_counter()
        tray.shutdown()
        results.append(time.perf_counter() - start)
    return results[1:]


def _with_cluster(backend: str, make_body, rounds: int, **options) -> list[float]:
    """Start a cluster, build the workload (``make_body()``), warm it up once,
    then time ``rounds`` runs; each run returns how many operations it did."""
    import tray

    if backend == "sim":
        tray.init(backend="sim", seed=0, **options)
    else:
        tray.init(**options)
    try:
        body = make_body()
        body()  # warm-up: workers started, functions exported
        results = []
        for _ in range(rounds):
            start = time.perf_counter()
            count = body()
            results.append(count / (time.perf_counter() - start))
        return results
    finally:
        tray.shutdown()


def _tasks_sync(n: int):
    import tray

    @tray.remote
    def small():
        return b"ok"

    def body():
        for _ in range(n):
            tray.get(small.remote())
        return n
    return body


def _tasks_async(n: int):
    import tray

    @tray.remote
    def small():
        return b"ok"

    def body():
        tray.get([small.remote() for _ in range(n)])
        return n
    return body


def _actor_calls(n: int, sync: bool):
    import tray

    @tray.remote
    class Actor:
        def small(self):
            return b"ok"

    actor = Actor.remote()

    def body():
        if sync:
            for _ in range(n):
                tray.get(actor.small.remote())
        else:
            tray.get([actor.small.remote() for _ in range(n)])
        return n
    return body


@metric("single client tasks sync (local)", "tasks/s")
def tasks_sync(rounds: int) -> list[float]:
    return _with_cluster("local", lambda: _tasks_sync(300), rounds)


@metric("single client tasks async (local)", "tasks/s")
def tasks_async(rounds: int) -> list[float]:
    return _with_cluster("local", lambda: _tasks_async(1000), rounds)


@metric("1:1 actor calls sync (local)", "calls/s")
def actor_sync(rounds: int) -> list[float]:
    return _with_cluster("local", lambda: _actor_calls(500, sync=True), rounds)


@metric("1:1 actor calls async (local)", "calls/s")
def actor_async(rounds: int) -> list[float]:
    return _with_cluster("local", lambda: _actor_calls(1000, sync=False), rounds)


@metric("put/get 80 MB array within a node (local)", "GB/s")
def put_get_large(rounds: int) -> list[float]:
    import numpy as np

    import tray

    tray.init(num_cpus=1)
    try:
        array = np.ones(10_000_000)  # 80 MB
        results = []
        for _ in range(rounds + 1):
            start = time.perf_counter()
            value = tray.get(tray.put(array))
            elapsed = time.perf_counter() - start
            assert not value.flags.owndata  # zero-copy view of shared memory
            results.append(array.nbytes / elapsed / 1e9)
        return results[1:]
    finally:
        tray.shutdown()


@metric("simulated tasks per wall-clock second (sim, 3 nodes)", "tasks/s")
def sim_tasks(rounds: int) -> list[float]:
    return _with_cluster("sim", lambda: _tasks_async(2000), rounds, num_nodes=3,
                         num_cpus=4)


# ---------------------------------------------------------------- harness

def _run_one(name: str, rounds: int) -> dict:
    code = (f"import sys, json; sys.path.insert(0, {HERE!r}); import run; "
            f"print(json.dumps(run.{METRICS[name][1]}({rounds})))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=600)
    if result.returncode != 0:
        return {"name": name, "unit": METRICS[name][0], "error": result.stderr[-2000:]}
    values = json.loads(result.stdout.strip().splitlines()[-1])
    return {"name": name, "unit": METRICS[name][0], "values": values,
            "median": statistics.median(values), "min": min(values), "max": max(values)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="run the metrics whose name contains this")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", default="", help="where to write the results")
    args = parser.parse_args(argv)
    names = [name for name in METRICS if args.only in name]
    rows = []
    for name in names:
        row = _run_one(name, args.rounds)
        rows.append(row)
        if "error" in row:
            print(f"{name:<55} FAILED\n{row['error']}")
        else:
            print(f"{name:<55} {row['median']:>12.4g} {row['unit']:<8} "
                  f"({row['min']:.4g} - {row['max']:.4g})", flush=True)
    record = {"date": datetime.datetime.now(datetime.UTC).isoformat(),
              "machine": {"platform": platform.platform(), "python": platform.python_version(),
                          "cpus": os.cpu_count()},
              "rounds": args.rounds, "results": rows}
    path = args.json or os.path.join(HERE, "results",
                                     datetime.date.today().isoformat() + ".json")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as file:
        json.dump(record, file, indent=2)
    print(f"results: {path}")
    return 1 if any("error" in row for row in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
