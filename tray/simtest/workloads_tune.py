"""The tray.tune workload: an experiment under the seed's faults, its
trial histories checked against a model of the scheduler's decisions.

Each seed picks a scheduler (ASHA most often, FIFO with a stopping
criterion, the median stopping rule with or without ``hard_stop``, PBT,
synchronous HyperBand), the searcher (the default generator, or one of
the workload's own, maybe under a ``ConcurrencyLimiter``), trials that
fail once or at every run,
a search space (``width`` sampled, or a grid over it: the trials are
``num_samples`` x the grid), ``max_concurrent_trials`` and
``FailureConfig.max_failures``; and (an RNG of its own) a function
trainable or a class one (``TuneClassObjective``: ``checkpoint_frequency``
1 to 3, ``checkpoint_at_end``, ``reuse_actors``, its state as a dict or a
file; it saves when the controller asks, at a pause or for a PBT donor,
and its ``done`` ends the trial whatever the scheduler answers). The trainable's score is ``quality(config)
* iteration``, accumulated from its checkpoint, and every result says
where its run resumed from (``restored_t``, ``restored_total``) and the
quality it ran with. The scheduler is the public one with a recorder mixed
in (``model_tune``): the controller's every call to it, in order, with its
answers. Reference models and invariants:

* ``tune-trials-match-search-space``: ``num_samples`` x grid trials, each
  grid value ``num_samples`` times, sampled values in their domain and
  distinct, each trial run with the config it was created with (PBT's
  exploits aside);
* ``tune-every-trial-accounted-for``: TERMINATED, or ERROR only after more
  than ``max_failures`` failures (exactly ``max_failures + 1``);
* ``tune-scheduler-decisions-match-model``: the scheduler's every answer
  equals its model's on the same sequence of results (ASHA's rungs and
  quantile, the median stopping rule, FIFO);
* ``tune-stopped-trials-stay-stopped``, ``tune-trials-end-when-told``: a
  STOP ends the trial at that result; a trial ends before ``max_t`` only
  when told to;
* ``tune-resumes-from-latest-checkpoint``: every new run of a trial (after
  a failure, a pause, a controller restart) resumes from the latest
  checkpoint the controller registered as of its last result (the function
  trainable checkpoints every result; a class one every
  ``checkpoint_frequency``, or on request: then from that last result);
  after a PBT exploit, from a checkpoint some trial reported;
* ``tune-scores-match-model``: every score follows from where its run
  resumed; ``tune-result-history``: a trial's ``result.json`` holds
  iterations 1..n once each, ending at the controller's last result;
* ``tune-max-concurrent-trials``: never more trials RUNNING at once;
* ``tune-best-result``: ``get_best_result()`` is the trial whose last
  result (in its ``result.json``) scores best; with ASHA or FIFO and no
  error, the best-quality config at ``quality * max_t`` (ASHA never stops
  the best at any rung).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
import time

from tray import tune
from tray.tune.search import ConcurrencyLimiter, Searcher


def _quality(config: dict) -> float:
    return round(config["x"] * (1 + config["width"] / 10), 9)


TABLE = list(range(50))  # what ``with_parameters`` hands the trainable, in some seeds


def _check_table(config: dict, table) -> None:
    if (table is not None or config.get("table_given")) and table != TABLE:
        raise ValueError(f"with_parameters delivered {str(table)[:80]}, not the table put")


def tune_objective(config: dict, table=None) -> None:
    """One virtual sleep and one report per iteration up to ``max_t``,
    checkpointing its running total every iteration; each result says
    where the run resumed from and the quality it runs with."""
    _check_table(config, table)
    quality = _quality(config)
    t, total = 0, 0.0
    checkpoint = tune.get_checkpoint()
    if checkpoint is not None:
        with open(os.path.join(checkpoint.path, "state.json"), encoding="utf-8") as file:
            state = json.load(file)
        t, total = state["t"], state["total"]
    restored_t, restored_total = t, total
    fail = config.get("fail", "never")
    while t < config["max_t"]:
        time.sleep(config["step_s"])
        t += 1
        if (fail == "always" and t == 1) or (fail == "once" and t == 2 and restored_t == 0):
            raise RuntimeError(f"the trainable fails ({fail}) at iteration {t}")
        total = round(total + quality, 9)
        with tempfile.TemporaryDirectory() as directory:
            with open(os.path.join(directory, "state.json"), "w", encoding="utf-8") as file:
                json.dump({"t": t, "total": total}, file)
            tune.report({"score": total, "restored_t": restored_t,
                         "restored_total": restored_total, "quality": quality},
                        checkpoint=tune.Checkpoint.from_directory(directory))


class TuneClassObjective(tune.Trainable):
    """``tune_objective`` as a class trainable: one ``step`` per iteration,
    checkpoints by ``save_checkpoint`` (a dict, or a file it writes, by the
    config's ``state_as``) when the controller asks (``checkpoint_frequency``,
    a pause, a PBT donor, ``checkpoint_at_end``); ``reset_config`` takes a new
    trial in place (``reuse_actors``). A run "failing once" fails at
    iteration ``fail_at`` of a run from scratch (the first checkpoint is
    taken before it)."""

    def setup(self, config: dict, table=None) -> None:
        _check_table(config, table)
        self._begin(config)

    def _begin(self, config: dict) -> None:
        self.quality = _quality(config)
        self.t, self.total = 0, 0.0
        self.restored_t, self.restored_total = 0, 0.0

    def reset_config(self, new_config: dict) -> bool:
        self._begin(new_config)
        return True

    def step(self) -> dict:
        config = self.config
        time.sleep(config["step_s"])
        self.t += 1
        fail = config.get("fail", "never")
        if (fail == "always" and self.t == 1) or (
                fail == "once" and self.t == config.get("fail_at", 2) and self.restored_t == 0):
            raise RuntimeError(f"the trainable fails ({fail}) at iteration {self.t}")
        self.total = round(self.total + self.quality, 9)
        return {"score": self.total, "restored_t": self.restored_t,
                "restored_total": self.restored_total, "quality": self.quality,
                "done": self.t >= config["max_t"]}

    def save_checkpoint(self, checkpoint_dir: str):
        state = {"t": self.t, "total": self.total}
        if self.config.get("state_as") == "file":
            with open(os.path.join(checkpoint_dir, "state.json"), "w", encoding="utf-8") as file:
                json.dump(state, file)
            return None
        return state

    def load_checkpoint(self, checkpoint) -> None:
        if isinstance(checkpoint, str):
            with open(os.path.join(checkpoint, "state.json"), encoding="utf-8") as file:
                checkpoint = json.load(file)
        self.t, self.total = checkpoint["t"], checkpoint["total"]
        self.restored_t, self.restored_total = self.t, self.total


# A score is a sum of 9-digit roundings, the model's a product: they agree to
# ~1e-8 (rounding both to 6 digits can still differ, at a half: chaos seed 126).
# A restore from the wrong checkpoint is off by a whole quality (>= 0.1).
SCORE_TOLERANCE = 1e-6


def _violation(invariant: str, message: str):
    from .invariants import InvariantViolation

    return InvariantViolation(invariant, message)


class SimtestSearcher(Searcher):
    """A searcher of its own (seeded draws), recording what it is told: the
    controller must tell it of every result and of every trial's end, once."""

    def __init__(self, seed: int, widths: list, fixed: dict, fails: list) -> None:
        super().__init__()
        import random

        self.rng = random.Random(seed)
        self.widths, self.fixed, self.fails = widths, fixed, fails
        self.suggested: list = []
        self.completed: dict = {}  # trial id -> times told it ended
        self.results: dict = {}  # trial id -> results seen

    def suggest(self, trial_id: str) -> dict:
        config = {"x": self.rng.uniform(0.1, 1.0), "width": self.rng.choice(self.widths),
                  "fail": self.rng.choice(self.fails), **self.fixed}
        self.suggested.append(trial_id)
        return config

    def on_trial_result(self, trial_id: str, result: dict) -> None:
        self.results[trial_id] = self.results.get(trial_id, 0) + 1

    def on_trial_complete(self, trial_id: str, result=None, error: bool = False) -> None:
        self.completed[trial_id] = self.completed.get(trial_id, 0) + 1


class ScoreStopper(tune.Stopper):
    """A stopping rule of the user's: a trial stops at its first result
    scoring ``threshold`` or more (or at ``max_iter``)."""

    def __init__(self, threshold: float, max_iter: int | None = None) -> None:
        self.threshold, self.max_iter = threshold, max_iter

    def __repr__(self) -> str:
        return f"ScoreStopper({self.threshold}, max_iter={self.max_iter})"

    def __call__(self, trial_id: str, result: dict) -> bool:
        return result.get("score", 0.0) >= self.threshold or (
            self.max_iter is not None and result.get("training_iteration", 0) >= self.max_iter)


def _scheduler(kind: str, max_t: int, extra, asha):
    from . import model_tune

    if kind == "asha":
        # (With rf 2, the quantile 1 - 1/rf is 1/rf: rf 3 and 4 tell them
        # apart. An RNG of their own: the other draws stay as they were.)
        grace, rf = asha.choice([1, 1, 2]), asha.choice([2, 3, 4])
        return (model_tune.RecordingASHA(max_t=max_t, grace_period=grace, reduction_factor=rf),
                model_tune.AshaModel(max_t, grace, rf))
    if kind == "fifo":
        return model_tune.RecordingFIFO(), model_tune.FifoModel()
    if kind == "median":
        grace, samples = extra.choice([1, 2]), extra.choice([1, 2, 3])
        hard_stop = extra.random() < 0.5
        return (model_tune.RecordingMedian(time_attr="training_iteration", grace_period=grace,
                                           min_samples_required=samples, hard_stop=hard_stop),
                model_tune.MedianModel(grace, samples, hard_stop))
    if kind == "hyperband":  # (no model of its brackets: the histories' checks hold)
        return (model_tune.RecordingHyperBand(time_attr="training_iteration", max_t=max_t,
                                              reduction_factor=2), None)
    return (model_tune.RecordingPBT(time_attr="training_iteration", perturbation_interval=2,
                                    hyperparam_mutations={"x": tune.uniform(0.1, 1.0)},
                                    quantile_fraction=extra.choice([0.25, 0.5])), None)


def tune_experiment(program) -> None:
    import random

    import tray.simtest

    rng = program.rng
    num_samples = rng.randint(5, 10)
    max_t = rng.choice([4, 6, 8])
    step_s = rng.choice([0.05, 0.08, 0.12])
    random_state = rng.randint(0, 9999)
    # The draws added later come from an RNG of their own: the original
    # ones (and the seeds pinned by them) stay as they were.
    extra = random.Random(f"{tray.simtest.cluster().seed}:tune-variations")
    asha = random.Random(f"{tray.simtest.cluster().seed}:tune-asha")
    kind = extra.choice(["asha", "asha", "asha", "fifo", "median", "pbt"])
    grid = extra.random() < 0.3
    if grid:
        num_samples = max(1, num_samples // 3)
    max_concurrent = extra.choice([None, None, 1, 2, 3])
    max_failures = extra.choice([3, 3, 3, 1])
    scheduler, model = _scheduler(kind, max_t, extra, asha)
    widths = [1, 2, 4]
    # Some trials raise: once (at iteration 2 of a run from scratch) or
    # always (at iteration 1: ERROR after max_failures + 1 failures).
    fails = ["never"] * 4 + ["once", "always"] if extra.random() < 0.35 else ["never"]
    param_space = {"x": tune.uniform(0.1, 1.0),
                   "width": tune.grid_search(widths) if grid else tune.choice(widths),
                   "fail": tune.choice(fails), "step_s": step_s, "max_t": max_t}
    search = tune.search.BasicVariantGenerator(random_state=random_state)
    searcher_limit = None
    if not grid and extra.random() < 0.3:
        search = SimtestSearcher(random_state, widths, {"step_s": step_s, "max_t": max_t},
                                 fails)
        if extra.random() < 0.6:
            searcher_limit = extra.choice([1, 2, 3])
            search = ConcurrencyLimiter(search, max_concurrent=searcher_limit)
    score_attribute = "score" if extra.random() < 0.3 else None
    if extra.random() < 0.15:  # (drawn last: the draws before stay as they were)
        kind = "hyperband"
        scheduler, model = _scheduler(kind, max_t, extra, asha)
    # A class trainable (its own RNG: the draws above stay as they were).
    variant = random.Random(f"{tray.simtest.cluster().seed}:tune-class")
    trainable, frequency, at_end, reuse = tune_objective, 0, None, False
    if variant.random() < 0.4:
        trainable = TuneClassObjective
        frequency = variant.choice([1, 1, 2, 3])
        at_end = variant.random() < 0.5
        reuse = variant.random() < 0.5
        fixed = {"fail_at": frequency + 1, "state_as": variant.choice(["dict", "file"])}
        param_space.update(fixed)
        if isinstance(search, SimtestSearcher):
            search.fixed.update(fixed)
        elif isinstance(search, ConcurrencyLimiter):
            search.searcher.fixed.update(fixed)
    # A stopping criterion on the score (an RNG of its own again).
    stopping = random.Random(f"{tray.simtest.cluster().seed}:tune-stopper")
    stop = {"training_iteration": max_t} if kind == "fifo" else None
    threshold = None
    if stopping.random() < 0.3:
        threshold = round(stopping.uniform(1.0, 4.0), 3)
        if stopping.random() < 0.5:
            stop = {"score": threshold, **(stop or {})}
        else:
            stop = ScoreStopper(threshold, max_t if kind == "fifo" else None)
    # Parameters through the object store, resources per trial (its own RNG).
    shaping = random.Random(f"{tray.simtest.cluster().seed}:tune-resources")
    shape = ""
    if shaping.random() < 0.3:
        trainable = tune.with_parameters(trainable, table=list(TABLE))
        shape += ", with_parameters"
        param_space["table_given"] = True
        if isinstance(search, ConcurrencyLimiter):
            search.searcher.fixed["table_given"] = True
        elif isinstance(search, SimtestSearcher):
            search.fixed["table_given"] = True
    if shaping.random() < 0.3:
        node_cpus = tray.simtest.cluster().node_resources.get("CPU", 1)
        cpus = shaping.choice([0.5, 1, node_cpus])
        trainable = tune.with_resources(trainable, {"cpu": cpus})
        shape += f", {cpus} CPU(s) per trial"
    class_mode = getattr(trainable, "trainable", trainable) is TuneClassObjective
    storage = tempfile.mkdtemp(prefix="tray-simtest-tune-")
    try:
        tuner = tune.Tuner(
            trainable, param_space=param_space,
            tune_config=tune.TuneConfig(
                metric="score", mode="max", num_samples=num_samples,
                max_concurrent_trials=max_concurrent, reuse_actors=reuse,
                search_alg=search, scheduler=scheduler),
            run_config=tune.RunConfig(
                name="exp", storage_path=storage, verbose=0,
                stop=stop,
                failure_config=tune.FailureConfig(max_failures=max_failures),
                checkpoint_config=tune.CheckpointConfig(
                    num_to_keep=2, checkpoint_score_attribute=score_attribute,
                    checkpoint_frequency=frequency, checkpoint_at_end=at_end)))
        controllers = _controllers()
        results = tuner.fit()
        replaced = len(_controllers() - controllers) > 1  # (a controller restarted)
        setting = (f"{kind} scheduler, {num_samples} sample(s){' x grid' if grid else ''}, "
                   f"max_t {max_t}, max_concurrent_trials {max_concurrent}, max_failures "
                   f"{max_failures}, fails {sorted(set(fails))}, "
                   f"{type(search).__name__}{f'({searcher_limit})' if searcher_limit else ''}"
                   + (f", class trainable (checkpoint_frequency {frequency}, checkpoint_at_end "
                      f"{at_end}, reuse_actors {reuse}, state as {param_space['state_as']})"
                      if class_mode else "") + shape
                   + (f", stop {stop}" if threshold is not None else ""))
        try:
            _check_failures(results, kind == "pbt")
            _check(results, num_samples * (len(widths) if grid else 1), max_t, max_failures,
                   kind, threshold, set(model.rungs) if kind == "asha" else ())
            added = _check_decisions(results, os.path.join(storage, "exp"), model, max_t,
                                     max_concurrent, searcher_limit, max_failures,
                                     class_mode, threshold, replaced)
            _check_search_space(results, added, num_samples, widths if grid else None)
            if kind != "pbt":
                _check_checkpoints(results, 2, score_attribute)
        except Exception as error:
            from .invariants import InvariantViolation

            if isinstance(error, InvariantViolation):
                error.message = f"({setting}) {error.message}"
            raise
    finally:
        shutil.rmtree(storage, ignore_errors=True)


def _check(grid, expected_trials: int, max_t: int, max_failures: int, kind: str,
           threshold: float | None, rungs) -> None:
    from tray.tune.result_grid import read_results

    if len(grid) != expected_trials:
        raise _violation("tune-trials-match-search-space",
                         f"{expected_trials} trials expected (num_samples x the grid), "
                         f"{len(grid)} in the result grid")
    errored = []
    last_scores = []  # (last score in result.json, trial id)
    for result in grid:
        trial = result._trial
        where = f"trial {result.trial_id} ({trial.num_failures} failures)"
        history = read_results(result.path)
        if history:
            last_scores.append((history[-1]["score"], result.trial_id))
        if result.status == "ERROR":
            if trial.num_failures != max_failures + 1:
                raise _violation("tune-every-trial-accounted-for",
                                 f"{where} is ERROR with max_failures={max_failures}:\n"
                                 f"{trial.error}")
            errored.append(result)
            continue
        if result.status != "TERMINATED":
            raise _violation("tune-every-trial-accounted-for",
                             f"{where} ended {result.status}, neither TERMINATED nor ERROR")
        if trial.num_failures > max_failures:
            raise _violation("tune-every-trial-accounted-for",
                             f"{where} is TERMINATED after more than max_failures="
                             f"{max_failures} failures")
        iteration = result.metrics.get("training_iteration")
        if iteration is None or not 1 <= iteration <= max_t:
            raise _violation("tune-trial-iterations",
                             f"{where} ended at iteration {iteration}; max_t is {max_t}")
        met = threshold is not None and result.metrics.get("score", 0.0) >= threshold
        if kind == "asha" and iteration < max_t and iteration not in rungs and not met:
            raise _violation("tune-asha-stops-at-rungs",
                             f"{where} stopped at iteration {iteration}, not at a rung")
        if kind == "fifo" and iteration != max_t and not met:
            raise _violation("tune-trials-end-when-told",
                             f"{where} ended at iteration {iteration}; FIFO runs every trial "
                             f"to max_t {max_t}")
        iterations = [row["training_iteration"] for row in history]
        # (After a PBT exploit the history goes on from the donor's iteration.)
        if kind != "pbt" and iterations != list(range(1, iteration + 1)):
            raise _violation("tune-result-history",
                             f"{where}: result.json holds iterations {iterations}, expected "
                             f"1..{iteration} once each")
        if kind == "pbt":
            continue  # exploits change the config: the log's check covers the scores
        quality = _quality(result.config)
        for row in history:
            expected = quality * row["training_iteration"]
            if not math.isclose(row["score"], expected, rel_tol=0, abs_tol=SCORE_TOLERANCE):
                raise _violation("tune-scores-match-model",
                                 f"{where}: iteration {row['training_iteration']} scored "
                                 f"{row['score']}, the model says {expected:.9g} (a restore from "
                                 f"the wrong checkpoint?)")
    best = grid.get_best_result()
    if last_scores:
        top_score, top_id = max(last_scores)
        if best.trial_id != top_id and not math.isclose(
                best.metrics.get("score", float("nan")), top_score, rel_tol=0,
                abs_tol=SCORE_TOLERANCE):
            raise _violation("tune-best-result",
                             f"get_best_result() is trial {best.trial_id} (score "
                             f"{best.metrics.get('score')}); the best last result on storage "
                             f"is trial {top_id}'s, {top_score}")
    if errored or kind not in ("asha", "fifo") or threshold is not None:
        return
    qualities = sorted(((_quality(r.config), r.trial_id) for r in grid), reverse=True)
    best_quality, best_id = qualities[0]
    if best.trial_id != best_id or not math.isclose(
            best.metrics["score"], best_quality * max_t, rel_tol=0, abs_tol=SCORE_TOLERANCE):
        raise _violation("tune-same-best-as-fault-free",
                         f"best trial {best.trial_id} (score {best.metrics.get('score')}); the "
                         f"model's best is {best_id} with {best_quality * max_t}")


def _check_checkpoints(grid, keep: int, attribute: str | None) -> None:
    """``tune-checkpoints-kept`` (not under PBT: a donor's checkpoint stays
    while a trial will resume from it): a trial keeps at most ``keep``
    checkpoints, every one it keeps is on storage, its latest among them;
    and of the checkpoints its results carried (the result lines up to the
    controller's last result), exactly the kept ones are still on storage,
    the others deleted — the kept ones, but the latest, being the best by
    ``checkpoint_score_attribute`` (or the most recent without one)."""
    from tray.tune.result_grid import read_results

    for result in grid:
        trial = result._trial
        where = f"trial {result.trial_id} (num_to_keep {keep}, score attribute {attribute})"
        kept = {os.path.basename(c.path): c for c in trial.checkpoints}
        if len(kept) > keep:
            raise _violation("tune-checkpoints-kept", f"{where} keeps {sorted(kept)}")
        missing = [name for name, c in kept.items() if not os.path.isdir(c.path)]
        if missing:
            raise _violation("tune-checkpoints-kept",
                             f"{where}: kept checkpoints {missing} are not on storage")
        latest = trial.restore_from
        if latest is not None and os.path.basename(latest.path) not in kept:
            raise _violation("tune-checkpoints-kept",
                             f"{where}: its latest checkpoint {latest.path} is not kept "
                             f"({sorted(kept)})")
        taken = trial.last_result.get("training_iteration", 0)
        carried = {}  # checkpoint dir -> (score, index) of the result that carried it
        for row in read_results(result.path):
            name = row.get("checkpoint_dir_name")
            if name and row["training_iteration"] <= taken:
                carried[name] = (row.get("score"), int(name.rsplit("_", 1)[-1]))
        for name in sorted(carried):
            on_storage = os.path.isdir(os.path.join(result.path, name))
            if on_storage != (name in kept):
                raise _violation("tune-checkpoints-kept",
                                 f"{where}: checkpoint {name} is "
                                 f"{'on storage' if on_storage else 'deleted'} and "
                                 f"{'' if name in kept else 'not '}kept (kept: {sorted(kept)})")
        others = [carried[n] for n in kept if n in carried and
                  (latest is None or n != os.path.basename(latest.path))]
        gone = [value for name, value in carried.items() if name not in kept]
        if others and gone:
            rank = (lambda v: (v[0], v[1])) if attribute else (lambda v: v[1])
            if max(map(rank, gone)) > min(map(rank, others)):
                raise _violation("tune-checkpoints-kept",
                                 f"{where}: deleted a checkpoint better than one kept "
                                 f"(deleted (score, index) {sorted(gone)}; kept {sorted(others)})")


def _check_failures(grid, exploits: bool) -> None:
    """``tune-failures-explained``: every failure a trial records (its
    ``error.txt``) is its trainable's own error, in a trial configured to
    fail, or the loss of its runner (a fault): nothing else raises in a
    trial (a checkpoint that vanished, an error of Tune's own). Under PBT a
    trial takes its donor's config, ``fail`` included: any configured error."""
    for result in grid:
        try:
            with open(os.path.join(result.path, "error.txt"), encoding="utf-8") as file:
                text = file.read()
        except FileNotFoundError:
            continue
        fail = result.config.get("fail", "never")
        for chunk in text.split("Failure # ")[1:]:
            if "runner actor" in chunk.splitlines()[1 if "\n" in chunk else 0] or (
                    fail != "never" and f"the trainable fails ({fail})" in chunk) or (
                    exploits and "the trainable fails (" in chunk):
                continue
            raise _violation("tune-failures-explained",
                             f"trial {result.trial_id} (fails {fail}) failed with:\n"
                             f"{chunk[-1500:]}")


def _check_search_space(grid, added: dict, num_samples: int, widths: list | None) -> None:
    """``added``: trial id -> its config when created (PBT changes it later)."""
    configs = sorted((r._trial.index, r.trial_id, added[r.trial_id]) for r in grid)
    if [index for index, _, _ in configs] != list(range(len(configs))):
        raise _violation("tune-trials-match-search-space",
                         f"trial indexes {[index for index, _, _ in configs]}")
    if widths is not None:
        for width in widths:
            count = sum(1 for _, _, config in configs if config["width"] == width)
            if count != num_samples:
                raise _violation("tune-trials-match-search-space",
                                 f"{count} trials with grid value width={width}; num_samples "
                                 f"is {num_samples}")
    xs = [config["x"] for _, _, config in configs]
    for _, trial_id, config in configs:
        if config["width"] not in (1, 2, 4) or not 0.1 <= config["x"] <= 1.0 or \
                config.get("fail") not in ("never", "once", "always"):
            raise _violation("tune-trials-match-search-space",
                             f"trial {trial_id} has config {config}, outside the space")
    if len(set(xs)) != len(xs) and len(xs) > 1:
        raise _violation("tune-trials-match-search-space",
                         f"sampled x values repeat across trials: {sorted(xs)}")


def _check_decisions(grid, experiment_path: str, model, max_t: int,
                     max_concurrent: int | None, searcher_limit: int | None,
                     max_failures: int, class_mode: bool = False,
                     threshold: float | None = None, replaced: bool = False) -> dict:
    import pickle

    import cloudpickle  # noqa: F401 - the snapshot may hold cloudpickled code

    from tray.tune.result_grid import read_results

    from . import model_tune

    with open(os.path.join(experiment_path, "experiment_state.pkl"), "rb") as file:
        state = pickle.load(file)
    log = state.scheduler.__dict__.get("simtest_log", [])
    added = {entry[1]: entry[2] for entry in log if entry[0] == "add"}
    for result in grid:
        first = added.get(result.trial_id)
        if first is None:
            raise _violation("tune-trials-match-search-space",
                             f"trial {result.trial_id} was never added to its scheduler")
        if not isinstance(model, type(None)) and first != result.config:
            raise _violation("tune-trials-match-search-space",
                             f"trial {result.trial_id} was created with {first}, ended with "
                             f"{result.config}")
    if model is not None:
        wrong = model_tune.replay(model, log)
        if wrong is not None:
            raise _violation("tune-scheduler-decisions-match-model", wrong)
    trials = {}
    for result in grid:
        history = read_results(result.path)
        trials[result.trial_id] = (result.status, history[-1]["training_iteration"]
                                   if history else None)
    found = model_tune.check_histories(log, trials, max_t, max_concurrent, _quality,
                                       saves_on_request=class_mode, stop_at=threshold)
    if found is not None:
        raise _violation(*found)
    for result in grid:
        trial, fail = result._trial, added[result.trial_id].get("fail")
        if fail == "always" and (result.status != "ERROR" or
                                 trial.num_failures != max_failures + 1):
            raise _violation("tune-every-trial-accounted-for",
                             f"trial {result.trial_id} fails at every run, and ended "
                             f"{result.status} after {trial.num_failures} failure(s); "
                             f"max_failures is {max_failures}")
        fail_at = added[result.trial_id].get("fail_at", 2)
        # (A failure reported to a controller that died before it saved it is
        # not counted: the next one resumes from the snapshot, and the trial
        # runs again as any running trial does. Tune chaos seed 201.)
        if fail == "once" and trial.num_failures < 1 and not replaced and \
                _ran_into_its_failure(log, result.trial_id, fail_at):
            raise _violation("tune-failures-counted",
                             f"trial {result.trial_id} failed at iteration 2 of its first "
                             f"run (told to continue at iteration 1, it ran again later), "
                             f"and counts {trial.num_failures} failures")
    _check_searcher(state.search, grid, log, searcher_limit)
    return added


def _controllers() -> set:
    """The ids of every Tune controller actor the GCS knows of."""
    import tray.simtest

    cluster = tray.simtest.cluster()
    process = cluster.processes.get(cluster.gcs_address)
    gcs = None if process is None else process.component
    if gcs is None:  # (restarting: its tables come back from storage)
        return set()
    return {actor_id for actor_id, record in gcs.actor_manager.actors.items()
            if record.spec.class_name == "TuneController"}


def _ran_into_its_failure(log: list, trial_id: str, fail_at: int = 2) -> bool:
    """Whether a run from scratch of a trial failing "once" was told to go on
    at iteration ``fail_at - 1`` (so it raised at ``fail_at``) and the trial
    ran again afterwards."""
    rows = [entry for entry in log if entry[0] == "result" and entry[1] == trial_id]
    for row, after in zip(rows, rows[1:], strict=False):
        if row[2] == fail_at - 1 and row[4] == 0 and row[7] == "CONTINUE" and after[4] != 0:
            return True
    return False


def _check_searcher(search, grid, log: list, limit: int | None) -> None:
    if isinstance(search, ConcurrencyLimiter):
        search = search.searcher
    if not isinstance(search, SimtestSearcher):
        return
    ids = sorted(r.trial_id for r in grid)
    if sorted(search.suggested) != ids:
        raise _violation("tune-searcher-sees-every-trial",
                         f"the searcher suggested {sorted(search.suggested)}, the trials are "
                         f"{ids}")
    told = {trial_id: search.completed.get(trial_id, 0) for trial_id in ids}
    if any(count != 1 for count in told.values()):
        raise _violation("tune-searcher-sees-every-trial",
                         f"times the searcher was told each trial ended: {told}")
    if limit is None:
        return
    live: set = set()
    for entry in log:
        if entry[0] == "add":
            live.add(entry[1])
            if len(live) > limit:
                raise _violation("tune-searcher-concurrency",
                                 f"{len(live)} of the searcher's trials live at once "
                                 f"({sorted(live)}); ConcurrencyLimiter({limit})")
        elif entry[0] in ("complete", "error"):
            live.discard(entry[1])


WORKLOADS = {"tune": tune_experiment}
