"""Placement groups, as in ``ray.util.placement_group``: bundles of resources
reserved together, atomically, across the cluster's nodes.

``placement_group(bundles, strategy)`` registers a group with the GCS and
returns at once; the GCS's placement-group manager reserves the bundles (a
two-phase prepare/commit, see ``gcs/placement_group_manager.py``).
``pg.ready()`` is an ObjectRef (a tiny task scheduled into the group, as
Ray's) and ``pg.wait(timeout_seconds)`` a bool. Tasks and actors run in a
group with ``PlacementGroupSchedulingStrategy``; a bundle's resources serve
them and nothing else. ``remove_placement_group`` gives the resources back,
kills the actors placed in the group, and fails its pending tasks."""

from __future__ import annotations

import numbers

from ..core.context import current_task, get_worker
from ..core.ids import PlacementGroupID
from ..core.messages import PlacementGroupStatus
from ..core.scheduling import PG_STRATEGIES
from .blocking import block, in_loop
from .remote import remote
from .session import current_namespace


class PlacementGroup:
    """A handle to a placement group; it pickles, so tasks can use it."""

    def __init__(self, pg_id: PlacementGroupID, bundles: list | None = None) -> None:
        self.id = pg_id
        self._bundles = bundles

    @property
    def bundle_specs(self) -> list[dict]:
        """The group's bundles (resource dicts), in order."""
        if self._bundles is None:
            info = _gcs("get_placement_group", self.id.hex())
            if info is None:
                raise ValueError(f"there is no placement group {self.id.hex()}")
            self._bundles = [dict(bundle) for bundle in info.bundles]
        return [dict(bundle) for bundle in self._bundles]

    @property
    def bundle_count(self) -> int:
        return len(self.bundle_specs)

    def ready(self):
        """An ObjectRef that resolves (to this group) once the group is
        placed: usable with ``tray.get`` and ``tray.wait``."""
        from .scheduling_strategies import PlacementGroupSchedulingStrategy

        strategy = PlacementGroupSchedulingStrategy(self, placement_group_bundle_index=0)
        return _bundle_reservation_check.options(scheduling_strategy=strategy).remote(self)

    def wait(self, timeout_seconds: float | None = 30) -> bool:
        """Whether the group is placed within ``timeout_seconds``."""
        if timeout_seconds is not None and (isinstance(timeout_seconds, bool) or not isinstance(
                timeout_seconds, numbers.Real) or timeout_seconds < 0):
            raise ValueError(f"timeout_seconds must be a non-negative number, got "
                             f"{timeout_seconds!r}")
        info = _gcs("wait_placement_group_ready", self.id.hex(), timeout_seconds)
        return info is not None and info.state == PlacementGroupStatus.CREATED

    def __eq__(self, other) -> bool:
        return isinstance(other, PlacementGroup) and other.id == self.id

    def __hash__(self) -> int:
        return hash(self.id)

    def __repr__(self) -> str:
        return f"PlacementGroup({self.id.hex()})"

    def __reduce__(self):
        return (PlacementGroup, (self.id, self._bundles))


@remote(num_cpus=0)
def _bundle_reservation_check(placement_group):
    return placement_group


def _gcs(method: str, *args):
    worker = get_worker()

    async def call():
        return await worker.gcs_call(method, *args)
    return block(worker, call)


def _validate_bundles(bundles) -> list[dict]:
    if not isinstance(bundles, list):
        raise ValueError(f"The type of bundles must be list, got {type(bundles).__name__}")
    if not bundles:
        raise ValueError("The placement group `bundles` argument cannot contain an empty list")
    checked = []
    for bundle in bundles:
        if not isinstance(bundle, dict):
            raise ValueError(f"each bundle must be a dict of resources, got {bundle!r}")
        for name, amount in bundle.items():
            if not isinstance(name, str) or not name:
                raise ValueError(f"resource names in bundles must be strings, got {name!r}")
            if isinstance(amount, bool) or not isinstance(amount, numbers.Real) or amount < 0:
                raise ValueError(f"resource {name!r} in bundle {bundle} must be a non-negative "
                                 f"number, got {amount!r}")
        if not bundle or all(amount == 0 for amount in bundle.values()):
            raise ValueError(f"Bundles cannot be an empty dictionary or resources with only "
                             f"0 values. Bundles: {bundles}")
        checked.append({name: float(amount) for name, amount in bundle.items() if amount > 0})
    return checked


def placement_group(bundles: list[dict], strategy: str = "PACK", name: str = "",
                    lifetime: str | None = None) -> PlacementGroup:
    """Reserve ``bundles`` (resource dicts) together, with ``strategy``:
    ``"PACK"`` (as few nodes as possible), ``"SPREAD"`` (as many as
    possible), ``"STRICT_PACK"`` (one node) or ``"STRICT_SPREAD"`` (a node
    per bundle). Returns at once; ``ready()``/``wait()`` say when it is
    placed. ``lifetime="detached"`` keeps it after its creator exits."""
    checked = _validate_bundles(bundles)
    if strategy not in PG_STRATEGIES:
        raise ValueError(f"Invalid placement group strategy {strategy!r}. Supported "
                         f"strategies are: {', '.join(PG_STRATEGIES)}")
    if not isinstance(name, str):
        raise ValueError(f"the placement group's name must be a string, got {name!r}")
    if lifetime not in (None, "detached"):
        raise ValueError("placement group `lifetime` argument must be either `None` or "
                         f"'detached', got {lifetime!r}")
    worker = get_worker()
    namespace = current_namespace()

    def prepare():
        return worker.prepare_placement_group(bundles=checked, strategy=strategy, name=name,
                                              namespace=namespace,
                                              detached=lifetime == "detached")
    spec = in_loop(worker, prepare)
    _gcs("create_placement_group", spec)
    return PlacementGroup(PlacementGroupID.from_hex(spec.pg_id), checked)


def remove_placement_group(placement_group: PlacementGroup) -> None:
    """Remove the group: its resources return to their nodes, the actors
    placed in it die, and tasks waiting for it fail."""
    if not isinstance(placement_group, PlacementGroup):
        raise TypeError(f"remove_placement_group() expects a PlacementGroup, got "
                        f"{type(placement_group).__name__}")
    _gcs("remove_placement_group", placement_group.id.hex())


def get_placement_group(placement_group_name: str) -> PlacementGroup:
    """The live group of that name in this job's namespace; ValueError if none."""
    if not isinstance(placement_group_name, str) or not placement_group_name:
        raise ValueError("Please supply a non-empty value to get_placement_group")
    info = _gcs("get_named_placement_group", placement_group_name, current_namespace())
    if info is None:
        raise ValueError(f"Failed to look up placement group with name: "
                         f"{placement_group_name}")
    return PlacementGroup(PlacementGroupID.from_hex(info.pg_id), info.bundles)


def _table_row(info) -> dict:
    return {"placement_group_id": info.pg_id, "name": info.name,
            "bundles": {index: dict(bundle) for index, bundle in enumerate(info.bundles)},
            "bundles_to_node_id": dict(sorted(info.bundle_nodes.items())),
            "strategy": info.strategy, "state": info.state.value,
            "is_detached": info.detached}


def placement_group_table(placement_group: PlacementGroup | None = None) -> dict:
    """One group's state (``placement_group_id``, ``name``, ``bundles``,
    ``bundles_to_node_id``, ``strategy``, ``state``), or every group's by id."""
    if placement_group is None:
        return {info.pg_id: _table_row(info) for info in _gcs("list_placement_groups")}
    info = _gcs("get_placement_group", placement_group.id.hex())
    if info is None:
        raise ValueError(f"there is no placement group {placement_group.id.hex()}")
    return _table_row(info)


def get_current_placement_group() -> PlacementGroup | None:
    """The group the running task or actor was scheduled into; None in the
    driver and outside any group."""
    get_worker()  # NotInitializedError before tray.init()
    context = current_task.get(None)
    group = context.placement_group if context is not None else None
    if group is None:
        return None
    return PlacementGroup(PlacementGroupID.from_hex(group.placement_group_id))


__all__ = ["PlacementGroup", "placement_group", "remove_placement_group",
           "get_placement_group", "placement_group_table", "get_current_placement_group"]
