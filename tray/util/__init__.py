"""Utilities with Ray's names (``tray.util.scheduling_strategies``)."""

from . import scheduling_strategies as scheduling_strategies
from .actor_pool import ActorPool as ActorPool
