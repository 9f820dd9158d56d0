"""Asynchronous successive halving (ASHA): ``ASHAScheduler``.

Rungs sit at ``grace_period * reduction_factor**k`` (up to ``max_t``). When a
trial first reaches a rung, it is compared with every result recorded at
that rung before it: below the ``1 - 1/reduction_factor`` quantile, it
stops; otherwise it goes on. No trial ever waits for another (that is the
"asynchronous"), which is why decisions depend on the order results
arrive — an order that the simulator makes reproducible. A trial that is
the best at every rung is never stopped, whatever that order.
"""

from __future__ import annotations

import math

import numpy as np

from ..experiment import Trial
from .trial_scheduler import FIFOScheduler, TrialScheduler


class _Bracket:
    def __init__(self, grace_period: float, max_t: float, reduction_factor: float,
                 s: int) -> None:
        self.reduction_factor = reduction_factor
        milestones = []
        milestone = grace_period * reduction_factor ** s
        while milestone <= max_t * (1 + 1e-9):
            milestones.append(milestone)
            milestone *= reduction_factor
        # Highest first: a result is judged at the highest rung it passed.
        self.rungs: list[tuple[float, dict]] = [(m, {}) for m in reversed(milestones)]

    def cutoff(self, recorded: dict) -> float | None:
        if not recorded:
            return None
        return float(np.nanpercentile(list(recorded.values()),
                                      (1 - 1 / self.reduction_factor) * 100))

    def on_result(self, trial_id: str, time: float, score: float) -> str:
        for milestone, recorded in self.rungs:
            if time < milestone or trial_id in recorded:
                continue
            cutoff = self.cutoff(recorded)
            recorded[trial_id] = score
            if cutoff is not None and score < cutoff:
                return TrialScheduler.STOP
            return TrialScheduler.CONTINUE
        return TrialScheduler.CONTINUE


class AsyncHyperBandScheduler(FIFOScheduler):
    """ASHA (Ray's ``AsyncHyperBandScheduler``, alias ``ASHAScheduler``).

    ``time_attr`` must grow monotonically; ``max_t`` ends every trial;
    ``grace_period`` is the first rung; with ``brackets > 1`` each trial
    joins a bracket drawn (softmax over bracket sizes) from the
    experiment's seeded RNG."""

    _needs_metric = True

    def __init__(self, time_attr: str = "training_iteration", metric: str | None = None,
                 mode: str | None = None, max_t: float = 100, grace_period: float = 1,
                 reduction_factor: float = 4, brackets: int = 1,
                 stop_last_trials: bool = True) -> None:
        if not max_t > 0:
            raise ValueError(f"max_t must be positive, got {max_t!r}")
        if not grace_period > 0:
            raise ValueError(f"grace_period must be positive, got {grace_period!r}")
        if grace_period > max_t:
            raise ValueError(f"grace_period ({grace_period}) must be <= max_t ({max_t})")
        if not reduction_factor > 1:
            raise ValueError(f"reduction_factor must be > 1, got {reduction_factor!r}")
        if isinstance(brackets, bool) or not isinstance(brackets, int) or brackets < 1:
            raise ValueError(f"brackets must be a positive integer, got {brackets!r}")
        if mode is not None and mode not in ("min", "max"):
            raise ValueError(f"mode must be 'min' or 'max', got {mode!r}")
        self._time_attr = time_attr
        self._metric, self._mode = metric, mode
        self._max_t = max_t
        self._stop_last_trials = stop_last_trials
        self._brackets = [_Bracket(grace_period, max_t, reduction_factor, s)
                          for s in range(brackets)]
        self._trial_bracket: dict[str, int] = {}
        self._num_stopped = 0

    def on_trial_add(self, controller, trial: Trial) -> None:
        self.check_metric()
        if len(self._brackets) == 1:
            self._trial_bracket[trial.trial_id] = 0
            return
        sizes = [len(b.rungs) for b in self._brackets]
        weights = [math.exp(size - max(sizes)) for size in sizes]
        self._trial_bracket[trial.trial_id] = controller.rng.choices(
            range(len(self._brackets)), weights=weights)[0]

    def on_trial_result(self, controller, trial: Trial, result: dict) -> str:
        if self._time_attr not in result or self._metric not in result:
            return TrialScheduler.CONTINUE
        time = result[self._time_attr]
        if time >= self._max_t and self._stop_last_trials:
            self._num_stopped += 1
            return TrialScheduler.STOP
        bracket = self._brackets[self._trial_bracket[trial.trial_id]]
        action = bracket.on_result(trial.trial_id, time, self._sign() * result[self._metric])
        if action == TrialScheduler.STOP:
            self._num_stopped += 1
        return action

    def results_ahead(self, trial: Trial, result: dict) -> int:
        """ASHA decides only at a rung and at ``max_t``: the results before the
        trial's next one need no answer (when time is counted in iterations)."""
        if self._time_attr != "training_iteration" or trial.trial_id not in self._trial_bracket:
            return 0
        now = result.get("training_iteration", 0)
        bracket = self._brackets[self._trial_bracket[trial.trial_id]]
        upcoming = [m for m, _recorded in bracket.rungs if m > now] + [self._max_t]
        return max(0, math.ceil(min(upcoming)) - now - 1)

    def on_trial_complete(self, controller, trial: Trial, result: dict) -> None:
        index = self._trial_bracket.pop(trial.trial_id, None)
        if index is None or self._time_attr not in result or self._metric not in result:
            return
        self._brackets[index].on_result(trial.trial_id, result[self._time_attr],
                                        self._sign() * result[self._metric])

    def on_trial_remove(self, controller, trial: Trial) -> None:
        self._trial_bracket.pop(trial.trial_id, None)

    def on_trial_error(self, controller, trial: Trial) -> None:
        self._trial_bracket.pop(trial.trial_id, None)

    def debug_string(self) -> str:
        rungs = " | ".join(f"Iter {m:g}: {self._brackets[0].cutoff(r)}"
                           for m, r in self._brackets[0].rungs)
        return f"Using AsyncHyperBand: num_stopped={self._num_stopped}\nBracket: {rungs}"


ASHAScheduler = AsyncHyperBandScheduler
AsyncHyperBandScheduler.__module__ = "tray.tune.schedulers"
