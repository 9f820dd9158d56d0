"""The rest of tray.data's public API, for the ``data`` workload: column
steps and consumers drawn from an RNG of their own (``{seed}:data-ops:{i}``,
so the workload's other draws do not move), each with an exact model.

A column step may end a pipeline (not a sort's: its key check reads the
key columns): ``drop_columns``, ``select_columns`` (the columns in the
order given), ``rename_columns`` (a dict old -> new, or a list of every new
name; positions kept). Then, besides the workload's consumer, one of:

* ``schema().names`` and ``columns()``: the model's columns, in order;
* ``take_batch(n)``: the first ``n`` rows as columns; ``iter_rows()`` and
  ``to_pandas()``: every row, in order (a multiset where the order is not
  defined), ``to_pandas()``'s columns in the model's order;
* ``mean``, ``std`` (Ray's default ``ddof=1``, or one given) and
  ``unique`` of a column: within a relative 1e-9, and the distinct values;
  ``groupby("g").mean/std("x")``: one row per key, in key order;
* ``split_at_indices``: ``len(indices) + 1`` datasets, the model's slices
  (indices past the end give empty ones); ``train_test_split``: the test
  set the last ``int(n * test_size)`` (or ``test_size``) rows, in order, or
  with ``shuffle=True`` a partition of the rows of those sizes;
* ``streaming_split(k, equal=...)``: ``k`` iterators, drained at once by
  ``k`` tasks: together the model's rows (``equal``: every share the same
  size, fewer than ``k`` rows left out).

Ray's ``aggregate``/``AggregateFn`` and ``random_sample`` are not in
tray.data, so nothing here calls them.
"""

from __future__ import annotations

import math
import random
from collections import Counter

import tray

TOLERANCE = 1e-9


def rng_for(seed: int, index: int) -> random.Random:
    return random.Random(f"{seed}:data-ops:{index}")


def _norm(value):
    return value.item() if hasattr(value, "item") and not isinstance(value, (list, dict)) \
        else value


def _rows(rows: list) -> list:
    return [{k: _norm(v) for k, v in row.items()} for row in rows]


def _multiset(rows: list) -> list:
    return sorted(tuple(sorted(row.items())) for row in _rows(rows))


# ============================================================ column steps


def column_step(rng: random.Random, steps: list, make, rows: list):
    """Maybe one column step at the end of the pipeline: (make, rows)."""
    if not rows or rng.random() < 0.4:
        return make, rows
    columns = list(rows[0])
    kind = rng.choice(["drop", "select", "rename_dict", "rename_list"])
    if kind == "drop" and len(columns) > 1:
        cols = rng.sample(columns, rng.randint(1, len(columns) - 1))
        arg = cols[0] if len(cols) == 1 and rng.random() < 0.5 else cols
        rows = [{c: r[c] for c in columns if c not in cols} for r in rows]
        steps.append(f"drop_columns({arg!r})")
        return (lambda: make().drop_columns(arg)), rows
    if kind in ("drop", "select"):
        cols = rng.sample(columns, rng.randint(1, len(columns)))
        rows = [{c: r[c] for c in cols} for r in rows]
        steps.append(f"select_columns({cols!r})")
        return (lambda: make().select_columns(cols)), rows
    if kind == "rename_dict":
        chosen = rng.sample(columns, rng.randint(1, len(columns)))
        names = {c: f"{c}__r" for c in chosen}
    else:
        names = [f"{c}__r" if rng.random() < 0.5 else c for c in columns]
    new = [names.get(c, c) for c in columns] if isinstance(names, dict) else names
    rows = [dict(zip(new, (r[c] for c in columns), strict=True)) for r in rows]
    steps.append(f"rename_columns({names!r})")
    return (lambda: make().rename_columns(names)), rows


# ============================================================ consumers


def consume(rng: random.Random, steps: list, make, rows: list, order: str) -> list:
    """One more consumer (or none): ``(label, model, tray)`` triples."""
    kinds = ["schema", "iter_rows", "to_pandas", "stats", "stats", "split_at_indices",
             "train_test_split", "streaming_split"]
    if order == "all":
        kinds.append("take_batch")
    if rows and "g" in rows[0] and "x" in rows[0]:
        kinds.append("grouped")
    if rng.random() < 0.2:
        return []
    how = rng.choice(kinds)
    if how == "streaming_split" and any("whole cluster" in s for s in steps):
        how = "iter_rows"  # (its coordinator's executor needs a CPU the pool holds)
    label = "data: " + " -> ".join(steps) + f" -> {how}"
    return globals()[f"_{how}"](rng, label, make, rows, order)


def _columns(rows: list) -> list | None:
    return list(rows[0]) if rows else None


def _schema(rng, label, make, rows, order):
    if not rows:  # (an empty dataset's schema: none to compare)
        return [(label + ": count", 0, make().count())]
    schema = make().schema()
    return [(label + ": schema().names", _columns(rows), schema.names if schema else None),
            (label + ": columns()", _columns(rows), make().columns())]


def _in_order(label, rows, got, order):
    if order == "all":
        return [(label, _rows(rows), _rows(got))]
    return [(label + " (as a multiset)", _multiset(rows), _multiset(got))]


def _iter_rows(rng, label, make, rows, order):
    return _in_order(label, rows, list(make().iter_rows()), order)


def _to_pandas(rng, label, make, rows, order):
    frame = make().to_pandas()
    found = _in_order(label, rows, frame.to_dict("records"), order)
    if rows:
        found.append((label + ": columns", _columns(rows), list(frame.columns)))
    return found


def _take_batch(rng, label, make, rows, order):
    size = rng.randint(1, len(rows) + 2)
    label += f"({size})"
    if not rows:
        try:
            make().take_batch(size, batch_format="numpy")
        except ValueError:
            return [(label, "ValueError (empty)", "ValueError (empty)")]
        return [(label, "ValueError (empty)", "a batch")]
    batch = make().take_batch(size, batch_format="numpy")
    got = {name: [_norm(v) for v in values] for name, values in batch.items()}
    model = {name: [r[name] for r in rows[:size]] for name in rows[0]}
    return [(label, model, got), (label + ": columns", list(model), list(batch))]


def _close(model, got) -> str:
    if model is None or got is None:
        return repr(got)
    return f"~{model!r}" if math.isclose(got, model, rel_tol=TOLERANCE, abs_tol=TOLERANCE) \
        else repr(got)


def _std(values: list, ddof: int):
    if len(values) - ddof <= 0:
        return None
    mean = math.fsum(values) / len(values)
    return math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (len(values) - ddof))


def _stats(rng, label, make, rows, order):
    if len(rows) < 3:
        return [(label + ": count", len(rows), make().count())]
    column = rng.choice(list(rows[0]))
    values = [r[column] for r in rows]
    ddof = rng.choice([None, None, 0, 1, 2])
    mean = math.fsum(values) / len(values)
    std = _std(values, 1 if ddof is None else ddof)
    got_std = make().std(column) if ddof is None else make().std(column, ddof=ddof)
    return [(label + f": mean({column!r})", f"~{mean!r}", _close(mean, make().mean(column))),
            (label + f": std({column!r}, ddof={ddof})", f"~{std!r}", _close(std, got_std)),
            (label + f": unique({column!r})", sorted(set(values)),
             sorted(_norm(v) for v in make().unique(column)))]


def _grouped(rng, label, make, rows, order):
    if not rows or "g" not in rows[0] or "x" not in rows[0]:
        return _schema(rng, label, make, rows, order)
    groups: dict = {}
    for row in rows:
        groups.setdefault(row["g"], []).append(row["x"])
    ddof = rng.choice([None, 0, 1])
    means = _rows(make().groupby("g").mean("x").take_all())
    grouped = make().groupby("g")
    stds = _rows((grouped.std("x") if ddof is None else grouped.std("x", ddof=ddof)).take_all())
    found = [(label + ": groupby(g).mean(x) keys", sorted(groups), [r.get("g") for r in means]),
             (label + f": groupby(g).std(x, ddof={ddof}) keys", sorted(groups),
              [r.get("g") for r in stds])]
    model_means = [f"~{math.fsum(xs) / len(xs)!r}" for _, xs in sorted(groups.items())]
    got_means = [_close(math.fsum(xs) / len(xs), r.get("mean(x)"))
                 for (_, xs), r in zip(sorted(groups.items()), means, strict=False)]
    found.append((label + ": groupby(g).mean(x)", model_means, got_means))
    model_stds, got_stds = [], []
    for (_, xs), r in zip(sorted(groups.items()), stds, strict=False):
        std = _std(xs, 1 if ddof is None else ddof)
        if std is None:  # undefined (count <= ddof): Ray gives 0.0, NaN or None
            continue
        model_stds.append(f"~{std!r}")
        got_stds.append(_close(std, r.get("std(x)")))
    found.append((label + ": groupby(g).std(x)", model_stds, got_stds))
    return found


def _parts(label, parts, slices, order):
    """Each part against the model's slice (in order), or by size only
    where the order is not defined, and all of them together."""
    found = [(label + ": datasets", len(slices), len(parts))]
    got = [list(part.take_all()) for part in parts]
    if order == "all":
        found.append((label, [_rows(s) for s in slices], [_rows(g) for g in got]))
    else:
        found.append((label + ": sizes", [len(s) for s in slices], [len(g) for g in got]))
        found.append((label + " (as a multiset)", _multiset([r for s in slices for r in s]),
                      _multiset([r for g in got for r in g])))
    return found


def _split_at_indices(rng, label, make, rows, order):
    n = len(rows)
    indices = sorted(rng.randint(0, n + 2) for _ in range(rng.randint(1, 3)))
    bounds = [0, *[min(i, n) for i in indices], n]
    slices = [rows[bounds[i]:bounds[i + 1]] for i in range(len(bounds) - 1)]
    return _parts(label + f"({indices})", make().split_at_indices(indices), slices, order)


def _train_test_split(rng, label, make, rows, order):
    n = len(rows)
    if n < 2:
        return [(label + ": count", n, make().count())]
    test_size = rng.choice([rng.randint(1, n - 1), rng.choice([0.1, 0.25, 0.5, 0.8])])
    test_rows = int(n * test_size) if isinstance(test_size, float) else test_size
    shuffle = rng.random() < 0.3
    seed = rng.randint(0, 2**31)
    label += f"(test_size={test_size}" + (", shuffle=True, seed)" if shuffle else ")")
    parts = make().train_test_split(test_size, shuffle=shuffle, seed=seed) if shuffle else \
        make().train_test_split(test_size)
    return _parts(label, list(parts), [rows[:n - test_rows], rows[n - test_rows:]],
                  "none" if shuffle else order)


@tray.remote(num_cpus=0, max_retries=0)
def _drain(iterator) -> list:
    return [dict(row) for row in iterator.iter_rows()]


def _streaming_split(rng, label, make, rows, order):
    k, equal = rng.randint(1, 3), rng.random() < 0.5
    label += f"({k}, equal={equal})"
    refs = [_drain.remote(it) for it in make().streaming_split(k, equal=equal)]
    try:
        shares = tray.get(refs)
    except Exception:
        # A consumer a fault ended leaves its peers waiting for its share of
        # the epoch (as in Ray, every split must be consumed): end them too.
        for ref in refs:
            tray.cancel(ref, force=True)
        tray.wait(refs, num_returns=len(refs))
        raise
    got = [r for share in shares for r in share]
    found = [(label + ": iterators", k, len(shares))]
    if equal:
        found.append((label + ": equal shares", True, len({len(s) for s in shares}) <= 1))
        found.append((label + ": rows left out < k", True, 0 <= len(rows) - len(got) < k))
        extra = Counter(_multiset(got)) - Counter(_multiset(rows))
        found.append((label + ": rows not in the model", [], sorted(extra)))
        return found
    found.append((label + " (as a multiset)", _multiset(rows), _multiset(got)))
    return found
