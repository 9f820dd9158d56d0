"""``DataParallelTrainer``: one training function on N workers, with
checkpoints and restarts.

``fit()`` is the run's controller, and it runs where ``fit()`` is called:
in the driver, or in a Tune trial's runner actor when the trainer is a
trial. Ray Train 2.x moved its controller into an actor so that the
driver only waits; here the controller is plain code over refs and actors
— placing the group, waiting on the workers' ``run`` calls and on the
collector's ``poll``, restarting — which keeps it where the simulator can
drive it under faults, and in the driver it costs nothing extra: the
driver would wait anyway.

One attempt, step by step:

1. remove what a lost attempt left on storage (``_storage``);
2. place the worker group (one placement group: all workers or none) and
   start the actors and the report collector, within
   ``WORKER_GROUP_START_TIMEOUT_S`` (``TRAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S``);
3. the backend's set-up (TorchTrainer: the torch process group);
4. split each dataset for the workers (``streaming_split(n, equal=True)``);
5. start ``run`` on every worker, then wait on those calls and on the
   collector's long ``poll`` at once: each completed report is written to
   ``result.json``, its checkpoint recorded (and old ones pruned to
   ``num_to_keep``), a progress row printed, and — for a Tune trial —
   passed to ``tune.report``;
6. when every ``run`` returned, collect the last reports and tear down.

A ``run`` that fails (the worker died: ``ActorDiedError``; the training
function raised: a ``TaskError`` with the worker's traceback) fails the
attempt: the driver takes the reports that completed before it, waits a
moment for the other ranks' errors (a surviving rank often fails too, on a
collective with the dead one; the dead one is named first), tears the whole
group down, and — within ``FailureConfig.max_failures`` — starts the next
attempt from the latest checkpoint. Each failure counts once, whatever
failed: a worker or the collector.

A group that does not start in time (the cluster lacks the resources: other
work holds them, or the group is larger than the cluster of the moment) is
scheduled again, as Ray Train's controller does, within
``FailureConfig.controller_failure_limit`` (unlimited by default), with a
warning each time saying what is missing: a run waits for resources. Only a
group no node could ever hold (no alive node and no autoscaler node type
fits one worker) fails ``fit()`` at once.
"""

from __future__ import annotations

import copy
import datetime
import inspect
import logging
import os
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import tray
from tray.exceptions import NotInitializedError, TaskError, TrayError

from ._progress import Progress
from ._session import RunInfo
from ._storage import RunStorage
from ._worker_group import WorkerGroup, feasibility_error, shortfall
from .checkpoint import Checkpoint
from .config import RunConfig, ScalingConfig
from .error import TrainingFailedError, WorkerGroupStartError
from .result import Result

WORKER_GROUP_START_TIMEOUT_S = float(
    os.environ.get("TRAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S", "60"))
# After a worker's failure, how long to wait for the other ranks' errors.
FAILURE_GATHER_S = 2.0
# How long to wait for the reports a failed attempt completed.
DRAIN_TIMEOUT_S = 5.0
DEFAULT_STORAGE_PATH = os.path.join("~", "tray_results")

logger = logging.getLogger(__name__)


def _autoscaler_node_types() -> list[dict]:
    """The resources of the node types a running autoscaler may launch."""
    from tray.autoscaler import read_status

    status = read_status() or {}
    return list(status.get("node_types", {}).values())


def _on_simulator() -> bool:
    """Whether this process runs a simulated cluster (every worker in it)."""
    import tray.simtest

    return tray.simtest.is_simulated()


def _takes_config(function: Callable) -> bool:
    try:
        parameters = list(inspect.signature(function).parameters.values())
    except (TypeError, ValueError):
        return True
    positional = [p for p in parameters if p.kind in (p.POSITIONAL_ONLY,
                                                      p.POSITIONAL_OR_KEYWORD)]
    required = [p for p in positional if p.default is p.empty]
    if any(p.kind == p.VAR_POSITIONAL for p in parameters):
        return True
    if len(required) > 1 or (not positional and any(
            p.kind == p.KEYWORD_ONLY and p.default is p.empty for p in parameters)):
        raise ValueError(f"train_loop_per_worker takes no argument or one (the "
                         f"train_loop_config dict), but {getattr(function, '__name__', function)}"
                         f"{inspect.signature(function)} needs more")
    return len(positional) >= 1


def _describe_failure(rank: int, world_size: int, error: BaseException) -> str:
    if isinstance(error, TaskError):
        cause = error.cause
        kind = type(cause).__name__ if cause is not None else "an error"
        return (f"worker rank {rank} (of {world_size}) raised {kind} in the training "
                f"function:\n{error.traceback_str.rstrip()}")
    return f"worker rank {rank} (of {world_size}) died: {type(error).__name__}: {error}"


class _Failure:
    """Why an attempt failed."""

    def __init__(self, summary: str, worker_failures: dict, cause: BaseException | None,
                 scheduling: bool = False):
        self.summary = summary
        self.worker_failures = worker_failures
        self.cause = cause
        self.scheduling = scheduling  # the group did not start in time


class DataParallelTrainer:
    """Runs ``train_loop_per_worker`` on ``scaling_config.num_workers``
    workers (Ray Train's ``DataParallelTrainer``).

    The function takes no argument or ``train_loop_config``; inside it,
    ``tray.train.report``, ``get_context``, ``get_checkpoint`` and
    ``get_dataset_shard`` work. ``datasets`` are ``tray.data`` datasets,
    split among the workers; ``resume_from_checkpoint`` is where the first
    attempt starts from. ``fit()`` returns a ``Result`` or raises
    ``TrainingFailedError``. A trainer is also a Tune trainable:
    ``tune.Tuner(trainer, param_space={"train_loop_config": {...}})``.
    """

    _kind = "DataParallelTrainer"

    def __init__(self, train_loop_per_worker: Callable, *, train_loop_config: dict | None = None,
                 scaling_config: ScalingConfig | None = None,
                 run_config: RunConfig | None = None, datasets: dict | None = None,
                 resume_from_checkpoint: Checkpoint | None = None) -> None:
        if not callable(train_loop_per_worker):
            raise TypeError(f"train_loop_per_worker must be a function, got "
                            f"{train_loop_per_worker!r}")
        self._takes_config = _takes_config(train_loop_per_worker)
        if train_loop_config is not None and not isinstance(train_loop_config, dict):
            raise TypeError(f"train_loop_config must be a dict, got "
                            f"{type(train_loop_config).__name__}")
        scaling_config = scaling_config if scaling_config is not None else ScalingConfig()
        if not isinstance(scaling_config, ScalingConfig):
            raise TypeError(f"scaling_config must be a tray.train.ScalingConfig, got "
                            f"{type(scaling_config).__name__}")
        run_config = run_config if run_config is not None else RunConfig()
        if not isinstance(run_config, RunConfig):
            raise TypeError(f"run_config must be a tray.train.RunConfig, got "
                            f"{type(run_config).__module__}.{type(run_config).__name__}")
        datasets = dict(datasets or {})
        for name, dataset in datasets.items():
            if not isinstance(name, str) or not hasattr(dataset, "streaming_split"):
                raise TypeError(f"datasets maps names to tray.data datasets; "
                                f"{name!r} is {type(dataset).__name__}")
        if resume_from_checkpoint is not None and not isinstance(resume_from_checkpoint,
                                                                 Checkpoint):
            raise TypeError(f"resume_from_checkpoint must be a tray.train.Checkpoint, got "
                            f"{type(resume_from_checkpoint).__name__}")
        self.train_loop_per_worker = train_loop_per_worker
        self.train_loop_config = train_loop_config
        self.scaling_config = scaling_config
        self.run_config = run_config
        self.datasets = datasets
        self.resume_from_checkpoint = resume_from_checkpoint

    def __repr__(self) -> str:
        return (f"{type(self).__name__}({getattr(self.train_loop_per_worker, '__name__', '?')}, "
                f"num_workers={self.scaling_config.num_workers})")

    # ------------------------------------------------ backend hooks (TorchTrainer)

    def _check_backend(self, on_simulator: bool) -> None:
        """Refuse, before anything starts, what this backend cannot run."""

    def _setup_backend(self, group: WorkerGroup, timeout_s: float, on_simulator: bool) -> None:
        """Prepare the started workers (the torch process group)."""

    def _teardown_backend(self, group: WorkerGroup) -> None:
        """Undo ``_setup_backend`` on the workers after a successful run."""

    # ------------------------------------------------------------ fit

    def fit(self) -> Result:
        """Train; returns the ``Result``, or raises ``TrainingFailedError``
        (whose ``.result`` is the failed run's ``Result``)."""
        return self._fit()

    def _fit(self, *, trial: dict | None = None, report_hook: Callable | None = None) -> Result:
        if not tray.is_initialized():
            raise NotInitializedError(f"{type(self).__name__}.fit() needs a cluster: call "
                                      f"tray.init() first")
        on_simulator = _on_simulator()
        self._check_backend(on_simulator)
        problem = feasibility_error(self.scaling_config, tray.nodes(), _autoscaler_node_types())
        if problem is not None:
            raise ValueError(problem)
        return _Run(self, on_simulator, trial, report_hook).execute()

    # ------------------------------------------------------------ Tune

    def __call__(self, config: dict) -> None:
        """Run this trainer as a Tune trial: ``tune.Tuner(trainer,
        param_space={"train_loop_config": {...}, "scaling_config": {...}})``.
        Each report is a Tune result, each checkpoint a Tune checkpoint, and
        a restarted trial resumes from Tune's latest checkpoint."""
        from tray import tune

        trainer = self._for_trial(config)
        context = tune.get_context()
        restore = tune.get_checkpoint() or trainer.resume_from_checkpoint
        trainer.resume_from_checkpoint = restore
        trainer.run_config = RunConfig(
            name="train", storage_path=context.get_trial_dir(),
            checkpoint_config=trainer.run_config.checkpoint_config,
            failure_config=trainer.run_config.failure_config, verbose=0)

        def to_tune(metrics: dict, checkpoint_path: str | None) -> None:
            checkpoint = Checkpoint(checkpoint_path) if checkpoint_path else None
            tune.report(dict(metrics), checkpoint=checkpoint)

        trial = {"experiment_name": context.get_experiment_name(),
                 "trial_name": context.get_trial_name(), "trial_id": context.get_trial_id()}
        trainer._fit(trial=trial, report_hook=to_tune)

    def as_trainable(self) -> DataParallelTrainer:
        """This trainer as a Tune trainable (it already is one)."""
        return self

    def _for_trial(self, config: dict) -> DataParallelTrainer:
        unknown = sorted(set(config) - {"train_loop_config", "scaling_config"})
        if unknown:
            raise ValueError(f"a trainer's param_space takes 'train_loop_config' and "
                             f"'scaling_config'; got {unknown}: put the training function's "
                             f"hyperparameters under 'train_loop_config'")
        trainer = copy.copy(self)
        if "train_loop_config" in config:
            loop_config = config["train_loop_config"]
            if not isinstance(loop_config, dict):
                raise TypeError("param_space['train_loop_config'] must be a dict")
            trainer.train_loop_config = {**(self.train_loop_config or {}), **loop_config}
        scaling = config.get("scaling_config")
        if isinstance(scaling, dict):
            trainer.scaling_config = replace(self.scaling_config, **scaling)
        elif scaling is not None:
            if not isinstance(scaling, ScalingConfig):
                raise TypeError("param_space['scaling_config'] must be a tray.train."
                                "ScalingConfig or a dict of its fields")
            trainer.scaling_config = scaling
        return trainer


DataParallelTrainer.__module__ = "tray.train"


class _Run:
    """One ``fit()``: attempts until success or the failure budget is spent."""

    def __init__(self, trainer: DataParallelTrainer, on_simulator: bool, trial: dict | None,
                 report_hook: Callable | None) -> None:
        self.trainer = trainer
        self.on_simulator = on_simulator
        self.report_hook = report_hook
        config = trainer.run_config
        self.name = config.name or \
            f"tray_train_{datetime.datetime.now().strftime('%Y-%m-%d_%H-%M-%S')}"
        storage = os.path.expanduser(config.storage_path or DEFAULT_STORAGE_PATH)
        self.run_dir = os.path.abspath(os.path.join(storage, self.name))
        self.trial = trial or {"experiment_name": self.name, "trial_name": self.name,
                               "trial_id": self.name}
        self.storage = RunStorage(self.run_dir, config.checkpoint_config)
        self.progress = Progress(config.verbose)
        self.max_failures = config.failure_config.max_failures
        self.controller_failure_limit = config.failure_config.controller_failure_limit
        # Per report: the iteration counts on from the checkpoint a restart resumes.
        self.iteration = 0
        self.time_total_s = 0.0
        self.last_time = 0.0
        self.next_index = 0  # the next report index of the current attempt
        self.attempt = 0
        self.metrics: dict | None = None

    def execute(self) -> Result:
        trainer = self.trainer
        n = trainer.scaling_config.num_workers
        self.progress.started(type(trainer).__name__, self.name, n, self.run_dir)
        initial = trainer.resume_from_checkpoint
        restore = initial.path if initial is not None else None
        failures = scheduling_failures = 0
        failure: _Failure | None = None
        function = tray.put(trainer.train_loop_per_worker)  # pickled once for every worker
        try:
            while True:
                failure = self._attempt(function, restore)
                if failure is None:
                    break
                if failure.scheduling:
                    scheduling_failures += 1
                    limit = self.controller_failure_limit
                    if limit != -1 and scheduling_failures > limit:
                        break
                    self._waiting(failure, scheduling_failures)
                    continue
                failures += 1
                if self.max_failures != -1 and failures > self.max_failures:
                    self.progress.failure(failure.summary, None, self.max_failures, None)
                    break
                latest = self.storage.latest
                if latest is not None:
                    restore = latest.path
                    self.iteration = latest.training_iteration
                else:
                    self.iteration = 0
                self.progress.failure(failure.summary, failures, self.max_failures,
                                      os.path.basename(restore) if restore else None)
                self.attempt += 1
        finally:
            del function
        return self._result(failure)

    def _waiting(self, failure: _Failure, tries: int) -> None:
        """The group did not start: say what is missing, and try again."""
        limit = self.controller_failure_limit
        budget = "unlimited" if limit == -1 else f"of {limit}"
        missing = shortfall(self.trainer.scaling_config, tray.nodes(), tray.available_resources())
        text = (f"the worker group did not start ({failure.summary}); waiting for resources: "
                f"{missing}; scheduling it again ({tries} {budget}, FailureConfig."
                f"controller_failure_limit)")
        logger.warning("%s: %s", self.name, text)
        self.progress.waiting(text)

    def _result(self, failure: _Failure | None) -> Result:
        latest = self.storage.latest
        error = None
        if failure is not None:
            if failure.scheduling:
                message = (f"training failed: the worker group did not start, scheduled again "
                           f"FailureConfig(controller_failure_limit="
                           f"{self.controller_failure_limit}) times: {failure.summary}")
            else:
                budget = ("" if self.max_failures == 0 else
                          f" and {self.attempt} restart(s)")
                message = (f"training failed (FailureConfig(max_failures={self.max_failures})"
                           f"{budget}): {failure.summary}")
            error = TrainingFailedError(message, failure.worker_failures, self.attempt)
            if failure.cause is not None:
                error.__cause__ = failure.cause
            # What the last, lost attempt left (a staging directory, a
            # checkpoint no report recorded) goes, as before any attempt.
            self.storage.begin_attempt()
            self.storage.write_error(message)
        result = Result(metrics=self.metrics, checkpoint=latest.checkpoint if latest else None,
                        error=error, path=self.run_dir,
                        metrics_dataframe=self.storage.dataframe(),
                        best_checkpoints=self.storage.best_checkpoints(),
                        num_restarts=self.attempt)
        self.progress.finished(len(self.storage.rows), self.attempt,
                               os.path.basename(latest.path) if latest else None,
                               failed=error is not None)
        if error is not None:
            error.result = result
            raise error
        return result

    # ------------------------------------------------------------ one attempt

    def _attempt(self, function, restore: str | None) -> _Failure | None:
        trainer = self.trainer
        scaling = trainer.scaling_config
        self.storage.begin_attempt()
        self.next_index = 0
        group = WorkerGroup(scaling, run_dir=self.run_dir, attempt=self.attempt,
                            first_checkpoint_index=self.storage.next_index)
        splits: list = []
        try:
            try:
                group.start(WORKER_GROUP_START_TIMEOUT_S)
                trainer._setup_backend(group, WORKER_GROUP_START_TIMEOUT_S, self.on_simulator)
            except WorkerGroupStartError as error:
                return _Failure(str(error), {}, error, scheduling=True)
            except TrayError as error:
                return _Failure(f"the worker group did not start: {error}", {}, error)
            self.last_time = group.started_at
            n = scaling.num_workers
            shards: list[dict] = [{} for _ in range(n)]
            for name, dataset in trainer.datasets.items():
                split = dataset.streaming_split(n, equal=True)
                splits.append(split)
                for rank in range(n):
                    shards[rank][name] = split[rank]
            run = RunInfo(experiment_name=self.trial["experiment_name"],
                          trial_name=self.trial["trial_name"], trial_id=self.trial["trial_id"],
                          run_dir=self.run_dir, attempt=self.attempt, restore_path=restore)
            pending = {}
            for rank, (worker, info) in enumerate(zip(group.workers, group.infos, strict=True)):
                ref = worker.run.remote(function, trainer.train_loop_config,
                                        trainer._takes_config, info, run, group.collector,
                                        shards[rank])
                pending[ref] = rank
            return self._watch(group, pending)
        finally:
            group.shutdown()
            self._close_splits(splits)

    def _watch(self, group: WorkerGroup, pending: dict) -> _Failure | None:
        collector = group.collector
        poll = collector.poll.remote(self.next_index, True)
        while pending:
            ready, _ = tray.wait([poll, *pending], num_returns=1)
            if poll in ready:
                try:
                    answer = tray.get(poll)
                except Exception as error:  # noqa: BLE001 - the collector's actor died
                    return _Failure(f"the report collector died: {type(error).__name__}: "
                                    f"{error}", {}, error)
                self._take(answer["results"])
                poll = collector.poll.remote(self.next_index, True)
                continue
            for ref in ready:
                rank = pending.pop(ref)
                try:
                    tray.get(ref)
                except Exception as error:  # noqa: BLE001 - the worker's failure
                    return self._failed(group, pending, {rank: error})
        try:  # every run returned: its reports all completed before it did
            answer = tray.get(collector.poll.remote(self.next_index, False))
        except Exception as error:  # noqa: BLE001
            return _Failure(f"the report collector died: {type(error).__name__}: {error}",
                            {}, error)
        self._take(answer["results"])
        try:
            self.trainer._teardown_backend(group)
        except Exception:  # noqa: BLE001 - the group goes anyway
            pass
        return None

    def _failed(self, group: WorkerGroup, pending: dict, failures: dict) -> _Failure:
        """A worker failed: gather the reports that completed and the other
        ranks' errors, dead workers first."""
        try:
            answer = tray.get(group.collector.poll.remote(self.next_index, False),
                              timeout=DRAIN_TIMEOUT_S)
            self._take(answer["results"])
        except Exception:  # noqa: BLE001 - the collector went too: those reports are lost
            pass
        if pending:
            ready, _ = tray.wait(list(pending), num_returns=len(pending),
                                 timeout=FAILURE_GATHER_S)
            for ref in ready:
                try:
                    tray.get(ref)
                except Exception as error:  # noqa: BLE001
                    failures[pending[ref]] = error
        n = self.trainer.scaling_config.num_workers
        ranks = sorted(failures, key=lambda r: (isinstance(failures[r], TaskError), r))
        first = ranks[0]
        lines = [_describe_failure(first, n, failures[first])]
        for rank in ranks[1:]:  # usually a consequence (a collective with the dead rank)
            last_line = _describe_failure(rank, n, failures[rank]).rstrip().splitlines()[-1]
            lines.append(f"(then worker rank {rank}: {last_line.strip()})")
        return _Failure("\n".join(lines), failures, failures[first])

    def _take(self, results: list) -> None:
        """Record completed reports, in order (each once)."""
        for report in results:
            index = report["index"]
            if index < self.next_index:
                continue
            assert index == self.next_index, (index, self.next_index)
            self.next_index += 1
            self.iteration += 1
            metrics = report["metrics"]
            this_iter_s = max(0.0, report["time"] - self.last_time)
            self.last_time = report["time"]
            self.time_total_s += this_iter_s
            row: dict[str, Any] = dict(metrics)
            row.update(training_iteration=self.iteration, time_this_iter_s=this_iter_s,
                       time_total_s=self.time_total_s, timestamp=int(report["time"]),
                       attempt=self.attempt)
            self.storage.add(row, metrics, report["checkpoint"])
            self.metrics = metrics
            self.progress.report(row, metrics)
            if self.report_hook is not None:
                self.report_hook(metrics, report["checkpoint"])

    def _close_splits(self, splits: list) -> None:
        """streaming_split's coordinator actors live until killed (tray's
        actors are not reclaimed with their last handle): end this
        attempt's, the next attempt splits anew."""
        for split in splits:
            coordinator = getattr(split[0], "_coordinator", None) if split else None
            if coordinator is not None:
                try:
                    tray.kill(coordinator)
                except Exception:  # noqa: BLE001
                    pass
