"""tray.data under faults: pipelines whose output rows must equal the
fault-free answer.

Each seed builds one or two Data pipelines of a random shape (fused maps,
an actor pool, a shuffle, a sort, a groupby, a union/limit), runs them in
the driver while the seed's faults fire, and records the rows it got with
``program.expect``; the reference model is plain Python over the same
input. Block tasks are retried and lost blocks rebuilt through lineage, so
a crash should change nothing but the time taken; an error the faults
permit (a worker crashed past its retries, an object lost with its
lineage) is re-raised by a task so the runner judges it as it judges any.

Map functions sleep a little virtual time, so that the pipelines are still
running when the faults fire (the fault window is 0.6 virtual seconds).
"""

from __future__ import annotations

import time

import numpy as np

import tray


@tray.remote(max_retries=3)
def _reraise(error: BaseException):
    raise error


def _slow_square(batch, sleep_s: float):
    time.sleep(sleep_s)
    return {"id": batch["id"], "sq": batch["id"] * batch["id"]}


class _Offset:
    """A callable class for the actor pool; state: its offset."""

    def __init__(self, offset: int, sleep_s: float) -> None:
        self.offset = offset
        self.sleep_s = sleep_s

    def __call__(self, batch):
        time.sleep(self.sleep_s)
        return {"id": batch["id"], "sq": batch["sq"] + self.offset}


def _not_multiple_of_3(row) -> bool:
    return row["id"] % 3 != 0


def _by_id(row):
    return row["id"]


def _run(program, build, expected, label: str) -> None:
    try:
        rows = build()
        ref = tray.put(rows)
    except Exception as error:  # noqa: BLE001 - judged by the runner like any error
        ref = _reraise.remote(error)
    program.expect(ref, expected, label=f"data: {label}")


def data_pipeline(program) -> None:
    import tray.data as td

    rng = program.rng
    for _ in range(rng.randint(1, 2)):
        n = rng.randint(20, 300)
        blocks = rng.randint(1, 8)
        sleep_s = rng.choice([0.0, 0.01, 0.05, 0.1])
        strategy = rng.choice(["DEFAULT", "SPREAD"])
        shape = rng.choice(["map", "actors", "shuffle", "sort", "groupby", "union"])
        squares = [{"id": i, "sq": i * i} for i in range(n)]

        def base(n=n, blocks=blocks, sleep_s=sleep_s, strategy=strategy):
            return td.range(n, override_num_blocks=blocks).map_batches(
                _slow_square, fn_kwargs={"sleep_s": sleep_s}, scheduling_strategy=strategy)

        if shape == "map":
            def build(base=base):
                return base().filter(_not_multiple_of_3).take_all()
            expected = [row for row in squares if row["id"] % 3 != 0]
        elif shape == "actors":
            offset = rng.randint(1, 100)

            def build(base=base, offset=offset, sleep_s=sleep_s):
                # No CPUs for the pool: on one-CPU nodes, actors holding half a
                # CPU each would leave no room for the one-CPU tasks feeding them.
                return base().map_batches(_Offset, concurrency=2, batch_size=16,
                                          fn_constructor_args=(offset, sleep_s),
                                          num_cpus=0).take_all()
            expected = [{"id": r["id"], "sq": r["sq"] + offset} for r in squares]
        elif shape == "shuffle":
            seed = rng.randint(0, 2**31)

            def build(base=base, seed=seed):
                rows = base().random_shuffle(seed=seed).take_all()
                return sorted(rows, key=_by_id)
            expected = squares
        elif shape == "sort":
            def build(base=base):
                return base().sort("sq", descending=True).take_all()
            expected = sorted(squares, key=lambda row: -row["sq"])
        elif shape == "groupby":
            groups = rng.randint(1, 6)

            def build(base=base, groups=groups):
                keyed = base().map_batches(
                    lambda b, groups=groups: {"k": b["id"] % groups, "sq": b["sq"]})
                return keyed.groupby("k").sum("sq").take_all()
            totals: dict = {}
            for row in squares:
                totals[row["id"] % groups] = totals.get(row["id"] % groups, 0) + row["sq"]
            expected = [{"k": k, "sum(sq)": totals[k]} for k in sorted(totals)]
        else:
            limit = rng.randint(0, 2 * n)

            def build(base=base, limit=limit):
                return base().union(base()).limit(limit).take_all()
            expected = (squares + squares)[:limit]
        _run(program, build, _normalize(expected), f"{shape} of {n} rows in {blocks} blocks")


def _normalize(rows: list) -> list:
    return [{k: (v.item() if isinstance(v, np.generic) else v) for k, v in row.items()}
            for row in rows]


WORKLOADS = {"data": data_pipeline}
