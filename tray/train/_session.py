"""The worker's side of a run: ``tray.train.report``, ``get_context``,
``get_checkpoint`` and ``get_dataset_shard``.

Every worker runs the user's ``train_loop_per_worker`` inside one call of
its actor (``TrainWorker.run``); the session lives in a ``ContextVar`` for
the length of that call. In the simulator all workers share one OS process,
each call in a trio task of its own with its own context, so a
module-level global would mix the workers up; a ``ContextVar`` does not.

``report`` is collective, as Ray Train's: every worker calls it the same
number of times. A worker first copies its checkpoint files (if it has any)
into the report's staging directory under the run directory — every rank
into the same one, so a checkpoint may be sharded across ranks — then tells
the run's ``ReportCollector`` and waits there until all ranks have reported
(a barrier). The collector then turns the staging directory into the next
``checkpoint_NNNNNN`` and releases everyone, so when ``report`` returns the
checkpoint is on storage, complete, under its final name: a worker that
dies a moment later costs at most the steps since that report.
"""

from __future__ import annotations

import contextvars
import json
import os
import shutil
from dataclasses import dataclass
from typing import Any

import tray
from tray.exceptions import TaskError

from .checkpoint import Checkpoint

# A report's metrics travel to the driver and into result.json; one report
# may not hold more than this (put large objects in a checkpoint).
METRICS_BYTES_MAX = 1_000_000

STAGING_PREFIX = ".staging_"


def staging_dir(run_dir: str, attempt: int, index: int) -> str:
    """Where the ranks put report ``index``'s checkpoint files in ``attempt``,
    before the collector renames it into place."""
    return os.path.join(run_dir, f"{STAGING_PREFIX}{attempt:04d}_{index:06d}")


@dataclass(frozen=True)
class WorkerInfo:
    """One worker's place in the group."""
    world_rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    node_rank: int
    node_id: str


@dataclass(frozen=True)
class RunInfo:
    """What every worker of one attempt shares."""
    experiment_name: str
    trial_name: str
    trial_id: str
    run_dir: str
    attempt: int
    restore_path: str | None


class TrainSession:
    """What ``report`` and friends need, for the worker running in this context."""

    def __init__(self, worker: WorkerInfo, run: RunInfo, collector, shards: dict) -> None:
        self.worker = worker
        self.run = run
        self.collector = collector
        self.shards = shards
        self.reports = 0
        self.checkpoint = Checkpoint(run.restore_path) if run.restore_path else None

    def report(self, metrics: dict, checkpoint: Checkpoint | None) -> None:
        index = self.reports
        if checkpoint is not None:
            staging = staging_dir(self.run.run_dir, self.run.attempt, index)
            # Every rank merges its files into the same directory (a sharded
            # checkpoint); files of the same name from two ranks: the last wins.
            shutil.copytree(checkpoint.path, staging, dirs_exist_ok=True)
        payload = metrics if self.worker.world_rank == 0 else None
        try:
            committed = tray.get(self.collector.report.remote(
                self.worker.world_rank, index, payload, checkpoint is not None))
        except TaskError as error:
            # The collector refused the report (ranks disagree on their count):
            # raise here, so the traceback shows the user's report() call.
            raise RuntimeError(str(error.cause)) from None
        self.reports += 1
        if committed is not None:
            self.checkpoint = Checkpoint(committed)


_current: contextvars.ContextVar[TrainSession | None] = contextvars.ContextVar(
    "tray_train_session", default=None)


def current_session() -> TrainSession | None:
    return _current.get()


def _session(what: str) -> TrainSession:
    session = _current.get()
    if session is None:
        raise RuntimeError(f"tray.train.{what}() can only be called inside a training "
                           f"function, in the workers that a tray.train trainer's fit() starts")
    return session


def _check_metrics(metrics: Any) -> None:
    if not isinstance(metrics, dict):
        raise TypeError(f"tray.train.report() takes a dict of metrics, got "
                        f"{type(metrics).__name__}")
    for key in metrics:
        if not isinstance(key, str):
            raise TypeError(f"tray.train.report(): metric names are strings, got {key!r}")
    size = len(json.dumps(metrics, default=repr))
    if size > METRICS_BYTES_MAX:
        raise ValueError(f"tray.train.report(): these metrics are {size} bytes as JSON; the "
                         f"limit is {METRICS_BYTES_MAX}: report scalars, and put large "
                         f"objects in a checkpoint")


# ================================================================ public API

def report(metrics: dict, *, checkpoint: Checkpoint | None = None) -> None:
    """Report this step's ``metrics`` (rank 0's become the run's) and,
    optionally, a checkpoint directory to resume from. Every worker must
    call ``report`` the same number of times: it returns once all have, and
    the checkpoint (the files of every rank that passed one) is on storage."""
    session = _session("report")
    _check_metrics(metrics)
    if checkpoint is not None and not isinstance(checkpoint, Checkpoint):
        raise TypeError(f"checkpoint must be a tray.train.Checkpoint "
                        f"(Checkpoint.from_directory(path)), got {type(checkpoint).__name__}")
    if checkpoint is not None and not os.path.isdir(checkpoint.path):
        raise ValueError(f"tray.train.report(): the checkpoint directory {checkpoint.path!r} "
                         f"does not exist (report before deleting it: report copies it)")
    session.report(metrics, checkpoint)


def get_checkpoint() -> Checkpoint | None:
    """The checkpoint to resume from: the run's latest one when the group
    was restarted after a failure (or ``resume_from_checkpoint`` at the
    start), then the latest this run reported; None on a fresh start."""
    return _session("get_checkpoint").checkpoint


def get_dataset_shard(dataset_name: str = "train"):
    """This worker's share of ``datasets[dataset_name]``: a
    ``tray.data.DataIterator`` (``iter_batches``, ``iter_torch_batches``,
    ``iter_rows``); each pass over it is one epoch of this worker's share."""
    session = _session("get_dataset_shard")
    if dataset_name not in session.shards:
        known = ", ".join(repr(name) for name in session.shards) or "none"
        raise KeyError(f"tray.train.get_dataset_shard({dataset_name!r}): the trainer has no "
                       f"dataset of that name (datasets: {known})")
    return session.shards[dataset_name]


class TrainContext:
    """Where this worker stands in the run (``tray.train.get_context()``)."""

    def __init__(self, session: TrainSession) -> None:
        self._worker = session.worker
        self._run = session.run

    def get_world_rank(self) -> int:
        return self._worker.world_rank

    def get_world_size(self) -> int:
        return self._worker.world_size

    def get_local_rank(self) -> int:
        """This worker's rank among the workers on its node."""
        return self._worker.local_rank

    def get_local_world_size(self) -> int:
        return self._worker.local_world_size

    def get_node_rank(self) -> int:
        """The rank of this worker's node among the run's nodes."""
        return self._worker.node_rank

    def get_experiment_name(self) -> str:
        return self._run.experiment_name

    def get_trial_name(self) -> str:
        """The Tune trial's name when the trainer runs as a trial, else the run's name."""
        return self._run.trial_name

    def get_trial_id(self) -> str:
        return self._run.trial_id

    def get_trial_dir(self) -> str:
        """The run's directory on storage (checkpoints and result.json)."""
        return self._run.run_dir

    def __repr__(self) -> str:
        w = self._worker
        return (f"TrainContext(world_rank={w.world_rank}, world_size={w.world_size}, "
                f"local_rank={w.local_rank}, node_rank={w.node_rank})")


def get_context() -> TrainContext:
    return TrainContext(_session("get_context"))


for _obj in (report, get_checkpoint, get_dataset_shard, get_context, TrainContext):
    _obj.__module__ = "tray.train"
del _obj
