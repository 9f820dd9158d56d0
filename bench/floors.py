"""The floors under issue 14's unmet goals: what this machine and tray's
design cost before any of tray's own work on a task or actor call.

    python3 bench/floors.py [--only init,latency,rpc,cpu] [--rounds N] [--out DIR]

Four measurements, each against the goal it bounds (bench/README.md reads
them):

* **init**: the wall time of a fresh interpreter that only imports (min of
  ``--rounds`` runs each): nothing, trio, the third-party modules a worker
  needs, tray's worker stack, tray's node stack. A first result needs a node
  process and a worker process that have imported these, so "init to first
  result <= 0.3 s" is bounded below by them.
* **latency**: a blocking round trip of 40 bytes between two processes over
  a Unix socket pair, no tray and no trio, timed call by call in six rounds
  of 500 (``harness.percentiles``, the bench's latency loop: p50, p99,
  p99/p50 per round); then the same with each call handed
  from a caller thread to a second thread that does the I/O, as a tray
  driver's user thread hands calls to its loop thread. "p99 <= 2x p50" is
  bounded below by what this machine's scheduler does to a bare round trip.
* **rpc**: tray's RPC layer alone (``tray.core.rpc.Endpoint`` over its Unix
  socket transport) between two processes, with a handler that returns at
  once: calls per second one at a time (sync) and 1,000 in flight (async),
  and the CPU per call on each side. Every task or actor call is one such
  call plus the runtime's work, so "3x Ray" is bounded above by it.
* **cpu**: where a task's or actor call's CPU goes, by process: each
  workload of a goal not met (the bench's own shapes, ``suite_raylike``) runs
  on a fresh one-node cluster, and ``psutil`` reads the CPU time of the
  driver, the node process and the workers (actors included) around each of
  ``CPU_ROUNDS`` rounds of a second or more: CPU per operation in each, and the wall time. On two
  cores a throughput goal is a CPU budget: 3x Ray's rate allows at most
  ``2 / (3 x rate)`` seconds of CPU per operation across all processes.

Speeds are measured here, never asserted; loopback only (a socket pair and a
Unix socket)."""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from queue import SimpleQueue

from harness import percentiles

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

IMPORTS = [
    ("a bare interpreter", "pass"),
    ("import trio", "import trio"),
    ("+ cloudpickle, greenback, psutil", "import trio, cloudpickle, greenback, psutil"),
    ("tray's worker stack", "import tray.backends.local.worker"),
    ("tray's node stack", "import tray.backends.local.node"),
]
LATENCY_ROUNDS, LATENCY_ROUND = 6, 500
RPC_CALLS = 5_000
CPU_ROUNDS, CPU_ROUND_S = 5, 1.0
CPU_WORKLOADS = ["tasks sync", "tasks async", "nested fan-out", "1:1 actor calls sync",
                 "1:1 actor calls async", "n:n actor calls async", "1:1 async-actor calls sync",
                 "1:1 async-actor calls async"]


# ------------------------------------------------------------------- init


def floor_init(rounds: int) -> dict:
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    rows = {}
    for label, statement in IMPORTS:
        times = []
        for _ in range(rounds):
            started = time.perf_counter()
            subprocess.run([sys.executable, "-c", statement], check=True, env=env)
            times.append(time.perf_counter() - started)
        rows[label] = {"min_s": min(times), "median_s": statistics.median(times)}
    return rows


# ---------------------------------------------------------------- latency


def floor_latency() -> dict:
    ours, theirs = socket.socketpair()
    pid = os.fork()
    if pid == 0:  # the echo: blocking reads and writes, nothing else
        ours.close()
        while True:
            message = theirs.recv(64)
            if not message:
                os._exit(0)
            theirs.sendall(message)
    theirs.close()

    def round_trip() -> None:
        ours.sendall(b"x" * 40)
        ours.recv(64)

    requests: SimpleQueue = SimpleQueue()
    replies: SimpleQueue = SimpleQueue()

    def io_thread() -> None:
        while requests.get():
            round_trip()
            replies.put(True)

    def through_a_thread() -> None:
        requests.put(True)
        replies.get()

    thread = threading.Thread(target=io_thread, daemon=True)
    thread.start()
    results = {}
    try:
        for label, call in (("one thread", round_trip),
                            ("handed to a second thread", through_a_thread)):
            # The bench's own latency loop (ms per round), as tray's rows use it.
            rounds = percentiles(call, LATENCY_ROUND, LATENCY_ROUNDS)
            results[label] = {
                "p50_us": statistics.median(rounds["p50"]) * 1e3,
                "p99_us": statistics.median(rounds["p99"]) * 1e3,
                "p99_over_p50_by_round": [round(p99 / p50, 2) for p50, p99
                                          in zip(rounds["p50"], rounds["p99"], strict=True)]}
    finally:
        requests.put(False)
        thread.join()
        ours.close()
        os.waitpid(pid, 0)
    return results


# -------------------------------------------------------------------- rpc

TOKEN = b"floors-bench-token-0123456789"
PAYLOAD = ("f", b"y" * 300, {"k": 1, "j": "abc"}, 7, None)  # about a call's size


def _env(address: str):
    from tray.core.config import DEFAULT_CONFIG
    from tray.core.interfaces import NullTracer, ProcessEnv
    from tray.transports.tcp import TcpTransport

    return ProcessEnv(address=address, transport=TcpTransport(TOKEN),
                      rng=random.Random(0), tracer=NullTracer(), config=DEFAULT_CONFIG)


def _rpc_server(address: str) -> None:
    import trio

    from tray.core.rpc import Endpoint

    async def serve() -> None:
        async with trio.open_nursery() as nursery:
            endpoint = Endpoint(_env(address), {"f": lambda conn, payload: b"x"}, nursery)
            await endpoint.serve()

    trio.run(serve)


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def floor_rpc() -> dict:
    import psutil
    import trio

    from tray.core.rpc import Endpoint

    directory = tempfile.mkdtemp(prefix="tray-floors-")
    server_address = f"unix:{directory}/server.sock"
    server = subprocess.Popen(
        [sys.executable, "-c", f"import sys; sys.path[:0] = [{ROOT!r}, {HERE!r}]; "
         f"import floors; floors._rpc_server({server_address!r})"])
    server_process = psutil.Process(server.pid)
    results = {}

    async def client(mode: str) -> dict:
        async with trio.open_nursery() as nursery:
            endpoint = Endpoint(_env(f"unix:{directory}/client.sock"), {}, nursery)
            deadline = time.monotonic() + 10
            while True:  # the server is up once it answers
                try:
                    await endpoint.call(server_address, "f", PAYLOAD)
                    break
                except Exception:  # noqa: BLE001 - not listening yet
                    if time.monotonic() > deadline:
                        raise
                    await trio.sleep(0.05)
            for _ in range(200):
                await endpoint.call(server_address, "f", PAYLOAD)
            server_cpu = sum(server_process.cpu_times()[:2])
            cpu, started = _cpu_s(), time.perf_counter()
            if mode == "sync":
                for _ in range(RPC_CALLS):
                    await endpoint.call(server_address, "f", PAYLOAD)
            else:
                for _ in range(RPC_CALLS // 1000):
                    async with trio.open_nursery() as batch:
                        for _ in range(1000):
                            batch.start_soon(endpoint.call, server_address, "f", PAYLOAD)
            wall = time.perf_counter() - started
            client_cpu = _cpu_s() - cpu
            server_cpu = sum(server_process.cpu_times()[:2]) - server_cpu
            nursery.cancel_scope.cancel()
        return {"calls_per_s": RPC_CALLS / wall, "client_cpu_us_per_call":
                client_cpu / RPC_CALLS * 1e6, "server_cpu_us_per_call":
                server_cpu / RPC_CALLS * 1e6}

    try:
        for mode in ("sync", "async"):
            results[mode] = trio.run(client, mode)
    finally:
        server.kill()
        server.wait()
        for name in os.listdir(directory):
            os.unlink(os.path.join(directory, name))
        os.rmdir(directory)
    return results


# -------------------------------------------------------------------- cpu


def _cpu_workloads() -> dict:
    """name -> the bench's own factory of that workload (``suite_raylike``):
    called once the cluster is up, it returns a body that does a round and
    returns how many operations it did."""
    import suite_raylike

    import tray

    suite_raylike.bind(tray)
    return {"tasks sync": suite_raylike.make_tasks_sync,
            "tasks async": suite_raylike.make_tasks_async,
            "nested fan-out": suite_raylike.make_nested_fan_out,
            "1:1 actor calls sync": suite_raylike.make_actor_calls(2, sync=True, count=500),
            "1:1 actor calls async": suite_raylike.make_actor_calls(2),
            "n:n actor calls async": suite_raylike.make_n_to_n(2),
            "1:1 async-actor calls sync": suite_raylike.make_actor_calls(3, sync=True,
                                                                         count=500),
            "1:1 async-actor calls async": suite_raylike.make_actor_calls(3)}


def _cpu_child(name: str, rounds: int) -> None:
    """Run one workload on a fresh cluster; print its rounds as JSON."""
    import psutil

    import tray

    make = _cpu_workloads()[name]
    tray.init(include_dashboard=False)
    me = psutil.Process()
    node_pids = {child.pid for child in me.children()}

    def cpu_by_role() -> dict:
        roles = {"driver": 0.0, "node": 0.0, "workers": 0.0}
        for process in [me] + me.children(recursive=True):
            try:
                times = process.cpu_times()
            except psutil.Error:
                continue  # (gone meanwhile: a worker that exited)
            role = "driver" if process.pid == me.pid else \
                "node" if process.pid in node_pids else "workers"
            roles[role] += times.user + times.system
        return roles

    try:
        body = make()
        body()  # warm-up: workers started, functions exported, actors created
        measured = []
        for _ in range(rounds):
            # (At least CPU_ROUND_S a round: psutil reads CPU time in 10 ms ticks.)
            before, started, count = cpu_by_role(), time.perf_counter(), 0
            while time.perf_counter() - started < CPU_ROUND_S:
                count += body()
            wall, after = time.perf_counter() - started, cpu_by_role()
            measured.append({"ops_per_s": count / wall,
                             **{f"{role}_us": (after[role] - before[role]) / count * 1e6
                                for role in before}})
    finally:
        tray.shutdown()
    print(json.dumps(measured))


def floor_cpu(workloads: list[str], rounds: int) -> dict:
    """workload -> the median of its rounds: ops/s and CPU per operation
    (us) in the driver, the node process, the workers, and in all."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [ROOT, HERE, os.environ.get("PYTHONPATH", "")])}
    results = {}
    for name in workloads:
        done = subprocess.run([sys.executable, os.path.abspath(__file__), "--cpu-child", name,
                               "--cpu-rounds", str(rounds)],
                              capture_output=True, text=True, env=env, timeout=600)
        if done.returncode != 0:
            raise RuntimeError(f"{name}: {done.stderr[-2000:]}")
        measured = json.loads(done.stdout.strip().splitlines()[-1])
        row = {key: statistics.median(r[key] for r in measured) for key in measured[0]}
        row["total_us"] = statistics.median(
            r["driver_us"] + r["node_us"] + r["workers_us"] for r in measured)
        results[name] = row
    return results


# ------------------------------------------------------------------- main


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="init,latency,rpc,cpu")
    parser.add_argument("--rounds", type=int, default=7, help="runs per import (init)")
    parser.add_argument("--out", default=os.path.join(HERE, "results"))
    parser.add_argument("--cpu-workloads", default=",".join(CPU_WORKLOADS),
                        help="the workloads of cpu (comma-separated)")
    parser.add_argument("--cpu-rounds", type=int, default=CPU_ROUNDS)
    parser.add_argument("--cpu-child", help=argparse.SUPPRESS)  # one workload of "cpu"
    args = parser.parse_args(argv)
    if args.cpu_child:
        _cpu_child(args.cpu_child, args.cpu_rounds)
        return 0
    sys.path.insert(0, ROOT)
    record = {"date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
              "load_before": os.getloadavg(), "cpus": os.cpu_count()}
    chosen = args.only.split(",")
    if "init" in chosen:
        record["init"] = rows = floor_init(args.rounds)
        for label, row in rows.items():
            print(f"init     {label:34} min {row['min_s'] * 1e3:6.0f} ms   "
                  f"median {row['median_s'] * 1e3:6.0f} ms", flush=True)
    if "latency" in chosen:
        record["latency"] = rows = floor_latency()
        for label, row in rows.items():
            print(f"latency  {label:34} p50 {row['p50_us']:5.0f} us  p99 {row['p99_us']:5.0f} us"
                  f"  p99/p50 by round {row['p99_over_p50_by_round']}", flush=True)
    if "rpc" in chosen:
        record["rpc"] = rows = floor_rpc()
        for mode, row in rows.items():
            print(f"rpc      {mode:34} {row['calls_per_s']:8,.0f} calls/s   CPU per call: "
                  f"client {row['client_cpu_us_per_call']:4.0f} us, server "
                  f"{row['server_cpu_us_per_call']:4.0f} us", flush=True)
    if "cpu" in chosen:
        workloads = [name.strip() for name in args.cpu_workloads.split(",") if name.strip()]
        unknown = sorted(set(workloads) - set(CPU_WORKLOADS))
        if unknown:
            parser.error(f"unknown workloads {unknown}; they are {CPU_WORKLOADS}")
        record["cpu"] = rows = floor_cpu(workloads, args.cpu_rounds)
        for name, row in rows.items():
            print(f"cpu      {name:34} {row['ops_per_s']:8,.0f} ops/s    CPU per op: driver "
                  f"{row['driver_us']:4.0f} us, node {row['node_us']:4.0f} us, workers "
                  f"{row['workers_us']:4.0f} us, all {row['total_us']:4.0f} us", flush=True)
    record["load_after"] = os.getloadavg()
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, f"floors-{time.strftime('%Y-%m-%d-%H%M%S', time.gmtime())}"
                                  ".json")
    with open(path, "w") as file:
        json.dump(record, file, indent=1)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
