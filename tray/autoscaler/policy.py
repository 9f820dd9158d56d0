"""The autoscaling policy: a state machine from (load, provider's nodes, now)
to decisions.

Each round the monitor hands ``Autoscaler.update`` what the GCS says waits
(``ClusterLoad``) and what the provider says exists; ``update`` returns the
decisions (launch N of a type, terminate a node) and the monitor carries
them out. Nothing here does I/O or reads a clock or global randomness, so
the same inputs give the same decisions, in the simulator and in tests.

Algorithm, per round (Ray's ``StandardAutoscaler``/``ResourceDemandScheduler``
in outline, with tray's own code):

1. Reconcile: a provider node whose GCS node died (a crash) is terminated
   at the provider and forgotten; a boot that failed is reported and its
   type backs off (``BOOT_BACKOFF_S`` doubling to ``BOOT_BACKOFF_MAX_S``)
   before the next launch of that type.
2. Bin-pack the demand (queued and infeasible shapes, pending actors,
   placement-group bundles: STRICT_SPREAD bundles each on a node of their
   own, STRICT_PACK bundles as one shape) first-fit-decreasing into the
   free resources of live nodes and the full resources of nodes still
   booting. What does not fit picks new nodes: for each unplaced shape, the
   type that fits it, has no GPU unless the shape needs one (Ray's GPU
   avoidance), and then holds the most of the remaining unplaced demand
   (ties: fewer kinds of resource left idle, then the name), within
   the type's and the cluster's ``max_workers``. A shape no type can hold
   is *infeasible*: reported (Ray's warning), never launched for.
   ``request_resources`` bundles are packed against the nodes' *total*
   resources (a floor for the cluster's size, as in Ray).
3. ``min_workers`` of each type are launched whatever the demand.
4. ``upscaling_speed``: at most ``max(5, upscaling_speed * nodes)`` nodes
   may be booting at once (Ray's rule; 5 lets a small cluster start).
5. Scale down: a worker node with no lease, no bundle and no object in its
   store, whose free resources are its total, is idle from the first round
   that sees it so; idle for ``idle_timeout_s`` it is terminated, unless
   that takes its type below ``min_workers`` or the node is needed for
   ``request_resources``. A node is never terminated while it runs work
   or holds objects (they may be the only copy an owner needs).

Bounds: ``DECISIONS_MAX`` recent decisions are kept; per round at most
``DEMAND_UNITS_MAX`` units of demand are packed (the rest are counted and
packed in later rounds, once these are placed)."""

from __future__ import annotations

import collections
import logging
from dataclasses import dataclass, field

from .config import AutoscalingConfig

logger = logging.getLogger("tray.autoscaler")

EPSILON = 1e-9
DECISIONS_MAX = 100
DEMAND_UNITS_MAX = 20_000
BOOT_BACKOFF_S = 5.0
BOOT_BACKOFF_MAX_S = 300.0
# A booted node the GCS has not listed alive within this is taken for lost.
REGISTRATION_TIMEOUT_S = 20.0
# Ray: "the number of nodes allowed to be pending" is at least this.
PENDING_NODES_MIN = 5

# Provider node states.
LAUNCHING, RUNNING, FAILED, TERMINATED = "launching", "running", "failed", "terminated"


@dataclass(frozen=True)
class ProviderNode:
    """A node as the provider knows it."""
    provider_id: str
    node_type: str
    state: str  # LAUNCHING | RUNNING | FAILED | TERMINATED
    node_id: str | None = None  # the tray node id once its node registered
    error: str = ""  # why its boot failed


@dataclass(frozen=True)
class Decision:
    at_s: float
    action: str  # launch | terminate | boot_failed | node_lost | infeasible
    node_type: str
    count: int = 1
    reason: str = ""
    provider_id: str = ""


@dataclass(frozen=True)
class AutoscalerStatus:
    """What ``tray status`` shows (as ``ray status`` does)."""
    at_s: float
    nodes_by_type: dict  # type -> running count
    launching_by_type: dict  # type -> booting count
    idle: tuple  # (provider id, type, idle seconds)
    pending_demand: tuple  # (shape, count) not placed on current nodes
    infeasible: tuple  # shapes no node type can hold
    failed_boots: int
    decisions: tuple  # the most recent Decision records, oldest first


def _fits(request: dict, free: dict) -> bool:
    return all(free.get(name, 0.0) + EPSILON >= amount for name, amount in request.items())


def _take(request: dict, free: dict) -> None:
    for name, amount in request.items():
        free[name] = free.get(name, 0.0) - amount


def _add(a: dict, b: dict) -> dict:
    out = dict(a)
    for name, amount in b.items():
        out[name] = out.get(name, 0.0) + amount
    return out


@dataclass
class _Bin:
    free: dict
    node_type: str
    new: bool = False
    strict_groups: set = field(default_factory=set)  # STRICT_SPREAD groups placed here


class Autoscaler:
    def __init__(self, config: AutoscalingConfig) -> None:
        self.config = config
        self.idle_since: dict[str, float] = {}  # provider id -> when it was first seen idle
        self.decisions: collections.deque = collections.deque(maxlen=DECISIONS_MAX)
        self.boot_failures: dict[str, int] = {}  # type -> consecutive failed boots
        self.backoff_until: dict[str, float] = {}  # type -> no launch before
        self.failed_boots = 0
        self._seen_failed: set = set()
        self._registered: set = set()  # provider ids whose node the GCS listed alive
        self._booted_at: dict[str, float] = {}  # booted, not registered yet: since when
        self._warned_infeasible: set = set()
        self.status: AutoscalerStatus | None = None

    # ------------------------------------------------------------- helpers

    def _decide(self, decisions: list, decision: Decision) -> None:
        decisions.append(decision)
        self.decisions.append(decision)

    def _demand_units(self, load) -> list:
        """The demand as [resources, group id or None, count], biggest first."""
        units: list = []
        for shape, count in load.shapes:
            units.append([dict(shape), None, min(count, DEMAND_UNITS_MAX)])
        for pg_id, strategy, bundles in load.placement_groups:
            if strategy == "STRICT_PACK":
                total: dict = {}
                for bundle in bundles:
                    total = _add(total, bundle)
                units.append([total, None, 1])
            elif strategy == "STRICT_SPREAD":
                units += [[dict(bundle), pg_id, 1] for bundle in bundles]
            else:
                units += [[dict(bundle), None, 1] for bundle in bundles]
        # First-fit decreasing: the biggest requests first.
        units.sort(key=lambda unit: (-sum(unit[0].values()), sorted(unit[0].items()),
                                     unit[1] or ""))
        return units

    @staticmethod
    def _how_many(resources: dict, free: dict, wanted: int) -> int:
        fit = wanted
        for name, amount in resources.items():
            if amount > EPSILON:
                fit = min(fit, int((free.get(name, 0.0) + EPSILON) // amount))
        return max(fit, 0)

    def _place(self, units: list, bins: list) -> list:
        """Place as much of ``units`` into ``bins`` as fits (first fit,
        updating the bins); returns what is left, in the same form."""
        left = []
        for resources, group, count in units:
            for current in bins:
                if count == 0:
                    break
                if group is not None:
                    if group in current.strict_groups or not _fits(resources, current.free):
                        continue
                    taken = 1
                    current.strict_groups.add(group)
                else:
                    taken = self._how_many(resources, current.free, count)
                for name, amount in resources.items():
                    current.free[name] = current.free.get(name, 0.0) - amount * taken
                count -= taken
            if count:
                left.append([resources, group, count])
        return left

    # -------------------------------------------------------------- a round

    def update(self, load, provider_nodes: list, now: float,
               objects_held: dict | None = None) -> list[Decision]:
        """The decisions for this round (see the module header).
        ``objects_held``: node id -> bytes in its object store (a node not
        listed holds none)."""
        config = self.config
        objects_held = objects_held or {}
        decisions: list[Decision] = []
        gcs_nodes = {node.node_id: node for node in load.nodes}
        live: list[ProviderNode] = []
        launching: list[ProviderNode] = []
        # 1. Reconcile with the provider (forgetting nodes it no longer lists).
        listed = {node.provider_id for node in provider_nodes}
        self._seen_failed &= listed
        self._registered &= listed
        for provider_id in sorted(set(self._booted_at) - listed):
            del self._booted_at[provider_id]
        for provider_id in sorted(set(self.idle_since) - listed):
            del self.idle_since[provider_id]
        for node in sorted(provider_nodes, key=lambda n: n.provider_id):
            if node.state == FAILED:
                if node.provider_id not in self._seen_failed:
                    self._seen_failed.add(node.provider_id)
                    self.failed_boots += 1
                    failures = self.boot_failures.get(node.node_type, 0) + 1
                    self.boot_failures[node.node_type] = failures
                    backoff = min(BOOT_BACKOFF_S * 2 ** (failures - 1), BOOT_BACKOFF_MAX_S)
                    self.backoff_until[node.node_type] = now + backoff
                    self._decide(decisions, Decision(
                        now, "boot_failed", node.node_type, reason=f"{node.error}; next "
                        f"launch of this type in {backoff:g} s", provider_id=node.provider_id))
                continue
            if node.state == LAUNCHING:
                launching.append(node)
            elif node.state == RUNNING:
                if node.node_id in gcs_nodes:
                    self._registered.add(node.provider_id)
                elif node.provider_id in self._registered:
                    # Registered, then gone from the GCS's live nodes: it died.
                    self._registered.discard(node.provider_id)
                    self.idle_since.pop(node.provider_id, None)
                    self._decide(decisions, Decision(
                        now, "node_lost", node.node_type, reason="its node died",
                        provider_id=node.provider_id))
                    continue
                if node.node_id not in gcs_nodes:
                    since = self._booted_at.setdefault(node.provider_id, now)
                    if now - since > REGISTRATION_TIMEOUT_S:
                        # Booted and never seen alive: it died before the
                        # first round that could see it.
                        self._booted_at.pop(node.provider_id, None)
                        self._decide(decisions, Decision(
                            now, "node_lost", node.node_type, reason="booted but did not "
                            f"register within {REGISTRATION_TIMEOUT_S:g} s",
                            provider_id=node.provider_id))
                        continue
                    launching.append(node)  # booted, not registered yet
                    continue
                self._booted_at.pop(node.provider_id, None)
                self.boot_failures.pop(node.node_type, None)
                live.append(node)
        counts = collections.Counter(node.node_type for node in live + launching)
        total_workers = len(live) + len(launching)

        # 2. Bin-pack the demand.
        bins: list[_Bin] = []
        by_node_id = {node.node_id: node for node in live}
        for node_id, gcs_node in sorted(gcs_nodes.items()):
            owner = by_node_id.get(node_id)
            bins.append(_Bin(dict(gcs_node.available),
                             owner.node_type if owner else config.head_node_type))
        for node in launching:
            bins.append(_Bin(dict(config.node_types[node.node_type].resources),
                             node.node_type))
        unplaced = self._place(self._demand_units(load), bins)
        # request_resources: against the nodes' totals.
        total_bins = [_Bin(dict(gcs_nodes[node_id].total), "") for node_id in sorted(gcs_nodes)]
        total_bins += [_Bin(dict(config.node_types[node.node_type].resources), "")
                       for node in launching]
        requested = sorted(([dict(bundle), None, 1] for bundle in load.requested),
                           key=lambda unit: (-sum(unit[0].values()), sorted(unit[0].items())))
        unplaced_requested = self._place(requested, total_bins)
        types = config.worker_types()
        infeasible = []
        feasible_unplaced = []
        for unit in unplaced + unplaced_requested:
            if any(_fits(unit[0], t.resources) for t in types):
                feasible_unplaced.append(unit)
            else:
                infeasible.append(unit[0])
        for shape in infeasible:
            key = tuple(sorted(shape.items()))
            if key not in self._warned_infeasible and len(self._warned_infeasible) < 1000:
                self._warned_infeasible.add(key)
                logger.warning("No available node types can fulfill resource request %s. "
                               "Add suitable node types to this cluster to resolve this "
                               "issue.", shape)
                self._decide(decisions, Decision(now, "infeasible", "", reason=str(shape)))
        # Room to launch: the cluster's and each type's max, the pending limit.
        pending_max = max(PENDING_NODES_MIN,
                          int(config.upscaling_speed * max(1, len(live) + 1)))
        room = min(config.max_workers - total_workers, pending_max - len(launching))
        to_launch: collections.Counter = collections.Counter()

        def can_launch(node_type) -> bool:
            return room - sum(to_launch.values()) > 0 and \
                counts[node_type.name] + to_launch[node_type.name] < node_type.max_workers \
                and self.backoff_until.get(node_type.name, -1.0) <= now

        # 3. min_workers first.
        for node_type in types:
            while counts[node_type.name] + to_launch[node_type.name] < node_type.min_workers \
                    and can_launch(node_type):
                to_launch[node_type.name] += 1
                bins.append(_Bin(dict(node_type.resources), node_type.name, new=True))
        if any(to_launch.values()):
            # The min_workers nodes take demand first.
            feasible_unplaced = self._place(feasible_unplaced, [b for b in bins if b.new])
        # Then new nodes for what is left.
        while feasible_unplaced:
            unit = feasible_unplaced[0]
            candidates = [t for t in types if _fits(unit[0], t.resources) and can_launch(t)]
            if not candidates:
                feasible_unplaced.pop(0)
                continue

            def score(node_type, demand=feasible_unplaced, unit=unit):
                trial = _Bin(dict(node_type.resources), node_type.name)
                left = self._place([list(other) for other in demand], [trial])
                held = sum(other[2] for other in demand) - sum(other[2] for other in left)
                idle_kinds = sum(1 for amount in trial.free.values() if amount > EPSILON)
                # As Ray's scorer: a GPU node only for work that needs a GPU.
                wastes_gpu = node_type.resources.get("GPU", 0.0) > 0 and \
                    unit[0].get("GPU", 0.0) <= 0
                return (wastes_gpu, -held, idle_kinds, node_type.name)
            chosen = min(candidates, key=score)
            new_bin = _Bin(dict(chosen.resources), chosen.name, new=True)
            to_launch[chosen.name] += 1
            feasible_unplaced = self._place(feasible_unplaced, [new_bin])
        for name, count in sorted(to_launch.items()):
            if count:
                self._decide(decisions, Decision(now, "launch", name, count=count,
                                                 reason="min_workers" if counts[name] <
                                                 config.node_types[name].min_workers
                                                 else "pending demand"))

        # 5. Scale down idle nodes.
        needed_for_request = set()
        if load.requested:
            # Keep the nodes request_resources needs: pack it onto the live
            # nodes, biggest first, and keep those it used.
            used_bins = [(_Bin(dict(gcs_nodes[node.node_id].total), node.node_type), node)
                         for node in live]
            for resources, _group, _count in requested:
                for trial, node in used_bins:
                    if _fits(resources, trial.free):
                        _take(resources, trial.free)
                        needed_for_request.add(node.provider_id)
                        break
        remaining = collections.Counter(node.node_type for node in live + launching)
        idle_report = []
        for node in live:
            gcs_node = gcs_nodes[node.node_id]
            idle = gcs_node.leases == 0 and gcs_node.bundles == 0 and \
                objects_held.get(node.node_id, 0) == 0 and \
                all(gcs_node.available.get(name, 0.0) + EPSILON >= amount
                    for name, amount in gcs_node.total.items())
            if not idle:
                self.idle_since.pop(node.provider_id, None)
                continue
            since = self.idle_since.setdefault(node.provider_id, now)
            idle_report.append((node.provider_id, node.node_type, now - since))
            if now - since < config.idle_timeout_s or node.provider_id in needed_for_request:
                continue
            if remaining[node.node_type] <= config.node_types[node.node_type].min_workers:
                continue
            remaining[node.node_type] -= 1
            self.idle_since.pop(node.provider_id, None)
            self._decide(decisions, Decision(
                now, "terminate", node.node_type, reason=f"idle for {now - since:g} s",
                provider_id=node.provider_id))
        pending: collections.Counter = collections.Counter()
        for resources, _group, count in unplaced:
            pending[tuple(sorted(resources.items()))] += count
        self.status = AutoscalerStatus(
            at_s=now, nodes_by_type=dict(sorted(collections.Counter(
                n.node_type for n in live).items())),
            launching_by_type=dict(sorted(collections.Counter(
                n.node_type for n in launching).items())),
            idle=tuple(idle_report),
            pending_demand=tuple((dict(key), count) for key, count in sorted(pending.items())),
            infeasible=tuple(infeasible[:20]), failed_boots=self.failed_boots,
            decisions=tuple(list(self.decisions)[-20:]))
        return decisions
