"""``Trial``: one run of the trainable with one config, as the controller sees it.

A trial lives in the controller actor; schedulers and searchers read it
(``trial_id``, ``config``, ``status``, ``last_result``, ``checkpoint``) and
the controller alone changes it. Its status moves
PENDING -> RUNNING -> (PAUSED -> PENDING ->) TERMINATED or ERROR; a failed
attempt within ``max_failures`` goes back to PENDING and resumes from its
latest checkpoint.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class CheckpointRecord:
    """A checkpoint persisted under the trial's directory."""
    path: str
    index: int
    training_iteration: int
    time_total_s: float
    metrics: dict


@dataclass(eq=False)
class Trial:
    PENDING = "PENDING"
    RUNNING = "RUNNING"
    PAUSED = "PAUSED"
    TERMINATED = "TERMINATED"
    ERROR = "ERROR"

    trial_id: str
    index: int
    config: dict
    resolved: dict  # the sampled parameters, flattened ("a/b"), for tables and tags
    experiment_tag: str
    dirname: str
    resources: dict  # tray actor options: num_cpus, num_gpus, resources, memory
    status: str = PENDING
    last_result: dict = field(default_factory=dict)
    num_failures: int = 0
    attempt: int = 0  # bumped at every start: calls from an older attempt are stale
    runner_id: int | None = None
    checkpoints: list[CheckpointRecord] = field(default_factory=list)
    restore_from: CheckpointRecord | None = None  # where the next start resumes
    next_checkpoint_index: int = 0
    error: str | None = None  # the last failure, as text (traceback included)
    error_object: Any = None  # the exception itself, when it pickles
    stopped_early: bool = False  # stopped by a scheduler or a stop criterion
    stop_requested: str | None = None  # "stop" / "pause", applied at the next report
    # The next start drops results and checkpoints its lost past wrote beyond the
    # checkpoint it resumes from; False only right after a PBT exploit.
    truncate_history: bool = True

    @property
    def checkpoint(self) -> CheckpointRecord | None:
        """Where this trial resumes: its latest checkpoint, or the donor's after
        a PBT exploit (until it saves one of its own)."""
        return self.restore_from

    @property
    def is_finished(self) -> bool:
        return self.status in (Trial.TERMINATED, Trial.ERROR)

    def __str__(self) -> str:
        return self.dirname

    def __repr__(self) -> str:
        return f"Trial({self.trial_id}, {self.status})"

    def __hash__(self) -> int:
        return hash(self.trial_id)


Trial.__module__ = "tray.tune.experiment"
