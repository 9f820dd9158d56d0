"""APPO and IMPALA: asynchronous sampling with V-trace off-policy correction.

The glossary's *asynchronous sampling*: every env runner always has a
sample request in flight; the driver takes fragments as they arrive
(``tray.wait(..., num_returns=1)``), immediately sends that runner a new
request carrying the newest weights ref, and hands the learner a train
batch whenever ``train_batch_size`` env steps have gathered. Runners never
wait for the learner, so fragments may have been sampled with older
weights: each carries the version it used, the result reports the lag
(``env_runners/weights_lag_mean``/``_max``), and V-trace (Espeholt et al.,
2018) corrects the value targets and advantages for it.

IMPALA's loss is the V-trace policy gradient; APPO's (the default here, as
in RLlib) clips the importance ratio as PPO does (``clip_param``)."""

from __future__ import annotations

import numpy as np
import torch

from tray.rllib.core.learner import Learner, _scalar

from ...utils.postprocessing import vtrace
from ..algorithm import Algorithm
from ..algorithm_config import AlgorithmConfig, NotProvided

WAITS_PER_STEP_MAX = 10_000  # bounds a training step whose runners never deliver


class APPOConfig(AlgorithmConfig):
    def __init__(self, algo_class=None) -> None:
        super().__init__(algo_class=algo_class or APPO)
        self.lr = 0.0005
        self.num_env_runners = 2
        self.train_batch_size = 500
        self.rollout_fragment_length = 50
        self.num_epochs = 1
        self.grad_clip = 40.0
        self.vtrace = True
        self.use_clipping = True
        self.clip_param = 0.4
        self.vf_loss_coeff = 0.5
        self.entropy_coeff = 0.01
        self.vtrace_clip_rho_threshold = 1.0
        self.vtrace_clip_pg_rho_threshold = 1.0

    def training(self, *, vtrace=NotProvided, clip_param=NotProvided,
                 vf_loss_coeff=NotProvided, entropy_coeff=NotProvided, **kwargs):
        super().training(**kwargs)
        if vtrace is not NotProvided:
            self.vtrace = bool(vtrace)
        for name, value in (("clip_param", clip_param), ("vf_loss_coeff", vf_loss_coeff),
                            ("entropy_coeff", entropy_coeff)):
            if value is not NotProvided:
                if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
                    raise ValueError(f"{name} must be a non-negative number, got {value!r}")
                setattr(self, name, float(value))
        return self


class IMPALAConfig(APPOConfig):
    def __init__(self, algo_class=None) -> None:
        super().__init__(algo_class=algo_class or IMPALA)
        self.use_clipping = False


class APPOLearner(Learner):
    def build_columns(self, module_id: str, chunks: list) -> dict:
        config = self.config
        values, target_logp = self.values_and_logp(module_id, chunks)
        vs_all, advantages = [], []
        for chunk, chunk_values, chunk_logp in zip(chunks, values, target_logp, strict=True):
            chunk_values = chunk_values.copy()
            if chunk["terminated"]:
                chunk_values[-1] = 0.0
            behaviour = chunk["action_logp"].astype(np.float64)
            rewards = chunk["rewards"].astype(np.float64)
            if config.vtrace:
                vs, adv = vtrace(behaviour, chunk_logp, rewards, chunk_values, config.gamma,
                                 config.vtrace_clip_rho_threshold,
                                 config.vtrace_clip_pg_rho_threshold)
            else:
                vs, adv = vtrace(behaviour, behaviour, rewards, chunk_values, config.gamma)
            vs_all.append(vs)
            advantages.append(adv)
        return {"obs": np.concatenate([c["obs"][:-1] for c in chunks]).astype(np.float32),
                "actions": np.concatenate([np.asarray(c["actions"]) for c in chunks]),
                "action_logp": np.concatenate([c["action_logp"] for c in chunks]),
                "advantages": np.concatenate(advantages).astype(np.float32),
                "value_targets": np.concatenate(vs_all).astype(np.float32)}

    def compute_loss_for_module(self, module_id: str, batch: dict):
        config = self.config
        module = self.modules[module_id]
        out = module.forward_train(batch)
        inputs = out["action_dist_inputs"]
        logp = module.dist_logp(inputs, batch["actions"])
        advantages = batch["advantages"]
        if config.use_clipping:
            ratio = torch.exp(logp - batch["action_logp"])
            surrogate = torch.min(advantages * ratio,
                                  advantages * torch.clamp(ratio, 1 - config.clip_param,
                                                           1 + config.clip_param))
        else:
            surrogate = logp * advantages
        vf_loss = 0.5 * ((out["vf_preds"] - batch["value_targets"]) ** 2).mean()
        entropy = module.dist_entropy(inputs).mean()
        total = -surrogate.mean() + config.vf_loss_coeff * vf_loss - \
            config.entropy_coeff * entropy
        return total, {"policy_loss": _scalar(-surrogate.mean()), "vf_loss": _scalar(vf_loss),
                       "entropy": _scalar(entropy), "total_loss": _scalar(total)}


class APPO(Algorithm):
    config_class = APPOConfig
    learner_class = APPOLearner

    def setup(self) -> None:
        self._buffer: list[dict] = []
        self._buffered_steps = 0
        self._lags: list[int] = []

    def training_step(self) -> dict:
        group = self.env_runner_group
        if group.local_runner is not None:  # no remote runners: nothing to overlap with
            results = self._sample_sync(self.config.total_train_batch_size)
            return self._update(self._merge_chunks(results))
        for _ in range(WAITS_PER_STEP_MAX):
            self._submit_to_idle_runners()
            for result in group.fetch_ready(self.config.sample_timeout_s):
                self._record_sample(result)
                self._lags.append(self.weights_version - result["weights_version"])
                self._buffer.append(result)
                self._buffered_steps += result["env_steps"]
            # Runners that delivered sample on at once, with the newest
            # weights there are, while the learner works.
            self._submit_to_idle_runners()
            if self._buffered_steps >= self.config.total_train_batch_size:
                batch = self._merge_chunks(self._buffer)
                self._buffer, self._buffered_steps = [], 0
                return self._update(batch)
        raise RuntimeError(f"APPO gathered {self._buffered_steps} of "
                           f"{self.config.total_train_batch_size} env steps in "
                           f"{WAITS_PER_STEP_MAX} waits: are the env runners alive?")

    def _submit_to_idle_runners(self) -> None:
        group = self.env_runner_group
        for index in group.indices_without_request():
            group.submit(index, self._weights_for(group), self.weights_version)

    def _extra_env_runner_metrics(self) -> dict:
        lags, self._lags = self._lags, []
        return {"weights_lag_mean": float(np.mean(lags)) if lags else 0.0,
                "weights_lag_max": int(max(lags)) if lags else 0,
                "weights_version": self.weights_version}

    def stop(self) -> None:
        self._buffer = []
        super().stop()


class IMPALA(APPO):
    config_class = IMPALAConfig
