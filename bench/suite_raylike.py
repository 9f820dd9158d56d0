"""The benchmarks that tray and Ray share: the same code runs on both,
since ``import tray`` works like ``import ray``. suite_tray.py and
suite_ray.py bind the runtime (``bind``) and add what differs (start-up
options, two-node clusters, placement groups, the simulator).

The shapes follow Ray's ``ray microbenchmark`` (python/ray/_private/ray_perf.py),
scaled down where bench/README.md says so."""

from __future__ import annotations

import os
import time

import numpy as np
from harness import (
    LARGE,
    SCALING_WORK,
    SCALING_WORKERS,
    busy,
    n,
    percentiles,
    throughput,
)
from harness import metric as _metric

METRICS: dict = {}
CPUS = os.cpu_count() or 1
rt = None  # the runtime module: tray or ray (bind)
OPTIONS: dict = {}  # passed to every rt.init()


def bind(runtime, **init_options) -> dict:
    """Run the shared metrics on ``runtime``; returns them by name."""
    global rt
    rt = runtime
    OPTIONS.update(init_options)
    return dict(METRICS)


def metric(name):
    return _metric(METRICS, name)


def _cluster(**options):
    rt.init(**OPTIONS, **options)


def across_nodes(other: str) -> list[float]:
    """GB/s of getting an 80 MB array whose only copy is on node ``other``
    (the cluster runs, with two nodes)."""
    import importlib

    from harness import ROUNDS

    strategies = importlib.import_module(f"{rt.__name__}.util.scheduling_strategies")
    strategy = strategies.NodeAffinitySchedulingStrategy(other, soft=False)

    @rt.remote(scheduling_strategy=strategy)
    def produce():
        return [rt.put(np.ones(LARGE))]  # the array stays in the other node's store

    def body():
        [inner] = rt.get(produce.remote())
        start = time.perf_counter()
        value = rt.get(inner)
        elapsed = time.perf_counter() - start
        assert value.nbytes == LARGE * 8
        return elapsed

    body()
    return [LARGE * 8 / 1e9 / body() for _ in range(ROUNDS)]


@metric("placement group create/removal")
def placement_groups():
    import importlib

    util = importlib.import_module(f"{rt.__name__}.util")
    _cluster(resources={"custom": 100})
    try:
        groups = n(100)

        def body():
            pgs = [util.placement_group(bundles=[{"custom": 0.001}]) for _ in range(groups)]
            for pg in pgs:
                pg.wait(timeout_seconds=30)
            for pg in pgs:
                util.remove_placement_group(pg)
            return groups
        return throughput(body)
    finally:
        rt.shutdown()


# Remote functions and classes are made after init, in a function, as Ray's
# script does at import time.

def _defs():
    @rt.remote
    def small_value():
        return b"ok"

    @rt.remote
    def small_value_batch(count):
        rt.get([small_value.remote() for _ in range(count)])
        return 0

    @rt.remote(num_cpus=0)
    class Actor:
        def small_value(self):
            return b"ok"

        def small_value_arg(self, x):
            return b"ok"

        def small_value_batch(self, count):
            rt.get([small_value.remote() for _ in range(count)])

    @rt.remote
    class AsyncActor:
        async def small_value(self):
            return b"ok"

        async def small_value_with_arg(self, x):
            return b"ok"

    @rt.remote(num_cpus=0)
    class Client:
        def __init__(self, servers):
            self.servers = servers if isinstance(servers, list) else [servers]

        def small_value_batch(self, count):
            results = []
            for server in self.servers:
                results.extend([server.small_value.remote() for _ in range(count)])
            rt.get(results)

        def small_value_batch_arg(self, count):
            x = rt.put(0)
            results = []
            for server in self.servers:
                results.extend([server.small_value_arg.remote(x) for _ in range(count)])
            rt.get(results)

    return small_value, small_value_batch, Actor, AsyncActor, Client


def _run(body_factory, **options):
    _cluster(**options)
    try:
        return throughput(body_factory())
    finally:
        rt.shutdown()


# ------------------------------------------------------------ Ray's microbenchmark

@metric("single client get calls (Plasma Store)")
def get_calls():
    def make():
        value = rt.put(0)
        count = n(2000)

        def body():
            for _ in range(count):
                rt.get(value)
            return count
        return body
    return _run(make)


@metric("single client put calls (Plasma Store)")
def put_calls():
    def make():
        count = n(2000)

        def body():
            for _ in range(count):
                rt.put(0)
            return count
        return body
    return _run(make)


@metric("multi client put calls (Plasma Store)")
def multi_put_calls():
    def make():
        @rt.remote
        def do_put_small():
            for _ in range(100):
                rt.put(0)

        def body():
            rt.get([do_put_small.remote() for _ in range(10)])
            return 1000
        return body
    return _run(make)


@metric("single client put gigabytes")
def put_gigabytes():
    def make():
        array = np.zeros(LARGE, dtype=np.int64)
        count = n(4)

        def body():
            for _ in range(count):
                rt.put(array)
            return count * array.nbytes / 1e9
        return body
    return _run(make)


@metric("multi client put gigabytes")
def multi_put_gigabytes():
    def make():
        @rt.remote
        def do_put():
            for _ in range(2):
                rt.put(np.zeros(LARGE, dtype=np.int64))

        tasks = 4

        def body():
            rt.get([do_put.remote() for _ in range(tasks)])
            return tasks * 2 * LARGE * 8 / 1e9
        return body
    return _run(make)


@metric("single client tasks and get batch")
def tasks_and_get_batch():
    def make():
        small_value = _defs()[0]
        size = n(1000)

        def body():
            rt.get([small_value.remote() for _ in range(size)])
            return 1
        return body
    return _run(make)


@metric("single client get object containing 10k refs")
def get_containing_refs():
    def make():
        @rt.remote
        def create_object_containing_ref():
            return [rt.put(1) for _ in range(n(10000))]

        ref = create_object_containing_ref.remote()
        rt.get(ref)

        def body():
            rt.get(ref)
            return 1
        return body
    return _run(make)


@metric("single client wait 1k refs")
def wait_1k_refs():
    def make():
        small_value = _defs()[0]

        def body():
            not_ready = [small_value.remote() for _ in range(n(1000))]
            for _ in range(len(not_ready)):
                _ready, not_ready = rt.wait(not_ready)
            return 1
        return body
    return _run(make)


# A metric's workload is a factory: called once the cluster is up, it sets
# the workload up and returns its body, which does a round and returns how
# many operations it did. bench/floors.py runs the same factories.

def make_nested_fan_out():
    """A task submits 10 tasks that each submit 10 tasks, and gets them all:
    111 tasks a round, submitted from workers rather than the driver, with
    tasks blocked in ``get`` lending their CPU to the ones they wait for."""
    width = 10

    @rt.remote
    def leaf():
        return 1

    @rt.remote
    def middle():
        return sum(rt.get([leaf.remote() for _ in range(width)]))

    @rt.remote
    def top():
        return sum(rt.get([middle.remote() for _ in range(width)]))

    def body():
        assert rt.get(top.remote()) == width * width
        return 1 + width + width * width
    return body


def make_tasks_sync():
    small_value = _defs()[0]
    count = n(500)

    def body():
        for _ in range(count):
            rt.get(small_value.remote())
        return count
    return body


def make_tasks_async():
    small_value = _defs()[0]
    count = n(1000)

    def body():
        rt.get([small_value.remote() for _ in range(count)])
        return count
    return body


def make_actor_calls(actor_index, sync=False, count=1000, method="small_value", arg=False,
                     **actor_options):
    """Calls of one actor (``_defs()[actor_index]``: 2 a plain one, 3 an
    async one), one at a time (``sync``) or all at once."""
    def make():
        actor_class = _defs()[actor_index]
        if actor_options:
            actor_class = actor_class.options(**actor_options)
        call = getattr(actor_class.remote(), method)
        calls = n(count)

        def body():
            if sync:
                for _ in range(calls):
                    rt.get(call.remote())
            elif arg:
                rt.get([call.remote(i) for i in range(calls)])
            else:
                rt.get([call.remote() for _ in range(calls)])
            return calls
        return body
    return make


def make_n_to_n(server_index):
    """4 tasks each call n servers (``_defs()[server_index]``) 1,000 times."""
    def make():
        defs = _defs()
        servers = [defs[server_index].remote() for _ in range(max(1, CPUS // 2))]
        count, clients = n(1000), 4

        @rt.remote
        def work(actors):
            rt.get([actors[i % len(actors)].small_value.remote() for i in range(count)])

        def body():
            rt.get([work.remote(servers) for _ in range(clients)])
            return count * clients
        return body
    return make


@metric("nested fan-out (tasks submitting tasks)")
def nested_fan_out():
    return _run(make_nested_fan_out)


@metric("single client tasks sync")
def tasks_sync():
    return _run(make_tasks_sync)


@metric("single client tasks async")
def tasks_async():
    return _run(make_tasks_async)


@metric("multi client tasks async")
def multi_client_tasks_async():
    def make():
        Actor = _defs()[2]
        per_client, clients = n(1000), 4
        actors = [Actor.remote() for _ in range(clients)]

        def body():
            rt.get([a.small_value_batch.remote(per_client) for a in actors])
            return per_client * clients
        return body
    return _run(make)


@metric("1:1 actor calls sync")
def actor_sync():
    return _run(make_actor_calls(2, sync=True, count=500))


@metric("1:1 actor calls async")
def actor_async():
    return _run(make_actor_calls(2))


@metric("1:1 actor calls concurrent")
def actor_concurrent():
    return _run(make_actor_calls(2, max_concurrency=16))


def _one_to_n(server_index):
    def make():
        defs = _defs()
        servers = [defs[server_index].remote() for _ in range(max(1, CPUS // 2))]
        client = defs[4].remote(servers)
        count = n(1000)

        def body():
            rt.get(client.small_value_batch.remote(count))
            return count * len(servers)
        return body
    return _run(make)


@metric("1:n actor calls async")
def one_to_n_actor():
    return _one_to_n(2)


@metric("n:n actor calls async")
def n_to_n_actor():
    return _run(make_n_to_n(2))


@metric("n:n actor calls with arg async")
def n_to_n_actor_arg():
    def make():
        defs = _defs()
        servers = [defs[2].remote() for _ in range(max(1, CPUS // 2))]
        clients = [defs[4].remote(server) for server in servers]
        count = n(1000)

        def body():
            rt.get([c.small_value_batch_arg.remote(count) for c in clients])
            return count * len(clients)
        return body
    return _run(make)


@metric("1:1 async-actor calls sync")
def async_actor_sync():
    return _run(make_actor_calls(3, sync=True, count=500))


@metric("1:1 async-actor calls async")
def async_actor_async():
    return _run(make_actor_calls(3))


@metric("1:1 async-actor calls with args async")
def async_actor_args():
    return _run(make_actor_calls(3, method="small_value_with_arg", arg=True))


@metric("1:n async-actor calls async")
def one_to_n_async_actor():
    return _one_to_n(3)


@metric("n:n async-actor calls async")
def n_to_n_async_actor():
    return _run(make_n_to_n(3))


# ------------------------------------------------------------ start-up and latency

@metric("init to first result")
def init_to_first_result():
    from harness import ROUNDS

    values = []
    for _ in range(ROUNDS + 1):
        start = time.perf_counter()
        _cluster()

        @rt.remote
        def one():
            return 1

        assert rt.get(one.remote()) == 1
        values.append(time.perf_counter() - start)
        rt.shutdown()
    return values[1:]


@metric("shutdown")
def shutdown_time():
    from harness import ROUNDS

    values = []
    for _ in range(ROUNDS + 1):
        _cluster()

        @rt.remote
        def one():
            return 1

        rt.get(one.remote())
        start = time.perf_counter()
        rt.shutdown()
        values.append(time.perf_counter() - start)
    return values[1:]


@metric("task round trip latency")
def task_latency():
    _cluster()
    try:
        small_value = _defs()[0]
        return percentiles(lambda: rt.get(small_value.remote()), n(500))
    finally:
        rt.shutdown()


@metric("actor call latency")
def actor_latency():
    _cluster()
    try:
        actor = _defs()[2].remote()
        return percentiles(lambda: rt.get(actor.small_value.remote()), n(500))
    finally:
        rt.shutdown()


def _scaling(work):
    rows = {}
    for workers in SCALING_WORKERS:
        _cluster(num_cpus=workers)
        try:
            @rt.remote
            def task(seconds):
                if seconds:
                    busy(seconds)
                return b"ok"

            count = n(SCALING_WORK[work])

            def body(count=count):
                rt.get([task.remote(work) for _ in range(count)])
                return count
            rows[f"{workers} worker{'s' if workers > 1 else ''}"] = throughput(body)
        finally:
            rt.shutdown()
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
    def make():
        array = np.ones(LARGE)

        def body():
            value = rt.get(rt.put(array))
            assert not value.flags.owndata, "get copied the array"  # zero-copy view
            return array.nbytes / 1e9
        return body
    return _run(make, num_cpus=1)


# ------------------------------------------------------------ user metrics

@metric("user metric Counter.inc in tasks")
def user_metric_incs():
    """``util.metrics.Counter.inc()`` with a tag, called in a loop inside one
    task per CPU: what recording a user metric costs where the work runs
    (tray: a dict update, the flush a task of its own once a second; Ray: its
    metrics agent's recorder)."""
    def make():
        @rt.remote
        def count(times):
            import importlib

            metrics = importlib.import_module(f"{rt.__name__}.util.metrics")
            counter = metrics.Counter("bench_incs", description="bench", tag_keys=("k",))
            for _ in range(times):
                counter.inc(tags={"k": "a"})
            return times

        per_task = n(20_000)

        def body():
            return sum(rt.get([count.remote(per_task) for _ in range(CPUS)]))
        return body
    return _run(make)
