"""Duplicate deliveries, object recovery and fault attribution: the fault
that sends reliable messages again (``duplicate``) and the checks that hold
the runtime to its promises under it. Bugs are planted one at a time by
monkeypatching tray's core (never by editing it), and each must make the
sweep fail on the right invariant within a stated number of seeds."""

from __future__ import annotations

from planting import first_failure  # (tests/ is on sys.path)

import tray
from tray import exceptions
from tray.core.ids import ObjectID
from tray.core.rpc import Endpoint
from tray.core.worker.object_recovery import ObjectRecoveryManager
from tray.core.worker.task_manager import PendingTask, TaskManager, spend_retry
from tray.simtest import faults, runner

# ------------------------------------------------------------ the fault itself


def test_duplicate_is_in_the_default_and_chaos_profiles_on_its_own_stream():
    kinds = set(faults.KIND_NEEDS)
    for profile in ("default", "chaos", "network", "duplicate"):
        assert "duplicate" in faults.PROFILES[profile]
    drawn = [f for seed in range(20) for f in faults.plan(seed, "default", kinds, 3)
             if f.kind == "duplicate"]
    assert drawn and all(dict(f.params)["seconds"] > 0 for f in drawn)
    # The other kinds' schedules are what they were without it.
    without = kinds - {"duplicate"}
    for seed in range(20):
        assert [f for f in faults.plan(seed, "chaos", kinds, 3) if f.kind != "duplicate"] == \
            faults.plan(seed, "chaos", without, 3)


def _lag_then_break(seed: int):
    """20 tasks on 2 nodes, the process the first reliable message reaches
    (a node manager a lease goes back to) lagging for 0.2 s: it handles
    that message and those that follow, but its acknowledgements go into
    the lag and are lost with the reset, so their senders send them again."""
    tray.init(backend="sim", seed=seed, num_nodes=2, num_cpus=2)
    try:
        cluster = tray.simtest.cluster()

        @tray.remote
        def square(x):
            return x * x

        cluster.replay_after_reset(None, 0.2)
        values = tray.get([square.remote(i) for i in range(20)])
        cluster.advance(1.0)
        network = cluster.network
        handled = {address: (process.component.endpoint.reliable_handled,
                             network.reliable_new.get(address, 0))
                   for address, process in cluster.processes.items()}
        return values, network.reliable_replayed, handled, cluster.digest()
    finally:
        tray.shutdown()


def test_a_lagging_process_whose_connections_break_gets_its_reliable_messages_again():
    values, replayed, handled, digest = _lag_then_break(5)
    assert values == [i * i for i in range(20)]
    assert replayed > 0
    for address, (handled_here, new_here) in handled.items():
        assert handled_here == new_here, address  # each handled once
    assert _lag_then_break(5)[3] == digest  # and it replays bit for bit


def test_the_duplicate_profile_passes_and_sends_messages_again():
    from tray.backends.sim.patches import _active

    struck = sent_again = 0
    for seed in range(4):
        result = runner.run_seed(seed, "mixed", "duplicate")
        assert result.ok, result.report()
        struck += sum(1 for line in result.schedule if " duplicate " in line and
                      "process=" in line)  # (recorded when it strikes)
        sent_again += _active["last"].network.reliable_replayed
    assert struck > 0 and sent_again > 0


# ------------------------------------------------------------ planted bugs


def test_a_disabled_duplicate_filter_is_caught_within_5_seeds(monkeypatch):
    original = Endpoint.first_delivery

    def every_copy_is_new(self, connection, seq):
        original(self, connection, seq)
        return True

    monkeypatch.setattr(Endpoint, "first_delivery", every_copy_is_new)
    result = first_failure(range(5), "mixed", "default", "reliable-message-handled-once")
    assert "handled a reliable message twice" in result.message


def test_a_duplicate_filter_off_by_one_is_caught_within_10_seeds(monkeypatch):
    def off_by_one(self, connection, seq):
        peer = connection.peer
        known = self._received.get(peer)
        if known is not None and known[0] == connection.peer_session and seq < known[1]:
            return False  # (<=: the last one handled comes through again)
        self._received[peer] = (connection.peer_session, seq)
        return True

    monkeypatch.setattr(Endpoint, "first_delivery", off_by_one)
    first_failure(range(10), "objects", "default", "reliable-message-handled-once")


def test_recovery_freeing_every_copy_it_knows_is_caught_within_5_seeds(monkeypatch):
    # The owner takes every copy it knows for lost, not only those the
    # reader could not read: it frees the good ones too, and re-runs.
    original = ObjectRecoveryManager.handle_recover_object

    def greedy(self, conn, object_id, lost):
        entry = self._references.refs.get(ObjectID(object_id))
        if entry is not None and entry.ready:
            lost = [list(location) for location in lost]
            lost += [list(location) for location in entry.locations
                     if list(location) not in lost]
        return original(self, conn, object_id, lost)

    monkeypatch.setattr(ObjectRecoveryManager, "handle_recover_object", greedy)
    result = first_failure(range(5), "copies", "none", "recovery-keeps-good-copies")
    assert "good copy" in result.message


def test_recovery_re_running_a_task_whose_copy_lives_is_caught_within_5_seeds(monkeypatch):
    # The owner drops what the reader lost, and re-runs the task although
    # a copy it knows of lives on (it keeps that copy).
    original = ObjectRecoveryManager.handle_recover_object

    def eager(self, conn, object_id, lost):
        failure = original(self, conn, object_id, lost)
        oid = ObjectID(object_id)
        entry = self._references.refs.get(oid)
        task = self._task_manager.lineage.get(oid.task_id())
        if failure is None and entry is not None and entry.ready and entry.locations and \
                task is not None and task.retries_left != 0 and not task.spec.ref_args():
            spend_retry(task)
            again = PendingTask(task.spec, task.retries_left, ())
            self._task_manager.add(again)
            self._tracer.record(self._name, "task_reconstruct", task=task.spec.task_id,
                                attempt=task.spec.attempt, object=oid, by=self._address)
            self._bridge.start_soon(self._submitter.submit, again)
        return failure

    monkeypatch.setattr(ObjectRecoveryManager, "handle_recover_object", eager)
    result = first_failure(range(5), "copies", "none", "recovery-keeps-good-copies")
    assert "re-ran its task" in result.message


def test_a_spurious_worker_crash_is_caught_within_3_seeds(monkeypatch):
    # The owner fails a finished task with max_retries=0 as if the worker
    # running it had died on the last node (nothing killed it).
    original = TaskManager.complete
    failed: set = set()

    def crash_instead(self, task, results):
        spec = task.spec
        if spec.actor_id is None and task.retries_left == 0 and len(failed) < 2 and \
                spec.task_id not in failed:
            failed.add(spec.task_id)
            node = tray.simtest.cluster().node_ids()[-1]
            self.fail(task, exceptions.WorkerCrashedError(
                f"the worker running task {spec.name} ({spec.task_id.hex()}) on node {node} "
                f"died, and its retries are used up (max_retries={spec.max_retries}, "
                f"attempts={spec.attempt + 1})"))
            return
        original(self, task, results)

    monkeypatch.setattr(TaskManager, "complete", crash_instead)
    result = first_failure(range(3), "retries", "default",
                            "every-failure-has-a-fault-behind-it")
    assert "failed as if its worker died" in result.message
