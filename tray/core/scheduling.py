"""Resource accounting and the node-selection policy (pure functions).

The policy follows Ray's hybrid scheduler: pack work on the local node while
it is less than ``local_utilization_threshold`` busy, then prefer the least
utilized node that can run the request now (choosing among the best few with
the seeded RNG, so that equal nodes share load), and when no node has room,
queue on a node that could ever run it. A request no node could *ever* run is
*infeasible*: it waits, with a warning that names what is missing, until a
node that has it joins.

``SPREAD`` walks the feasible nodes round-robin; node affinity pins a node,
hard (fail if it is gone) or soft (fall back to the default policy)."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

EPSILON = 1e-9


def normalize_resources(resources: dict[str, float]) -> dict[str, float]:
    return {name: float(amount) for name, amount in sorted(resources.items()) if amount > 0}


def fits(request: dict[str, float], available: dict[str, float]) -> bool:
    return all(available.get(name, 0.0) + EPSILON >= amount for name, amount in request.items())


def missing(request: dict[str, float], total: dict[str, float]) -> dict[str, float]:
    return {name: amount for name, amount in request.items()
            if total.get(name, 0.0) + EPSILON < amount}


def utilization(total: dict[str, float], available: dict[str, float]) -> float:
    worst = 0.0
    for name, amount in total.items():
        if amount > 0:
            worst = max(worst, (amount - available.get(name, 0.0)) / amount)
    return worst


@dataclass
class NodeView:
    node_id: str  # hex
    address: str  # the node manager's address
    total: dict[str, float]
    available: dict[str, float]
    alive: bool = True


@dataclass(frozen=True)
class Strategy:
    kind: str = "DEFAULT"  # DEFAULT | SPREAD | NODE_AFFINITY
    node_id: str | None = None
    soft: bool = False


INFEASIBLE = "infeasible"


@dataclass
class PolicyState:
    spread_next: int = 0
    rng: random.Random = field(default_factory=lambda: random.Random(0))


def pick_node(request: dict[str, float], strategy: Strategy, local_node_id: str | None,
              view: dict[str, NodeView], state: PolicyState, threshold: float) -> str:
    """The hex id of the node to run on, or INFEASIBLE."""
    alive = [view[node_id] for node_id in sorted(view) if view[node_id].alive]
    feasible = [node for node in alive if fits(request, node.total)]
    if strategy.kind == "NODE_AFFINITY":
        target = view.get(strategy.node_id or "")
        if target is not None and target.alive and fits(request, target.total):
            if not strategy.soft or fits(request, target.available):
                return target.node_id
        if not strategy.soft:
            return INFEASIBLE
    if not feasible:
        return INFEASIBLE
    ready = [node for node in feasible if fits(request, node.available)]
    if strategy.kind == "SPREAD":
        candidates = ready or feasible
        choice = candidates[state.spread_next % len(candidates)]
        state.spread_next += 1
        return choice.node_id
    local = view.get(local_node_id or "")
    if local is not None and local in ready and \
            utilization(local.total, local.available) < threshold:
        return local.node_id
    if ready:
        ranked = sorted(ready, key=lambda node: (utilization(node.total, node.available),
                                                 node.node_id != local_node_id, node.node_id))
        best_score = utilization(ranked[0].total, ranked[0].available)
        best = [node for node in ranked
                if utilization(node.total, node.available) <= best_score + EPSILON]
        if local is not None and local in best:
            return local.node_id
        return best[state.rng.randrange(len(best))].node_id
    if local is not None and local in feasible:
        return local.node_id
    return feasible[0].node_id


class GpuAllocator:
    """Per-device GPU accounting: whole GPUs for ``num_gpus >= 1``, a share
    of one device for fractions (as Ray does)."""

    def __init__(self, count: int) -> None:
        self.free = [1.0] * count

    def can_allocate(self, amount: float) -> bool:
        return self._choose(amount) is not None

    def _choose(self, amount: float) -> list[tuple[int, float]] | None:
        if amount <= 0:
            return []
        if amount >= 1 - EPSILON:
            whole = round(amount)
            ids = [i for i, share in enumerate(self.free) if share >= 1 - EPSILON]
            if abs(amount - whole) > EPSILON or len(ids) < whole:
                return None
            return [(i, 1.0) for i in ids[:whole]]
        for i, share in enumerate(self.free):
            if share + EPSILON >= amount:
                return [(i, amount)]
        return None

    def allocate(self, amount: float) -> list[tuple[int, float]]:
        chosen = self._choose(amount)
        assert chosen is not None, f"cannot allocate {amount} GPUs from {self.free}"
        for i, share in chosen:
            self.free[i] -= share
        return chosen

    def release(self, allocation: list[tuple[int, float]]) -> None:
        for i, share in allocation:
            self.free[i] += share
            assert self.free[i] <= 1 + EPSILON
