"""Serve and Data under simtest: the workloads' models catch bugs planted in
the libraries (by monkeypatching, never by editing them), on the right
invariant within a stated number of seeds; and the issue-41 bugs those
workloads reach (a Data pool as large as the cluster then ``take()``
hung; a sort with a list of directions sorted every key one way; Serve
sent every request of a sequential caller to one replica) stay fixed."""

from __future__ import annotations

import collections

import pytest

import tray
from tray.simtest import runner


def _first_failure(seeds, workload: str, faults: str, invariant: str):
    seen = []
    for seed in seeds:
        result = runner.run_seed(seed, workload, faults)
        if not result.ok:
            seen.append((seed, result.invariant, result.message[:200]))
            if result.invariant == invariant:
                return result
    pytest.fail(f"the planted bug went unnoticed (failures on other invariants: {seen})")


# ====================================================== issue 41 regressions


@pytest.fixture
def two_cpus():
    tray.init(backend="sim", num_nodes=1, num_cpus=2, seed=0)
    yield
    tray.shutdown()


class _Double:
    def __call__(self, batch):
        return {"id": batch["id"] * 2}


def test_a_pool_as_large_as_the_cluster_then_take_finishes(two_cpus):
    # Before: the limit's slice task waited for a CPU the pool never freed
    # (take/show hung), and then any pool as large as the cluster was
    # refused at once; now the read runs on the pool's actors, the slice
    # needs no CPU and a finished pool frees its actors.
    import tray.data as td

    def ds():
        return td.range(100, override_num_blocks=4).map_batches(_Double, concurrency=2)

    assert ds().take(5) == [{"id": 2 * i} for i in range(5)]
    assert ds().count() == 100
    assert sum(len(b["id"]) for b in ds().iter_batches(batch_size=7)) == 100
    # A task map after the pool runs once the pool is done with its input.
    assert ds().map(lambda r: {"id": r["id"] + 1}).take(3) == [{"id": 1}, {"id": 3}, {"id": 5}]


def test_sort_takes_one_direction_per_key(two_cpus):
    import tray.data as td

    rows = [{"g": (i * 7) % 3, "k": (i * 5) % 11, "i": i} for i in range(30)]
    got = td.from_items(rows, override_num_blocks=4).sort(
        ["g", "k"], descending=[False, True]).take_all()
    expected = sorted(rows, key=lambda r: (r["g"], -r["k"]))
    assert [(r["g"], r["k"]) for r in got] == [(r["g"], r["k"]) for r in expected]
    got = td.from_items(rows, override_num_blocks=3).sort(
        ["g", "k"], descending=[True, False]).take_all()
    assert [(r["g"], r["k"]) for r in got] == \
        [(r["g"], r["k"]) for r in sorted(rows, key=lambda r: (-r["g"], r["k"]))]
    with pytest.raises(ValueError, match="one per key"):
        td.from_items(rows).sort(["g", "k"], descending=[True])
