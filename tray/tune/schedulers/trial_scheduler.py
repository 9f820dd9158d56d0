"""``TrialScheduler``: decides, at every result, whether a trial goes on.

Schedulers run inside the experiment's controller actor, one call at a
time, and see trials through the controller they are handed: ``get_trials()``,
``get_live_trials()``, ``stop_trial(t)``, ``pause_trial(t)``,
``resume_trial(t)``, ``has_resources_for_trial(t)`` and ``rng`` (a seeded
``random.Random``: schedulers draw from it, never from global randomness,
so a seeded experiment replays). ``on_trial_result`` answers CONTINUE,
PAUSE, STOP or NOOP (the scheduler already changed the trial itself).
"""

from __future__ import annotations

from typing import Any

from ..experiment import Trial

DEFAULT_METRIC = "_metric"


class TrialScheduler:
    """Base class of trial schedulers (Ray's ``tune.schedulers.TrialScheduler``)."""

    CONTINUE = "CONTINUE"
    PAUSE = "PAUSE"
    STOP = "STOP"
    NOOP = "NOOP"

    _metric: str | None = None
    _mode: str | None = None
    # Whether the scheduler needs a metric and mode to work (FIFO does not).
    _needs_metric = True

    @property
    def metric(self) -> str | None:
        return self._metric

    @property
    def mode(self) -> str | None:
        return self._mode

    def set_search_properties(self, metric: str | None, mode: str | None, **spec: Any) -> bool:
        """Take the experiment's metric and mode where the scheduler has none
        of its own; False if both sides name one (Ray's rule)."""
        if (self._metric and metric and self._metric != metric) or \
                (self._mode and mode and self._mode != mode):
            return False
        if metric and not self._metric:
            self._metric = metric
        if mode and not self._mode:
            self._mode = mode
        if self._mode is not None and self._mode not in ("min", "max"):
            raise ValueError(f"mode must be 'min' or 'max', got {self._mode!r}")
        if self._metric is None and self._mode:
            self._metric = DEFAULT_METRIC
        return True

    def check_metric(self) -> None:
        """Raise a clear error when a metric-driven scheduler has no metric or mode."""
        if self._needs_metric and (not self._metric or self._mode not in ("min", "max")):
            raise ValueError(
                f"{type(self).__name__} needs a metric and a mode ('min' or 'max'), got "
                f"metric={self._metric!r}, mode={self._mode!r}: pass them to the scheduler "
                f"or to tune.TuneConfig(metric=..., mode=...)")

    def _sign(self) -> float:
        return 1.0 if self._mode == "max" else -1.0

    def on_trial_add(self, controller, trial: Trial) -> None:
        pass

    def on_trial_error(self, controller, trial: Trial) -> None:
        pass

    def on_trial_result(self, controller, trial: Trial, result: dict) -> str:
        return TrialScheduler.CONTINUE

    def on_trial_complete(self, controller, trial: Trial, result: dict) -> None:
        pass

    def results_ahead(self, trial: Trial, result: dict) -> int:
        """How many more results of ``trial`` (after ``result``) this scheduler
        is sure to answer CONTINUE, whatever the other trials do. The trial
        sends those without waiting for an answer: one message instead of a
        round trip each. 0 (the default) keeps every report synchronous."""
        return 0

    def on_trial_remove(self, controller, trial: Trial) -> None:
        pass

    def choose_trial_to_run(self, controller) -> Trial | None:
        """The next trial to start on the runner that asks: pending trials in
        creation order, then paused ones."""
        for status in (Trial.PENDING, Trial.PAUSED):
            for trial in controller.get_trials():
                if trial.status == status and controller.has_resources_for_trial(trial):
                    return trial
        return None

    def debug_string(self) -> str:
        return f"Using {type(self).__name__}"


class FIFOScheduler(TrialScheduler):
    """Runs trials in the order they were created, to the end."""

    _needs_metric = False

    def __init__(self) -> None:
        pass

    def results_ahead(self, trial: Trial, result: dict) -> int:
        # Subclasses that stop or pause trials must say for themselves.
        return 1 << 30 if type(self) is FIFOScheduler else 0


for _cls in (TrialScheduler, FIFOScheduler):
    _cls.__module__ = "tray.tune.schedulers"
del _cls
