"""``Tuner``: the driver's side of an experiment.

The driver validates the settings, starts the controller actor (decisions,
see ``_controller``) and holds the runner actors (where trials run, see
``_runner``): it creates as many runners per resource shape as the
controller asks for and the cluster can hold, waits on their ``serve``
calls so that a runner's death is seen at once, kills runners the
controller gives up on, prints the progress table, and when the
controller says the experiment is over, turns its trial records into a
``ResultGrid``. If the controller actor itself dies (its worker crashed),
the driver starts a new one from the last snapshot, as ``Tuner.restore``
would after a driver crash; one that dies before its ``start`` answered is
replaced by one started the same way (up to ``CONTROLLER_RESTARTS_MAX``
replacements in all).
"""

from __future__ import annotations

import datetime
import hashlib
import os
import pickle
import time
from typing import Any

import tray
from tray.exceptions import NotInitializedError, TrayError

from ._controller import SETTINGS_FILE, STATE_FILE, ExperimentSpec, TuneController
from ._runner import RunnerActor
from .config import RunConfig, TuneConfig
from .error import TuneError
from .progress import ProgressReporter
from .result_grid import ResultGrid
from .schedulers.trial_scheduler import DEFAULT_METRIC, FIFOScheduler, TrialScheduler
from .search.searcher import Searcher
from .search.variant_generator import BasicVariantGenerator, leaves
from .stopper import as_stopper
from .trainable import TrainableSpec, as_spec

POLL_INTERVAL_S = 0.5  # the driver's loop: progress, demand, the time budget
CONTROLLER_RESTARTS_MAX = 10
DEFAULT_STORAGE_PATH = os.path.join("~", "tray_results")

ControllerActor = tray.remote(TuneController)


def _default_seed(name: str) -> int:
    """The experiment's seed when none is given: from the driver's node id,
    which the simulator derives from its own seed (so the same simulation
    seed draws the same trials) and a real cluster from OS entropy."""
    node = tray.get_runtime_context().get_node_id()
    digest = hashlib.blake2b(f"{node}:{name}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") >> 2


class Tuner:
    """Runs a trainable over a search space (Ray's ``tune.Tuner``)."""

    def __init__(self, trainable: Any = None, *, param_space: dict | None = None,
                 tune_config: TuneConfig | None = None, run_config: RunConfig | None = None,
                 _restore: dict | None = None) -> None:
        if trainable is None:
            raise TypeError("Tuner needs a trainable: a function train(config) or a "
                            "tune.Trainable subclass")
        self._trainable = as_spec(trainable)
        if param_space is not None and not isinstance(param_space, dict):
            raise TypeError(f"param_space must be a dict, got {type(param_space).__name__}")
        self._param_space = param_space or {}
        self._tune_config = tune_config or TuneConfig()
        self._run_config = run_config or RunConfig()
        if not isinstance(self._tune_config, TuneConfig):
            raise TypeError("tune_config must be a tune.TuneConfig")
        if not isinstance(self._run_config, RunConfig):
            raise TypeError("run_config must be a tune.RunConfig")
        search = self._tune_config.search_alg
        if search is not None and not isinstance(search, (Searcher, BasicVariantGenerator)):
            raise TypeError(f"search_alg must be a tune.search.Searcher (or "
                            f"BasicVariantGenerator), got {search!r}")
        scheduler = self._tune_config.scheduler
        if scheduler is not None and not isinstance(scheduler, TrialScheduler):
            raise TypeError(f"scheduler must be a tune.schedulers.TrialScheduler, got "
                            f"{scheduler!r}")
        leaves(self._param_space)  # unknown search-space types fail here
        self._stopper = as_stopper(self._run_config.stop)
        self._restore = _restore
        self._result_grid: ResultGrid | None = None
        name = self._run_config.name or (
            f"{self._trainable.__name__}_"
            f"{datetime.datetime.now().strftime('%Y-%m-%d_%H-%M-%S')}")
        storage = os.path.expanduser(self._run_config.storage_path or DEFAULT_STORAGE_PATH)
        self._name = name
        self._experiment_path = os.path.abspath(os.path.join(storage, name))

    # ------------------------------------------------------------ restore

    @classmethod
    def can_restore(cls, path: str) -> bool:
        path = os.path.expanduser(path)
        return os.path.exists(os.path.join(path, SETTINGS_FILE)) and \
            os.path.exists(os.path.join(path, STATE_FILE))

    @classmethod
    def restore(cls, path: str, trainable: Any, *, param_space: dict | None = None,
                resume_unfinished: bool = True, resume_errored: bool = False,
                restart_errored: bool = False) -> Tuner:
        """Resume the experiment stored at ``path`` (its driver died, or it was
        stopped): finished trials keep their results and are not run again;
        unfinished ones resume from their latest checkpoint."""
        path = os.path.abspath(os.path.expanduser(path))
        if not cls.can_restore(path):
            raise ValueError(f"no tray.tune experiment to restore at {path!r} (it needs "
                             f"{SETTINGS_FILE} and {STATE_FILE})")
        import cloudpickle  # noqa: F401

        with open(os.path.join(path, SETTINGS_FILE), "rb") as file:
            settings = pickle.load(file)
        tuner = cls.__new__(cls)
        tuner._trainable = as_spec(trainable)
        tuner._param_space = param_space if param_space is not None else settings["param_space"]
        tuner._tune_config = settings["tune_config"]
        tuner._run_config = settings["run_config"]
        tuner._stopper = as_stopper(tuner._run_config.stop)
        tuner._restore = {"resume_unfinished": resume_unfinished,
                          "resume_errored": resume_errored,
                          "restart_errored": restart_errored}
        tuner._result_grid = None
        tuner._name = os.path.basename(path)
        tuner._experiment_path = path
        return tuner

    def get_results(self) -> ResultGrid:
        if self._result_grid is None:
            raise RuntimeError("get_results() needs fit() to have run")
        return self._result_grid

    # ------------------------------------------------------------ fit

    def _spec(self) -> ExperimentSpec:
        tc, rc = self._tune_config, self._run_config
        search = tc.search_alg if tc.search_alg is not None else BasicVariantGenerator()
        scheduler = tc.scheduler if tc.scheduler is not None else FIFOScheduler()
        max_concurrent = tc.max_concurrent_trials
        if isinstance(search, BasicVariantGenerator) and search.max_concurrent:
            max_concurrent = min(filter(None, [max_concurrent, search.max_concurrent]))
        seed = search.random_state if isinstance(search, BasicVariantGenerator) and \
            search.random_state is not None else _default_seed(self._name)
        strict = []
        for owner in (tc, scheduler if scheduler._needs_metric else None, search):
            metric = getattr(owner, "metric", None) if owner is not None else None
            if metric and metric != DEFAULT_METRIC and metric not in strict:
                strict.append(metric)
        return ExperimentSpec(
            name=self._name, experiment_path=self._experiment_path,
            trainable_name=self._trainable.__name__, param_space=self._param_space,
            metric=tc.metric, mode=tc.mode, num_samples=tc.num_samples, search=search,
            scheduler=scheduler, stopper=self._stopper,
            checkpoint_config=rc.checkpoint_config, failure_config=rc.failure_config,
            max_concurrent_trials=max_concurrent, time_budget_s=tc.time_budget_s,
            reuse_actors=tc.reuse_actors, seed=seed, strict_metrics=tuple(strict),
            trial_dirname_creator=tc.trial_dirname_creator)

    def _check_resources(self) -> None:
        """A trial that no node could ever hold fails now, not after a hang."""
        request = self._trainable.resources
        if callable(request):
            return
        options = self._trainable.resources_for({})
        nodes = [n for n in tray.nodes() if n["Alive"]]
        needs = {"CPU": options.get("num_cpus", 1), "GPU": options.get("num_gpus", 0),
                 "memory": options.get("memory", 0), **options.get("resources", {})}
        needs = {k: v for k, v in needs.items() if v}
        if any(all(n["Resources"].get(k, 0) >= v for k, v in needs.items()) for n in nodes):
            return
        have = [{k: v for k, v in n["Resources"].items() if k in needs} for n in nodes]
        raise ValueError(f"each trial needs {needs}, but no node of the cluster has that "
                         f"much (nodes have {have}): lower the request in "
                         f"tune.with_resources() or add resources")

    def fit(self) -> ResultGrid:
        """Run the experiment; returns when every trial has ended."""
        if not tray.is_initialized():
            raise NotInitializedError("tray.tune needs a running cluster: call tray.init() "
                                      "(or tray.init(backend='sim')) before Tuner.fit()")
        self._check_resources()
        spec = self._spec()
        os.makedirs(spec.experiment_path, exist_ok=True)
        if self._restore is None:
            import cloudpickle

            settings = {"param_space": self._param_space, "tune_config": self._tune_config,
                        "run_config": self._run_config}
            try:
                blob = cloudpickle.dumps(settings)
            except Exception:  # noqa: BLE001 - refs in param_space: restore needs it again
                blob = cloudpickle.dumps(dict(settings, param_space=None))
            with open(os.path.join(spec.experiment_path, SETTINGS_FILE), "wb") as file:
                file.write(blob)
        run = _ExperimentRun(spec, self._trainable, self._restore, self._run_config)
        self._result_grid = run.run()
        return self._result_grid


Tuner.__module__ = "tray.tune"


class _Runner:
    __slots__ = ("actor", "shape", "ref", "runner_id")

    def __init__(self, runner_id: int, actor, shape: str, ref) -> None:
        self.runner_id, self.actor, self.shape, self.ref = runner_id, actor, shape, ref


class _ExperimentRun:
    """One ``fit()``: the driver loop."""

    def __init__(self, spec: ExperimentSpec, trainable: TrainableSpec, restore: dict | None,
                 run_config: RunConfig) -> None:
        self.spec = spec
        self.trainable = trainable
        self.restore = restore
        self.reporter = ProgressReporter(spec.name, run_config.verbose,
                                         run_config.progress_interval_s)
        self.runners: dict[int, _Runner] = {}
        self.next_runner_id = 0
        self.controller = None
        self.controller_restarts = 0
        self.trainable_ref = None

    def _start_controller(self, restore: dict | None) -> dict:
        from tray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        node = tray.get_runtime_context().get_node_id()
        while True:
            self.controller = ControllerActor.options(
                num_cpus=0, max_restarts=0,
                scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False),
            ).remote(self.spec, self.trainable, restore)
            try:
                return tray.get(self.controller.start.remote())
            except TrayError as error:
                self._kill(self.controller)
                if isinstance(error, tray.exceptions.ActorError) and error.cause is None:
                    # Its process died (or was cut off) before start() answered: no
                    # runner has used it yet, so start another the same way (from the
                    # same snapshot when resuming; a fresh start redoes the same
                    # seeded setup).
                    self._count_restart()
                    continue
                # A bad setting raised in the controller: raise the user's error itself.
                cause = error
                while isinstance(cause, TrayError) and \
                        isinstance(getattr(cause, "cause", None), BaseException):
                    cause = cause.cause
                if cause is not error and not isinstance(cause, TrayError):
                    raise cause from None
                raise

    def _kill(self, actor) -> None:
        try:
            tray.kill(actor)
        except Exception:  # noqa: BLE001 - already gone
            pass

    def _call(self, method: str, *args):
        """A call to the controller; None if the controller died (then it is
        rebuilt from its snapshot)."""
        try:
            return tray.get(getattr(self.controller, method).remote(*args))
        except tray.exceptions.ActorError:
            self._recover()
            return None

    def _count_restart(self) -> None:
        self.controller_restarts += 1
        if self.controller_restarts > CONTROLLER_RESTARTS_MAX:
            raise TuneError(f"the experiment's controller actor died "
                            f"{self.controller_restarts} times; giving up")

    def _recover(self) -> None:
        self._count_restart()
        for runner in list(self.runners.values()):
            self._kill(runner.actor)
        self.runners.clear()
        self._kill(self.controller)
        self.status = self._start_controller({"resume_unfinished": True})

    def run(self) -> ResultGrid:
        self.trainable_ref = tray.put(self.trainable)
        self.status = self._start_controller(self.restore)
        try:
            while True:
                self._provision(self.status)
                self._wait_runners()
                census = {rid: r.shape for rid, r in self.runners.items()}
                status = self._call("poll", census)
                if status is None:
                    continue  # recovered: self.status is the new controller's
                self.status = status
                self.reporter.update(status["progress"])
                if status["done"]:
                    break
            data = self._call("results")
            while data is None:
                data = self._call("results")
            self.reporter.finish(self.status["progress"])
        finally:
            for runner in list(self.runners.values()):
                self._kill(runner.actor)
            self.runners.clear()
            if self.controller is not None:
                self._kill(self.controller)
        if data["fatal"] is not None:
            raise data["fatal"]
        return ResultGrid(data["trials"], self.spec.experiment_path, self.spec.metric,
                          self.spec.mode)

    def _provision(self, status: dict) -> None:
        for runner_id in status["kill"]:
            runner = self.runners.pop(runner_id, None)
            if runner is not None:
                self._kill(runner.actor)
        for shape, entry in sorted(status["demand"].items()):
            have = sum(1 for r in self.runners.values() if r.shape == shape)
            for _ in range(entry["count"] - have):
                runner_id = self.next_runner_id
                self.next_runner_id += 1
                actor = RunnerActor.options(**entry["options"], max_restarts=0).remote(
                    self.trainable_ref, self.controller, runner_id, shape)
                self.runners[runner_id] = _Runner(runner_id, actor, shape, actor.serve.remote())

    def _wait_runners(self) -> None:
        if not self.runners:
            time.sleep(POLL_INTERVAL_S)
            return
        by_ref = {r.ref: r for r in self.runners.values()}
        refs = list(by_ref)
        ready, _ = tray.wait(refs, num_returns=1, timeout=POLL_INTERVAL_S)
        if ready:
            ready, _ = tray.wait(refs, num_returns=len(refs), timeout=0)
        for ref in ready:
            runner = by_ref[ref]
            self.runners.pop(runner.runner_id, None)
            try:
                tray.get(ref)  # "finished", "retire" or "controller_lost"
                self._kill(runner.actor)
            except TrayError as error:
                self._kill(runner.actor)
                if self._call("runner_lost", runner.runner_id,
                              f"{type(error).__name__}: {error}") is None:
                    return
