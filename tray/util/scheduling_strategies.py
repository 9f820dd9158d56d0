"""Scheduling strategies, as in ``ray.util.scheduling_strategies``."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class NodeAffinitySchedulingStrategy:
    """Run on the node with hex id ``node_id``. With ``soft=False`` the work
    fails if that node is gone; with ``soft=True`` it runs elsewhere."""

    node_id: str
    soft: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.node_id, str):
            raise ValueError(f"node_id must be a hex string, got {self.node_id!r}")


__all__ = ["NodeAffinitySchedulingStrategy"]
