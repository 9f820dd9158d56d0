"""Blocks and batches: every block is a ``pyarrow.Table``.

Ray Data lets a block be an Arrow table or a pandas DataFrame, whichever the
last transform produced. tray keeps one block type, Arrow, for three
reasons: one code path for slicing, concatenation, sizes and schemas; Arrow
buffers pickle out of band, so a block in the object store is read back
without a copy; and a schema is always exact (pandas' object columns are
not). Batches given to user code are converted at the edge, in the task:
``"numpy"`` (a dict of arrays, the default), ``"pandas"`` or ``"pyarrow"``.

Tensor columns (an ndarray of ndim >= 2 in a batch, or rows holding arrays
of one shape) are Arrow fixed-shape tensor columns, read back as ndarrays.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

BATCH_FORMATS = ("default", "numpy", "pandas", "pyarrow")


@dataclass(frozen=True)
class BlockMetadata:
    """What the executor knows of a block without fetching it."""
    num_rows: int
    size_bytes: int
    schema: pa.Schema | None
    exec_s: float = 0.0  # time the task that made it spent in its transform


def metadata_of(table: pa.Table, exec_s: float = 0.0) -> BlockMetadata:
    return BlockMetadata(table.num_rows, int(table.nbytes), table.schema, exec_s)


def check_batch_format(batch_format: str) -> str:
    if batch_format not in BATCH_FORMATS:
        raise ValueError(f"batch_format must be one of {', '.join(map(repr, BATCH_FORMATS))}, "
                         f"got {batch_format!r}")
    return "numpy" if batch_format == "default" else batch_format


# ====================================================== columns to and from numpy


def _is_tensor_type(arrow_type) -> bool:
    return isinstance(arrow_type, pa.FixedShapeTensorType)


def column_to_numpy(column) -> np.ndarray:
    """One Arrow column as a NumPy array (tensor columns as an ndarray of
    ndim >= 2; nested lists as an object array)."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)
    if _is_tensor_type(column.type):
        return column.to_numpy_ndarray()
    if pa.types.is_null(column.type):
        return np.full(len(column), None, dtype=object)
    return column.to_numpy(zero_copy_only=False)


def numpy_to_column(values) -> pa.Array:
    """A batch column (ndarray, list, pandas Series) as an Arrow array."""
    if isinstance(values, (pa.Array, pa.ChunkedArray)):
        return values
    if not isinstance(values, np.ndarray):
        if hasattr(values, "to_numpy"):  # a pandas Series
            values = values.to_numpy()
        else:
            values = list(values)
            if values and all(isinstance(v, np.ndarray) for v in values) and \
                    len({v.shape for v in values}) == 1 and values[0].ndim >= 1:
                values = np.stack(values)
            else:
                return pa.array(values)
    if values.ndim >= 2:
        return pa.FixedShapeTensorArray.from_numpy_ndarray(np.ascontiguousarray(values))
    if values.dtype == object:
        items = list(values)
        if items and all(isinstance(v, np.ndarray) for v in items) and \
                len({v.shape for v in items}) == 1 and items[0].ndim >= 1:
            return numpy_to_column(np.stack(items))
        return pa.array(items)
    return pa.array(values)


# ============================================================ batches to blocks


def batch_to_block(batch, what: str = "fn") -> pa.Table:
    """A user function's output as a block; TypeError naming ``what`` if it
    is not a batch."""
    if isinstance(batch, pa.Table):
        return batch
    if isinstance(batch, dict):
        if not batch:
            return pa.table({})
        columns = {}
        lengths = set()
        for name, values in batch.items():
            if not isinstance(name, str):
                raise TypeError(f"{what} returned a dict with the non-string key {name!r}; "
                                "column names must be strings")
            if np.isscalar(values):
                raise TypeError(f"{what} returned a dict whose column {name!r} is the scalar "
                                f"{values!r}; each column must be an array or list with one "
                                "value per row")
            column = numpy_to_column(values)
            columns[name] = column
            lengths.add(len(column))
        if len(lengths) > 1:
            raise ValueError(f"{what} returned columns of different lengths: "
                             + ", ".join(f"{n}={len(c)}" for n, c in columns.items()))
        return pa.table(columns)
    pd = _pandas_or_none()
    if pd is not None and isinstance(batch, pd.DataFrame):
        return pandas_to_block(batch)
    raise TypeError(
        f"{what} returned a value of type {type(batch).__name__}; a batch function must "
        "return a dict of NumPy arrays (column name -> array), a pandas.DataFrame or a "
        "pyarrow.Table")


def pandas_to_block(frame) -> pa.Table:
    columns = {}
    for name in frame.columns:
        series = frame[name]
        if series.dtype == object:
            columns[str(name)] = numpy_to_column(series.to_numpy())
        else:
            columns[str(name)] = pa.Array.from_pandas(series)
    return pa.table(columns) if columns else pa.table({"__empty": pa.nulls(len(frame))}).drop(
        ["__empty"])


def block_to_batch(block: pa.Table, batch_format: str):
    batch_format = check_batch_format(batch_format)
    if batch_format == "pyarrow":
        return block
    if batch_format == "numpy":
        return {name: column_to_numpy(block.column(name)) for name in block.column_names}
    return block_to_pandas(block)


def block_to_pandas(block: pa.Table):
    pd = _pandas()
    data = {}
    for name in block.column_names:
        column = block.column(name)
        if _is_tensor_type(column.type):
            data[name] = list(column_to_numpy(column))
        else:
            data[name] = column.to_pandas()
    return pd.DataFrame(data, index=pd.RangeIndex(block.num_rows)) if data else \
        pd.DataFrame(index=pd.RangeIndex(block.num_rows))


# ================================================================== rows


def block_to_rows(block: pa.Table):
    """Rows as dicts, with Python scalars (tensors as ndarrays)."""
    tensor = [n for n in block.column_names if _is_tensor_type(block.schema.field(n).type)]
    if not tensor:
        yield from block.to_pylist()
        return
    arrays = {name: column_to_numpy(block.column(name)) for name in tensor}
    plain = block.drop_columns(tensor).to_pylist() if len(tensor) < block.num_columns else \
        [{} for _ in range(block.num_rows)]
    for index, row in enumerate(plain):
        full = {}
        for name in block.column_names:
            full[name] = arrays[name][index] if name in arrays else row[name]
        yield full


def rows_to_block(rows: list, what: str = "fn") -> pa.Table:
    """Row dicts as a block; TypeError naming ``what`` for a row that is
    not a dict."""
    if not rows:
        return pa.table({})
    names: dict[str, None] = {}
    for row in rows:
        if not isinstance(row, dict):
            raise TypeError(f"{what} returned a row of type {type(row).__name__}; rows must "
                            "be dicts of column name -> value")
        for name in row:
            names.setdefault(name, None)
    columns = {}
    for name in names:
        values = [row.get(name) for row in rows]
        if values and all(isinstance(v, np.ndarray) and v.ndim >= 1 for v in values) and \
                len({v.shape for v in values}) == 1:
            columns[name] = numpy_to_column(np.stack(values))
        elif values and all(isinstance(v, np.generic) for v in values):
            columns[name] = pa.array(np.array(values))
        else:
            columns[name] = pa.array([v.item() if isinstance(v, np.generic) else v
                                      for v in values])
    return pa.table(columns)


def items_to_block(items: list) -> pa.Table:
    """``from_items``: dicts become rows; anything else a column "item"."""
    if items and all(isinstance(item, dict) for item in items):
        return rows_to_block(items, "from_items")
    return rows_to_block([{"item": item} for item in items], "from_items")


# ============================================================ block algebra


def concat(blocks: list) -> pa.Table:
    blocks = [b for b in blocks if b is not None]
    nonempty = [b for b in blocks if b.num_rows > 0 or b.num_columns > 0]
    if not nonempty:
        return blocks[0] if blocks else pa.table({})
    with_rows = [b for b in nonempty if b.num_rows > 0]
    if not with_rows:
        return nonempty[0]
    if len(with_rows) == 1:
        return with_rows[0]
    return pa.concat_tables(with_rows, promote_options="default")


def take_rows(block: pa.Table, start: int, stop: int) -> pa.Table:
    """Rows [start, stop) as a compact table (a slice would pickle the
    whole parent buffers)."""
    stop = min(stop, block.num_rows)
    if start == 0 and stop == block.num_rows:
        return compact(block)
    return block.take(np.arange(start, max(start, stop)))


def compact(block: pa.Table) -> pa.Table:
    """``block`` without references to buffers it does not use: a table
    made of slices (a batch of a bigger block) pickles every parent buffer
    whole, once per slice."""
    if block.num_rows and block.get_total_buffer_size() > 2 * block.nbytes + 65536:
        return block.take(np.arange(block.num_rows))
    if any(column.num_chunks > 1 for column in block.columns):
        return block.combine_chunks()
    return block


def _pandas():
    try:
        import pandas
    except ImportError:
        raise ImportError("pandas is required for this tray.data operation: "
                          "pip install 'tray[data]'") from None
    return pandas


def _pandas_or_none():
    import sys

    return sys.modules.get("pandas")
