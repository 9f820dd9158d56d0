"""Seeded fault schedules ("swarm" testing) and their injection.

A profile names the fault kinds a sweep may use; each seed draws its own
subset of them and its own parameters (how many faults, when, how long a
partition lasts, how slow the slow node is) from
``random.Random(f"{seed}:faults")``, so two seeds of one profile torture the
cluster differently and one seed always the same way. The schedule is a
plain list of ``Fault``s, planned before the run: it is printed with every
failure. Targets (which worker, which node) are drawn when a fault fires,
from the cluster's sorted state, with the schedule's own RNG, so they are as
reproducible as the schedule.

Faults go through the simulator's fault API on ``tray.simtest.cluster()``.
A fault kind whose method the cluster does not have is left out of the
schedule (``available_kinds``), so a profile degrades instead of failing.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import trio

# Which cluster methods each fault kind needs.
KIND_NEEDS = {
    "worker_crash": (),  # kill_worker, or the spawner's process kill
    "node_crash": ("kill_node", "restart_node"),
    "gcs_restart": ("restart_gcs",),
    "partition": ("partition", "heal"),
    "stall": ("stall",),
    "reset": ("reset_connections",),
    "slow_node": ("slow_node",),
    # Duplicate deliveries: a node's connections lag, then break, and the
    # senders send again every reliable message whose acknowledgement the
    # lag lost (``replay_after_reset``): each must be handled once.
    "duplicate": ("replay_after_reset",),
}

ALL_KINDS = tuple(KIND_NEEDS)

PROFILES = {
    "none": (),
    "crash": ("worker_crash",),
    "network": ("partition", "stall", "reset", "slow_node", "duplicate"),
    # The default sweep's: every kind that tray survives (today, all of them).
    "default": ALL_KINDS,
    # Every kind, more of each, over a longer window, overlapping on
    # purpose, and with BUGGIFY knobs (see ``plan`` and ``buggify_config``).
    "chaos": ALL_KINDS,
}

# Every kind on its own is a profile too ("--faults stall").
PROFILES.update({kind: (kind,) for kind in KIND_NEEDS})

# Kinds that kill processes: with them, errors such as WorkerCrashedError
# and ActorDiedError are permitted outcomes.
# A partition counts: the GCS may declare the isolated node dead, and the
# node then fences itself (its workers and objects are gone).
KILLING_KINDS = {"worker_crash", "node_crash", "reset", "partition", "duplicate"}
# Kinds drawn from a random stream of their own (added after the others
# were: the schedules and targets of the other kinds stay what they were).
SEPARATE_KINDS = ("duplicate",)

FAULT_WINDOW_S = 0.6  # faults fire in [0, FAULT_WINDOW_S) of virtual time
CHAOS_WINDOW_S = 1.5  # the chaos profile's window: faults land amid later work too


@dataclass(frozen=True)
class Fault:
    at_s: float
    kind: str
    params: tuple = ()

    def describe(self) -> str:
        extra = " ".join(f"{k}={v}" for k, v in self.params)
        return f"t={self.at_s:.3f}s {self.kind}" + (f" {extra}" if extra else "")


def available_kinds(cluster) -> set:
    return {kind for kind, needs in KIND_NEEDS.items()
            if all(hasattr(cluster, name) for name in needs)}


def plan(seed: int, profile: str, kinds_available: set, num_nodes: int) -> list[Fault]:
    """The seed's fault schedule: a random subset of the profile's kinds
    (swarm testing), each with random counts, times and parameters."""
    if profile not in PROFILES:
        raise ValueError(f"unknown fault profile {profile!r}; choose from {sorted(PROFILES)}")
    rng = random.Random(f"{seed}:faults")
    every_kind = [k for k in PROFILES[profile] if k in kinds_available]
    if num_nodes < 2:
        every_kind = [k for k in every_kind if k not in ("node_crash", "partition")]
    kinds = [k for k in every_kind if k not in SEPARATE_KINDS]
    separate = [k for k in every_kind if k in SEPARATE_KINDS]
    chaos = profile == "chaos"
    if not kinds:
        return sorted(_separate_kinds(seed, separate, chaos, forced=True),
                      key=lambda f: (f.at_s, f.kind))
    pick_p, most, window_s = (0.85, 5, CHAOS_WINDOW_S) if chaos else (0.6, 3, FAULT_WINDOW_S)
    chosen = [k for k in kinds if rng.random() < pick_p] or [rng.choice(kinds)]
    faults = []
    for kind in chosen:
        for _ in range(rng.randint(2 if chaos else 1, most)):
            at_s = round(rng.random() * window_s, 4)
            params: tuple = ()
            if kind == "node_crash":
                params = (("restart_after_s", round(rng.uniform(0.05, 1.5), 3)),)
            elif kind == "gcs_restart":
                params = (("down_for_s", round(rng.uniform(0.0, 0.5), 3)),)
            elif kind == "partition":
                params = (("one_way", rng.random() < 0.3), ("heal_after_s",
                                                            round(rng.uniform(0.02, 0.8), 3)))
            elif kind == "stall":
                params = (("seconds", round(rng.uniform(0.01, 0.4), 3)),)
            elif kind == "slow_node":
                params = (("factor", round(rng.uniform(2.0, 50.0), 1)),)
            faults.append(Fault(at_s, kind, params))
    if chaos:
        faults += _overlaps(rng, faults, num_nodes)
    faults += _separate_kinds(seed, separate, chaos)
    return _space_gcs_restarts(sorted(faults, key=lambda f: (f.at_s, f.kind)))


def _separate_kinds(seed: int, kinds: list, chaos: bool, forced: bool = False) -> list[Fault]:
    """The faults of ``SEPARATE_KINDS``, each drawn from its own stream
    (``forced``: the profile has no other kind, so each is chosen)."""
    faults = []
    for kind in kinds:
        rng = random.Random(f"{seed}:faults:{kind}")
        pick_p, most, window_s = (0.9, 5, CHAOS_WINDOW_S) if chaos else \
            (0.8, 3, FAULT_WINDOW_S)
        if not forced and rng.random() >= pick_p:
            continue
        for _ in range(rng.randint(2 if chaos else 1, most)):
            at_s = round(rng.random() * window_s, 4)
            # How long the node's connections lag before they break: the
            # longer, the more reliable messages are sent again.
            # after how many reliable messages (to any process) it strikes
            params = (("seconds", round(rng.uniform(0.02, 0.4), 3)),
                      ("after", rng.randint(0, 12)))
            faults.append(Fault(at_s, kind, params))
    return faults


def _overlaps(rng: random.Random, faults: list[Fault], num_nodes: int) -> list[Fault]:
    """The chaos profile's deliberate coincidences, which independent draws
    almost never make: two nodes down at once (a second crash at the same
    instant picks another live node), and the GCS restarting in the middle of
    a partition."""
    extra = []
    crashes = [f for f in faults if f.kind == "node_crash"]
    if crashes and num_nodes >= 3 and rng.random() < 0.5:
        first = rng.choice(crashes)
        extra.append(Fault(first.at_s, "node_crash", first.params))
    partitions = [f for f in faults if f.kind == "partition"]
    if partitions and any(f.kind == "gcs_restart" for f in faults) and rng.random() < 0.5:
        cut = rng.choice(partitions)
        during_s = round(cut.at_s + dict(cut.params)["heal_after_s"] / 2, 4)
        extra.append(Fault(during_s, "gcs_restart",
                           (("down_for_s", round(rng.uniform(0.0, 0.3), 3)),)))
    return extra


# BUGGIFY (FoundationDB's term): a seed also turns some of the core's knobs
# to values that make rare paths common. Only the simulator sees them (the
# runner puts them in the simulated cluster's Config; the real backend's
# defaults never change), and the failure report lists them.
#
# The chaos profile's (each on with probability one half): every object
# through the store (pulls, locations, reconciling), one lease request per
# scheduling class, spillback on every grant, workers reaped when idle for a
# moment, owners asked about stored copies often.
BUGGIFY_KNOBS = {
    "inline_object_max_bytes": 0,
    "pending_lease_requests_max": 1,
    "local_utilization_threshold": 0.0,
    "idle_worker_timeout_s": 0.2,
    "object_reconcile_period_s": 0.25,
}
# Every profile that injects faults (default and chaos) draws these too, from
# a stream of their own: half the seeds turn none, the others each with
# probability one half, to one of its values. Each changes how the core
# does its work, never what a program may observe: objects pulled in many
# chunks (16 or 64 KiB: the workloads' stored objects are 120 KB to 1.6 MB,
# so a pull takes 2 to 100 chunks, several in flight), objects a few KiB
# large kept in the store, one or two lease requests in flight, the work
# spread at once or packed to the full, workers reaped after a moment idle,
# owners asked often whether they still know the copies, task events sent
# to the GCS often.
PATH_KNOBS = {
    "object_chunk_bytes": (16 * 1024, 64 * 1024),
    "inline_object_max_bytes": (0, 4 * 1024),
    "pending_lease_requests_max": (1, 2),
    "local_utilization_threshold": (0.0, 1.0),
    "idle_worker_timeout_s": (0.2, 1.0),
    "object_reconcile_period_s": (0.25, 0.5),
    "task_events_flush_period_s": (0.1,),
}
PATH_KNOB_PROFILES = ("default", "chaos")


def buggify(seed: int, profile: str) -> dict:
    """The knobs this seed turns: the chaos profile's ``BUGGIFY_KNOBS``, and
    under ``PATH_KNOB_PROFILES`` the ``PATH_KNOBS`` (a chaos knob wins)."""
    knobs: dict = {}
    if profile in PATH_KNOB_PROFILES:
        rng = random.Random(f"{seed}:buggify:paths")
        if rng.random() < 0.5:
            for name, values in PATH_KNOBS.items():
                if rng.random() < 0.5:
                    knobs[name] = rng.choice(values)
    if profile == "chaos":
        rng = random.Random(f"{seed}:buggify")
        knobs.update({name: value for name, value in BUGGIFY_KNOBS.items()
                      if rng.random() < 0.5})
    return knobs


def _space_gcs_restarts(faults: list[Fault]) -> list[Fault]:
    """A GCS restart is scheduled only once the previous one is back up, so
    that each planned restart happens (one that lands while the GCS is down
    does nothing)."""
    spaced, up_at = [], -1.0
    for fault in faults:
        if fault.kind == "gcs_restart":
            at_s = max(fault.at_s, round(up_at + 0.05, 4))
            fault = Fault(at_s, fault.kind, fault.params)
            up_at = at_s + dict(fault.params)["down_for_s"]
        spaced.append(fault)
    return sorted(spaced, key=lambda f: (f.at_s, f.kind))


def kills(faults: list[Fault]) -> bool:
    return any(f.kind in KILLING_KINDS for f in faults)


# ================================================================ injection


class Injector:
    """Fires a schedule inside the simulation; ``stop()`` ends the faults and
    undoes the lasting ones (heals partitions, un-slows nodes, restarts
    crashed nodes) for the liveness phase."""

    def __init__(self, cluster, seed: int, faults: list[Fault]) -> None:
        self.cluster = cluster
        self.faults = faults
        self.rng = random.Random(f"{seed}:fault-targets")
        # (The separate kinds' targets: the others' stay what they were.)
        self.separate_rng = random.Random(f"{seed}:fault-targets:separate")
        self.applied: list[str] = []
        self.scope: trio.CancelScope | None = None

    # ------------------------------------------------------------ the loop

    def start(self) -> None:
        if not self.faults:
            return
        spawn = getattr(self.cluster, "spawn", None)
        if spawn is not None:
            spawn(self._main)
        else:  # before the fault API: start the task in the cluster's nursery
            self.cluster.call_soon(lambda: self.cluster._nursery.start_soon(self._main))

    async def _main(self) -> None:
        start = trio.current_time()
        with trio.CancelScope() as scope:
            self.scope = scope
            async with trio.open_nursery() as nursery:
                for fault in self.faults:
                    await trio.sleep_until(start + fault.at_s)
                    self._fire(fault, nursery)

    def _record(self, what: str) -> None:
        self.applied.append(what)
        self.cluster.trace.record("simtest", "fault", what=what)

    def _node_ids(self) -> list[str]:
        ids = getattr(self.cluster, "node_ids", [])
        return list(ids() if callable(ids) else ids)

    def _live_workers(self) -> list[str]:
        workers = getattr(self.cluster, "workers", None)
        if callable(workers):
            return sorted(workers())
        return sorted(address for address, process in self.cluster.processes.items()
                      if "/worker-" in address and process.alive)

    def _fire(self, fault: Fault, nursery: trio.Nursery) -> None:
        params = dict(fault.params)
        nodes = self._node_ids()
        alive = [n for n in nodes if self.cluster.is_alive(n)] \
            if hasattr(self.cluster, "is_alive") else nodes
        if fault.kind == "worker_crash":
            workers = self._live_workers()
            if not workers:
                return
            target = self.rng.choice(workers)
            self._record(f"{fault.describe()} worker={target[:12]}")
            try:
                if hasattr(self.cluster, "kill_worker") and "/" not in target:
                    self.cluster.kill_worker(target)
                else:
                    self.cluster.kill_process(target)
            except ValueError:
                pass  # it died meanwhile
        elif fault.kind == "node_crash":
            candidates = [n for n in alive if n != nodes[0]]
            if not candidates:
                return
            target = self.rng.choice(candidates)
            self._record(f"{fault.describe()} node={target[:8]}")
            self.cluster.kill_node(target, restart_after_s=params["restart_after_s"])
        elif fault.kind == "gcs_restart":
            self._record(fault.describe())
            self.cluster.restart_gcs(down_for_s=params["down_for_s"])
        elif fault.kind == "partition":
            if len(alive) < 2:
                return
            isolated = self.rng.choice(alive)
            rest = [n for n in alive if n != isolated]
            group_a, group_b = ([isolated], rest) if self.rng.random() < 0.5 else (rest,
                                                                                  [isolated])
            self._record(f"{fault.describe()} isolated={isolated[:8]}")
            self.cluster.partition(group_a, group_b, one_way=params["one_way"])

            async def heal_later() -> None:
                await trio.sleep(params["heal_after_s"])
                self._record("heal")
                self.cluster.heal()
            nursery.start_soon(heal_later)
        elif fault.kind == "stall":
            target = self.rng.choice(alive)
            self._record(f"{fault.describe()} node={target[:8]}")
            self.cluster.stall(target, params["seconds"])
        elif fault.kind == "reset":
            target = self.rng.choice(alive)
            self._record(f"{fault.describe()} node={target[:8]}")
            self.cluster.reset_connections(target)
        elif fault.kind == "slow_node":
            target = self.rng.choice(alive)
            self._record(f"{fault.describe()} node={target[:8]}")
            self.cluster.slow_node(target, params["factor"])
        elif fault.kind == "duplicate":
            self._fire_duplicate(fault, nodes, params["seconds"], params["after"])

    def _fire_duplicate(self, fault: Fault, nodes: list, seconds: float, after: int) -> None:
        """The process that a reliable message reaches next (after ``after``
        others) lags, then its connections break (recorded as it starts)."""
        def started(address: str) -> None:
            # The node on that machine now: it may have restarted (a new
            # node id) since the fault fired (mixed chaos seed 272 named the
            # dead one, so the re-run it caused was not attributed to it).
            machine = int(address.split("/", 1)[0][1:])
            now = self._node_ids() or nodes
            node = now[machine] if machine < len(now) else ""
            self._record(f"{fault.describe()} node={node[:8]} process={address}")

        self.cluster.replay_after_reset(None, seconds, on_start=started, skip=after)

    def stop(self) -> None:
        """Called from the driver: no more faults; undo the lasting ones."""
        if not self.faults:
            return

        def stop_now() -> None:
            if self.scope is not None:
                self.scope.cancel()
            if hasattr(self.cluster, "heal"):
                self.cluster.heal()  # partitions, stalls and slow nodes
            if hasattr(self.cluster, "restart_node"):
                for node in self._node_ids():
                    if not self.cluster.is_alive(node):
                        self.cluster.restart_node(node)
            self.cluster.trace.record("simtest", "faults_stopped")

        self.cluster.call_soon(stop_now)
