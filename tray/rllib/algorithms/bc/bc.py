"""BC: behaviour cloning from recorded episodes (offline RL's baseline).

``BCConfig().offline_data(input_=path)`` reads transitions recorded with
``offline_data(output=...)`` (JSON lines or Parquet). Every ``train()``
draws ``train_batch_size`` transitions uniformly (seeded) and takes
``num_epochs`` passes of minibatch SGD on the negative log-likelihood of
the recorded actions. There is no sampling during training; ``evaluate()``
(or ``evaluation_interval``) runs the cloned policy in the env."""

from __future__ import annotations

import numpy as np

from tray.rllib.core.learner import Learner, _scalar
from tray.rllib.core.rl_module import DEFAULT_MODULE_ID

from ...offline.io import read_transitions
from ..algorithm import Algorithm
from ..algorithm_config import AlgorithmConfig


class BCConfig(AlgorithmConfig):
    def __init__(self, algo_class=None) -> None:
        super().__init__(algo_class=algo_class or BC)
        self.lr = 1e-4
        self.train_batch_size = 2000
        self.num_env_runners = 0

    def validate(self) -> None:
        super().validate()
        if self.input_ is None:
            raise ValueError("BC learns from recorded data: set offline_data(input_=path)")
        if self.is_multi_agent:
            raise ValueError("BC here clones a single-agent policy")


class BCLearner(Learner):
    def build_columns(self, module_id: str, chunks: list) -> dict:
        return {"obs": np.concatenate([c["obs"] for c in chunks]).astype(np.float32),
                "actions": np.concatenate([c["actions"] for c in chunks])}

    def compute_loss_for_module(self, module_id: str, batch: dict):
        module = self.modules[module_id]
        inputs = module.forward_train(batch)["action_dist_inputs"]
        logp = module.dist_logp(inputs, batch["actions"])
        loss = -logp.mean()
        return loss, {"policy_loss": _scalar(loss),
                      "entropy": _scalar(module.dist_entropy(inputs).mean())}


class BC(Algorithm):
    config_class = BCConfig
    learner_class = BCLearner

    def setup(self) -> None:
        data = read_transitions(self.config.input_, max_rows=self.config.offline_max_rows)
        self._obs = data["obs"]
        actions = data["actions"]
        if np.issubdtype(actions.dtype, np.floating) and actions.ndim == 1:
            actions = actions.astype(np.float32)
        self._actions = actions
        seed = self.config.seed if self.config.seed is not None else 0
        self._rng = np.random.default_rng([seed & 0xFFFFFFFF, 31])
        if not len(self._obs):
            raise ValueError(f"offline input {self.config.input_!r} holds no transitions")

    def _make_env_runner_group(self):
        from ...env.env_runner_group import EnvRunnerGroup

        config = self.config.copy()
        config.num_env_runners = 0  # BC does not sample while it trains
        return EnvRunnerGroup(config, self.module_specs)

    def training_step(self) -> dict:
        size = min(self.config.total_train_batch_size, len(self._obs))
        rows = self._rng.choice(len(self._obs), size=size, replace=False)
        chunk = {"obs": self._obs[rows], "actions": self._actions[rows]}
        return self._update({DEFAULT_MODULE_ID: [chunk]})
