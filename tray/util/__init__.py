"""Utilities with Ray's names (``tray.util.scheduling_strategies``,
``tray.util.placement_group``, ...)."""

from . import scheduling_strategies as scheduling_strategies
from .actor_pool import ActorPool as ActorPool
from .placement_group import PlacementGroup as PlacementGroup
from .placement_group import get_current_placement_group as get_current_placement_group
from .placement_group import get_placement_group as get_placement_group
from .placement_group import placement_group as placement_group
from .placement_group import placement_group_table as placement_group_table
from .placement_group import remove_placement_group as remove_placement_group
