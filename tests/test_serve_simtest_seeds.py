"""Pinned seeds of the ``serve`` simtest workload (tray/simtest/workloads_serve.py)
that once failed; each must stay green. The fixes changed what the seeds
run (a fault schedule picks among the processes alive at its instants), so
the tests in test_serve.py pin each mechanism directly as well."""

from __future__ import annotations

import pytest

import tray
import tray.simtest
from tray import serve
from tray.serve import _api
from tray.simtest import runner
from tray.simtest.cli import sweep


@pytest.mark.parametrize(("seed", "faults"), [
    # A fault failed every held request (they went to a replica whose worker
    # had crashed while the GCS was down, so nobody knew it was dead yet):
    # no load, so the autoscaler rightly kept one replica, and the workload
    # demanded the scale-up anyway (a checker mistake). Now a held request
    # lost to a fault excuses it (the failure itself is still judged).
    (6, "chaos"),
    # The controller died, then its checkpoint store actor restarted empty
    # before the controller came back: the state was lost, serve.run sent
    # the application again, and the driver's router then took a long-poll
    # answer the empty controller had given ("SimWorker does not exist")
    # over the target serve.run handed it. Now an answer from an older
    # controller incarnation never undoes a newer one, and "does not exist"
    # is checked with the controller before a caller hears it.
    (28, "chaos"),
    # The checkpoint store actor restarted empty and the controller died
    # 80 ms later, before it wrote the state again: the state was lost and a
    # caller got "SimWorker does not exist".
    (32, "chaos"),
    # The controller and both checkpoint store actors (two copies that
    # refilled each other) died at once: the state was lost and a caller
    # got "Application 'serve-simtest' does not exist". Seeds 28, 32 and 165
    # pass now because the checkpoint lives in the GCS's key-value store,
    # which no actor's death touches and which outlives GCS restarts.
    (165, "chaos"),
    # The controller restarted during a rolling update and found a replica
    # of the old version, whose re-attach took a while (a slow node): the
    # autoscaler had the deployment DOWNSCALING, which counted as running,
    # so serve.run returned; then the old replica came back and took a
    # request sent after it ("u-0 got v1"). Now an old-version replica still
    # RECOVERING keeps the deployment UPDATING, as one that serves does.
    (136, "chaos"),
    # lookup_actor used up its retries (worker crashes, GCS restarts) while
    # the controller recovered its state: _recover raised, the control loop
    # never started, and every call to the controller waited forever. Now
    # the recovery is tried again until it succeeds.
    (104, "chaos"),
    (192, "chaos"),
    # A replica drained (its last request's code had returned) and was
    # killed before that request's reply went out; the router, finding the
    # replica dead and drained, sent the request again: it ran twice. Now a
    # drained replica ends itself (exit_actor), which sends the replies
    # first.
    (39, "default"),
    # The driver's router took a long-poll answer that had waited for it
    # since a scale-up to two replicas, while a downscale had since drained
    # and stopped one; its 20 ms check that the answer was the latest lost
    # to a slow controller, so 3 of 6 held requests went to the stopped
    # replica, failed at once, and were sent again only when the driver
    # fetched them, after the 30 s wait: the autoscaler saw 3 requests and
    # kept 1-2 replicas, not 3. Now a synchronous router that finds an answer
    # waiting reads the controller's current target before it routes.
    (205, "chaos"),
    # The workload's own replica kill asked the GCS for the worker of a
    # replica the controller listed RUNNING while the GCS had it restarting
    # (None) and passed None to kill_worker, which raised TypeError. A
    # replica not alive by the GCS is skipped; kill_worker(None) is a clear
    # ValueError.
    (269, "chaos"),
    # The controller began a graceful stop of a replica (it drained, and
    # refused every later request with ReplicaDrainedError), then died
    # before its checkpoint said so. The restarted controller re-attached
    # the replica as RUNNING and routed every request to it for good: a
    # held request failed after its retries. Now a replica tells a
    # re-attaching controller that it drains, and is stopped again
    # (test_a_restarted_controller_stops_a_replica_that_drains below).
    (98, "chaos"),
    # A node died while the controller started its HTTP proxy (pinned there,
    # soft=False); the actor waited in PENDING_CREATION for good. Now an
    # actor pinned to a dead node dies with ActorUnschedulableError, as in
    # Ray (test_actor_pinned_to_a_dead_node_is_unschedulable).
    (469, "chaos"),
])
def test_serve_seed(seed, faults):
    result = runner.run_seed(seed, "serve", faults)
    assert result.ok, result.report()


def test_serve_seed_replays_in_one_process():
    # Chaos seed 60 gave two digests in one process: SimWorker was pickled
    # by value, and the simulator's replicas (in this same process)
    # unpickled it onto the original class, replacing its methods with
    # copies that pickle differently. The workload's class now has a
    # module-level name of its own, so it is pickled by reference.
    summary = sweep(range(60, 61), "serve", "chaos", determinism_every=1)
    assert summary["failures"] == [], summary["failures"]
    assert summary["nondeterministic_seeds"] == []


@serve.deployment(name="Echo", ray_actor_options={"num_cpus": 0})
class _Echo:
    def __call__(self, x):
        return x


def test_a_restarted_controller_stops_a_replica_that_drains():
    # Serve chaos seed 98's mechanism: the controller's graceful stop of a
    # replica had begun (the replica drained) when the controller died, and
    # its checkpoint still had the replica RUNNING.
    tray.init(backend="sim", num_cpus=4, seed=0)
    try:
        sim = tray.simtest.cluster()
        handle = serve.run(_Echo.bind(), name="drains", route_prefix=None)
        assert handle.remote(1).result() == 1
        [(replica_id, actor_name, state, _version)] = _api._list_replicas("drains", "Echo")
        assert state == "RUNNING"
        replica = tray.get_actor(actor_name, namespace="serve")
        assert tray.get(replica.prepare_for_shutdown.remote(0.05, 5.0)) == 0  # drained
        controller = tray.get_actor("SERVE_CONTROLLER_ACTOR", namespace="serve")
        sim.kill_worker(sim.worker_of(controller))  # it restarts from its checkpoint
        sim.advance(5.0)
        replicas = _api._list_replicas("drains", "Echo")
        assert [r[0] for r in replicas] != [replica_id], replicas  # replaced
        assert [r[2] for r in replicas] == ["RUNNING"], replicas
        assert handle.remote(2).result(timeout_s=10.0) == 2
        assert serve.status().applications["drains"].status == serve.ApplicationStatus.RUNNING
    finally:
        serve.shutdown()
        tray.shutdown()


def _proxies() -> dict:
    return {node: status.value for node, status in serve.status().proxies.items()}


def test_proxies_follow_the_nodes_and_a_controller_restart():
    # Found by the serve workload's proxy model (default seeds 3, 5): a proxy
    # whose node died was started again there (the alive nodes were one
    # refresh old) and that start never ended (its actor waited for the
    # dead node for good), so the proxy stayed STARTING for ever and
    # serve.shutdown() timed out on it. And a restarted controller, not
    # knowing the nodes yet, drained every proxy off the head.
    tray.init(backend="sim", num_nodes=3, seed=1)
    try:
        sim = tray.simtest.cluster()
        serve.start(http_options={"host": "127.0.0.1", "port": 0}, proxy_location="EveryNode")
        sim.advance(12.0)
        nodes = sorted(sim.node_ids())
        assert _proxies() == dict.fromkeys(nodes, "HEALTHY")
        actors = {n: tray.get_actor("SERVE_PROXY_ACTOR-" + n, namespace="serve")._actor_id
                  for n in nodes}
        controller = tray.get_actor("SERVE_CONTROLLER_ACTOR", namespace="serve")
        sim.kill_worker(sim.worker_of(controller))
        sim.advance(12.0)
        assert _proxies() == dict.fromkeys(nodes, "HEALTHY")
        assert {n: tray.get_actor("SERVE_PROXY_ACTOR-" + n, namespace="serve")._actor_id
                for n in nodes} == actors  # re-attached, not replaced
        sim.kill_node(nodes[1] if nodes[1] != sim.node_ids()[0] else nodes[2])
        sim.advance(30.0)
        alive = sorted(n["NodeID"] for n in tray.nodes() if n["Alive"])
        assert len(alive) == 2 and _proxies() == dict.fromkeys(alive, "HEALTHY")
    finally:
        serve.shutdown()
        tray.shutdown()
