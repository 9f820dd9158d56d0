"""Dask's side of the benchmarks, with its public API only (Client.submit,
gather, scatter, wait, worker_client, actors). run.py's METRICS says how each
metric maps to Dask; metrics without an equivalent are not here.

The cluster is a LocalCluster of worker processes with one thread each, as many
as there are CPUs (tray and Ray likewise run one task per CPU at a time)."""

from __future__ import annotations

import logging
import os
import time

import numpy as np
from distributed import Client, LocalCluster, wait, worker_client
from harness import LARGE, SCALING_WORK, SCALING_WORKERS, busy, n, percentiles, throughput
from harness import metric as _metric

METRICS: dict = {}
CPUS = os.cpu_count() or 1


def metric(name):
    return _metric(METRICS, name)


class _Cluster:
    def __init__(self, workers: int = CPUS):
        self.cluster = LocalCluster(n_workers=workers, threads_per_worker=1, processes=True,
                                    dashboard_address=None, silence_logs=logging.ERROR)
        self.client = Client(self.cluster)

    def close(self):
        self.client.close()
        self.cluster.close()


def _run(make_body, workers: int = CPUS):
    cluster = _Cluster(workers)
    try:
        return throughput(make_body(cluster.client))
    finally:
        cluster.close()


def small_value():
    return b"ok"


class Actor:
    def small_value(self):
        return b"ok"

    def small_value_arg(self, x):
        return b"ok"


class AsyncActor:
    async def small_value(self):
        return b"ok"

    async def small_value_with_arg(self, x):
        return b"ok"


def _submit(client, count):
    return [client.submit(small_value, pure=False) for _ in range(count)]


# ------------------------------------------------------------ Ray's microbenchmark

@metric("single client get calls (Plasma Store)")
def get_calls():
    def make(client):
        future = client.scatter(0)
        count = n(2000)

        def body():
            for _ in range(count):
                future.result()
            return count
        return body
    return _run(make)


@metric("single client put calls (Plasma Store)")
def put_calls():
    def make(client):
        count = n(2000)

        def body():
            for _ in range(count):
                client.scatter(0, hash=False)
            return count
        return body
    return _run(make)


def _do_put_small():
    with worker_client() as client:
        for _ in range(100):
            client.scatter(0, hash=False)


@metric("multi client put calls (Plasma Store)")
def multi_put_calls():
    def make(client):
        def body():
            client.gather([client.submit(_do_put_small, pure=False) for _ in range(10)])
            return 1000
        return body
    return _run(make)


@metric("single client put gigabytes")
def put_gigabytes():
    def make(client):
        array = np.zeros(LARGE, dtype=np.int64)
        count = n(4)

        def body():
            for _ in range(count):
                client.scatter(array, hash=False)
            return count * array.nbytes / 1e9
        return body
    return _run(make)


def _do_put():
    with worker_client() as client:
        for _ in range(2):
            client.scatter(np.zeros(LARGE, dtype=np.int64), hash=False)


@metric("multi client put gigabytes")
def multi_put_gigabytes():
    def make(client):
        tasks = 4

        def body():
            client.gather([client.submit(_do_put, pure=False) for _ in range(tasks)])
            return tasks * 2 * LARGE * 8 / 1e9
        return body
    return _run(make)


@metric("single client tasks and get batch")
def tasks_and_get_batch():
    def make(client):
        size = n(1000)

        def body():
            client.gather(_submit(client, size))
            return 1
        return body
    return _run(make)


@metric("single client wait 1k refs")
def wait_1k_refs():
    def make(client):
        def body():
            pending = _submit(client, n(1000))
            while pending:
                done, not_done = wait(pending, return_when="FIRST_COMPLETED")
                pending = list(not_done) + list(done)[1:]  # take one, as ray.wait does
            return 1
        return body
    return _run(make)


@metric("single client tasks sync")
def tasks_sync():
    def make(client):
        count = n(500)

        def body():
            for _ in range(count):
                client.submit(small_value, pure=False).result()
            return count
        return body
    return _run(make)


@metric("single client tasks async")
def tasks_async():
    def make(client):
        count = n(1000)

        def body():
            client.gather(_submit(client, count))
            return count
        return body
    return _run(make)


def _small_value_batch(count):
    with worker_client() as client:
        client.gather(_submit(client, count))


def _one():
    return 1


def _fan_out_middle(width):
    with worker_client() as client:
        return sum(client.gather([client.submit(_one, pure=False) for _ in range(width)]))


def _fan_out_top(width):
    with worker_client() as client:
        return sum(client.gather([client.submit(_fan_out_middle, width, pure=False)
                                  for _ in range(width)]))


@metric("nested fan-out (tasks submitting tasks)")
def nested_fan_out():
    def make(client):
        width = 10

        def body():
            assert client.submit(_fan_out_top, width, pure=False).result() == width * width
            return 1 + width + width * width
        return body
    return _run(make)


@metric("multi client tasks async")
def multi_client_tasks_async():
    def make(client):
        per_client, clients = n(1000), 4

        def body():
            client.gather([client.submit(_small_value_batch, per_client, pure=False)
                           for _ in range(clients)])
            return per_client * clients
        return body
    return _run(make)


def _actor_calls(cls, method="small_value", sync=False, count=1000, arg=False):
    def make(client):
        actor = client.submit(cls, actor=True).result()
        call = getattr(actor, method)
        calls = n(count)

        def body():
            if sync:
                for _ in range(calls):
                    call().result()
            else:
                futures = [call(i) for i in range(calls)] if arg else [
                    call() for _ in range(calls)]
                for future in futures:
                    future.result()
            return calls
        return body
    return _run(make)


@metric("1:1 actor calls sync")
def actor_sync():
    return _actor_calls(Actor, sync=True, count=500)


@metric("1:1 actor calls async")
def actor_async():
    return _actor_calls(Actor)


def _call_actors(actors, count, arg=False):
    """A task acting as the client of some actors (Ray uses an actor or a task)."""
    futures = []
    for index in range(count * (1 if arg else 1)):
        actor = actors[index % len(actors)]
        futures.append(actor.small_value_arg(0) if arg else actor.small_value())
    for future in futures:
        future.result()


def _actors(client, cls, count):
    return [client.submit(cls, actor=True, pure=False).result() for _ in range(count)]


def _one_to_n(cls):
    def make(client):
        servers = _actors(client, cls, max(1, CPUS // 2))
        count = n(1000)

        def body():
            client.submit(_call_actors, servers, count * len(servers), pure=False).result()
            return count * len(servers)
        return body
    return _run(make)


def _n_to_n(cls):
    def make(client):
        servers = _actors(client, cls, max(1, CPUS // 2))
        count, clients = n(1000), 4

        def body():
            client.gather([client.submit(_call_actors, servers, count, pure=False)
                           for _ in range(clients)])
            return count * clients
        return body
    return _run(make)


@metric("1:n actor calls async")
def one_to_n_actor():
    return _one_to_n(Actor)


@metric("n:n actor calls async")
def n_to_n_actor():
    return _n_to_n(Actor)


@metric("n:n actor calls with arg async")
def n_to_n_actor_arg():
    def make(client):
        servers = _actors(client, Actor, max(1, CPUS // 2))
        count = n(1000)

        def body():
            client.gather([client.submit(_call_actors, [server], count, True, pure=False)
                           for server in servers])
            return count * len(servers)
        return body
    return _run(make)


@metric("1:1 async-actor calls sync")
def async_actor_sync():
    return _actor_calls(AsyncActor, sync=True, count=500)


@metric("1:1 async-actor calls async")
def async_actor_async():
    return _actor_calls(AsyncActor)


@metric("1:1 async-actor calls with args async")
def async_actor_args():
    return _actor_calls(AsyncActor, method="small_value_with_arg", arg=True)


@metric("1:n async-actor calls async")
def one_to_n_async_actor():
    return _one_to_n(AsyncActor)


@metric("n:n async-actor calls async")
def n_to_n_async_actor():
    return _n_to_n(AsyncActor)


# ------------------------------------------------------------ start-up and latency

@metric("init to first result")
def init_to_first_result():
    from harness import ROUNDS

    values = []
    for _ in range(ROUNDS + 1):
        start = time.perf_counter()
        cluster = _Cluster()
        assert cluster.client.submit(small_value, pure=False).result() == b"ok"
        values.append(time.perf_counter() - start)
        cluster.close()
    return values[1:]


@metric("shutdown")
def shutdown_time():
    from harness import ROUNDS

    values = []
    for _ in range(ROUNDS + 1):
        cluster = _Cluster()
        cluster.client.submit(small_value, pure=False).result()
        start = time.perf_counter()
        cluster.close()
        values.append(time.perf_counter() - start)
    return values[1:]


@metric("task round trip latency")
def task_latency():
    cluster = _Cluster()
    try:
        client = cluster.client
        return percentiles(lambda: client.submit(small_value, pure=False).result(), n(500))
    finally:
        cluster.close()


@metric("actor call latency")
def actor_latency():
    cluster = _Cluster()
    try:
        actor = cluster.client.submit(Actor, actor=True).result()
        return percentiles(lambda: actor.small_value().result(), n(500))
    finally:
        cluster.close()


def _task(seconds):
    if seconds:
        busy(seconds)
    return b"ok"


def _scaling(work):
    rows = {}
    for workers in SCALING_WORKERS:
        def make(client):
            count = n(SCALING_WORK[work])

            def body():
                client.gather([client.submit(_task, work, pure=False) for _ in range(count)])
                return count
            return body
        rows[f"{workers} worker{'s' if workers > 1 else ''}"] = _run(make, workers)
    return rows


@metric("scaling, 0 ms tasks")
def scaling_0():
    return _scaling(0.0)


@metric("scaling, 1 ms tasks")
def scaling_1():
    return _scaling(0.001)


@metric("scaling, 10 ms tasks")
def scaling_10():
    return _scaling(0.01)


# ------------------------------------------------------------ large objects

@metric("put/get 80 MB array within a node")
def large_within_node():
    def make(client):
        array = np.ones(LARGE)

        def body():
            value = client.scatter(array, hash=False).result()
            assert value.nbytes == array.nbytes
            return array.nbytes / 1e9
        return body
    return _run(make, workers=1)


def _produce():
    return np.ones(LARGE)


@metric("get 80 MB array across two nodes")
def large_across_nodes():
    from harness import ROUNDS

    cluster = _Cluster(2)
    try:
        client = cluster.client
        other = sorted(client.scheduler_info()["workers"])[-1]

        def body():
            future = client.submit(_produce, workers=[other], pure=False)
            wait(future)
            start = time.perf_counter()
            value = future.result()
            elapsed = time.perf_counter() - start
            assert value.nbytes == LARGE * 8
            return elapsed

        body()
        return [LARGE * 8 / 1e9 / body() for _ in range(ROUNDS)]
    finally:
        cluster.close()


# Ray and Dask always copy between nodes: the same measurement.
METRICS["get 80 MB array across two nodes, copied"] = large_across_nodes
