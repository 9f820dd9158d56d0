"""The run directory: ``storage_path/name/``.

The driver is its only writer, apart from the workers' staging directories
and the collector's rename of a staging directory into ``checkpoint_NNNNNN``
(see ``_session``). It holds:

* ``checkpoint_NNNNNN/``: the checkpoints, numbered in report order across
  attempts; with ``CheckpointConfig.num_to_keep`` the others are deleted
  as new ones arrive (the latest always stays too: restarts resume from it);
* ``result.json``: a JSON line per report (rank 0's metrics, plus
  ``training_iteration``, ``time_this_iter_s``, ``time_total_s``,
  ``attempt``, ``checkpoint_dir_name``), readable with pandas;
* ``error.txt`` when the run failed for good.

A directory that already holds checkpoints (a run of the same name before)
keeps them: this run numbers its checkpoints after theirs, and
``num_to_keep`` applies to this run's only, so ``resume_from_checkpoint``
may point into the same directory.

Before each attempt the driver removes what a lost attempt left behind:
staging directories, and checkpoints numbered past those it recorded (a
collector that committed one and died before the driver heard of it) —
the next attempt would write those numbers again.
"""

from __future__ import annotations

import json
import math
import os
import shutil
from dataclasses import dataclass, field

from ._session import STAGING_PREFIX
from .checkpoint import Checkpoint
from .config import CheckpointConfig

CHECKPOINT_PREFIX = "checkpoint_"
RESULT_FILE = "result.json"
ERROR_FILE = "error.txt"


def checkpoint_index(name: str) -> int | None:
    if not name.startswith(CHECKPOINT_PREFIX):
        return None
    digits = name[len(CHECKPOINT_PREFIX):]
    return int(digits) if digits.isdigit() else None


def _json_default(value):
    if hasattr(value, "tolist"):
        return value.tolist()
    if hasattr(value, "item"):
        return value.item()
    return repr(value)


def _finite(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None  # JSON has no NaN; pandas reads None back as NaN
    return value


@dataclass
class CheckpointRecord:
    index: int
    path: str
    metrics: dict = field(default_factory=dict)
    training_iteration: int = 0

    @property
    def checkpoint(self) -> Checkpoint:
        return Checkpoint(self.path)


class RunStorage:
    """Checkpoint bookkeeping and result files of one ``fit()``."""

    def __init__(self, run_dir: str, checkpoint_config: CheckpointConfig) -> None:
        self.run_dir = run_dir
        self.config = checkpoint_config
        os.makedirs(run_dir, exist_ok=True)
        existing = [checkpoint_index(name) for name in os.listdir(run_dir)]
        self.next_index = 1 + max((i for i in existing if i is not None), default=-1)
        self.first_index = self.next_index
        self.kept: list[CheckpointRecord] = []  # in index order
        self.latest: CheckpointRecord | None = None
        self.rows: list[dict] = []

    def begin_attempt(self) -> None:
        for name in sorted(os.listdir(self.run_dir)):
            index = checkpoint_index(name)
            stale = name.startswith(STAGING_PREFIX) or (
                index is not None and index >= self.next_index)
            if stale:
                shutil.rmtree(os.path.join(self.run_dir, name), ignore_errors=True)

    def add(self, row: dict, metrics: dict, checkpoint_path: str | None) -> None:
        """Record one completed report (``row``: metrics and bookkeeping)."""
        if checkpoint_path is not None:
            index = checkpoint_index(os.path.basename(checkpoint_path))
            assert index == self.next_index, (index, self.next_index)
            record = CheckpointRecord(index, checkpoint_path, dict(metrics),
                                      row.get("training_iteration", 0))
            self.kept.append(record)
            self.latest = record
            self.next_index = index + 1
            self._prune()
        row["checkpoint_dir_name"] = os.path.basename(checkpoint_path) if checkpoint_path \
            else None
        self.rows.append(row)
        text = json.dumps({k: _finite(v) for k, v in row.items()}, default=_json_default)
        with open(os.path.join(self.run_dir, RESULT_FILE), "a", encoding="utf-8") as file:
            file.write(text + "\n")

    def _score(self, record: CheckpointRecord) -> tuple:
        """Sort key, worst first: (has the score, score in max order, index)."""
        attribute = self.config.checkpoint_score_attribute
        if attribute is None:
            return (True, 0.0, record.index)
        value = record.metrics.get(attribute)
        if not isinstance(value, (int, float)) or isinstance(value, bool) or value != value:
            return (False, 0.0, record.index)  # missing or NaN: the worst
        signed = value if self.config.checkpoint_score_order == "max" else -value
        return (True, signed, record.index)

    def _prune(self) -> None:
        """Keep the ``num_to_keep`` best; the latest stays too, even when it is
        not among them (then one more is on storage), as in Ray."""
        keep = self.config.num_to_keep
        if keep is None or len(self.kept) <= keep:
            return
        ranked = sorted(self.kept, key=self._score)  # worst first
        for record in ranked[:len(ranked) - keep]:
            if record is self.latest:
                continue
            self.kept.remove(record)
            shutil.rmtree(record.path, ignore_errors=True)

    def best_checkpoints(self) -> list[tuple[Checkpoint, dict]]:
        """The kept checkpoints with their metrics, worst to best (oldest to
        newest without a score attribute)."""
        return [(r.checkpoint, dict(r.metrics)) for r in sorted(self.kept, key=self._score)]

    def write_error(self, text: str) -> None:
        with open(os.path.join(self.run_dir, ERROR_FILE), "w", encoding="utf-8") as file:
            file.write(text)

    def dataframe(self):
        try:
            import pandas as pd
        except ImportError:
            return None
        return pd.DataFrame(self.rows)
