"""Vanilla policy gradient (REINFORCE, Williams 1992), RLlib's old ``PG``.

Whole episodes (``batch_mode="complete_episodes"``) sampled with the
current weights; each action's return-to-go, standardized over the batch
(the mean is the baseline), weights its log-probability. One gradient step
per iteration by default (``num_epochs=1``, the whole batch)."""

from __future__ import annotations

import numpy as np

from tray.rllib.core.learner import Learner, _scalar, standardize

from ...utils.postprocessing import discounted_returns
from ..algorithm import Algorithm
from ..algorithm_config import AlgorithmConfig, NotProvided


class PGConfig(AlgorithmConfig):
    def __init__(self, algo_class=None) -> None:
        super().__init__(algo_class=algo_class or PG)
        self.lr = 0.0004
        self.train_batch_size = 200
        self.batch_mode = "complete_episodes"
        self.entropy_coeff = 0.0

    def training(self, *, entropy_coeff=NotProvided, **kwargs):
        super().training(**kwargs)
        if entropy_coeff is not NotProvided:
            if isinstance(entropy_coeff, bool) or not isinstance(entropy_coeff, int | float) \
                    or entropy_coeff < 0:
                raise ValueError(f"entropy_coeff must be a non-negative number, got "
                                 f"{entropy_coeff!r}")
            self.entropy_coeff = float(entropy_coeff)
        return self

    def validate(self) -> None:
        super().validate()
        if self.batch_mode != "complete_episodes":
            raise ValueError("PG has no critic to bootstrap cut episodes with: it needs "
                             "env_runners(batch_mode='complete_episodes')")


class PGLearner(Learner):
    def build_columns(self, module_id: str, chunks: list) -> dict:
        returns = np.concatenate([discounted_returns(c["rewards"], self.config.gamma)
                                  for c in chunks])
        return {"obs": np.concatenate([c["obs"][:-1] for c in chunks]).astype(np.float32),
                "actions": np.concatenate([np.asarray(c["actions"]) for c in chunks]),
                "advantages": standardize(returns)}

    def compute_loss_for_module(self, module_id: str, batch: dict):
        module = self.modules[module_id]
        inputs = module.forward_train(batch)["action_dist_inputs"]
        logp = module.dist_logp(inputs, batch["actions"])
        entropy = module.dist_entropy(inputs).mean()
        policy_loss = -(logp * batch["advantages"]).mean()
        total = policy_loss - self.config.entropy_coeff * entropy
        return total, {"policy_loss": _scalar(policy_loss), "entropy": _scalar(entropy),
                       "total_loss": _scalar(total)}


class PG(Algorithm):
    config_class = PGConfig
    learner_class = PGLearner

    def training_step(self) -> dict:
        results = self._sample_sync(self.config.total_train_batch_size)
        return self._update(self._merge_chunks(results))
