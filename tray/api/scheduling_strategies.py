"""Scheduling strategies, as in ``ray.util.scheduling_strategies``."""

from __future__ import annotations

from dataclasses import dataclass

from ..core.ids import PlacementGroupID


@dataclass(frozen=True)
class NodeAffinitySchedulingStrategy:
    """Run on the node with hex id ``node_id``. With ``soft=False`` the work
    fails if that node is gone; with ``soft=True`` it runs elsewhere."""

    node_id: str
    soft: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.node_id, str):
            raise ValueError(f"node_id must be a hex string, got {self.node_id!r}")


@dataclass(frozen=True)
class PlacementGroupSchedulingStrategy:
    """Run in a bundle of ``placement_group`` (``-1``: any of its bundles).
    With ``placement_group_capture_child_tasks=True``, the tasks and actors
    this one creates without a strategy of their own run in the group too."""

    placement_group: object
    placement_group_bundle_index: int = -1
    placement_group_capture_child_tasks: bool | None = None

    def __post_init__(self) -> None:
        # A PlacementGroup (``tray.api.placement_group``, which imports this
        # module to run ``ready()`` in its group): an id and bundles.
        if not isinstance(getattr(self.placement_group, "id", None), PlacementGroupID) or \
                not hasattr(self.placement_group, "bundle_count"):
            raise ValueError(f"placement_group must be a PlacementGroup (from "
                             f"tray.util.placement_group()), got {self.placement_group!r}")
        index = self.placement_group_bundle_index
        count = self.placement_group.bundle_count
        if isinstance(index, bool) or not isinstance(index, int) or not -1 <= index < count:
            raise ValueError(f"placement_group_bundle_index {index!r} is invalid: the group "
                             f"has {count} bundle(s), so use -1 (any) or 0..{count - 1}")


__all__ = ["NodeAffinitySchedulingStrategy", "PlacementGroupSchedulingStrategy"]
