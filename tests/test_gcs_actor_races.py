"""Races in the GCS's actor manager between a creation and a death report.

An actor is not ALIVE until its worker answers the creation task, so a
report that the worker died, arriving while the GCS still waits for that
answer, finds no actor recorded in the worker. These tests make such a
report cross the answer, in the simulator, and check that the actor is
created again elsewhere and answers calls (simtest chaos seed 3939 of
``mixed``: the answer, sent just before the worker crashed and held up by a
partition, came after the report and made the actor ALIVE on the dead
worker; its callers waited forever)."""

from __future__ import annotations

import time

import pytest

import tray
from tray.simtest import cluster as current_cluster
from tray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

# Virtual seconds: the constructor's length, and how long a get may wait
# for the actor made again (generous: a restart here takes well under 1 s).
CONSTRUCTOR_S = 1.0
CALL_TIMEOUT_S = 60.0


@tray.remote
class Slow:
    def __init__(self):
        time.sleep(CONSTRUCTOR_S)

    def worker_id(self):
        return tray.get_runtime_context().get_worker_id()


def _leased_workers(sim, index: int) -> list[str]:
    pool = sim.processes[f"n{index}/raylet"].component.pool
    return sorted(w.worker_id for w in pool.workers.values() if w.state in ("leased", "actor"))


def _start_creation_on_far_node(sim):
    """An actor pinned to node 1, and the worker its constructor runs in."""
    far = sim.node_ids()[1]
    actor = Slow.options(
        scheduling_strategy=NodeAffinitySchedulingStrategy(far, soft=False)).remote()
    for _ in range(200):  # 10 virtual seconds at most
        leased = _leased_workers(sim, 1)
        if leased:
            break
        sim.advance(0.05)
    assert len(leased) == 1, leased
    # Into the constructor (a worker starts and takes its task in a few ms).
    sim.advance(CONSTRUCTOR_S / 2)
    return actor, far, leased[0]


@pytest.mark.parametrize("report", ["worker_died", "node_died"])
def test_a_creation_reply_that_comes_after_its_worker_was_reported_dead(report):
    tray.init(backend="sim", seed=7, num_nodes=2, num_cpus=1, validate_every_steps=1)
    try:
        sim = current_cluster()
        head, _ = sim.node_ids()
        actor, far, first_worker = _start_creation_on_far_node(sim)
        manager = sim.processes[sim.gcs_address].component.actor_manager
        # Node 1 can no longer reach the head: the constructor's answer is
        # sent, and held up on the way to the GCS.
        sim.partition([far], [head], one_way=True)
        sim.advance(CONSTRUCTOR_S)
        host = sim.processes[f"n1/worker-{first_worker[:12]}"].component.actor_host
        assert host.instance is not None, "the constructor has not answered yet"
        assert manager.actors[actor._actor_id].state == "PENDING_CREATION"
        # The worker crashes, and the GCS hears of it before the answer
        # arrives (the node's own report is held up behind the partition
        # too; the test delivers the one that wins the race).
        sim.kill_worker(first_worker)
        if report == "worker_died":
            sim.call_soon(lambda: manager.handle_worker_died(None, first_worker, far,
                                                             "killed by the test"))
        else:
            # The GCS took the cut-off node for dead (here without waiting
            # for its death timeout): its creations under way are lost too.
            sim.call_soon(lambda: manager.node_died(far, "declared dead by the test"))
        sim.advance(0.1)
        sim.heal()  # the held answer arrives now
        worker_id = tray.get(actor.worker_id.remote(), timeout=CALL_TIMEOUT_S)
        assert worker_id != first_worker
        record = manager.actors[actor._actor_id]
        assert record.state == "ALIVE"
        assert record.worker_id == worker_id
        # A creation lost before it finished is not a restart.
        assert record.restarts == 0
        assert not manager._creating
    finally:
        tray.shutdown()
