"""tray.tune on the simulated backend: search spaces, trainables, schedulers,
search algorithms, fault tolerance, results, and the errors users can cause.

Virtual time makes every ``time.sleep`` in a trainable free, and a seed
makes every experiment replay, so most behaviour is tested here; a few
tests on real processes live in test_tune_local.py."""

from __future__ import annotations

import json
import os
import random
import time

import pytest

import tray
import tray.simtest
from tray import tune
from tray.tune._controller import TuneController
from tray.tune.search.variant_generator import BasicVariantGenerator, resolve

# ================================================================ trainables


def quadratic(config):
    """Score peaks at x = 0.5; one report per virtual 0.1 s."""
    for step in range(1, config.get("steps", 4) + 1):
        time.sleep(0.1)
        tune.report({"score": -((config["x"] - 0.5) ** 2) * 10 + step, "step": step})


def checkpointed(config):
    """Accumulates its state in checkpoints; fails once at ``fail_at``."""
    start, total = 0, 0.0
    checkpoint = tune.get_checkpoint()
    if checkpoint is not None:
        with open(os.path.join(checkpoint.path, "state.json")) as file:
            start, total = json.load(file)
    marker = os.path.join(config["marker_dir"], tune.get_context().get_trial_id())
    for step in range(start + 1, config["steps"] + 1):
        time.sleep(0.05)
        total += config["x"]
        if step == config.get("fail_at") and not os.path.exists(marker + ".failed"):
            open(marker + ".failed", "w").close()
            raise RuntimeError("planned failure")
        directory = os.path.join(config["marker_dir"], f"tmp-{tune.get_context().get_trial_id()}")
        os.makedirs(directory, exist_ok=True)
        with open(os.path.join(directory, "state.json"), "w") as file:
            json.dump([step, total], file)
        tune.report({"total": total}, checkpoint=tune.Checkpoint.from_directory(directory))


class Counter(tune.Trainable):
    def setup(self, config, offset=0):
        self.value = config["start"] + offset
        self.resets = 0

    def step(self):
        time.sleep(0.05)
        self.value += 1
        if self.config.get("crash_at") == self.value and \
                not os.path.exists(self.config["marker"]):
            open(self.config["marker"], "w").close()
            os._exit(1)  # in the simulator: this worker only
        return {"value": self.value, "done": self.iteration + 1 >= self.config["steps"]}

    def save_checkpoint(self, checkpoint_dir):
        return {"value": self.value}

    def load_checkpoint(self, checkpoint):
        self.value = checkpoint["value"]

    def reset_config(self, new_config):
        self.value = new_config["start"]
        self.resets += 1
        return True


def no_metric(config):
    tune.report({"something_else": 1})


def with_data(config, data=None, scale=1):
    tune.report({"sum": float(data.sum()) * scale + config["x"]})


def timed(config):
    start = time.time()
    time.sleep(1.0)
    tune.report({"start": start, "end": time.time()})


# ================================================================ helpers


@pytest.fixture
def sim():
    tray.init(backend="sim", seed=3, num_cpus=4)
    yield tray.simtest.cluster()
    tray.shutdown()


def run(trainable, tmp_path, name="exp", **kwargs):
    run_kwargs = {k: kwargs.pop(k) for k in ("stop", "failure_config", "checkpoint_config",
                                             "verbose") if k in kwargs}
    run_kwargs.setdefault("verbose", 0)
    param_space = kwargs.pop("param_space", {})
    tuner = tune.Tuner(trainable, param_space=param_space,
                       tune_config=tune.TuneConfig(**kwargs),
                       run_config=tune.RunConfig(name=name, storage_path=str(tmp_path),
                                                 **run_kwargs))
    return tuner.fit()


def history(result):
    with open(os.path.join(result.path, "result.json")) as file:
        return [json.loads(line) for line in file]


# ================================================================ search spaces


def test_domains_sample_within_their_bounds_from_the_given_rng():
    rng = random.Random(0)
    space = {"u": tune.uniform(1, 2), "q": tune.quniform(0, 1, 0.25),
             "log": tune.loguniform(1e-4, 1e-1), "i": tune.randint(0, 3),
             "qi": tune.qrandint(0, 10, 5), "n": tune.randn(10, 0.001),
             "c": tune.choice(["a", "b"]), "nested": {"deep": tune.lograndint(1, 100)},
             "derived": tune.sample_from(lambda spec: spec.config.i * 10), "const": 7}
    seen_i, seen_qi = set(), set()
    for _ in range(300):
        config, _ = resolve(space, rng)
        assert 1 <= config["u"] < 2
        assert config["q"] in (0.0, 0.25, 0.5, 0.75, 1.0)
        assert 1e-4 <= config["log"] <= 1e-1
        seen_i.add(config["i"])
        seen_qi.add(config["qi"])
        assert abs(config["n"] - 10) < 0.01
        assert config["c"] in ("a", "b")
        assert 1 <= config["nested"]["deep"] < 100
        assert config["derived"] == config["i"] * 10
        assert config["const"] == 7
    assert seen_i == {0, 1, 2}  # randint: upper exclusive
    assert seen_qi == {0, 5, 10}  # qrandint: upper inclusive
    assert resolve(space, random.Random(5))[0] == resolve(space, random.Random(5))[0]


def test_grid_search_times_num_samples_first_key_fastest():
    generator = BasicVariantGenerator(random_state=1)
    generator.setup({"a": tune.grid_search([1, 2]), "b": tune.grid_search(["x", "y"]),
                     "r": tune.uniform(0, 1)}, num_samples=2, seed=0)
    configs = [config for config, _ in generator.iter_configs()]
    assert [(c["a"], c["b"]) for c in configs] == [(1, "x"), (2, "x"), (1, "y"), (2, "y")] * 2
    assert len({c["r"] for c in configs}) == 8  # random draws are per variant


def test_points_to_evaluate_run_first():
    generator = BasicVariantGenerator(points_to_evaluate=[{"x": 0.5}], random_state=0)
    generator.setup({"x": tune.uniform(0, 1), "y": tune.choice([1])}, num_samples=3, seed=0)
    configs = [config for config, _ in generator.iter_configs()]
    assert configs[0] == {"x": 0.5, "y": 1}
    assert len(configs) == 3


def test_bad_search_spaces_fail_with_clear_errors():
    with pytest.raises(ValueError, match="grid search"):
        tune.Tuner(quadratic, param_space={"x": {"grid_search": 3}})
    with pytest.raises(ValueError, match="lower .* less than upper"):
        tune.uniform(2, 1)
    with pytest.raises(ValueError, match="list of categories"):
        tune.choice("abc")
    optuna = pytest.importorskip("optuna")
    with pytest.raises(TypeError, match="search space type tray.tune does not know"):
        tune.Tuner(quadratic,
                   param_space={"x": optuna.distributions.FloatDistribution(0, 1)})


# ================================================================ experiments


def test_function_trainable_results_and_files(sim, tmp_path):
    grid = run(quadratic, tmp_path, metric="score", mode="max", num_samples=4,
               param_space={"x": tune.uniform(0, 1), "steps": 3})
    assert len(grid) == 4 and grid.num_errors == 0 and grid.num_terminated == 4
    best = grid.get_best_result()
    assert best.config["x"] == min((r.config["x"] for r in grid), key=lambda x: abs(x - 0.5))
    assert best.metrics["training_iteration"] == 3
    assert [row["training_iteration"] for row in history(best)] == [1, 2, 3]
    frame = grid.get_dataframe()
    assert {"config/x", "score", "training_iteration", "logdir"} <= set(frame.columns)
    assert list(best.metrics_dataframe["step"]) == [1, 2, 3]
    assert json.load(open(os.path.join(best.path, "params.json")))["x"] == best.config["x"]
    assert tune.Tuner.can_restore(grid.experiment_path)
    # filter_metric picks each trial's best row, not its last.
    assert len(grid.get_dataframe(filter_metric="score", filter_mode="min")) == 4


def _asha_experiment(seed: int, tmp_path) -> tuple:
    tray.init(backend="sim", seed=seed, num_cpus=3)
    try:
        grid = run(quadratic, tmp_path / f"run{seed}-{random.random()}", metric="score",
                   mode="max", num_samples=12, param_space={"x": tune.uniform(0, 1), "steps": 8},
                   scheduler=tune.schedulers.ASHAScheduler(max_t=8, grace_period=1,
                                                           reduction_factor=2))
        stopped_at = [(r.config["x"], r.metrics["training_iteration"]) for r in grid]
        return stopped_at, grid.get_best_result().config, tray.simtest.trace_digest()
    finally:
        tray.shutdown()


def test_asha_stops_at_rungs_and_a_seed_replays(tmp_path):
    first = _asha_experiment(11, tmp_path)
    again = _asha_experiment(11, tmp_path)
    assert first == again  # same trials, decisions, best result and event trace
    iterations = [iteration for _x, iteration in first[0]]
    assert set(iterations) <= {1, 2, 4, 8}
    assert iterations.count(8) < len(iterations)  # some were stopped early
    other = _asha_experiment(12, tmp_path)
    assert other[0] != first[0]  # another simulation seed draws other trials


def _asha_under_a_node_crash(seed: int, tmp_path) -> tuple:
    tray.init(backend="sim", seed=seed, num_nodes=3, num_cpus=2)
    try:
        sim = tray.simtest.cluster()
        victim = sim.node_ids()[1]
        sim.at(0.35, lambda: sim.kill_node(victim, restart_after_s=0.5))
        grid = run(checkpointed, tmp_path / f"crash-{random.random()}", metric="total",
                   mode="max", num_samples=8,
                   param_space={"x": tune.uniform(0, 1), "steps": 8,
                                "marker_dir": str(tmp_path)},
                   scheduler=tune.schedulers.ASHAScheduler(max_t=8, reduction_factor=2),
                   failure_config=tune.FailureConfig(max_failures=3))
        failures = sum(r._trial.num_failures for r in grid)
        outcome = [(r.config["x"], r.status, r.metrics.get("training_iteration")) for r in grid]
        return outcome, failures, grid.get_best_result().config, tray.simtest.trace_digest()
    finally:
        tray.shutdown()


def test_a_seed_replays_under_faults(tmp_path):
    first = _asha_under_a_node_crash(4, tmp_path)
    assert first[1] > 0  # the crash cost some trials an attempt
    assert all(status == "TERMINATED" for _x, status, _i in first[0])
    assert first == _asha_under_a_node_crash(4, tmp_path)


def test_class_trainable_checkpoints_and_survives_a_worker_crash(sim, tmp_path):
    marker = str(tmp_path / "crashed")
    grid = run(Counter, tmp_path, num_samples=1,
               param_space={"start": 10, "steps": 6, "crash_at": 14, "marker": marker},
               failure_config=tune.FailureConfig(max_failures=1),
               checkpoint_config=tune.CheckpointConfig(checkpoint_frequency=2))
    [result] = grid
    assert os.path.exists(marker)  # the worker did crash once
    assert result.status == "TERMINATED" and result.error is None
    # Resumed from the checkpoint at iteration 2 (value 12): no lost or doubled steps.
    assert result.metrics["value"] == 16
    assert [row["value"] for row in history(result)] == [11, 12, 13, 14, 15, 16]
    assert result.checkpoint is not None


def test_function_trainable_resumes_from_its_checkpoint(sim, tmp_path):
    grid = run(checkpointed, tmp_path, num_samples=1, metric="total", mode="max",
               param_space={"x": 2.0, "steps": 5, "fail_at": 4, "marker_dir": str(tmp_path)},
               failure_config=tune.FailureConfig(max_failures=2),
               checkpoint_config=tune.CheckpointConfig(num_to_keep=2))
    [result] = grid
    assert result.status == "TERMINATED"
    assert result.metrics["total"] == 10.0  # 5 steps of 2.0, none lost or doubled
    assert [row["training_iteration"] for row in history(result)] == [1, 2, 3, 4, 5]
    kept = sorted(name for name in os.listdir(result.path) if name.startswith("checkpoint_"))
    assert len(kept) == 2  # num_to_keep
    assert "Failure # 1" in open(os.path.join(result.path, "error.txt")).read()


class _ControllerThatDies(TuneController):
    """Its worker exits once in ``start`` and once in a ``poll`` after a trial
    reported, each while a marker file in the experiment directory says so."""

    def _die_once(self, method: str) -> None:
        marker = os.path.join(self.spec.experiment_path, f"die-in-{method}")
        if os.path.exists(marker):
            os.remove(marker)
            os._exit(1)  # in the simulator: this worker only

    def start(self):
        self._die_once("start")
        return super().start()

    def poll(self, census):
        if any(t.last_result for t in self.state.trials.values()):
            self._die_once("poll")
        return super().poll(census)


def test_fit_survives_the_controller_dying_while_it_starts_and_later(sim, tmp_path,
                                                                   monkeypatch):
    # The controller died in start() (chaos seed 10 of the tune workload): fit()
    # raised ActorDiedError. Now the driver starts another controller, as it
    # already did for one that died later on (from its snapshot).
    from tray.tune import tuner

    monkeypatch.setattr(tuner, "ControllerActor", tray.remote(_ControllerThatDies))
    experiment = tmp_path / "dies"
    os.makedirs(experiment)
    for method in ("start", "poll"):
        open(experiment / f"die-in-{method}", "w").close()
    grid = run(checkpointed, tmp_path, name="dies", metric="total", mode="max",
               param_space={"x": tune.grid_search([1.0, 2.0, 3.0]), "steps": 6,
                            "marker_dir": str(tmp_path)})
    assert not any(name.startswith("die-in-") for name in os.listdir(experiment))  # both died
    assert [r.status for r in grid] == ["TERMINATED"] * 3
    for result in grid:  # resumed from checkpoints: no step lost or doubled
        assert result.metrics["total"] == 6 * result.config["x"]
        assert [row["training_iteration"] for row in history(result)] == [1, 2, 3, 4, 5, 6]
        assert result._trial.num_failures == 0  # a lost controller is no trial's failure


def test_errors_beyond_max_failures_are_reported_not_raised(sim, tmp_path):
    grid = run(checkpointed, tmp_path, num_samples=2,
               param_space={"x": 1.0, "steps": 3, "fail_at": 2, "marker_dir": str(tmp_path)},
               failure_config=tune.FailureConfig(max_failures=0))
    assert [r.status for r in grid] == ["ERROR", "ERROR"]
    assert grid.num_errors == 2 and grid.num_terminated == 0
    assert all(isinstance(error, RuntimeError) and "planned failure" in str(error)
               for error in grid.errors)
    assert grid[0].metrics["training_iteration"] == 1  # its last result before the error
    os.makedirs(tmp_path / "again")
    space = {"x": 1.0, "steps": 3, "fail_at": 2, "marker_dir": str(tmp_path / "again"),
             "i": tune.grid_search([0, 1, 2])}
    grid = run(checkpointed, tmp_path, name="fast", param_space=space, max_concurrent_trials=1,
               failure_config=tune.FailureConfig(fail_fast=True))
    assert [r.status for r in grid] == ["ERROR", "PENDING", "PENDING"]  # the rest never ran
    os.makedirs(tmp_path / "third")
    with pytest.raises(RuntimeError, match="planned failure") as raised:
        run(checkpointed, tmp_path, name="raise", param_space=dict(space, marker_dir=str(
            tmp_path / "third")), failure_config=tune.FailureConfig(fail_fast="raise"))
    assert type(raised.value) is RuntimeError  # the trial's own error


def test_with_parameters_puts_once_and_with_resources_limits_concurrency(sim, tmp_path):
    import numpy as np

    data = np.ones(100_000)
    wrapped = tune.with_parameters(with_data, data=data, scale=2)
    assert all(isinstance(ref, tray.ObjectRef) for ref in wrapped.parameters.values())
    grid = run(wrapped, tmp_path, num_samples=3, param_space={"x": tune.randint(0, 5)})
    assert sorted(r.metrics["sum"] - r.config["x"] for r in grid) == [200_000.0] * 3

    grid = run(tune.with_resources(timed, {"cpu": 2}), tmp_path, name="res", num_samples=6)
    spans = [(r.metrics["start"], r.metrics["end"]) for r in grid]
    overlap = max(sum(1 for s, e in spans if s <= t < e) for t, _ in spans)
    assert overlap == 2  # 4 CPUs, 2 per trial
    with pytest.raises(ValueError, match="no node of the cluster has that much"):
        run(tune.with_resources(timed, {"cpu": 64}), tmp_path, name="big")


def test_user_errors_are_clear(sim, tmp_path):
    with pytest.raises(ValueError, match="without the metric"):
        run(no_metric, tmp_path, name="m", metric="score", mode="max")
    with pytest.raises(ValueError, match="needs a metric and a mode"):
        run(quadratic, tmp_path, name="n", metric="score",
            scheduler=tune.schedulers.ASHAScheduler(), param_space={"x": 0.1})
    with pytest.raises(ValueError, match="mode must be 'min' or 'max'"):
        tune.TuneConfig(metric="score", mode="maximize")
    grid = run(quadratic, tmp_path, name="o", param_space={"x": 0.2, "steps": 1})
    with pytest.raises(ValueError, match="No mode is provided"):
        grid.get_best_result(metric="score")
    with pytest.raises(RuntimeError, match="No best trial found"):
        grid.get_best_result(metric="nope", mode="max")
    with pytest.raises(RuntimeError, match="inside a trial"):
        tune.report({"x": 1})
    with pytest.raises(TypeError, match="trainable"):
        tune.Tuner(42)
    with pytest.raises(ValueError, match="num_samples"):
        tune.TuneConfig(num_samples=0)


def test_tune_needs_a_cluster(tmp_path):
    with pytest.raises(tray.exceptions.NotInitializedError, match="tray.init"):
        run(quadratic, tmp_path, param_space={"x": 0.1})


class Alternate(tune.search.Searcher):
    """A user's searcher: x = 0, 1, 2, ... and it watches what ends."""

    def __init__(self):
        super().__init__(metric="end", mode="max")
        self.count, self.completed = 0, []

    def suggest(self, trial_id):
        if self.count >= 6:
            return tune.search.Searcher.FINISHED
        self.count += 1
        return {"x": self.count / 10}

    def on_trial_complete(self, trial_id, result=None, error=False):
        self.completed.append(result["end"])


def test_custom_searcher_with_concurrency_limiter(sim, tmp_path):
    limited = tune.search.ConcurrencyLimiter(Alternate(), max_concurrent=2)
    grid = run(timed, tmp_path, search_alg=limited, num_samples=10)
    assert len(grid) == 6  # the searcher said FINISHED after six
    assert sorted(r.config["x"] for r in grid) == [0.1, 0.2, 0.3, 0.4, 0.5, 0.6]
    spans = [(r.metrics["start"], r.metrics["end"]) for r in grid]
    assert max(sum(1 for s, e in spans if s <= t < e) for t, _ in spans) == 2  # 4 CPUs free


def test_optuna_search_is_seeded_and_replays(tmp_path):
    pytest.importorskip("optuna")
    from tray.tune.search.optuna import OptunaSearch

    def once(tag):
        tray.init(backend="sim", seed=5, num_cpus=2)
        try:
            grid = run(quadratic, tmp_path, name=tag, metric="score", mode="max",
                       num_samples=8, search_alg=OptunaSearch(seed=7),
                       param_space={"x": tune.uniform(0, 1), "steps": 2})
            return [round(r.config["x"], 12) for r in grid], grid.get_best_result().config
        finally:
            tray.shutdown()

    first, again = once("a"), once("b")
    assert first == again and len(first[0]) == 8
    with pytest.raises(ValueError, match="grid search"):
        OptunaSearch(metric="score", mode="max").set_search_properties(
            None, None, {"x": tune.grid_search([1, 2])})


def pbt_trainable(config):
    checkpoint = tune.get_checkpoint()
    step, value = 0, 0.0
    if checkpoint is not None:
        with open(os.path.join(checkpoint.path, "s.json")) as file:
            step, value = json.load(file)
    while step < 20:
        time.sleep(0.1)
        step += 1
        value += config["lr"]
        directory = os.path.join(tune.get_context().get_trial_dir(), "staging")
        os.makedirs(directory, exist_ok=True)
        with open(os.path.join(directory, "s.json"), "w") as file:
            json.dump([step, value], file)
        tune.report({"value": value}, checkpoint=tune.Checkpoint.from_directory(directory))


def test_pbt_exploits_and_explores(sim, tmp_path):
    pbt = tune.schedulers.PopulationBasedTraining(
        time_attr="training_iteration", perturbation_interval=4,
        hyperparam_mutations={"lr": [0.1, 0.5, 1.0, 2.0]})
    grid = run(pbt_trainable, tmp_path, metric="value", mode="max", num_samples=1,
               scheduler=pbt, param_space={"lr": tune.grid_search([0.1, 0.2, 0.4, 0.8])})
    assert grid.num_errors == 0 and grid.num_terminated == 4
    policies = [f for f in os.listdir(grid.experiment_path) if f.startswith("pbt_policy_")]
    assert policies  # some trial exploited another
    # The trial that started with the worst lr copied better weights: it ends
    # above what its own lr alone gives (0.1 * 20 steps).
    [slowest] = [r for r in grid if r.trial_id.endswith("_00000")]
    assert slowest.metrics["value"] > 0.1 * 20 + 1e-9
    assert grid.get_best_result().metrics["value"] >= 0.8 * 20 - 1e-9


def test_hyperband_and_median_stopping_account_for_every_trial(sim, tmp_path):
    grid = run(Counter, tmp_path, name="hb", metric="value", mode="max", num_samples=9,
               param_space={"start": tune.randint(0, 100), "steps": 9},
               checkpoint_config=tune.CheckpointConfig(checkpoint_frequency=1),
               scheduler=tune.schedulers.HyperBandScheduler(max_t=9, reduction_factor=3))
    assert len(grid) == 9 and grid.num_terminated == 9
    iterations = sorted(r.metrics["training_iteration"] for r in grid)
    assert iterations[-1] == 9 and iterations[0] < 9
    best = grid.get_best_result()
    assert best.config["start"] == max(r.config["start"] for r in grid)

    grid = run(quadratic, tmp_path, name="median", metric="score", mode="max", num_samples=8,
               param_space={"x": tune.uniform(0, 1), "steps": 10},
               scheduler=tune.schedulers.MedianStoppingRule(
                   time_attr="training_iteration", grace_period=2, min_samples_required=2))
    assert grid.num_terminated == 8
    assert any(r.metrics["training_iteration"] < 10 for r in grid)


def test_stop_criteria_time_budget_and_reuse(sim, tmp_path):
    grid = run(quadratic, tmp_path, name="stop", num_samples=2, stop={"step": 2},
               param_space={"x": 0.3, "steps": 10})
    assert [r.metrics["training_iteration"] for r in grid] == [2, 2]
    grid = run(quadratic, tmp_path, name="budget", num_samples=-1, time_budget_s=3.0,
               param_space={"x": tune.uniform(0, 1), "steps": 5})
    assert 4 <= grid.num_terminated <= len(grid) < 100  # sampled until the budget ran out
    grid = run(Counter, tmp_path, name="reuse", num_samples=4, reuse_actors=True,
               max_concurrent_trials=1, param_space={"start": 0, "steps": 2})
    assert [r.metrics["value"] for r in grid] == [2, 2, 2, 2]


def test_progress_table_is_printed(sim, tmp_path, capsys):
    run(quadratic, tmp_path, metric="score", mode="max", num_samples=2, verbose=1,
        param_space={"x": tune.uniform(0, 1), "steps": 2})
    out = capsys.readouterr().out
    assert "== Status (done) ==" in out
    assert "Trial name" in out and "TERMINATED" in out and "score" in out


def test_checkpoint_retention_by_score(sim, tmp_path):
    grid = run(checkpointed, tmp_path, num_samples=1,
               param_space={"x": -1.0, "steps": 6, "marker_dir": str(tmp_path)},
               checkpoint_config=tune.CheckpointConfig(
                   num_to_keep=2, checkpoint_score_attribute="total",
                   checkpoint_score_order="max"))
    [result] = grid
    kept = [c for c, _ in result.best_checkpoints]
    # Totals fall every step: the best (first) and the latest survive.
    assert [os.path.basename(c.path) for c in kept] == ["checkpoint_000000", "checkpoint_000005"]


# ================================================================ driver death

def ledgered(config):
    """Appends its index to the ledger when it starts; the ``kill_at`` trial
    kills the whole driver process (once), at once: the trial before it ended
    0.1 s earlier, well within the controller's snapshot period (it was run
    again by the restore when only the period saved the state, issue 43)."""
    with open(config["ledger"], "a") as file:
        file.write(f"{config['i']}\n")
    time.sleep(0.1)
    if config["i"] == config["kill_at"] and not os.path.exists(config["ledger"] + ".killed"):
        open(config["ledger"] + ".killed", "w").close()
        import signal

        os.kill(config["driver_pid"], signal.SIGKILL)
        time.sleep(60)
    tune.report({"score": config["i"]})


DRIVER_SCRIPT = """
import os, sys
sys.path.insert(0, {tests!r})
import tray
from tray import tune
import {module} as module
tray.init({init})
tune.Tuner(module.ledgered, param_space={{"i": tune.grid_search(list(range(5))), "kill_at": 3,
                                         "ledger": {ledger!r}, "driver_pid": os.getpid()}},
           tune_config=tune.TuneConfig(max_concurrent_trials=1),
           run_config=tune.RunConfig(name="killed", storage_path={storage!r}, verbose=0)).fit()
print("fit returned: the driver was not killed")
"""


def run_killed_driver(tmp_path, init: str, module: str) -> str:
    """Start an experiment in a child process whose trial 3 SIGKILLs it."""
    import subprocess
    import sys

    ledger = str(tmp_path / "ledger.txt")
    script = tmp_path / "driver.py"
    script.write_text(DRIVER_SCRIPT.format(
        tests=os.path.dirname(__file__), module=module, init=init, ledger=ledger,
        storage=str(tmp_path)))
    # Output to a file, not a pipe: the killed driver's cluster may hold a pipe open
    # for a moment after the driver itself is gone.
    with open(tmp_path / "driver.log", "w") as log:
        returncode = subprocess.run([sys.executable, str(script)], stdout=log,
                                    stderr=subprocess.STDOUT, timeout=120).returncode
    assert returncode == -9, (tmp_path / "driver.log").read_text()
    assert os.path.exists(ledger + ".killed")
    return ledger


def check_restored(tmp_path, ledger: str) -> None:
    started_before = open(ledger).read().split()
    assert started_before == ["0", "1", "2", "3"]
    path = str(tmp_path / "killed")
    assert tune.Tuner.can_restore(path)
    grid = tune.Tuner.restore(path, trainable=ledgered).fit()
    assert sorted(r.config["i"] for r in grid) == [0, 1, 2, 3, 4]
    assert grid.num_terminated == 5
    assert sorted(r.metrics["score"] for r in grid) == [0, 1, 2, 3, 4]
    # Finished trials were not run again; the one killed mid-run was, and 4 ran once.
    assert open(ledger).read().split() == ["0", "1", "2", "3", "3", "4"]


def test_restore_after_the_driver_died_sim(tmp_path):
    ledger = run_killed_driver(tmp_path, "backend='sim', seed=1, num_cpus=2", "test_tune")
    tray.init(backend="sim", seed=2, num_cpus=2)
    check_restored(tmp_path, ledger)


def gpu_trial(config):
    start = time.time()
    time.sleep(1.0)
    tune.report({"start": start, "end": time.time(), "gpus": len(tray.get_gpu_ids())})


def test_fractional_gpus_and_custom_resources(tmp_path):
    tray.init(backend="sim", seed=0, num_cpus=8, num_gpus=1, resources={"disk": 3})
    grid = run(tune.with_resources(gpu_trial, {"cpu": 1, "gpu": 0.5}), tmp_path, name="gpu",
               num_samples=4)
    spans = [(r.metrics["start"], r.metrics["end"]) for r in grid]
    assert max(sum(1 for s, e in spans if s <= t < e) for t, _ in spans) == 2
    assert all(r.metrics["gpus"] == 1 for r in grid)
    grid = run(tune.with_resources(gpu_trial, lambda config: {"cpu": 1, "disk": config["d"]}),
               tmp_path, name="disk", param_space={"d": tune.grid_search([1, 2, 1, 2])})
    assert grid.num_terminated == 4


def test_checkpoint_directories(tmp_path):
    source = tmp_path / "src"
    source.mkdir()
    (source / "weights.txt").write_text("42")
    checkpoint = tune.Checkpoint.from_directory(source)
    checkpoint.set_metadata({"epoch": 3})
    checkpoint.update_metadata({"loss": 0.5})
    assert checkpoint.get_metadata() == {"epoch": 3, "loss": 0.5}
    copy = checkpoint.to_directory(str(tmp_path / "copy"))
    assert open(os.path.join(copy, "weights.txt")).read() == "42"
    with checkpoint.as_directory() as path:
        assert os.path.exists(os.path.join(path, "weights.txt"))
    with pytest.raises(ValueError, match="not a directory"):
        tune.Checkpoint.from_directory(tmp_path / "missing")


def reports_then_fails(config):
    """Reports its score once, then raises; a retry raises at once."""
    marker = os.path.join(config["marker_dir"], tune.get_context().get_trial_id())
    if not os.path.exists(marker):
        open(marker, "w").close()
        tune.report({"score": config["score"]})
    raise RuntimeError("planned failure")


def test_a_retried_trial_drops_its_lost_attempts_metrics_with_its_results(sim, tmp_path):
    # Tune default seed 291: a trial's attempt reported a score and died; the
    # retry, from scratch, dropped that line from result.json but the trial
    # kept the score as its metrics, so get_best_result() chose a trial whose
    # stored history held no such result.
    grid = run(reports_then_fails, tmp_path, param_space={
        "score": tune.grid_search([5.0, 1.0]), "marker_dir": str(tmp_path)},
        failure_config=tune.FailureConfig(max_failures=1), metric="score", mode="max")
    assert [r.status for r in grid] == ["ERROR", "ERROR"]
    for result in grid:
        assert result.metrics_dataframe is None or result.metrics_dataframe.empty
        assert "score" not in result.metrics


def test_restore_resumes_or_restarts_errored_trials(sim, tmp_path):
    space = {"x": 1.0, "steps": 4, "fail_at": 3, "marker_dir": str(tmp_path)}
    grid = run(checkpointed, tmp_path, name="err", param_space=space)
    assert [r.status for r in grid] == ["ERROR"]
    path = grid.experiment_path
    again = tune.Tuner.restore(path, trainable=checkpointed).fit()
    assert [r.status for r in again] == ["ERROR"]  # errored trials stay, by default
    resumed = tune.Tuner.restore(path, trainable=checkpointed, resume_errored=True).fit()
    [result] = resumed
    assert result.status == "TERMINATED" and result.metrics["total"] == 4.0
    assert [row["training_iteration"] for row in history(result)] == [1, 2, 3, 4]
    os.makedirs(tmp_path / "m3")
    grid = run(checkpointed, tmp_path, name="err4",
               param_space=dict(space, marker_dir=str(tmp_path / "m3")))
    assert [r.status for r in grid] == ["ERROR"]
    restarted = tune.Tuner.restore(grid.experiment_path, trainable=checkpointed,
                                   restart_errored=True).fit()
    [result] = restarted
    assert result.status == "TERMINATED" and result.metrics["total"] == 4.0
    # From scratch: the lost attempt's lines and checkpoints were dropped, not resumed.
    assert [row["training_iteration"] for row in history(result)] == [1, 2, 3, 4]
    assert result._trial.num_failures == 0
    with pytest.raises(ValueError, match="no tray.tune experiment to restore"):
        tune.Tuner.restore(str(tmp_path / "nowhere"), trainable=checkpointed)


# ================================================================ the state machine


def test_controller_state_machine_without_a_cluster(tmp_path):
    """The controller is plain logic fed by events: no cluster needed."""
    from tray.tune._controller import ExperimentSpec, TuneController
    from tray.tune.trainable import as_spec

    spec = ExperimentSpec(
        name="unit", experiment_path=str(tmp_path / "unit"), trainable_name="quadratic",
        param_space={"x": tune.grid_search([0.1, 0.2, 0.9])}, metric="score", mode="max",
        num_samples=1, search=BasicVariantGenerator(), scheduler=tune.schedulers.ASHAScheduler(
            max_t=4, grace_period=1, reduction_factor=2),
        stopper=None, checkpoint_config=tune.CheckpointConfig(),
        failure_config=tune.FailureConfig(max_failures=1), max_concurrent_trials=None,
        time_budget_s=None, reuse_actors=False, seed=0, strict_metrics=("score",))
    controller = TuneController(spec, as_spec(quadratic))
    controller._nodes = lambda: [{"Resources": {"CPU": 2.0}, "Alive": True}]
    status = controller.start()
    assert status["demand"]["num_cpus=1"]["count"] == 2  # two fit on the node
    shape = "num_cpus=1"
    a, b = controller.next_work(0, shape), controller.next_work(1, shape)
    assert (a.config["x"], b.config["x"]) == (0.1, 0.2)
    assert controller.next_work(2, shape).config["x"] == 0.9  # a third runner would get 0.9
    result = {"score": 0.9, "training_iteration": 1}
    assert controller.report(a.trial_id, a.attempt, [(dict(result), None)]) == \
        ("continue", False, 0)  # the next result (iteration 2) meets a rung: wait for it
    low = dict(result, score=0.1)
    assert controller.report(b.trial_id, b.attempt, [(low, None)]) == ("stop", False)  # below cutoff
    assert controller.get_trial(b.trial_id).status == "TERMINATED"
    # The runner of trial a dies: retried within max_failures, from scratch (no checkpoint).
    controller.runner_lost(0, "node died")
    trial = controller.get_trial(a.trial_id)
    assert trial.status == "PENDING" and trial.num_failures == 1
    assert controller.report(a.trial_id, a.attempt, [(dict(result), None)]) == ("stop", False)  # stale
    assert controller.next_work(0, shape) == "finished"  # a lost runner gets no trial
    again = controller.next_work(3, shape)  # (the driver never reuses a runner id)
    assert again.trial_id == a.trial_id and again.attempt == a.attempt + 1
    with pytest.raises(KeyError):
        controller.get_trial("nope")


def test_controller_gives_no_trial_to_a_runner_it_was_told_is_gone(tmp_path):
    """Chaos seed 89 of the tune workload hung: a runner's next_work call was on
    the way when its node crashed; the driver's runner_lost reached the
    controller first, then the late next_work handed a trial to the dead
    runner, and the trial stayed RUNNING forever. Now a lost runner's calls get
    "finished", and a poll fails any RUNNING trial whose runner the driver no
    longer holds (one that left without a runner_lost, too)."""
    from tray.tune._controller import ExperimentSpec, TuneController
    from tray.tune.trainable import as_spec

    spec = ExperimentSpec(
        name="gone", experiment_path=str(tmp_path / "gone"), trainable_name="quadratic",
        param_space={"x": tune.grid_search([0.1, 0.2])}, metric="score", mode="max",
        num_samples=1, search=BasicVariantGenerator(), scheduler=tune.schedulers.FIFOScheduler(),
        stopper=None, checkpoint_config=tune.CheckpointConfig(),
        failure_config=tune.FailureConfig(max_failures=3), max_concurrent_trials=None,
        time_budget_s=None, reuse_actors=False, seed=0, strict_metrics=("score",))
    controller = TuneController(spec, as_spec(quadratic))
    controller._nodes = lambda: [{"Resources": {"CPU": 2.0}, "Alive": True}]
    controller.start()
    shape = "num_cpus=1"
    controller.poll({0: shape, 1: shape})
    controller.runner_lost(0, "node died")  # before runner 0's next_work arrives
    assert controller.next_work(0, shape) == "finished"
    assert {t.status for t in controller.get_trials()} == {"PENDING"}
    a = controller.next_work(1, shape)
    # Runner 1 leaves without a runner_lost (its serve returned): the next census
    # lacks it, so its trial fails (and is retried); a late call of its gets nothing.
    controller.poll({2: shape})
    trial = controller.get_trial(a.trial_id)
    assert trial.status == "PENDING" and trial.num_failures == 1 and trial.runner_id is None
    assert controller.next_work(1, shape) == "finished"
    assert controller.trial_ended(1, a.trial_id, a.attempt, {"kind": "returned"},
                                  shape) == "finished"
    assert trial.status == "PENDING"  # the lost attempt's end changes nothing
    again = controller.next_work(2, shape)
    assert again.trial_id == a.trial_id and again.attempt == a.attempt + 1
    status = controller.poll({2: shape})  # its runner is in the census: it keeps running
    assert trial.status == "RUNNING" and trial.runner_id == 2 and not status["done"]


def test_reports_that_need_no_answer_are_sent_without_waiting():
    """ASHA decides at rungs only: the results in between go without a round trip."""
    from tray.tune.experiment import Trial

    asha = tune.schedulers.ASHAScheduler(metric="m", mode="max", max_t=16, grace_period=2,
                                         reduction_factor=2)
    trial = Trial("t", 0, {}, {}, "0", "d", {"num_cpus": 1})
    asha.on_trial_add(None, trial)
    assert [asha.results_ahead(trial, {"training_iteration": i}) for i in (1, 2, 5, 8, 15)] == \
        [0, 1, 2, 7, 0]  # next rungs: 2, 4, 8, 16 (max_t), 16
    assert tune.schedulers.FIFOScheduler().results_ahead(trial, {}) > 1000
    median = tune.schedulers.MedianStoppingRule(metric="m", mode="max")
    assert median.results_ahead(trial, {}) == 0  # decides at any result
