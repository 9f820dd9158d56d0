"""RLModule specs, initial weights, and the numpy policy the env runners act with.

An RLModule here is a pair of multilayer perceptrons: a policy head that
outputs the action distribution's inputs, and a separate value head
(RLlib's default ``vf_share_layers=False``). It exists in two forms with
the same weights:

* a torch ``nn.Module`` (``tray.rllib.core.torch_rl_module``) in the
  Learner, which trains it, and returned by ``Algorithm.get_module()``;
* a :class:`NumpyPolicy` in every EnvRunner, which only acts.

Why two: env runners are many small actors that do a forward pass of a tiny
network per step. In numpy that pass costs microseconds, and the runners
never import torch (about a second and a hundred MB per process), so they
start fast and the whole sampling path runs, and is tested, without torch
installed. The Learner recomputes every quantity it trains on (log-probs,
values) with its own torch copy, so the two forms never have to agree to
the last bit.

Weights are a plain dict ``{"pi": [(W, b), ...], "vf": [(W, b), ...]}`` of
float32 arrays (``W`` is ``out x in``, as ``torch.nn.Linear`` stores it):
that is what goes through the object store once per iteration. Initial
weights are drawn by numpy from the config's seed (RLlib's ``normc``
initializer: columns of unit norm, the last policy layer scaled to 0.01),
so a seed fixes the network on every backend without touching torch's
global RNG."""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field

import numpy as np

from ..utils import spaces as spaces_module

DEFAULT_MODULE_ID = "default_policy"
ACTIVATIONS = ("tanh", "relu", "linear")


@dataclass
class RLModuleSpec:
    """What a module is: its spaces and its model config (RLlib's names:
    ``fcnet_hiddens``, ``fcnet_activation``, ``free_log_std`` unsupported)."""
    observation_space: object = None
    action_space: object = None
    model_config: dict = field(default_factory=dict)

    def hiddens(self) -> list[int]:
        hiddens = list(self.model_config.get("fcnet_hiddens", [256, 256]))
        for size in hiddens:
            if isinstance(size, bool) or not isinstance(size, int) or size < 1:
                raise ValueError(f"model_config['fcnet_hiddens'] must be positive integers, "
                                 f"got {hiddens!r}")
        return hiddens

    def activation(self) -> str:
        activation = self.model_config.get("fcnet_activation", "tanh")
        if activation not in ACTIVATIONS:
            raise ValueError(f"model_config['fcnet_activation'] must be one of {ACTIVATIONS}, "
                             f"got {activation!r}")
        return activation

    def validate(self) -> None:
        spaces_module.check_observation_space(self.observation_space)
        spaces_module.check_action_space(self.action_space)
        self.hiddens()
        self.activation()

    def layer_sizes(self) -> dict[str, list[int]]:
        obs = spaces_module.observation_size(self.observation_space)
        hidden = self.hiddens()
        return {"pi": [obs, *hidden, spaces_module.action_dist_size(self.action_space)],
                "vf": [obs, *hidden, 1]}

    def initial_weights(self, seed: int, module_id: str = DEFAULT_MODULE_ID) -> dict:
        """Seeded normc weights: the same network for the same (seed, module)."""
        rng = np.random.default_rng([seed & 0xFFFFFFFF, zlib.crc32(module_id.encode())])
        weights = {}
        for head, sizes in self.layer_sizes().items():
            layers = []
            for index, (fan_in, fan_out) in enumerate(zip(sizes[:-1], sizes[1:], strict=True)):
                last = index == len(sizes) - 2
                std = (0.01 if head == "pi" else 1.0) if last else 1.0
                w = rng.standard_normal((fan_out, fan_in)).astype(np.float32)
                w *= std / np.sqrt(np.square(w).sum(axis=1, keepdims=True))
                layers.append((w, np.zeros(fan_out, dtype=np.float32)))
            weights[head] = layers
        return weights


@dataclass
class MultiRLModuleSpec:
    """Several modules by id (multi-agent: one per policy)."""
    module_specs: dict = field(default_factory=dict)


def _activate(x: np.ndarray, activation: str) -> np.ndarray:
    if activation == "tanh":
        return np.tanh(x)
    if activation == "relu":
        return np.maximum(x, 0.0)
    return x


def mlp_forward(layers: list, x: np.ndarray, activation: str) -> np.ndarray:
    for index, (w, b) in enumerate(layers):
        x = x @ w.T + b
        if index < len(layers) - 1:
            x = _activate(x, activation)
    return x


class NumpyPolicy:
    """The acting half of an RLModule, in numpy: distribution inputs,
    sampled (or greedy) actions and their log-probabilities."""

    def __init__(self, spec: RLModuleSpec, weights: dict | None = None) -> None:
        self.spec = spec
        self.activation = spec.activation()
        self.discrete = spaces_module.is_discrete(spec.action_space)
        self.weights = weights

    def set_weights(self, weights: dict) -> None:
        self.weights = weights

    def dist_inputs(self, obs_flat: np.ndarray) -> np.ndarray:
        assert self.weights is not None, "the policy has no weights yet"
        return mlp_forward(self.weights["pi"], obs_flat, self.activation)

    def value(self, obs_flat: np.ndarray) -> np.ndarray:
        return mlp_forward(self.weights["vf"], obs_flat, self.activation)[:, 0]

    def act(self, obs_flat: np.ndarray, rng: np.random.Generator, explore: bool,
            epsilon: float | None = None):
        """(actions, logp, dist_inputs) for a batch of flat observations.
        With ``epsilon`` (DQN) the outputs are Q-values: greedy, or with
        probability ``epsilon`` (when exploring) a uniformly random action."""
        inputs = self.dist_inputs(obs_flat).astype(np.float64)
        if epsilon is not None:
            actions = inputs.argmax(axis=1)
            if explore and epsilon > 0:
                random_actions = rng.integers(0, inputs.shape[1], size=inputs.shape[0])
                actions = np.where(rng.random(inputs.shape[0]) < epsilon, random_actions, actions)
            return (actions.astype(np.int64), np.zeros(inputs.shape[0], np.float32),
                    inputs.astype(np.float32))
        if self.discrete:
            shifted = inputs - inputs.max(axis=1, keepdims=True)
            logp_all = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
            if explore:
                uniform = rng.random(inputs.shape[0])
                cumulative = np.cumsum(np.exp(logp_all), axis=1)
                actions = np.minimum((cumulative < uniform[:, None]).sum(axis=1),
                                     inputs.shape[1] - 1)
            else:
                actions = inputs.argmax(axis=1)
            logp = logp_all[np.arange(inputs.shape[0]), actions]
            return actions.astype(np.int64), logp.astype(np.float32), inputs.astype(np.float32)
        dim = inputs.shape[1] // 2
        mean, log_std = inputs[:, :dim], inputs[:, dim:]
        std = np.exp(log_std)
        actions = mean + std * rng.standard_normal(mean.shape) if explore else mean
        logp = (-0.5 * np.square((actions - mean) / std) - log_std
                - 0.5 * np.log(2.0 * np.pi)).sum(axis=1)
        return actions.astype(np.float32), logp.astype(np.float32), inputs.astype(np.float32)


def env_action(space, action):
    """An action as the env takes it (Box actions clipped to the bounds, as
    RLlib's ``clip_actions``/``normalize_actions`` protect the env)."""
    if spaces_module.is_discrete(space):
        return int(action) + int(space.start)
    return np.clip(np.asarray(action, dtype=space.dtype), space.low, space.high)
