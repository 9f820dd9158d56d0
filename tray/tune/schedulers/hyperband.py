"""Synchronous HyperBand: ``HyperBandScheduler``.

Trials are grouped into brackets; bracket ``s`` starts ``n(s)`` trials with
a budget of ``max_t / eta**s`` and halves them ``s`` times. Unlike ASHA a
trial that reaches its bracket's milestone PAUSEs (its runner goes to other
work) until every live trial of the bracket got there; then the best
``1/eta`` go on (PAUSED -> PENDING, resumed from their checkpoint) and the
rest stop. Pausing loses no work only if the trainable checkpoints: class
trainables are asked to save on pause; function trainables resume from the
last checkpoint they reported.
"""

from __future__ import annotations

import math

from ..experiment import Trial
from .trial_scheduler import FIFOScheduler, TrialScheduler


class _HBBracket:
    def __init__(self, time_attr: str, max_trials: int, first_milestone: float,
                 max_t: float, eta: float, halvings: int) -> None:
        self.time_attr = time_attr
        self.max_trials = max_trials
        self.size = max_trials  # how many survive the current stage
        self.milestone = first_milestone
        self.max_t = max_t
        self.eta = eta
        self.halvings = halvings
        self.live: dict[str, float] = {}  # trial id -> time reached (ordered)
        self.scores: dict[str, float] = {}
        self.all_trials: list[str] = []
        self.work_done = 0.0
        self.work_total = self._total_work(max_trials, first_milestone, halvings)

    def _total_work(self, n: float, r: float, s: int) -> float:
        total, milestone = 0.0, r
        for _ in range(s + 1):
            total += n * milestone
            n = math.ceil(n / self.eta)
            milestone = min(milestone * self.eta, self.max_t)
        return max(total, 1e-9)

    def filled(self) -> bool:
        return len(self.all_trials) >= self.max_trials

    def add(self, trial_id: str) -> None:
        self.live[trial_id] = 0.0
        self.all_trials.append(trial_id)

    def update(self, trial_id: str, time: float, score: float) -> None:
        self.work_done += max(0.0, time - self.live.get(trial_id, 0.0))
        self.live[trial_id] = time
        self.scores[trial_id] = score

    def reached(self, trial_id: str) -> bool:
        return self.live[trial_id] >= self.milestone

    def stage_done(self) -> bool:
        return all(time >= self.milestone for time in self.live.values())

    def final(self) -> bool:
        return self.halvings == 0

    def halve(self) -> tuple[list[str], list[str]]:
        """Keep the best ``size / eta``; returns (good, bad) trial ids."""
        self.halvings -= 1
        self.size = math.ceil(self.size / self.eta)
        self.milestone = min(self.milestone * self.eta, self.max_t)
        ranked = sorted(self.live, key=lambda tid: self.scores.get(tid, float("-inf")))
        return ranked[-self.size:], ranked[:-self.size]

    def completion(self) -> float:
        return min(self.work_done / self.work_total, 1.0)


class HyperBandScheduler(FIFOScheduler):
    """Ray's ``HyperBandScheduler``: ``max_t`` and ``reduction_factor`` (eta)
    fix the brackets (for max_t=81, eta=3: five brackets, up to 81 trials in
    the largest)."""

    _needs_metric = True

    def __init__(self, time_attr: str = "training_iteration", metric: str | None = None,
                 mode: str | None = None, max_t: float = 81, reduction_factor: float = 3,
                 stop_last_trials: bool = True) -> None:
        if not max_t > 0:
            raise ValueError(f"max_t must be positive, got {max_t!r}")
        if not reduction_factor > 1:
            raise ValueError(f"reduction_factor must be > 1, got {reduction_factor!r}")
        if mode is not None and mode not in ("min", "max"):
            raise ValueError(f"mode must be 'min' or 'max', got {mode!r}")
        self._time_attr = time_attr
        self._metric, self._mode = metric, mode
        self._max_t = max_t
        self._eta = reduction_factor
        self._stop_last_trials = stop_last_trials
        self._s_max_1 = int(round(math.log(max_t) / math.log(reduction_factor))) + 1
        self._bands: list[list[_HBBracket]] = [[]]
        self._trial_bracket: dict[str, _HBBracket] = {}
        self._num_stopped = 0

    def _new_bracket(self) -> _HBBracket:
        while True:
            band = self._bands[-1]
            if len(band) >= self._s_max_1:
                band = []
                self._bands.append(band)
            s = len(band)
            first = int(self._max_t * self._eta ** (-s))
            if first == 0:  # too small to run: skip this bracket size
                band.append(None)  # type: ignore[arg-type]
                continue
            n0 = math.ceil(self._s_max_1 / (s + 1) * self._eta ** s)
            bracket = _HBBracket(self._time_attr, n0, first, self._max_t, self._eta, s)
            band.append(bracket)
            return bracket

    def on_trial_add(self, controller, trial: Trial) -> None:
        self.check_metric()
        current = next((b for b in reversed(self._bands[-1]) if b is not None), None)
        if current is None or current.filled():
            current = self._new_bracket()
        current.add(trial.trial_id)
        self._trial_bracket[trial.trial_id] = current

    def on_trial_result(self, controller, trial: Trial, result: dict) -> str:
        bracket = self._trial_bracket.get(trial.trial_id)
        if bracket is None or self._time_attr not in result or self._metric not in result:
            return TrialScheduler.CONTINUE
        time = result[self._time_attr]
        bracket.update(trial.trial_id, time, self._sign() * result[self._metric])
        if time >= self._max_t and self._stop_last_trials:
            self._remove(controller, trial.trial_id)
            return TrialScheduler.STOP
        if not bracket.reached(trial.trial_id):
            return TrialScheduler.CONTINUE
        return self._process(controller, bracket, trial.trial_id)

    def _process(self, controller, bracket: _HBBracket, current: str | None) -> str:
        """The current trial reached the milestone (or one left the bracket):
        halve when the whole stage is done, else the current trial waits."""
        if not bracket.stage_done():
            return TrialScheduler.PAUSE
        if bracket.final():
            if not self._stop_last_trials:
                return TrialScheduler.CONTINUE
            action = TrialScheduler.STOP
            for tid in list(bracket.live):
                if tid != current:
                    self._stop(controller, tid)
            bracket.live.clear()
            return action
        good, bad = bracket.halve()
        action = TrialScheduler.CONTINUE
        for tid in bad:
            bracket.live.pop(tid, None)
            self._num_stopped += 1
            if tid == current:
                action = TrialScheduler.STOP
            else:
                self._stop(controller, tid)
        for tid in good:
            if tid != current:
                trial = controller.get_trial(tid)
                if trial.status == Trial.PAUSED:
                    controller.resume_trial(trial)
        return action

    def _stop(self, controller, trial_id: str) -> None:
        trial = controller.get_trial(trial_id)
        if not trial.is_finished:
            controller.stop_trial(trial)

    def _remove(self, controller, trial_id: str) -> None:
        bracket = self._trial_bracket.pop(trial_id, None)
        if bracket is not None:
            bracket.live.pop(trial_id, None)

    def _left(self, controller, trial: Trial) -> None:
        bracket = self._trial_bracket.pop(trial.trial_id, None)
        if bracket is None or trial.trial_id not in bracket.live:
            return
        bracket.live.pop(trial.trial_id)
        if bracket.live and bracket.stage_done() and not bracket.final():
            self._process(controller, bracket, None)

    def on_trial_complete(self, controller, trial: Trial, result: dict) -> None:
        self._left(controller, trial)

    def on_trial_error(self, controller, trial: Trial) -> None:
        self._left(controller, trial)

    def on_trial_remove(self, controller, trial: Trial) -> None:
        self._left(controller, trial)

    def choose_trial_to_run(self, controller) -> Trial | None:
        """Pending trials of the least complete bracket first (fairness)."""
        for band in self._bands:
            for bracket in sorted((b for b in band if b is not None),
                                  key=lambda b: b.completion()):
                for tid in bracket.all_trials:
                    trial = controller.get_trial(tid)
                    if trial.status == Trial.PENDING and \
                            controller.has_resources_for_trial(trial):
                        return trial
        return super().choose_trial_to_run(controller)

    def debug_string(self) -> str:
        brackets = sum(1 for band in self._bands for b in band if b is not None)
        return f"Using HyperBand: num_stopped={self._num_stopped} total_brackets={brackets}"


HyperBandScheduler.__module__ = "tray.tune.schedulers"
