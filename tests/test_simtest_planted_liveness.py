"""Proving the liveness and efficiency invariants (tray/simtest/liveness.py):
a bug planted in the core by monkeypatching (never by editing it) that
makes work merely *late* — a grant, a spill, a placement, an actor's end —
must fail the sweep on the right invariant within a stated number of seeds;
and the monitor must leave every digest as it was."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import trio
from planting import first_failure  # (tests/ is on sys.path)

from tray.core import scheduling
from tray.core.gcs import actor_manager
from tray.core.gcs.actor_manager import ActorManager
from tray.core.gcs.placement_group_manager import PlacementGroupManager
from tray.core.ids import ObjectID
from tray.core.messages import PlacementGroupStatus
from tray.core.node.lease_manager import LeaseManager
from tray.core.node.worker_pool import WorkerPool
from tray.core.worker.actor_task_submitter import ActorTaskSubmitter
from tray.core.worker.outbox import Outbox
from tray.core.worker.reference_counter import ReferenceCounter, is_actor_handle
from tray.simtest import liveness, runner

# ------------------------------------------------------------ work-conserving-leases


def test_a_grant_left_for_the_next_request_is_caught_within_3_seeds(monkeypatch):
    # A returned lease frees its resources, but the node does not offer them
    # to the requests queued there: they are granted only when some other
    # event (the next request, a blocked worker) runs the dispatch.
    def release_lease(self, lease_id, worker_ok):
        lease = self.leases.pop(lease_id, None)
        if lease is None:
            return
        available, _, gpus = self._pool_of(lease)
        for name, amount in lease.resources.items():
            if not (name == "CPU" and lease.blocked):
                available[name] = available.get(name, 0.0) + amount
        gpus.release(lease.gpu_allocation)
        owned = self._leases_by_owner[lease.owner]
        owned.discard(lease_id)
        if not owned:
            del self._leases_by_owner[lease.owner]
        self._pool.lease_ended(lease.worker_id, worker_ok, lease.for_actor is not None)

    monkeypatch.setattr(LeaseManager, "release_lease", release_lease)
    result = first_failure(range(3), "backlog", "none", "work-conserving-leases")
    assert "fits this node's free resources" in result.message


def test_requests_never_moved_to_an_idle_node_are_caught_within_3_seeds(monkeypatch):
    # A node never sends its queued requests to the nodes that went idle
    # (neither every heartbeat nor when a node joins): they wait for its
    # own leases to end.
    monkeypatch.setattr(LeaseManager, "_respill", lambda self, node_ids, waited_s: None)
    result = first_failure(range(3), "backlog", "none", "work-conserving-leases")
    assert "has had the free resources it needs" in result.message


def test_a_worker_given_back_that_wakes_no_lease_is_caught_within_2_seeds(monkeypatch):
    # A worker that comes back idle is not offered to the granted leases
    # waiting for one: they wait for the next worker to start or return.
    original = WorkerPool._wake_waiters

    def wake_waiters(self, idle=None):
        if idle is None:
            original(self, idle)

    monkeypatch.setattr(WorkerPool, "_wake_waiters", wake_waiters)
    result = first_failure(range(2), "backlog", "none", "work-conserving-leases")
    assert "without a worker" in result.message


# ----------------------------------------------------------------- fitting-actor-created


def test_an_actor_retried_only_on_a_long_timer_is_caught_within_6_seeds(monkeypatch):
    # After a lease request that was not granted (spilled back from a node
    # that filled up), the GCS asks again only 30 s later, not after its
    # retry period: the actor waits while CPUs sit free.
    sleeps = {"sleep": trio.sleep}

    async def sleep(seconds):
        await sleeps["sleep"](30.0 if seconds == 1.0 else seconds)

    monkeypatch.setattr(actor_manager, "trio", _TrioWith(sleep))
    result = first_failure(range(6), "backlog", "none", "fitting-actor-created")
    assert "PENDING_CREATION" in result.message


class _TrioWith:
    """trio, as the GCS's actor manager sees it, with another sleep."""

    def __init__(self, sleep) -> None:
        self.sleep = sleep

    def __getattr__(self, name):
        return getattr(trio, name)


# ---------------------------------------------------- fitting-placement-group-placed


def test_a_group_retried_only_on_a_long_timer_is_caught_within_2_seeds(monkeypatch):
    # A group that did not fit at once is tried again only after 30 s (far
    # longer than the bound): it waits while the CPUs it needs sit free.
    async def schedule(self, pg_id):
        while True:
            group = self.groups[pg_id]
            if group.state not in (PlacementGroupStatus.PENDING,
                                   PlacementGroupStatus.RESCHEDULING):
                return
            placement = scheduling.place_bundles(group.spec.bundles, group.spec.strategy,
                                                 self._nodes.view(), fixed=group.bundle_nodes)
            if placement is not None and await self._reserve(group, placement):
                return
            await trio.sleep(30.0)

    monkeypatch.setattr(PlacementGroupManager, "_schedule", schedule)
    result = first_failure(range(2), "waiting_groups", "none",
                            "fitting-placement-group-placed")
    assert "fits the free resources of the live nodes" in result.message


# ------------------------------------------- placement-group-bundles-held-where-placed


def test_bundles_kept_after_their_group_is_removed_are_caught_within_2_seeds(monkeypatch):
    # The GCS never tells the nodes to give a removed group's bundles back,
    # and answers their reconciliation as if it still placed them there.
    async def release_on(self, node_id, pg_id, indexes):
        return None

    monkeypatch.setattr(PlacementGroupManager, "_release_on", release_on)
    monkeypatch.setattr(PlacementGroupManager, "handle_held_bundles",
                        lambda self, conn, node_id, bundles: list(bundles))
    result = first_failure(range(2), "waiting_groups", "none",
                            "placement-group-bundles-held-where-placed")
    assert "which the GCS removed" in result.message


def test_a_commit_lost_on_its_node_is_caught_within_3_seeds(monkeypatch):
    # A node drops the commit of a group's bundles when it holds others
    # already: the GCS records the group CREATED, the node only prepared it.
    original = LeaseManager.handle_commit_bundles

    def commit(self, conn, pg_id, indexes):
        if len(self.bundles) > 1:
            return None
        return original(self, conn, pg_id, indexes)

    monkeypatch.setattr(LeaseManager, "handle_commit_bundles", commit)
    result = first_failure(range(3), "groups", "none",
                            "placement-group-bundles-held-where-placed")
    assert "not committed it" in result.message


# ---------------------------------------------------------- unreferenced-actor-ends


def test_an_ended_actor_whose_worker_is_never_stopped_is_caught_within_2_seeds(monkeypatch):
    # The GCS marks an actor out of scope DEAD and never asks its worker to
    # exit: the worker and its lease (its CPU) live on.
    async def stop_worker(self, actor_id, node_id, worker_id, address, reason):
        return None

    monkeypatch.setattr(ActorManager, "_stop_worker", stop_worker)
    first_failure(range(2), "lifetimes", "none", "unreferenced-actor-ends")



def test_an_owner_that_never_tells_the_gcs_is_caught_within_2_seeds(monkeypatch):
    # The owner's last handle goes, and the GCS is never told.
    monkeypatch.setattr(ActorTaskSubmitter, "actor_out_of_scope", lambda self, actor_id: None)
    result = first_failure(range(2), "lifetimes", "none", "unreferenced-actor-ends")
    assert "ALIVE by the GCS" in result.message


def test_a_lost_borrower_release_is_caught_within_5_seeds(monkeypatch):
    # A borrower of an actor's handle lets go of it, and its message to the
    # owner is lost: the owner counts a borrower that holds nothing.
    original = Outbox.send_later

    def send_later(self, address, method, *args):
        if method == "remove_borrower" and is_actor_handle(ObjectID(args[0])):
            return None
        return original(self, address, method, *args)

    monkeypatch.setattr(Outbox, "send_later", send_later)
    first_failure(range(5), "lifetimes", "none", "unreferenced-actor-ends")


def test_an_actor_ended_while_borrowed_is_caught_within_8_seeds(monkeypatch):
    # The owner does not count borrowers of actor handles: the actor ends
    # when the owner's own handles go, under a borrower still using it.
    original = ReferenceCounter.handle_add_borrower

    def add_borrower(self, conn, object_id, borrower):
        if is_actor_handle(ObjectID(object_id)):
            return self.refs.get(ObjectID(object_id)) is not None
        return original(self, conn, object_id, borrower)

    monkeypatch.setattr(ReferenceCounter, "handle_add_borrower", add_borrower)
    result = first_failure(range(8), "lifetimes", "none", "actor-outlives-its-handles")
    assert "still held a handle" in result.message


# ------------------------------------------------------------------ regressions


def test_an_actor_whose_owner_died_while_the_gcs_restarted_ends():
    # lifetimes default seed 14: a task made an actor and its worker died
    # while the GCS was down; the GCS, which hears of an owner's end from its
    # connection to it, had none, and the node's report of the death ended
    # only what the worker hosted. The actor lived on, ALIVE, for good.
    result = runner.run_seed(14, "lifetimes", "default")
    assert result.ok, result.report()


def test_an_actor_whose_owners_node_died_while_the_gcs_restarted_ends():
    # mixed default seed 410: the same, but the owner's whole node crashed,
    # so no node reported the worker's death either; the GCS ends the actors
    # owned on a node it declares dead (ActorSpec.owner_node_id).
    result = runner.run_seed(410, "mixed", "default")
    assert result.ok, result.report()


def test_lifetimes_chaos_seed_479_passes():
    # The seed that found it (see the test above): an actor kept by its
    # handle inside a lineage-pinned argument, a second one never created.
    result = runner.run_seed(479, "lifetimes", "chaos")
    assert result.ok, result.report()


def test_lifetimes_chaos_seed_126_passes():
    # A lineage re-run of a task that took an actor's handle deserialized it
    # after the actor had ended (its handles let go): a holder that came
    # after the end is no premature end (actor-outlives-its-handles).
    result = runner.run_seed(126, "lifetimes", "chaos")
    assert result.ok, result.report()


# ------------------------------------------------------------------ the monitor


def test_the_monitor_leaves_the_digest_as_it_was(monkeypatch):
    watched = runner.run_seed(3, "lifetimes", "default")
    monkeypatch.setattr(liveness.LivenessMonitor, "install", lambda self: None)
    unwatched = runner.run_seed(3, "lifetimes", "default")
    assert watched.ok and unwatched.ok
    assert watched.digest == unwatched.digest


class _Node:
    """What the monitor reads of a node's lease manager, for _group_fits."""

    def __init__(self, cpus: float) -> None:
        self.available = {"CPU": cpus}
        self.gpus = scheduling.GpuAllocator(0)
        self.draining = False


class _Group:
    def __init__(self, bundles, strategy, placed=None) -> None:
        self.spec = SimpleNamespace(bundles=bundles, strategy=strategy)
        self.bundle_nodes = dict(placed or {})


@pytest.mark.parametrize("strategy, free, fits", [
    # Two 1-CPU bundles: one node with 2 CPUs holds both, whatever the strategy
    # but STRICT_SPREAD's, which needs two nodes.
    ("STRICT_PACK", [2.0], True), ("PACK", [2.0], True), ("SPREAD", [2.0], True),
    ("STRICT_SPREAD", [2.0], False),
    # Two nodes with 1 CPU each: all but STRICT_PACK.
    ("STRICT_PACK", [1.0, 1.0], False), ("PACK", [1.0, 1.0], True),
    ("SPREAD", [1.0, 1.0], True), ("STRICT_SPREAD", [1.0, 1.0], True),
    # Not enough anywhere: never judged (it may be infeasible for now).
    ("PACK", [1.0], False), ("SPREAD", [0.5, 0.5], False),
])
def test_a_group_clearly_fits_by_its_strategy(strategy, free, fits):
    nodes = [(f"node{i}", _Node(cpus)) for i, cpus in enumerate(free)]
    group = _Group([{"CPU": 1.0}, {"CPU": 1.0}], strategy)
    assert (liveness.LivenessMonitor._group_fits(group, nodes) is not None) == fits


def test_a_rescheduled_group_fits_around_its_placed_bundles():
    nodes = [("a", _Node(1.0)), ("b", _Node(1.0))]
    # STRICT_PACK keeps its node: the missing bundle must fit there.
    assert liveness.LivenessMonitor._group_fits(
        _Group([{"CPU": 1.0}, {"CPU": 1.0}], "STRICT_PACK", {0: "a"}), nodes) == {"a"}
    nodes[0][1].available["CPU"] = 0.0
    assert liveness.LivenessMonitor._group_fits(
        _Group([{"CPU": 1.0}, {"CPU": 1.0}], "STRICT_PACK", {0: "a"}), nodes) is None
    # STRICT_SPREAD avoids the nodes of its placed bundles.
    assert liveness.LivenessMonitor._group_fits(
        _Group([{"CPU": 1.0}, {"CPU": 1.0}], "STRICT_SPREAD", {0: "b"}), nodes) is None


def test_a_handle_kept_only_for_lineage_lets_its_actor_end():
    # lifetimes chaos seed 479: an argument that goes through the store (all
    # do with inline_object_max_bytes=0) is kept for the lineage of its
    # task while the task's result is referenced, and the actor handle in
    # it kept the actor, and its CPU, alive: on one CPU the next actor was
    # never created.
    import tray
    from tray.core.config import Config
    from tray.simtest.pieces_lifetimes import Scoped, call_boxed

    tray.init(backend="sim", seed=1, num_nodes=1, num_cpus=1,
              config=Config(inline_object_max_bytes=0))
    try:
        first = Scoped.options(num_cpus=1).remote("first")
        result = call_boxed.options(num_cpus=0).remote("borrower", [first], 3)
        assert tray.get(result, timeout=10) == 9
        del first  # the result stays referenced: its task stays in the lineage
        second = Scoped.options(num_cpus=1).remote("second")
        assert tray.get(second.square.remote(4), timeout=30) == 16
        del result
    finally:
        tray.shutdown()



def test_cluster_resources_counting_dead_nodes_is_caught_within_5_seeds(monkeypatch):
    # resources-view-at-quiescence: the public API's view of the cluster's
    # resources (cluster_resources, available_resources) against the alive
    # node managers' own totals once nothing is held. Planted: the dead
    # nodes a node crash left in the GCS's table are counted.
    from planting import first_failure

    from tray.api import cluster_info

    def every_node() -> dict:
        total: dict = {}
        for node in cluster_info.nodes():
            for name, amount in node["Resources"].items():
                total[name] = total.get(name, 0.0) + amount
        return total

    import tray

    monkeypatch.setattr(cluster_info, "cluster_resources", every_node)
    monkeypatch.setattr(tray, "cluster_resources", every_node)
    first_failure(range(5), "restarts", "node_crash", "resources-view-at-quiescence")
