"""``OptunaSearch``: the real Optuna library behind Tune's ``Searcher`` API.

Optuna is an optional extra (``pip install 'tray[tune]'``); importing this
module works without it, constructing an ``OptunaSearch`` does not. The
study uses Optuna's ask-and-tell interface: ``suggest`` asks for a trial
with the space's distributions fixed up front, ``on_trial_complete`` tells
it the trial's last value (or that it failed). With ``seed`` the sampler
(TPE by default) is seeded, so a seeded experiment suggests the same
configs in the same order; in the simulator the order of tells is
deterministic too, so the whole search replays.
"""

from __future__ import annotations

from typing import Any

from .sample import Categorical, Domain, Float, Function, Integer, is_grid
from .searcher import Searcher
from .variant_generator import _path_str, copy_structure, leaves, set_path_creating


def _import_optuna():
    try:
        import optuna
    except ImportError as error:
        raise ImportError("OptunaSearch needs the optuna package: pip install 'tray[tune]' "
                          "(or pip install optuna)") from error
    return optuna


def _distribution(optuna, path: tuple, domain: Any):
    name = _path_str(path)
    dist = optuna.distributions
    if is_grid(domain):
        raise ValueError(f"OptunaSearch cannot take param_space[{name!r}], a grid search: "
                         f"use tune.choice(...) instead, or the default search algorithm")
    if isinstance(domain, Float) and domain.kind in ("uniform", "loguniform"):
        log = domain.kind == "loguniform"
        if log and domain.q is not None:
            raise ValueError(f"OptunaSearch cannot take param_space[{name!r}]: Optuna has no "
                             f"quantized log-uniform floats")
        if log and domain.base != 10:
            pass  # the distribution is the same up to the base: Optuna's log is natural
        return dist.FloatDistribution(domain.lower, domain.upper, log=log, step=domain.q)
    if isinstance(domain, Integer):
        if domain.q is not None:
            return dist.IntDistribution(domain.lower, domain.upper, step=domain.q)
        return dist.IntDistribution(domain.lower, domain.upper - 1, log=domain.log)
    if isinstance(domain, Categorical):
        return dist.CategoricalDistribution(domain.categories)
    if isinstance(domain, Function):
        raise ValueError(f"OptunaSearch cannot take param_space[{name!r}], a "
                         f"tune.sample_from function: Optuna needs explicit distributions")
    if isinstance(domain, Domain):
        raise ValueError(f"OptunaSearch cannot take param_space[{name!r}] = "
                         f"{domain.describe()}: supported are uniform, quniform, loguniform, "
                         f"randint, qrandint, lograndint and choice")
    raise ValueError(f"OptunaSearch cannot take param_space[{name!r}] = {domain!r}")


class OptunaSearch(Searcher):
    """Search with Optuna (Ray's ``tune.search.optuna.OptunaSearch``).

    ``space`` is a dict of Optuna distributions (flattened ``"a/b"`` keys for
    nesting) or ``None`` to translate the Tuner's ``param_space``;
    ``points_to_evaluate`` are enqueued first; ``sampler`` defaults to
    ``TPESampler(seed=seed)``."""

    def __init__(self, space: dict | None = None, metric: str | list | None = None,
                 mode: str | list | None = None, points_to_evaluate: list[dict] | None = None,
                 sampler: Any = None, seed: int | None = None) -> None:
        optuna = _import_optuna()
        if isinstance(metric, list) or isinstance(mode, list):
            raise ValueError("OptunaSearch in tray.tune optimizes one metric; pass a string")
        super().__init__(metric, mode)
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        self._space = dict(space) if space else None
        self._points_to_evaluate = list(points_to_evaluate or [])
        self._sampler = sampler
        self._seed = seed
        self._study: Any = None
        self._trials: dict[str, Any] = {}
        self._constants: Any = {}

    def set_search_properties(self, metric, mode, config, **spec) -> bool:
        super().set_search_properties(metric, mode, config)
        optuna = _import_optuna()
        if self._space is None:
            domains = leaves(config)
            self._space = {_path_str(path): _distribution(optuna, path, domain)
                           for path, domain in domains}
            self._constants = config
        elif leaves(config):
            raise ValueError("OptunaSearch got a space of its own and a param_space with "
                             "search domains: give one of them")
        else:
            self._constants = config
        if not self._space:
            raise ValueError("OptunaSearch has nothing to search: the param_space has no "
                             "tune.uniform/choice/... domain")
        self._setup_study(spec.get("seed"))
        return True

    def _setup_study(self, experiment_seed: int | None) -> None:
        if self._mode is None:
            raise ValueError("OptunaSearch needs a mode ('min' or 'max'): pass it to "
                             "OptunaSearch or to TuneConfig")
        if self._metric is None:
            raise ValueError("OptunaSearch needs a metric: pass it to OptunaSearch or to "
                             "TuneConfig")
        optuna = _import_optuna()
        sampler = self._sampler
        if sampler is None:
            seed = self._seed if self._seed is not None else experiment_seed
            sampler = optuna.samplers.TPESampler(seed=seed)
        direction = "maximize" if self._mode == "max" else "minimize"
        self._study = optuna.create_study(sampler=sampler, direction=direction)
        for point in self._points_to_evaluate:
            self._study.enqueue_trial(point)

    def suggest(self, trial_id: str):
        if self._study is None:
            raise RuntimeError("OptunaSearch was not set up: the Tuner calls "
                               "set_search_properties first")
        trial = self._study.ask(fixed_distributions=self._space)
        self._trials[trial_id] = trial
        config = copy_structure(self._constants)
        for key, value in trial.params.items():
            set_path_creating(config, tuple(key.split("/")), value)
        return config

    def on_trial_result(self, trial_id: str, result: dict) -> None:
        trial = self._trials.get(trial_id)
        step = result.get("training_iteration")
        if trial is not None and self._metric in result and step is not None:
            trial.report(float(result[self._metric]), int(step))

    def on_trial_complete(self, trial_id: str, result=None, error: bool = False) -> None:
        trial = self._trials.pop(trial_id, None)
        if trial is None:
            return
        optuna = _import_optuna()
        if error or not result or self._metric not in result:
            self._study.tell(trial, state=optuna.trial.TrialState.FAIL)
        else:
            self._study.tell(trial, float(result[self._metric]))

    def add_evaluated_point(self, parameters, value, error=False, pruned=False,
                            intermediate_values=None) -> None:
        optuna = _import_optuna()
        if self._study is None:
            raise RuntimeError("add_evaluated_point needs the study: call it after the "
                               "Tuner set the searcher up")
        state = optuna.trial.TrialState.FAIL if error else (
            optuna.trial.TrialState.PRUNED if pruned else optuna.trial.TrialState.COMPLETE)
        self._study.add_trial(optuna.trial.create_trial(
            params=parameters, distributions=self._space, value=None if error else value,
            state=state, intermediate_values=dict(enumerate(intermediate_values or []))))

