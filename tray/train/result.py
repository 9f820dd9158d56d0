"""``Result``: what ``fit()`` returns (Ray Train's fields, plus the restarts)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .checkpoint import Checkpoint


@dataclass
class Result:
    """The outcome of a training run.

    ``metrics``: rank 0's last reported metrics; ``checkpoint``: the latest
    checkpoint; ``error``: the ``TrainingFailedError`` if the run failed
    (``fit()`` raises it too); ``path``: the run directory;
    ``metrics_dataframe``: every report (a pandas DataFrame, one row per
    report, with ``training_iteration``, ``attempt`` and the checkpoint's
    directory name); ``best_checkpoints``: ``(checkpoint, metrics)`` of the
    checkpoints kept on storage, worst to best by
    ``CheckpointConfig.checkpoint_score_attribute`` (oldest to newest
    without one); ``num_restarts``: how many times the worker group was
    restarted after a failure.
    """
    metrics: dict | None
    checkpoint: Checkpoint | None
    error: BaseException | None
    path: str
    metrics_dataframe: Any = None
    best_checkpoints: list = field(default_factory=list)
    num_restarts: int = 0

    def get_best_checkpoint(self, metric: str, mode: str) -> Checkpoint | None:
        """The kept checkpoint with the best ``metric`` (``mode`` "max"/"min")."""
        if mode not in ("max", "min"):
            raise ValueError(f"mode must be 'max' or 'min', got {mode!r}")
        scored = [(m[metric], c) for c, m in self.best_checkpoints
                  if isinstance(m.get(metric), (int, float)) and m[metric] == m[metric]]
        if not scored:
            return None
        pick = max if mode == "max" else min
        return pick(scored, key=lambda pair: pair[0])[1]

    def __repr__(self) -> str:
        error = f", error={type(self.error).__name__}" if self.error is not None else ""
        return (f"Result(metrics={self.metrics}, checkpoint={self.checkpoint}, "
                f"path={self.path!r}, num_restarts={self.num_restarts}{error})")


Result.__module__ = "tray.train"
