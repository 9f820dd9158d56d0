"""Data benchmarks: the same code on tray.data and Ray Data (``import
tray.data`` works like ``import ray.data``), bound per runtime by
``metrics(runtime)``.

Shapes (per round; ``--quick`` makes sizes 10x smaller):

* parquet -> map_batches -> iter_batches: 20 parquet files of 1M rows x two
  float64 columns (320 MB in memory), read, a cheap vectorised NumPy
  function, consumed in batches of 4,096 rows: rows/s and GB/s;
* the same with the function as a callable class on 2 actors;
* random_shuffle and sort of 1 GB (62.5M rows of a random float64 key and
  an int64 value), materialized: GB/s;
* 10x the object store: a 200 MB store, 2 GB streamed through
  range -> map_batches -> iter_batches: seconds to finish;
* peak object store bytes of the first and the last: the high-water mark,
  sampled every 20 ms by a thread, of tray's session store files under
  /dev/shm (allocated bytes), and for Ray of /dev/shm's used bytes above
  what it held before (Ray maps its store from unlinked files there, so
  only the total shows it; other programs' shared memory adds noise to
  Ray's number, and freed pages of Ray's mapping stay counted). Spilled
  bytes are not counted for either.
"""

from __future__ import annotations

import glob
import importlib
import os
import shutil
import tempfile
import threading
import time

import numpy as np
from harness import ROUNDS, n

rt = None  # tray or ray
data = None  # tray.data or ray.data
INIT: dict = {}

ROWS_PER_FILE = 1_000_000
FILES = 20
SHUFFLE_BYTES = 1_000_000_000
BIG_STORE_BYTES = 200 * 1024 * 1024
STREAM_FACTOR = 10


def _bind(runtime: str) -> None:
    global rt, data
    if runtime == "ray":
        os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
        INIT.update(include_dashboard=False, logging_level="ERROR", log_to_driver=False,
                    _node_ip_address="127.0.0.1")
    rt = importlib.import_module(runtime)
    data = importlib.import_module(f"{runtime}.data")


def _quiet() -> None:
    context = data.DataContext.get_current()
    context.enable_progress_bars = False
    if hasattr(context, "print_on_execution_start"):
        context.print_on_execution_start = False


def _tray_store_bytes() -> int:
    """Bytes allocated by this driver's tray session under /dev/shm (its
    nodes' stores): other programs' shared memory does not count."""
    total = 0
    for directory in glob.glob(f"/dev/shm/tray-session-{os.getpid()}-*"):
        for root, _dirs, files in os.walk(directory):
            for name in files:
                try:
                    total += os.stat(os.path.join(root, name)).st_blocks * 512
                except FileNotFoundError:
                    pass  # freed while we looked
    return total


def _shm_used_bytes() -> int:
    return shutil.disk_usage("/dev/shm").used


class PeakShm:
    """The high-water mark of shared-memory bytes above the baseline: for
    tray its session's store files, for Ray /dev/shm's used bytes (Ray's
    store is one mapping of unlinked files there)."""

    def __init__(self, period_s: float = 0.02) -> None:
        self.period_s = period_s
        self._measure = _tray_store_bytes if rt.__name__ == "tray" else _shm_used_bytes
        self.baseline = self._measure()
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._stop.is_set():
            used = self._measure() - self.baseline
            self.peak = max(self.peak, used)
            self._stop.wait(self.period_s)

    def __enter__(self) -> PeakShm:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def _rounds(body, rounds: int | None = None) -> list[float]:
    """Warm up once, then time ``rounds`` runs of ``body`` (returning its
    amount of work); work per second per round."""
    rounds = ROUNDS if rounds is None else rounds
    body()
    values = []
    for _ in range(rounds):
        start = time.perf_counter()
        amount = body()
        values.append(amount / (time.perf_counter() - start))
    return values


def _write_parquet(directory: str) -> tuple[int, int]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    files, rows = max(2, n(FILES)), ROWS_PER_FILE
    rng = np.random.default_rng(0)
    for index in range(files):
        table = pa.table({"a": rng.random(rows), "b": rng.random(rows)})
        pq.write_table(table, os.path.join(directory, f"part-{index:03d}.parquet"))
    return files * rows, files * rows * 16


def _scale(batch):
    return {"a": batch["a"] * 2.0 + 1.0, "b": batch["b"] - batch["a"]}


class Scale:
    def __init__(self) -> None:
        self.factor = 2.0

    def __call__(self, batch):
        return {"a": batch["a"] * self.factor + 1.0, "b": batch["b"] - batch["a"]}


def _pipeline(directory: str, actors: bool):
    ds = data.read_parquet(directory)
    if actors:
        return ds.map_batches(Scale, concurrency=2, batch_size=4096, num_cpus=0.5)
    return ds.map_batches(_scale, batch_size=4096)


def _consume(ds) -> int:
    rows = 0
    for batch in ds.iter_batches(batch_size=4096, batch_format="numpy"):
        rows += len(batch["a"])
    return rows


def _parquet_metric(actors: bool, peak: bool):
    directory = tempfile.mkdtemp(prefix="bench-data-")
    try:
        rows, size_bytes = _write_parquet(directory)
        rt.init(num_cpus=2, **INIT)
        _quiet()
        try:
            if peak:
                _consume(_pipeline(directory, actors))  # warm-up
                peaks = []
                for _ in range(ROUNDS):
                    with PeakShm() as meter:
                        assert _consume(_pipeline(directory, actors)) == rows
                    peaks.append(meter.peak / 1e6)
                return peaks
            per_s = _rounds(lambda: _consume(_pipeline(directory, actors)))
            return {"rows/s": per_s, "GB/s": [v * size_bytes / rows / 1e9 for v in per_s]}
        finally:
            rt.shutdown()
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def _keyed(rows: int, blocks: int):
    def make(batch):
        rng = np.random.default_rng(int(batch["id"][0]))
        return {"key": rng.random(len(batch["id"])), "value": batch["id"]}

    return data.range(rows, override_num_blocks=blocks).map_batches(make, batch_size=None)


def _all_to_all(kind: str):
    size_bytes = int(SHUFFLE_BYTES * (n(10) / 10))
    rows = size_bytes // 16
    blocks = max(4, size_bytes // (32 * 1024 * 1024))
    rt.init(num_cpus=2, **INIT)
    _quiet()
    try:
        def body():
            ds = _keyed(rows, blocks)
            ds = ds.random_shuffle(seed=1) if kind == "shuffle" else ds.sort("key")
            materialized = ds.materialize()
            assert materialized.count() == rows
            del materialized
            return size_bytes / 1e9
        return _rounds(body, rounds=min(ROUNDS, 3))
    finally:
        rt.shutdown()


def _ten_times_the_store(peak: bool):
    store = BIG_STORE_BYTES if n(10) == 10 else 80 * 1024 * 1024
    total_bytes = STREAM_FACTOR * store
    rows = total_bytes // 8
    rt.init(num_cpus=2, object_store_memory=store, **INIT)
    _quiet()
    if rt.__name__ == "tray":
        # tray.nodes() does not report store sizes yet, so tray.data cannot
        # see this store's size on a real cluster: say it (half, its default share).
        limits = data.DataContext.get_current().execution_options.resource_limits
        limits.object_store_memory = store // 2
    try:
        def run():
            ds = data.range(rows, override_num_blocks=max(20, total_bytes // (8 * 1024 * 1024)))
            ds = ds.map_batches(lambda b: {"x": b["id"] * 0.5}, batch_size=None)
            seen = 0
            for batch in ds.iter_batches(batch_size=65536):
                seen += len(batch["x"])
            assert seen == rows
        if peak:
            run()
            peaks = []
            for _ in range(min(ROUNDS, 3)):
                with PeakShm() as meter:
                    run()
                peaks.append(meter.peak / 1e6)
            return peaks
        run()
        values = []
        for _ in range(min(ROUNDS, 3)):
            start = time.perf_counter()
            run()
            values.append(time.perf_counter() - start)
        return values
    finally:
        rt.shutdown()


NAMES = {
    "data: parquet -> map_batches -> iter_batches": lambda: _parquet_metric(False, False),
    "data: peak store, parquet -> map_batches -> iter_batches":
        lambda: _parquet_metric(False, True),
    "data: parquet -> map_batches on 2 actors -> iter_batches":
        lambda: _parquet_metric(True, False),
    "data: random_shuffle 1 GB": lambda: _all_to_all("shuffle"),
    "data: sort 1 GB": lambda: _all_to_all("sort"),
    "data: 2 GB through a 200 MB object store": lambda: _ten_times_the_store(False),
    "data: peak store, 2 GB through a 200 MB object store": lambda: _ten_times_the_store(True),
}


def metrics(runtime: str) -> dict:
    """The data metrics, bound to ``runtime`` ("tray" or "ray")."""
    if runtime not in ("tray", "ray"):
        return {}
    _bind(runtime)
    return dict(NAMES)
