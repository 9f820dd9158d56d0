"""tray.data under faults: whole pipelines on distinct inputs, each checked
against a model of what every step promises.

Each seed builds one to three pipelines of a random shape. Two sources
with distinct rows (``a``: ``td.range`` through a task ``map_batches``;
``b``: ``td.from_items`` of other ids and values) each go through a random
chain of row-wise steps (``map``, ``map_batches`` with or without a batch
size, ``flat_map``, ``filter``, an actor pool, ``add_column``), then are
combined or not (``union`` of both, ``zip`` of two row-count-preserving
chains), then maybe go through an all-to-all step (a ``sort`` by one to
three keys with a list of directions, a ``groupby`` with ``sum``, ``count``,
``min`` and ``max``, ``repartition``, ``random_shuffle`` with a seed), and
are consumed in one of several ways (``take_all``, ``take``, ``limit``,
``iter_batches``, ``split``, ``count``, a global ``sum``/``max``). The
reference model is plain Python over the same rows, step by step. Column
steps and the rest of the consumers (``drop/select/rename_columns``,
``schema``, ``take_batch``, ``to_pandas``, ``mean``/``std``/``unique``,
``split_at_indices``, ``train_test_split``, ``streaming_split``) come from
``data_ops``, with an RNG of their own.

What is checked, as tray.data documents it (``preserve_order``, tray's
default: outputs leave every operator in input order):

* the rows, **in order**, wherever the order is defined: maps, unions (the
  first dataset's rows, then the next's), zips (row ``i`` of one beside row
  ``i`` of the other), limits and takes (a prefix), repartition and split
  (the same rows in the same order); a sort's key columns come out in the
  model's order exactly (rows with equal keys may come in any order, so
  the rows are compared as a multiset); a groupby's groups in key order;
* ``random_shuffle(seed=...)``: a permutation of the model's rows;
* ``repartition(k)``: ``k`` blocks; ``split(k)``: ``k`` datasets;
* a pool as large as the cluster (every CPU held by its actors) followed
  by ``take``/``take_all``/``iter_batches`` finishes (issue 41: it hung).

* ``data-udf-error-reaches-consumer``: a pipeline ending in a user
  function that raises on one of the model's rows raises the user's own
  exception class, with its message, to the consumer (not a bare
  TaskError, not nothing); one whose worker exits (``SystemExit``, no
  retries) raises ``WorkerCrashedError`` noted with that operator;
* ``data-operators-max``: a plan with more operators than
  ``DataContext.operators_max`` is refused with a ValueError.

Some seeds (an RNG of their own) run under a tiny object-store budget
(``resource_limits.object_store_memory`` of 1 byte to 40 kB: the executor's
backpressure, one task or a few in flight) or with ``task_max_retries=0``
(a fault that ends a task surfaces as its system error). An error the faults permit (a worker crashed past its retries, an object
lost with its lineage) is re-raised by a task so that the runner judges it
as it judges any; a wrong answer fails ``values-match-model``.

Map functions sleep a little virtual time, so that the pipelines are still
running when the faults fire.
"""

from __future__ import annotations

import time

import numpy as np

import tray

from . import data_ops

B_OFFSET = 1_000_000  # source b's ids: distinct from a's whatever the steps


@tray.remote(max_retries=3)
def _reraise(error: BaseException):
    raise error


# ============================================================ the steps (tray)


def _slow_tag(batch, sleep_s: float, salt: int):
    time.sleep(sleep_s)
    ids = batch["id"]
    return {"id": ids, "x": (ids * 7919 + salt) % 1000}


def _map_row(row, k: int):
    return {**row, "x": row["x"] * 3 + k}


def _map_batch(batch, k: int, sleep_s: float):
    time.sleep(sleep_s)
    return {**batch, "x": batch["x"] + k}


def _flat_row(row):
    return [{**row, "id": row["id"] * 3 + j} for j in range(row["x"] % 3)]


def _keep(row) -> bool:
    return (row["x"] + row["id"]) % 4 != 0


def _g_column(batch):
    return batch["x"] % 5


def _with_g(ds):
    return ds.add_column("g", _g_column)


def _then(make, step):
    """The pipeline ``make`` builds, followed by ``step`` (dataset -> dataset)."""
    def made():
        return step(make())
    return made


class _Offset:
    """A callable class for the actor pool; its state is its offset."""

    def __init__(self, offset: int, sleep_s: float) -> None:
        self.offset = offset
        self.sleep_s = sleep_s

    def __call__(self, batch):
        time.sleep(self.sleep_s)
        return {**batch, "x": batch["x"] + self.offset}


# ============================================================ the model


def _model_step(rows: list, step: tuple) -> list:
    kind = step[0]
    if kind == "map":
        return [{**r, "x": r["x"] * 3 + step[1]} for r in rows]
    if kind in ("map_batches", "actors"):
        return [{**r, "x": r["x"] + step[1]} for r in rows]
    if kind == "flat_map":
        return [{**r, "id": r["id"] * 3 + j} for r in rows for j in range(r["x"] % 3)]
    if kind == "filter":
        return [r for r in rows if (r["x"] + r["id"]) % 4 != 0]
    if kind == "add_column":
        return [{**r, "g": r["x"] % 5} for r in rows]
    raise AssertionError(kind)


def _zip_rows(left: list, right: list) -> list:
    out = []
    for one, two in zip(left, right, strict=True):
        row = dict(one)
        for name, value in two.items():
            new_name, suffix = name, 1
            while new_name in row:
                new_name = f"{name}_{suffix}"
                suffix += 1
            row[new_name] = value
        out.append(row)
    return out


def _sorted_rows(rows: list, keys: list, descending: list) -> list:
    out = list(rows)
    for key, down in reversed(list(zip(keys, descending, strict=True))):
        out.sort(key=lambda r, key=key: r[key], reverse=down)  # stable: keys compose
    return out


def _groups(rows: list, how: str) -> list:
    """A groupby on "g", in key order: one aggregation, or map_groups."""
    groups: dict = {}
    for row in rows:
        groups.setdefault(row["g"], []).append(row["x"])
    if how == "map_groups":
        return [{"g": g, "n": len(xs), "spread": max(xs) - min(xs)}
                for g, xs in sorted(groups.items())]
    name, fn = {"count": ("count()", len), "sum": ("sum(x)", sum), "min": ("min(x)", min),
                "max": ("max(x)", max)}[how]
    return [{"g": g, name: fn(xs)} for g, xs in sorted(groups.items())]


def _per_group(batch):
    xs = batch["x"]
    return {"g": batch["g"][:1], "n": np.array([len(xs)]),
            "spread": np.array([int(xs.max() - xs.min())])}


def _grouped(ds, how: str):
    grouped = ds.groupby("g")
    if how == "map_groups":
        return grouped.map_groups(_per_group)
    if how == "count":
        return grouped.count()
    return getattr(grouped, how)("x")


def _key(row: dict) -> tuple:
    return tuple(sorted(row.items()))


def _normalize(rows: list) -> list:
    return [{k: (v.item() if isinstance(v, np.generic) else v) for k, v in row.items()}
            for row in rows]


# ============================================================ one pipeline


class _Pipeline:
    """A random pipeline and its model, built side by side."""

    def __init__(self, program, cluster) -> None:
        self.rng = program.rng
        self.cluster = cluster
        self.sleep_s = self.rng.choice([0.0, 0.01, 0.05, 0.1])
        self.strategy = self.rng.choice(["DEFAULT", "SPREAD"])
        self.steps: list = []  # what it does, for the label

    # -- sources
    def source(self, name: str):
        import tray.data as td

        rng = self.rng
        n = rng.randint(0 if rng.random() < 0.05 else 10, 160)
        blocks = rng.randint(1, 8)
        salt = rng.randint(0, 999)
        if name == "a":
            rows = [{"id": i, "x": (i * 7919 + salt) % 1000} for i in range(n)]

            def make(n=n, blocks=blocks, salt=salt, sleep_s=self.sleep_s,
                     strategy=self.strategy):
                spread = {"scheduling_strategy": "SPREAD"} if strategy == "SPREAD" else {}
                return td.range(n, override_num_blocks=blocks).map_batches(
                    _slow_tag, fn_kwargs={"sleep_s": sleep_s, "salt": salt}, **spread)
        else:
            rows = [{"id": B_OFFSET + 2 * i, "x": (i * 104729 + salt) % 997}
                    for i in range(n)]

            def make(rows=rows, blocks=blocks):
                return td.from_items(list(rows), override_num_blocks=blocks)
        self.steps.append(f"{name}: {n} rows in {blocks} blocks")
        return make, rows

    # -- row-wise chains
    def chain(self, make, rows: list, columns: list, *, keep_count: bool,
              allow_full_pool: bool):
        rng = self.rng
        kinds = ["map", "map_batches", "actors", "add_column"]
        if not keep_count:
            kinds += ["flat_map", "filter"]
        for _ in range(rng.randint(0, 3)):
            kind = rng.choice(kinds)
            full = False
            if kind == "map":
                k = rng.randint(0, 9)
                step, build = ("map", k), (lambda ds, k=k: ds.map(_map_row, fn_kwargs={"k": k}))
            elif kind == "map_batches":
                k = rng.randint(1, 50)
                size = rng.choice([None, 1, 7, 32])
                step = ("map_batches", k)

                def build(ds, k=k, size=size, sleep_s=self.sleep_s):
                    return ds.map_batches(_map_batch, batch_size=size,
                                          fn_kwargs={"k": k, "sleep_s": sleep_s})
            elif kind == "actors":
                k = rng.randint(1, 100)
                full = allow_full_pool and rng.random() < 0.5
                step, build = ("actors", k), self._pool(k, full)
            elif kind == "flat_map":
                step, build = ("flat_map",), (lambda ds: ds.flat_map(_flat_row))
            elif kind == "filter":
                step, build = ("filter",), (lambda ds: ds.filter(_keep))
            else:
                if "g" in columns:
                    continue
                step, build = ("add_column",), _with_g
                columns = [*columns, "g"]
            # Only right after the source may a pool hold the whole cluster
            # (a map with a batch size of its own runs as tasks before it).
            allow_full_pool = False
            rows = _model_step(rows, step)
            self.steps.append(step[0] + ("(whole cluster)" if full else ""))
            make = _then(make, build)
        return make, rows, columns

    def _pool(self, offset: int, full: bool):
        """An actor pool: zero-CPU actors, or (``full``) one actor per node
        holding every CPU of it, so the pool holds the whole cluster."""
        concurrency = self.cluster.num_nodes if full else self.rng.randint(1, 2)
        num_cpus = self.cluster.node_resources["CPU"] if full else 0

        def build(ds, offset=offset, sleep_s=self.sleep_s):
            return ds.map_batches(_Offset, concurrency=concurrency, batch_size=16,
                                  fn_constructor_args=(offset, sleep_s), num_cpus=num_cpus)
        return build

    # -- the whole
    def build(self):
        """(make, model rows, order, checks): ``order`` says how far the
        rows' order is defined: "all", "keys" (a sort's key columns; rows
        with equal keys may come in any order) or "none" (a shuffle)."""
        rng = self.rng
        combine = rng.choice(["none", "none", "union", "union", "zip"])
        make, rows = self.source("a")
        # A pool may hold the whole cluster where nothing it needs runs as
        # tasks before it (the source's read and map run on its actors).
        make, rows, columns = self.chain(make, rows, ["id", "x"], keep_count=combine == "zip",
                                         allow_full_pool=combine == "none" and
                                         self.strategy == "DEFAULT")
        if combine != "none":
            other, other_rows = self.source("b")
            if combine == "zip":
                n = min(len(rows), len(other_rows))  # zip needs equal counts
                rows, other_rows = rows[:n], other_rows[:n]
                make = _then(make, lambda ds, n=n: ds.limit(n))
                other = _then(other, lambda ds, n=n: ds.limit(n))
                self.steps.append(f"limit({n}) of both")
            other, other_rows, other_columns = self.chain(
                other, other_rows, ["id", "x"], keep_count=combine == "zip",
                allow_full_pool=False)
            if combine == "union":
                if other_columns != columns:  # the same columns, in the same order
                    for column in columns:
                        if column not in other_columns:
                            other_rows = _model_step(other_rows, ("add_column",))
                            other = _then(other, _with_g)
                    if "g" not in columns:
                        rows = _model_step(rows, ("add_column",))
                        make = _then(make, _with_g)
                        columns = [*columns, "g"]
                self.steps.append("union")
                rows = rows + other_rows
                make = _then(make, lambda ds, other=other: ds.union(other()))
            else:
                self.steps.append("zip")
                rows = _zip_rows(rows, other_rows)
                columns = list(_zip_rows([dict.fromkeys(columns, 0)],
                                         [dict.fromkeys(other_columns, 0)])[0])
                make = _then(make, lambda ds, other=other: ds.zip(other()))
        order, checks = "all", []
        last = rng.choice(["none", "none", "sort", "sort", "groupby", "repartition", "shuffle"])
        if last in ("sort", "groupby") and "g" not in columns:
            rows = _model_step(rows, ("add_column",))
            make = _then(make, _with_g)
            self.steps.append("add_column")
        if last == "sort":
            keys = rng.sample(["g", "x", "id"], rng.randint(1, 3))
            descending = [rng.random() < 0.5 for _ in keys]
            if rng.random() < 0.2:  # one bool for every key
                descending = [descending[0]] * len(keys)
                arg = descending[0]
            else:
                arg = descending
            rows = _sorted_rows(rows, keys, descending)
            make = _then(make, lambda ds, keys=keys, arg=arg:
                         ds.sort(keys if len(keys) > 1 else keys[0], descending=arg))
            self.steps.append(f"sort({keys}, descending={arg})")
            order = "keys"
            checks.append(("keys", keys))
        elif last == "groupby":
            how = rng.choice(["count", "sum", "min", "max", "map_groups"])
            rows = _groups(rows, how)
            make = _then(make, lambda ds, how=how: _grouped(ds, how))
            self.steps.append(f"groupby(g).{how}")
        elif last == "repartition":
            k = rng.randint(1, 6)
            make = _then(make, lambda ds, k=k: ds.repartition(k))
            self.steps.append(f"repartition({k})")
            checks.append(("blocks", k))
        elif last == "shuffle":
            seed = rng.randint(0, 2**31)
            make = _then(make, lambda ds, seed=seed: ds.random_shuffle(seed=seed))
            self.steps.append("random_shuffle(seed)")
            order = "none"
        return make, rows, order, checks


# ============================================================ consuming


def _consume(pipeline: _Pipeline, make, rows: list, order: str, checks: list) -> list:
    """Run the pipeline one of several ways; what to check, as
    ``(label, the model's answer, tray's answer)``."""
    rng = pipeline.rng
    how = rng.choice(["take_all", "take_all", "take", "limit", "iter_batches", "split",
                      "count", "aggregate"] if order == "all" else
                     ["take_all", "take_all", "iter_batches", "count"])
    label = " -> ".join(pipeline.steps) + f" -> {how}"
    if how == "count":
        return [(label, len(rows), make().count())]
    if how == "aggregate":
        if not rows or "x" not in rows[0]:
            return [(label, len(rows), make().count())]
        return [(label, (sum(r["x"] for r in rows), max(r["x"] for r in rows)),
                 (make().sum("x"), make().max("x")))]
    if how in ("take", "limit"):
        m = rng.randint(0, len(rows) + 3)
        got = make().take(m) if how == "take" else make().limit(m).take_all()
        return [(label + f"({m})", _normalize(rows[:m]), _normalize(got))]
    if how == "split":
        k = rng.randint(1, 4)
        parts = make().split(k)
        got = [row for part in parts for row in part.take_all()]
        return [(label + f"({k}): datasets", k, len(parts)),
                (label + f"({k})", _normalize(rows), _normalize(got))]
    found = []
    if how == "iter_batches":
        size = rng.choice([None, 1, 5, 64])
        got = []
        for batch in make().iter_batches(batch_size=size, batch_format="numpy"):
            names = list(batch)
            got.extend(dict(zip(names, values, strict=True))
                       for values in zip(*(batch[n] for n in names), strict=True))
    else:
        dataset = make()
        for check in checks:
            # (Only where every block can hold a row: tray drops empty blocks.)
            if check[0] == "blocks" and len(rows) >= check[1]:
                dataset = dataset.materialize()
                found.append((label + f": blocks after repartition({check[1]})", check[1],
                              dataset.num_blocks()))
        got = dataset.take_all()
    got, model = _normalize(got), _normalize(rows)
    if order == "all":
        return [*found, (label, model, got)]
    if order == "keys":  # the key columns in the model's order exactly
        keys = checks[0][1]
        found.append((label + f": the sort keys {keys}", [tuple(r[k] for k in keys) for r in model],
                      [tuple(r[k] for k in keys) for r in got]))
    # Rows with equal keys, or a shuffle: a permutation of the model's rows.
    return [*found, (label + " (as a multiset)", sorted(map(_key, model)),
                     sorted(map(_key, got)))]


class UdfError(ValueError):
    """A user function's own error: it must reach the consumer as itself."""


def _explode(batch, bad: int, exit_: bool = False):
    if bad in set(batch["id"].tolist()):
        if exit_:  # the worker exits: a system error, WorkerCrashedError
            raise SystemExit(3)
        raise UdfError(f"the user function refuses row {bad}")
    return batch


def _exiting(program, make, bad: int, label: str) -> None:
    """A user function whose worker exits (no retries): the consumer gets
    the system error, a TrayError, noted with the operator that ran it."""
    from tray import exceptions
    from tray.data import DataContext

    context = DataContext.get_current()
    before, context.task_max_retries = context.task_max_retries, 0
    try:
        got = make().map_batches(_explode, fn_kwargs={"bad": bad, "exit_": True}).take_all()
    except exceptions.WorkerCrashedError as error:
        notes = " ".join(getattr(error, "__notes__", []))
        if "tray.data operator" not in notes or "_explode" not in notes:
            # Another operator's task, ended by a fault (no retries either):
            # judged by the runner, as any error a fault may explain.
            program.expect(_reraise.remote(error), "WorkerCrashedError", label=label)
            return
        got = "noted"
    except Exception as error:  # noqa: BLE001 - judged by the runner like any error
        program.expect(_reraise.remote(error), "WorkerCrashedError", label=label)
        return
    else:
        got = f"no error: {len(got)} rows"
    finally:
        context.task_max_retries = before
    if got != "noted":
        from .invariants import InvariantViolation

        raise InvariantViolation("data-udf-error-reaches-consumer",
                                 f"{label}: expected WorkerCrashedError noted with the operator "
                                 f"map_batches(_explode), got {got}")


def _failing(program, pipeline: _Pipeline, make, rows: list) -> None:
    """The pipeline, then a ``map_batches`` whose function raises on one of
    the model's rows: consuming it raises the user's error class, with its
    message (``data-udf-error-reaches-consumer``), unless a fault the plan
    injected ended it first (judged by the runner)."""
    bad = rows[pipeline.rng.randrange(len(rows))]["id"]
    label = "data: " + " -> ".join(pipeline.steps) + f" -> map_batches(_explode: row {bad})"
    if pipeline.rng.random() < 0.4:
        _exiting(program, make, bad, label + " (its worker exits)")
        return
    expected = f"UdfError: the user function refuses row {bad}"
    try:
        got = make().map_batches(_explode, fn_kwargs={"bad": bad}).take_all()
    except UdfError as error:  # (the operator's name and the traceback may come with it)
        got = expected if f"refuses row {bad}" in str(error) else f"UdfError: {error}"
    except Exception as error:  # noqa: BLE001
        from tray import exceptions

        if not isinstance(error, exceptions.TrayError) or isinstance(error,
                                                                     exceptions.TaskError):
            got = f"{type(error).__name__}: {error}"[:300]  # the user's class lost?
        else:  # a system error: judged by the runner (a fault may explain it)
            program.expect(_reraise.remote(error), expected, label=label)
            return
    else:
        got = f"no error: {len(got)} rows"
    if got != expected:
        from .invariants import InvariantViolation

        raise InvariantViolation("data-udf-error-reaches-consumer",
                                 f"{label}: expected {expected!r}, got {got!r}")


def _limits(seed: int):
    """A tiny object-store budget (backpressure: one task at a time, or a
    few), or none, and an operators_max the plan must exceed, or none: the
    context's settings for this seed (an RNG of their own)."""
    import random

    rng = random.Random(f"{seed}:data-limits")
    budget = rng.choice([1, 4_000, 40_000]) if rng.random() < 0.3 else None
    refuse, udf_error = rng.random() < 0.05, rng.random() < 0.2
    # No retries: a task a fault ends raises its system error to the consumer.
    retries = 0 if rng.random() < 0.3 else None
    return budget, refuse, udf_error, retries


def data_pipeline(program) -> None:
    import tray.simtest
    from tray.data import DataContext

    cluster = tray.simtest.cluster()
    budget, refuse, udf_error, retries = _limits(cluster.seed)
    context = DataContext.get_current()
    limits = context.execution_options.resource_limits
    saved = limits.object_store_memory, context.operators_max, context.task_max_retries
    limits.object_store_memory = budget
    if retries is not None:
        context.task_max_retries = retries
    try:
        if refuse:
            _refused(context)
        for index in range(program.rng.randint(1, 3)):
            pipeline = _Pipeline(program, cluster)
            make, rows, order, checks = pipeline.build()
            ops = data_ops.rng_for(cluster.seed, index)  # (draws of its own)
            if order != "keys":  # (a sort's check reads its key columns)
                make, rows = data_ops.column_step(ops, pipeline.steps, make, rows)
            if budget is not None:
                pipeline.steps.append(f"(object_store_memory budget {budget} bytes)")
            if retries is not None:
                pipeline.steps.append(f"(task_max_retries {retries})")
            try:
                for label, expected, got in _consume(pipeline, make, rows, order, checks):
                    program.expect(tray.put(got), expected, label=f"data: {label}")
                for label, expected, got in data_ops.consume(ops, pipeline.steps, make, rows,
                                                             order):
                    program.expect(tray.put(got), expected, label=label)
            except Exception as error:  # noqa: BLE001 - judged by the runner like any error
                program.expect(_reraise.remote(error), _normalize(rows),
                               label="data: " + " -> ".join(pipeline.steps))
            if udf_error and rows and "id" in rows[0]:
                _failing(program, pipeline, make, rows)
    finally:
        limits.object_store_memory, context.operators_max, context.task_max_retries = saved


def _refused(context) -> None:
    """A plan with more operators than ``operators_max`` is refused, with a
    ValueError saying so, before anything runs."""
    import tray.data as td

    before, context.operators_max = context.operators_max, 3
    try:  # (a read's two operators, two all-to-all ones: they never fuse)
        td.range(10, override_num_blocks=2).repartition(2).repartition(3).take_all()
    except ValueError as error:
        if "operators" not in str(error):
            raise
    else:
        from .invariants import InvariantViolation

        raise InvariantViolation("data-operators-max", "a plan of 4 operators ran with "
                                 "DataContext.operators_max = 3")
    finally:
        context.operators_max = before


WORKLOADS = {"data": data_pipeline}
