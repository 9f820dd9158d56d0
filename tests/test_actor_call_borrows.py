"""An actor call that fails at its caller while the actor still runs it
keeps the refs inside its arguments alive: the actor borrows them when it
unpacks the arguments, which may be after the caller gave up on the call
(simtest ``objects`` default seed 168: a reset cut off ``hold([ref])``, the
driver freed ``ref``, and the actor's borrow registration arrived after the
free; its later read of ``ref`` found the object freed)."""

from __future__ import annotations

import time

import numpy as np
import pytest

import tray
import tray.exceptions as tex
import tray.simtest
from tray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

BIG = 200_000  # float64 elements: 1.6 MB, in a node's object store


@pytest.fixture
def sim():
    tray.init(backend="sim", seed=7, num_nodes=2, num_cpus=2)
    try:
        yield tray.simtest.cluster()
    finally:
        tray.shutdown()


@tray.remote
class Holder:
    """Keeps a ref given inside a list (borrowed, not resolved)."""

    def __init__(self) -> None:
        self.held = []

    def busy(self, seconds: float) -> bool:
        time.sleep(seconds)
        return True

    def hold(self, boxed: list) -> bool:
        self.held.append(boxed[0])
        return True

    def read(self) -> float:
        return float(sum(float(np.asarray(tray.get(ref)).sum()) for ref in self.held))


def _driver(sim):
    return sim.processes["n0/driver"].component


def test_a_cut_off_call_keeps_its_argument_refs_until_the_actor_is_gone(sim):
    victim = sim.node_ids()[1]
    holder = Holder.options(scheduling_strategy=NodeAffinitySchedulingStrategy(
        victim, soft=False)).remote()
    assert tray.get(holder.busy.remote(0.0))
    # `hold` waits at the actor behind `busy`, its argument not yet
    # unpacked, when a reset cuts both calls off: the caller gives up on
    # them (the actor lives on, so "may or may not have run"), but the
    # actor runs them both afterwards.
    busy = holder.busy.remote(5.0)
    boxed = tray.put(np.full(BIG, 2.0))
    oid = boxed.object_id()
    hold = holder.hold.remote([boxed])
    sim.advance(1.0)
    sim.reset_connections(victim)
    for ref in (busy, hold):
        with pytest.raises(tex.ActorUnavailableError, match="may or may not have run"):
            tray.get(ref)
    del boxed  # the driver's last local ref: only the unsettled call holds it now
    # The actor ran `hold` after the failure and borrowed the ref: it reads
    # the value (before the fix: ObjectLostError, "was freed").
    assert tray.get(holder.read.remote()) == BIG * 2.0
    driver = _driver(sim)
    assert driver.references.refs[oid].submitted == 1
    assert driver.actor_submitter.statistics().calls_unsettled == 1
    borrowers = list(driver.references.refs[oid].borrowers)
    assert len(borrowers) == 1 and borrowers[0].endswith(sim.worker_of(holder)[:12])
    # The actor's end settles the call: its hold goes, the actor's borrow
    # with the actor, and the object is freed.
    tray.kill(holder)
    sim.advance(5.0)
    assert driver.actor_submitter.statistics().calls_unsettled == 0
    assert oid not in driver.references.refs


def test_an_answered_call_keeps_nothing_back(sim):
    holder = Holder.remote()
    boxed = tray.put(np.full(BIG, 3.0))
    oid = boxed.object_id()
    assert tray.get(holder.hold.remote([boxed]))
    del boxed
    driver = _driver(sim)
    assert driver.actor_submitter.statistics().calls_unsettled == 0
    assert driver.references.refs[oid].submitted == 0  # only the actor's borrow keeps it
    assert tray.get(holder.read.remote()) == BIG * 3.0


def test_a_cancelled_call_keeps_its_argument_refs_until_the_actor_answers(sim):
    holder = Holder.remote()
    assert tray.get(holder.busy.remote(0.0))
    busy = holder.busy.remote(5.0)
    boxed = tray.put(np.full(BIG, 4.0))
    oid = boxed.object_id()
    hold = holder.hold.remote([boxed])
    sim.advance(1.0)
    # On its way: the caller fails it at once and tells the actor, which
    # skips it when its turn comes after `busy` (Ray's rule for an actor
    # call still waiting). Until the actor's reply says so, the caller cannot
    # know whether it ran (the cancel may be lost with a connection), so the
    # call keeps its argument held.
    tray.cancel(hold)
    with pytest.raises(tex.TaskCancelledError):
        tray.get(hold)
    del boxed
    driver = _driver(sim)
    assert driver.actor_submitter.statistics().calls_unsettled == 1
    assert driver.references.refs[oid].submitted == 1
    assert tray.get(busy)
    # It never ran, and the actor read no freed object (before the fix:
    # ObjectLostError, "was freed").
    assert tray.get(holder.read.remote()) == 0.0
    # Its reply came (and was dropped: the call had failed here): settled,
    # and with no borrow at the actor nothing holds the object any more.
    assert driver.actor_submitter.statistics().calls_unsettled == 0
    assert oid not in driver.references.refs
