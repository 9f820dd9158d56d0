"""The worker group of one attempt: placed all at once, ranked, torn down.

Gang scheduling: the group's bundles (one per worker, ``ScalingConfig``'s
``resources_per_worker``) are reserved as one placement group, which the
GCS places atomically — every bundle or none — so a run never holds half
its workers while it waits for the rest (the deadlock two half-placed runs
would otherwise share). Only when the group is placed are the worker actors
created, one in each bundle.

Ranks follow the placement: nodes in the order of their first bundle, and
on each node its workers in bundle order, so the workers of a node hold
consecutive world ranks (as torchrun numbers them); ``local_rank`` is the
rank within the node, ``node_rank`` the node's position.

A group lives for one attempt. After a failure it is torn down whole — the
placement group removed (its actors die with it), the collector killed —
and the next attempt places a new one: a restarted group may land on other
nodes than the dead one's.
"""

from __future__ import annotations

import tray
from tray.util import placement_group, remove_placement_group
from tray.util.scheduling_strategies import (
    NodeAffinitySchedulingStrategy,
    PlacementGroupSchedulingStrategy,
)

from ._session import WorkerInfo
from ._worker import ReportCollectorActor, TrainWorkerActor
from .config import ScalingConfig
from .error import WorkerGroupStartError


def _fits(need: dict, have: dict) -> int:
    """How many bundles of ``need`` fit in ``have``."""
    return min((int(have.get(name, 0.0) / amount + 1e-9) for name, amount in need.items()),
               default=0)


def _alive(nodes: list[dict]) -> list[dict]:
    return [node for node in nodes if node.get("Alive", node.get("alive", False))]


def feasibility_error(scaling: ScalingConfig, nodes: list[dict],
                      node_types: list[dict] = ()) -> str | None:
    """Why the group can never be placed, or None: no node shape it could
    ever have — an alive node's (``nodes``, as ``tray.nodes()``) or a node
    type the autoscaler may launch (``node_types``: their resources) — holds
    one worker (STRICT_PACK: the whole group). A group larger than the
    cluster of the moment waits for nodes to join (``shortfall``)."""
    need = scaling.worker_resources()
    shapes = [node.get("Resources", {}) for node in _alive(nodes)] + list(node_types)
    strict_pack = scaling.placement_strategy == "STRICT_PACK"
    wanted = scaling.num_workers if strict_pack else 1
    if any(_fits(need, shape) >= wanted for shape in shapes):
        return None
    totals: dict[str, float] = {}
    for shape in shapes:
        for name in need:
            totals[name] = max(totals.get(name, 0.0), shape.get(name, 0.0))
    missing = [name for name in need if not totals.get(name)]
    detail = (f"no node has {', '.join(repr(m) for m in missing)}" if missing else
              f"the largest node{' type' if node_types else ''} has {totals}")
    what = f"{wanted} workers on one node (STRICT_PACK)" if strict_pack else "one worker"
    return (f"ScalingConfig(num_workers={scaling.num_workers}, resources_per_worker={need}, "
            f"placement_strategy={scaling.placement_strategy!r}) can never be placed: no node"
            f"{' or autoscaler node type' if node_types else ''} can hold {what}, and "
            f"{detail}. Lower resources_per_worker, or add a node that fits.")


def shortfall(scaling: ScalingConfig, nodes: list[dict], available: dict) -> str:
    """What the cluster of the moment lacks for the group, in words (for a
    run that waits for resources)."""
    need = scaling.worker_resources()
    alive = _alive(nodes)
    per_node = [_fits(need, node.get("Resources", {})) for node in alive]
    wanted = scaling.num_workers
    strategy = scaling.placement_strategy
    if strategy == "STRICT_PACK":
        most, where = max(per_node, default=0), "on one node (STRICT_PACK)"
    elif strategy == "STRICT_SPREAD":
        most, where = sum(1 for fits in per_node if fits > 0), "on distinct nodes (STRICT_SPREAD)"
    else:
        most, where = sum(per_node), "in the whole cluster"
    free = {name: available.get(name, 0.0) for name in need}
    group = f"{wanted} worker(s) x {need} ({strategy})"
    if most < wanted:
        return (f"{group}: at most {most} fit {where} of {len(alive)} alive node(s): it waits "
                f"for nodes to join (an autoscaler, or 'tray start --address')")
    return f"{group}: other work holds the resources ({free} free now)"


def rank_bundles(bundle_nodes: dict[int, str]) -> list[tuple[int, WorkerInfo]]:
    """(bundle index, the worker's place) in world-rank order."""
    order: list[str] = []
    for bundle in sorted(bundle_nodes):
        node = bundle_nodes[bundle]
        if node not in order:
            order.append(node)
    by_node = {node: sorted(b for b, n in bundle_nodes.items() if n == node) for node in order}
    world_size = len(bundle_nodes)
    ranked = []
    for node_rank, node in enumerate(order):
        bundles = by_node[node]
        for local_rank, bundle in enumerate(bundles):
            ranked.append((bundle, WorkerInfo(
                world_rank=len(ranked), world_size=world_size, local_rank=local_rank,
                local_world_size=len(bundles), node_rank=node_rank, node_id=node)))
    return ranked


class WorkerGroup:
    """The placement group, the worker actors (in rank order) and the collector."""

    def __init__(self, scaling: ScalingConfig, *, run_dir: str, attempt: int,
                 first_checkpoint_index: int) -> None:
        self.scaling = scaling
        self.run_dir = run_dir
        self.attempt = attempt
        self.first_checkpoint_index = first_checkpoint_index
        self.placement_group = None
        self.workers: list = []
        self.infos: list[WorkerInfo] = []
        self.collector = None
        self.started_at = 0.0  # the collector's clock when every actor was up

    def start(self, timeout_s: float) -> None:
        """Place the group and start its actors; ``WorkerGroupStartError`` if
        that takes longer than ``timeout_s``."""
        n = self.scaling.num_workers
        bundles = [dict(self.scaling.worker_resources()) for _ in range(n)]
        self.placement_group = placement_group(bundles,
                                               strategy=self.scaling.placement_strategy)
        ready = self.placement_group.ready()
        done, _ = tray.wait([ready], num_returns=1, timeout=timeout_s)
        if not done:
            raise WorkerGroupStartError(
                f"the placement group of {n} worker(s) x {bundles[0]} "
                f"({self.scaling.placement_strategy}) was not placed within {timeout_s:g} s: "
                f"other work holds the resources, or nodes died")
        tray.get(ready)
        options = self.scaling.actor_options()
        bundles = list(range(n))
        for bundle in bundles:
            strategy = PlacementGroupSchedulingStrategy(
                self.placement_group, placement_group_bundle_index=bundle)
            self.workers.append(TrainWorkerActor.options(
                scheduling_strategy=strategy, **options).remote())
        here = tray.get_runtime_context().get_node_id()
        self.collector = ReportCollectorActor.options(
            num_cpus=0, scheduling_strategy=NodeAffinitySchedulingStrategy(here, soft=True)
        ).remote(n, self.run_dir, self.attempt, self.first_checkpoint_index)
        pings = [worker.ping.remote() for worker in self.workers] + [self.collector.ping.remote()]
        done, _ = tray.wait(pings, num_returns=len(pings), timeout=timeout_s)
        if len(done) < len(pings):
            raise WorkerGroupStartError(f"{len(pings) - len(done)} of the group's actors did "
                                        f"not start within {timeout_s:g} s")
        values = tray.get(pings)  # an actor that died while starting raises here
        self.started_at = values[-1]
        # Ranks follow where the workers are (each ping says its node), not
        # the group's table as read before: a bundle whose node died is
        # placed again elsewhere, and its worker starts there (simtest train
        # chaos seed 214: ranks computed from the table named a dead node).
        by_bundle = dict(zip(bundles, self.workers, strict=True))
        ranked = rank_bundles(dict(zip(bundles, values[:-1], strict=True)))
        self.workers = [by_bundle[bundle] for bundle, _ in ranked]
        self.infos = [info for _, info in ranked]

    def execute(self, function, *args_per_rank: list) -> list:
        """Run ``function(*args)`` on every worker at once (args per rank);
        the refs, in rank order."""
        refs = []
        for rank, worker in enumerate(self.workers):
            refs.append(worker.execute.remote(function, *(a[rank] for a in args_per_rank)))
        return refs

    def shutdown(self) -> None:
        """Tear everything down; safe to call on a half-started group."""
        for actor in [*self.workers, self.collector]:
            if actor is None:
                continue
            try:
                tray.kill(actor)
            except Exception:  # noqa: BLE001 - already dead, or its node is gone
                pass
        if self.placement_group is not None:
            try:
                remove_placement_group(self.placement_group)
            except Exception:  # noqa: BLE001 - the GCS forgot it with a dead node
                pass
        self.workers, self.collector, self.placement_group = [], None, None
