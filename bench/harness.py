"""Timing helpers shared by the per-runtime suites (bench/suite_*.py).

A suite registers one function per metric with ``@metric(NAME)``; the
function runs in a fresh process (see run.py) and returns either a list of
per-round values (one row) or a dict ``{row suffix: values}`` (several rows,
e.g. p50 and p99), or raises ``NotAvailable`` with the reason."""

from __future__ import annotations

import time
from collections.abc import Callable

# Set by run.py in the child process before a metric runs.
ROUNDS = 5
SCALE = 1.0  # --quick makes every operation count 10x smaller


class NotAvailable(Exception):
    """This runtime has no equivalent of the metric (the message says why)."""


def metric(registry: dict, name: str):
    def register(function):
        registry[name] = function
        return function
    return register


def n(count: int) -> int:
    """An operation count, scaled down under --quick."""
    return max(1, int(count * SCALE))


def throughput(body: Callable[[], float], rounds: int | None = None) -> list[float]:
    """Warm up with one run of ``body`` (it returns how many operations it did),
    then time ``rounds`` runs; each value is operations per second."""
    rounds = ROUNDS if rounds is None else rounds
    body()
    values = []
    for _ in range(rounds):
        start = time.perf_counter()
        count = body()
        values.append(count / (time.perf_counter() - start))
    return values


def percentiles(call: Callable[[], object], calls: int,
                rounds: int | None = None) -> dict[str, list[float]]:
    """Round-trip latency of ``call``: a warm-up of ``calls // 10`` calls, then
    ``rounds`` rounds of ``calls`` timed calls; p50 and p99 (ms) per round."""
    rounds = ROUNDS if rounds is None else rounds
    for _ in range(max(1, calls // 10)):
        call()
    p50, p99 = [], []
    for _ in range(rounds):
        samples = []
        for _ in range(calls):
            start = time.perf_counter()
            call()
            samples.append((time.perf_counter() - start) * 1000)
        samples.sort()
        p50.append(samples[len(samples) // 2])
        p99.append(samples[min(len(samples) - 1, int(len(samples) * 0.99))])
    return {"p50": p50, "p99": p99}


def busy(seconds: float) -> None:
    """Burn CPU for ``seconds`` (the scaling curve's unit of work)."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


# Worker counts for the scaling curve (this machine has 2 cores: 4 oversubscribes).
SCALING_WORKERS = (1, 2, 4)
# Work per task (seconds) -> tasks per round at each worker count.
SCALING_WORK = {0.0: 1000, 0.001: 400, 0.01: 100}
LARGE = 10_000_000  # float64 elements: 80 MB
