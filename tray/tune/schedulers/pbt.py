"""Population based training: ``PopulationBasedTraining``.

Every ``perturbation_interval`` (in ``time_attr`` units) a trial that
reports is ranked against the population: in the top quantile, its latest
checkpoint is remembered as a donor; in the bottom quantile, it *exploits*
a donor drawn from the top (it restarts from the donor's checkpoint) and
*explores* (its config becomes the donor's, perturbed: numbers multiplied
by one of ``perturbation_factors``, categories moved to a neighbour, or
resampled with ``resample_probability``). The exploiting trial pauses and
resumes from the donor's checkpoint with the new config. All randomness
comes from the experiment's seeded RNG, so a seeded PBT run replays.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from ..experiment import Trial
from ..search.sample import Domain, Function
from .trial_scheduler import FIFOScheduler, TrialScheduler


class _PBTState:
    def __init__(self, tag: str) -> None:
        self.orig_tag = tag
        self.last_score: float | None = None
        self.last_checkpoint: Any = None
        self.last_perturbation_time = 0.0
        self.last_train_time = 0.0


def explore(config: dict, mutations: dict, resample_probability: float,
            perturbation_factors: tuple, rng, custom_explore_fn: Callable | None) -> dict:
    """A perturbed copy of ``config`` (PBT's explore step)."""
    new = dict(config)
    for key, space in mutations.items():
        value = config.get(key)
        if isinstance(space, dict):
            new[key] = explore(value if isinstance(value, dict) else {}, space,
                               resample_probability, perturbation_factors, rng, None)
        elif isinstance(space, (list, tuple)):
            choices = list(space)
            if rng.random() < resample_probability or value not in choices:
                new[key] = choices[rng.randrange(len(choices))]
            else:
                index = choices.index(value) + rng.choice([-1, 1])
                new[key] = choices[min(max(index, 0), len(choices) - 1)]
        elif isinstance(space, Domain) or callable(space):
            if rng.random() < resample_probability or value is None:
                new[key] = space.sample(rng) if isinstance(space, Domain) else space()
            else:
                factor = rng.choice(list(perturbation_factors))
                new[key] = type(value)(value * factor) if isinstance(value, int) \
                    else value * factor
    if custom_explore_fn is not None:
        new = custom_explore_fn(new)
        if not isinstance(new, dict):
            raise ValueError("custom_explore_fn must return the new config (a dict)")
    return new


class PopulationBasedTraining(FIFOScheduler):
    """Ray's ``PopulationBasedTraining`` (asynchronous mode)."""

    _needs_metric = True

    def __init__(self, time_attr: str = "time_total_s", metric: str | None = None,
                 mode: str | None = None, perturbation_interval: float = 60.0,
                 burn_in_period: float = 0.0, hyperparam_mutations: dict | None = None,
                 quantile_fraction: float = 0.25, resample_probability: float = 0.25,
                 perturbation_factors: tuple = (1.2, 0.8),
                 custom_explore_fn: Callable | None = None, log_config: bool = True,
                 require_attrs: bool = True, synch: bool = False) -> None:
        hyperparam_mutations = hyperparam_mutations or {}
        for key, value in hyperparam_mutations.items():
            if isinstance(value, Function):
                raise ValueError(f"hyperparam_mutations[{key!r}]: tune.sample_from is not "
                                 f"supported; use tune.uniform, tune.choice, a list, ...")
            if not isinstance(value, (dict, list, tuple, Domain)) and not callable(value):
                raise TypeError(f"hyperparam_mutations[{key!r}] must be a list, a dict, a "
                                f"tune search space or a callable, got {value!r}")
        if not hyperparam_mutations and custom_explore_fn is None:
            raise ValueError("PopulationBasedTraining needs hyperparam_mutations or "
                             "custom_explore_fn")
        if not 0 <= quantile_fraction <= 0.5:
            raise ValueError(f"quantile_fraction must be in [0, 0.5], got {quantile_fraction}")
        if not perturbation_interval > 0:
            raise ValueError(f"perturbation_interval must be positive, got "
                             f"{perturbation_interval}")
        if synch:
            raise ValueError("PopulationBasedTraining(synch=True) is not supported by "
                             "tray.tune yet; use the asynchronous mode (synch=False)")
        if mode is not None and mode not in ("min", "max"):
            raise ValueError(f"mode must be 'min' or 'max', got {mode!r}")
        self._time_attr = time_attr
        self._metric, self._mode = metric, mode
        self._perturbation_interval = perturbation_interval
        self._burn_in_period = burn_in_period
        self._hyperparam_mutations = hyperparam_mutations
        self._quantile_fraction = quantile_fraction
        self._resample_probability = resample_probability
        self._perturbation_factors = tuple(perturbation_factors)
        self._custom_explore_fn = custom_explore_fn
        self._log_config = log_config
        self._require_attrs = require_attrs
        self._state: dict[str, _PBTState] = {}
        self._num_perturbations = 0
        self._num_checkpoints = 0

    def on_trial_add(self, controller, trial: Trial) -> None:
        self.check_metric()
        self._state[trial.trial_id] = _PBTState(trial.experiment_tag)
        for key, space in self._hyperparam_mutations.items():
            if key not in trial.config:
                if isinstance(space, (list, tuple)):
                    trial.config[key] = list(space)[controller.rng.randrange(len(space))]
                elif isinstance(space, Domain):
                    trial.config[key] = space.sample(controller.rng)
                elif callable(space):
                    trial.config[key] = space()

    def on_trial_result(self, controller, trial: Trial, result: dict) -> str:
        for attr in (self._time_attr, self._metric):
            if attr not in result:
                if self._require_attrs:
                    raise ValueError(
                        f"PopulationBasedTraining needs {attr!r} in every result; trial "
                        f"{trial} reported {sorted(result)} (or pass require_attrs=False)")
                return TrialScheduler.CONTINUE
        time = result[self._time_attr]
        state = self._state[trial.trial_id]
        if time < self._burn_in_period:
            return TrialScheduler.CONTINUE
        if time - state.last_perturbation_time < self._perturbation_interval:
            return TrialScheduler.CONTINUE
        state.last_score = self._sign() * result[self._metric]
        state.last_train_time = time
        state.last_perturbation_time = time
        lower, upper = self._quantiles(controller)
        decision = TrialScheduler.CONTINUE
        if any(t.status in (Trial.PENDING, Trial.PAUSED) and t is not trial
               for t in controller.get_trials()):
            decision = TrialScheduler.PAUSE  # share the runners with waiting trials
        if trial.trial_id in upper:
            state.last_checkpoint = controller.save_trial(trial)
            self._num_checkpoints += 1
        else:
            state.last_checkpoint = None
        if trial.trial_id in lower:
            donor_id = upper[controller.rng.randrange(len(upper))]
            donor = controller.get_trial(donor_id)
            checkpoint = self._state[donor_id].last_checkpoint
            if checkpoint == "latest":
                checkpoint = donor.checkpoint
            if checkpoint is None:
                return decision  # the donor has nothing to copy yet
            new_config = explore(donor.config, self._hyperparam_mutations,
                                 self._resample_probability, self._perturbation_factors,
                                 controller.rng, self._custom_explore_fn)
            self._num_perturbations += 1
            if self._log_config:
                controller.log_pbt(trial, donor, new_config)
            controller.exploit(trial, new_config, checkpoint)
            return TrialScheduler.NOOP
        return decision

    def _quantiles(self, controller) -> tuple[list[str], list[str]]:
        scored = [t.trial_id for t in controller.get_trials()
                  if self._state.get(t.trial_id) is not None
                  and self._state[t.trial_id].last_score is not None and not t.is_finished]
        if len(scored) <= 1:
            return [], []
        scored.sort(key=lambda tid: self._state[tid].last_score)
        count = math.ceil(len(scored) * self._quantile_fraction)
        if count > len(scored) / 2:
            count = int(math.floor(len(scored) / 2))
        if count == 0:
            return [], []
        return scored[:count], scored[-count:]

    def on_trial_complete(self, controller, trial: Trial, result: dict) -> None:
        pass

    def choose_trial_to_run(self, controller) -> Trial | None:
        """The waiting trial that trained least so far (fair share of time)."""
        candidates = [t for t in controller.get_trials()
                      if t.status in (Trial.PENDING, Trial.PAUSED)
                      and controller.has_resources_for_trial(t)]
        if not candidates:
            return None
        return min(candidates, key=lambda t: self._state[t.trial_id].last_train_time
                   if t.trial_id in self._state else 0.0)

    def debug_string(self) -> str:
        return (f"PopulationBasedTraining: {self._num_checkpoints} checkpoints, "
                f"{self._num_perturbations} perturbs")


PopulationBasedTraining.__module__ = "tray.tune.schedulers"
