"""What ``Tuner.fit()`` returns: a ``ResultGrid`` of ``Result``s.

Results are built from the controller's trial records; the per-iteration
history (``Result.metrics_dataframe``) is read lazily from the trial's
``result.json`` lines, so a grid of many trials costs little until asked.
pandas is needed only for the dataframes (the ``tray[tune]`` extra).
"""

from __future__ import annotations

import json
import math
import os
from typing import Any

from .checkpoint import Checkpoint
from .experiment import Trial
from .search.variant_generator import flatten

_SCOPES = ("last", "avg", "last-5-avg", "last-10-avg", "all")


def _pandas():
    try:
        import pandas
    except ImportError as error:
        raise ImportError("dataframes need pandas: pip install 'tray[tune]'") from error
    return pandas


def read_results(path: str) -> list[dict]:
    """The result lines of a trial directory (a torn last line is skipped)."""
    rows = []
    try:
        with open(os.path.join(path, "result.json"), encoding="utf-8") as file:
            for line in file:
                try:
                    rows.append(json.loads(line))
                except ValueError:
                    break
    except FileNotFoundError:
        pass
    return rows


class Result:
    """One trial's outcome: ``metrics`` (its last result), ``config``,
    ``checkpoint`` (latest), ``best_checkpoints``, ``path``, ``error``."""

    def __init__(self, trial: Trial, experiment_path: str) -> None:
        self._trial = trial
        self.metrics: dict = dict(trial.last_result)
        self.config: dict = trial.config
        self.path: str = os.path.join(experiment_path, trial.dirname)
        own = [c for c in trial.checkpoints if os.path.isdir(c.path)]
        self.checkpoint: Checkpoint | None = Checkpoint(own[-1].path) if own else None
        self.best_checkpoints: list[tuple[Checkpoint, dict]] = [
            (Checkpoint(c.path), c.metrics) for c in own]
        self.error: BaseException | None = None
        if trial.status == Trial.ERROR:
            from .error import TuneError

            self.error = trial.error_object if isinstance(trial.error_object, BaseException) \
                else TuneError(trial.error or "the trial failed")
        self.status = trial.status
        self.trial_id = trial.trial_id

    @property
    def metrics_dataframe(self):
        """Every reported result of the trial, one row per iteration."""
        rows = read_results(self.path)
        pandas = _pandas()
        return pandas.DataFrame([{k: v for k, v in flatten(row).items()} for row in rows])

    def _history(self, metric: str) -> list[float]:
        return [row[metric] for row in read_results(self.path)
                if isinstance(row.get(metric), (int, float))]

    def __repr__(self) -> str:
        shown = {k: v for k, v in self.metrics.items()
                 if k not in ("config", "trial_id", "timestamp", "done")}
        return (f"Result(metrics={shown!r}, path={self.path!r}, "
                f"checkpoint={self.checkpoint!r}{', error=...' if self.error else ''})")


Result.__module__ = "tray.tune"


class ResultGrid:
    """All trials' results: index it, iterate it, or ask for the best."""

    def __init__(self, trials: list[Trial], experiment_path: str, metric: str | None,
                 mode: str | None) -> None:
        self._results = [Result(t, experiment_path) for t in trials]
        self.experiment_path = experiment_path
        self._metric, self._mode = metric, mode

    def __len__(self) -> int:
        return len(self._results)

    def __getitem__(self, index: int) -> Result:
        return self._results[index]

    def __iter__(self):
        return iter(self._results)

    @property
    def errors(self) -> list[BaseException]:
        return [r.error for r in self._results if r.error is not None]

    @property
    def num_errors(self) -> int:
        return len(self.errors)

    @property
    def num_terminated(self) -> int:
        return sum(1 for r in self._results if r.status == Trial.TERMINATED)

    def get_best_result(self, metric: str | None = None, mode: str | None = None,
                        scope: str = "last", filter_nan_and_inf: bool = True) -> Result:
        """The trial with the best ``metric`` (its last value, or with ``scope``
        its best ("all") or average ("avg", "last-5-avg", "last-10-avg"))."""
        metric = metric or self._metric
        mode = mode or self._mode
        if not metric:
            raise ValueError("No metric is provided: pass metric= to get_best_result, or set "
                             "tune.TuneConfig(metric=...) on the Tuner")
        if not mode:
            raise ValueError("No mode is provided: pass mode='min' or 'max' to "
                             "get_best_result, or set tune.TuneConfig(mode=...) on the Tuner")
        if mode not in ("min", "max"):
            raise ValueError(f"mode must be 'min' or 'max', got {mode!r}")
        if scope not in _SCOPES:
            raise ValueError(f"scope must be one of {_SCOPES}, got {scope!r}")
        best, best_score = None, None
        for result in self._results:
            score = self._score(result, metric, mode, scope)
            if score is None or (filter_nan_and_inf and not math.isfinite(score)):
                continue
            better = best_score is None or (score > best_score if mode == "max"
                                            else score < best_score)
            if better:
                best, best_score = result, score
        if best is None:
            raise RuntimeError(f"No best trial found for the metric {metric!r}: no trial "
                               f"reported it (or every value was NaN/inf). Reported metrics: "
                               f"{sorted(self._reported_keys())}")
        return best

    def _reported_keys(self) -> set:
        keys: set = set()
        for result in self._results:
            keys.update(k for k in result.metrics if k != "config")
        return keys

    def _score(self, result: Result, metric: str, mode: str, scope: str) -> float | None:
        if scope == "last":
            value = result.metrics.get(metric)
            return float(value) if isinstance(value, (int, float)) else None
        history = result._history(metric)
        if not history:
            return None
        if scope == "all":
            return max(history) if mode == "max" else min(history)
        if scope != "avg":
            history = history[-int(scope.split("-")[1]):]
        return sum(history) / len(history)

    def get_dataframe(self, filter_metric: str | None = None,
                      filter_mode: str | None = None) -> Any:
        """One row per trial: its last result (or, with ``filter_metric`` and
        ``filter_mode``, its best one), config as ``config/<key>`` columns."""
        pandas = _pandas()
        if (filter_metric is None) != (filter_mode is None):
            raise ValueError("get_dataframe needs both filter_metric and filter_mode, or "
                             "neither")
        rows = []
        for result in self._results:
            row = dict(result.metrics)
            if filter_metric is not None:
                history = [r for r in read_results(result.path)
                           if isinstance(r.get(filter_metric), (int, float))]
                if history:
                    pick = max if filter_mode == "max" else min
                    row = pick(history, key=lambda r: r[filter_metric])
            row = dict(row)
            row.pop("config", None)
            flat = flatten(row)
            flat.update({f"config/{k}": v for k, v in flatten(result.config).items()})
            flat["logdir"] = result.path
            flat["status"] = result.status
            flat.setdefault("trial_id", result.trial_id)
            rows.append(flat)
        return pandas.DataFrame(rows)

    def __repr__(self) -> str:
        return (f"ResultGrid<{len(self)} results, {self.num_terminated} terminated, "
                f"{self.num_errors} errors>")


ResultGrid.__module__ = "tray.tune"
