"""User metrics (``tray.util.metrics``): Ray's Counter, Gauge and Histogram,
aggregated across processes, on both backends; replayed identically in the
simulator; Ray's errors for bad definitions and bad tags."""

from __future__ import annotations

import time

import pytest

import tray
import tray.simtest
from tray.util.metrics import Counter, Gauge, Histogram, collect, merge


def _program() -> dict:
    @tray.remote
    def work(i):
        done = Counter("jobs_done", description="jobs done", tag_keys=("kind",))
        done.set_default_tags({"kind": "even"})
        done.inc(tags=None if i % 2 == 0 else {"kind": "odd"})
        Histogram("work_s", boundaries=[0.1, 1.0]).observe(0.05 * i)
        return tray.get_runtime_context().get_worker_id()

    @tray.remote
    class Queue:
        def __init__(self):
            self.length = Gauge("queue_length", description="items waiting")

        def set(self, value):
            self.length.set(value)
            return value

    @tray.remote
    def nap(seconds):
        time.sleep(seconds)  # virtual in the simulator: the flushers run meanwhile

    workers = tray.get([work.remote(i) for i in range(10)])
    queue = Queue.remote()
    tray.get(queue.set.remote(3))
    tray.get(queue.set.remote(7))
    Counter("jobs_done", tag_keys=("kind",)).inc(2.5, tags={"kind": "driver"})
    tray.get(nap.remote(1.5))
    deadline = time.monotonic() + 20
    while True:
        merged = collect()
        if merged.get("jobs_done", {}).get("series", {}).get(("even",)) == 5 or \
                time.monotonic() > deadline:
            break
        time.sleep(0.2)  # the local backend: real time
    return {"merged": merged, "workers": set(workers)}


def _check(result: dict) -> None:
    merged = result["merged"]
    assert merged["jobs_done"]["kind"] == "counter"
    assert merged["jobs_done"]["series"] == {("even",): 5.0, ("odd",): 5.0, ("driver",): 2.5}
    histogram = merged["work_s"]["series"][()]
    assert histogram["buckets"] == [3, 7, 0] and histogram["count"] == 10
    assert histogram["sum"] == pytest.approx(sum(0.05 * i for i in range(10)))
    assert merged["queue_length"]["series"] == {(): 7.0}  # the last value set


def test_metrics_aggregate_across_simulated_workers_and_replay():
    digests = []
    for _ in range(2):
        tray.init(backend="sim", seed=11, num_cpus=2)
        try:
            result = _program()
            digests.append(tray.simtest.trace_digest())
        finally:
            tray.shutdown()
        _check(result)
    assert digests[0] == digests[1]


def test_metrics_aggregate_across_worker_processes():
    tray.init(num_cpus=2, include_dashboard=False)
    try:
        result = _program()
    finally:
        tray.shutdown()
    _check(result)
    assert len(result["workers"]) >= 1


def test_merge_sums_counters_and_histograms_and_keeps_the_last_gauge():
    one = {"c": {"kind": "counter", "description": "", "tag_keys": ["k"], "boundaries": None,
                 "series": {'["a"]': 2.0}},
           "g": {"kind": "gauge", "description": "", "tag_keys": [], "boundaries": None,
                 "series": {"[]": [5.0, 100.0]}},
           "h": {"kind": "histogram", "description": "", "tag_keys": [], "boundaries": [1.0],
                 "series": {"[]": {"buckets": [1, 0], "sum": 0.5, "count": 1}}}}
    two = {"c": {**one["c"], "series": {'["a"]': 3.0, '["b"]': 1.0}},
           "g": {**one["g"], "series": {"[]": [9.0, 50.0]}},
           "h": {**one["h"], "series": {"[]": {"buckets": [0, 2], "sum": 4.0, "count": 2}}}}
    merged = merge([one, two])
    assert merged["c"]["series"] == {("a",): 5.0, ("b",): 1.0}
    assert merged["g"]["series"] == {(): 5.0}  # set at 100 > 50
    assert merged["h"]["series"][()] == {"buckets": [1, 2], "sum": 4.5, "count": 3}


def test_merged_series_are_in_tag_order_whoever_reported_first():
    # Regression (CI): the README walkthrough printed ('/b',) first when the
    # worker that ran handle("/b") sorted before the other one.
    def counter(series):
        return {"c": {"kind": "counter", "description": "", "tag_keys": ["k"],
                      "boundaries": None, "series": series}}

    merged = merge([counter({'["b"]': 1.0}), counter({'["a"]': 2.0})])
    assert list(merged["c"]["series"].items()) == [(("a",), 2.0), (("b",), 1.0)]


def test_bad_definitions_and_tags_fail_with_rays_errors():
    with pytest.raises(ValueError, match="non-empty"):
        Counter("")
    with pytest.raises(ValueError, match="Prometheus name"):
        Counter("bad name")
    with pytest.raises(TypeError, match="tag_keys must be a tuple"):
        Counter("tagged_wrong", tag_keys=["a"])
    with pytest.raises(ValueError, match="needs boundaries"):
        Histogram("no_bounds")
    with pytest.raises(ValueError, match="at index 1 is not greater"):
        Histogram("unsorted", boundaries=[2.0, 1.0])
    with pytest.raises(ValueError, match="at index 0 is not a positive"):
        Histogram("negative", boundaries=[-1.0])
    counter = Counter("requests_seen", tag_keys=("route",))
    with pytest.raises(ValueError, match=r"missing value for tag key\(s\) \['route'\]"):
        counter.inc()
    with pytest.raises(ValueError, match=r"unknown tag key\(s\) \['colour'\]"):
        counter.inc(tags={"route": "/", "colour": "red"})
    with pytest.raises(ValueError, match="positive number"):
        counter.inc(0)
    with pytest.raises(ValueError, match="already a counter"):
        Gauge("requests_seen", tag_keys=("route",))
    counter.inc(tags={"route": "/"})  # fine
    with pytest.raises(ValueError, match=r"unknown tag key\(s\) \['colour'\]"):
        counter.inc(tags={"colour": "red"})  # as many keys as tag_keys, the wrong one
    with pytest.raises(TypeError, match="tags must be a dict"):
        counter.inc(tags=[])


def test_inc_without_tags_follows_the_latest_default_tags():
    # inc() reuses the tags it worked out last time, until the defaults change.
    from tray.util.metrics import _current

    counter = Counter("pages_seen", tag_keys=("route",)).set_default_tags({"route": "/a"})
    counter.inc()
    counter.inc(2.0)
    counter.set_default_tags({"route": "/b"})
    counter.inc()
    counter.inc(tags={"route": "/c"})
    _, registry = _current()
    assert registry.metrics["pages_seen"]["series"] == {("/a",): 3.0, ("/b",): 1.0,
                                                        ("/c",): 1.0}


def test_readme_metrics_walkthrough_runs(tmp_path):
    import readme_examples

    result = readme_examples.run(readme_examples.block("from tray.util.metrics import",
                                                               page="observability.md"),
                                 tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["{('/a',): 2.0, ('/b',): 1.0}", "{(): 4.0}"]
