"""Models of Tune's trial schedulers, held against what the controller did.

The ``tune`` workload's scheduler is a public scheduler with a recorder
mixed in (``Recording*``): every call the controller makes to it — a
trial added, a result (with the scheduler's answer, how many trials ran
then, whether any waited), a trial completed or errored — goes, in order,
into ``simtest_log`` on the scheduler. The log lives in the scheduler's
state, so the controller's snapshots carry it and a controller restarted
from a snapshot rolls it back with everything else; the workload reads it
from the final snapshot (``experiment_state.pkl``).

``replay`` feeds the log through a model of the scheduler written from
its documentation (ASHA's rungs and quantile, the median stopping rule,
FIFO) and returns the first answer that differs. ``check_histories``
holds the log against what every trial did: a STOP ends a trial at that
result, a trial that ends has been told to (or reached ``max_t``), every
restart resumes from the latest checkpoint the controller registered (the
last result it took, since every result carries one), each score follows
from the checkpoint it resumed from, and no more trials run at once than
``max_concurrent_trials``. A scheduler may also stop other trials than
the one reporting (``controller.stop_trial``: HyperBand's halving): the
recorder logs those too, as ``told_stop``."""

from __future__ import annotations

import statistics

from tray.tune.experiment import Trial
from tray.tune.schedulers import (
    ASHAScheduler,
    FIFOScheduler,
    HyperBandScheduler,
    MedianStoppingRule,
    PopulationBasedTraining,
    TrialScheduler,
)

# Scores are sums of 9-digit roundings: they agree with a product to ~1e-8.
TOLERANCE = 1e-6


class _Recorder:
    """Records the controller's calls to the scheduler (see the module header)."""

    def _log(self, entry: tuple) -> None:
        log = self.__dict__.setdefault("simtest_log", [])
        log.append(entry)

    def on_trial_add(self, controller, trial: Trial) -> None:
        super().on_trial_add(controller, trial)
        self._log(("add", trial.trial_id, dict(trial.config)))

    @staticmethod
    def _states(controller) -> dict:
        return {t.trial_id: (t.status, t.stop_requested) for t in controller.get_trials()}

    def _told(self, controller, before: dict, current: str) -> None:
        """Other trials the call stopped (``controller.stop_trial``): ended at
        once, or told to stop at their next result."""
        for trial in controller.get_trials():
            status, requested = before.get(trial.trial_id, (None, None))
            if trial.trial_id == current or status is None:
                continue
            if trial.status == Trial.TERMINATED and status != Trial.TERMINATED:
                self._log(("told_stop", trial.trial_id, False))
            elif trial.stop_requested == "stop" and requested != "stop":
                self._log(("told_stop", trial.trial_id, True))

    def on_trial_result(self, controller, trial: Trial, result: dict) -> str:
        running = sum(1 for t in controller.get_trials() if t.status == Trial.RUNNING)
        waiting = any(t.status in (Trial.PENDING, Trial.PAUSED)
                      for t in controller.get_live_trials())
        config = dict(trial.config)
        before = self._states(controller)
        record = trial.checkpoint  # the latest the controller registered (this result's?)
        checkpoint = None if record is None else (record.training_iteration,
                                                  record.metrics.get("score"))
        action = super().on_trial_result(controller, trial, result)
        self._log(("result", trial.trial_id, result.get("training_iteration"),
                   result.get("score"), result.get("restored_t"), result.get("restored_total"),
                   result.get("quality"), action, running, waiting, config,
                   dict(trial.config) != config, checkpoint))
        self._told(controller, before, trial.trial_id)
        return action

    def on_trial_complete(self, controller, trial: Trial, result: dict) -> None:
        before = self._states(controller)
        super().on_trial_complete(controller, trial, result)
        self._log(("complete", trial.trial_id, result.get("training_iteration"),
                   result.get("score")))
        self._told(controller, before, trial.trial_id)

    def on_trial_error(self, controller, trial: Trial) -> None:
        before = self._states(controller)
        super().on_trial_error(controller, trial)
        self._log(("error", trial.trial_id))
        self._told(controller, before, trial.trial_id)


class RecordingASHA(_Recorder, ASHAScheduler):
    pass


class RecordingFIFO(_Recorder, FIFOScheduler):
    pass


class RecordingMedian(_Recorder, MedianStoppingRule):
    pass


class RecordingPBT(_Recorder, PopulationBasedTraining):
    pass


class RecordingHyperBand(_Recorder, HyperBandScheduler):
    pass


for _cls in (RecordingASHA, RecordingFIFO, RecordingMedian, RecordingPBT, RecordingHyperBand):
    _cls.__module__ = __name__
del _cls


def _quantile(values: list, q: float) -> float:
    """The q-quantile (0..1) by linear interpolation between order statistics."""
    ordered = sorted(values)
    position = q * (len(ordered) - 1)
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


class AshaModel:
    """ASHA, one bracket: rungs at grace * rf**k up to max_t; a trial first
    reaching a rung stops if below the (1 - 1/rf) quantile of the scores
    recorded there before it; at max_t every trial stops."""

    def __init__(self, max_t: float, grace_period: float, reduction_factor: float) -> None:
        self.max_t, self.rf = max_t, reduction_factor
        rungs, milestone = [], grace_period
        while milestone <= max_t * (1 + 1e-9):
            rungs.append(milestone)
            milestone *= reduction_factor
        self.rungs = {m: {} for m in rungs}
        self.gone: set = set()

    def _judge(self, trial_id: str, t: float, score: float) -> str:
        for milestone in sorted(self.rungs, reverse=True):
            recorded = self.rungs[milestone]
            if t < milestone or trial_id in recorded:
                continue
            before = list(recorded.values())
            recorded[trial_id] = score
            if before and score < _quantile(before, 1 - 1 / self.rf):
                return TrialScheduler.STOP
            return TrialScheduler.CONTINUE
        return TrialScheduler.CONTINUE

    def result(self, trial_id: str, t: float, score: float, waiting: bool) -> str:
        if t >= self.max_t:
            return TrialScheduler.STOP
        return self._judge(trial_id, t, score)

    def complete(self, trial_id: str, t, score) -> None:
        if trial_id not in self.gone and t is not None and score is not None:
            self._judge(trial_id, t, score)
        self.gone.add(trial_id)

    def error(self, trial_id: str) -> None:
        self.gone.add(trial_id)


class MedianModel:
    """The median stopping rule (time in iterations): after the grace period,
    a trial whose best is worse than the median of the other trials' mean
    results up to the same time stops (pauses without hard_stop, then runs
    on unjudged); with fewer than min_samples_required others that got so
    far, it pauses while other trials wait."""

    def __init__(self, grace_period: float, min_samples: int, hard_stop: bool) -> None:
        self.grace, self.min_samples, self.hard_stop = grace_period, min_samples, hard_stop
        self.results: dict = {}
        self.stopped: set = set()
        self.last_pause: dict = {}

    def _mean(self, trial_id: str, t: float) -> float:
        scoped = [v for time, v in self.results[trial_id] if self.grace <= time <= t]
        return sum(scoped) / len(scoped) if scoped else float("nan")

    def result(self, trial_id: str, t: float, score: float, waiting: bool) -> str:
        if trial_id in self.stopped:
            return TrialScheduler.CONTINUE
        self.results.setdefault(trial_id, []).append((t, float(score)))
        if t < self.grace:
            return TrialScheduler.CONTINUE
        others = [o for o, rows in self.results.items() if o != trial_id and rows[-1][0] >= t]
        if len(others) < self.min_samples:
            if waiting and t > self.last_pause.get(trial_id, float("-inf")):
                self.last_pause[trial_id] = t
                return TrialScheduler.PAUSE
            return TrialScheduler.CONTINUE
        median = statistics.median(self._mean(o, t) for o in others)
        best = max(v for _, v in self.results[trial_id])
        if best < median:
            self.stopped.add(trial_id)
            return TrialScheduler.STOP if self.hard_stop else TrialScheduler.PAUSE
        return TrialScheduler.CONTINUE

    def complete(self, trial_id: str, t, score) -> None:
        if t is None or score is None:
            return
        rows = self.results.setdefault(trial_id, [])
        if not rows or rows[-1] != (t, float(score)):
            rows.append((t, float(score)))

    def error(self, trial_id: str) -> None:
        pass


class FifoModel:
    def result(self, trial_id, t, score, waiting) -> str:
        return TrialScheduler.CONTINUE

    def complete(self, trial_id, t, score) -> None:
        pass

    def error(self, trial_id) -> None:
        pass


def replay(model, log: list) -> str | None:
    """The first of the scheduler's answers that its model does not give."""
    for entry in log:
        kind = entry[0]
        if kind == "result":
            _, trial_id, t, score, *_rest = entry
            action, waiting = entry[7], entry[9]
            expected = model.result(trial_id, t, score, waiting)
            if action != expected:
                return (f"trial {trial_id} at iteration {t} (score {score}): the scheduler "
                        f"answered {action}, its model {expected}")
        elif kind == "complete":
            model.complete(entry[1], entry[2], entry[3])
        elif kind == "error":
            model.error(entry[1])
    return None


def check_histories(log: list, trials: dict, max_t: int, max_concurrent: int | None,
                    quality, saves_on_request: bool = False,
                    stop_at: float | None = None) -> tuple | None:
    """(invariant, message) for the first thing the log and the trials'
    final states disagree on, or None. ``trials``: trial id -> (status,
    last iteration in result.json). A run resumes from the latest checkpoint
    registered as of the trial's last result; with ``saves_on_request`` (a
    class trainable, saving when a pause or a PBT donor asks, after the
    answer) or from that last result itself. ``stop_at``: the stopping
    criterion's score: a result the scheduler lets go on (CONTINUE, NOOP)
    that scores that much ends the trial there."""
    last: dict = {}  # trial id -> (iteration, score) of its last result taken
    saved: dict = {}  # trial id -> (iteration, score) of its latest checkpoint then
    attempt: dict = {}  # trial id -> (restored_t, restored_total) of its current run
    stopped: dict = {}  # trial id -> the iteration a STOP ended it at
    exploited: set = set()  # PBT: restarts from another trial's checkpoint
    ever_exploited: set = set()
    reported: set = set()  # (iteration, score) of every result taken
    told: dict = {}  # told to stop at their next result (stop_trial): -> last iteration
    for entry in log:
        if entry[0] == "told_stop":
            _, trial_id, at_next = entry
            if at_next:
                told.setdefault(trial_id, last.get(trial_id, (0, 0.0))[0])
            elif trial_id not in stopped:
                stopped[trial_id] = last.get(trial_id, (0, 0.0))[0]
            continue
        if entry[0] != "result":
            continue
        (_, trial_id, t, score, restored_t, restored_total, reported_quality, action,
         running, _waiting, config, config_changed, *rest) = entry
        checkpoint = rest[0] if rest else (t, score)
        where = f"trial {trial_id}, iteration {t}"
        if max_concurrent is not None and running > max_concurrent:
            return ("tune-max-concurrent-trials",
                    f"{running} trials RUNNING at {where}; max_concurrent_trials is "
                    f"{max_concurrent}")
        if trial_id in stopped:
            return ("tune-stopped-trials-stay-stopped",
                    f"{where} was taken after a STOP at iteration {stopped[trial_id]}")
        if trial_id in told:
            return ("tune-stopped-trials-stay-stopped",
                    f"{where} went to its scheduler after the scheduler stopped the trial "
                    f"(stop_trial) at iteration {told[trial_id]}")
        if abs(reported_quality - quality(config)) > TOLERANCE:
            return ("tune-trials-run-their-config",
                    f"{where} ran with quality {reported_quality}; its config {config} "
                    f"has {quality(config)}")
        previous = last.get(trial_id)
        if attempt.get(trial_id) != (restored_t, restored_total) or previous is None or \
                t != previous[0] + 1:
            # A new run of the trial: it resumes from the latest checkpoint.
            if trial_id in exploited or (trial_id in ever_exploited and
                                         (restored_t, restored_total) in reported):
                # (After an exploit, a restart may resume from the donor's
                # checkpoint again: PBT's record of where to resume.)
                if (restored_t, restored_total) not in reported:
                    return ("tune-resumes-from-latest-checkpoint",
                            f"{where}: the exploiting trial resumed from iteration "
                            f"{restored_t} with total {restored_total}, a checkpoint no "
                            f"trial reported")
                exploited.discard(trial_id)
            else:
                latest = saved.get(trial_id) or (0, 0.0)
                allowed = [latest] + ([previous] if saves_on_request and previous else [])
                if not any(restored_t == at and abs(restored_total - total) <= TOLERANCE
                           for at, total in allowed):
                    return ("tune-resumes-from-latest-checkpoint",
                            f"{where}: the run resumed from iteration {restored_t} (total "
                            f"{restored_total}); the latest checkpoint the controller took "
                            f"was iteration {latest[0]} (total {latest[1]})"
                            + (f", or the last result's {previous}" if len(allowed) > 1 else ""))
            if t != restored_t + 1:
                return ("tune-trial-iterations",
                        f"{where} is the first result of a run resumed from iteration "
                        f"{restored_t}")
            attempt[trial_id] = (restored_t, restored_total)
        expected = restored_total + (t - restored_t) * reported_quality
        if abs(score - expected) > TOLERANCE * t:
            return ("tune-scores-match-model",
                    f"{where} scored {score}; from iteration {restored_t} (total "
                    f"{restored_total}) at quality {reported_quality} the model says "
                    f"{expected:.9g}")
        last[trial_id] = (t, score)
        if checkpoint is not None and checkpoint[1] is not None:
            saved[trial_id] = checkpoint
        reported.add((t, score))
        if action == TrialScheduler.STOP or (
                stop_at is not None and score >= stop_at and
                action in (TrialScheduler.CONTINUE, TrialScheduler.NOOP)):
            stopped[trial_id] = t
        if config_changed or action == TrialScheduler.NOOP:  # (PBT: an exploit)
            exploited.add(trial_id)
            ever_exploited.add(trial_id)
    for trial_id, (status, final) in sorted(trials.items()):
        if status != "TERMINATED" or final is None:
            continue
        if trial_id in told and trial_id not in stopped:
            if final not in (told[trial_id], told[trial_id] + 1):
                return ("tune-stopped-trials-stay-stopped",
                        f"trial {trial_id} was stopped (stop_trial) at iteration "
                        f"{told[trial_id]}, to end at its next result; its history ends "
                        f"at {final}")
        elif trial_id in stopped:
            if final != stopped[trial_id]:
                return ("tune-stopped-trials-stay-stopped",
                        f"trial {trial_id} was stopped at iteration {stopped[trial_id]}, its "
                        f"history ends at {final}")
        elif final < max_t and trial_id not in ever_exploited:
            # (An exploited trial counts its iterations on from its own, its
            # trainable from the donor's checkpoint: it may end sooner.)
            return ("tune-trials-end-when-told",
                    f"trial {trial_id} ended TERMINATED at iteration {final} < max_t "
                    f"{max_t}, with no STOP from its scheduler")
        if trial_id in last and last[trial_id][0] != final and trial_id not in told:
            return ("tune-result-history",
                    f"trial {trial_id}: the controller's last result is iteration "
                    f"{last[trial_id][0]}, result.json ends at {final}")
    return None
