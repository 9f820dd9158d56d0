"""The ``autoscaler`` simtest workload: green and deterministic on a few
seeds, and its invariants can fail (planted bugs)."""

from __future__ import annotations

import json

import pytest

from tray.autoscaler import policy
from tray.simtest import runner
from tray.simtest.cli import sweep


def test_autoscaler_workload_is_green_and_deterministic():
    summary = sweep(range(0, 4), "autoscaler", "default", determinism_every=2)
    assert summary["failures"] == [], json.dumps(summary["failures"], indent=1)[:4000]
    assert summary["seeds"] == 4
    assert summary["nondeterministic_seeds"] == []


def test_a_policy_that_launches_past_max_workers_is_caught(monkeypatch):
    update = policy.Autoscaler.update

    def overshoot(self, load, provider_nodes, now, objects_held=None):
        decisions = update(self, load, provider_nodes, now, objects_held)
        if any(d.action == "launch" for d in decisions):
            decisions.append(policy.Decision(now, "launch", "small", count=4))
        return decisions

    monkeypatch.setattr(policy.Autoscaler, "update", overshoot)
    result = runner.run_seed(0, "autoscaler", "none")
    assert not result.ok
    assert result.invariant == "autoscaler-node-bounds", result.message[:2000]


def test_a_policy_that_never_scales_down_is_caught(monkeypatch):
    update = policy.Autoscaler.update

    def keep_everything(self, load, provider_nodes, now, objects_held=None):
        decisions = update(self, load, provider_nodes, now, objects_held)
        return [d for d in decisions if d.action != "terminate"]

    monkeypatch.setattr(policy.Autoscaler, "update", keep_everything)
    result = runner.run_seed(1, "autoscaler", "none")
    assert not result.ok
    assert result.invariant == "autoscaler-scales-down", result.message[:2000]


# Chaos seeds of the autoscaler workload that broke: (seed, what broke).
PINNED_CHAOS = [
    # The workload removed its placement group once the work was done, then
    # its own crash of a scaled node took the only copy of the group task's
    # result (the seed stores small results in the node's store); the
    # runner's later read reconstructed the task, which failed with
    # TaskPlacementGroupRemoved (as Ray's would: a removed group's tasks
    # cannot run again). The workload now reads that result, pulling a copy
    # to the driver's node, before it removes the group.
    (3, "a removed group's task reconstructed after its node crashed"),
    # A scaled node added while the GCS was down crashed (a fault) before it
    # registered; the workload's own node crash then asked whether it was
    # alive, and SimCluster.is_alive raised "unknown node" (neither the
    # machines nor the GCS knew the id). An id no machine holds is not alive;
    # test_fault_tolerance.py has the direct test.
    (37, "is_alive of a node that never registered raised"),
    (49, "is_alive of a node that never registered raised"),
    # The workload's crash of the scaled GPU node took a GPU task's result,
    # and the runner read it only after the monitor had stopped: its re-run
    # waited for a GPU node nobody would launch. Read while the monitor runs.
    (109, "a GPU task's result read after the autoscaler stopped"),
    (315, "a GPU task's result read after the autoscaler stopped"),
    # A duplicate fault on a node the autoscaler added is recorded without a
    # node id; the attribution check raised TypeError on it.
    (237, "a fault record without a target crashed the attribution check"),
]


@pytest.mark.parametrize("seed,bug", PINNED_CHAOS, ids=[str(s) for s, _ in PINNED_CHAOS])
def test_autoscaler_chaos_seed_stays_fixed(seed, bug):
    result = runner.run_seed(seed, "autoscaler", "chaos")
    assert result.ok, f"{bug}: {result.report()}"
    assert any("by the workload" in fault for fault in result.schedule)
