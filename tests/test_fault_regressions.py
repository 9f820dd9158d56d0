"""Seeds of the fault sweeps that found tray bugs, pinned so they stay fixed.

Each replays with ``tray simtest replay --seed N --workload mixed --faults P``.
The first ones were found when ``chaos`` was the same schedule as
``default``; they are pinned under ``default``, which still draws them.
The workload mix has grown since most were found (``returns``, ``named``,
``gpus``; GPUs in cluster shapes), so a pinned seed now replays a different
program than the one that failed: each stays a must-pass sweep point, and
the bugs with a direct reproduction have a test of their own below."""

from __future__ import annotations

import pytest

from tray.simtest import runner

PINNED = [
    # A lease whose grant reply was lost in a connection reset stayed taken
    # forever; now the node asks the owner whether it holds it.
    (66, "default", "lease lost in a reset"),
    # An actor call re-sent after a reset ran twice (both copies were waiting
    # for their turn); now the actor answers a re-sent call with the first reply.
    (79, "default", "actor call re-sent after a reset ran twice"),
    # Leases granted to the GCS for actor creations in progress when it
    # restarted were never returned.
    (86, "default", "actor leases across GCS restarts"),
    (92, "default", "actor leases across GCS restarts"),
    (93, "default", "lease lost in a reset, with partitions"),
    # The chaos profile (BUGGIFY: every object through the store): a
    # restarted actor's constructor found its arguments freed (they were
    # released at the first start), and a pull from this node's manager over
    # a reset connection failed the get instead of asking again.
    (2, "chaos", "pull_object over a reset connection"),
    (13, "chaos", "pull_object over a reset connection, in wait"),
    (21, "chaos", "constructor arguments freed before a restart"),
    (38, "chaos", "constructor arguments freed before a restart"),
    # Two attempts of one task in one worker (re-pushed after a reset cut
    # the first off): the first to end removed the other's entry, and the
    # other failed its task with a KeyError.
    (160, "chaos", "two attempts of a task in one worker"),
    # Of the grown mix: a placement group being re-placed was marked CREATED
    # although a node holding its other bundles died meanwhile.
    (16, "chaos", "placement group CREATED with a bundle missing"),
    (290, "chaos", "placement group CREATED with a bundle missing"),
    # With task costs in virtual time (2026-11-23): a floor that jumped past
    # several waiting actor calls let them race for the actor, and #3 ran
    # before #2; a call that failed while earlier ones were in flight left
    # the actor waiting for it forever (the floor went out too early).
    (480, "chaos", "actor calls raced after a floor jump"),
    (520, "chaos", "actor calls raced after a floor jump"),
    (559, "chaos", "an abandoned call before calls in flight: a gap forever"),
    # Two copies of a call held up by a partition arrived after the caller
    # gave up on it: the second ran again (its first's reply was not kept),
    # after a later call.
    (873, "chaos", "a late re-sent actor call ran twice, out of order"),
    # The model: a crash after a flaky task's successful run costs one more
    # run; a hold cut off by a reset leaves the holder nothing to read.
    (333, "chaos", "the model: a successful run cut off by a crash"),
    (273, "chaos", "the model: a borrow cut off by a reset"),
]


@pytest.mark.parametrize("seed,profile,bug", PINNED,
                         ids=[f"{profile}-{seed}" for seed, profile, _ in PINNED])
def test_fault_seed_stays_fixed(seed, profile, bug):
    result = runner.run_seed(seed, "mixed", profile)
    assert result.ok, f"{bug}: {result.report()}"


def test_first_run_in_a_process_repeats_like_later_runs():
    # Seed 413 used a task through .options() before using it plainly: each
    # variant pickled the function on its own, at different moments, so the
    # first run in a process exported one function more than later runs.
    first = runner.run_seed(413, "mixed", "default")
    second = runner.run_seed(413, "mixed", "default")
    assert first.digest == second.digest


def test_options_variants_share_one_export():
    import tray

    @tray.remote
    def f(x):
        return x

    variant = f.options(num_cpus=0.5)
    assert variant._export is f._export
    assert variant._export.get() == f._export.get()


def test_reset_during_borrowing_keeps_the_object():
    # A connection reset lost a one-way reference-counting message (add or
    # remove borrower), so an object a borrower held was freed early. One-way
    # messages that matter are reliable now: re-sent, handled once.
    result = runner.run_seed(413, "mixed", "default")
    assert result.ok, result.report()


def test_a_registration_sent_again_leaves_a_leased_worker_leased():
    # chaos seed 235 (before the workload mix grew): a worker's register
    # reply was lost in a reset, the worker registered again, and its node
    # made it idle while a task held its lease (then gave it to another).
    import time

    import tray
    from tray.simtest import cluster as current_cluster

    @tray.remote
    def hold(seconds):
        time.sleep(seconds)
        return "done"

    tray.init(backend="sim", seed=3, num_cpus=1, validate_every_steps=1)
    try:
        ref = hold.remote(5.0)
        cluster = current_cluster()
        node = cluster.processes["n0/raylet"].component
        leased = []
        while not leased:
            tray.wait([ref], timeout=0.1)
            leased = [w for w in node.pool.workers.values() if w.state == "leased"]
        worker = leased[0]
        cluster.call_soon(lambda: node.pool.handle_register_worker(None, worker.worker_id,
                                                                   worker.address))
        tray.wait([ref], timeout=0.1)
        assert worker.state == "leased" and worker.worker_id not in node.pool.idle
        assert tray.get(ref) == "done"
    finally:
        tray.shutdown()


def test_a_reset_to_the_owner_is_not_the_owner_dying(monkeypatch):
    # A borrower whose connection to the owner broke (a reset) while it asked
    # for an object's status, or for its recovery, got OwnerDiedError
    # although the owner lived. Each first ask here is cut off.
    import numpy as np

    import tray
    from tray.core.rpc import Endpoint, PeerDisconnected

    original = Endpoint.call
    cut: set = set()

    async def flaky_call(self, address, method, *args):
        if method in ("object_status", "recover_object") and method not in cut:
            cut.add(method)
            raise PeerDisconnected(address, method)
        return await original(self, address, method, *args)

    @tray.remote
    def read(boxed):
        return int(tray.get(boxed[0]).sum())

    tray.init(backend="sim", seed=4, num_nodes=2, num_cpus=1)
    try:
        ref = tray.put(np.ones(100_000, dtype=np.int64))
        monkeypatch.setattr(Endpoint, "call", flaky_call)
        assert tray.get(read.remote([ref])) == 100_000
        assert "object_status" in cut
    finally:
        monkeypatch.undo()
        tray.shutdown()


def test_a_node_registering_at_an_address_ends_the_node_that_was_there():
    # chaos seed 5 (of the grown mix): a node died while the GCS was down and
    # came back at its address as a new node; the GCS still counted the old
    # one alive, and an actor recorded on it made a lease of the new node
    # look held, so that lease was never reclaimed.
    import dataclasses

    import tray
    from tray.simtest import cluster as current_cluster

    tray.init(backend="sim", seed=2, num_nodes=2, num_cpus=1)
    try:
        cluster = current_cluster()
        table = cluster.processes[cluster.gcs_address].component.node_table
        old_id = cluster.node_ids()[1]
        old = table.nodes[old_id]
        successor = dataclasses.replace(old, node_id="f" * 32)
        cluster.call_soon(lambda: table.handle_register_node(None, successor))
        tray.wait([tray.put(0)], timeout=0.5)
        assert table.nodes["f" * 32].alive
        assert not table.nodes[old_id].alive
    finally:
        tray.shutdown()
