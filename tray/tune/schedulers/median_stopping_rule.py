"""The median stopping rule (Google Vizier): ``MedianStoppingRule``.

A trial stops when its best result so far is worse than the median of the
other trials' running averages up to the same time. Per trial it keeps the
``(time, metric)`` pairs it saw: memory grows with trials x results, which
is the rule's own definition (a running average over all of a trial's
results); nothing else grows.
"""

from __future__ import annotations

import statistics

from ..experiment import Trial
from .trial_scheduler import FIFOScheduler, TrialScheduler


class MedianStoppingRule(FIFOScheduler):
    """Ray's ``MedianStoppingRule``: no decision before ``grace_period`` (in
    ``time_attr`` units) or with fewer than ``min_samples_required`` other
    trials that got that far; ``hard_stop=False`` pauses instead of stopping."""

    _needs_metric = True

    def __init__(self, time_attr: str = "time_total_s", metric: str | None = None,
                 mode: str | None = None, grace_period: float = 60.0,
                 min_samples_required: int = 3, min_time_slice: float = 0,
                 hard_stop: bool = True) -> None:
        if mode is not None and mode not in ("min", "max"):
            raise ValueError(f"mode must be 'min' or 'max', got {mode!r}")
        if min_samples_required < 1:
            raise ValueError(f"min_samples_required must be >= 1, got {min_samples_required}")
        self._time_attr = time_attr
        self._metric, self._mode = metric, mode
        self._grace_period = grace_period
        self._min_samples_required = min_samples_required
        self._min_time_slice = min_time_slice
        self._hard_stop = hard_stop
        self._results: dict[str, list[tuple[float, float]]] = {}
        self._stopped: dict[str, None] = {}
        self._last_pause: dict[str, float] = {}

    def on_trial_add(self, controller, trial: Trial) -> None:
        self.check_metric()

    def on_trial_result(self, controller, trial: Trial, result: dict) -> str:
        if self._time_attr not in result or self._metric not in result:
            return TrialScheduler.CONTINUE
        if trial.trial_id in self._stopped:
            return TrialScheduler.CONTINUE  # paused once (hard_stop=False): runs FIFO now
        time = result[self._time_attr]
        self._results.setdefault(trial.trial_id, []).append((time, float(result[self._metric])))
        if time < self._grace_period:
            return TrialScheduler.CONTINUE
        others = [tid for tid, results in self._results.items()
                  if tid != trial.trial_id and results[-1][0] >= time]
        if len(others) < self._min_samples_required:
            waiting = any(t.status in (Trial.PENDING, Trial.PAUSED)
                          for t in controller.get_live_trials())
            if waiting and time - self._last_pause.get(trial.trial_id, float("-inf")) \
                    > self._min_time_slice:
                self._last_pause[trial.trial_id] = time
                return TrialScheduler.PAUSE
            return TrialScheduler.CONTINUE
        median = statistics.median(self._running_mean(tid, time) for tid in others)
        values = [value for _t, value in self._results[trial.trial_id]]
        best = max(values) if self._mode == "max" else min(values)
        worse = best < median if self._mode == "max" else best > median
        if worse:
            self._stopped[trial.trial_id] = None
            return TrialScheduler.STOP if self._hard_stop else TrialScheduler.PAUSE
        return TrialScheduler.CONTINUE

    def _running_mean(self, trial_id: str, time: float) -> float:
        scoped = [value for t, value in self._results[trial_id]
                  if self._grace_period <= t <= time]
        return sum(scoped) / len(scoped) if scoped else float("nan")

    def on_trial_complete(self, controller, trial: Trial, result: dict) -> None:
        if self._time_attr in result and self._metric in result:
            history = self._results.setdefault(trial.trial_id, [])
            point = (result[self._time_attr], float(result[self._metric]))
            if not history or history[-1] != point:
                history.append(point)

    def debug_string(self) -> str:
        return f"Using MedianStoppingRule: num_stopped={len(self._stopped)}."


MedianStoppingRule.__module__ = "tray.tune.schedulers"
