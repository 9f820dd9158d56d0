"""The autoscaler at scale, in the simulator: a burst of tasks onto a cluster
that grows from its head to up to ``--max-nodes`` simulated worker nodes and
back (issue 22's demonstration). Prints the wall time this process took and
the virtual time the cluster lived through, per phase.

    python3 bench/autoscaler_scale.py --tasks 10000 --max-nodes 1000

Ray has no counterpart (its autoscaler needs real or fake-multinode machines,
one process per node). Each task needs one unit of ``work``, which only the
autoscaled node type has (10 per node), and sleeps ``--task-s`` of virtual
time. ``pending_lease_requests_max`` is raised to the burst's size so that
the whole backlog is visible as demand (tray's lease requests do not carry a
backlog count yet: with the default of 16 a single owner shows at most 16
queued requests per scheduling class, and the cluster grows by that much per
round). Heartbeats every ``--heartbeat-s`` (2 s; tray's default is 0.5 s):
each heartbeat reply carries the whole cluster view, so a simulated second
costs O(nodes^2) and that, not the autoscaler, bounds the size simulated in
reasonable time (see bench/README.md)."""

from __future__ import annotations

import argparse
import json
import time


def main(argv=None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tasks", type=int, default=10_000)
    parser.add_argument("--max-nodes", type=int, default=1_000)
    parser.add_argument("--per-node", type=int, default=10)
    parser.add_argument("--task-s", type=float, default=30.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--heartbeat-s", type=float, default=2.0)
    args = parser.parse_args(argv)

    import tray
    import tray.autoscaler as autoscaler
    from tray.core.config import Config
    from tray.simtest import cluster, trace_digest

    config = {
        "max_workers": args.max_nodes, "upscaling_speed": 2.0, "idle_timeout_minutes": 1.0,
        "autoscaler_period_s": 5.0, "head_node_type": "head",
        "available_node_types": {
            "head": {"resources": {}, "max_workers": 0},
            "worker": {"resources": {"CPU": args.per_node, "work": args.per_node},
                       "max_workers": args.max_nodes}},
        "provider": {"type": "sim", "boot_delay_s": [10.0, 30.0]},
    }
    started = time.perf_counter()
    tray.init(backend="sim", seed=args.seed, num_cpus=1,
              config=Config(pending_lease_requests_max=args.tasks,
                            heartbeat_period_s=args.heartbeat_s))
    sim = cluster()
    monitor = autoscaler.start(config)

    @tray.remote(resources={"work": 1})
    def job(i):
        time.sleep(args.task_s)
        return i

    def alive_workers() -> int:
        return sum(1 for node in monitor.provider.nodes() if node.state == "running")

    peak = {"nodes": 0, "launched": 0, "terminated": 0}
    original = monitor.run_once

    async def counting_round():
        decisions = await original()
        peak["nodes"] = max(peak["nodes"], alive_workers())
        peak["launched"] += sum(d.count for d in decisions if d.action == "launch")
        peak["terminated"] += sum(1 for d in decisions if d.action == "terminate")
        return decisions
    monitor.run_once = counting_round

    v0, w0 = sim.clock.current_time(), time.perf_counter()
    refs = [job.remote(i) for i in range(args.tasks)]
    assert tray.get(refs) == list(range(args.tasks))
    v1, w1 = sim.clock.current_time(), time.perf_counter()
    del refs
    while alive_workers() > 0 and sim.clock.current_time() - v1 < 3600:
        time.sleep(10.0)  # virtual: the driver's sleep advances the simulation
    v2, w2 = sim.clock.current_time(), time.perf_counter()
    result = {
        "tasks": args.tasks, "max_nodes": args.max_nodes, "per_node": args.per_node,
        "task_s": args.task_s, "heartbeat_s": args.heartbeat_s, "peak_worker_nodes": peak["nodes"],
        "launched": peak["launched"], "terminated": peak["terminated"],
        "left_after_scale_down": alive_workers(),
        "burst_virtual_s": round(v1 - v0, 1), "burst_wall_s": round(w1 - w0, 1),
        "scale_down_virtual_s": round(v2 - v1, 1), "scale_down_wall_s": round(w2 - w1, 1),
        "total_wall_s": round(time.perf_counter() - started, 1), "digest": trace_digest(),
        "violations": monitor.provider.violations[:3],
    }
    tray.shutdown()
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
