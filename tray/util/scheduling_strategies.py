"""Scheduling strategies under Ray's module name (``ray.util.scheduling_strategies``)."""

from ..api.scheduling_strategies import (
    NodeAffinitySchedulingStrategy as NodeAffinitySchedulingStrategy,
)
from ..api.scheduling_strategies import (
    PlacementGroupSchedulingStrategy as PlacementGroupSchedulingStrategy,
)

__all__ = ["NodeAffinitySchedulingStrategy", "PlacementGroupSchedulingStrategy"]
