"""Cost as work grows (issue 14): each curve is time per operation against N,
which should stay flat, plus memory where the issue asks for it. Run by hand:

    python3 bench/scale_curves.py            # every curve, every point (long)
    python3 bench/scale_curves.py --quick    # the smallest points: a smoke run
    python3 bench/scale_curves.py --only actors --only sim_cluster

The curves:

* ``tasks``: N no-op tasks submitted at once: time to submit, time from the
  last submission to the last result, and the driver's and the nodes' RSS
  growth per pending task (measured right after the last submission). Real
  processes (``backend="local"``, 2 CPUs) for 10k and 100k; 1M in the
  simulator (``backend="sim"``), where one process holds the driver, the
  node and the workers, so its RSS is all of them.
* ``objects``: N small live objects owned by one driver (real processes):
  ``put`` per object, ``get`` of all per object, and freeing them (dropping
  the refs, then until the driver's reference table is empty).
* ``actors``: N actors created and called once: real processes for 100
  (each actor is a worker process), the simulator for 100, 1,000 and 5,000
  (on one simulated node per 200 actors: a node runs at most 256 workers).
* ``sim_cluster``: a simulated cluster of 10, 100 and 1,000 nodes (one CPU
  each) running ``--sim-tasks`` tasks (100k by default; each takes 10 ms of
  virtual time): wall CPU per task and per simulated node-second, the
  start-up cost, and an idle second of heartbeats (the GCS's view and every
  node's heartbeat: what scales with the cluster's size, not the work).

Each point runs in a fresh process (``--point``), so memory figures are not
polluted by the previous point and a point that blows a limit fails alone.
Every point records CPU seconds (``time.process_time`` of the driver plus
its finished children where real processes run) next to wall seconds and
the load average, since the machine is shared. The record goes to
``bench/results/scale-<date>.json`` and a chart next to it (bench/chart.py,
``write_scale``). Everything runs on 127.0.0.1 (tray's local backend binds
loopback only)."""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))

# (curve, backend, N): the full run; --quick keeps the first point of each.
# Backend "ray": Ray's own runtime on the same curve, in the bench's
# environment (--ray-python), on loopback; --peers ray adds those points.
# "sim1": every actor on ONE simulated node (workers_per_node_max raised to
# fit: the default cap of 256 workers is the memory bound of real processes).
POINTS = {
    "tasks": [("local", 10_000), ("local", 100_000), ("local", 1_000_000), ("sim", 10_000),
              ("sim", 100_000), ("sim", 1_000_000)],
    "objects": [("local", 1_000), ("local", 10_000), ("local", 100_000)],
    "actors": [("local", 100), ("sim", 100), ("sim", 1_000), ("sim", 5_000),
               ("sim1", 1_000), ("sim1", 5_000)],
    "sim_cluster": [("sim", 10), ("sim", 100), ("sim", 1_000)],
}
PEER_POINTS = {
    "tasks": [("ray", 10_000), ("ray", 100_000)],
    "objects": [("ray", 1_000), ("ray", 10_000), ("ray", 100_000)],
    "actors": [("ray", 100)],
}
QUICK = {
    "tasks": [("local", 2_000), ("sim", 2_000)],
    "objects": [("local", 1_000)],
    "actors": [("local", 10), ("sim", 100)],
    "sim_cluster": [("sim", 10)],
}
QUICK_PEER_POINTS = {"tasks": [("ray", 2_000)], "objects": [("ray", 1_000)],
                     "actors": [("ray", 10)]}
ACTORS_PER_SIM_NODE = 200
DEFAULT_RAY_PYTHON = os.path.join(os.path.dirname(HERE), ".nox", "bench", "bin", "python")
# A point that has not finished in this long is reported as such.
POINT_TIMEOUT_S = 900


def _rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/statm") as file:
        return int(file.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _children_rss_bytes() -> int:
    """RSS of every live descendant of this process (the local backend's
    GCS, node managers and workers)."""
    import psutil

    total = 0
    for child in psutil.Process().children(recursive=True):
        try:
            total += child.memory_info().rss
        except psutil.Error:
            pass
    return total


def _children_cpu_s() -> float:
    """CPU seconds of live descendants (finished ones are in RUSAGE_CHILDREN)."""
    import psutil

    total = 0.0
    for child in psutil.Process().children(recursive=True):
        try:
            times = child.cpu_times()
            total += times.user + times.system
        except psutil.Error:
            pass
    return total


def _cpu_s() -> float:
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + children.ru_utime + children.ru_stime + _children_cpu_s()


def _init(backend: str, **options):
    """tray (local or simulated), or Ray: the module, started."""
    if backend == "ray":
        os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # its connections on loopback
        import ray

        ray.init(num_cpus=options.pop("num_cpus", 2), include_dashboard=False,
                 logging_level="ERROR", log_to_driver=False, _node_ip_address="127.0.0.1")
        return ray
    import tray

    if backend in ("sim", "sim1"):
        tray.init(backend="sim", seed=options.pop("seed", 0), **options)
    else:
        tray.init(num_cpus=options.pop("num_cpus", 2), **options)
    return tray


# ------------------------------------------------------------------ points


def point_tasks(backend: str, n: int) -> dict:
    tray = _init(backend, num_cpus=2)

    @tray.remote
    def noop():
        return None

    tray.get(noop.remote())  # a worker is up: the first task's start is not measured
    rss_driver = _rss_bytes(os.getpid())
    real = backend in ("local", "ray")
    rss_nodes = _children_rss_bytes() if real else 0
    cpu0, wall0 = _cpu_s(), time.perf_counter()
    refs = [noop.remote() for _ in range(n)]
    wall_submit = time.perf_counter() - wall0
    grew_driver = _rss_bytes(os.getpid()) - rss_driver
    grew_nodes = (_children_rss_bytes() - rss_nodes) if real else 0
    wall1 = time.perf_counter()
    tray.get(refs)
    wall_results = time.perf_counter() - wall1
    cpu = _cpu_s() - cpu0
    del refs
    tray.shutdown()
    return {"submit_us_per_task": wall_submit / n * 1e6,
            "results_us_per_task": wall_results / n * 1e6,
            "cpu_us_per_task": cpu / n * 1e6,
            "driver_rss_bytes_per_pending_task": grew_driver / n,
            "nodes_rss_bytes_per_pending_task": grew_nodes / n if real else None}


def point_objects(backend: str, n: int) -> dict:
    tray = _init(backend, num_cpus=1)

    payload = b"x" * 100
    assert tray.get(tray.put(payload)) == payload  # started: the first put is not measured
    rss0 = _rss_bytes(os.getpid())
    cpu0, wall0 = time.process_time(), time.perf_counter()
    refs = [tray.put(payload) for _ in range(n)]
    wall_put, cpu_put = time.perf_counter() - wall0, time.process_time() - cpu0
    grew = _rss_bytes(os.getpid()) - rss0
    wall0 = time.perf_counter()
    values = tray.get(refs)
    wall_get = time.perf_counter() - wall0
    assert len(values) == n
    del values
    if backend == "ray":  # (its reference table is not public: not measured)
        wall_free = None
        del refs
    else:
        from tray.core.context import get_worker

        references = get_worker().references
        held = len(references.refs)
        wall0 = time.perf_counter()
        del refs
        deadline = time.monotonic() + 60
        while len(references.refs) > held - n and time.monotonic() < deadline:
            time.sleep(0.001)
        wall_free = time.perf_counter() - wall0
    tray.shutdown()
    return {"put_us_per_object": wall_put / n * 1e6, "put_cpu_us_per_object": cpu_put / n * 1e6,
            "get_us_per_object": wall_get / n * 1e6,
            "free_us_per_object": None if wall_free is None else wall_free / n * 1e6,
            "driver_rss_bytes_per_object": grew / n}


def point_actors(backend: str, n: int) -> dict:
    # A node runs at most ``workers_per_node_max`` (256) workers, so many
    # actors need many nodes: the simulator gets one per ACTORS_PER_SIM_NODE.
    if backend == "sim":
        tray = _init(backend, num_cpus=2, num_nodes=max(1, -(-n // ACTORS_PER_SIM_NODE)))
    elif backend == "sim1":
        from tray.core.config import Config

        tray = _init(backend, num_cpus=2, num_nodes=1,
                     config=Config(workers_per_node_max=n + 16))
    else:
        tray = _init(backend, num_cpus=2)

    @tray.remote(num_cpus=0)
    class Counter:
        def __init__(self):
            self.count = 0

        def add(self):
            self.count += 1
            return self.count

    cpu0, wall0 = _cpu_s(), time.perf_counter()
    actors = [Counter.remote() for _ in range(n)]
    assert tray.get([actor.add.remote() for actor in actors]) == [1] * n
    wall = time.perf_counter() - wall0
    cpu = _cpu_s() - cpu0
    rss = _rss_bytes(os.getpid()) + (_children_rss_bytes() if backend in ("local", "ray")
                                     else 0)
    result = {"create_and_call_ms_per_actor": wall / n * 1e3,
              "cpu_ms_per_actor": cpu / n * 1e3, "rss_bytes_per_actor": rss / n}
    if backend in ("sim", "sim1"):
        # Idle actors should cost no host CPU: every process woke each task
        # events flush period with nothing to send.
        from tray.simtest import cluster as current_cluster

        cpu0 = time.process_time()
        current_cluster().advance(10.0)
        result["idle_cpu_ms_per_actor_second"] = (time.process_time() - cpu0) / 10.0 / n * 1e3
    # Out before the kills: the parent reads the last line even on a timeout.
    print(json.dumps(result), flush=True)
    # Killed one `tray.kill` at a time, each waited for (the GCS's handling
    # of a worker's death and a closed connection was a scan of every actor).
    cpu0, wall0 = _cpu_s(), time.perf_counter()
    for actor in actors:
        tray.kill(actor)
    if backend in ("sim", "sim1"):
        from tray.simtest import cluster as current_cluster

        current_cluster().advance(1.0)  # every death handled
    # (Real processes: a killed worker's CPU time goes to its node process's
    # children account, out of reach here; only the simulator's is counted.)
    result.update(kill_ms_per_actor=(time.perf_counter() - wall0) / n * 1e3,
                  kill_cpu_ms_per_actor=(_cpu_s() - cpu0) / n * 1e3
                  if backend in ("sim", "sim1") else None)
    print(json.dumps(result), flush=True)
    tray.shutdown()
    return result


def point_sim_cluster(backend: str, nodes: int, tasks: int) -> dict:
    import tray
    from tray.simtest import cluster as current_cluster

    cpu0 = time.process_time()
    tray.init(backend="sim", seed=0, num_nodes=nodes, num_cpus=1, task_cost_s=0.01)
    cluster = current_cluster()
    cluster.advance(1.0)  # every node registered and heartbeating
    start_cpu = time.process_time() - cpu0
    cpu0 = time.process_time()
    cluster.advance(1.0)
    idle_cpu = time.process_time() - cpu0

    @tray.remote
    def work(i):
        return i

    virtual0 = cluster.clock.current_time()
    cpu0 = time.process_time()
    done = 0
    batch = 10_000  # submitted in batches: the cluster works while the driver submits
    while done < tasks:
        count = min(batch, tasks - done)
        assert sum(tray.get([work.remote(i) for i in range(count)])) == count * (count - 1) // 2
        done += count
    run_cpu = time.process_time() - cpu0
    virtual = cluster.clock.current_time() - virtual0
    rss = _rss_bytes(os.getpid())
    tray.shutdown()
    return {"start_cpu_s": start_cpu, "idle_cpu_s_per_virtual_s": idle_cpu,
            "idle_cpu_ms_per_node_second": idle_cpu / nodes * 1e3,
            "cpu_us_per_task": run_cpu / tasks * 1e6, "virtual_s": virtual,
            "tasks": tasks, "rss_bytes": rss}


def run_point(curve: str, backend: str, n: int, sim_tasks: int) -> dict:
    if curve == "sim_cluster":
        return point_sim_cluster(backend, n, sim_tasks)
    return {"tasks": point_tasks, "objects": point_objects,
            "actors": point_actors}[curve](backend, n)


# -------------------------------------------------------------------- main


def _run_isolated(curve: str, backend: str, n: int, sim_tasks: int,
                  ray_python: str = DEFAULT_RAY_PYTHON,
                  timeout_s: float = POINT_TIMEOUT_S) -> dict:
    load = os.getloadavg()
    started = time.perf_counter()
    python = ray_python if backend == "ray" else sys.executable
    try:
        done = subprocess.run(
            [python, os.path.abspath(__file__), "--point", f"{curve}:{backend}:{n}",
             "--sim-tasks", str(sim_tasks)],
            capture_output=True, text=True, timeout=timeout_s,
            env={**os.environ, "PYTHONPATH": os.path.dirname(HERE) + os.pathsep +
                 os.environ.get("PYTHONPATH", "")})
    except subprocess.TimeoutExpired as timeout:
        output = timeout.stdout.decode() if isinstance(timeout.stdout, bytes) else \
            timeout.stdout or ""
        lines = [line for line in output.splitlines() if line.startswith("{")]
        if lines:  # measured, then stuck in its teardown
            return {**json.loads(lines[-1]), "load": load,
                    "note": f"teardown did not finish in {timeout_s} s"}
        return {"error": f"did not finish in {timeout_s} s", "load": load}
    wall = time.perf_counter() - started
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        return {"error": (done.stderr or done.stdout).strip().splitlines()[-1:] or
                [f"exit {done.returncode}"], "load": load, "wall_s": wall}
    result = json.loads(lines[-1])
    result.update(load=load, wall_s=wall)
    return result


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the smallest points only")
    parser.add_argument("--only", action="append", choices=sorted(POINTS),
                        help="run only this curve (repeatable)")
    parser.add_argument("--sim-tasks", type=int, default=None,
                        help="tasks per sim_cluster point (default 100,000; 2,000 with --quick)")
    parser.add_argument("--min-n", type=int, default=None,
                        help="skip the points below this N")
    parser.add_argument("--max-n", type=int, default=None,
                        help="skip the points above this N (what fits the time at hand)")
    parser.add_argument("--peers", default="", help="'ray': add Ray's points (tasks, objects, "
                        "actors) from --ray-python")
    parser.add_argument("--ray-python", default=DEFAULT_RAY_PYTHON,
                        help="an interpreter with Ray installed (the nox bench env's)")
    parser.add_argument("--backend", action="append",
                        help="run only this backend's points (local, sim, sim1, ray; "
                             "repeatable)")
    parser.add_argument("--timeout-s", type=float, default=POINT_TIMEOUT_S,
                        help="a point not finished in this long is reported as such")
    parser.add_argument("--out", default=os.path.join(HERE, "results"))
    parser.add_argument("--point", help=argparse.SUPPRESS)  # curve:backend:N, in a child
    args = parser.parse_args(argv)
    sim_tasks = args.sim_tasks or (2_000 if args.quick else 100_000)
    if args.point:
        curve, backend, n = args.point.split(":")
        print(json.dumps(run_point(curve, backend, int(n), sim_tasks)), flush=True)
        return 0
    points = {curve: list(rows) for curve, rows in (QUICK if args.quick else POINTS).items()}
    if "ray" in args.peers.split(","):
        for curve, rows in (QUICK_PEER_POINTS if args.quick else PEER_POINTS).items():
            points[curve] += rows
    record = {"date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
              "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
              "quick": args.quick, "sim_tasks": sim_tasks, "max_n": args.max_n,
              "argv": sys.argv[1:] if argv is None else list(argv), "curves": {}}
    os.makedirs(args.out, exist_ok=True)
    stamp = time.strftime("%Y-%m-%d-%H%M%S", time.gmtime())
    path = os.path.join(args.out, f"scale-{stamp}{'-quick' if args.quick else ''}.json")
    for curve in args.only or sorted(points):
        rows = record["curves"][curve] = []
        for backend, n in points[curve]:
            if args.max_n is not None and n > args.max_n or \
                    args.min_n is not None and n < args.min_n or \
                    args.backend and backend not in args.backend:
                continue
            result = _run_isolated(curve, backend, n, sim_tasks, args.ray_python,
                                   args.timeout_s)
            rows.append({"backend": backend, "n": n, **result})
            print(f"{curve:12} {backend:5} N={n:>9,}  " + "  ".join(
                f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                for k, v in result.items() if k != "load") +
                f"  load={result['load'][0]:.1f}", flush=True)
            # Written after every point: a long run cut short keeps what it measured.
            with open(path, "w") as file:
                json.dump(record, file, indent=1)
    print(f"wrote {path}")
    try:
        sys.path.insert(0, HERE)
        import chart

        print(f"wrote {chart.write_scale(record, path[:-len('.json')] + '.png')}")
    except ImportError as error:  # matplotlib is the bench's, not tray's
        print(f"no chart: {error}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
