"""Placement groups, as in ``ray.util.placement_group`` (see
``tray.api.placement_group``)."""

from ..api.placement_group import PlacementGroup as PlacementGroup
from ..api.placement_group import get_current_placement_group as get_current_placement_group
from ..api.placement_group import get_placement_group as get_placement_group
from ..api.placement_group import placement_group as placement_group
from ..api.placement_group import placement_group_table as placement_group_table
from ..api.placement_group import remove_placement_group as remove_placement_group

PlacementGroup.__module__ = "tray.util.placement_group"

__all__ = ["PlacementGroup", "placement_group", "remove_placement_group",
           "get_placement_group", "placement_group_table", "get_current_placement_group"]
