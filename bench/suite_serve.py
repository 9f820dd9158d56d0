"""Serve's benchmarks, for tray.serve and Ray Serve with the same code.

Every metric deploys one no-op deployment (``__call__`` returns ``"ok"``;
``num_cpus=0`` replicas, ``max_ongoing_requests=100``, so neither queues in
front of the replicas at this load) on a local cluster of 2 CPUs
(``tray.init(num_cpus=2)``; Ray with ``_node_ip_address="127.0.0.1"``, no
dashboard), with its HTTP proxy on 127.0.0.1 at a free port. Both runtimes
run with their defaults otherwise: one proxy on the head, Python handles
routing by power of two choices.

* ``serve: HTTP no-op, N replica(s)``: a closed-loop load generator in the
  benchmark's own process — ``CONCURRENCY`` asyncio tasks sharing one
  ``httpx.AsyncClient`` (at most ``CONCURRENCY`` connections, kept alive),
  each sending its next ``GET`` as soon as the last one answered —
  sends ``REQUESTS`` requests a round (bounded by ``ROUND_LIMIT_S`` too); a
  round is a warm-up first. Rows: requests per second, and the p50 and p99
  of every request's latency (send to full response) in the round, in ms.
  Any answer but a 200 fails the metric. The load generator shares the
  machine's 2 cores with the proxy and replicas, as a client on the same
  host would.
* ``serve: handle calls, no-op, 1 replica``: from the driver, through the
  ingress's ``DeploymentHandle``: ``sync`` is ``handle.remote().result()``
  one at a time; ``100 in flight`` is batches of 100 ``handle.remote()``
  whose results are then fetched. Calls per second.

``--quick`` divides the counts by 10. Traffic stays on 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import os
import socket
import statistics
import time

import harness

CPUS = 2
CONCURRENCY = 16
REQUESTS = 1000
ROUND_LIMIT_S = 60.0
HANDLE_SYNC_CALLS = 500
HANDLE_BATCH = 100
HANDLE_BATCHES = 10

DEFINITIONS = [
    ("serve: HTTP no-op, 1 replica", "req/s", True, ()),
    ("serve: HTTP no-op latency, 1 replica", "ms", False, ("p50", "p99")),
    ("serve: HTTP no-op, 2 replicas", "req/s", True, ()),
    ("serve: HTTP no-op latency, 2 replicas", "ms", False, ("p50", "p99")),
    ("serve: handle calls, no-op, 1 replica", "calls/s", True, ("sync", "100 in flight")),
]
NAMES = [definition[0] for definition in DEFINITIONS]


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _start(runtime: str, port: int):
    """The runtime and its serve module, with Serve started on 127.0.0.1:port."""
    if runtime == "tray":
        import tray
        from tray import serve

        tray.init(num_cpus=CPUS)
        module = tray
    else:
        os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
        import ray
        from ray import serve

        ray.init(num_cpus=CPUS, include_dashboard=False, logging_level="ERROR",
                 log_to_driver=False, _node_ip_address="127.0.0.1")
        module = ray
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    return module, serve


def _deploy(serve, replicas: int):
    @serve.deployment(num_replicas=replicas, max_ongoing_requests=100,
                      ray_actor_options={"num_cpus": 0})
    class NoOp:
        async def __call__(self, request=None) -> str:
            return "ok"

    return serve.run(NoOp.bind(), name="noop", route_prefix="/noop")


def _percentile(samples: list[float], fraction: float) -> float:
    return samples[min(len(samples) - 1, int(len(samples) * fraction))]


async def _load_round(url: str, requests: int) -> tuple[float, list[float]]:
    """One closed-loop round: (requests per second, sorted latencies in ms)."""
    import httpx

    latencies_ms: list[float] = []
    failures: list[str] = []
    sent = 0
    limits = httpx.Limits(max_connections=CONCURRENCY, max_keepalive_connections=CONCURRENCY)
    async with httpx.AsyncClient(limits=limits, timeout=30.0) as client:
        deadline = time.perf_counter() + ROUND_LIMIT_S

        async def worker() -> None:
            nonlocal sent
            while sent < requests and time.perf_counter() < deadline and not failures:
                sent += 1
                began = time.perf_counter()
                reply = await client.get(url)
                latencies_ms.append((time.perf_counter() - began) * 1000)
                if reply.status_code != 200 or reply.text != "ok":
                    failures.append(f"{reply.status_code} {reply.text[:200]}")

        start = time.perf_counter()
        await asyncio.gather(*[worker() for _ in range(CONCURRENCY)])
        elapsed_s = time.perf_counter() - start
    if failures:
        raise RuntimeError(f"{len(failures)} request(s) failed, first: {failures[0]}")
    latencies_ms.sort()
    return len(latencies_ms) / elapsed_s, latencies_ms


def _http(runtime: str, replicas: int, want: str):
    def measure() -> list[float] | dict[str, list[float]]:
        port = _free_port()
        module, serve = _start(runtime, port)
        try:
            _deploy(serve, replicas)
            url = f"http://127.0.0.1:{port}/noop"
            requests = harness.n(REQUESTS)
            asyncio.run(_load_round(url, requests))  # warm-up
            rates, p50, p99 = [], [], []
            for _ in range(harness.ROUNDS):
                rate, latencies_ms = asyncio.run(_load_round(url, requests))
                rates.append(rate)
                p50.append(statistics.median(latencies_ms))
                p99.append(_percentile(latencies_ms, 0.99))
            if want == "rate":
                return rates
            return {"p50": p50, "p99": p99}
        finally:
            serve.shutdown()
            module.shutdown()
    return measure


def _handle_calls(runtime: str):
    def measure() -> dict[str, list[float]]:
        module, serve = _start(runtime, _free_port())
        try:
            handle = _deploy(serve, 1)

            def sync() -> int:
                count = harness.n(HANDLE_SYNC_CALLS)
                for _ in range(count):
                    handle.remote().result()
                return count

            def in_flight() -> int:
                batches = harness.n(HANDLE_BATCHES)
                for _ in range(batches):
                    responses = [handle.remote() for _ in range(HANDLE_BATCH)]
                    for response in responses:
                        response.result()
                return batches * HANDLE_BATCH

            return {"sync": harness.throughput(sync),
                    "100 in flight": harness.throughput(in_flight)}
        finally:
            serve.shutdown()
            module.shutdown()
    return measure


def metric_for(runtime: str, name: str):
    """The function that measures ``name`` on ``runtime`` (tray or ray)."""
    return {
        NAMES[0]: _http(runtime, 1, "rate"),
        NAMES[1]: _http(runtime, 1, "latency"),
        NAMES[2]: _http(runtime, 2, "rate"),
        NAMES[3]: _http(runtime, 2, "latency"),
        NAMES[4]: _handle_calls(runtime),
    }[name]
