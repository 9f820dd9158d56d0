"""``ds.groupby(key)``: ``GroupedData``, its aggregations and map_groups.

Aggregations, and the grouping before map_groups, are all-to-all
operators (their plans are in ``_shuffle``); map_groups then calls the
user's function once per group, in tasks or on an actor pool like any
map. The datasets it returns are made by the grouped dataset's ``_with``
(a plain ``Dataset``), so this module does not import ``_dataset``, which
imports it.
"""

from __future__ import annotations

import numpy as np

from . import _block as B
from . import _compute as C
from . import _plan as P
from . import _shuffle as S
from . import _transforms as T


class GroupedData:
    """``ds.groupby(key)``: aggregations and map_groups, each a new
    ``Dataset``. Outputs are sorted by key, as in Ray."""

    def __init__(self, dataset, keys: list) -> None:
        self._dataset = dataset
        self._keys = keys

    def __repr__(self) -> str:
        return f"GroupedData(keys={self._keys})"

    def _aggregate(self, label: str, aggregations: list):
        keys = self._keys

        def plan(bundles):
            return (yield from S.aggregate_plan(bundles, keys, aggregations))

        return self._dataset._with(
            P.all_to_all_op([self._dataset._plan], f"Aggregate[{label}]", plan))

    def _on(self, kind: str, on, ddof: int = 1):
        columns = [on] if isinstance(on, str) else list(on or [])
        if not columns:
            raise ValueError(f"groupby().{kind}: name the column(s) with on=")
        return self._aggregate(f"{kind}({', '.join(columns)})",
                               [(kind, c, ddof) for c in columns])

    def count(self):
        return self._aggregate("count()", [("count", None, 0)])

    def sum(self, on=None):
        return self._on("sum", on)

    def min(self, on=None):
        return self._on("min", on)

    def max(self, on=None):
        return self._on("max", on)

    def mean(self, on=None):
        return self._on("mean", on)

    def std(self, on=None, ddof: int = 1):
        return self._on("std", on, ddof)

    def map_groups(self, fn, *, compute=None, batch_format: str = "default", fn_args=None,
                   fn_kwargs=None, fn_constructor_args=None, fn_constructor_kwargs=None,
                   num_cpus=None, num_gpus=None, memory=None, concurrency=None,
                   **ray_remote_args):
        """Apply ``fn`` to each group as one batch."""
        keys = self._keys

        def plan(bundles):
            return (yield from S.group_partition_plan(bundles, keys))

        grouped = self._dataset._with(
            P.all_to_all_op([self._dataset._plan], f"GroupBy({keys})", plan))
        name = f"MapGroups({C.fn_name(fn)})"
        pool, task_concurrency = C.pool_and_concurrency(fn, compute, concurrency, "map_groups")
        user_fn = T._UserFn(fn, fn_args, fn_kwargs, fn_constructor_args, fn_constructor_kwargs)
        transform = MapGroups(name, user_fn, keys, batch_format)
        args = C.remote_args(num_cpus, num_gpus, memory, ray_remote_args, actor=pool is not None)
        return self._dataset._with(P.map_op(grouped._plan, name, transform, remote_args=args,
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
