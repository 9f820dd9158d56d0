"""The experiment's controller: every trial's state, the search algorithm,
the scheduler and the stopping rules, in one actor.

Why an actor, and not the driver (Ray's ``TuneController`` runs in the
driver)? A trial reports from inside its trainable and must get the
scheduler's decision before it trains further (ASHA stops it at a rung,
PBT pauses it to exploit another). In Ray the trainable runs in a thread
of its actor and the driver pulls results; tray's actors have no threads
(and a thread would escape the simulator's virtual time), so ``report``
blocks on a call, and someone must answer calls: the driver cannot, an
actor can. The controller is a plain synchronous actor, so calls run one
at a time in arrival order: the state machine needs no locks, and in the
simulator arrival order is reproducible, so the same seed gives the same
decisions, the same trials and the same best result.

What else was considered: (a) runners push results and poll for decisions
later, so trials run ahead of decisions (Ray's old function API) — decisions
then land at arbitrary iterations; (b) the driver as the decision maker,
runners blocking on a mailbox actor that waits for the driver's answer —
that needs an actor that waits inside a call (async), and gives two places
that hold trial state. One state machine, fed by events, is simpler.

Events (each an actor method): ``next_work`` (a runner wants a trial),
``report`` (a result; answers continue / stop / pause), ``saved`` (a class
trainable saved a checkpoint the scheduler asked for), ``trial_ended``
(the trainable returned, raised or was unwound; answers the runner's next
trial), ``runner_lost`` (the driver saw a runner die) and ``poll`` (the
driver's periodic call: how many runners of which shape it should hold,
which to kill, the progress table). The driver owns the runner actors;
the controller owns all decisions.

Durability: the state (trials, searcher, scheduler, counters) is written to
``experiment_state.pkl`` at most once per ``SNAPSHOT_PERIOD_S`` while it
changes, whenever a trial ends or fails, and at the end. ``Tuner.restore`` — and the
driver, when the controller actor itself dies — builds a new controller from
it: finished trials stay finished; trials that were running resume from their
latest checkpoint. Work since the snapshot is redone, never lost or doubled in
the results (a retried trial drops the result lines past its checkpoint), and
a checkpoint that retention drops is deleted once no snapshot lists it."""

from __future__ import annotations

import hashlib
import math
import os
import pickle
import shutil
import time
from dataclasses import dataclass, field
from typing import Any

from ._session import Work
from .error import TuneError
from .experiment import CheckpointRecord, Trial
from .schedulers.trial_scheduler import TrialScheduler
from .search.searcher import ConcurrencyLimiter, Searcher
from .search.variant_generator import BasicVariantGenerator, _path_str, flatten, format_tag, leaves
from .trainable import TrainableSpec, shape_key

STATE_FILE = "experiment_state.pkl"
SETTINGS_FILE = "tuner.pkl"
SNAPSHOT_PERIOD_S = 1.0
# Trials created ahead of need by the default generator: twice what the
# cluster can run at once (at least PENDING_TRIALS_MIN), never more than
# PENDING_TRIALS_MAX, so a huge grid is not materialized up front.
PENDING_TRIALS_MIN = 16
PENDING_TRIALS_MAX = 1000
STOP_GRACE_S = 5.0  # a trial told to stop that does not report within this is killed
# Reports a trial sends without waiting for an answer, at most, between two that
# wait: also the most unanswered report calls one runner has in flight.
REPORTS_AHEAD_MAX = 32
TABLE_ROWS_MAX = 20


@dataclass
class ExperimentSpec:
    """Everything the controller needs but the trainable itself."""
    name: str
    experiment_path: str
    trainable_name: str
    param_space: dict
    metric: str | None
    mode: str | None
    num_samples: int
    search: Any  # BasicVariantGenerator or a Searcher
    scheduler: TrialScheduler
    stopper: Any
    checkpoint_config: Any
    failure_config: Any
    max_concurrent_trials: int | None
    time_budget_s: float | None
    reuse_actors: bool
    seed: int
    strict_metrics: tuple = ()
    trial_dirname_creator: Any = None


@dataclass
class _State:
    """What a snapshot holds: enough to resume the experiment."""
    trials: dict = field(default_factory=dict)  # trial id -> Trial, in creation order
    next_index: int = 0
    search_finished: bool = False
    elapsed_s: float = 0.0
    search: Any = None
    scheduler: Any = None
    stopper: Any = None
    rng_state: Any = None
    seed: int | None = None  # the first run's: trial ids keep their prefix on restore


class TuneController:
    def __init__(self, spec: ExperimentSpec, trainable: TrainableSpec,
                 restore: dict | None = None) -> None:
        import random

        self.spec = spec
        self.trainable = trainable
        self.rng = random.Random(spec.seed)
        self.state = _State(search=spec.search, scheduler=spec.scheduler, stopper=spec.stopper,
                            seed=spec.seed)
        self._id_prefix = self._prefix(spec.seed)
        self._session_start = time.time()
        self._last_snapshot = float("-inf")
        self._dirty = True
        self.fatal: BaseException | None = None
        self._stopping_since: float | None = None  # budget, stop_all or a fatal error
        self._asking_shape: str | None = None
        self._runners: dict[int, str] = {}  # runner id -> shape, from the driver's census
        # Runners the driver dropped (died, killed, or left): a call of theirs that
        # arrives late (sent before the runner died) gets no trial. Ids are never reused.
        self._gone: set[int] = set()
        self._nodes = None  # test hook: a function returning tray.nodes()-like rows
        self._started = False
        self._restore = restore
        self._save_requested: str | None = None  # a class trainable asked to save (PBT)
        self._pending_ahead = PENDING_TRIALS_MIN  # updated from the cluster's size by poll
        self._doomed: list[str] = []  # checkpoints retention dropped, not deleted yet

    @staticmethod
    def _prefix(seed: int) -> str:
        return hashlib.blake2b(str(seed).encode(), digest_size=3).hexdigest()[:5]

    # ================================================= scheduler's view

    def get_trials(self) -> list[Trial]:
        return list(self.state.trials.values())

    def get_live_trials(self) -> list[Trial]:
        return [t for t in self.state.trials.values() if not t.is_finished]

    def get_trial(self, trial_id: str) -> Trial:
        return self.state.trials[trial_id]

    def has_resources_for_trial(self, trial: Trial) -> bool:
        return self._asking_shape is None or self._shape(trial) == self._asking_shape

    def stop_trial(self, trial: Trial) -> None:
        """End a trial: at once if it is not running, at its next report if it is."""
        if trial.is_finished:
            return
        if trial.status == Trial.RUNNING:
            trial.stop_requested = "stop"
            return
        self._finish(trial, early=True)

    def pause_trial(self, trial: Trial) -> None:
        if trial.status == Trial.RUNNING:
            trial.stop_requested = "pause"
        elif trial.status == Trial.PENDING:
            trial.status = Trial.PAUSED
            self._dirty = True

    def resume_trial(self, trial: Trial) -> None:
        if trial.status == Trial.PAUSED:
            trial.status = Trial.PENDING
            self._dirty = True

    def save_trial(self, trial: Trial) -> Any:
        """A checkpoint of ``trial`` for PBT: its latest ("latest": a class
        trainable is asked to save right after this report)."""
        if self.trainable.is_class and trial.status == Trial.RUNNING:
            self._save_requested = trial.trial_id
            return "latest"
        return trial.checkpoint

    def exploit(self, trial: Trial, new_config: dict, checkpoint: CheckpointRecord) -> None:
        """PBT: restart ``trial`` from ``checkpoint`` with ``new_config``."""
        trial.config = new_config
        trial.resolved = {k: v for k, v in flatten(new_config).items() if k in trial.resolved}
        trial.restore_from = checkpoint
        trial.truncate_history = False
        if trial.status == Trial.RUNNING:
            trial.stop_requested = "pause"
        elif trial.status == Trial.PAUSED:
            trial.status = Trial.PENDING
        self._dirty = True

    def log_pbt(self, trial: Trial, donor: Trial, new_config: dict) -> None:
        import json

        line = {"trial": trial.trial_id, "donor": donor.trial_id,
                "trial_iteration": trial.last_result.get("training_iteration", 0),
                "donor_iteration": donor.last_result.get("training_iteration", 0),
                "old_config": trial.config, "new_config": new_config}
        path = os.path.join(self.spec.experiment_path, f"pbt_policy_{trial.trial_id}.txt")
        with open(path, "a", encoding="utf-8") as file:
            file.write(json.dumps(line, default=repr) + "\n")

    # ============================================================ setup

    def start(self) -> dict:
        """Validate and set up (errors raise here, before any trial runs), or
        load the snapshot to resume."""
        spec = self.spec
        os.makedirs(spec.experiment_path, exist_ok=True)
        if self._restore is not None:
            self._load(self._restore)
        else:
            scheduler = self.state.scheduler
            if not scheduler.set_search_properties(spec.metric, spec.mode):
                raise ValueError(f"{type(scheduler).__name__} and TuneConfig both set a metric "
                                 f"or mode, and they differ: set them in one place")
            scheduler.check_metric()
            search = self.state.search
            if isinstance(search, BasicVariantGenerator):
                samples = spec.num_samples if spec.num_samples > 0 else 2 ** 62
                search.setup(spec.param_space, samples, spec.seed)
            else:
                if not search.set_search_properties(spec.metric, spec.mode, spec.param_space,
                                                    seed=spec.seed):
                    raise ValueError(f"{type(search).__name__} did not accept the metric "
                                     f"{spec.metric!r} and mode {spec.mode!r}")
                if search.metric is None or search.mode is None:
                    raise ValueError(f"{type(search).__name__} needs a metric and a mode: pass "
                                     f"them to it or to tune.TuneConfig(metric=..., mode=...)")
            self._fill_pending()
        self._started = True
        self.snapshot(force=True)
        return self.poll({})

    def _load(self, options: dict) -> None:
        with open(os.path.join(self.spec.experiment_path, STATE_FILE), "rb") as file:
            import cloudpickle  # noqa: F401 - the snapshot may hold cloudpickled code

            state: _State = pickle.load(file)
        self.state = state
        if state.seed is not None:
            self._id_prefix = self._prefix(state.seed)
        if state.rng_state is not None:
            self.rng.setstate(state.rng_state)
        for trial in state.trials.values():
            trial.runner_id = None
            trial.stop_requested = None
            if trial.status == Trial.RUNNING:
                # Its runner died with the old driver or controller: resume, no failure.
                trial.status = Trial.PENDING
                trial.truncate_history = True
            if trial.status in (Trial.PENDING, Trial.PAUSED) and \
                    not options.get("resume_unfinished", True):
                self._finish(trial, early=True)
            if trial.status == Trial.ERROR:
                if options.get("restart_errored"):
                    trial.status, trial.num_failures = Trial.PENDING, 0
                    trial.restore_from, trial.checkpoints = None, []
                    trial.next_checkpoint_index, trial.truncate_history = 0, True
                    trial.error = trial.error_object = None
                elif options.get("resume_errored"):
                    trial.status, trial.num_failures = Trial.PENDING, 0
                    trial.truncate_history = True
                    trial.error = trial.error_object = None

    # ============================================================ trials

    def _elapsed(self) -> float:
        return self.state.elapsed_s + (time.time() - self._session_start)

    def _shape(self, trial: Trial) -> str:
        return shape_key(trial.resources)

    def _search_exhausted(self) -> bool:
        return self.state.search_finished

    def _create_trial(self) -> Trial | None:
        state, spec = self.state, self.spec
        if state.search_finished or self._stopping_since is not None:
            return None
        index = state.next_index
        trial_id = f"{self._id_prefix}_{index:05d}"
        search = state.search
        if isinstance(search, BasicVariantGenerator):
            item = search.next_config()
            if item is None:
                state.search_finished = True
                return None
            config, resolved = item
        else:
            if spec.num_samples > 0 and index >= spec.num_samples:
                state.search_finished = True
                return None
            suggestion = search.suggest(trial_id)
            if suggestion == Searcher.FINISHED:
                state.search_finished = True
                return None
            if suggestion is None:
                return None
            if not isinstance(suggestion, dict):
                raise TypeError(f"{type(search).__name__}.suggest() must return a dict, None or "
                                f"Searcher.FINISHED, got {suggestion!r}")
            config = suggestion
            paths = {_path_str(path) for path, _leaf in leaves(spec.param_space)}
            resolved = {k: v for k, v in flatten(config).items() if k in paths or not paths}
        state.next_index += 1
        resources = self.trainable.resources_for(config)
        tag = format_tag(index, resolved)
        dirname = f"{spec.trainable_name}_{trial_id}"
        trial = Trial(trial_id=trial_id, index=index, config=config, resolved=resolved,
                      experiment_tag=tag, dirname=dirname, resources=resources)
        if spec.trial_dirname_creator is not None:
            trial.dirname = str(spec.trial_dirname_creator(trial))
        state.trials[trial_id] = trial
        state.scheduler.on_trial_add(self, trial)
        self._dirty = True
        return trial

    def _fill_pending(self) -> None:
        """The default generator creates trials ahead of need (bounded);
        adaptive searchers are asked only when a runner needs work."""
        if not isinstance(self.state.search, BasicVariantGenerator):
            return
        pending = sum(1 for t in self.state.trials.values() if t.status == Trial.PENDING)
        while pending < self._pending_ahead and self._create_trial() is not None:
            pending += 1

    def _running(self) -> list[Trial]:
        return [t for t in self.state.trials.values() if t.status == Trial.RUNNING]

    def _finish(self, trial: Trial, early: bool) -> None:
        """TERMINATED: the one way a trial ends well (returned, or stopped)."""
        trial.status = Trial.TERMINATED
        trial.runner_id = None
        trial.stop_requested = None
        trial.stopped_early = trial.stopped_early or early
        trial.last_result = dict(trial.last_result, done=True)
        self.state.scheduler.on_trial_complete(self, trial, trial.last_result)
        if isinstance(self.state.search, Searcher):
            self.state.search.on_trial_complete(trial.trial_id, trial.last_result)
        self._dirty = True
        self.snapshot(force=True)  # (a restore must not run a finished trial again)

    def _fail(self, trial: Trial, text: str, error_object: Any) -> None:
        """An attempt failed: retry from the latest checkpoint within
        ``max_failures``, else ERROR (the one way a trial ends badly)."""
        max_failures = self.spec.failure_config.max_failures
        trial.num_failures += 1
        trial.error, trial.error_object = text, error_object
        trial.runner_id = None
        stopped = trial.stop_requested == "stop"
        trial.stop_requested = None
        self._dirty = True
        if stopped:
            # Its scheduler had stopped it (stop_trial: applied at the next
            # report, which never came): the failure does not revive it.
            self._finish(trial, early=True)
        elif self._stopping_since is not None and self.fatal is None:
            trial.status = Trial.TERMINATED  # the experiment is ending anyway
        elif max_failures < 0 or trial.num_failures <= max_failures:
            trial.status = Trial.PENDING
            trial.truncate_history = True
        else:
            trial.status = Trial.ERROR
            self.state.scheduler.on_trial_error(self, trial)
            if isinstance(self.state.search, Searcher):
                self.state.search.on_trial_complete(trial.trial_id, trial.last_result or None,
                                                    error=True)
            fail_fast = self.spec.failure_config.fail_fast
            if fail_fast == "raise":
                self._stop_all(error_object if isinstance(error_object, BaseException) else
                               TuneError(f"trial {trial} failed (FailureConfig(fail_fast="
                                         f"'raise')):\n{text}"))
            elif fail_fast:
                self._stop_all()
        self.snapshot(force=True)  # (its failures count across a restore: max_failures)

    def _stop_all(self, fatal: BaseException | None = None) -> None:
        if fatal is not None and self.fatal is None:
            self.fatal = fatal
        if self._stopping_since is None:
            self._stopping_since = self._elapsed()
        for trial in self._running():
            trial.stop_requested = "stop"
        self._dirty = True

    # ============================================================ events

    def next_work(self, runner_id: int, shape: str) -> Any:
        """A runner asks for a trial: a ``Work``, or "wait", "retire", "finished"."""
        if runner_id in self._gone:
            # Its call was on the way when the driver saw it die (runner_lost came
            # first): a trial handed to it now would stay RUNNING with no one to run it.
            return "finished"
        if self.is_done():
            self.snapshot(force=True)
            return "finished"
        if self._stopping_since is not None:
            return "finished"
        self._check_budget()
        limit = self.spec.max_concurrent_trials
        if limit is not None and len(self._running()) >= limit:
            return "wait"
        self._asking_shape = shape
        try:
            trial = self.state.scheduler.choose_trial_to_run(self)
            if trial is None and not isinstance(self.state.search, BasicVariantGenerator):
                created = self._create_trial()
                if created is not None:
                    trial = self.state.scheduler.choose_trial_to_run(self)
            if trial is None:
                self._fill_pending()
                trial = self.state.scheduler.choose_trial_to_run(self)
        finally:
            self._asking_shape = None
        if trial is None:
            waiting = any(t.status in (Trial.PENDING, Trial.PAUSED) and self._shape(t) == shape
                          for t in self.state.trials.values())
            if not waiting and self._search_exhausted() and not self._running():
                return "retire"
            return "wait"
        return self._start(trial, runner_id)

    def _start(self, trial: Trial, runner_id: int) -> Work:
        trial.status = Trial.RUNNING
        trial.attempt += 1
        trial.runner_id = runner_id
        trial.stop_requested = None
        truncate, trial.truncate_history = trial.truncate_history, True
        restore = trial.restore_from
        if truncate:  # (its results past the restore point are dropped from storage too)
            trial.last_result = dict(restore.metrics) if restore is not None else {}
        self._dirty = True
        config = self.spec.checkpoint_config
        done_so_far = {"training_iteration": restore.training_iteration if restore else 0}
        return Work(
            trial_id=trial.trial_id, attempt=trial.attempt, trial_name=str(trial),
            trial_dir=os.path.join(self.spec.experiment_path, trial.dirname),
            experiment_path=self.spec.experiment_path, experiment_name=self.spec.name,
            config=trial.config, restore=restore, truncate=truncate,
            next_checkpoint_index=trial.next_checkpoint_index,
            checkpoint_frequency=config.checkpoint_frequency,
            checkpoint_at_end=bool(config.checkpoint_at_end),
            reuse_actors=self.spec.reuse_actors, strict_metrics=self.spec.strict_metrics,
            results_ahead=self._results_ahead(trial, done_so_far))

    def _live(self, trial_id: str, attempt: int) -> Trial | None:
        trial = self.state.trials.get(trial_id)
        if trial is None or trial.attempt != attempt or trial.status != Trial.RUNNING:
            return None  # a call from an attempt given up on
        return trial

    def report(self, trial_id: str, attempt: int, items: list) -> tuple:
        """Results of one trial, in order (``[(result, checkpoint), ...]``: those
        the trial sent without waiting, then usually one it waits on). Answers
        the decision on the last, as ("continue" | "stop" | "pause", save_first,
        results the trial may send next without waiting); a result that stops
        or pauses the trial drops the ones after it."""
        decision: tuple = ("stop", False)
        for result, checkpoint in items:
            trial = self._live(trial_id, attempt)
            if trial is None:
                return ("stop", False)
            decision = self._report_one(trial, result, checkpoint)
            if decision[0] != "continue":
                return decision
        return decision

    def _report_one(self, trial: Trial, result: dict, checkpoint: dict | None) -> tuple:
        trial_id = trial.trial_id
        result["config"] = trial.config
        trial.last_result = result
        self._dirty = True
        missing = [m for m in self.spec.strict_metrics if m not in result]
        if missing:
            error = ValueError(
                f"Trial {trial} reported {sorted(k for k in result if k != 'config')} without "
                f"the metric(s) {missing} that the experiment optimizes (TuneConfig metric, "
                f"search algorithm or scheduler): include them in every tune.report() call")
            trial.status, trial.runner_id = Trial.ERROR, None
            trial.error, trial.error_object = str(error), error
            self._stop_all(error)
            return ("stop", False)
        if checkpoint is not None:
            self._register_checkpoint(trial, checkpoint, result)
        self._save_requested = None
        if trial.stop_requested == "stop":
            # Stopped (stop_trial, or the experiment ending) while it ran: this
            # result ends it. The scheduler is not asked again: its answer (a
            # PAUSE at a milestone) would revive a trial it stopped.
            self._finish(trial, early=not result.get("done", False))
            return ("stop", False)
        try:
            if isinstance(self.state.search, Searcher):
                self.state.search.on_trial_result(trial_id, result)
            action = self.state.scheduler.on_trial_result(self, trial, result)
            if action in (TrialScheduler.CONTINUE, TrialScheduler.NOOP):
                stopper = self.state.stopper
                if stopper is not None and stopper(trial_id, result):
                    action = TrialScheduler.STOP
                if stopper is not None and stopper.stop_all():
                    self._stop_all()
        except Exception as error:  # noqa: BLE001 - a scheduler/searcher/stopper bug ends it
            self._stop_all(error)
            return ("stop", False)
        self._check_budget()
        if result.get("done"):  # the trainable is done (Ray: should_stop): a PAUSE would revive it
            action = TrialScheduler.STOP
        if action == TrialScheduler.NOOP or action == TrialScheduler.CONTINUE:
            requested = trial.stop_requested
            if trial.status == Trial.TERMINATED:
                return ("stop", False)
            action = {"stop": TrialScheduler.STOP, "pause": TrialScheduler.PAUSE}.get(
                requested, TrialScheduler.CONTINUE)
        save_first = self._save_requested == trial_id
        if action == TrialScheduler.STOP:
            self._finish(trial, early=not result.get("done", False))
            return ("stop", False)
        if action == TrialScheduler.PAUSE:
            trial.status = Trial.PAUSED
            trial.runner_id = None
            trial.stop_requested = None
            latest = trial.checkpoint
            stale = latest is None or latest.training_iteration < result["training_iteration"]
            if trial.restore_from is not None and trial.restore_from.path.find(
                    os.sep + trial.dirname + os.sep) < 0:
                stale = False  # an exploit: resume from the donor, not a save of our own
            return ("pause", save_first or (self.trainable.is_class and stale))
        return ("continue", save_first, self._results_ahead(trial, result))

    def _results_ahead(self, trial: Trial, result: dict) -> int:
        """Reports the trial may send next without waiting for an answer: what
        the scheduler is sure to let pass, when nothing else can stop the trial
        in between (a stopper, a time budget) and it owes no save."""
        if self.state.stopper is not None or self.spec.time_budget_s is not None or \
                self._stopping_since is not None or trial.stop_requested:
            return 0
        ahead = self.state.scheduler.results_ahead(trial, result)
        return max(0, min(ahead, REPORTS_AHEAD_MAX))

    def saved(self, trial_id: str, attempt: int, checkpoint: dict) -> tuple:
        """A class trainable saved the checkpoint a decision asked for."""
        trial = self.state.trials.get(trial_id)
        if trial is None or trial.attempt != attempt:
            return ("stop", False)
        self._register_checkpoint(trial, checkpoint, trial.last_result)
        if trial.status == Trial.PAUSED:
            return ("pause", False)
        if trial.status != Trial.RUNNING:
            return ("stop", False)
        requested = trial.stop_requested
        if requested == "pause":
            trial.status, trial.runner_id, trial.stop_requested = Trial.PAUSED, None, None
            return ("pause", False)
        if requested == "stop":
            self._finish(trial, early=True)
            return ("stop", False)
        return ("continue", False)

    def trial_ended(self, runner_id: int, trial_id: str, attempt: int, outcome: dict,
                    shape: str) -> Any:
        """The trainable of ``trial_id`` ended on ``runner_id``; its next work."""
        if outcome.get("results"):  # what the trial sent without waiting, before it ended
            self.report(trial_id, attempt, outcome["results"])
        trial = self.state.trials.get(trial_id)
        if trial is not None and trial.attempt == attempt:
            kind = outcome["kind"]
            if kind == "error" and trial.status == Trial.RUNNING:
                error_object = None
                if outcome.get("exception") is not None:
                    try:
                        error_object = pickle.loads(outcome["exception"])
                    except Exception:  # noqa: BLE001
                        error_object = None
                self._fail(trial, outcome["error"], error_object)
                self._write_error(trial)
            elif kind == "returned" and trial.status == Trial.RUNNING:
                self._finish(trial, early=False)
            elif trial.status == Trial.RUNNING:  # unwound without a decision: treat as done
                self._finish(trial, early=True)
        return self.next_work(runner_id, shape)

    def runner_lost(self, runner_id: int, error_text: str) -> None:
        """The driver saw runner ``runner_id`` die: its trial failed."""
        self._runners.pop(runner_id, None)
        self._gone.add(runner_id)
        for trial in self._running():
            if trial.runner_id == runner_id:
                self._fail(trial, f"the trial's runner actor died: {error_text}", None)
                self._write_error(trial)

    def _write_error(self, trial: Trial) -> None:
        directory = os.path.join(self.spec.experiment_path, trial.dirname)
        os.makedirs(directory, exist_ok=True)
        with open(os.path.join(directory, "error.txt"), "a", encoding="utf-8") as file:
            file.write(f"Failure # {trial.num_failures}\n{trial.error}\n")

    def _register_checkpoint(self, trial: Trial, info: dict, result: dict) -> None:
        record = CheckpointRecord(path=info["path"], index=info["index"],
                                  training_iteration=info["training_iteration"],
                                  time_total_s=info["time_total_s"],
                                  metrics={k: v for k, v in result.items() if k != "config"})
        trial.checkpoints = [c for c in trial.checkpoints if c.index != record.index]
        trial.checkpoints.append(record)
        trial.next_checkpoint_index = max(trial.next_checkpoint_index, record.index + 1)
        trial.restore_from = record
        self._dirty = True
        self._retain(trial)

    def _retain(self, trial: Trial) -> None:
        """Keep the ``num_to_keep`` best checkpoints (and always the latest)."""
        config = self.spec.checkpoint_config
        keep = config.num_to_keep
        if keep is None or len(trial.checkpoints) <= keep:
            return
        latest = trial.checkpoints[-1]
        attribute = config.checkpoint_score_attribute
        if attribute is None:
            ranked = list(trial.checkpoints)  # oldest first: the newest are the best
        else:
            sign = 1.0 if config.checkpoint_score_order == "max" else -1.0

            def score(record: CheckpointRecord) -> float:
                value = record.metrics.get(attribute)
                return sign * value if isinstance(value, (int, float)) else float("-inf")
            ranked = sorted(trial.checkpoints, key=lambda c: (score(c), c.index))
        keepers = ranked[-keep:]
        if latest not in keepers:
            keepers = keepers[1:] + [latest] if keep > 1 else [latest]
        victims = [c for c in trial.checkpoints if c not in keepers]
        if not victims:
            return
        # A checkpoint another trial will resume from (a PBT donor's) stays.
        pinned = {t.restore_from.path for t in self.state.trials.values()
                  if t.restore_from is not None and not t.is_finished}
        # Deleted after the next snapshot: the last one may still resume from them.
        self._doomed += [c.path for c in victims if c.path not in pinned]
        trial.checkpoints = [c for c in trial.checkpoints if c not in victims or c.path in pinned]

    def _check_budget(self) -> None:
        budget = self.spec.time_budget_s
        if budget is not None and self._stopping_since is None and self._elapsed() >= budget:
            self._stop_all()

    # ============================================================ driver

    def is_done(self) -> bool:
        if not self._started:
            return False
        if self._stopping_since is not None:
            return not self._running()
        if not self._search_exhausted():
            return False
        return all(t.is_finished for t in self.state.trials.values())

    def _node_rows(self) -> list[dict]:
        if self._nodes is not None:
            return self._nodes()
        import tray

        return [n for n in tray.nodes() if n["Alive"]]

    def _default_options(self) -> dict:
        """The resource shape of trials not created yet (a per-config request
        that cannot be computed without a config counts as one CPU)."""
        try:
            return self.trainable.resources_for({})
        except Exception:  # noqa: BLE001 - a user's function of the config
            return {"num_cpus": 1}

    def _capacity(self, options: dict) -> int:
        """How many runners of this shape the live nodes can hold in total."""
        needs = {"CPU": options.get("num_cpus", 1), "GPU": options.get("num_gpus", 0),
                 "memory": options.get("memory", 0), **options.get("resources", {})}
        needs = {k: v for k, v in needs.items() if v}
        total = 0
        for node in self._node_rows():
            have = node["Resources"]
            if not needs:
                total += 1000
                continue
            total += min(int(math.floor(have.get(k, 0) / v + 1e-9)) for k, v in needs.items())
        return total

    def poll(self, census: dict) -> dict:
        """The driver's periodic call. ``census``: runner id -> shape of the
        runners it holds (a RUNNING trial whose runner is not in it has lost
        it). Answers the runners it should hold per shape, the ones to kill,
        whether the experiment is over, and the progress."""
        census = dict(census)
        self._gone.update(set(self._runners) - set(census))
        self._runners = census
        for trial in self._running():
            if trial.runner_id not in census:
                # Its runner is gone and no runner_lost said so (it returned after a
                # broken call to this controller, or its last call came late): the
                # attempt is lost, as when its runner dies.
                self._gone.add(trial.runner_id)
                self._fail(trial, f"the trial's runner actor {trial.runner_id} is gone "
                                  f"(the driver no longer holds it)", None)
                self._write_error(trial)
        self._check_budget()
        if self._started:
            capacity = self._capacity(self._default_options())
            self._pending_ahead = min(PENDING_TRIALS_MAX, max(PENDING_TRIALS_MIN, 2 * capacity))
        if self._stopping_since is None:
            self._fill_pending()
        kill = []
        if self._stopping_since is not None and \
                self._elapsed() - self._stopping_since > STOP_GRACE_S:
            for trial in self._running():  # told to stop, never reported again
                kill.append(trial.runner_id)
                self._finish(trial, early=True)
        demand: dict[str, dict] = {}
        if self._stopping_since is None:
            limit = self.spec.max_concurrent_trials
            for trial in self.state.trials.values():
                if trial.status in (Trial.PENDING, Trial.PAUSED, Trial.RUNNING):
                    entry = demand.setdefault(self._shape(trial),
                                              {"options": trial.resources, "count": 0})
                    entry["count"] += 1
            if not self._search_exhausted():
                # More trials will come (an adaptive searcher makes them on demand):
                # hold as many runners as fit, or as the searcher lets run at once.
                options = self._default_options()
                entry = demand.setdefault(shape_key(options), {"options": options, "count": 0})
                entry["count"] += self._capacity(options)
                search = self.state.search
                if isinstance(search, ConcurrencyLimiter):
                    limit = min(filter(None, [limit, search.max_concurrent]))
            budget = limit
            for _shape, entry in sorted(demand.items()):
                count = min(entry["count"], max(self._capacity(entry["options"]), 1))
                if budget is not None:
                    count = min(count, budget)
                    budget -= count
                entry["count"] = count
        self.snapshot()
        done = self.is_done()
        if done:
            self.snapshot(force=True)
        return {"done": done, "demand": demand, "kill": kill,
                "progress": self.progress()}

    def progress(self) -> dict:
        counts: dict[str, int] = {}
        for trial in self.state.trials.values():
            counts[trial.status] = counts.get(trial.status, 0) + 1
        order = {Trial.RUNNING: 0, Trial.PAUSED: 1, Trial.PENDING: 2, Trial.ERROR: 3,
                 Trial.TERMINATED: 4}
        trials = sorted(self.state.trials.values(), key=lambda t: (order[t.status], t.index))
        metric = self.spec.metric
        rows = []
        for trial in trials[:TABLE_ROWS_MAX]:
            result = trial.last_result
            rows.append({"trial": str(trial), "status": trial.status,
                         "params": dict(trial.resolved),
                         "iter": result.get("training_iteration"),
                         "total time (s)": result.get("time_total_s"),
                         **({metric: result.get(metric)} if metric else {})})
        return {"elapsed_s": self._elapsed(), "counts": counts, "total": len(trials),
                "rows": rows, "hidden": max(0, len(trials) - TABLE_ROWS_MAX),
                "scheduler": self.state.scheduler.debug_string()}

    def results(self) -> dict:
        """Everything the ResultGrid needs (the driver calls it at the end)."""
        self.snapshot(force=True)
        return {"trials": list(self.state.trials.values()), "fatal": self.fatal}

    # ============================================================ snapshots

    def snapshot(self, force: bool = False) -> None:
        now = time.time()
        if not self._dirty or (not force and now - self._last_snapshot < SNAPSHOT_PERIOD_S):
            return
        import cloudpickle

        self.state.rng_state = self.rng.getstate()
        elapsed = self._elapsed()
        saved_elapsed, self.state.elapsed_s = self.state.elapsed_s, elapsed
        try:
            blob = cloudpickle.dumps(self.state)
        finally:
            self.state.elapsed_s = saved_elapsed
        path = os.path.join(self.spec.experiment_path, STATE_FILE)
        with open(path + ".tmp", "wb") as file:
            file.write(blob)
        os.replace(path + ".tmp", path)
        self._last_snapshot = now
        self._dirty = False
        for path in self._doomed:  # no snapshot lists them now
            shutil.rmtree(path, ignore_errors=True)
        self._doomed = []
