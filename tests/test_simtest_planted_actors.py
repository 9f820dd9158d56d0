"""Actor lifetimes and node fencing (tray/simtest/checks_actors.py and the
patterns of pieces_actors.py): a bug planted in the core by monkeypatching
(never by editing tray) must make a sweep fail on the right invariant
within a stated number of seeds."""

from __future__ import annotations

import pytest
from planting import first_failure  # (tests/ is on sys.path)

import tray
from tray.core.gcs.actor_manager import OUT_OF_SCOPE, ActorManager
from tray.core.messages import ActorStatus
from tray.core.node.node_manager import NodeManager
from tray.core.node.worker_pool import WorkerPool, WorkerState
from tray.core.scheduling import placement_group_id_of


@tray.remote(max_restarts=-1, max_task_retries=-1, num_cpus=0)
class Echo:
    """Restarted and retried without limit: its calls must come back."""

    def twice(self, x):
        return 2 * x


def test_a_detached_actor_ended_with_its_owner_is_caught_within_5_seeds(monkeypatch):
    # When an owner dies, the GCS also ends the detached actors it created,
    # as if every handle to them had gone out of scope.
    original = ActorManager.handle_owner_died

    def ends_detached_too(self, conn, owner_address):
        original(self, conn, owner_address)
        for actor in list(self.actors.values()):
            if actor.spec.owner_address == owner_address and actor.spec.detached and \
                    actor.state != ActorStatus.DEAD:
                self._end_gracefully(actor, OUT_OF_SCOPE)

    monkeypatch.setattr(ActorManager, "handle_owner_died", ends_detached_too)
    result = first_failure(range(5), "named", "none", "detached-actor-outlives-its-creator")
    assert "not found by name after its creator ended" in result.message


def test_actors_ended_for_an_owner_that_lives_are_caught_within_3_seeds(monkeypatch):
    # When a node dies, the GCS ends the actors whose owners lived on it,
    # and, its filter lost, those owned on every other node as well.
    def every_owner(self, node_id, reason):
        for actor in list(self.actors.values()):
            if actor.node_id == node_id and \
                    actor.state in (ActorStatus.ALIVE, ActorStatus.PENDING_CREATION):
                self._actor_failed(actor, f"its node {node_id} died ({reason})")
        for owner in sorted({actor.spec.owner_address for actor in self.actors.values()}):
            self.handle_owner_died(None, owner)

    monkeypatch.setattr(ActorManager, "node_died", every_owner)
    result = first_failure(range(3), "lifetimes", "node_crash", "actor-death-explained")
    assert "is alive" in result.message


def test_a_removed_group_whose_actors_die_of_another_cause_is_caught_within_5_seeds(
        monkeypatch):
    # The GCS ends a removed group's actors, but forgets the cause: their
    # calls raise a plain ActorDiedError, not ActorPlacementGroupRemoved.
    def forgets_the_cause(self, pg_id):
        for actor in list(self.actors.values()):
            if placement_group_id_of(actor.spec.strategy) == pg_id and \
                    actor.state != ActorStatus.DEAD:
                self._set_dead(actor, "its worker died")
                if actor.worker_id and actor.node_id in self._nodes.nodes:
                    self._nursery.start_soon(self._kill_worker, actor.node_id, actor.worker_id)

    monkeypatch.setattr(ActorManager, "placement_group_removed", forgets_the_cause)
    result = first_failure(range(5), "groups", "none", "removed-group-ends-its-actors")
    assert "ActorPlacementGroupRemoved" in result.message


def test_a_removed_group_that_spares_live_actors_is_caught_within_10_seeds(monkeypatch):
    # Only the actors not created yet end with the group: live ones are left
    # to die with their bundle's worker (and a restartable one is created
    # again in the removed group: it dies then, of the group, too late).
    def pending_only(self, pg_id):
        for actor in list(self.actors.values()):
            if placement_group_id_of(actor.spec.strategy) == pg_id and \
                    actor.state == ActorStatus.PENDING_CREATION:
                self._set_dead(actor, f"its placement group {pg_id} was removed",
                               group_removed=True)

    monkeypatch.setattr(ActorManager, "placement_group_removed", pending_only)
    first_failure(range(10), "groups", "none", "removed-group-ends-its-actors")


def test_group_names_kept_after_removal_or_given_twice_are_caught_within_5_seeds(
        monkeypatch):
    # A fresh red team's bug: the name of a removed group stays taken. And
    # its opposite: a name is given to a second group while the first lives.
    from tray.core.gcs.placement_group_manager import PlacementGroupManager

    original = PlacementGroupManager.handle_create_placement_group

    def names_never_freed(self, conn, spec):
        if spec.name and (spec.namespace, spec.name) in self.names:
            raise ValueError(f"a placement group named {spec.name!r} already exists")
        return original(self, conn, spec)

    monkeypatch.setattr(PlacementGroupManager, "handle_create_placement_group",
                        names_never_freed)
    first_failure(range(5), "removed_group", "none", "placement-group-names-unique")
    monkeypatch.undo()

    def names_shared(self, conn, spec):
        self.names.pop((spec.namespace, spec.name), None)
        return original(self, conn, spec)

    monkeypatch.setattr(PlacementGroupManager, "handle_create_placement_group", names_shared)
    first_failure(range(5), "removed_group", "none", "placement-group-names-unique")


def test_a_node_that_ignores_its_death_is_caught_within_10_seeds(monkeypatch):
    # Told by the GCS that it was declared dead, the node stops
    # heartbeating but does not end itself nor its workers.
    monkeypatch.setattr(NodeManager, "_fence", lambda self: None)
    result = first_failure(range(10), "restarts", "default", "dead-node-fenced")
    assert "declared dead" in result.message


def test_an_actor_worker_reported_dead_while_it_serves_is_caught_within_10_seeds(
        monkeypatch):
    # The node's idle-worker reaper counts an actor's worker among the idle
    # ones: it reports it dead to the GCS (which restarts the actor
    # elsewhere) without ending it, so callers that still know the old
    # incarnation's address go on calling it beside the new one.
    original = WorkerPool.reap_idle
    reported: set = set()

    def reaps_an_actor(self):
        original(self)
        for worker in list(self.workers.values()):
            if worker.state == WorkerState.ACTOR and worker.worker_id not in reported:
                reported.add(worker.worker_id)
                self._nursery.start_soon(self._report_worker_death, worker.worker_id, "idle",
                                         worker.address)
                return

    monkeypatch.setattr(WorkerPool, "reap_idle", reaps_an_actor)
    first_failure(range(10), "restarts", "none", "one-actor-incarnation-at-a-time")


# ============================================ regressions these checks found


@pytest.mark.parametrize("reconnecting", [False, True])
def test_a_call_to_an_actor_on_a_node_declared_dead_comes_back_while_the_node_is_cut_off(
        reconnecting):
    # A node cut off (a partition) past the death timeout: the GCS declares
    # it dead and restarts its actor elsewhere, and the call in flight must
    # go to the new incarnation while the partition still holds. It waited
    # for the heal instead: the caller asked whether the old actor still
    # listened (reachable), or was opening a connection to it (after a
    # reset), and either stayed held by the partition (restarts default
    # seeds 2, 25, 32 with the cut_off_past_death pattern).
    from tray.simtest.pytest_plugin import simtest_cluster
    from tray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    with simtest_cluster(1, num_nodes=2, num_cpus=1) as sim:
        head, other = sim.node_ids()
        echo = Echo.options(scheduling_strategy=NodeAffinitySchedulingStrategy(
            other, soft=True)).remote()
        assert tray.get(echo.twice.remote(1)) == 2
        if reconnecting:
            sim.reset_connections(other)  # the next call opens a new connection
        sim.partition([other], [head])
        ref = echo.twice.remote(21)
        sim.advance(sim.config.node_death_timeout_s + 2.0)
        assert not any(node["Alive"] for node in tray.nodes() if node["NodeID"] == other)
        assert tray.get(ref, timeout=10.0) == 42  # (the partition still holds)
        sim.heal()


@pytest.mark.parametrize("seed, faults", [(2, "default"), (71, "default"), (8, "chaos")])
def test_the_restarts_seeds_that_found_them_pass(seed, faults):
    # The seeds that found the bugs these regression tests pin (a call to
    # an actor on a node cut off past its death came back only after the
    # heal: 2 for the caller's wait, 71 for the GCS's lease request, 8 for
    # the restarted GCS's node_died notice).
    from tray.simtest import runner

    result = runner.run_seed(seed, "restarts", faults)
    assert result.ok, result.report()


def test_a_restarted_gcs_is_heard_telling_of_a_node_death():
    # The simulator started a restarted GCS with its predecessor's random
    # draws, so with its rpc session: its reliable messages (numbered from 1
    # again) were taken for copies of the old GCS's, already handled, and
    # dropped, a node_died notice among them (restarts chaos seed 8: a call
    # to an actor on a node declared dead waited for the node's return).
    from tray.simtest.pytest_plugin import simtest_cluster

    with simtest_cluster(1, num_nodes=3, num_cpus=1) as sim:
        _, first, second = sim.node_ids()
        sim.kill_node(first)
        # (The old GCS declares it dead and tells the driver: a reliable message.)
        sim.advance(sim.config.node_death_timeout_s + 2.0)
        sim.restart_gcs(0.0)
        sim.advance(2.0)
        assert len(tray.nodes()) == 3  # (the driver connects to the new GCS)
        sim.kill_node(second)
        sim.advance(sim.config.node_death_timeout_s + 2.0)
        heard = [event["node"] for event in sim.trace.events
                 if event["event"] == "node_died" and event["component"].startswith("driver")]
        assert heard == [first, second]
        assert tray.get(tray.put(1)) == 1


def test_a_node_declared_dead_while_it_heartbeats_is_caught_within_5_seeds(monkeypatch):
    # The GCS forgets to note a heartbeat's time when the node's free
    # resources did not change: an idle node is declared dead a death
    # timeout after its last change, heartbeating all along.
    from tray.core.gcs.node_table import NodeTable

    original = NodeTable.handle_heartbeat

    def forgetful(self, conn, node_id, available, epoch=0, version=-1):
        node = self.nodes.get(node_id)
        unchanged = node is not None and node.available == available
        last = self.heartbeat_at.get(node_id)
        reply = original(self, conn, node_id, available, epoch, version)
        if unchanged and last is not None:
            self.heartbeat_at[node_id] = last
        return reply

    monkeypatch.setattr(NodeTable, "handle_heartbeat", forgetful)
    first_failure(range(5), "restarts", "none", "node-declared-dead-after-its-timeout")


def test_an_actor_whose_lease_request_a_dead_node_holds_is_created_elsewhere():
    # The GCS asked a node for an actor's lease, and the node was cut off
    # (a partition) until the GCS declared it dead: the GCS kept waiting for
    # that node's answer, and created the actor only after the heal
    # (restarts default seed 71: a restarting actor stayed RESTARTING).
    from tray.simtest.pytest_plugin import simtest_cluster
    from tray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    with simtest_cluster(1, num_nodes=2, num_cpus=1) as sim:
        head, other = sim.node_ids()
        sim.partition([other], [head])
        echo = Echo.options(scheduling_strategy=NodeAffinitySchedulingStrategy(
            other, soft=True)).remote()
        ref = echo.twice.remote(21)
        sim.advance(sim.config.node_death_timeout_s + 2.0)
        assert tray.get(ref, timeout=10.0) == 42  # (the partition still holds)
        sim.heal()
