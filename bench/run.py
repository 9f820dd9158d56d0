"""tray's benchmarks, alone or side by side with Ray and Dask (bench/README.md).

    python bench/run.py [--peers ray,dask] [--only NAME] [--rounds N] [--quick]
                        [--json PATH] [--no-chart]

Every (runtime, metric) pair runs in a fresh process, one after another, so no
metric warms up another and no runtime shares a process with another. Within
that process the workload runs once as a warm-up, then ``--rounds`` measured
rounds; the table shows the median and the spread (min-max) per runtime and the
ratio tray/peer. Results go to bench/results/<date>-<time>.json, with a PNG chart
of the same next to it."""

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
from dataclasses import dataclass

HERE = os.path.dirname(os.path.abspath(__file__))
RUNTIMES = ("tray", "ray", "dask")
MARK = "BENCH-RESULT "


@dataclass(frozen=True)
class Metric:
    name: str
    unit: str
    higher_is_better: bool = True
    rows: tuple[str, ...] = ()  # sub-rows (p50/p99, worker counts); () is one row
    dask: str = ""  # how Dask does it, or why it cannot ("n/a: ...")

    def row_names(self) -> list[str]:
        return [f"{self.name}, {row}" for row in self.rows] if self.rows else [self.name]


SCALING = ("1 worker", "2 workers", "4 workers")
NA = "n/a: "

# The order of the table. Names up to "placement group" are Ray's (ray_perf.py).
METRICS = [
    Metric("single client get calls (Plasma Store)", "calls/s",
           dask="Future.result() of a scattered value"),
    Metric("single client put calls (Plasma Store)", "calls/s",
           dask="Client.scatter(0, hash=False)"),
    Metric("multi client put calls (Plasma Store)", "calls/s",
           dask="10 tasks, each scatter()s 100 values through worker_client()"),
    Metric("single client put gigabytes", "GB/s", dask="Client.scatter(array, hash=False)"),
    Metric("multi client put gigabytes", "GB/s",
           dask="4 tasks, each scatter()s two arrays through worker_client()"),
    Metric("single client tasks and get batch", "batches/s",
           dask="gather() of 1,000 submit()s"),
    Metric("single client get object containing 10k refs", "gets/s",
           dask=NA + "a Dask result cannot hold futures that the client then owns"),
    Metric("single client wait 1k refs", "rounds/s",
           dask="distributed.wait(FIRST_COMPLETED), taking one future at a time"),
    Metric("single client tasks sync", "tasks/s", dask="submit(f).result()"),
    Metric("nested fan-out (tasks submitting tasks)", "tasks/s",
           dask="a task submit()s 10 tasks that each submit() 10, through worker_client()"),
    Metric("single client tasks async", "tasks/s", dask="gather() of 1,000 submit()s"),
    Metric("multi client tasks async", "tasks/s",
           dask="4 tasks, each submit()s and gather()s through worker_client()"),
    Metric("1:1 actor calls sync", "calls/s", dask="Dask actor, method().result()"),
    Metric("1:1 actor calls async", "calls/s",
           dask="Dask actor, 1,000 method() calls, then their results"),
    Metric("1:1 actor calls concurrent", "calls/s",
           dask=NA + "Dask actors have no max_concurrency"),
    Metric("1:n actor calls async", "calls/s",
           dask="a task (not an actor) is the client of the actors"),
    Metric("n:n actor calls async", "calls/s", dask="4 tasks call the actors"),
    Metric("n:n actor calls with arg async", "calls/s",
           dask="a task per actor is the client; the argument is a value, not a ref"),
    Metric("1:1 async-actor calls sync", "calls/s", dask="Dask actor with async def methods"),
    Metric("1:1 async-actor calls async", "calls/s", dask="Dask actor with async def methods"),
    Metric("1:1 async-actor calls with args async", "calls/s",
           dask="Dask actor with async def methods"),
    Metric("1:n async-actor calls async", "calls/s",
           dask="a task (not an actor) is the client of the async actors"),
    Metric("n:n async-actor calls async", "calls/s", dask="4 tasks call the async actors"),
    Metric("placement group create/removal", "groups/s", dask=NA + "no placement groups"),
    Metric("init to first result", "s", higher_is_better=False,
           dask="LocalCluster(2 worker processes) + Client, then submit().result()"),
    Metric("shutdown", "s", higher_is_better=False, dask="client.close() + cluster.close()"),
    Metric("task round trip latency", "ms", higher_is_better=False, rows=("p50", "p99"),
           dask="submit(f).result()"),
    Metric("actor call latency", "ms", higher_is_better=False, rows=("p50", "p99"),
           dask="Dask actor, method().result()"),
    Metric("scaling, 0 ms tasks", "tasks/s", rows=SCALING,
           dask="LocalCluster(n_workers=N, threads_per_worker=1)"),
    Metric("scaling, 1 ms tasks", "tasks/s", rows=SCALING,
           dask="LocalCluster(n_workers=N, threads_per_worker=1)"),
    Metric("scaling, 10 ms tasks", "tasks/s", rows=SCALING,
           dask="LocalCluster(n_workers=N, threads_per_worker=1)"),
    Metric("put/get 80 MB array within a node", "GB/s",
           dask="scatter() then Future.result(): copies, over TCP to a worker and back"),
    Metric("get 80 MB array across two nodes", "GB/s",
           dask="an array made on a worker, fetched by the client (TCP)"),
    Metric("get 80 MB array across two nodes, copied", "GB/s",
           dask="the same as the row above (Dask always copies)"),
    Metric("user metric Counter.inc in tasks", "incs/s",
           dask=NA + "no user metrics API"),
    Metric("simulated tasks per wall-clock second", "tasks/s",
           dask=NA + "no simulator"),
    Metric("simtest seeds per minute (mixed workload)", "seeds/min",
           dask=NA + "no simulator"),
    # tray.data beside Ray Data (suite_data.py; the same code on both).
    Metric("data: parquet -> map_batches -> iter_batches", "per s", rows=("rows/s", "GB/s"),
           dask=NA + "no Ray Data equivalent measured"),
    Metric("data: peak store, parquet -> map_batches -> iter_batches", "MB",
           higher_is_better=False, dask=NA + "no Ray Data equivalent measured"),
    Metric("data: parquet -> map_batches on 2 actors -> iter_batches", "per s",
           rows=("rows/s", "GB/s"), dask=NA + "no Ray Data equivalent measured"),
    Metric("data: random_shuffle 1 GB", "GB/s", dask=NA + "no Ray Data equivalent measured"),
    Metric("data: sort 1 GB", "GB/s", dask=NA + "no Ray Data equivalent measured"),
    Metric("data: 2 GB through a 200 MB object store", "s", higher_is_better=False,
           dask=NA + "no Ray Data equivalent measured"),
    Metric("data: peak store, 2 GB through a 200 MB object store", "MB",
           higher_is_better=False, dask=NA + "no Ray Data equivalent measured"),
]
# tray.tune beside Ray Tune (bench/suite_tune.py: one suite, both runtimes).
import suite_tune  # noqa: E402 - imports neither tray nor ray

METRICS += [Metric(name, unit, higher_is_better=better, dask=NA + "no Tune")
            for name, unit, better in suite_tune.DEFINITIONS]
# tray.rllib beside Ray's RLlib (bench/suite_rllib.py: one suite, both runtimes).
import suite_rllib  # noqa: E402 - imports neither tray nor ray

METRICS += [Metric(name, unit, higher_is_better=better, rows=rows, dask=NA + "no RLlib")
            for name, unit, better, rows in suite_rllib.DEFINITIONS]
# tray.train beside Ray Train (bench/suite_train.py: one suite, both runtimes).
import suite_train  # noqa: E402 - imports neither tray nor ray

METRICS += [Metric(name, unit, higher_is_better=better, dask=NA + "no Train")
            for name, unit, better in suite_train.DEFINITIONS]
# tray.serve beside Ray Serve (bench/suite_serve.py: one suite, both runtimes).
import suite_serve  # noqa: E402 - imports neither tray nor ray

METRICS += [Metric(name, unit, higher_is_better=better, rows=rows, dask=NA + "no Serve")
            for name, unit, better, rows in suite_serve.DEFINITIONS]
NOT_IN_RAY = {"simulated tasks per wall-clock second": "no simulator",
              "simtest seeds per minute (mixed workload)": "no simulator"}


# ---------------------------------------------------------------- one metric, in a child

def child(runtime: str, name: str, rounds: int, quick: bool) -> None:
    """Run one metric of one runtime in this (fresh) process; print its result."""
    sys.path.insert(0, HERE)
    import harness

    harness.ROUNDS, harness.SCALE = rounds, (0.1 if quick else 1.0)
    try:
        if name in suite_tune.NAMES:
            function = suite_tune.metric_for(runtime, name)
        elif name in suite_rllib.NAMES:
            function = suite_rllib.metric_for(runtime, name)
        elif name in suite_train.NAMES:
            function = suite_train.metric_for(runtime, name)
        elif name in suite_serve.NAMES:
            function = suite_serve.metric_for(runtime, name)
        else:
            suite = __import__(f"suite_{runtime}")
            function = suite.METRICS.get(name)
        if function is None and name.startswith("data: "):
            import suite_data

            function = suite_data.metrics(runtime).get(name)
        if function is None:
            raise harness.NotAvailable("no equivalent")
        result = {"values": function()}
    except harness.NotAvailable as reason:
        result = {"na": str(reason)}
    sys.stdout.flush()
    print("\n" + MARK + json.dumps(result), flush=True)


def _summary(values: list[float]) -> dict:
    return {"values": values, "median": statistics.median(values), "min": min(values),
            "max": max(values)}


def run_one(runtime: str, metric: Metric, rounds: int, quick: bool, timeout: float) -> dict:
    """{row name: summary or {"na": why} or {"error": text}} for one metric."""
    if runtime == "ray" and metric.name in NOT_IN_RAY:
        return {row: {"na": NOT_IN_RAY[metric.name]} for row in metric.row_names()}
    if runtime == "dask" and metric.dask.startswith(NA):
        return {row: {"na": metric.dask[len(NA):]} for row in metric.row_names()}
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [HERE, os.path.dirname(HERE), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
    code = (f"import sys; sys.path.insert(0, {HERE!r}); import run; "
            f"run.child({runtime!r}, {metric.name!r}, {rounds}, {quick})")
    try:
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              timeout=timeout, env=env, cwd=os.path.dirname(HERE))
    except subprocess.TimeoutExpired:
        return {row: {"error": f"timed out after {timeout:.0f} s"}
                for row in metric.row_names()}
    lines = [line for line in done.stdout.splitlines() if line.startswith(MARK)]
    if done.returncode != 0 or not lines:
        error = (done.stderr or done.stdout)[-1500:]
        return {row: {"error": error} for row in metric.row_names()}
    result = json.loads(lines[-1][len(MARK):])
    if "na" in result:
        return {row: {"na": result["na"]} for row in metric.row_names()}
    values = result["values"]
    if isinstance(values, dict):
        return {f"{metric.name}, {key}": _summary(value) for key, value in values.items()}
    return {metric.name: _summary(values)}


# ---------------------------------------------------------------- table

def _number(value: float) -> str:
    if value >= 100:
        return f"{value:,.0f}"
    if value >= 10:
        return f"{value:.1f}"
    return f"{value:.3g}"


def _cell(cell: dict | None) -> str:
    if cell is None:
        return ""
    if "na" in cell:
        return f"n/a ({cell['na']})"
    if "error" in cell:
        return "FAILED"
    return f"{_number(cell['median'])} ({_number(cell['min'])}–{_number(cell['max'])})"


def ratio(tray_cell: dict | None, peer_cell: dict | None) -> float | None:
    if not tray_cell or not peer_cell or "median" not in tray_cell \
            or "median" not in peer_cell or not peer_cell["median"]:
        return None
    return tray_cell["median"] / peer_cell["median"]


def table(record: dict) -> str:
    """The results as a Markdown table: median (min–max) per runtime, tray/peer."""
    runtimes = record["runtimes"]
    peers = [r for r in runtimes if r != "tray"]
    header = ["metric", "unit"]
    for runtime in runtimes:
        header.append(runtime)
        if runtime != "tray":
            header.append(f"tray/{runtime}")
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in record["rows"]:
        unit = row["unit"] + ("" if row["higher_is_better"] else " (lower is better)")
        cells = [row["name"], unit]
        for runtime in runtimes:
            cells.append(_cell(row["results"].get(runtime)))
            if runtime in peers:
                value = ratio(row["results"].get("tray"), row["results"].get(runtime))
                cells.append("" if value is None else f"{value:.2f}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _compile_tray() -> None:
    """Give tray's modules their bytecode, as Ray's and every installed
    wheel's have. An editable install ships none, and where
    PYTHONDONTWRITEBYTECODE is set (these machines) every process of a run
    (each node, each fresh worker) would compile tray's sources again:
    measured, init to first result 0.89-0.95 s without, 0.61-0.63 s with."""
    import compileall

    import tray

    compileall.compile_dir(os.path.dirname(tray.__file__), quiet=1, workers=0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--peers", default="",
                        help="comma-separated runtimes to run beside tray: ray, dask")
    parser.add_argument("--only", default="",
                        help="run the metrics whose name contains this (comma: any of these)")
    parser.add_argument("--rounds", type=int, default=5, help="measured rounds (default 5)")
    parser.add_argument("--quick", action="store_true",
                        help="one round, every operation count 10x smaller (a smoke test)")
    parser.add_argument("--json", default="", help="where to write the results")
    parser.add_argument("--no-chart", action="store_true", help="skip the PNG chart")
    parser.add_argument("--timeout", type=float, default=900,
                        help="seconds allowed per metric per runtime")
    args = parser.parse_args(argv)
    rounds = 1 if args.quick else args.rounds
    peers = [p.strip() for p in args.peers.split(",") if p.strip()]
    for peer in peers:
        if peer not in RUNTIMES or peer == "tray":
            parser.error(f"unknown peer {peer!r}; known: ray, dask")
    runtimes = ["tray", *peers]
    patterns = [p.strip() for p in args.only.split(",")] if args.only else [""]
    metrics = [m for m in METRICS if any(p in m.name for p in patterns)]
    if not metrics:
        parser.error(f"no metric matches --only {args.only!r}")
    _compile_tray()
    versions = _versions(runtimes)
    started = datetime.datetime.now().astimezone()
    rows = {row: {} for metric in metrics for row in metric.row_names()}
    load_before = os.getloadavg()
    # One runtime after another: all of tray's metrics, then Ray's, then Dask's.
    for runtime in runtimes:
        for metric in metrics:
            began = time.perf_counter()
            results = run_one(runtime, metric, rounds, args.quick, args.timeout)
            for row, cell in results.items():
                rows.setdefault(row, {})[runtime] = cell
                print(f"{runtime:<5} {row:<52} {_cell(cell):<36} "
                      f"[{time.perf_counter() - began:.1f} s]", flush=True)
                if "error" in cell:
                    print("      " + cell["error"].replace("\n", "\n      "), flush=True)
    record = {
        "date": started.isoformat(timespec="seconds"),
        "machine": {"platform": platform.platform(), "python": platform.python_version(),
                    "cpus": os.cpu_count(), "memory_gb": _memory_gb()},
        "loadavg_before": load_before, "loadavg_after": os.getloadavg(),
        "versions": versions, "runtimes": runtimes, "rounds": rounds, "quick": args.quick,
        "rows": [],
    }
    others = {name for other in metrics for name in other.row_names()}
    for metric in metrics:
        names = list(metric.row_names())
        # Sub-rows a metric named as it ran, not another metric whose name
        # extends this one's ("get 80 MB array across two nodes, copied").
        names += [r for r in rows if r.startswith(metric.name + ", ") and r not in names
                  and r not in others]
        for name in names:
            record["rows"].append({"name": name, "metric": metric.name, "unit": metric.unit,
                                   "higher_is_better": metric.higher_is_better,
                                   "dask_method": metric.dask, "results": rows.get(name, {})})
    stamp = started.strftime("%Y-%m-%d-%H%M%S")
    path = args.json or os.path.join(HERE, "results", stamp + ".json")
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as file:
        json.dump(record, file, indent=2)
    print()
    print(f"{record['date']}, {record['machine']['platform']}, {record['machine']['cpus']} "
          f"CPUs, Python {record['machine']['python']}; "
          + ", ".join(f"{k} {v}" for k, v in versions.items())
          + f"; rounds {rounds}{' (quick)' if args.quick else ''}; load average "
          f"{_load(load_before)} before, {_load(record['loadavg_after'])} after")
    print()
    print(table(record))
    print()
    print(f"results: {path}")
    if not args.no_chart:
        try:
            import chart

            png = chart.write(record, os.path.splitext(path)[0] + ".png")
            print(f"chart:   {png}")
        except ImportError as error:
            print(f"chart:   skipped ({error}; pip install matplotlib)")
    failed = [row["name"] for row in record["rows"]
              if any("error" in cell for cell in row["results"].values())]
    if failed:
        print(f"FAILED: {', '.join(failed)}")
    return 1 if failed else 0


def _load(load: tuple) -> str:
    return "/".join(f"{x:.2f}" for x in load)


def _memory_gb() -> float | None:
    try:
        return round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)
    except (ValueError, OSError, AttributeError):
        return None


def _versions(runtimes: list[str]) -> dict:
    from importlib import metadata

    versions = {}
    for runtime in runtimes:
        package = {"dask": "distributed"}.get(runtime, runtime)
        try:
            versions[runtime] = metadata.version(package)
        except metadata.PackageNotFoundError:
            versions[runtime] = "not installed"
    return versions


if __name__ == "__main__":
    sys.path.insert(0, HERE)
    sys.exit(main())
