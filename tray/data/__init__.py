"""tray.data: datasets of Arrow blocks, streamed through tasks and actors.

``import tray.data`` works like ``import ray.data``: create a dataset
(``range``, ``from_items``, ``read_parquet``, ...), transform it lazily
(``map_batches``, ``filter``, ``sort``, ``groupby``, ...), and consume it
(``iter_batches``, ``take``, ``write_parquet``, ...). Execution streams
blocks through the cluster within a memory budget (see ``_executor``)."""

from __future__ import annotations

import builtins

import numpy as np
import pyarrow as pa

import tray

from . import _block as B
from . import _datasource as _sources
from . import _plan as P
from ._block import BlockMetadata as BlockMetadata
from ._compute import ActorPoolStrategy as ActorPoolStrategy
from ._compute import TaskPoolStrategy as TaskPoolStrategy
from ._context import DataContext as DataContext
from ._context import ExecutionOptions as ExecutionOptions
from ._context import ExecutionResources as ExecutionResources
from ._dataset import Dataset as Dataset
from ._dataset import MaterializedDataset as MaterializedDataset
from ._dataset import Schema as Schema
from ._grouped_data import GroupedData as GroupedData
from ._iterator import DataIterator as DataIterator
from ._operators import Bundle as _Bundle

# ================================================================ creation


def _num_blocks(override_num_blocks, parallelism, what: str) -> int | None:
    value = override_num_blocks if override_num_blocks is not None else (
        parallelism if parallelism not in (None, -1) else None)
    if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                              or value < 1):
        raise ValueError(f"{what}: override_num_blocks must be a positive integer, got {value!r}")
    return value


def _default_blocks(rows: int) -> int:
    cpus = int(tray.cluster_resources().get("CPU", 1) or 1)
    return max(1, min(rows, max(cpus * 2, 1), 200))


def range(n: int, *, override_num_blocks: int | None = None,  # noqa: A001 - Ray's name
          parallelism: int = -1) -> Dataset:
    """Rows ``{"id": i}`` for ``i`` in ``[0, n)``."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ValueError(f"range: n must be a non-negative integer, got {n!r}")
    blocks = _num_blocks(override_num_blocks, parallelism, "range") or _default_blocks(n)
    return Dataset(P.read_op("ReadRange", _sources.range_tasks(n, blocks)))


def range_tensor(n: int, *, shape: tuple = (1,), override_num_blocks: int | None = None,
                 parallelism: int = -1) -> Dataset:
    """Rows ``{"data": array of `shape` filled with i}``."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ValueError(f"range_tensor: n must be a non-negative integer, got {n!r}")
    shape = tuple(shape)
    if not shape or not all(isinstance(d, int) and d > 0 for d in shape):
        raise ValueError(f"range_tensor: shape must be a tuple of positive ints, got {shape!r}")
    blocks = _num_blocks(override_num_blocks, parallelism, "range_tensor") or _default_blocks(n)
    return Dataset(P.read_op("ReadRangeTensor", _sources.range_tasks(n, blocks, shape)))


def _from_tables(tables: list, name: str) -> MaterializedDataset:
    bundles = []
    for table in tables:
        table = B.compact(table)
        bundles.append(_Bundle([tray.put(table)], [B.metadata_of(table)]))
    return MaterializedDataset.from_bundles(bundles, name)


def from_items(items: list, *, override_num_blocks: int | None = None,
               parallelism: int = -1) -> MaterializedDataset:
    """Dicts become rows; other items a column "item"."""
    if not isinstance(items, (list, tuple)):
        raise TypeError(f"from_items takes a list, got {type(items).__name__}")
    items = list(items)
    blocks = _num_blocks(override_num_blocks, parallelism, "from_items") or \
        _default_blocks(len(items))
    tables = []
    for i in builtins.range(blocks):
        chunk = items[len(items) * i // blocks: len(items) * (i + 1) // blocks]
        if chunk:
            tables.append(B.items_to_block(chunk))
    return _from_tables(tables, "FromItems")


def from_numpy(ndarrays) -> MaterializedDataset:
    """Each array (or the one array) is a block with column "data"."""
    arrays = [ndarrays] if isinstance(ndarrays, np.ndarray) else list(ndarrays)
    for array in arrays:
        if not isinstance(array, np.ndarray):
            raise TypeError(f"from_numpy takes NumPy arrays, got {type(array).__name__}")
    return _from_tables([B.batch_to_block({"data": a}, "from_numpy") for a in arrays],
                        "FromNumpy")


def from_pandas(dfs) -> MaterializedDataset:
    pd = B._pandas()
    frames = [dfs] if isinstance(dfs, pd.DataFrame) else list(dfs)
    for frame in frames:
        if not isinstance(frame, pd.DataFrame):
            raise TypeError(f"from_pandas takes DataFrames, got {type(frame).__name__}")
    return _from_tables([B.pandas_to_block(f) for f in frames], "FromPandas")


def from_arrow(tables) -> MaterializedDataset:
    tables = [tables] if isinstance(tables, pa.Table) else list(tables)
    for table in tables:
        if not isinstance(table, pa.Table):
            raise TypeError(f"from_arrow takes pyarrow Tables, got {type(table).__name__}")
    return _from_tables(tables, "FromArrow")


def from_arrow_refs(refs) -> MaterializedDataset:
    refs = [refs] if isinstance(refs, tray.ObjectRef) else list(refs)
    metas = tray.get([_metadata_of.remote(ref) for ref in refs])
    return MaterializedDataset.from_bundles(
        [_Bundle([ref], [meta]) for ref, meta in zip(refs, metas, strict=False)], "FromArrowRefs")


@tray.remote
def _metadata_of(table):
    return B.metadata_of(table)


def read_parquet(paths, *, columns: list | None = None, override_num_blocks: int | None = None,
                 parallelism: int = -1, **_arrow_options) -> Dataset:
    blocks = _num_blocks(override_num_blocks, parallelism, "read_parquet")
    return Dataset(P.read_op("ReadParquet", _sources.parquet_tasks(paths, columns, blocks)))


def _read_files(kind: str, name: str, paths, override_num_blocks, parallelism, **options):
    blocks = _num_blocks(override_num_blocks, parallelism, f"read_{kind}")
    return Dataset(P.read_op(name, _sources.file_tasks(kind, paths, blocks, **options)))


def read_csv(paths, *, override_num_blocks: int | None = None, parallelism: int = -1,
             file_extensions=None, **arrow_csv_args) -> Dataset:
    return _read_files("csv", "ReadCSV", paths, override_num_blocks, parallelism,
                       file_extensions=file_extensions, arrow_csv_args=arrow_csv_args)


def read_json(paths, *, override_num_blocks: int | None = None, parallelism: int = -1,
              file_extensions=None) -> Dataset:
    return _read_files("json", "ReadJSON", paths, override_num_blocks, parallelism,
                       file_extensions=file_extensions)


def read_text(paths, *, encoding: str = "utf-8", drop_empty_lines: bool = False,
              override_num_blocks: int | None = None, parallelism: int = -1,
              file_extensions=None) -> Dataset:
    return _read_files("text", "ReadText", paths, override_num_blocks, parallelism,
                       encoding=encoding, drop_empty_lines=drop_empty_lines,
                       file_extensions=file_extensions)


def read_binary_files(paths, *, include_paths: bool = False,
                      override_num_blocks: int | None = None, parallelism: int = -1,
                      file_extensions=None) -> Dataset:
    return _read_files("binary", "ReadBinary", paths, override_num_blocks, parallelism,
                       include_paths=include_paths, file_extensions=file_extensions)


def read_numpy(paths, *, override_num_blocks: int | None = None, parallelism: int = -1,
               file_extensions=("npy",)) -> Dataset:
    return _read_files("numpy", "ReadNumpy", paths, override_num_blocks, parallelism,
                       file_extensions=file_extensions)


from . import preprocessors as preprocessors  # noqa: E402 - needs Dataset above

__all__ = [
    "range", "range_tensor", "from_items", "from_numpy", "from_pandas", "from_arrow",
    "from_arrow_refs", "read_parquet", "read_csv", "read_json", "read_text",
    "read_binary_files", "read_numpy", "Dataset", "MaterializedDataset", "GroupedData",
    "DataIterator", "DataContext", "ExecutionOptions", "ExecutionResources",
    "ActorPoolStrategy", "TaskPoolStrategy", "Schema", "BlockMetadata", "preprocessors",
]
