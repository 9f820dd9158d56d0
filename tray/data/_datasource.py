"""Reading and writing files: read tasks per file, one file per block.

Paths are local: a file, a directory (read recursively, in sorted order,
skipping hidden files that start with "." or "_", as Ray does), or a glob;
a list mixes them. A path that matches nothing fails at once, in the
driver, naming it — not later inside a task.

A read task is a small picklable value (paths, a row group range); the
read operator's tasks take it as an argument, so a block lost with its
node is read again through lineage.
"""

from __future__ import annotations

import glob
import json
import os

import numpy as np
import pyarrow as pa

from . import _block as B


class ReadTask:
    """Reads some rows; ``estimated_bytes`` guides backpressure before the
    first task reports a real size."""

    def __init__(self, fn, args: tuple, estimated_bytes: int) -> None:
        self.fn = fn
        self.args = args
        self.estimated_bytes = int(estimated_bytes)

    def __call__(self) -> list:
        return self.fn(*self.args)


# ================================================================ paths


def expand_paths(paths, extensions: tuple | None = None) -> list[str]:
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    if not isinstance(paths, (list, tuple)) or not paths:
        raise ValueError(f"paths must be a path or a non-empty list of paths, got {paths!r}")
    found: list[str] = []
    for path in paths:
        path = os.fspath(path)
        if path.startswith("local://"):
            path = path[len("local://"):]
        if glob.has_magic(path):
            matches = sorted(glob.glob(path, recursive=True))
            if not matches:
                raise FileNotFoundError(f"no file matches the pattern {path!r}")
            for match in matches:
                found.extend(_files_under(match))
        elif os.path.isdir(path):
            found.extend(_files_under(path))
        elif os.path.exists(path):
            found.append(path)
        else:
            raise FileNotFoundError(f"the path {path!r} does not exist")
    if extensions:
        found = [f for f in found if f.lower().endswith(tuple(e.lower() for e in extensions))]
    if not found:
        raise FileNotFoundError(f"no files to read under {list(map(os.fspath, paths))!r}"
                                + (f" with extensions {list(extensions)}" if extensions else ""))
    return found


def _files_under(path: str) -> list[str]:
    if not os.path.isdir(path):
        return [path]
    files = []
    for root, dirs, names in os.walk(path):
        dirs[:] = sorted(d for d in dirs if not d.startswith((".", "_")))
        files.extend(os.path.join(root, n) for n in sorted(names)
                     if not n.startswith((".", "_")))
    return files


def _group(files: list, num_blocks: int | None) -> list[list]:
    """Files per read task: one each, or ``num_blocks`` contiguous groups."""
    if not num_blocks or num_blocks >= len(files):
        return [[f] for f in files]
    groups = []
    for i in range(num_blocks):
        group = files[len(files) * i // num_blocks: len(files) * (i + 1) // num_blocks]
        if group:
            groups.append(group)
    return groups


def _size(files: list) -> int:
    return sum(os.path.getsize(f) for f in files)


# ================================================================ readers


def _read_parquet(pieces: list, columns) -> list:
    import pyarrow.parquet as pq

    tables = []
    for path, row_groups in pieces:
        file = pq.ParquetFile(path)
        if row_groups is None:
            tables.append(file.read(columns=columns, use_threads=False))
        else:
            tables.append(file.read_row_groups(row_groups, columns=columns, use_threads=False))
    return [B.concat(tables)]


def parquet_tasks(paths, columns, num_blocks) -> list[ReadTask]:
    import pyarrow.parquet as pq

    files = expand_paths(paths)
    pieces = []  # (path, row groups or None, estimated bytes)
    if num_blocks and num_blocks > len(files):
        # More blocks than files: split files by row groups.
        for path in files:
            metadata = pq.ParquetFile(path).metadata
            for group in range(metadata.num_row_groups):
                pieces.append((path, [group], metadata.row_group(group).total_byte_size))
    else:
        pieces = [(path, None, _uncompressed_size(path)) for path in files]
    tasks = []
    for group in _group(pieces, num_blocks):
        tasks.append(ReadTask(_read_parquet, ([(p, g) for p, g, _ in group], columns),
                              sum(size for _, _, size in group)))
    return tasks


def _uncompressed_size(path: str) -> int:
    import pyarrow.parquet as pq

    try:
        metadata = pq.ParquetFile(path).metadata
        return sum(metadata.row_group(i).total_byte_size for i in range(metadata.num_row_groups))
    except Exception:  # noqa: BLE001 - the read task will say what is wrong
        return os.path.getsize(path)


def _read_csv(files: list, options: dict) -> list:
    import pyarrow.csv as pcsv

    return [B.concat([pcsv.read_csv(f, **options) for f in files])]


def _read_json(files: list) -> list:
    import pyarrow.json as pjson

    tables = []
    for f in files:
        with open(f, "rb") as handle:
            head = handle.read(64).lstrip()
        if head.startswith(b"["):  # one JSON array of records
            with open(f, encoding="utf-8") as handle:
                tables.append(B.rows_to_block(json.load(handle), f"read_json({f!r})"))
        else:  # JSON lines
            tables.append(pjson.read_json(f))
    return [B.concat(tables)]


def _read_text(files: list, encoding: str, drop_empty_lines: bool) -> list:
    lines = []
    for f in files:
        with open(f, encoding=encoding) as handle:
            for line in handle.read().splitlines():
                if line or not drop_empty_lines:
                    lines.append(line)
    return [pa.table({"text": pa.array(lines, type=pa.string())})]


def _read_binary(files: list, include_paths: bool) -> list:
    data = []
    for f in files:
        with open(f, "rb") as handle:
            data.append(handle.read())
    columns = {"bytes": pa.array(data, type=pa.binary())}
    if include_paths:
        columns = {"path": pa.array(files, type=pa.string()), **columns}
    return [pa.table(columns)]


def _read_numpy(files: list) -> list:
    arrays = [np.load(f, allow_pickle=False) for f in files]
    return [B.batch_to_block({"data": np.concatenate(arrays) if len(arrays) > 1 else arrays[0]},
                             "read_numpy")]


def file_tasks(kind: str, paths, num_blocks, **options) -> list[ReadTask]:
    extensions = options.pop("file_extensions", None)
    files = expand_paths(paths, tuple(extensions) if extensions else None)
    readers = {"csv": lambda g: (_read_csv, (g, options.get("arrow_csv_args", {}))),
               "json": lambda g: (_read_json, (g,)),
               "text": lambda g: (_read_text, (g, options.get("encoding", "utf-8"),
                                               options.get("drop_empty_lines", False))),
               "binary": lambda g: (_read_binary, (g, options.get("include_paths", False))),
               "numpy": lambda g: (_read_numpy, (g,))}
    tasks = []
    for group in _group(files, num_blocks):
        fn, args = readers[kind](group)
        tasks.append(ReadTask(fn, args, _size(group) * (2 if kind == "csv" else 1)))
    return tasks


# ================================================================ ranges


def _read_range(start: int, stop: int, tensor_shape) -> list:
    ids = np.arange(start, stop, dtype=np.int64)
    if tensor_shape is None:
        return [pa.table({"id": ids})]
    data = np.broadcast_to(ids.reshape((-1,) + (1,) * len(tensor_shape)),
                           (len(ids), *tensor_shape))
    return [B.batch_to_block({"data": np.ascontiguousarray(data)}, "range_tensor")]


def range_tasks(n: int, num_blocks: int, tensor_shape=None) -> list[ReadTask]:
    row_bytes = 8 * int(np.prod(tensor_shape)) if tensor_shape else 8
    tasks = []
    for i in range(num_blocks):
        start, stop = n * i // num_blocks, n * (i + 1) // num_blocks
        if stop > start:
            tasks.append(ReadTask(_read_range, (start, stop, tensor_shape),
                                  (stop - start) * row_bytes))
    return tasks


# ================================================================ writers


def write_block(kind: str, path: str, prefix: str, options: dict):
    """A table function writing one block as one file; returns a one-row
    table naming the file (what write tasks report)."""

    def write(table: pa.Table, task_index: int) -> pa.Table:
        os.makedirs(path, exist_ok=True)
        extension = {"parquet": "parquet", "csv": "csv", "json": "json", "numpy": "npy"}[kind]
        target = os.path.join(path, f"{prefix}_{task_index:06d}.{extension}")
        if table.num_rows == 0:
            return pa.table({"path": pa.array([], type=pa.string())})
        if kind == "parquet":
            import pyarrow.parquet as pq

            pq.write_table(table, target)
        elif kind == "csv":
            import pyarrow.csv as pcsv

            pcsv.write_csv(table, target)
        elif kind == "json":
            with open(target, "w", encoding="utf-8") as handle:
                for row in B.block_to_rows(table):
                    handle.write(json.dumps(row, default=_json_default))
                    handle.write("\n")
        else:
            column = options["column"]
            if column not in table.column_names:
                raise ValueError(f"write_numpy: no column {column!r}; the dataset has "
                                 f"{table.column_names}")
            np.save(target, B.column_to_numpy(table.column(column)))
        return pa.table({"path": [target]})

    return write


def _json_default(value):
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    raise TypeError(f"cannot write a {type(value).__name__} as JSON")
