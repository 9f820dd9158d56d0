"""The tray.tune workload: an ASHA experiment under the seed's faults.

The trainable's score is ``quality(config) * iteration``, accumulated from
its checkpoint (so a trial restored from the wrong checkpoint reports a
wrong score), and the config with the best quality is the best at every
rung: ASHA never stops it, whatever order results arrive in. That makes a
reference model possible without running the experiment twice:

* every sampled trial is accounted for: TERMINATED (at ``max_t``, or
  stopped early at a rung), or ERROR only after more than ``max_failures``
  failures;
* every reported score equals the model's, and a trial's ``result.json``
  holds iterations 1..n exactly once each (retries drop what the lost
  attempt wrote past its checkpoint);
* when no trial errored, the best result is the best-quality config with
  the score ``quality * max_t`` — what the fault-free run of the same seed
  finds too (its configs come from the same seeded generator).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
import time

from tray import tune


def _quality(config: dict) -> float:
    return round(config["x"] * (1 + config["width"] / 10), 9)


def tune_objective(config: dict) -> None:
    """ASHA's trainable: one virtual sleep and one report per iteration,
    checkpointing its running total every iteration."""
    quality = _quality(config)
    t, total = 0, 0.0
    checkpoint = tune.get_checkpoint()
    if checkpoint is not None:
        with open(os.path.join(checkpoint.path, "state.json"), encoding="utf-8") as file:
            state = json.load(file)
        t, total = state["t"], state["total"]
    while True:
        time.sleep(config["step_s"])
        t += 1
        total = round(total + quality, 9)
        with tempfile.TemporaryDirectory() as directory:
            with open(os.path.join(directory, "state.json"), "w", encoding="utf-8") as file:
                json.dump({"t": t, "total": total}, file)
            tune.report({"score": total}, checkpoint=tune.Checkpoint.from_directory(directory))


# A score is a sum of 9-digit roundings, the model's a product: they agree to
# ~1e-8 (rounding both to 6 digits can still differ, at a half: chaos seed 126).
# A restore from the wrong checkpoint is off by a whole quality (>= 0.1).
SCORE_TOLERANCE = 1e-6


def _violation(invariant: str, message: str):
    from .invariants import InvariantViolation

    return InvariantViolation(invariant, message)


def tune_asha(program) -> None:
    rng = program.rng
    num_samples = rng.randint(5, 10)
    max_t = rng.choice([4, 6, 8])
    max_failures = 3
    param_space = {"x": tune.uniform(0.1, 1.0), "width": tune.choice([1, 2, 4]),
                   "step_s": rng.choice([0.05, 0.08, 0.12])}
    storage = tempfile.mkdtemp(prefix="tray-simtest-tune-")
    try:
        tuner = tune.Tuner(
            tune_objective, param_space=param_space,
            tune_config=tune.TuneConfig(
                metric="score", mode="max", num_samples=num_samples,
                search_alg=tune.search.BasicVariantGenerator(random_state=rng.randint(0, 9999)),
                scheduler=tune.schedulers.ASHAScheduler(max_t=max_t, grace_period=1,
                                                        reduction_factor=2)),
            run_config=tune.RunConfig(
                name="asha", storage_path=storage, verbose=0,
                failure_config=tune.FailureConfig(max_failures=max_failures),
                checkpoint_config=tune.CheckpointConfig(num_to_keep=2)))
        grid = tuner.fit()
        _check(grid, num_samples, max_t, max_failures)
    finally:
        shutil.rmtree(storage, ignore_errors=True)


def _check(grid, num_samples: int, max_t: int, max_failures: int) -> None:
    from tray.tune.result_grid import read_results

    if len(grid) != num_samples:
        raise _violation("tune-every-trial-accounted-for",
                         f"{num_samples} samples, {len(grid)} trials in the result grid")
    rungs = {1, 2, 4, 8}
    errored = []
    for result in grid:
        trial = result._trial
        where = f"trial {result.trial_id} ({trial.num_failures} failures)"
        if result.status == "ERROR":
            if trial.num_failures <= max_failures:
                raise _violation("tune-every-trial-accounted-for",
                                 f"{where} is ERROR within max_failures={max_failures}:\n"
                                 f"{trial.error}")
            errored.append(result)
            continue
        if result.status != "TERMINATED":
            raise _violation("tune-every-trial-accounted-for",
                             f"{where} ended {result.status}, neither TERMINATED nor ERROR")
        quality = _quality(result.config)
        iteration = result.metrics.get("training_iteration")
        if iteration is None or not 1 <= iteration <= max_t:
            raise _violation("tune-trial-iterations",
                             f"{where} ended at iteration {iteration}; max_t is {max_t}")
        if iteration < max_t and iteration not in rungs:
            raise _violation("tune-asha-stops-at-rungs",
                             f"{where} stopped at iteration {iteration}, not at a rung")
        history = read_results(result.path)
        iterations = [row["training_iteration"] for row in history]
        if iterations != list(range(1, iteration + 1)):
            raise _violation("tune-result-history",
                             f"{where}: result.json holds iterations {iterations}, expected "
                             f"1..{iteration} once each")
        for row in history:
            expected = quality * row["training_iteration"]
            if not math.isclose(row["score"], expected, rel_tol=0, abs_tol=SCORE_TOLERANCE):
                raise _violation("tune-scores-match-model",
                                 f"{where}: iteration {row['training_iteration']} scored "
                                 f"{row['score']}, the model says {expected:.9g} (a restore from "
                                 f"the wrong checkpoint?)")
    if errored:
        return
    best = grid.get_best_result()
    qualities = sorted(((_quality(r.config), r.trial_id) for r in grid), reverse=True)
    best_quality, best_id = qualities[0]
    if best.trial_id != best_id or not math.isclose(
            best.metrics["score"], best_quality * max_t, rel_tol=0, abs_tol=SCORE_TOLERANCE):
        raise _violation("tune-same-best-as-fault-free",
                         f"best trial {best.trial_id} (score {best.metrics.get('score')}); the "
                         f"model's best is {best_id} with {best_quality * max_t}")


WORKLOADS = {"tune": tune_asha}
