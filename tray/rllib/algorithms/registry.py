"""Algorithms by name, for ``tune.Tuner("PPO", ...)`` and friends."""

from __future__ import annotations

import importlib

ALGORITHMS = {"PPO": ("ppo", "PPO"), "PG": ("pg", "PG"), "APPO": ("appo", "APPO"),
              "IMPALA": ("appo", "IMPALA"), "BC": ("bc", "BC"),
              "DQN": ("dqn", "DQN")}


def get_algorithm_class(name: str):
    if name not in ALGORITHMS:
        raise ValueError(f"unknown algorithm {name!r}; tray.rllib has {sorted(ALGORITHMS)}")
    module, attribute = ALGORITHMS[name]
    return getattr(importlib.import_module(f"tray.rllib.algorithms.{module}"), attribute)
