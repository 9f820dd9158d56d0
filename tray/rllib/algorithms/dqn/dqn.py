"""DQN: deep Q-learning (Mnih et al., 2015) with a replay buffer, a target
network and double Q-learning (van Hasselt et al., 2016): off-policy.

Each training step samples ``rollout_fragment_length`` steps per env with
an epsilon-greedy policy (epsilon decays linearly from
``initial_epsilon`` to ``final_epsilon`` over ``epsilon_timesteps`` env
steps), adds the transitions to a bounded replay buffer, and, once
``num_steps_sampled_before_learning_starts`` transitions are in it, takes
gradient steps on minibatches of ``train_batch_size`` transitions drawn
uniformly (``training_intensity``: replayed transitions per sampled one;
by default one minibatch per training step). The env runners get the new
weights every ``broadcast_interval`` training steps (25: 100 env steps). The loss is the Huber loss of
``Q(s, a)`` against ``r + gamma * Q_target(s', argmax_a' Q(s', a'))``; the
target network copies the online one every ``target_network_update_freq``
sampled env steps. The module's policy head outputs the Q-values; the env
runners act greedily on them, with epsilon."""

from __future__ import annotations

import numpy as np
import torch

from tray.rllib.core.learner import Learner, _scalar
from tray.rllib.core.rl_module import DEFAULT_MODULE_ID
from tray.rllib.core.torch_rl_module import TorchRLModule

from ...utils import spaces as spaces_module
from ..algorithm import Algorithm
from ..algorithm_config import AlgorithmConfig, NotProvided


class DQNConfig(AlgorithmConfig):
    def __init__(self, algo_class=None) -> None:
        super().__init__(algo_class=algo_class or DQN)
        self.lr = 5e-4
        self.train_batch_size = 32
        self.rollout_fragment_length = 4
        self.num_env_runners = 0
        self.min_sample_timesteps_per_iteration = 1000
        self.replay_buffer_capacity = 50_000
        self.num_steps_sampled_before_learning_starts = 1000
        self.target_network_update_freq = 500
        self.double_q = True
        self.training_intensity = None
        self.initial_epsilon = 1.0
        self.final_epsilon = 0.02
        self.epsilon_timesteps = 10_000
        self.grad_clip = 40.0
        # Training steps between weight broadcasts to the env runners (each
        # is a copy of the weights, and a put with remote runners).
        self.broadcast_interval = 25

    def training(self, *, replay_buffer_capacity=NotProvided,
                 num_steps_sampled_before_learning_starts=NotProvided,
                 target_network_update_freq=NotProvided, double_q=NotProvided,
                 training_intensity=NotProvided, epsilon=NotProvided, **kwargs):
        super().training(**kwargs)
        for name, value in (("replay_buffer_capacity", replay_buffer_capacity),
                            ("num_steps_sampled_before_learning_starts",
                             num_steps_sampled_before_learning_starts),
                            ("target_network_update_freq", target_network_update_freq)):
            if value is not NotProvided:
                if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                    raise ValueError(f"{name} must be a non-negative integer, got {value!r}")
                setattr(self, name, value)
        if double_q is not NotProvided:
            self.double_q = bool(double_q)
        if training_intensity is not NotProvided:
            if training_intensity is not None and (
                    isinstance(training_intensity, bool) or
                    not isinstance(training_intensity, int | float) or training_intensity <= 0):
                raise ValueError(f"training_intensity must be a positive number or None, got "
                                 f"{training_intensity!r}")
            self.training_intensity = training_intensity
        if epsilon is not NotProvided:
            # RLlib's schedule form: [[0, initial], [timesteps, final]].
            try:
                (_, initial), (timesteps, final) = epsilon
            except (TypeError, ValueError):
                raise ValueError(f"epsilon must be [[0, initial], [timesteps, final]], got "
                                 f"{epsilon!r}") from None
            self.initial_epsilon, self.final_epsilon = float(initial), float(final)
            self.epsilon_timesteps = int(timesteps)
        return self

    def validate(self) -> None:
        super().validate()
        if self.is_multi_agent:
            raise ValueError("DQN here trains a single-agent policy")
        if self.replay_buffer_capacity < self.train_batch_size:
            raise ValueError(f"replay_buffer_capacity ({self.replay_buffer_capacity}) must hold "
                             f"at least one train batch ({self.train_batch_size})")


class ReplayBuffer:
    """Transitions in a ring of ``capacity`` (the oldest are overwritten),
    sampled uniformly with a seeded generator."""

    def __init__(self, capacity: int, seed: int) -> None:
        self.capacity = capacity
        self.rng = np.random.default_rng([seed & 0xFFFFFFFF, 41])
        self.columns: dict = {}
        self.size = 0
        self.next_index = 0
        self.added = 0

    def add_chunk(self, chunk: dict) -> None:
        steps = len(chunk["rewards"])
        if not steps:
            return
        terminateds = np.zeros(steps, dtype=np.float32)
        terminateds[-1] = float(chunk["terminated"])
        rows = {"obs": chunk["obs"][:-1], "new_obs": chunk["obs"][1:],
                "actions": np.asarray(chunk["actions"], dtype=np.int64),
                "rewards": chunk["rewards"].astype(np.float32), "terminateds": terminateds}
        if not self.columns:
            self.columns = {name: np.zeros((self.capacity, *values.shape[1:]), values.dtype)
                            for name, values in rows.items()}
        for offset in range(steps):
            index = self.next_index
            for name, values in rows.items():
                self.columns[name][index] = values[offset]
            self.next_index = (index + 1) % self.capacity
        self.size = min(self.capacity, self.size + steps)
        self.added += steps

    def sample(self, count: int) -> dict:
        rows = self.rng.integers(0, self.size, size=count)
        return {name: values[rows] for name, values in self.columns.items()}


class DQNLearner(Learner):
    def setup(self) -> None:
        self.targets = {m: TorchRLModule(module.spec, module.get_weights())
                        for m, module in self.modules.items()}

    def build_columns(self, module_id: str, chunks: list) -> dict:
        return {name: np.concatenate([c[name] for c in chunks])
                for name in ("obs", "new_obs", "actions", "rewards", "terminateds")}

    def compute_loss_for_module(self, module_id: str, batch: dict):
        config = self.config
        module = self.modules[module_id]
        q_all = module.pi(batch["obs"])
        q = q_all.gather(1, batch["actions"].long().reshape(-1, 1)).squeeze(1)
        with torch.no_grad():
            target_next = self.targets[module_id].pi(batch["new_obs"])
            if config.double_q:
                best = module.pi(batch["new_obs"]).argmax(1, keepdim=True)
                next_q = target_next.gather(1, best).squeeze(1)
            else:
                next_q = target_next.max(1).values
            target = batch["rewards"] + config.gamma * (1.0 - batch["terminateds"]) * next_q
        td_error = q - target
        loss = torch.nn.functional.smooth_l1_loss(q, target)
        return loss, {"qf_loss": _scalar(loss), "qf_mean": _scalar(q.mean()),
                      "td_error_mean": _scalar(td_error.abs().mean())}

    def update_target(self) -> None:
        for module_id, module in self.modules.items():
            self.targets[module_id].set_weights(module.get_weights())

    def extra_state(self) -> dict:
        return {"targets": {m: t.get_weights() for m, t in self.targets.items()}}

    def set_extra_state(self, state: dict) -> None:
        for module_id, weights in state.get("targets", {}).items():
            self.targets[module_id].set_weights(weights)


class DQN(Algorithm):
    config_class = DQNConfig
    learner_class = DQNLearner

    def setup(self) -> None:
        spec = self.module_specs[DEFAULT_MODULE_ID]
        if not spaces_module.is_discrete(spec.action_space):
            raise ValueError(f"DQN needs Discrete actions, got {spec.action_space!r}")
        seed = self.config.seed if self.config.seed is not None else 0
        self.replay_buffer = ReplayBuffer(self.config.replay_buffer_capacity, seed)
        self._steps_since_target_update = 0
        self._steps_since_broadcast = 0
        self._last_learner_results: dict = {}

    def epsilon(self) -> float:
        config = self.config
        fraction = min(1.0, self.env_steps_sampled_lifetime / max(1, config.epsilon_timesteps))
        return config.initial_epsilon + fraction * (config.final_epsilon - config.initial_epsilon)

    def training_step(self) -> dict:
        config = self.config
        started_steps = self._iteration_counts["env_steps"]
        results = self.env_runner_group.sample(
            self._weights_for(self.env_runner_group), self.weights_version,
            num_timesteps=config.get_rollout_fragment_length() * config.num_envs_per_env_runner
            * max(1, config.num_env_runners), epsilon=self.epsilon())
        for result in results:
            self._record_sample(result)
            for chunk in result["chunks"].get(DEFAULT_MODULE_ID, []):
                self.replay_buffer.add_chunk(chunk)
        sampled = self._iteration_counts["env_steps"] - started_steps
        self._steps_since_target_update += sampled
        if self.replay_buffer.size < max(config.num_steps_sampled_before_learning_starts,
                                         config.train_batch_size):
            return self._last_learner_results
        if config.training_intensity is None:
            updates = 1
        else:
            updates = max(1, round(sampled * config.training_intensity / config.train_batch_size))
        for _ in range(updates):
            batch = self.replay_buffer.sample(config.train_batch_size)
            self._last_learner_results = self.learner_group.update({DEFAULT_MODULE_ID: [batch]})
        if self._steps_since_target_update >= config.target_network_update_freq:
            self.learner_group.foreach_learner("update_target")
            self._steps_since_target_update = 0
        self._steps_since_broadcast += 1
        if self._steps_since_broadcast >= config.broadcast_interval:
            self._broadcast_weights()
            self._steps_since_broadcast = 0
        return self._last_learner_results

    def _extra_env_runner_metrics(self) -> dict:
        return {"epsilon": self.epsilon(), "replay_buffer_size": self.replay_buffer.size}
