"""The actors of one attempt of a run: a ``TrainWorker`` per rank, and one
``ReportCollector``.

``TrainWorker`` is a plain actor that runs the user's training function
in one long call (``run``), so the driver that waits on that call learns
at once that a worker died (its ``run`` fails with ``ActorDiedError``) or
raised (a ``TaskError`` with the worker's traceback). ``execute`` runs a
backend's set-up function (the torch process group) before ``run``.

``ReportCollector`` is the barrier behind ``tray.train.report`` and the
driver's only window onto the reports. It is an async actor (on asyncio,
as Ray's SynchronizationActor): each rank's ``report`` call parks on an
event until every rank has made its report of the same index; the last one
to arrive completes the report — renames the staging directory into the
next ``checkpoint_NNNNNN`` and stamps the time — and wakes the others. The
driver long-polls ``poll(after)`` for completed reports. Why a separate
actor rather than letting the driver collect from the workers: a worker is
busy inside its training function and cannot answer calls, and the driver
(a plain program) cannot receive them; and why not a rank-0 thread: in the
simulator there are no threads, and an actor is the same on both backends.

Limits: at most ``RESULTS_AHEAD_MAX`` completed reports wait for the
driver; past that, reports block until it catches up (the run slows down,
nothing grows). A report index is live in at most two barriers at a time
(a rank cannot report ``k+1`` before ``k`` completed), so the barrier
table is bounded by construction.
"""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import dataclass

import tray

from . import _session
from ._session import RunInfo, TrainSession, WorkerInfo, staging_dir

RESULTS_AHEAD_MAX = 1000


class TrainWorker:
    """One rank of the worker group."""

    def ping(self) -> str:
        return tray.get_runtime_context().get_node_id()

    def execute(self, function, *args):
        """Run a backend's set-up or tear-down step in this worker."""
        return function(*args)

    def run(self, train_fn, config, takes_config: bool, worker: WorkerInfo, run: RunInfo,
            collector, shards: dict) -> int:
        """Run the training function; returns how many reports it made."""
        session = TrainSession(worker, run, collector, shards)
        token = _session._current.set(session)
        try:
            if takes_config:
                train_fn(dict(config) if config is not None else {})
            else:
                train_fn()
        finally:
            _session._current.reset(token)
        collector.finished.remote(worker.world_rank, session.reports)
        return session.reports


TrainWorker.__module__ = "tray.train._worker"
TrainWorkerActor = tray.remote(max_restarts=0)(TrainWorker)


class _Barrier:
    """The ranks' reports of one index."""

    def __init__(self) -> None:
        self.arrived: dict[int, bool] = {}  # rank -> brought checkpoint files
        self.metrics: dict | None = None
        self.done = asyncio.Event()
        self.error: str | None = None
        self.committed: str | None = None  # the checkpoint's path, once renamed


@dataclass(frozen=True)
class CollectorStatistics:
    barriers_open: int  # report indexes some ranks have made and others not yet
    ranks_waiting: int  # ranks parked in a barrier
    completed_waiting: int  # completed reports the driver has not taken
    taken: int  # reports the driver has taken
    finished_ranks: int


class ReportCollector:
    """The report barrier and the driver's queue of completed reports."""

    def __init__(self, world_size: int, run_dir: str, attempt: int,
                 first_checkpoint_index: int) -> None:
        self.world_size = world_size
        self.run_dir = run_dir
        self.attempt = attempt
        self.next_checkpoint_index = first_checkpoint_index
        self.barriers: dict[int, _Barrier] = {}
        self.completed: list[dict] = []  # reports the driver has not taken yet
        self.taken = 0  # the driver has every report below this index
        self.finished_reports: dict[int, int] = {}  # rank -> reports made, once its function returned
        self._changed = asyncio.Event()

    async def statistics(self) -> CollectorStatistics:
        return CollectorStatistics(
            barriers_open=len(self.barriers),
            ranks_waiting=sum(len(b.arrived) for b in self.barriers.values()),
            completed_waiting=len(self.completed), taken=self.taken,
            finished_ranks=len(self.finished_reports))

    async def ping(self) -> float:
        """The collector's clock (virtual in the simulator): when the attempt began."""
        return time.time()

    def _wake(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    async def report(self, rank: int, index: int, metrics: dict | None,
                     has_checkpoint: bool) -> str | None:
        """Rank ``rank``'s report ``index``: returns once every rank has made
        it, with the committed checkpoint's path (or None)."""
        for other, count in sorted(self.finished_reports.items()):
            if count <= index:
                raise RuntimeError(self._mismatch(other, count, index))
        barrier = self.barriers.setdefault(index, _Barrier())
        assert rank not in barrier.arrived, f"rank {rank} reported index {index} twice"
        barrier.arrived[rank] = has_checkpoint
        if rank == 0:
            barrier.metrics = metrics
        if len(barrier.arrived) == self.world_size:
            # Backpressure: the driver is too far behind; wait before completing.
            while index - self.taken >= RESULTS_AHEAD_MAX:
                changed = self._changed
                await changed.wait()
            self._complete(index, barrier)
        else:
            await barrier.done.wait()
        if barrier.error is not None:
            raise RuntimeError(barrier.error)
        return barrier.committed

    def _complete(self, index: int, barrier: _Barrier) -> None:
        committed = None
        if any(barrier.arrived.values()):
            staging = staging_dir(self.run_dir, self.attempt, index)
            name = f"checkpoint_{self.next_checkpoint_index:06d}"
            target = os.path.join(self.run_dir, name)
            try:
                os.replace(staging, target)
            except OSError as error:
                barrier.error = (f"tray.train.report(): could not move the checkpoint of "
                                 f"report {index} into place ({staging} -> {target}): {error}")
            else:
                committed = target
                self.next_checkpoint_index += 1
        barrier.committed = committed
        if barrier.error is None:
            self.completed.append({"index": index, "metrics": barrier.metrics or {},
                                   "checkpoint": committed, "time": time.time()})
        barrier.done.set()
        self.barriers.pop(index, None)
        self._wake()

    def _mismatch(self, rank: int, count: int, index: int) -> str:
        return (f"tray.train.report(): rank {rank} returned from its training function "
                f"after {count} report(s) while another rank made report #{index + 1}: every "
                f"worker must call tray.train.report() the same number of times")

    async def finished(self, rank: int, reports: int) -> None:
        """Rank ``rank``'s training function returned after ``reports``
        reports: ranks waiting for a report it will never make fail now."""
        self.finished_reports[rank] = reports
        for index, barrier in sorted(self.barriers.items()):
            if index >= reports and not barrier.done.is_set():
                barrier.error = self._mismatch(rank, reports, index)
                barrier.done.set()
        self._wake()

    async def poll(self, after: int, wait: bool = True) -> dict:
        """The completed reports from index ``after`` on (the driver has the
        earlier ones); with ``wait``, blocks until there is one or every
        rank has finished."""
        if after > self.taken:
            self.taken = after
            self.completed = [r for r in self.completed if r["index"] >= after]
            self._wake()  # reports held back by RESULTS_AHEAD_MAX may go on
        while wait and not self.completed and len(self.finished_reports) < self.world_size:
            changed = self._changed
            await changed.wait()
        return {"results": list(self.completed),
                "all_finished": len(self.finished_reports) == self.world_size}


ReportCollector.__module__ = "tray.train._worker"
ReportCollectorActor = tray.remote(ReportCollector)
