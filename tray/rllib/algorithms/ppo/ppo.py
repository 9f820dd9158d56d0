"""PPO: proximal policy optimization (Schulman et al., 2017), RLlib's flagship.

Synchronous sampling of ``train_batch_size`` env steps with the current
weights; the learner computes GAE advantages (standardized over the batch)
and value targets with its critic, then runs ``num_epochs`` passes of
minibatch SGD on the clipped surrogate objective, a clipped value loss, an
entropy bonus and an adaptive KL penalty, as RLlib's ``PPOTorchLearner``."""

from __future__ import annotations

from ..algorithm import Algorithm
from ..algorithm_config import AlgorithmConfig, NotProvided


class PPOConfig(AlgorithmConfig):
    def __init__(self, algo_class=None) -> None:
        super().__init__(algo_class=algo_class or PPO)
        # RLlib's PPO defaults (new API stack).
        self.lr = 5e-5
        self.num_env_runners = 2
        self.train_batch_size = 4000
        self.minibatch_size = 128
        self.num_epochs = 30
        self.use_critic = True
        self.use_gae = True
        self.lambda_ = 1.0
        self.use_kl_loss = True
        self.kl_coeff = 0.2
        self.kl_target = 0.01
        self.vf_loss_coeff = 1.0
        self.entropy_coeff = 0.0
        self.clip_param = 0.3
        self.vf_clip_param = 10.0

    def training(self, *, use_critic=NotProvided, use_gae=NotProvided, lambda_=NotProvided,
                 use_kl_loss=NotProvided, kl_coeff=NotProvided, kl_target=NotProvided,
                 vf_loss_coeff=NotProvided, entropy_coeff=NotProvided, clip_param=NotProvided,
                 vf_clip_param=NotProvided, **kwargs):
        super().training(**kwargs)
        for name, value in (("use_critic", use_critic), ("use_gae", use_gae),
                            ("use_kl_loss", use_kl_loss)):
            if value is not NotProvided:
                setattr(self, name, bool(value))
        for name, value in (("lambda_", lambda_), ("kl_coeff", kl_coeff),
                            ("kl_target", kl_target), ("vf_loss_coeff", vf_loss_coeff),
                            ("entropy_coeff", entropy_coeff), ("clip_param", clip_param),
                            ("vf_clip_param", vf_clip_param)):
            if value is not NotProvided:
                if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
                    raise ValueError(f"{name} must be a non-negative number, got {value!r}")
                setattr(self, name, float(value))
        return self

    def validate(self) -> None:
        super().validate()
        if not 0.0 <= self.lambda_ <= 1.0:
            raise ValueError(f"lambda_ must be within [0, 1], got {self.lambda_}")
        if self.batch_mode == "truncate_episodes" and not self.use_critic:
            raise ValueError("PPO without a critic (use_critic=False) cannot bootstrap cut "
                             "episodes: set env_runners(batch_mode='complete_episodes')")


class PPO(Algorithm):
    config_class = PPOConfig

    @property
    def learner_class(self):
        from .ppo_learner import PPOLearner

        return PPOLearner

    def training_step(self) -> dict:
        results = self._sample_sync(self.config.total_train_batch_size)
        return self._update(self._merge_chunks(results))
