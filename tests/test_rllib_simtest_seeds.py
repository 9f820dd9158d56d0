"""Pinned seeds of the ``rllib`` simtest workload (tray/simtest/workloads_rllib.py)
that once failed; each must stay green."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("gymnasium")

from tray.simtest import runner  # noqa: E402


@pytest.mark.parametrize(("seed", "faults"), [
    # The workload's own kill of an env runner's worker came while the GCS
    # was restarting: worker_of() raised "the GCS is down" inside the
    # simulation and crashed the run. Now the kill waits for the GCS.
    (118, "default"),
    # The workload killed an env runner's worker (sim.kill_worker), the actor
    # restarted and its constructor ran again: the checker counted only the
    # schedule's faults and called the second run causeless. Now every
    # kill_worker in the trace is a fault, whoever asked for it.
    (253, "default"),
])
def test_rllib_seed(seed, faults):
    result = runner.run_seed(seed, "rllib", faults)
    assert result.ok, result.report()
