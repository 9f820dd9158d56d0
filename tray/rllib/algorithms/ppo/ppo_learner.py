"""PPO's loss, in torch (RLlib's ``PPOTorchLearner``, re-derived)."""

from __future__ import annotations

import numpy as np
import torch

from tray.rllib.core.learner import Learner, _scalar, standardize

from ...utils.postprocessing import discounted_returns, gae


class PPOLearner(Learner):
    def setup(self) -> None:
        self.kl_coeffs = {m: float(self.config.kl_coeff) for m in self.modules}

    def build_columns(self, module_id: str, chunks: list) -> dict:
        config = self.config
        values, _logp = self.values_and_logp(module_id, chunks)
        advantages, targets, old_values = [], [], []
        for chunk, chunk_values in zip(chunks, values, strict=True):
            rewards = chunk["rewards"].astype(np.float64)
            if config.use_critic:
                if chunk["terminated"]:
                    chunk_values = chunk_values.copy()
                    chunk_values[-1] = 0.0
                lambda_ = config.lambda_ if config.use_gae else 1.0
                adv, target = gae(rewards, chunk_values, config.gamma, lambda_)
            else:
                target = discounted_returns(rewards, config.gamma)
                adv = target
            advantages.append(adv)
            targets.append(target)
            old_values.append(chunk_values[:-1].astype(np.float32))
        advantages = np.concatenate(advantages)
        return {"obs": np.concatenate([c["obs"][:-1] for c in chunks]).astype(np.float32),
                "actions": np.concatenate([np.asarray(c["actions"]) for c in chunks]),
                "action_logp": np.concatenate([c["action_logp"] for c in chunks]),
                "action_dist_inputs": np.concatenate([c["action_dist_inputs"] for c in chunks]),
                "advantages": standardize(advantages),
                "value_targets": np.concatenate(targets).astype(np.float32),
                "vf_preds": np.concatenate(old_values)}

    def compute_loss_for_module(self, module_id: str, batch: dict):
        config = self.config
        module = self.modules[module_id]
        out = module.forward_train(batch)
        inputs = out["action_dist_inputs"]
        logp = module.dist_logp(inputs, batch["actions"])
        ratio = torch.exp(logp - batch["action_logp"])
        advantages = batch["advantages"]
        surrogate = torch.min(advantages * ratio,
                              advantages * torch.clamp(ratio, 1 - config.clip_param,
                                                       1 + config.clip_param))
        entropy = module.dist_entropy(inputs)
        if config.use_kl_loss:
            mean_kl = module.dist_kl(batch["action_dist_inputs"], inputs).mean()
        else:
            mean_kl = torch.zeros(())
        if config.use_critic:
            vf_loss = (out["vf_preds"] - batch["value_targets"]) ** 2
            vf_loss_clipped = torch.clamp(vf_loss, 0, config.vf_clip_param)
        else:
            vf_loss = vf_loss_clipped = torch.zeros_like(surrogate)
        total = (-surrogate + config.vf_loss_coeff * vf_loss_clipped
                 - config.entropy_coeff * entropy).mean()
        if config.use_kl_loss:
            total = total + self.kl_coeffs[module_id] * mean_kl
        targets = batch["value_targets"]
        variance = torch.var(targets)
        explained = 1.0 - torch.var(targets - out["vf_preds"]) / variance \
            if float(variance) > 0 else torch.zeros(())
        return total, {"policy_loss": _scalar(-surrogate.mean()),
                       "vf_loss": _scalar(vf_loss_clipped.mean()),
                       "vf_loss_unclipped": _scalar(vf_loss.mean()),
                       "vf_explained_var": _scalar(torch.clamp(explained, min=-1.0)),
                       "entropy": _scalar(entropy.mean()),
                       "mean_kl_loss": _scalar(mean_kl), "total_loss": _scalar(total)}

    def after_update(self, module_id: str, stats: dict) -> dict:
        config = self.config
        if not config.use_kl_loss or "mean_kl_loss" not in stats:
            return {}
        kl = stats["mean_kl_loss"]
        if kl > 2.0 * config.kl_target:
            self.kl_coeffs[module_id] *= 1.5
        elif kl < 0.5 * config.kl_target:
            self.kl_coeffs[module_id] *= 0.5
        return {"curr_kl_coeff": self.kl_coeffs[module_id]}

    def extra_state(self) -> dict:
        return {"kl_coeffs": dict(self.kl_coeffs)}

    def set_extra_state(self, state: dict) -> None:
        self.kl_coeffs.update(state.get("kl_coeffs", {}))
