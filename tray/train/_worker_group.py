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
from tray.util import placement_group, placement_group_table, remove_placement_group
from tray.util.scheduling_strategies import (
    NodeAffinitySchedulingStrategy,
    PlacementGroupSchedulingStrategy,
)

from ._session import WorkerInfo
from ._worker import ReportCollectorActor, TrainWorkerActor
from .config import ScalingConfig
from .error import WorkerGroupStartError


def feasibility_error(scaling: ScalingConfig, nodes: list[dict]) -> str | None:
    """Why the cluster (its alive ``nodes``) can never hold the group, or None."""
    need = scaling.worker_resources()
    alive = [node for node in nodes if node.get("Alive", node.get("alive", False))]
    per_node = []
    for node in alive:
        have = node.get("Resources", {})
        fits = min((int(have.get(name, 0.0) / amount + 1e-9) for name, amount in need.items()),
                   default=0)
        per_node.append(fits)
    wanted = scaling.num_workers
    strategy = scaling.placement_strategy
    if strategy == "STRICT_PACK":
        most = max(per_node, default=0)
        where = "on one node (STRICT_PACK)"
    elif strategy == "STRICT_SPREAD":
        most = sum(1 for fits in per_node if fits > 0)
        where = "on distinct nodes (STRICT_SPREAD)"
    else:
        most = sum(per_node)
        where = "in the whole cluster"
    if most >= wanted:
        return None
    totals: dict[str, float] = {}
    for node in alive:
        for name, amount in node.get("Resources", {}).items():
            if name in need:
                totals[name] = totals.get(name, 0.0) + amount
    missing = [name for name in need if not totals.get(name)]
    detail = (f"no node has {', '.join(repr(m) for m in missing)}" if missing else
              f"the cluster's {len(alive)} alive node(s) have {totals} in all")
    return (f"ScalingConfig(num_workers={wanted}, resources_per_worker={need}, "
            f"placement_strategy={strategy!r}) can never be placed: at most {most} such "
            f"worker(s) fit {where}, and {detail}. Lower num_workers or "
            f"resources_per_worker, or add nodes.")


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
        table = placement_group_table(self.placement_group)["bundles_to_node_id"]
        options = self.scaling.actor_options()
        for bundle, info in rank_bundles({int(b): node for b, node in table.items()}):
            strategy = PlacementGroupSchedulingStrategy(
                self.placement_group, placement_group_bundle_index=bundle)
            self.workers.append(TrainWorkerActor.options(
                scheduling_strategy=strategy, **options).remote())
            self.infos.append(info)
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
