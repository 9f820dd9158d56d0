"""What runs inside a data task or pool actor: a chain of block transforms.

Adjacent map operators are fused into one task by concatenating their
transforms into one chain (see ``_plan``), so a read, a map_batches and a
filter in a row cost one task and one block in the object store, not three.
Each transform maps a list of Arrow tables (the task's input) to a list of
tables; the task concatenates what the last one returns into its output block.

A transform that names a user function carries the operator's name, so a
function returning the wrong type fails with a message naming the operator.
"""

from __future__ import annotations

import inspect
import time

import pyarrow as pa

import tray

from . import _block as B


class Transform:
    name = "Transform"

    def apply(self, blocks: list, task_index: int) -> list:
        raise NotImplementedError

    def init_in_actor(self) -> Transform:
        """This transform as an actor holds it (classes constructed once)."""
        return self


# ============================================================ sources


class ReadTransform(Transform):
    """The first transform of a read task: ignores its input, calls the
    read function (a ``ReadTask``) and returns its tables."""

    def __init__(self, name: str) -> None:
        self.name = name

    def apply(self, blocks: list, task_index: int) -> list:
        tables = []
        for read_task in blocks:  # the task's inputs are read tasks here
            tables.extend(read_task())
        return tables


# ============================================================ user functions


class _UserFn:
    """A user function or callable class with its extra arguments."""

    def __init__(self, fn, fn_args=(), fn_kwargs=None, constructor_args=(),
                 constructor_kwargs=None) -> None:
        self.fn = fn
        self.fn_args = tuple(fn_args or ())
        self.fn_kwargs = dict(fn_kwargs or {})
        self.constructor_args = tuple(constructor_args or ())
        self.constructor_kwargs = dict(constructor_kwargs or {})
        self.is_class = inspect.isclass(fn)
        self._instance = None

    def instantiate(self) -> _UserFn:
        clone = _UserFn(self.fn, self.fn_args, self.fn_kwargs, self.constructor_args,
                        self.constructor_kwargs)
        if self.is_class:
            clone._instance = self.fn(*self.constructor_args, **self.constructor_kwargs)
        return clone

    def __call__(self, value):
        target = self._instance if self.is_class else self.fn
        if target is None:
            raise RuntimeError("a callable class runs only in an actor pool "
                               "(map_batches(..., concurrency=N))")
        return target(value, *self.fn_args, **self.fn_kwargs)


class MapBatches(Transform):
    def __init__(self, name: str, fn: _UserFn, batch_size, batch_format: str,
                 zero_copy_batch: bool = False) -> None:
        self.name = name
        self.fn = fn
        self.batch_size = batch_size
        self.batch_format = B.check_batch_format(batch_format)
        self.zero_copy_batch = zero_copy_batch

    def init_in_actor(self) -> Transform:
        return MapBatches(self.name, self.fn.instantiate(), self.batch_size,
                          self.batch_format, self.zero_copy_batch)

    def apply(self, blocks: list, task_index: int) -> list:
        table = B.concat(blocks)
        size = table.num_rows if self.batch_size is None else max(1, self.batch_size)
        outputs = []
        for start in range(0, max(table.num_rows, 1), max(size, 1)):
            if table.num_rows == 0:
                break
            piece = table.slice(start, size)
            batch = B.block_to_batch(piece, self.batch_format)
            if self.batch_format == "numpy" and not self.zero_copy_batch:
                batch = {k: (v.copy() if not v.flags.writeable else v) for k, v in batch.items()}
            result = self.fn(batch)
            if inspect.isgenerator(result):
                for item in result:
                    outputs.append(B.batch_to_block(item, f"{self.name} (a generator item)"))
            else:
                outputs.append(B.batch_to_block(result, self.name))
        return outputs


class MapRows(Transform):
    def __init__(self, name: str, fn: _UserFn) -> None:
        self.name = name
        self.fn = fn

    def init_in_actor(self) -> Transform:
        return type(self)(self.name, self.fn.instantiate())

    def apply(self, blocks: list, task_index: int) -> list:
        out = []
        for block in blocks:
            for row in B.block_to_rows(block):
                result = self.fn(row)
                if not isinstance(result, dict):
                    raise TypeError(f"{self.name}: fn returned a {type(result).__name__}; "
                                    "map expects fn to return a dict (one row)")
                out.append(result)
        return [B.rows_to_block(out, self.name)] if out else []


class FlatMap(MapRows):
    def apply(self, blocks: list, task_index: int) -> list:
        out = []
        for block in blocks:
            for row in B.block_to_rows(block):
                result = self.fn(row)
                try:
                    items = list(result)
                except TypeError:
                    raise TypeError(f"{self.name}: fn returned a {type(result).__name__}; "
                                    "flat_map expects fn to return a list of dicts") from None
                out.extend(items)
        return [B.rows_to_block(out, self.name)] if out else []


class Filter(MapRows):
    def apply(self, blocks: list, task_index: int) -> list:
        out = []
        for block in blocks:
            keep = []
            for row in B.block_to_rows(block):
                verdict = self.fn(row)
                if not isinstance(verdict, (bool, type(None))) and \
                        type(verdict).__name__ != "bool_":
                    raise TypeError(f"{self.name}: fn returned a {type(verdict).__name__}; "
                                    "filter expects fn to return a bool")
                keep.append(bool(verdict))
            if block.num_rows:
                out.append(block.filter(pa.array(keep, type=pa.bool_())))
        return out


class TableFn(Transform):
    """A tray-internal function of one whole table (column ops, writes,
    slicing); ``fn(table, task_index)``."""

    def __init__(self, name: str, fn) -> None:
        self.name = name
        self.fn = fn

    def apply(self, blocks: list, task_index: int) -> list:
        return [self.fn(B.concat(blocks), task_index)]


# ============================================================ the task


def run_chain(chain: list, task_index: int, inputs: list):
    """Apply ``chain`` to ``inputs``; returns (block, metadata)."""
    started = time.time()  # virtual time in the simulator: fine for stats
    blocks = list(inputs)
    for transform in chain:
        blocks = transform.apply(blocks, task_index)
    block = B.compact(B.concat(blocks)) if blocks else pa.table({})
    return block, B.metadata_of(block, max(0.0, time.time() - started))


@tray.remote
def map_task(chain, task_index, *inputs):
    return run_chain(chain, task_index, list(inputs))


@tray.remote
class MapWorker:
    """A pool actor: constructs the chain's callable classes once."""

    def __init__(self, chain) -> None:
        self.chain = [transform.init_in_actor() for transform in chain]

    def ready(self) -> bool:
        return True

    @tray.method(num_returns=2)
    def map(self, task_index, *inputs):
        return run_chain(self.chain, task_index, list(inputs))
