"""Pinned seeds of the ``tune`` simtest workload (tray/simtest/workloads_tune.py)
that once failed; each must stay green. A fix changes what a seed runs, so
test_tune.py pins each mechanism directly as well."""

from __future__ import annotations

import pytest

from tray.simtest import runner


@pytest.mark.parametrize(("seed", "faults"), [
    # A worker crash killed the controller actor while it ran start() (the
    # GCS had restarted and re-created it once already): fit() raised
    # ActorDiedError, since only a controller that died after start() was
    # replaced. Now the driver starts another one (the same way) when the
    # controller's process is lost during start() too.
    (10, "chaos"),
    # A node crash killed a runner while its next_work call was on the way to
    # the controller; the driver's runner_lost got there first, then the late
    # next_work handed a trial to the dead runner: the trial stayed RUNNING
    # and fit() polled forever. Now the controller gives a lost runner no
    # trial, and a poll fails a RUNNING trial whose runner the driver no
    # longer holds.
    (89, "chaos"),
    # The workload's check rounded a trial's score (a sum of 9-digit roundings,
    # 4.6191465) and the model's (a product, 4.6191464999...) to 6 digits
    # apart, at a half: a false "restore from the wrong checkpoint". Now
    # they are compared within a tolerance far below one step's score.
    (126, "chaos"),
    # With the state saved whenever a trial ended (so that a restore never
    # re-runs it), a snapshot could come between a trial's failure and the
    # controller's death: the restored controller counted 0 failures for a
    # trial that had failed. A failure is now saved at once as well.
    (20, "chaos"),
    # A failure reported to a controller that died before it saved it was
    # not counted (the restored controller resumed the trial as any running
    # one): the check now excuses it when a controller was replaced.
    (201, "default"),
    # An attempt that reported a score and died left that score as the
    # trial's metrics while its retry dropped the line from result.json:
    # get_best_result() chose a trial whose stored history had no such result.
    (291, "default"),
])
def test_tune_seed(seed, faults):
    result = runner.run_seed(seed, "tune", faults)
    assert result.ok, result.report()
