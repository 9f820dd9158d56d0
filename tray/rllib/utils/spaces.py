"""Observation and action spaces as the networks see them.

tray.rllib's default models are multilayer perceptrons over a flat float
vector, so every observation space it accepts must flatten: ``Box`` (any
shape, flattened) and ``Discrete`` (one-hot). Action spaces: ``Discrete``
(a categorical distribution over ``n`` logits) and one-dimensional ``Box``
(a diagonal Gaussian whose network output is ``[mean, log_std]``, as RLlib's
default ``TorchDiagGaussian``). Anything else is refused when the algorithm
is built, with the space named, instead of failing deep inside a forward
pass."""

from __future__ import annotations

import numpy as np


def _gym():
    import gymnasium

    return gymnasium


def check_observation_space(space) -> None:
    spaces = _gym().spaces
    if isinstance(space, spaces.Box | spaces.Discrete):
        return
    raise ValueError(f"tray.rllib's default models take Box or Discrete observations; "
                     f"got {space!r}. Flatten it with a gymnasium wrapper "
                     f"(gymnasium.wrappers.FlattenObservation) in your env creator.")


def check_action_space(space) -> None:
    spaces = _gym().spaces
    if isinstance(space, spaces.Discrete):
        return
    if isinstance(space, spaces.Box) and len(space.shape) == 1:
        return
    raise ValueError(f"tray.rllib's default models take Discrete or one-dimensional Box "
                     f"actions; got {space!r}")


def observation_size(space) -> int:
    spaces = _gym().spaces
    if isinstance(space, spaces.Discrete):
        return int(space.n)
    return int(np.prod(space.shape))


def action_dist_size(space) -> int:
    """Width of the policy head's output (RLlib's ``action_dist_inputs``)."""
    spaces = _gym().spaces
    if isinstance(space, spaces.Discrete):
        return int(space.n)
    return 2 * int(space.shape[0])


def is_discrete(space) -> bool:
    return isinstance(space, _gym().spaces.Discrete)


def flatten_observations(space, observations) -> np.ndarray:
    """A batch of observations (a list or an array) as float32 rows."""
    spaces = _gym().spaces
    if isinstance(space, spaces.Discrete):
        index = np.asarray(observations, dtype=np.int64).reshape(-1) - int(space.start)
        out = np.zeros((index.shape[0], int(space.n)), dtype=np.float32)
        out[np.arange(index.shape[0]), index] = 1.0
        return out
    array = np.asarray(observations, dtype=np.float32)
    return array.reshape(array.shape[0], -1)
