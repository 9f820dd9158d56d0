"""The all-to-all operations as map-reduce rounds of tasks.

Every operation here is a plan written as a generator: it yields a list of
``Call``s (a round of tasks), the executor runs them within its limits and
sends back their results, and the generator goes on to the next round or
emits output bundles. Ray Data's sort, shuffle and groupby have the same
shape (sample, partition, reduce); keeping each as one readable function,
not a state machine, is what the generator buys.

Every task returns its blocks first and a small value (metadata, samples)
last; only the small value travels to the driver. Partitioning is by range
for sort, groupby and map_groups (sampled boundaries, so outputs come out
in key order, as Ray's do) and by a seeded random draw for random_shuffle.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

import tray

from . import _block as B

SAMPLES_PER_BLOCK = 32


@dataclass
class Call:
    """One task of a round: ``remote`` with ``args``; ``num_blocks`` block
    returns come before the small value."""
    remote: object
    args: tuple
    num_blocks: int
    pins: list = field(default_factory=list)  # refs to keep alive with its output


@dataclass
class CallResult:
    block_refs: list
    value: object
    pins: list


# ================================================================ tasks


@tray.remote
def sample_keys(block, key: str, count: int):
    if block.num_rows == 0:
        return np.array([])
    if key not in block.column_names:
        raise ValueError(f"no column {key!r} to sort or group by; the dataset has "
                         f"{block.column_names}")
    keys = B.column_to_numpy(block.column(key))
    positions = np.linspace(0, len(keys) - 1, num=min(count, len(keys))).astype(np.int64)
    return keys[positions]


def _split_by(block: pa.Table, partition: np.ndarray, num_parts: int) -> list:
    """The rows of each partition, in their order in ``block``; one copy
    of the data (a take per part), since a slice would pickle whole
    parent buffers."""
    order = np.argsort(partition, kind="stable")
    counts = np.bincount(partition, minlength=num_parts)
    parts, start = [], 0
    for count in counts:
        stop = start + int(count)
        parts.append(block.take(order[start:stop]) if count else block.schema.empty_table())
        start = stop
    return parts


def _parts_with_metadata(parts: list):
    return (*parts, [B.metadata_of(part) for part in parts])


@tray.remote
def partition_by_range(block, key: str, boundaries, descending: bool):
    num_parts = len(boundaries) + 1
    if block.num_rows == 0:
        return _parts_with_metadata([block] * num_parts)
    keys = B.column_to_numpy(block.column(key))
    partition = np.searchsorted(boundaries, keys, side="right") if len(boundaries) else \
        np.zeros(len(keys), dtype=np.int64)
    if descending:
        partition = num_parts - 1 - partition
    return _parts_with_metadata(_split_by(block, partition.astype(np.int64), num_parts))


@tray.remote
def partition_random(block, num_parts: int, seed: int):
    rng = np.random.default_rng(seed)
    partition = rng.integers(0, num_parts, size=block.num_rows)
    return _parts_with_metadata(_split_by(block, partition, num_parts))


@tray.remote
def partition_round_robin(block, num_parts: int, offset: int):
    partition = (np.arange(block.num_rows) + offset) % num_parts
    return _parts_with_metadata(_split_by(block, partition, num_parts))


def _with_metadata(block: pa.Table):
    block = B.compact(block)
    return block, B.metadata_of(block)


def _directions(keys: list, descending) -> list:
    """One direction per key: ``descending`` is one bool for all of them
    or a list of bools, one per key (as Ray's ``sort`` takes it)."""
    if isinstance(descending, (list, tuple)):
        return [bool(d) for d in descending]
    return [bool(descending)] * len(keys)


def _sort_table(table: pa.Table, keys: list, descending) -> pa.Table:
    if table.num_rows == 0:
        return table
    return table.sort_by([(key, "descending" if down else "ascending")
                          for key, down in zip(keys, _directions(keys, descending),
                                               strict=True)])


@tray.remote
def sort_reduce(keys: list, descending, *parts):
    return _with_metadata(_sort_table(B.concat(list(parts)), keys, descending))


@tray.remote
def shuffle_reduce(seed: int, *parts):
    table = B.concat(list(parts))
    permutation = np.random.default_rng(seed).permutation(table.num_rows)
    return _with_metadata(table.take(permutation) if table.num_rows else table)


@tray.remote
def concat_reduce(*parts):
    return _with_metadata(B.concat(list(parts)))


@tray.remote(num_cpus=0)
def gather_rows(spans: list, *blocks):
    """Rows ``spans[i] = (start, stop)`` of ``blocks[i]``, in order. No CPU:
    it only copies rows (a limit's slice, a split's share), and it must
    never wait for a CPU that an actor pool holds (a pool as large as the
    cluster then ``take()`` hung: issue 41)."""
    pieces = [B.take_rows(block, start, stop) for block, (start, stop) in zip(blocks, spans, strict=False)]
    return _with_metadata(B.concat(pieces))


@tray.remote
def zip_blocks(left, spans: list, *right_blocks):
    right = B.concat([B.take_rows(block, start, stop)
                      for block, (start, stop) in zip(right_blocks, spans, strict=False)])
    if right.num_rows != left.num_rows:
        raise ValueError(f"zip: a left block of {left.num_rows} rows met {right.num_rows} "
                         "rows of the right dataset")
    columns = dict(zip(left.column_names, left.columns, strict=False))
    for name, column in zip(right.column_names, right.columns, strict=False):
        new_name, suffix = name, 1
        while new_name in columns:
            new_name = f"{name}_{suffix}"
            suffix += 1
        columns[new_name] = column
    return _with_metadata(pa.table(columns))


# Ray's output names: count(), sum(x), min(x), max(x), mean(x), std(x).
ARROW_AGGREGATES = {"sum": "sum", "min": "min", "max": "max", "mean": "mean", "std": "stddev",
                    "count": "count"}


@tray.remote
def aggregate_reduce(keys: list, aggregations: list, *parts):
    """``aggregations``: [(kind, column or None, ddof)] per output column."""
    table = B.concat(list(parts))
    if table.num_rows == 0:
        return _with_metadata(pa.table({}))
    missing = [c for c in [*keys, *(a[1] for a in aggregations if a[1])]
               if c not in table.column_names]
    if missing:
        raise ValueError(f"groupby: no column(s) {missing}; the dataset has {table.column_names}")
    specs, names, arrow_names = [], [], []
    for kind, column, ddof in aggregations:
        if kind == "count":
            specs.append(([], "count_all"))
            names.append("count()")
            arrow_names.append("count_all")
        elif kind == "std":
            specs.append((column, "stddev", pc.VarianceOptions(ddof=ddof)))
            names.append(f"std({column})")
            arrow_names.append(f"{column}_stddev")
        else:
            specs.append((column, ARROW_AGGREGATES[kind]))
            names.append(f"{kind}({column})")
            arrow_names.append(f"{column}_{ARROW_AGGREGATES[kind]}")
    grouped = table.group_by(keys, use_threads=False).aggregate(specs)
    result = pa.table({**{key: grouped.column(key) for key in keys},
                       **{name: grouped.column(arrow_name)
                          for name, arrow_name in zip(names, arrow_names, strict=False)}})
    return _with_metadata(_sort_table(result, keys, False))


# ============================================================ the plans


def boundaries_from(samples: list, num_parts: int) -> np.ndarray:
    values = [s for s in samples if len(s)]
    if not values or num_parts <= 1:
        return np.array([])
    merged = np.sort(np.concatenate(values))
    positions = [int(len(merged) * i / num_parts) for i in range(1, num_parts)]
    return merged[np.minimum(positions, len(merged) - 1)]


def range_partition_plan(bundles: list, key: str, descending: bool, num_parts: int):
    """Rounds 1-2 of sort, groupby and map_groups: sample the key, cut the
    range into ``num_parts``, partition every block. Returns the parts as
    parts[j] = [(ref, metadata) of partition j from each block]."""
    blocks = [(ref, meta) for bundle in bundles for ref, meta in zip(bundle.refs, bundle.metas, strict=False)
              if meta.num_rows > 0]
    if not blocks:
        return []
    samples = yield [Call(sample_keys, (ref, key, SAMPLES_PER_BLOCK), 0) for ref, _ in blocks]
    boundaries = boundaries_from([s.value for s in samples], num_parts)
    partitioned = yield [Call(partition_by_range.options(num_returns=len(boundaries) + 2),
                              (ref, key, boundaries, descending), len(boundaries) + 1)
                         for ref, _ in blocks]
    return _transpose(partitioned)


def _transpose(results: list) -> list:
    num_parts = len(results[0].block_refs) if results else 0
    return [[(r.block_refs[j], r.value[j]) for r in results] for j in range(num_parts)]


def _reduce_calls(parts: list, remote, leading_args: tuple) -> list:
    calls = []
    for column in parts:
        refs = [ref for ref, meta in column if meta.num_rows > 0]
        if refs:
            calls.append(Call(remote, (*leading_args, *refs), 1, pins=refs))
    return calls


def num_parts_for(bundles: list) -> int:
    return max(1, sum(1 for bundle in bundles for meta in bundle.metas if meta.num_rows > 0))


def sort_plan(bundles: list, keys: list, descending):
    """``descending``: a bool, or one per key. Blocks are partitioned by the
    first key's range (in its direction), so rows of equal first keys meet
    in one reduce, which sorts by every key in its own direction."""
    first_descending = _directions(keys, descending)[0]
    parts = yield from range_partition_plan(bundles, keys[0], first_descending,
                                            num_parts_for(bundles))
    results = yield _reduce_calls(parts, sort_reduce, (keys, descending))
    return results


def aggregate_plan(bundles: list, keys: list, aggregations: list):
    parts = yield from range_partition_plan(bundles, keys[0], False, num_parts_for(bundles))
    results = yield _reduce_calls(parts, aggregate_reduce, (keys, aggregations))
    return results


def group_partition_plan(bundles: list, keys: list):
    """map_groups' first half: every group ends up whole in one block,
    sorted by key."""
    parts = yield from range_partition_plan(bundles, keys[0], False, num_parts_for(bundles))
    results = yield _reduce_calls(parts, sort_reduce, (keys, False))
    return results


def shuffle_plan(bundles: list, seed: int):
    blocks = [ref for bundle in bundles for ref, meta in zip(bundle.refs, bundle.metas, strict=False)
              if meta.num_rows > 0]
    if not blocks:
        return []
    num_parts = len(blocks)
    seeds = np.random.default_rng(seed).integers(0, 2**62, size=2 * num_parts)
    partitioned = yield [Call(partition_random.options(num_returns=num_parts + 1),
                              (ref, num_parts, int(seeds[i])), num_parts)
                         for i, ref in enumerate(blocks)]
    parts = _transpose(partitioned)
    calls = []
    for j, column in enumerate(parts):
        refs = [ref for ref, meta in column if meta.num_rows > 0]
        if refs:
            calls.append(Call(shuffle_reduce, (int(seeds[num_parts + j]), *refs), 1, pins=refs))
    results = yield calls
    return results


def repartition_plan(bundles: list, num_blocks: int, shuffle: bool):
    blocks = [(ref, meta) for bundle in bundles for ref, meta in zip(bundle.refs, bundle.metas, strict=False)]
    if shuffle:
        if not blocks:
            return []
        offsets = np.cumsum([0] + [meta.num_rows for _, meta in blocks])
        partitioned = yield [Call(partition_round_robin.options(num_returns=num_blocks + 1),
                                  (ref, num_blocks, int(offsets[i])), num_blocks)
                             for i, (ref, _) in enumerate(blocks)]
        results = yield _reduce_calls(_transpose(partitioned), concat_reduce, ())
        return results
    total = sum(meta.num_rows for _, meta in blocks)
    calls = []
    for i in range(num_blocks):
        calls.append(rows_call(blocks, total * i // num_blocks, total * (i + 1) // num_blocks))
    results = yield [call for call in calls if call is not None]
    return results


def rows_call(blocks: list, start: int, stop: int) -> Call | None:
    """A task gathering global rows [start, stop) of ``blocks`` ((ref, meta) pairs)."""
    if stop <= start:
        return None
    refs, spans, offset = [], [], 0
    for ref, meta in blocks:
        lo, hi = max(start, offset), min(stop, offset + meta.num_rows)
        if lo < hi:
            refs.append(ref)
            spans.append((lo - offset, hi - offset))
        offset += meta.num_rows
    return Call(gather_rows, (spans, *refs), 1, pins=refs)


def zip_plan(left_bundles: list, right_bundles: list):
    left = [(ref, meta) for b in left_bundles for ref, meta in zip(b.refs, b.metas, strict=False)]
    right = [(ref, meta) for b in right_bundles for ref, meta in zip(b.refs, b.metas, strict=False)]
    left_rows = sum(meta.num_rows for _, meta in left)
    right_rows = sum(meta.num_rows for _, meta in right)
    if left_rows != right_rows:
        raise ValueError(f"zip needs datasets with the same number of rows; the left one has "
                         f"{left_rows}, the right one {right_rows}")
    calls, offset = [], 0
    for ref, meta in left:
        if meta.num_rows == 0:
            continue
        gather = rows_call(right, offset, offset + meta.num_rows)
        spans, *right_refs = gather.args
        calls.append(Call(zip_blocks, (ref, spans, *right_refs), 1, pins=[ref, *right_refs]))
        offset += meta.num_rows
    results = yield calls
    return results
