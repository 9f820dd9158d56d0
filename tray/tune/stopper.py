"""Stopping criteria (``RunConfig(stop=...)``): a dict of thresholds, a
function, or a ``Stopper``."""

from __future__ import annotations

from collections.abc import Callable


class Stopper:
    """Decides per result whether a trial stops (``__call__``) and whether the
    whole experiment stops (``stop_all``)."""

    def __call__(self, trial_id: str, result: dict) -> bool:
        return False

    def stop_all(self) -> bool:
        return False


class MaximumIterationStopper(Stopper):
    """Stops each trial after ``max_iter`` iterations."""

    def __init__(self, max_iter: int) -> None:
        if isinstance(max_iter, bool) or not isinstance(max_iter, int) or max_iter < 1:
            raise ValueError(f"max_iter must be a positive integer, got {max_iter!r}")
        self.max_iter = max_iter

    def __call__(self, trial_id: str, result: dict) -> bool:
        return result.get("training_iteration", 0) >= self.max_iter


class FunctionStopper(Stopper):
    def __init__(self, function: Callable) -> None:
        self.function = function

    def __call__(self, trial_id: str, result: dict) -> bool:
        return bool(self.function(trial_id, result))


class DictStopper(Stopper):
    """``{"metric": threshold}``: stop once a result's metric reaches it."""

    def __init__(self, criteria: dict) -> None:
        for key, value in criteria.items():
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ValueError(f"stop criterion {key!r} must be a number, got {value!r}")
        self.criteria = dict(criteria)

    def __call__(self, trial_id: str, result: dict) -> bool:
        return any(key in result and result[key] >= threshold
                   for key, threshold in self.criteria.items())


def as_stopper(stop) -> Stopper | None:
    if stop is None:
        return None
    if isinstance(stop, Stopper):
        return stop
    if isinstance(stop, dict):
        return DictStopper(stop)
    if callable(stop):
        return FunctionStopper(stop)
    raise ValueError(f"RunConfig.stop must be a dict, a function (trial_id, result) -> bool "
                     f"or a tune.stopper.Stopper, got {stop!r}")


for _cls in (Stopper, MaximumIterationStopper, FunctionStopper, DictStopper):
    _cls.__module__ = "tray.tune.stopper"
del _cls
