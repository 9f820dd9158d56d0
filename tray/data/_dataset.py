"""``Dataset``: a lazy, immutable plan over blocks, with Ray Data's API.

Every transform returns a new ``Dataset`` whose plan has one more logical
operator; every consumer compiles the plan and runs it with the streaming
executor (``_executor``). As in Ray, a dataset consumed twice executes
twice, unless it was ``materialize()``d.
"""

from __future__ import annotations

import inspect
import itertools

import numpy as np
import pyarrow as pa

import tray

from . import _block as B
from . import _executor as E
from . import _plan as P
from . import _shuffle as S
from . import _transforms as T
from ._context import DataContext
from ._iterator import DataIterator, SplitCoordinator, StreamSplitIterator
from ._seed import fresh_seed

# ================================================================ helpers


def _fn_name(fn) -> str:
    return getattr(fn, "__name__", None) or type(fn).__name__


def _remote_args(num_cpus, num_gpus, memory, ray_remote_args: dict, *, actor: bool) -> dict:
    args = dict(ray_remote_args)
    if num_cpus is not None:
        args["num_cpus"] = num_cpus
    if num_gpus is not None:
        args["num_gpus"] = num_gpus
    if memory is not None:
        args["memory"] = memory
    if not actor:
        args.setdefault("max_retries", DataContext.get_current().task_max_retries)
    # Unknown options and bad values fail here, at the call, naming them
    # (tray's own check of remote options).
    if args:
        tray.remote(**args)(_ProbeActor if actor else _probe)
    return args


def _probe():  # what options are validated against
    return None


class _ProbeActor:
    pass


class ActorPoolStrategy:
    """``compute=ActorPoolStrategy(size=N)``: run a callable class on N actors."""

    def __init__(self, size: int | None = None, min_size: int | None = None,
                 max_size: int | None = None) -> None:
        chosen = size or max_size or min_size
        if chosen is None or not isinstance(chosen, int) or chosen < 1:
            raise ValueError(f"ActorPoolStrategy needs a positive size, got size={size!r}, "
                             f"min_size={min_size!r}, max_size={max_size!r}")
        self.size = chosen


class TaskPoolStrategy:
    def __init__(self, size: int | None = None) -> None:
        self.size = size


def _pool_and_concurrency(fn, compute, concurrency, what: str):
    """(actor pool size or None, task concurrency or None) for ``fn``."""
    is_class = inspect.isclass(fn)
    if not is_class and not callable(fn):
        raise TypeError(f"{what}: fn must be a function or a callable class, got {fn!r}")
    if isinstance(compute, ActorPoolStrategy):
        if not is_class:
            raise ValueError(f"{what}: an ActorPoolStrategy needs a callable class as fn, "
                             f"got the function {_fn_name(fn)!r}")
        return compute.size, None
    if concurrency is not None:
        if isinstance(concurrency, tuple):
            if len(concurrency) != 2 or not all(isinstance(c, int) and c > 0
                                                for c in concurrency):
                raise ValueError(f"{what}: concurrency must be a positive int or a (min, max) "
                                 f"tuple, got {concurrency!r}")
            concurrency = concurrency[1]
        if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
            raise ValueError(f"{what}: concurrency must be a positive integer, "
                             f"got {concurrency!r}")
    if is_class:
        if concurrency is None:
            raise ValueError(f"{what}: fn is the callable class {fn.__name__!r}, which runs on "
                             "a pool of actors: say how many with concurrency=N")
        if not any("__call__" in vars(k) for k in fn.__mro__[:-1]):
            raise TypeError(f"{what}: the class {fn.__name__!r} has no __call__ method")
        return concurrency, None
    if isinstance(compute, TaskPoolStrategy) and compute.size:
        concurrency = compute.size
    return None, concurrency


class Schema:
    """A dataset's columns and their types (Ray's ``Schema``)."""

    def __init__(self, base_schema: pa.Schema) -> None:
        self.base_schema = base_schema

    @property
    def names(self) -> list[str]:
        return list(self.base_schema.names)

    @property
    def types(self) -> list:
        return list(self.base_schema.types)

    def __eq__(self, other) -> bool:
        return isinstance(other, Schema) and other.base_schema == self.base_schema

    def __repr__(self) -> str:
        width = max((len(n) for n in self.names), default=0)
        lines = ["Column" + " " * max(0, width - 6) + "  Type",
                 "-" * max(6, width) + "  ----"]
        lines += [f"{name:<{max(6, width)}}  {dtype}" for name, dtype in
                  zip(self.names, self.types, strict=False)]
        return "\n".join(lines)


# ================================================================ Dataset


class Dataset:
    """A distributed collection of rows in Arrow blocks; lazy."""

    def __init__(self, plan: P.LogicalOp) -> None:
        self._plan = plan
        self._last_stats = ""

    def __repr__(self) -> str:
        return f"{type(self).__name__}(plan={P.describe(self._plan)})"

    # -------------------------------------------------------------- execution

    def _record_stats(self, executor) -> None:
        self._last_stats = executor.summary()

    def _bundles(self):
        """Run the plan; yields bundles (refs and metadata, no data)."""
        return P.execute_plan(self._plan, DataContext.get_current(), self._record_stats)

    def iterator(self) -> DataIterator:
        return DataIterator(self._bundles, P.describe(self._plan))

    def _with(self, node: P.LogicalOp) -> Dataset:
        return Dataset(node)

    # -------------------------------------------------------------- transforms

    def map_batches(self, fn, *, batch_size="default", compute=None,
                    batch_format: str = "default", zero_copy_batch: bool = False,
                    fn_args=None, fn_kwargs=None, fn_constructor_args=None,
                    fn_constructor_kwargs=None, num_cpus=None, num_gpus=None, memory=None,
                    concurrency=None, **ray_remote_args) -> Dataset:
        """Apply ``fn`` to batches: a function runs as tasks, a callable
        class on a pool of ``concurrency`` actors (each constructs it once)."""
        name = f"MapBatches({_fn_name(fn)})"
        explicit_batch_size = isinstance(batch_size, int) and not isinstance(batch_size, bool)
        pool, task_concurrency = _pool_and_concurrency(fn, compute, concurrency, "map_batches")
        if not inspect.isclass(fn) and (fn_constructor_args or fn_constructor_kwargs):
            raise ValueError("map_batches: fn_constructor_args and fn_constructor_kwargs apply "
                             "to callable classes only")
        if batch_size == "default":
            batch_size = DataContext.get_current().default_batch_size
        if batch_size is not None and (isinstance(batch_size, bool) or
                                       not isinstance(batch_size, int) or batch_size <= 0):
            raise ValueError(f"map_batches: batch_size must be a positive integer, None or "
                             f"'default', got {batch_size!r}")
        B.check_batch_format(batch_format)
        user_fn = T._UserFn(fn, fn_args, fn_kwargs, fn_constructor_args, fn_constructor_kwargs)
        transform = T.MapBatches(name, user_fn, batch_size, batch_format, zero_copy_batch)
        args = _remote_args(num_cpus, num_gpus, memory, ray_remote_args, actor=pool is not None)
        return self._with(P.map_op(self._plan, name, transform, remote_args=args,
                                   pool_size=pool, concurrency=task_concurrency,
                                   min_rows_per_bundle=batch_size,
                                   explicit_batch_size=explicit_batch_size))

    def _row_op(self, kind, label: str, fn, compute, fn_args, fn_kwargs, fn_constructor_args,
                fn_constructor_kwargs, num_cpus, num_gpus, memory, concurrency,
                ray_remote_args) -> Dataset:
        name = f"{label}({_fn_name(fn)})"
        pool, task_concurrency = _pool_and_concurrency(fn, compute, concurrency, label.lower())
        user_fn = T._UserFn(fn, fn_args, fn_kwargs, fn_constructor_args, fn_constructor_kwargs)
        args = _remote_args(num_cpus, num_gpus, memory, ray_remote_args, actor=pool is not None)
        return self._with(P.map_op(self._plan, name, kind(name, user_fn), remote_args=args,
                                   pool_size=pool, concurrency=task_concurrency))

    def map(self, fn, *, compute=None, fn_args=None, fn_kwargs=None, fn_constructor_args=None,
            fn_constructor_kwargs=None, num_cpus=None, num_gpus=None, memory=None,
            concurrency=None, **ray_remote_args) -> Dataset:
        """Apply ``fn`` to each row (a dict); it returns a dict."""
        return self._row_op(T.MapRows, "Map", fn, compute, fn_args, fn_kwargs,
                            fn_constructor_args, fn_constructor_kwargs, num_cpus, num_gpus,
                            memory, concurrency, ray_remote_args)

    def flat_map(self, fn, *, compute=None, fn_args=None, fn_kwargs=None,
                 fn_constructor_args=None, fn_constructor_kwargs=None, num_cpus=None,
                 num_gpus=None, memory=None, concurrency=None, **ray_remote_args) -> Dataset:
        """Apply ``fn`` to each row; it returns a list of rows."""
        return self._row_op(T.FlatMap, "FlatMap", fn, compute, fn_args, fn_kwargs,
                            fn_constructor_args, fn_constructor_kwargs, num_cpus, num_gpus,
                            memory, concurrency, ray_remote_args)

    def filter(self, fn, *, compute=None, fn_args=None, fn_kwargs=None,
               fn_constructor_args=None, fn_constructor_kwargs=None, num_cpus=None,
               num_gpus=None, memory=None, concurrency=None, **ray_remote_args) -> Dataset:
        """Keep the rows for which ``fn(row)`` is true."""
        return self._row_op(T.Filter, "Filter", fn, compute, fn_args, fn_kwargs,
                            fn_constructor_args, fn_constructor_kwargs, num_cpus, num_gpus,
                            memory, concurrency, ray_remote_args)

    def _table_op(self, name: str, fn) -> Dataset:
        args = _remote_args(None, None, None, {}, actor=False)
        return self._with(P.map_op(self._plan, name, T.TableFn(name, fn), remote_args=args))

    def add_column(self, col: str, fn, *, batch_format: str = "pandas", compute=None,
                   concurrency=None, **ray_remote_args) -> Dataset:
        """Add (or replace) column ``col`` with ``fn(batch)``'s values."""
        if not isinstance(col, str) or not col:
            raise ValueError(f"add_column: the column name must be a non-empty string, "
                             f"got {col!r}")
        if not callable(fn):
            raise TypeError(f"add_column: fn must be callable, got {fn!r}")
        batch_format = B.check_batch_format(batch_format)

        def add(batch):
            values = fn(batch)
            if batch_format == "pyarrow":
                column = B.numpy_to_column(values)
                if col in batch.column_names:
                    return batch.set_column(batch.column_names.index(col), col, column)
                return batch.append_column(col, column)
            batch[col] = values
            return batch

        add.__name__ = f"add_column[{col}]"
        return self.map_batches(add, batch_format=batch_format, batch_size=None,
                                compute=compute, concurrency=concurrency, **ray_remote_args)

    def drop_columns(self, cols) -> Dataset:
        cols = [cols] if isinstance(cols, str) else list(cols)

        def drop(table, _index):
            missing = [c for c in cols if c not in table.column_names]
            if missing and table.num_columns:
                raise ValueError(f"drop_columns: no column(s) {missing}; the dataset has "
                                 f"{table.column_names}")
            return table.drop_columns([c for c in cols if c in table.column_names])

        return self._table_op(f"DropColumns({cols})", drop)

    def select_columns(self, cols) -> Dataset:
        cols = [cols] if isinstance(cols, str) else list(cols)

        def select(table, _index):
            missing = [c for c in cols if c not in table.column_names]
            if missing and table.num_columns:
                raise ValueError(f"select_columns: no column(s) {missing}; the dataset has "
                                 f"{table.column_names}")
            return table.select(cols) if table.num_columns else table

        return self._table_op(f"SelectColumns({cols})", select)

    def rename_columns(self, names) -> Dataset:
        if not isinstance(names, (dict, list, tuple)):
            raise TypeError(f"rename_columns takes a dict old -> new or a list of new names, "
                            f"got {names!r}")

        def rename(table, _index):
            if isinstance(names, dict):
                missing = [c for c in names if c not in table.column_names]
                if missing and table.num_columns:
                    raise ValueError(f"rename_columns: no column(s) {missing}; the dataset has "
                                     f"{table.column_names}")
                return table.rename_columns([names.get(c, c) for c in table.column_names])
            if table.num_columns and len(names) != table.num_columns:
                raise ValueError(f"rename_columns: {len(names)} names for "
                                 f"{table.num_columns} columns")
            return table.rename_columns(list(names)) if table.num_columns else table

        return self._table_op("RenameColumns", rename)

    def random_shuffle(self, *, seed: int | None = None, num_blocks=None) -> Dataset:
        """Shuffle all rows. Without a seed the order differs per execution
        (from the simulator's seed in the simulator; see fresh_seed)."""
        def plan(bundles):
            chosen = seed if seed is not None else fresh_seed()
            return (yield from S.shuffle_plan(bundles, chosen))

        return self._with(P.all_to_all_op([self._plan], "RandomShuffle", plan))

    def randomize_block_order(self, *, seed: int | None = None) -> Dataset:
        def plan(bundles):
            chosen = seed if seed is not None else fresh_seed()
            blocks = [(ref, meta, bundle.pins) for bundle in bundles
                      for ref, meta in zip(bundle.refs, bundle.metas, strict=False)]
            order = np.random.default_rng(chosen).permutation(len(blocks))
            if False:
                yield []
            return [S.CallResult([blocks[i][0]], blocks[i][1], blocks[i][2]) for i in order]

        return self._with(P.all_to_all_op([self._plan], "RandomizeBlockOrder", plan))

    def sort(self, key, descending: bool = False) -> Dataset:
        keys = [key] if isinstance(key, str) else list(key or [])
        if not keys or not all(isinstance(k, str) for k in keys):
            raise ValueError(f"sort: key must be a column name or a list of them, got {key!r}")

        def plan(bundles):
            return (yield from S.sort_plan(bundles, keys, bool(descending)))

        return self._with(P.all_to_all_op([self._plan], f"Sort({keys})", plan))

    def groupby(self, key) -> GroupedData:
        keys = [key] if isinstance(key, str) else list(key or [])
        if not keys or not all(isinstance(k, str) for k in keys):
            raise ValueError(f"groupby: key must be a column name or a list of them, got {key!r}")
        return GroupedData(self, keys)

    def repartition(self, num_blocks: int, *, shuffle: bool = False) -> Dataset:
        if isinstance(num_blocks, bool) or not isinstance(num_blocks, int) or num_blocks < 1:
            raise ValueError(f"repartition: num_blocks must be a positive integer, "
                             f"got {num_blocks!r}")

        def plan(bundles):
            return (yield from S.repartition_plan(bundles, num_blocks, shuffle))

        return self._with(P.all_to_all_op([self._plan], f"Repartition[{num_blocks}]", plan))

    def union(self, *others: Dataset) -> Dataset:
        for other in others:
            if not isinstance(other, Dataset):
                raise TypeError(f"union takes datasets, got {type(other).__name__}")
        return self._with(P.union_op([self._plan, *(o._plan for o in others)]))

    def zip(self, other: Dataset) -> Dataset:
        """Columns of both, row by row (same row counts); a duplicate name
        from ``other`` gets a suffix, as in Ray (``x`` -> ``x_1``)."""
        if not isinstance(other, Dataset):
            raise TypeError(f"zip takes a dataset, got {type(other).__name__}")

        def plan(left, right):
            return (yield from S.zip_plan(left, right))

        return self._with(P.all_to_all_op([self._plan, other._plan], "Zip", plan))

    def limit(self, limit: int) -> Dataset:
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
            raise ValueError(f"limit must be a non-negative integer, got {limit!r}")
        return self._with(P.limit_op(self._plan, limit))

    # -------------------------------------------------------------- consumption

    def iter_batches(self, **kwargs):
        return self.iterator().iter_batches(**kwargs)

    def iter_rows(self, **kwargs):
        return self.iterator().iter_rows(**kwargs)

    def iter_torch_batches(self, **kwargs):
        return self.iterator().iter_torch_batches(**kwargs)

    def take(self, limit: int = 20) -> list[dict]:
        return list(itertools.islice(self.limit(limit).iter_rows(), limit))

    def take_all(self, limit: int | None = None) -> list[dict]:
        rows = []
        for row in self.iter_rows():
            rows.append(row)
            if limit is not None and len(rows) > limit:
                raise ValueError(f"the dataset has more than the given limit of {limit} rows")
        return rows

    def take_batch(self, batch_size: int = 20, *, batch_format: str = "default"):
        batches = self.limit(batch_size).iter_batches(batch_size=batch_size,
                                                      batch_format=batch_format)
        for batch in batches:
            return batch
        raise ValueError("take_batch: the dataset is empty")

    def show(self, limit: int = 20) -> None:
        for row in self.take(limit):
            print(row)

    def count(self) -> int:
        return sum(bundle.num_rows for bundle in self._bundles())

    def schema(self) -> Schema | None:
        """The columns and types, from the first non-empty block (executing
        only as far as needed)."""
        bundles = self._bundles()
        try:
            for bundle in bundles:
                for meta in bundle.metas:
                    if meta.schema is not None and meta.num_rows:
                        return Schema(meta.schema)
        finally:
            bundles.close()
        return None

    def columns(self) -> list[str] | None:
        schema = self.schema()
        return schema.names if schema is not None else None

    def to_pandas(self, limit: int | None = None):
        rows = self.count() if limit is not None else None
        if limit is not None and rows > limit:
            raise ValueError(f"the dataset has {rows} rows, more than limit={limit}; raise the "
                             "limit or use iter_batches()")
        blocks = [tray.get(ref) for bundle in self._bundles() for ref in bundle.refs]
        return B.block_to_pandas(B.concat(blocks))

    def to_arrow_refs(self) -> list:
        return [ref for bundle in self._bundles() for ref in bundle.refs]

    def to_numpy_refs(self, *, column: str | None = None) -> list:
        refs = self.to_arrow_refs()
        return [_to_numpy.remote(ref, column) for ref in refs]

    def materialize(self) -> MaterializedDataset:
        """Execute now and keep the blocks; the result re-reads them."""
        result = MaterializedDataset.from_bundles(list(self._bundles()), "Materialized")
        result._last_stats = self._last_stats
        return result

    def stats(self) -> str:
        """Per-operator statistics of this dataset's last execution."""
        return self._last_stats or "(this dataset has not been executed yet)"

    def num_blocks(self) -> int:
        return sum(len(bundle.refs) for bundle in self.materialize()._input_bundles())

    # -------------------------------------------------------------- aggregates

    def _column_stats(self, columns: list[str]) -> dict:
        return column_stats(self, columns)

    def _global(self, kind: str, on):
        columns = [on] if isinstance(on, str) else list(on or [])
        if not columns:
            raise ValueError(f"{kind}: name the column(s) to aggregate with on=")
        stats = self._column_stats(columns)
        values = [stats[c][kind] for c in columns]
        return values[0] if isinstance(on, str) else dict(zip(columns, values, strict=False))

    def sum(self, on):
        return self._global("sum", on)

    def min(self, on):
        return self._global("min", on)

    def max(self, on):
        return self._global("max", on)

    def mean(self, on):
        return self._global("mean", on)

    def std(self, on, ddof: int = 1):
        columns = [on] if isinstance(on, str) else list(on)
        stats = self._column_stats(columns)
        values = [_std(stats[c], ddof) for c in columns]
        return values[0] if isinstance(on, str) else dict(zip(columns, values, strict=False))

    def unique(self, column: str) -> list:
        return sorted(self._column_stats([column])[column]["counts"], key=_sort_key)

    # -------------------------------------------------------------- splits

    def split(self, n: int, *, equal: bool = False, locality_hints=None) -> list:
        _check_positive("split", "n", n)
        materialized = self.materialize()
        total = materialized.count()
        if equal:
            share = total // n
            return materialized.split_at_indices([share * i for i in range(1, n + 1)])[:n]
        blocks = materialized._blocks_list()
        if len(blocks) >= n:
            groups, start = [], 0
            for i in range(n):
                stop = len(blocks) * (i + 1) // n
                groups.append(blocks[start:stop])
                start = stop
            return [MaterializedDataset.from_bundles(
                [E.Bundle([r], [m]) for r, m in group], "Split") for group in groups]
        return materialized.split_at_indices([total * i // n for i in range(1, n)])

    def split_at_indices(self, indices: list) -> list:
        if not isinstance(indices, (list, tuple)) or not all(
                isinstance(i, int) and not isinstance(i, bool) for i in indices):
            raise ValueError(f"split_at_indices takes a list of integers, got {indices!r}")
        if any(i < 0 for i in indices):
            raise ValueError(f"split_at_indices: indices must be non-negative, got {indices}")
        if list(indices) != sorted(indices):
            raise ValueError(f"split_at_indices: indices must be sorted, got {indices}")
        materialized = self.materialize()
        blocks = materialized._blocks_list()
        total = sum(meta.num_rows for _, meta in blocks)
        bounds = [0, *[min(i, total) for i in indices], total]
        return [materialized._slice_rows(bounds[i], bounds[i + 1])
                for i in range(len(bounds) - 1)]

    def train_test_split(self, test_size, *, shuffle: bool = False, seed: int | None = None,
                         stratify=None) -> tuple:
        if stratify is not None:
            raise NotImplementedError("train_test_split(stratify=...) is not supported yet")
        dataset = self.random_shuffle(seed=seed) if shuffle else self
        materialized = dataset.materialize()
        total = materialized.count()
        if isinstance(test_size, float):
            if not 0 < test_size < 1:
                raise ValueError(f"train_test_split: a float test_size must be in (0, 1), "
                                 f"got {test_size}")
            test_rows = int(total * test_size)
        elif isinstance(test_size, int) and not isinstance(test_size, bool):
            if not 0 < test_size < total:
                raise ValueError(f"train_test_split: an int test_size must be in (0, {total}), "
                                 f"got {test_size}")
            test_rows = test_size
        else:
            raise TypeError(f"train_test_split: test_size must be a float or an int, "
                            f"got {test_size!r}")
        train, test = materialized.split_at_indices([total - test_rows])
        return train, test

    def streaming_split(self, n: int, *, equal: bool = False, locality_hints=None) -> list:
        """``n`` iterators over one execution, for ``n`` concurrent
        consumers (each must consume its share of every epoch)."""
        _check_positive("streaming_split", "n", n)
        coordinator = SplitCoordinator.options(num_cpus=0, max_concurrency=1).remote(
            self._plan, n, bool(equal), DataContext.get_current())
        return [StreamSplitIterator(coordinator, i, n) for i in range(n)]

    # -------------------------------------------------------------- writes

    def _write(self, kind: str, path: str, **options) -> None:
        if not isinstance(path, str) or not path:
            raise ValueError(f"write_{kind}: path must be a directory path, got {path!r}")
        prefix = f"{fresh_seed() & 0xFFFFFFFF:08x}"
        name = f"Write{kind.capitalize()}"
        written = self._table_op(name, _datasource().write_block(kind, path, prefix, options))
        for _ in written._bundles():
            pass

    def write_parquet(self, path: str, **_options) -> None:
        self._write("parquet", path)

    def write_csv(self, path: str, **_options) -> None:
        self._write("csv", path)

    def write_json(self, path: str, **_options) -> None:
        self._write("json", path)

    def write_numpy(self, path: str, *, column: str = "data", **_options) -> None:
        self._write("numpy", path, column=column)


def _datasource():
    from . import _datasource

    return _datasource


def _check_positive(what: str, name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{what}: {name} must be a positive integer, got {value!r}")


@tray.remote
def _to_numpy(block, column):
    if column is None:
        return B.block_to_batch(block, "numpy")
    if column not in block.column_names:
        raise ValueError(f"to_numpy_refs: no column {column!r}; the dataset has "
                         f"{block.column_names}")
    return B.column_to_numpy(block.column(column))


class MaterializedDataset(Dataset):
    """A dataset whose blocks exist (``materialize()``, ``split``)."""

    @classmethod
    def from_bundles(cls, bundles: list, name: str) -> MaterializedDataset:
        return cls(P.input_op(name, bundles))

    def _input_bundles(self) -> list:
        return self._plan.params["bundles"]

    def _blocks_list(self) -> list:
        return [(ref, meta) for bundle in self._input_bundles()
                for ref, meta in zip(bundle.refs, bundle.metas, strict=False)]

    def count(self) -> int:
        return sum(meta.num_rows for _, meta in self._blocks_list())

    def num_blocks(self) -> int:
        return len(self._blocks_list())

    def materialize(self) -> MaterializedDataset:
        return self

    def _slice_rows(self, start: int, stop: int) -> MaterializedDataset:
        bundles, offset = [], 0
        pending = []
        for ref, meta in self._blocks_list():
            lo, hi = max(start, offset), min(stop, offset + meta.num_rows)
            if lo < hi:
                if lo == offset and hi == offset + meta.num_rows:
                    bundles.append(E.Bundle([ref], [meta]))
                else:
                    block_ref, meta_ref = S.gather_rows.options(num_returns=2).remote(
                        [(lo - offset, hi - offset)], ref)
                    pending.append((len(bundles), block_ref, meta_ref, ref))
                    bundles.append(None)
            offset += meta.num_rows
        metas = tray.get([meta_ref for _, _, meta_ref, _ in pending]) if pending else []
        for (index, block_ref, _, source), meta in zip(pending, metas, strict=False):
            bundles[index] = E.Bundle([block_ref], [meta], pins=[source])
        return MaterializedDataset.from_bundles(bundles, "Split")


DataIterator.materialized_class = MaterializedDataset  # what DataIterator.materialize builds


# ================================================================ groupby


class GroupedData:
    """``ds.groupby(key)``: aggregations and map_groups. Outputs are sorted
    by key, as in Ray."""

    def __init__(self, dataset: Dataset, keys: list) -> None:
        self._dataset = dataset
        self._keys = keys

    def __repr__(self) -> str:
        return f"GroupedData(keys={self._keys})"

    def _aggregate(self, label: str, aggregations: list) -> Dataset:
        keys = self._keys

        def plan(bundles):
            return (yield from S.aggregate_plan(bundles, keys, aggregations))

        return Dataset(P.all_to_all_op([self._dataset._plan], f"Aggregate[{label}]", plan))

    def _on(self, kind: str, on, ddof: int = 1) -> Dataset:
        columns = [on] if isinstance(on, str) else list(on or [])
        if not columns:
            raise ValueError(f"groupby().{kind}: name the column(s) with on=")
        return self._aggregate(f"{kind}({', '.join(columns)})",
                               [(kind, c, ddof) for c in columns])

    def count(self) -> Dataset:
        return self._aggregate("count()", [("count", None, 0)])

    def sum(self, on=None) -> Dataset:
        return self._on("sum", on)

    def min(self, on=None) -> Dataset:
        return self._on("min", on)

    def max(self, on=None) -> Dataset:
        return self._on("max", on)

    def mean(self, on=None) -> Dataset:
        return self._on("mean", on)

    def std(self, on=None, ddof: int = 1) -> Dataset:
        return self._on("std", on, ddof)

    def map_groups(self, fn, *, compute=None, batch_format: str = "default", fn_args=None,
                   fn_kwargs=None, fn_constructor_args=None, fn_constructor_kwargs=None,
                   num_cpus=None, num_gpus=None, memory=None, concurrency=None,
                   **ray_remote_args) -> Dataset:
        """Apply ``fn`` to each group as one batch."""
        keys = self._keys

        def plan(bundles):
            return (yield from S.group_partition_plan(bundles, keys))

        grouped = Dataset(P.all_to_all_op([self._dataset._plan], f"GroupBy({keys})", plan))
        name = f"MapGroups({_fn_name(fn)})"
        pool, task_concurrency = _pool_and_concurrency(fn, compute, concurrency, "map_groups")
        user_fn = T._UserFn(fn, fn_args, fn_kwargs, fn_constructor_args, fn_constructor_kwargs)
        transform = MapGroups(name, user_fn, keys, batch_format)
        args = _remote_args(num_cpus, num_gpus, memory, ray_remote_args, actor=pool is not None)
        return Dataset(P.map_op(grouped._plan, name, transform, remote_args=args,
                                pool_size=pool, concurrency=task_concurrency))


class MapGroups(T.MapBatches):
    """Splits each (key-sorted, whole-group) block into its groups and calls
    ``fn`` once per group."""

    def __init__(self, name, fn, keys, batch_format) -> None:
        super().__init__(name, fn, None, batch_format)
        self.keys = keys

    def init_in_actor(self):
        return MapGroups(self.name, self.fn.instantiate(), self.keys, self.batch_format)

    def apply(self, blocks: list, task_index: int) -> list:
        table = B.concat(blocks)
        if table.num_rows == 0:
            return []
        change = np.zeros(table.num_rows, dtype=bool)
        change[0] = True
        for key in self.keys:
            values = B.column_to_numpy(table.column(key))
            change[1:] |= values[1:] != values[:-1]
        starts = list(np.flatnonzero(change)) + [table.num_rows]
        outputs = []
        for start, stop in zip(starts[:-1], starts[1:], strict=False):
            batch = B.block_to_batch(B.take_rows(table, int(start), int(stop)),
                                     self.batch_format)
            outputs.append(B.batch_to_block(self.fn(batch), self.name))
        return outputs


# ================================================================ column statistics


def _sort_key(value):
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


def column_stats(dataset: Dataset, columns: list[str]) -> dict:
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


def _std(entry: dict, ddof: int):
    count = entry.get("count", 0)
    if not count or count - ddof <= 0 or entry.get("m2") is None:
        return None
    return float(np.sqrt(entry["m2"] / (count - ddof)))
