"""Seeds of the fault sweeps that found tray bugs, pinned so they stay fixed.

Each replays with ``tray simtest replay --seed N --workload mixed --faults P``.
The first ones were found when ``chaos`` was the same schedule as
``default``; they are pinned under ``default``, which still draws them."""

from __future__ import annotations

import pytest

from tray.simtest import runner

PINNED = [
    # A lease whose grant reply was lost in a connection reset stayed taken
    # forever; now the node asks the owner whether it holds it.
    (66, "default", "lease lost in a reset"),
    # An actor call re-sent after a reset ran twice (both copies were waiting
    # for their turn); now the actor answers a re-sent call with the first reply.
    (79, "default", "actor call re-sent after a reset ran twice"),
    # Leases granted to the GCS for actor creations in progress when it
    # restarted were never returned.
    (86, "default", "actor leases across GCS restarts"),
    (92, "default", "actor leases across GCS restarts"),
    (93, "default", "lease lost in a reset, with partitions"),
    # The chaos profile (BUGGIFY: every object through the store): a
    # restarted actor's constructor found its arguments freed (they were
    # released at the first start), and a pull from this node's manager over
    # a reset connection failed the get instead of asking again.
    (2, "chaos", "pull_object over a reset connection"),
    (13, "chaos", "pull_object over a reset connection, in wait"),
    (21, "chaos", "constructor arguments freed before a restart"),
    (38, "chaos", "constructor arguments freed before a restart"),
    # Two attempts of one task in one worker (re-pushed after a reset cut
    # the first off): the first to end removed the other's entry, and the
    # other failed its task with a KeyError.
    (160, "chaos", "two attempts of a task in one worker"),
]


@pytest.mark.parametrize("seed,profile,bug", PINNED,
                         ids=[f"{profile}-{seed}" for seed, profile, _ in PINNED])
def test_fault_seed_stays_fixed(seed, profile, bug):
    result = runner.run_seed(seed, "mixed", profile)
    assert result.ok, f"{bug}: {result.report()}"


def test_first_run_in_a_process_repeats_like_later_runs():
    # Seed 413 used a task through .options() before using it plainly: each
    # variant pickled the function on its own, at different moments, so the
    # first run in a process exported one function more than later runs.
    first = runner.run_seed(413, "mixed", "default")
    second = runner.run_seed(413, "mixed", "default")
    assert first.digest == second.digest


def test_options_variants_share_one_export():
    import tray

    @tray.remote
    def f(x):
        return x

    variant = f.options(num_cpus=0.5)
    assert variant._export is f._export
    assert variant._export.get() == f._export.get()


def test_reset_during_borrowing_keeps_the_object():
    # A connection reset lost a one-way reference-counting message (add or
    # remove borrower), so an object a borrower held was freed early. One-way
    # messages that matter are reliable now: re-sent, handled once.
    result = runner.run_seed(413, "mixed", "default")
    assert result.ok, result.report()
