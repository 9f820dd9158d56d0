"""The ``autoscaler`` simtest workload: green and deterministic on a few
seeds, and its invariants can fail (planted bugs)."""

from __future__ import annotations

import json

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
