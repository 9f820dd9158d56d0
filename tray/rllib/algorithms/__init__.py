"""Algorithms: the Algorithm base class, its config, and PPO, PG, APPO/IMPALA, BC."""

from .algorithm import Algorithm
from .algorithm_config import AlgorithmConfig
from .registry import get_algorithm_class

__all__ = ["Algorithm", "AlgorithmConfig", "get_algorithm_class"]
