"""The experiment's settings: ``TuneConfig``, ``RunConfig``,
``CheckpointConfig`` and ``FailureConfig`` (Ray Tune 2.x names and defaults).

Each validates itself when built, so a wrong value fails where it was
written, with its name, rather than inside a trial.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


def check_int(name: str, value: Any, minimum: int, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")


@dataclass
class CheckpointConfig:
    """Which checkpoints a trial keeps: the ``num_to_keep`` best by
    ``checkpoint_score_attribute`` (or the most recent, without one; None
    keeps all). ``checkpoint_frequency`` and ``checkpoint_at_end`` apply to
    class trainables (function trainables checkpoint when they report one)."""
    num_to_keep: int | None = None
    checkpoint_score_attribute: str | None = None
    checkpoint_score_order: str = "max"
    checkpoint_frequency: int = 0
    checkpoint_at_end: bool | None = None

    def __post_init__(self) -> None:
        check_int("CheckpointConfig.num_to_keep", self.num_to_keep, 1, allow_none=True)
        check_int("CheckpointConfig.checkpoint_frequency", self.checkpoint_frequency, 0)
        if self.checkpoint_score_order not in ("min", "max"):
            raise ValueError(f"CheckpointConfig.checkpoint_score_order must be 'min' or "
                             f"'max', got {self.checkpoint_score_order!r}")


@dataclass
class FailureConfig:
    """``max_failures``: how many times a failed trial is retried from its
    latest checkpoint (-1: always); ``fail_fast``: end the experiment at the
    first trial error (``"raise"``: and raise that error from ``fit()``)."""
    max_failures: int = 0
    fail_fast: bool | str = False

    def __post_init__(self) -> None:
        check_int("FailureConfig.max_failures", self.max_failures, -1)
        if self.fail_fast not in (True, False, "raise"):
            raise ValueError(f"FailureConfig.fail_fast must be True, False or 'raise', got "
                             f"{self.fail_fast!r}")


@dataclass
class RunConfig:
    """Where results go (``storage_path/name/``), when trials stop (``stop``: a
    dict of metric thresholds, a function ``(trial_id, result) -> bool`` or a
    ``tune.stopper.Stopper``), checkpoints, failures and verbosity (0 silent,
    1 progress table, 2 also a line per finished trial)."""
    name: str | None = None
    storage_path: str | None = None
    stop: dict | Callable | Any = None
    checkpoint_config: CheckpointConfig | None = None
    failure_config: FailureConfig | None = None
    verbose: int = 1
    progress_interval_s: float = 5.0

    def __post_init__(self) -> None:
        if self.name is not None and (not isinstance(self.name, str) or not self.name
                                      or "/" in self.name or self.name in (".", "..")):
            raise ValueError(f"RunConfig.name must be a plain directory name, got "
                             f"{self.name!r}")
        if self.checkpoint_config is None:
            self.checkpoint_config = CheckpointConfig()
        if self.failure_config is None:
            self.failure_config = FailureConfig()
        if not isinstance(self.checkpoint_config, CheckpointConfig):
            raise ValueError("RunConfig.checkpoint_config must be a tune.CheckpointConfig")
        if not isinstance(self.failure_config, FailureConfig):
            raise ValueError("RunConfig.failure_config must be a tune.FailureConfig")
        if self.verbose not in (0, 1, 2, 3):
            raise ValueError(f"RunConfig.verbose must be 0, 1, 2 or 3, got {self.verbose!r}")
        if not self.progress_interval_s > 0:
            raise ValueError("RunConfig.progress_interval_s must be positive")


@dataclass
class TuneConfig:
    """What to optimize and how: ``metric``/``mode`` (``"min"`` or ``"max"``),
    ``num_samples`` (repeats of the param_space's grid; with a search
    algorithm, the number of trials), ``search_alg``, ``scheduler``,
    ``max_concurrent_trials``, ``time_budget_s`` and ``reuse_actors``
    (class trainables: reuse the Trainable through ``reset_config``)."""
    metric: str | None = None
    mode: str | None = None
    search_alg: Any = None
    scheduler: Any = None
    num_samples: int = 1
    max_concurrent_trials: int | None = None
    time_budget_s: float | None = None
    reuse_actors: bool = False
    trial_dirname_creator: Callable | None = None

    def __post_init__(self) -> None:
        if self.mode is not None and self.mode not in ("min", "max"):
            raise ValueError(f"TuneConfig.mode must be 'min' or 'max', got {self.mode!r}")
        if self.metric is not None and not isinstance(self.metric, str):
            raise ValueError(f"TuneConfig.metric must be a string, got {self.metric!r}")
        check_int("TuneConfig.num_samples", self.num_samples, -1)
        if self.num_samples == 0:
            raise ValueError("TuneConfig.num_samples must be positive (or -1: until the "
                             "time budget runs out)")
        check_int("TuneConfig.max_concurrent_trials", self.max_concurrent_trials, 1,
                   allow_none=True)
        if self.time_budget_s is not None and not self.time_budget_s > 0:
            raise ValueError(f"TuneConfig.time_budget_s must be positive, got "
                             f"{self.time_budget_s!r}")
        if self.num_samples == -1 and self.time_budget_s is None:
            raise ValueError("TuneConfig.num_samples=-1 (sample forever) needs a "
                             "time_budget_s")
