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
])
def test_tune_seed(seed, faults):
    result = runner.run_seed(seed, "tune", faults)
    assert result.ok, result.report()
