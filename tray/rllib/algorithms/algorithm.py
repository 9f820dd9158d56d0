"""The Algorithm: the driver's loop over env runners and learners.

``train()`` runs one iteration: ``training_step()`` (algorithm-specific:
sample, update, broadcast the new weights) and, every
``evaluation_interval`` iterations, ``evaluate()``; it returns RLlib's
result dict (``env_runners/episode_return_mean``, ``learners/<module>/...``,
``num_env_steps_sampled_lifetime``, ``fault_tolerance/...``,
``time_this_iter_s``, ``training_iteration``).

The loop is plain logic over actors and refs, through tray's public API
only, so the same algorithm runs on real processes and, deterministically,
in the simulator, where faults can be injected into it.

Weights are broadcast once per update: the driver ``put``s them (one
object) and every sample request carries the ref and a version number; a
runner fetches the object only when the version is new to it.

Episode metrics (``episode_return_mean``, ...) are, as in RLlib 2.x's new
stack, over the episodes the training env runners finished during this
iteration (the last ``metrics_num_episodes_for_smoothing``, 100, of them);
an iteration in which no episode finished repeats the previous iteration's
(NaN before any has finished). ``evaluate()`` reports the episodes of that
evaluation only."""

from __future__ import annotations

import datetime
import json
import math
import os
import tempfile
import time
from collections import deque
from dataclasses import dataclass

import numpy as np

from tray.rllib.core.learner_group import LearnerGroup
from tray.rllib.core.rl_module import DEFAULT_MODULE_ID, NumpyPolicy, env_action

from ..env.env_runner_group import EnvRunnerGroup
from ..env.registry import make_env
from ..utils import spaces as spaces_module

CHECKPOINT_VERSION = "tray-rllib-1"
STATE_FILE = "algorithm_state.pkl"
METADATA_FILE = "rllib_checkpoint.json"


@dataclass(frozen=True)
class Checkpoint:
    path: str

    def __fspath__(self) -> str:
        return self.path


@dataclass(frozen=True)
class SaveResult:
    """What ``Algorithm.save()`` returns (``result.checkpoint.path``), as Ray's
    ``TrainingResult``."""
    checkpoint: Checkpoint
    metrics: dict


def _nan_stats(values: list) -> tuple[float, float, float]:
    if not values:
        return math.nan, math.nan, math.nan
    return float(np.mean(values)), float(np.max(values)), float(np.min(values))


class Algorithm:
    """Base class of tray.rllib's algorithms."""

    learner_class = None
    config_class = None

    @classmethod
    def get_default_config(cls):
        if cls.config_class is None:
            raise ValueError(f"{cls.__name__} has no default config")
        return cls.config_class()

    def __init__(self, config=None, env=None) -> None:
        config = config if config is not None else self.get_default_config()
        if isinstance(config, dict):
            config = self.get_default_config().update_from_dict(config)
        if env is not None:
            config.environment(env)
        config.validate()
        self.config = config
        self.iteration = 0
        self.time_total_s = 0.0
        self.env_steps_sampled_lifetime = 0
        self.agent_steps_sampled_lifetime = 0
        self.env_steps_trained_lifetime = 0
        self.episodes_lifetime = 0
        self.module_steps_sampled_lifetime: dict = {}
        window = config.metrics_num_episodes_for_smoothing
        self._episodes = deque(maxlen=window)
        self.weights_version = 0
        self._weights_ref = None
        self.module_specs = self._module_specs()
        self.learner_group = LearnerGroup(config, self.learner_class, self.module_specs)
        self.env_runner_group = self._make_env_runner_group()
        self.eval_env_runner_group = None
        self._last_result: dict = {}
        self.setup()
        self._broadcast_weights()

    # -------------------------------------------------------------- setup

    def setup(self) -> None:
        """Algorithm-specific state."""

    def _make_env_runner_group(self):
        return EnvRunnerGroup(self.config, self.module_specs)

    def _probe_env(self):
        return make_env(self.config.env, self.config.env_config, worker_index=0)

    def _module_specs(self) -> dict:
        config = self.config
        if not config.is_multi_agent:
            observation_space, action_space = config.observation_space, config.action_space
            if observation_space is None or action_space is None:
                env = self._probe_env()
                observation_space = observation_space or env.observation_space
                action_space = action_space or env.action_space
                env.close()
            spec = config.module_spec(observation_space, action_space)
            spec.validate()
            return {DEFAULT_MODULE_ID: spec}
        env = self._probe_env()
        inferred: dict = {}
        for agent_id in list(getattr(env, "possible_agents", []) or []):
            module_id = config.policy_mapping_fn(agent_id, None)
            inferred.setdefault(module_id, (env.get_observation_space(agent_id),
                                            env.get_action_space(agent_id)))
        env.close()
        specs = {}
        for module_id in sorted(config.policies or inferred, key=str):
            given = (config.policies or {}).get(module_id)
            spaces = inferred.get(module_id)
            observation_space = getattr(given, "observation_space", None) or \
                (spaces[0] if spaces else None)
            action_space = getattr(given, "action_space", None) or (spaces[1] if spaces else None)
            if observation_space is None or action_space is None:
                raise ValueError(f"policy {module_id!r}: no agent of the env maps to it, so its "
                                 f"spaces are unknown; give RLModuleSpec(observation_space=..., "
                                 f"action_space=...) in multi_agent(policies=...)")
            model = {**config.model, **(getattr(given, "model_config", None) or {})}
            from tray.rllib.core.rl_module import RLModuleSpec

            spec = RLModuleSpec(observation_space, action_space, model)
            spec.validate()
            specs[module_id] = spec
        missing = sorted(set(inferred) - set(specs), key=str)
        if missing:
            raise ValueError(f"policy_mapping_fn maps agents to {missing}, which are not in "
                             f"multi_agent(policies={sorted(specs, key=str)})")
        return specs

    # ------------------------------------------------------------ weights

    def _broadcast_weights(self) -> None:
        """One ``put`` of the learner's weights; requests carry its ref."""
        self._weights = self.learner_group.get_weights()
        self.weights_version += 1
        self._weights_ref = None
        if self.env_runner_group.local_runner is None:
            import tray

            self._weights_ref = tray.put(self._weights)

    def _weights_for(self, group):
        if group.local_runner is not None:
            return self._weights
        if self._weights_ref is None:
            import tray

            self._weights_ref = tray.put(self._weights)
        return self._weights_ref

    def get_weights(self, module_ids=None) -> dict:
        return {m: w for m, w in self._weights.items() if module_ids is None or m in module_ids}

    def set_weights(self, weights: dict) -> None:
        self.learner_group.set_weights(weights)
        self._broadcast_weights()

    # -------------------------------------------------------------- train

    def train(self) -> dict:
        started = time.perf_counter()
        self._iteration_counts = {"env_steps": 0, "agent_steps": 0, "episodes": 0,
                                  "module_steps": {},
                                  "episodes_this_iter": deque(
                                      maxlen=self.config.metrics_num_episodes_for_smoothing)}
        self._timers = {"env_runner_sampling_timer": 0.0, "learner_update_timer": 0.0,
                        "synch_weights": 0.0}
        learner_results: dict = {}
        while True:
            step_results = self.training_step()
            learner_results = step_results or learner_results
            if self._iteration_counts["env_steps"] >= \
                    self.config.min_sample_timesteps_per_iteration:
                break
        self.iteration += 1
        result = self._result(learner_results, time.perf_counter() - started)
        interval = self.config.evaluation_interval
        if interval and self.iteration % interval == 0:
            result["evaluation"] = self.evaluate()
        self._last_result = result
        return result

    def training_step(self) -> dict:
        """One sample-and-update step; returns the learner results."""
        raise NotImplementedError

    def step(self) -> dict:
        return self.train()

    # ------------------------------------------------------ sampling help

    def _sample_sync(self, num_timesteps: int) -> list[dict]:
        started = time.perf_counter()
        results = self.env_runner_group.sample(self._weights_for(self.env_runner_group),
                                               self.weights_version,
                                               num_timesteps=num_timesteps)
        self._timers["env_runner_sampling_timer"] += time.perf_counter() - started
        for result in results:
            self._record_sample(result)
        return results

    def _record_sample(self, result: dict) -> None:
        counts = self._iteration_counts
        counts["env_steps"] += result["env_steps"]
        counts["agent_steps"] += result["agent_steps"]
        self.env_steps_sampled_lifetime += result["env_steps"]
        self.agent_steps_sampled_lifetime += result["agent_steps"]
        for module_id, chunks in result["chunks"].items():
            steps = sum(len(c["rewards"]) for c in chunks)
            counts["module_steps"][module_id] = counts["module_steps"].get(module_id, 0) + steps
            self.module_steps_sampled_lifetime[module_id] = \
                self.module_steps_sampled_lifetime.get(module_id, 0) + steps
        for episode in result["episodes"]:
            counts["episodes_this_iter"].append(episode)
        counts["episodes"] += len(result["episodes"])
        self.episodes_lifetime += len(result["episodes"])

    @staticmethod
    def _merge_chunks(results: list[dict]) -> dict:
        batch: dict = {}
        for result in results:
            for module_id, chunks in result["chunks"].items():
                batch.setdefault(module_id, []).extend(chunks)
        return batch

    def _update(self, batch: dict) -> dict:
        started = time.perf_counter()
        results = self.learner_group.update(batch)
        self._timers["learner_update_timer"] += time.perf_counter() - started
        self.env_steps_trained_lifetime += results.get("__all_modules__", {}).get(
            "num_env_steps_trained", 0)
        started = time.perf_counter()
        self._broadcast_weights()
        self._timers["synch_weights"] += time.perf_counter() - started
        return results

    # ------------------------------------------------------------ results

    def _episode_metrics(self, episodes) -> dict:
        episodes = list(episodes)
        mean, high, low = _nan_stats([e["return"] for e in episodes])
        len_mean, len_max, len_min = _nan_stats([e["length"] for e in episodes])
        module_returns: dict = {}
        agent_returns: dict = {}
        for episode in episodes:
            for module_id, value in episode["module_returns"].items():
                module_returns.setdefault(module_id, []).append(value)
            for agent_id, value in episode["agent_returns"].items():
                agent_returns.setdefault(agent_id, []).append(value)
        return {"episode_return_mean": mean, "episode_return_max": high,
                "episode_return_min": low, "episode_len_mean": len_mean,
                "episode_len_max": len_max, "episode_len_min": len_min,
                "module_episode_returns_mean": {m: float(np.mean(v))
                                                for m, v in sorted(module_returns.items())},
                "agent_episode_returns_mean": {a: float(np.mean(v))
                                               for a, v in sorted(agent_returns.items())}}

    def _result(self, learner_results: dict, elapsed_s: float) -> dict:
        counts = self._iteration_counts
        self.time_total_s += elapsed_s
        stats = self.env_runner_group.statistics()
        if counts["episodes_this_iter"]:
            self._episodes.clear()
            self._episodes.extend(counts["episodes_this_iter"])
        env_runners = self._episode_metrics(self._episodes)
        env_runners.update({
            "num_episodes": counts["episodes"],
            "num_episodes_lifetime": self.episodes_lifetime,
            "num_env_steps_sampled": counts["env_steps"],
            "num_env_steps_sampled_lifetime": self.env_steps_sampled_lifetime,
            "num_agent_steps_sampled": counts["agent_steps"],
            "num_agent_steps_sampled_lifetime": self.agent_steps_sampled_lifetime,
            "num_module_steps_sampled": dict(sorted(counts["module_steps"].items())),
            "num_module_steps_sampled_lifetime": dict(
                sorted(self.module_steps_sampled_lifetime.items())),
            "num_faulty_episodes": stats.num_faulty_episodes,
            "sample": self._timers["env_runner_sampling_timer"],
        })
        env_runners.update(self._extra_env_runner_metrics())
        now = datetime.datetime.now()
        return {
            "env_runners": env_runners,
            "learners": learner_results,
            "num_env_steps_sampled_lifetime": self.env_steps_sampled_lifetime,
            "num_agent_steps_sampled_lifetime": self.agent_steps_sampled_lifetime,
            "num_env_steps_trained_lifetime": self.env_steps_trained_lifetime,
            "num_episodes_lifetime": self.episodes_lifetime,
            "fault_tolerance": {
                "num_healthy_workers": stats.num_healthy_env_runners,
                "num_remote_worker_restarts": stats.num_remote_worker_restarts,
                "num_lost_sample_requests": stats.num_lost_sample_requests,
                "num_lost_results": stats.num_lost_results,
                "num_faulty_episodes": stats.num_faulty_episodes,
                "num_timed_out_sample_requests": stats.num_timed_out_sample_requests,
            },
            "env_runner_group": {
                "actor_manager_num_outstanding_async_reqs": stats.num_in_flight_requests},
            "timers": {"training_iteration": elapsed_s, **self._timers},
            "training_iteration": self.iteration,
            "iterations_since_restore": self.iteration,
            "time_this_iter_s": elapsed_s,
            "time_total_s": self.time_total_s,
            "timestamp": int(time.time()),
            "date": now.strftime("%Y-%m-%d_%H-%M-%S"),
            "done": False,
        }

    def _extra_env_runner_metrics(self) -> dict:
        return {}

    # --------------------------------------------------------- evaluation

    def _evaluation_config(self):
        config = self.config.copy()
        overrides = dict(config.evaluation_config or {})
        config.update_from_dict(overrides)
        config.output = None
        return config

    def evaluate(self) -> dict:
        """Episodes with the current weights (``explore=False`` unless the
        evaluation config says otherwise): ``{"env_runners": {...}}``."""
        config = self._evaluation_config()
        if self.eval_env_runner_group is None:
            self.eval_env_runner_group = EnvRunnerGroup(
                config, self.module_specs, num_env_runners=config.evaluation_num_env_runners,
                evaluation=True)
        group = self.eval_env_runner_group
        duration = config.evaluation_duration
        kwargs = {"num_episodes": duration} if config.evaluation_duration_unit == "episodes" \
            else {"num_timesteps": duration}
        results = group.sample(self._weights_for(group), self.weights_version,
                               explore=config.explore, **kwargs)
        episodes = [e for r in results for e in r["episodes"]]
        if config.evaluation_duration_unit == "episodes":
            episodes = episodes[:duration]
        metrics = self._episode_metrics(episodes)
        metrics["num_episodes"] = len(episodes)
        metrics["num_env_steps_sampled"] = sum(r["env_steps"] for r in results)
        return {"env_runners": metrics}

    # ----------------------------------------------------- using a policy

    def get_module(self, module_id: str = DEFAULT_MODULE_ID):
        """The module (a torch ``nn.Module``) with the current weights, with
        RLlib's ``forward_inference`` / ``forward_exploration`` / ``forward_train``."""
        from tray.rllib.core.torch_rl_module import TorchRLModule

        if module_id not in self.module_specs:
            raise ValueError(f"no module {module_id!r}; modules: {sorted(self.module_specs)}")
        module = TorchRLModule(self.module_specs[module_id], self._weights[module_id])
        module.eval()
        return module

    def compute_single_action(self, observation, *, explore: bool = False,
                              policy_id: str = DEFAULT_MODULE_ID, seed: int | None = None):
        """The action for one observation (numpy forward pass of the current weights)."""
        if policy_id not in self.module_specs:
            raise ValueError(f"no policy {policy_id!r}; policies: {sorted(self.module_specs)}")
        spec = self.module_specs[policy_id]
        policy = NumpyPolicy(spec, self._weights[policy_id])
        flat = spaces_module.flatten_observations(spec.observation_space, [observation])
        rng = np.random.default_rng(seed)
        actions, _logp, _inputs = policy.act(flat, rng, explore)
        return env_action(spec.action_space, actions[0])

    # -------------------------------------------------------- checkpoints

    def get_state(self) -> dict:
        return {"config": self.config, "algorithm_class": type(self),
                "learner": self.learner_group.get_state(),
                "counters": {"iteration": self.iteration, "time_total_s": self.time_total_s,
                             "env_steps_sampled_lifetime": self.env_steps_sampled_lifetime,
                             "agent_steps_sampled_lifetime": self.agent_steps_sampled_lifetime,
                             "env_steps_trained_lifetime": self.env_steps_trained_lifetime,
                             "episodes_lifetime": self.episodes_lifetime,
                             "module_steps_sampled_lifetime":
                                 dict(self.module_steps_sampled_lifetime)},
                "episodes": list(self._episodes), "extra": self.extra_state()}

    def set_state(self, state: dict) -> None:
        self.learner_group.set_state(state["learner"])
        counters = state["counters"]
        self.iteration = counters["iteration"]
        self.time_total_s = counters["time_total_s"]
        self.env_steps_sampled_lifetime = counters["env_steps_sampled_lifetime"]
        self.agent_steps_sampled_lifetime = counters["agent_steps_sampled_lifetime"]
        self.env_steps_trained_lifetime = counters["env_steps_trained_lifetime"]
        self.episodes_lifetime = counters["episodes_lifetime"]
        self.module_steps_sampled_lifetime = dict(counters["module_steps_sampled_lifetime"])
        self._episodes.clear()
        self._episodes.extend(state["episodes"])
        self.set_extra_state(state.get("extra") or {})
        self._broadcast_weights()

    def extra_state(self) -> dict:
        return {}

    def set_extra_state(self, state: dict) -> None:
        pass

    def save_to_path(self, path: str | None = None) -> str:
        """Write a checkpoint directory; returns its path."""
        import cloudpickle

        path = os.path.abspath(path or tempfile.mkdtemp(prefix="tray_rllib_checkpoint_"))
        os.makedirs(path, exist_ok=True)
        state = self.get_state()
        with open(os.path.join(path, STATE_FILE + ".tmp"), "wb") as out:
            cloudpickle.dump(state, out)
        os.replace(os.path.join(path, STATE_FILE + ".tmp"), os.path.join(path, STATE_FILE))
        for module_id, weights in self._weights.items():
            module_dir = os.path.join(path, "learner_group", "learner", "rl_module",
                                      str(module_id))
            os.makedirs(module_dir, exist_ok=True)
            arrays = {f"{head}_{index}_{part}": array
                      for head, layers in weights.items()
                      for index, layer in enumerate(layers)
                      for part, array in zip(("w", "b"), layer, strict=True)}
            np.savez(os.path.join(module_dir, "module_state.npz"), **arrays)
        metadata = {"type": "Algorithm", "checkpoint_version": CHECKPOINT_VERSION,
                    "format": "cloudpickle", "algorithm_class": type(self).__name__,
                    "module_ids": sorted(str(m) for m in self.module_specs),
                    "training_iteration": self.iteration}
        with open(os.path.join(path, METADATA_FILE), "w", encoding="utf-8") as out:
            json.dump(metadata, out, indent=2)
        return path

    def save(self, checkpoint_dir: str | None = None) -> SaveResult:
        return SaveResult(Checkpoint(self.save_to_path(checkpoint_dir)), dict(self._last_result))

    @staticmethod
    def _read_state(path) -> dict:
        import cloudpickle

        path = getattr(path, "path", path)
        path = getattr(getattr(path, "checkpoint", None), "path", path)
        metadata_path = os.path.join(path, METADATA_FILE)
        if not os.path.exists(metadata_path):
            raise ValueError(f"{path!r} is not a tray.rllib checkpoint (no {METADATA_FILE})")
        with open(metadata_path, encoding="utf-8") as source:
            metadata = json.load(source)
        if metadata.get("checkpoint_version") != CHECKPOINT_VERSION:
            raise ValueError(f"checkpoint {path!r} has version "
                             f"{metadata.get('checkpoint_version')!r}; this tray.rllib reads "
                             f"{CHECKPOINT_VERSION!r}")
        with open(os.path.join(path, STATE_FILE), "rb") as source:
            return cloudpickle.load(source)

    def restore_from_path(self, path) -> None:
        self.set_state(self._read_state(path))

    def restore(self, path) -> None:
        self.restore_from_path(path)

    @classmethod
    def from_checkpoint(cls, path, config_overrides: dict | None = None):
        """A new Algorithm (of the checkpoint's class and config) in the
        state the checkpoint holds."""
        state = cls._read_state(path)
        config = state["config"]
        if config_overrides:
            config = config.copy().update_from_dict(config_overrides)
        algorithm = state["algorithm_class"](config=config)
        algorithm.set_state(state)
        return algorithm

    # ---------------------------------------------------------------- Tune

    def save_checkpoint(self, checkpoint_dir: str) -> None:
        self.save_to_path(checkpoint_dir)

    def load_checkpoint(self, checkpoint_dir: str) -> None:
        self.restore_from_path(checkpoint_dir)

    @classmethod
    def as_trainable(cls):
        """This algorithm as a ``tray.tune.Trainable`` class: each trial
        builds it from its config (``config.to_dict()`` as the
        ``param_space``, with search spaces in any value), ``step()`` is
        ``train()``, checkpoints are the algorithm's."""
        from tray import tune

        algorithm_class = cls

        class AlgorithmTrainable(tune.Trainable):
            def setup(self, config: dict) -> None:
                algo_config = algorithm_class.get_default_config()
                algo_config.update_from_dict(
                    {k: v for k, v in config.items() if k != "algo_class"})
                self.algorithm = algorithm_class(config=algo_config)

            def step(self) -> dict:
                result = self.algorithm.train()
                # Flat copies of the headline metrics: any Tune can stop on them.
                env_runners = result["env_runners"]
                result["episode_return_mean"] = env_runners["episode_return_mean"]
                result["env_runners/episode_return_mean"] = env_runners["episode_return_mean"]
                return result

            def save_checkpoint(self, checkpoint_dir: str) -> None:
                self.algorithm.save_to_path(checkpoint_dir)

            def load_checkpoint(self, checkpoint) -> None:
                self.algorithm.restore_from_path(checkpoint)

            def cleanup(self) -> None:
                self.algorithm.stop()

        AlgorithmTrainable.__name__ = AlgorithmTrainable.__qualname__ = cls.__name__
        return AlgorithmTrainable

    # ------------------------------------------------------------- stop

    def stop(self) -> None:
        """End the env runner and learner actors."""
        self.env_runner_group.stop()
        if self.eval_env_runner_group is not None:
            self.eval_env_runner_group.stop()
        self.learner_group.stop()
        # Drop the broadcast ref now, not whenever the garbage collector
        # gets to this object: frees then happen in program order.
        self._weights_ref = None

    def __repr__(self) -> str:
        return f"{type(self).__name__}(iteration={self.iteration})"
