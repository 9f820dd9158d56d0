"""A node at ``workers_per_node_max`` (issue 43 item 7): an actor whose
creation waits there for a worker says why (the state API's
``pending_reason``, ``tray status``'s line for the node), and a task's lease
is served before waiting actor creations (an actor keeps its worker for
good, a task gives it back). Before, 300 actors on one node left 44 pending
with nothing but a line in the node's log to say why, and a plain task
waited behind them for a worker that only actors ever got.

On the simulator only: the real backend's nodes read their ``Config`` from
the defaults (and the memory monitor's environment variables), so the cap
cannot be set small there without starting 256 worker processes."""

from __future__ import annotations

import time

import tray
from tray.core.config import Config
from tray.scripts.cluster import worker_limit_lines
from tray.util import state
from tray.util.state._client import Client

CAP = 4


@tray.remote
def hold(seconds):
    time.sleep(seconds)
    return "held"


@tray.remote(num_cpus=0.5)  # a scheduling class of its own: it cannot reuse hold's lease
def plain():
    return "ran"


@tray.remote
class Idle:
    def ping(self):
        return "pong"


def _until(fetch, check, tries=80):
    result = fetch()
    for _ in range(tries):
        if check(result):
            return result
        time.sleep(0.5)  # virtual time
        result = fetch()
    raise AssertionError(f"never held; last: {result!r}")


def _reason(node):
    return f"waiting: worker limit {CAP} reached on node {node}"


def _pending(rows):
    return sorted(row.actor_id for row in rows
                  if row.state == "PENDING_CREATION" and row.pending_reason)


def test_actors_waiting_at_the_worker_cap_say_why_and_tasks_go_first():
    tray.init(backend="sim", seed=1, num_nodes=1, num_cpus=8,
              config=Config(workers_per_node_max=CAP))
    try:
        [node] = [n["NodeID"] for n in tray.nodes()]
        held = [hold.remote(20.0) for _ in range(2)]  # two workers, busy for 20 s
        actors = []
        for _ in range(6):
            actors.append(Idle.remote())
            time.sleep(0.5)  # created in order: the first two get the last two workers
        waiting = sorted(a._actor_id for a in actors[2:])

        rows = _until(lambda: state.list_actors(detail=True), lambda rows: _pending(rows) == waiting)
        assert sorted(row.state for row in rows) == ["ALIVE"] * 2 + ["PENDING_CREATION"] * 4
        for row in rows:
            assert row.pending_reason == (_reason(node) if row.actor_id in waiting else None)
        assert state.get_actor(waiting[0]).pending_reason == _reason(node)

        # tray status's summary: the node, its cap, the leases waiting.
        waits = Client(None, None).gcs_call("worker_limits")
        assert [(w.node_id, w.limit, w.leases, sorted(w.actors)) for w in waits] == \
            [(node, CAP, 4, waiting)]
        assert worker_limit_lines(waits) == [
            f"node {node}: worker limit {CAP} reached, 4 leases wait for a worker "
            f"(4 of them actor creations; workers_per_node_max)"]

        # A task submitted after the waiting actors: a worker a finished task
        # gives back goes to it first (before, the two freed workers went to
        # two of the actors, for good, and it waited forever behind the rest).
        ran = plain.remote()
        assert tray.get(ran, timeout=60) == "ran"
        assert tray.get(held, timeout=60) == ["held", "held"]
        # Both freed workers end with actors: four alive, two still waiting,
        # and they still say why.
        rows = _until(lambda: state.list_actors(detail=True),
                      lambda rows: sum(row.state == "ALIVE" for row in rows) == CAP
                      and len(_pending(rows)) == 2)
        for row in rows:
            assert row.pending_reason == (_reason(node) if row.state != "ALIVE" else None)
        waits = _until(lambda: Client(None, None).gcs_call("worker_limits"),
                       lambda waits: [w.leases for w in waits] == [2])
        assert worker_limit_lines(waits)[0].startswith(
            f"node {node}: worker limit {CAP} reached, 2 leases wait")
    finally:
        tray.shutdown()
