"""The torch form of an RLModule: what the Learner trains and what
``Algorithm.get_module()`` returns.

It carries RLlib's forward methods: ``forward_inference`` and
``forward_exploration`` return ``{"action_dist_inputs": ...}``,
``forward_train`` adds ``"vf_preds"``; ``compute_values`` is the critic.
Weights move in and out as the numpy dict of ``rl_module.py``."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from ..utils import spaces as spaces_module
from .rl_module import RLModuleSpec

OBS = "obs"
ACTION_DIST_INPUTS = "action_dist_inputs"
VF_PREDS = "vf_preds"


def _activation(name: str) -> nn.Module:
    return {"tanh": nn.Tanh, "relu": nn.ReLU, "linear": nn.Identity}[name]()


def _mlp(sizes: list[int], activation: str) -> nn.Sequential:
    layers: list[nn.Module] = []
    for index, (fan_in, fan_out) in enumerate(zip(sizes[:-1], sizes[1:], strict=True)):
        layers.append(nn.Linear(fan_in, fan_out))
        if index < len(sizes) - 2:
            layers.append(_activation(activation))
    return nn.Sequential(*layers)


class TorchRLModule(nn.Module):
    """Policy and value MLPs over flat observations."""

    def __init__(self, spec: RLModuleSpec, weights: dict | None = None) -> None:
        super().__init__()
        spec.validate()
        self.spec = spec
        sizes = spec.layer_sizes()
        self.pi = _mlp(sizes["pi"], spec.activation())
        self.vf = _mlp(sizes["vf"], spec.activation())
        self.discrete = spaces_module.is_discrete(spec.action_space)
        if weights is not None:
            self.set_weights(weights)

    # ---------------------------------------------------------- weights

    def _linears(self, head: str) -> list[nn.Linear]:
        return [layer for layer in getattr(self, head) if isinstance(layer, nn.Linear)]

    def get_weights(self) -> dict:
        return {head: [(layer.weight.detach().cpu().numpy().copy(),
                        layer.bias.detach().cpu().numpy().copy())
                       for layer in self._linears(head)] for head in ("pi", "vf")}

    def set_weights(self, weights: dict) -> None:
        with torch.no_grad():
            for head in ("pi", "vf"):
                linears = self._linears(head)
                if len(linears) != len(weights[head]):
                    raise ValueError(f"weights for {head!r} have {len(weights[head])} layers; "
                                     f"the module has {len(linears)}")
                for layer, (w, b) in zip(linears, weights[head], strict=True):
                    layer.weight.copy_(torch.as_tensor(np.asarray(w)))
                    layer.bias.copy_(torch.as_tensor(np.asarray(b)))

    # ---------------------------------------------------------- forward

    def _obs(self, batch) -> torch.Tensor:
        obs = batch[OBS] if isinstance(batch, dict) else batch
        if not isinstance(obs, torch.Tensor):
            obs = torch.as_tensor(np.asarray(obs, dtype=np.float32))
        return obs.reshape(obs.shape[0], -1).float()

    def forward_inference(self, batch) -> dict:
        with torch.no_grad():
            return {ACTION_DIST_INPUTS: self.pi(self._obs(batch))}

    def forward_exploration(self, batch) -> dict:
        return self.forward_inference(batch)

    def forward_train(self, batch) -> dict:
        obs = self._obs(batch)
        return {ACTION_DIST_INPUTS: self.pi(obs), VF_PREDS: self.vf(obs).squeeze(-1)}

    def compute_values(self, batch) -> torch.Tensor:
        return self.vf(self._obs(batch)).squeeze(-1)

    def forward(self, batch) -> dict:
        return self.forward_train(batch)

    # ---------------------------------------------------- distributions

    def dist_logp(self, inputs: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        if self.discrete:
            logp = torch.log_softmax(inputs, dim=-1)
            return logp.gather(-1, actions.long().reshape(-1, 1)).squeeze(-1)
        mean, log_std = torch.chunk(inputs, 2, dim=-1)
        return (-0.5 * ((actions - mean) / log_std.exp()) ** 2 - log_std
                - 0.5 * float(np.log(2.0 * np.pi))).sum(-1)

    def dist_entropy(self, inputs: torch.Tensor) -> torch.Tensor:
        if self.discrete:
            logp = torch.log_softmax(inputs, dim=-1)
            return -(logp.exp() * logp).sum(-1)
        _, log_std = torch.chunk(inputs, 2, dim=-1)
        return (log_std + 0.5 * float(np.log(2.0 * np.pi * np.e))).sum(-1)

    def dist_kl(self, old_inputs: torch.Tensor, new_inputs: torch.Tensor) -> torch.Tensor:
        """KL(old || new) per row."""
        if self.discrete:
            old = torch.log_softmax(old_inputs, dim=-1)
            new = torch.log_softmax(new_inputs, dim=-1)
            return (old.exp() * (old - new)).sum(-1)
        old_mean, old_log_std = torch.chunk(old_inputs, 2, dim=-1)
        new_mean, new_log_std = torch.chunk(new_inputs, 2, dim=-1)
        return (new_log_std - old_log_std
                + ((2 * old_log_std).exp() + (old_mean - new_mean) ** 2)
                / (2 * (2 * new_log_std).exp()) - 0.5).sum(-1)

    def greedy_action(self, inputs: torch.Tensor) -> torch.Tensor:
        if self.discrete:
            return inputs.argmax(-1)
        return torch.chunk(inputs, 2, dim=-1)[0]
