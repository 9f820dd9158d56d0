"""``Dataset``: a lazy, immutable plan over blocks, with Ray Data's API.

Every transform returns a new ``Dataset`` whose plan has one more logical
operator; every consumer compiles the plan and runs it with the streaming
executor (``_executor``). As in Ray, a dataset consumed twice executes
twice, unless it was ``materialize()``d.

Beside it: how a transform's function runs (``_compute``), ``groupby``
(``_grouped_data``), the column statistics behind ``sum``/``std``/
``unique`` (``_column_stats``), and iteration and ``streaming_split``
(``_iterator``).
"""

from __future__ import annotations

import inspect
import itertools

import numpy as np
import pyarrow as pa

import tray

from . import _block as B
from . import _column_stats as CS
from . import _compute as C
from . import _operators as O
from . import _plan as P
from . import _shuffle as S
from . import _transforms as T
from ._context import DataContext
from ._grouped_data import GroupedData
from ._iterator import DataIterator, SplitCoordinator, StreamSplitIterator
from ._seed import fresh_seed


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
        name = f"MapBatches({C.fn_name(fn)})"
        explicit_batch_size = isinstance(batch_size, int) and not isinstance(batch_size, bool)
        pool, task_concurrency = C.pool_and_concurrency(fn, compute, concurrency, "map_batches")
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
        args = C.remote_args(num_cpus, num_gpus, memory, ray_remote_args, actor=pool is not None)
        return self._with(P.map_op(self._plan, name, transform, remote_args=args,
                                   pool_size=pool, concurrency=task_concurrency,
                                   min_rows_per_bundle=batch_size,
                                   explicit_batch_size=explicit_batch_size))

    def _row_op(self, kind, label: str, fn, compute, fn_args, fn_kwargs, fn_constructor_args,
                fn_constructor_kwargs, num_cpus, num_gpus, memory, concurrency,
                ray_remote_args) -> Dataset:
        name = f"{label}({C.fn_name(fn)})"
        pool, task_concurrency = C.pool_and_concurrency(fn, compute, concurrency, label.lower())
        user_fn = T._UserFn(fn, fn_args, fn_kwargs, fn_constructor_args, fn_constructor_kwargs)
        args = C.remote_args(num_cpus, num_gpus, memory, ray_remote_args, actor=pool is not None)
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
        args = C.remote_args(None, None, None, {}, actor=False)
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

    def sort(self, key, descending: bool | list = False) -> Dataset:
        """Sort by ``key`` (a column or a list of them); ``descending`` is
        one bool for every key or a list of them, one per key (Ray's)."""
        keys = [key] if isinstance(key, str) else list(key or [])
        if not keys or not all(isinstance(k, str) for k in keys):
            raise ValueError(f"sort: key must be a column name or a list of them, got {key!r}")
        if isinstance(descending, (list, tuple)):
            if len(descending) != len(keys):
                raise ValueError(f"sort: descending must be a bool or a list of one per key; "
                                 f"got {len(descending)} for {len(keys)} keys")
            directions = [bool(d) for d in descending]
        else:
            directions = bool(descending)

        def plan(bundles):
            return (yield from S.sort_plan(bundles, keys, directions))

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
        return CS.column_stats(self, columns)

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
        values = [CS.entry_std(stats[c], ddof) for c in columns]
        return values[0] if isinstance(on, str) else dict(zip(columns, values, strict=False))

    def unique(self, column: str) -> list:
        return sorted(self._column_stats([column])[column]["counts"], key=CS.value_sort_key)

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
                [O.Bundle([r], [m]) for r, m in group], "Split") for group in groups]
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
                    bundles.append(O.Bundle([ref], [meta]))
                else:
                    block_ref, meta_ref = S.gather_rows.options(num_returns=2).remote(
                        [(lo - offset, hi - offset)], ref)
                    pending.append((len(bundles), block_ref, meta_ref, ref))
                    bundles.append(None)
            offset += meta.num_rows
        metas = tray.get([meta_ref for _, _, meta_ref, _ in pending]) if pending else []
        for (index, block_ref, _, source), meta in zip(pending, metas, strict=False):
            bundles[index] = O.Bundle([block_ref], [meta], pins=[source])
        return MaterializedDataset.from_bundles(bundles, "Split")


DataIterator.materialized_class = MaterializedDataset  # what DataIterator.materialize builds
