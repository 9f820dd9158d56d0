"""User metrics, as Ray's ``ray.util.metrics``: ``Counter``, ``Gauge`` and
``Histogram``, recorded in any task, actor or driver, aggregated across the
cluster's processes and served by the dashboard's ``/metrics``::

    from tray.util.metrics import Counter, Histogram
    requests = Counter("app_requests", description="requests served",
                       tag_keys=("route",))
    requests.set_default_tags({"route": "/"})
    requests.inc()
    latency = Histogram("app_latency_s", boundaries=[0.01, 0.1, 1.0])
    latency.observe(0.05)

**How values travel.** Each process keeps its own registry: cumulative
values per (metric, tags) series (a counter's total, a gauge's last value
and when it was set, a histogram's bucket counts, sum and count). A
background task on the process's own loop (virtual time in the simulator,
so runs replay) writes the series that changed since its last flush, at
most every ``FLUSH_INTERVAL_S``, as one record in the GCS key-value store
under ``_tray_metrics:<the process's address>`` — one write per process per
interval, never one per ``inc()``. Values are cumulative, so a lost or
repeated write loses nothing but freshness. A reader (``collect()``, and
the dashboard's ``/metrics``) lists the cluster's processes with the state
API and reads their records: counters and histograms are summed across
processes, a gauge is the value set last anywhere.

**Bounds.** ``METRICS_MAX`` metrics and ``SERIES_MAX`` tag combinations per
metric in a process: one more fails that call with ``ValueError`` (the
process goes on). A record is at most ``RECORD_BYTES_MAX``; a process's
record is replaced, never appended to, so the store holds one record per
process the cluster has had."""

from __future__ import annotations

import json
import re
import threading
import time
import weakref

FLUSH_INTERVAL_S = 1.0
METRICS_MAX = 1_000
SERIES_MAX = 1_000
RECORD_BYTES_MAX = 4 * 1024 * 1024
KEY_PREFIX = "_tray_metrics:"
_NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")


# ============================================================ the registry


class _Registry:
    """One process's metrics (see the module's docstring); in the
    simulator, one simulated process's."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.metrics: dict[str, dict] = {}  # name -> definition and series
        # name -> the definition object last checked against metrics (the
        # same object is not compared again at every record)
        self._checked: dict[str, dict] = {}
        self.dirty = False
        self.flushing = False

    def define(self, definition: dict) -> dict:
        """The entry for ``definition`` (created on first use)."""
        name = definition["name"]
        known = self.metrics.get(name)
        if known is not None:
            if known["kind"] != definition["kind"] or \
                    known["tag_keys"] != list(definition["tag_keys"]):
                raise ValueError(f"metric {name!r} is already a {known['kind']} with tag "
                                 f"keys {tuple(known['tag_keys'])} in this process")
            return known
        if len(self.metrics) >= METRICS_MAX:
            raise ValueError(f"this process has {METRICS_MAX} metrics already (the "
                             f"limit); {name!r} is not created")
        entry = self.metrics[name] = {
            "kind": definition["kind"], "description": definition["description"],
            "tag_keys": list(definition["tag_keys"]),
            "boundaries": definition["boundaries"], "series": {}}
        return entry

    def record(self, definition: dict, tags: tuple, update) -> None:
        with self.lock:
            name = definition["name"]
            if self._checked.get(name) is definition:
                series = self.metrics[name]["series"]
            else:
                series = self.define(definition)["series"]
                self._checked[name] = definition
            key = tags  # a tuple; JSON (a list) only when the record is written
            if key not in series and len(series) >= SERIES_MAX:
                raise ValueError(f"metric {definition['name']!r} has {SERIES_MAX} tag "
                                 "combinations in this process (the limit): use fewer "
                                 "distinct tag values")
            series[key] = update(series.get(key))
            self.dirty = True

    def take(self) -> bytes | None:
        """This process's record, if anything changed since the last take."""
        with self.lock:
            if not self.dirty:
                return None
            self.dirty = False
            record = {name: {**entry, "series": {json.dumps(list(tags)): value
                                                 for tags, value in entry["series"].items()}}
                      for name, entry in self.metrics.items()}
        blob = json.dumps(record, sort_keys=True).encode()
        if len(blob) > RECORD_BYTES_MAX:
            raise ValueError(f"this process's metrics are {len(blob)} bytes, over "
                             f"{RECORD_BYTES_MAX}")
        return blob


# The registry of each connected process (a worker, or a driver), by its
# core worker: one in a real process, one per simulated process in the
# simulator (they share this Python process). Values recorded where tray is
# not initialized go to a registry that is never flushed.
_registries: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_unconnected = _Registry()
_registries_lock = threading.Lock()


_get_worker = None  # tray.core.context.get_worker, imported on first use


def _current() -> tuple[object | None, _Registry]:
    global _get_worker
    if _get_worker is None:
        from ..core.context import get_worker as _get_worker
    worker = _get_worker(required=False)
    if worker is None:
        return None, _unconnected
    registry = _registries.get(worker)
    if registry is None:
        with _registries_lock:
            registry = _registries.get(worker)
            if registry is None:
                registry = _registries[worker] = _Registry()
    return worker, registry


def _record(definition: dict, tags: tuple, update) -> None:
    worker, registry = _current()
    registry.record(definition, tags, update)
    if worker is not None and not registry.flushing:
        registry.flushing = True
        worker.spawn(_flush_forever, worker, registry)


async def _flush_forever(worker, registry: _Registry) -> None:
    """The flusher: on the process's own loop, for as long as it runs."""
    import trio

    while True:
        await _flush_once(worker, registry)
        await trio.sleep(FLUSH_INTERVAL_S)


async def _flush_once(worker, registry: _Registry) -> None:
    blob = registry.take()
    if blob is None:
        return
    try:
        await worker.gcs_call("kv_put", KEY_PREFIX + worker.address, blob, True)
    except Exception:  # noqa: BLE001 - the GCS restarting: the next flush retries
        registry.dirty = True


def flush() -> None:
    """Write this process's metrics to the cluster now (``collect()`` in the
    same process calls it first; values are otherwise at most
    ``FLUSH_INTERVAL_S`` late)."""
    from ..api.blocking import block

    worker, registry = _current()
    if worker is not None:
        block(worker, _flush_once, worker, registry)


# ============================================================== the metrics


def _check_tags(tags, what: str) -> dict:
    if tags is None:
        return {}
    if not isinstance(tags, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                             for k, v in tags.items()):
        raise TypeError(f"{what} must be a dict of str to str, got {tags!r}")
    return dict(tags)


class Metric:
    """What the three kinds share: a name, a description, tag keys and
    default tags (Ray's ``Metric``)."""

    _kind = ""

    def __init__(self, name: str, description: str = "", tag_keys: tuple | None = None,
                 *, _boundaries: list | None = None) -> None:
        if not isinstance(name, str) or not name:
            raise ValueError("a metric's name must be a non-empty string")
        if not _NAME.match(name):
            raise ValueError(f"metric name {name!r} is not a Prometheus name "
                             "([a-zA-Z_:][a-zA-Z0-9_:]*)")
        tag_keys = () if tag_keys is None else tag_keys
        if not isinstance(tag_keys, tuple) or not all(isinstance(k, str) for k in tag_keys):
            raise TypeError(f"tag_keys must be a tuple of str, got {tag_keys!r}")
        self._name = name
        self._description = description
        self._tag_keys = tag_keys
        self._default_tags: dict = {}
        self._default_tuple: tuple | None = None  # the tags of inc() without tags
        self._definition = {"name": name, "kind": self._kind, "description": description,
                            "tag_keys": tag_keys, "boundaries": _boundaries}
        _, registry = _current()
        with registry.lock:
            registry.define(self._definition)  # a conflicting definition fails here

    @property
    def info(self) -> dict:
        return {"name": self._name, "description": self._description,
                "tag_keys": self._tag_keys, "default_tags": dict(self._default_tags)}

    def set_default_tags(self, default_tags: dict) -> Metric:
        default_tags = _check_tags(default_tags, "default_tags")
        unknown = sorted(set(default_tags) - set(self._tag_keys))
        if unknown:
            raise ValueError(f"unknown tag key(s) {unknown} for metric {self._name!r} "
                             f"(its tag_keys: {self._tag_keys})")
        self._default_tags = default_tags
        self._default_tuple = None
        return self

    def _tags(self, tags) -> tuple:
        """The series' tag values, in ``tag_keys`` order. ``inc()`` without
        tags reuses one tuple until the defaults change; a complete set of
        tags is checked by one lookup per key, and only a wrong one builds
        the sets that say what is wrong."""
        if tags is None and self._default_tuple is not None:
            return self._default_tuple
        merged = {**self._default_tags, **_check_tags(tags, "tags")}
        values = None
        if len(merged) == len(self._tag_keys):
            try:
                values = tuple([merged[key] for key in self._tag_keys])
            except KeyError:
                pass
        if values is None:
            unknown = sorted(set(merged) - set(self._tag_keys))
            if unknown:
                raise ValueError(f"unknown tag key(s) {unknown} for metric {self._name!r} "
                                 f"(its tag_keys: {self._tag_keys})")
            missing = [key for key in self._tag_keys if key not in merged]
            raise ValueError(f"missing value for tag key(s) {missing} of metric "
                             f"{self._name!r}: pass tags= or set_default_tags()")
        if tags is None:
            self._default_tuple = values
        return values


class Counter(Metric):
    """A total that only grows (Ray's ``Counter``): ``inc(value=1.0, tags=None)``."""

    _kind = "counter"

    def inc(self, value: float = 1.0, tags: dict | None = None) -> None:
        if not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0:
            raise ValueError(f"a counter grows by a positive number, got {value!r}")
        _record(self._definition, self._tags(tags), lambda old: (old or 0.0) + value)


class Gauge(Metric):
    """A value that goes up and down (Ray's ``Gauge``): ``set(value, tags=None)``."""

    _kind = "gauge"

    def set(self, value: float, tags: dict | None = None) -> None:
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            raise TypeError(f"a gauge is set to a number, got {value!r}")
        stamp = time.time()  # virtual in the simulator: last-set-wins replays
        _record(self._definition, self._tags(tags), lambda old: [float(value), stamp])


class Histogram(Metric):
    """Observations counted in buckets (Ray's ``Histogram``): ``boundaries``
    are the buckets' upper bounds, positive and increasing;
    ``observe(value, tags=None)``."""

    _kind = "histogram"

    def __init__(self, name: str, description: str = "", boundaries: list | None = None,
                 tag_keys: tuple | None = None) -> None:
        if not boundaries:
            raise ValueError("a histogram needs boundaries (a non-empty list of positive, "
                             "increasing numbers)")
        for index, bound in enumerate(boundaries):
            if not isinstance(bound, (int, float)) or bound <= 0:
                raise ValueError(f"invalid boundaries: {bound!r} at index {index} is not a "
                                 "positive number")
            if index and bound <= boundaries[index - 1]:
                raise ValueError(f"invalid boundaries: {bound!r} at index {index} is not "
                                 "greater than the one before")
        self._boundaries = [float(b) for b in boundaries]
        super().__init__(name, description, tag_keys, _boundaries=self._boundaries)

    def observe(self, value: float, tags: dict | None = None) -> None:
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            raise TypeError(f"a histogram observes numbers, got {value!r}")
        bucket = next((i for i, b in enumerate(self._boundaries) if value <= b),
                      len(self._boundaries))
        width = len(self._boundaries) + 1

        def update(old):
            state = old or {"buckets": [0] * width, "sum": 0.0, "count": 0}
            state["buckets"][bucket] += 1
            state["sum"] += value
            state["count"] += 1
            return state
        _record(self._definition, self._tags(tags), update)


# ================================================================ reading


def merge(records: list[dict]) -> dict:
    """Processes' registries (as flushed) merged into one: ``{name: {"kind",
    "description", "tag_keys", "boundaries", "series": {tags tuple: value}}}``
    with counters and histograms summed and gauges last-set-wins; each
    metric's series in tag order, whichever process reported a tag first."""
    merged: dict = {}
    for record in records:
        for name, metric in record.items():
            into = merged.setdefault(name, {key: metric[key] for key in (
                "kind", "description", "tag_keys", "boundaries")} | {"series": {}})
            if into["kind"] != metric["kind"] or into["tag_keys"] != metric["tag_keys"]:
                continue  # a conflicting definition elsewhere: the first one wins
            for key, value in metric["series"].items():
                tags = tuple(json.loads(key))
                known = into["series"].get(tags)
                if metric["kind"] == "counter":
                    into["series"][tags] = (known or 0.0) + value
                elif metric["kind"] == "gauge":
                    if known is None or value[1] >= known[1]:
                        into["series"][tags] = value
                elif known is None:
                    into["series"][tags] = {"buckets": list(value["buckets"]),
                                            "sum": value["sum"], "count": value["count"]}
                else:
                    known["buckets"] = [a + b for a, b in zip(known["buckets"],
                                                              value["buckets"], strict=True)]
                    known["sum"] += value["sum"]
                    known["count"] += value["count"]
    for metric in merged.values():
        gauge = metric["kind"] == "gauge"
        metric["series"] = {tags: value[0] if gauge else value
                            for tags, value in sorted(metric["series"].items())}
    return merged


def collect(address: str | None = None) -> dict:
    """Every process's user metrics, merged (see ``merge``): from a driver
    (``address=None``, either backend, the simulator too) or from outside
    the cluster (``address`` as in ``tray.util.state``). This process's own
    values are flushed first."""
    from .state import list_workers
    from .state._client import Client

    if address is None:
        flush()
    client = Client(address)
    addresses = [w.address for w in list_workers(address=address, detail=True,
                                                  limit=10**9) if w.address]
    if client.worker is not None and client.worker.address not in addresses:
        addresses.append(client.worker.address)
    records = []
    for process_address in sorted(set(addresses)):
        blob = client.gcs_call("kv_get", KEY_PREFIX + process_address)
        if blob:
            records.append(json.loads(blob))
    return merge(records)


def prometheus_families(ctx) -> list:
    """The merged user metrics as prometheus_client families (the
    dashboard's ``/metrics``); ``ctx`` is the dashboard's context."""
    from prometheus_client.core import (
        CounterMetricFamily,
        GaugeMetricFamily,
        HistogramMetricFamily,
    )

    families = []
    for name, metric in sorted(collect(ctx.reader.address).items()):
        labels = list(metric["tag_keys"])
        if metric["kind"] == "counter":
            family = CounterMetricFamily(name, metric["description"] or name, labels=labels)
            for tags, value in sorted(metric["series"].items()):
                family.add_metric(list(tags), value)
        elif metric["kind"] == "gauge":
            family = GaugeMetricFamily(name, metric["description"] or name, labels=labels)
            for tags, value in sorted(metric["series"].items()):
                family.add_metric(list(tags), value)
        else:
            family = HistogramMetricFamily(name, metric["description"] or name,
                                           labels=labels)
            for tags, value in sorted(metric["series"].items()):
                running, buckets = 0, []
                for bound, count in zip([*metric["boundaries"], float("inf")],
                                        value["buckets"], strict=True):
                    running += count
                    buckets.append(("+Inf" if bound == float("inf") else repr(bound),
                                    running))
                family.add_metric(list(tags), buckets, value["sum"])
        families.append(family)
    return families


__all__ = ["Counter", "Gauge", "Histogram", "Metric", "collect", "flush"]
