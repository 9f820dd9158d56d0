"""Per-column statistics in one distributed pass: ``ds.sum``, ``min``,
``max``, ``mean``, ``std``, ``unique``, and the preprocessors' fits.

A task per block computes partials (count, sum, mean and M2 for a
parallel variance, min, max, value counts up to a bound); the driver
merges them as they finish, a bounded window at a time.
"""

from __future__ import annotations

import numpy as np

import tray

from . import _block as B


def value_sort_key(value):
    return (value is None, str(type(value)), value) if value is not None else (True, "", 0)


@tray.remote
def _partial_stats(block, columns):
    """Per-column partial statistics of one block, merged in the driver:
    count, sum, mean and M2 (Chan et al.'s parallel variance), min, max,
    value counts (bounded)."""
    out = {}
    for column in columns:
        if column not in block.column_names:
            raise ValueError(f"no column {column!r}; the dataset has {block.column_names}")
        values = B.column_to_numpy(block.column(column))
        entry = {"rows": len(values)}
        numeric = values.dtype.kind in "biuf"
        present = values[~np.isnan(values)] if values.dtype.kind == "f" else \
            values[np.array([v is not None for v in values], dtype=bool)] \
            if values.dtype == object else values
        entry["count"] = len(present)
        if numeric and len(present):
            as_float = present.astype(np.float64)
            entry["sum"] = present.sum().item()
            entry["mean"] = float(as_float.mean())
            entry["m2"] = float(((as_float - entry["mean"]) ** 2).sum())
            entry["min"] = present.min().item()
            entry["max"] = present.max().item()
        elif len(present):
            try:
                entry["min"] = min(present)
                entry["max"] = max(present)
            except TypeError:
                pass
        unique, counts = (np.unique(present, return_counts=True) if numeric else
                          _object_counts(present))
        if len(unique) <= COUNTS_MAX:
            entry["counts"] = {(u.item() if isinstance(u, np.generic) else u): int(c)
                               for u, c in zip(unique, counts, strict=False)}
        out[column] = entry
    return out


COUNTS_MAX = 100_000  # distinct values kept per column and block


def _object_counts(values):
    counts: dict = {}
    for value in values:
        key = tuple(value) if isinstance(value, (list, np.ndarray)) else value
        counts[key] = counts.get(key, 0) + 1
    return list(counts), list(counts.values())


def _merge(a: dict, b: dict) -> dict:
    if not a:
        return dict(b)
    merged = {"rows": a["rows"] + b["rows"], "count": a["count"] + b["count"]}
    if "mean" in a and "mean" in b:
        n_a, n_b = a["count"], b["count"]
        delta = b["mean"] - a["mean"]
        merged["sum"] = a["sum"] + b["sum"]
        merged["mean"] = a["mean"] + delta * n_b / (n_a + n_b)
        merged["m2"] = a["m2"] + b["m2"] + delta * delta * n_a * n_b / (n_a + n_b)
    else:
        for key in ("sum", "mean", "m2"):
            if key in a or key in b:
                merged[key] = a.get(key, b.get(key))
    for key, pick in (("min", min), ("max", max)):
        present = [x[key] for x in (a, b) if key in x]
        if present:
            merged[key] = pick(present)
    if "counts" in a and "counts" in b:
        counts = dict(a["counts"])
        for value, count in b["counts"].items():
            counts[value] = counts.get(value, 0) + count
        if len(counts) <= COUNTS_MAX:
            merged["counts"] = counts
    return merged


def column_stats(dataset, columns: list[str]) -> dict:
    """Statistics of ``columns`` in one distributed pass: a task per block
    computes partials, the driver merges them (small values only)."""
    partial_refs, merged = [], {c: {} for c in columns}
    window = max(1, int(tray.cluster_resources().get("CPU", 1)) * 2)
    for bundle in dataset._bundles():
        for ref in bundle.refs:
            partial_refs.append(_partial_stats.remote(ref, columns))
            if len(partial_refs) >= window:  # bounded: merge as they finish
                _merge_into(merged, tray.get(partial_refs.pop(0)), dataset)
    for ref in partial_refs:
        _merge_into(merged, tray.get(ref), dataset)
    for column, entry in merged.items():
        if not entry:
            merged[column] = {"rows": 0, "count": 0, "sum": 0, "mean": None, "min": None,
                              "max": None, "m2": 0.0, "counts": {}}
        else:
            entry.setdefault("sum", None)
            entry.setdefault("mean", None)
            entry.setdefault("min", None)
            entry.setdefault("max", None)
    return merged


def _merge_into(merged: dict, partial: dict, dataset) -> None:
    for column, entry in partial.items():
        merged[column] = _merge(merged[column], entry)


def entry_std(entry: dict, ddof: int):
    count = entry.get("count", 0)
    if not count or count - ddof <= 0 or entry.get("m2") is None:
        return None
    return float(np.sqrt(entry["m2"] / (count - ddof)))
