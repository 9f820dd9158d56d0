"""Proving the libraries' reference models: bugs planted one at a time in
tray.autoscaler, tray.tune and tray.train (by monkeypatching, never by
editing them) must make their workload's sweep fail on the right
invariant, within a stated number of seeds."""

from __future__ import annotations

import pytest
from planting import first_failure  # (tests/ is on sys.path)

from tray.autoscaler import monitor as autoscaler_monitor
from tray.autoscaler import policy
from tray.simtest import runner

# ------------------------------------------------------------------ autoscaler


def _plant_update(monkeypatch, change) -> None:
    """Autoscaler.update's decisions pass through ``change(self, decisions, now)``."""
    update = policy.Autoscaler.update

    def planted(self, load, provider_nodes, now, objects_held=None):
        return change(self, update(self, load, provider_nodes, now, objects_held), now)

    monkeypatch.setattr(policy.Autoscaler, "update", planted)


def test_a_policy_that_launches_one_node_too_few_is_caught_within_3_seeds(monkeypatch):
    def one_fewer(self, decisions, now):
        for index, decision in enumerate(decisions):
            if decision.action == "launch" and decision.reason == "pending demand":
                if decision.count == 1:
                    return decisions[:index] + decisions[index + 1:]
                return decisions[:index] + [policy.Decision(
                    now, "launch", decision.node_type, count=decision.count - 1,
                    reason=decision.reason)] + decisions[index + 1:]
        return decisions

    _plant_update(monkeypatch, one_fewer)
    first_failure(range(3), "autoscaler", "none", "autoscaler-launches-for-demand")


def test_a_policy_that_waits_an_extra_period_to_launch_is_caught_within_3_seeds(monkeypatch):
    def a_round_late(self, decisions, now):
        launches = [d for d in decisions if d.action == "launch"]
        if launches and not getattr(self, "_planted_waited", False):
            self._planted_waited = True  # launch next round, when it asks again
            return [d for d in decisions if d.action != "launch"]
        self._planted_waited = False
        return decisions

    _plant_update(monkeypatch, a_round_late)
    first_failure(range(3), "autoscaler", "none", "autoscaler-launches-for-demand")


def test_a_policy_that_never_scales_down_is_caught_per_round_within_3_seeds(monkeypatch):
    # The end-of-run check (autoscaler-scales-down) sees it too
    # (tests/test_autoscaler_simtest.py); the model's round check names the
    # round, the node and how long it was idle.
    from tray.simtest import workloads_autoscaler

    monkeypatch.setattr(workloads_autoscaler, "_check", lambda *args: None)
    _plant_update(monkeypatch, lambda self, decisions, now: [
        d for d in decisions if d.action != "terminate"])
    first_failure(range(3), "autoscaler", "none", "autoscaler-terminates-idle-nodes")


def test_a_policy_that_scales_down_before_the_idle_timeout_is_caught_within_3_seeds(
        monkeypatch):
    original = policy.Autoscaler.__init__

    def impatient(self, config):
        import dataclasses

        original(self, dataclasses.replace(
            config, idle_timeout_minutes=config.idle_timeout_minutes / 3))

    monkeypatch.setattr(policy.Autoscaler, "__init__", impatient)
    first_failure(range(3), "autoscaler", "none", "autoscaler-terminates-only-idle-nodes")


def test_a_policy_that_launches_gpu_nodes_for_cpu_work_is_caught_within_5_seeds(monkeypatch):
    # The GPU type is chosen for CPU work while it is below its max_workers
    # (the scorer's GPU avoidance lost).
    update = policy.Autoscaler.update

    def gpu_first(self, load, provider_nodes, now, objects_held=None):
        decisions = update(self, load, provider_nodes, now, objects_held)
        if any(n.node_type == "gpu" and n.state != "failed" for n in provider_nodes):
            return decisions
        for index, d in enumerate(decisions):
            if d.action == "launch" and d.node_type != "gpu" and d.reason == "pending demand":
                return decisions[:index] + [policy.Decision(now, "launch", "gpu", count=1,
                                                            reason=d.reason)]
        return decisions

    monkeypatch.setattr(policy.Autoscaler, "update", gpu_first)
    first_failure(range(5), "autoscaler", "none", "autoscaler-launches-only-for-demand")


def test_a_policy_that_does_not_report_infeasible_shapes_is_caught_within_6_seeds(monkeypatch):
    update = policy.Autoscaler.update

    def silent(self, load, provider_nodes, now, objects_held=None):
        decisions = update(self, load, provider_nodes, now, objects_held)
        import dataclasses

        self.status = dataclasses.replace(self.status, infeasible=())
        return decisions

    monkeypatch.setattr(policy.Autoscaler, "update", silent)
    first_failure(range(6), "autoscaler", "none", "autoscaler-reports-infeasible")


def test_a_monitor_that_sleeps_two_periods_is_caught_within_2_seeds(monkeypatch):
    import trio

    async def slow_run(self):
        while not self._stopped:
            try:
                await self.run_once()
            except Exception:  # noqa: BLE001
                self.failed_rounds += 1
            await trio.sleep(2 * self.config.autoscaler_period_s)

    monkeypatch.setattr(autoscaler_monitor.Monitor, "run", slow_run)
    first_failure(range(2), "autoscaler", "none", "autoscaler-runs-every-period")


def test_a_policy_packing_strict_spread_groups_is_caught_within_40_seeds(monkeypatch):
    # The policy plans a STRICT_SPREAD group as if PACK would do: all its
    # bundles may go to one new node, where the group can never be placed.
    import dataclasses

    update = policy.Autoscaler.update

    def packs(self, load, provider_nodes, now, objects_held=None):
        groups = tuple((group, "PACK" if strategy == "STRICT_SPREAD" else strategy, bundles)
                       for group, strategy, bundles in load.placement_groups)
        return update(self, dataclasses.replace(load, placement_groups=groups),
                      provider_nodes, now, objects_held)

    monkeypatch.setattr(policy.Autoscaler, "update", packs)
    result = first_failure(range(40), "autoscaler", "default",
                           "autoscaler-launches-for-demand")
    assert "STRICT_SPREAD group" in result.message


def test_request_resources_survives_a_gcs_restart():
    # Found by autoscaler-reports-infeasible (default seed 14): the GCS kept
    # the standing request in memory only, and its restart withdrew it.
    import tray
    import tray.simtest
    from tray.autoscaler.sdk import request_resources
    from tray.simtest.pytest_plugin import simtest_cluster

    with simtest_cluster(0, num_nodes=1) as sim:
        request_resources(bundles=[{"CPU": 1.0, "scaled": 1.0}, {"scaled": 64.0}])
        sim.restart_gcs(down_for_s=0.2)
        sim.advance(1.0)
        gcs = sim.processes[sim.gcs_address].component
        assert [dict(b) for b in gcs.demand.requested] == [{"CPU": 1.0, "scaled": 1.0},
                                                           {"scaled": 64.0}]
    assert not tray.is_initialized()


AUTOSCALER_PINNED = [
    # The standing request_resources was lost with a GCS restart (above).
    (14, "default", "request_resources withdrawn by a GCS restart"),
]


@pytest.mark.parametrize("seed,faults,bug", AUTOSCALER_PINNED,
                         ids=[f"{s}-{f}" for s, f, _ in AUTOSCALER_PINNED])
def test_autoscaler_seed_stays_fixed(seed, faults, bug):
    result = runner.run_seed(seed, "autoscaler", faults)
    assert result.ok, f"{bug}: {result.report()}"


def test_a_node_reporting_work_queued_in_a_group_as_demand_is_caught_within_4_seeds(
        monkeypatch):
    # A node's demand report counts the lease requests waiting for a placed
    # group's busy bundles: the autoscaler launches nodes that can never run
    # them (they must run in the group's bundles). The policy's own model
    # sees nothing wrong (it trusts the load); the check against the
    # cluster's ground truth does (autoscaler-launches-only-for-real-demand).
    import dataclasses

    from tray.core.node import demand_reporter
    from tray.core.node.lease_manager import shape_key
    from tray.core.scheduling import PlacementGroupStrategy

    demand = demand_reporter.DemandReporter.demand

    def counts_group_waiters(self):
        found = demand(self)
        counts = dict(found.shapes)
        for waiter in self._leases.waiting:
            if isinstance(waiter.request.strategy, PlacementGroupStrategy):
                key = shape_key(waiter.request.resources)
                counts[key] = counts.get(key, 0) + 1
        return dataclasses.replace(found, shapes=tuple(
            sorted(counts.items(), key=lambda item: (-item[1], item[0]))))

    monkeypatch.setattr(demand_reporter.DemandReporter, "demand", counts_group_waiters)
    result = first_failure(range(4), "autoscaler", "none",
                           "autoscaler-launches-only-for-real-demand")
    assert "really waited" in result.message


# ------------------------------------------------------------------------ tune
# The tune workload's seeds 0..39 draw (scheduler, grid, max_concurrent_trials):
# median 0, 16 (hard stop), 1, 7 (pausing); ASHA 2, 3 (grid), 20, 23 and 31 (one trial at
# a time); FIFO 5 (one trial at a time); HyperBand 9, 10, 13, 14, 24, 27, 29;
# grid 1, 3, 7.


def test_asha_with_a_wrong_quantile_is_caught_within_3_seeds(monkeypatch):
    import numpy as np

    from tray.tune.schedulers import async_hyperband

    def quarter(self, recorded):
        return float(np.nanpercentile(list(recorded.values()), 25)) if recorded else None

    monkeypatch.setattr(async_hyperband._Bracket, "cutoff", quarter)
    first_failure([2, 3, 20], "tune", "none", "tune-scheduler-decisions-match-model")


def test_asha_cutting_at_the_1_over_rf_quantile_is_caught_within_2_seeds(monkeypatch):
    # A fresh red team's bug, invisible with reduction_factor=2 (1/rf is
    # 1 - 1/rf then): the workload now draws rf 2, 3 or 4 (seeds 17 and 26:
    # ASHA with rf above 2).
    import numpy as np

    from tray.tune.schedulers import async_hyperband

    def one_over_rf(self, recorded):
        return float(np.nanpercentile(list(recorded.values()), 100 / self.reduction_factor)) \
            if recorded else None

    monkeypatch.setattr(async_hyperband._Bracket, "cutoff", one_over_rf)
    first_failure([17, 26], "tune", "none", "tune-scheduler-decisions-match-model")


def test_a_median_rule_that_stops_the_better_trials_is_caught_within_2_seeds(monkeypatch):
    from tray.tune.schedulers import median_stopping_rule

    original = median_stopping_rule.MedianStoppingRule.on_trial_result

    def inverted(self, controller, trial, result):
        self._mode = "min"  # compares the wrong way round
        try:
            return original(self, controller, trial, result)
        finally:
            self._mode = "max"

    monkeypatch.setattr(median_stopping_rule.MedianStoppingRule, "on_trial_result", inverted)
    first_failure([0, 16], "tune", "none", "tune-scheduler-decisions-match-model")


def test_asha_letting_trials_run_past_a_rung_unjudged_is_caught_within_3_seeds(monkeypatch):
    from tray.tune.schedulers import async_hyperband

    original = async_hyperband.AsyncHyperBandScheduler.results_ahead
    monkeypatch.setattr(async_hyperband.AsyncHyperBandScheduler, "results_ahead",
                        lambda self, trial, result: original(self, trial, result) + 2)
    # The trial ran on past its STOP: its history holds iterations the
    # controller never took.
    first_failure([2, 3, 20], "tune", "none", "tune-result-history")


def test_resuming_from_the_oldest_checkpoint_is_caught_within_4_seeds(monkeypatch):
    from tray.tune._controller import TuneController

    original = TuneController._start

    def oldest(self, trial, runner_id):
        if len(trial.checkpoints) > 1:
            trial.restore_from = trial.checkpoints[0]
        return original(self, trial, runner_id)

    monkeypatch.setattr(TuneController, "_start", oldest)
    first_failure([1, 7, 0, 16], "tune", "none", "tune-resumes-from-latest-checkpoint")


def test_ignoring_max_concurrent_trials_is_caught_within_3_seeds(monkeypatch):
    from tray.tune._controller import TuneController

    original = TuneController.__init__

    def unlimited(self, spec, trainable, restore=None):
        original(self, spec, trainable, restore)
        self.spec.max_concurrent_trials = None

    monkeypatch.setattr(TuneController, "__init__", unlimited)
    first_failure([5, 23, 31], "tune", "none", "tune-max-concurrent-trials")


def test_a_grid_that_reuses_its_random_draws_is_caught_within_3_seeds(monkeypatch):
    from tray.tune.search import variant_generator

    original = variant_generator.BasicVariantGenerator.setup

    def constant(self, space, num_samples, seed):
        original(self, space, num_samples, seed)
        self.constant_grid_search = True  # as if set: every grid value, same draws

    monkeypatch.setattr(variant_generator.BasicVariantGenerator, "setup", constant)
    first_failure([1, 3, 7], "tune", "none", "tune-trials-match-search-space")


def test_a_best_result_picked_the_wrong_way_is_caught_within_2_seeds(monkeypatch):
    from tray.tune.result_grid import ResultGrid

    original = ResultGrid.get_best_result

    def worst(self, metric=None, mode=None, scope="last", filter_nan_and_inf=True):
        return original(self, metric, "min", scope, filter_nan_and_inf)

    monkeypatch.setattr(ResultGrid, "get_best_result", worst)
    first_failure([2, 5], "tune", "none", "tune-best-result")


def test_a_runner_reusing_a_class_trainable_without_reset_config_is_caught_within_2_seeds(
        monkeypatch):
    # Seeds 0 and 9 run a class trainable with reuse_actors=True.
    from tray.tune._runner import TrialRunner

    original = TrialRunner._make_instance

    def reuse_always(self, work):
        cached = self._instance
        if cached is not None and type(cached) is self.spec.trainable:
            self._instance = None
            cached.config = dict(work.config)  # reset_config forgotten: its state stays
            return cached
        return original(self, work)

    monkeypatch.setattr(TrialRunner, "_make_instance", reuse_always)
    first_failure([0, 9], "tune", "none", "tune-scores-match-model")


def test_results_sent_ahead_past_a_stopping_criterion_are_caught_within_1_seed(monkeypatch):
    # Seed 23: ASHA (results pass between rungs unasked) and a score stopper.
    from tray.tune._controller import REPORTS_AHEAD_MAX, TuneController

    def ahead(self, trial, result):  # forgets that a stopper may stop any result
        if self.spec.time_budget_s is not None or self._stopping_since is not None or \
                trial.stop_requested:
            return 0
        return max(0, min(self.state.scheduler.results_ahead(trial, result),
                          REPORTS_AHEAD_MAX))

    monkeypatch.setattr(TuneController, "_results_ahead", ahead)
    first_failure([23], "tune", "none", "tune-result-history")


def test_a_runner_that_forgets_with_parameters_is_caught_within_1_seed(monkeypatch):
    # Seed 0 passes a table through tune.with_parameters: every trial fails
    # on a missing parameter, an error no fault and no config explains.
    from tray.tune._runner import TrialRunner

    monkeypatch.setattr(TrialRunner, "_params", lambda self: {})
    first_failure([0], "tune", "none", "tune-failures-explained")


# ------------------------------------------------------------------------ data
# The data workload's seeds 6 and 11 end a pipeline with a user function
# that raises (tray/simtest/workloads_data.py, _limits).


def test_a_user_error_that_loses_its_class_is_caught_within_2_seeds(monkeypatch):
    from tray import exceptions
    from tray.data import _executor

    def plain(error, op_name):  # not as_instanceof_cause: a bare TaskError
        return exceptions.TaskError(f"tray.data operator {op_name}", error.traceback_str,
                                    error.cause)

    monkeypatch.setattr(_executor, "_operator_error", plain)
    first_failure([6, 11], "data", "none", "data-udf-error-reaches-consumer")


# ----------------------------------------------------------------------- train
# The train workload's seeds 10 (max_failures=0), 16 (max_failures=1) and 18
# (max_failures=0) spend their budget under the default faults; 0, 9, 16, 18
# also ask for a group the cluster can never hold.


def test_a_trainer_that_gives_up_one_failure_early_is_caught_within_2_seeds(monkeypatch):
    from tray.train import trainer

    original = trainer._Run.execute

    def early(self):
        if self.max_failures > 0:
            self.max_failures -= 1  # "failures >= max_failures"
        return original(self)

    monkeypatch.setattr(trainer._Run, "execute", early)
    first_failure([16, 11], "train", "default", "train-failure-budget")


def test_a_run_that_keeps_its_first_checkpoint_as_latest_is_caught_within_4_seeds(
        monkeypatch):
    # Its restarts resume from there too; the Result's checkpoint shows it first.
    from tray.train import _storage

    original = _storage.RunStorage.add

    def keep_first(self, row, metrics, checkpoint_path):
        first = self.latest
        original(self, row, metrics, checkpoint_path)
        if first is not None:
            self.latest = first  # the restart resumes from the first checkpoint kept

    monkeypatch.setattr(_storage.RunStorage, "add", keep_first)
    first_failure([16, 10, 18, 11], "train", "default", "train-latest-checkpoint")


def test_local_ranks_numbered_wrong_are_caught_within_6_seeds(monkeypatch):
    import dataclasses

    from tray.train import _worker_group

    original = _worker_group.rank_bundles

    def reversed_local(bundle_nodes):
        ranked = original(bundle_nodes)
        return [(bundle, dataclasses.replace(
            info, local_rank=info.local_world_size - 1 - info.local_rank))
            for bundle, info in ranked]

    monkeypatch.setattr(_worker_group, "rank_bundles", reversed_local)
    first_failure(range(6), "train", "none", "train-ranks-follow-placement")


def test_a_group_that_can_never_be_placed_is_refused_within_2_seeds(monkeypatch):
    from tray.train import trainer

    monkeypatch.setattr(trainer, "feasibility_error", lambda scaling, nodes: None)
    first_failure([0, 9], "train", "none", "train-refuses-what-never-fits")


TRAIN_PINNED = [
    # A run that spent its failure budget left its last attempt's staging
    # directory in the run directory (only the next attempt cleaned up).
    (10, "default", "a failed run's staging directory left on storage"),
]


@pytest.mark.parametrize("seed,faults,bug", TRAIN_PINNED,
                         ids=[f"{s}-{f}" for s, f, _ in TRAIN_PINNED])
def test_train_seed_stays_fixed(seed, faults, bug):
    result = runner.run_seed(seed, "train", faults)
    assert result.ok, f"{bug}: {result.report()}"


# train-checkpoints-kept: the train workload draws its CheckpointConfig
# (num_to_keep None/1/2/3, a "score" attribute max or min, or none) and
# reports a distinct score per step in mixed order; some runs fail on purpose
# once and restore. Default faults.


def test_a_prune_that_deletes_the_latest_checkpoint_is_caught_within_6_seeds(monkeypatch):
    # Seed 5 (num_to_keep=1, max): the latest is not the best, so it goes,
    # and Result.checkpoint (a restart's restore point) names a deleted directory.
    import shutil

    from tray.train import _storage

    def prune(self):
        keep = self.config.num_to_keep
        if keep is None or len(self.kept) <= keep:
            return
        for record in sorted(self.kept, key=self._score)[:len(self.kept) - keep]:
            self.kept.remove(record)
            shutil.rmtree(record.path, ignore_errors=True)

    monkeypatch.setattr(_storage.RunStorage, "_prune", prune)
    first_failure(range(6), "train", "default", "train-checkpoints-kept")


def test_a_score_order_taken_as_max_is_caught_within_3_seeds(monkeypatch):
    # checkpoint_score_order="min" ranked as "max": seeds 1 and 2 rank (and
    # seed 2 prunes) the wrong way round.
    from tray.train import _storage

    original = _storage.RunStorage._score

    def as_max(self, record):
        order, self.config.checkpoint_score_order = self.config.checkpoint_score_order, "max"
        try:
            return original(self, record)
        finally:
            self.config.checkpoint_score_order = order

    monkeypatch.setattr(_storage.RunStorage, "_score", as_max)
    first_failure(range(3), "train", "default", "train-checkpoints-kept")


def test_best_checkpoints_in_report_order_are_caught_within_2_seeds(monkeypatch):
    # Result.best_checkpoints is worst to best by score, not oldest to newest.
    from tray.train import _storage

    monkeypatch.setattr(_storage.RunStorage, "best_checkpoints",
                        lambda self: [(r.checkpoint, dict(r.metrics)) for r in self.kept])
    first_failure(range(2), "train", "default", "train-checkpoints-kept")


def _unit_controller(tmp_path, scheduler):
    from tray import tune
    from tray.tune._controller import ExperimentSpec, TuneController
    from tray.tune.search import BasicVariantGenerator
    from tray.tune.trainable import as_spec

    def trainable(config):  # never run: the controller is fed events by hand
        pass

    spec = ExperimentSpec(
        name="unit", experiment_path=str(tmp_path / "unit"), trainable_name="t",
        param_space={"x": tune.grid_search([0.1, 0.2])}, metric="score", mode="max",
        num_samples=1, search=BasicVariantGenerator(), scheduler=scheduler, stopper=None,
        checkpoint_config=tune.CheckpointConfig(), failure_config=tune.FailureConfig(
            max_failures=3), max_concurrent_trials=None, time_budget_s=None,
        reuse_actors=False, seed=0, strict_metrics=("score",))
    controller = TuneController(spec, as_spec(trainable))
    controller._nodes = lambda: [{"Resources": {"CPU": 2.0}, "Alive": True}]
    controller.start()
    return controller


class _PausingScheduler:
    """Stops the other trial at the first result of ``x == 0.1``; answers
    PAUSE to everything (as HyperBand at a milestone)."""

    @staticmethod
    def make():
        from tray.tune.schedulers import FIFOScheduler, TrialScheduler

        class Pausing(FIFOScheduler):
            asked: list = []

            def on_trial_result(self, controller, trial, result):
                Pausing.asked.append((trial.trial_id, result["training_iteration"]))
                if trial.config["x"] == 0.1:
                    for other in controller.get_trials():
                        if other is not trial:
                            controller.stop_trial(other)
                    return TrialScheduler.CONTINUE
                return TrialScheduler.PAUSE

        return Pausing()


def test_a_trial_stopped_while_running_is_not_revived_by_a_pause(tmp_path):
    # Found by tune-stopped-trials-stay-stopped (default seed 14, HyperBand):
    # a trial its scheduler stopped while it ran got, at its next result, the
    # scheduler's PAUSE (HyperBand counted it at its milestone again), was
    # paused instead of stopped, and ran on later.
    scheduler = _PausingScheduler.make()
    controller = _unit_controller(tmp_path, scheduler)
    shape = "num_cpus=1"
    a, b = controller.next_work(0, shape), controller.next_work(1, shape)
    result = {"score": 1.0, "training_iteration": 1}
    controller.report(a.trial_id, a.attempt, [(dict(result), None)])  # stops b (running)
    assert controller.report(b.trial_id, b.attempt, [(dict(result), None)]) == ("stop", False)
    assert controller.get_trial(b.trial_id).status == "TERMINATED"
    assert (b.trial_id, 1) not in type(scheduler).asked  # not asked again: it was stopped


def test_a_trial_stopped_while_running_is_not_revived_by_a_failure(tmp_path):
    # Its runner died before the stop took effect (at its next report): the
    # failure used to put it back to PENDING, to run again.
    scheduler = _PausingScheduler.make()
    controller = _unit_controller(tmp_path, scheduler)
    shape = "num_cpus=1"
    a, b = controller.next_work(0, shape), controller.next_work(1, shape)
    controller.report(a.trial_id, a.attempt, [({"score": 1.0, "training_iteration": 1}, None)])
    controller.runner_lost(1, "node died")
    assert controller.get_trial(b.trial_id).status == "TERMINATED"


def test_a_done_result_ends_its_trial_whatever_the_scheduler_answers(tmp_path):
    # Found by tune-trial-iterations (default seeds 0, 1: the median rule, a
    # class trainable): a class trainable's result with done=True got the
    # scheduler's PAUSE; the trial was paused, not ended, and when resumed its
    # runner stepped it on past max_t (iteration 17 of 8). A done result ends
    # the trial (Ray: Trial.should_stop), the scheduler is told of it still.
    scheduler = _PausingScheduler.make()
    controller = _unit_controller(tmp_path, scheduler)
    shape = "num_cpus=1"
    controller.next_work(0, shape)  # (x == 0.1: the trial the scheduler lets run)
    b = controller.next_work(1, shape)
    done = {"score": 1.0, "training_iteration": 3, "done": True}
    assert controller.report(b.trial_id, b.attempt, [(dict(done), None)]) == ("stop", False)
    trial = controller.get_trial(b.trial_id)
    assert trial.status == "TERMINATED" and not trial.stopped_early
    assert (b.trial_id, 3) in type(scheduler).asked


def test_a_checkpoint_the_snapshot_lists_is_deleted_only_after_the_next_snapshot(tmp_path):
    # Found by tune-checkpoints-kept (default seed 20): retention deleted a
    # trial's older checkpoints as soon as newer ones came; the controller
    # then died, and the one restarted from the last snapshot resumed the
    # trial from a checkpoint no longer on storage: every retry failed
    # (FileNotFoundError) and the trial ended ERROR.
    import os
    import pickle

    from tray import tune
    from tray.tune.schedulers import FIFOScheduler

    controller = _unit_controller(tmp_path, FIFOScheduler())
    controller.spec.checkpoint_config = tune.CheckpointConfig(num_to_keep=1)
    work = controller.next_work(0, "num_cpus=1")
    paths = [str(tmp_path / f"checkpoint_{i:06d}") for i in range(2)]
    for i, path in enumerate(paths):
        os.makedirs(path)
        info = {"path": path, "index": i, "training_iteration": i + 1, "time_total_s": 0.0}
        controller.report(work.trial_id, work.attempt,
                          [({"score": float(i), "training_iteration": i + 1}, info)])
        if i == 0:
            controller.snapshot(force=True)  # it lists checkpoint 0 as the latest
    trial = controller.get_trial(work.trial_id)
    assert [c.path for c in trial.checkpoints] == paths[1:]
    assert os.path.isdir(paths[0])  # the snapshot on storage still resumes from it
    controller.snapshot(force=True)
    assert not os.path.isdir(paths[0]) and os.path.isdir(paths[1])
    with open(os.path.join(controller.spec.experiment_path, "experiment_state.pkl"), "rb") as f:
        state = pickle.load(f)
    assert [c.path for c in state.trials[work.trial_id].checkpoints] == paths[1:]


TUNE_PINNED = [
    (14, "default", "a trial stopped by HyperBand while running was paused, then ran on"),
    (0, "default", "a done result paused by the median rule: the class trainable ran on"),
    (1, "default", "a done result paused by the median rule: the class trainable ran on"),
    (20, "default", "retention deleted checkpoints the snapshot a new controller used listed"),
]


@pytest.mark.parametrize("seed,faults,bug", TUNE_PINNED,
                         ids=[f"{s}-{f}" for s, f, _ in TUNE_PINNED])
def test_tune_seed_stays_fixed(seed, faults, bug):
    result = runner.run_seed(seed, "tune", faults)
    assert result.ok, f"{bug}: {result.report()}"
