"""Proving the harness: known bugs planted one at a time (by monkeypatching
tray's core, never by editing it) must make the sweep fail, on the right
invariant, within a stated number of seeds."""

from __future__ import annotations

import collections

from planting import first_failure, plant_spurious_retries  # (tests/ is on sys.path)

from tray.core.gcs.actor_manager import ActorManager
from tray.core.ids import ObjectID, TaskID
from tray.core.worker.actor_host import ActorHost
from tray.core.worker.actor_task_submitter import ActorTaskSubmitter
from tray.core.worker.cancellation import TaskCanceller
from tray.core.worker.core_worker import CoreWorker
from tray.core.worker.normal_task_submitter import NormalTaskSubmitter
from tray.core.worker.object_getter import ObjectGetter
from tray.core.worker.object_recovery import ObjectRecoveryManager
from tray.core.worker.reference_counter import ReferenceCounter
from tray.core.worker.task_manager import TaskManager
from tray.core.worker.task_receiver import TaskReceiver


class _NewestFirst(collections.deque):
    def popleft(self):
        return self.pop()


def test_skipping_actor_sequence_ordering_is_caught_within_20_seeds(monkeypatch):
    # The actor's executor runs the calls admitted while it was busy newest
    # first. (Planted before the executor existed as "every call's turn has
    # come"; callers now send a burst in order on one connection, so without
    # faults calls arrive in order and that bug could not show.)
    original = ActorHost.__init__

    def newest_first(self, *args, **kwargs):
        original(self, *args, **kwargs)
        self._admitted = _NewestFirst(self._admitted)

    monkeypatch.setattr(ActorHost, "__init__", newest_first)
    first_failure(range(20), "actors", "none", "actor-calls-in-submission-order")


def test_one_retry_too_many_is_caught_within_10_seeds(monkeypatch):
    original = CoreWorker.submit_task

    def generous(self, **kwargs):
        refs = original(self, **kwargs)
        if kwargs.get("actor") is None:
            task = self.task_manager.get(refs[0].task_id()) if refs else None
            if task is not None and task.retries_left >= 0:
                task.retries_left += 1
        return refs

    monkeypatch.setattr(CoreWorker, "submit_task", generous)
    result = first_failure(range(10), "retries", "none", "task-executes-at-most-1+max_retries")
    assert "executed" in result.message


def test_freeing_an_object_a_borrower_holds_is_caught_within_10_seeds(monkeypatch):
    def forgetful(self, conn, object_id, borrower):
        return self.refs.get(ObjectID(object_id)) is not None

    monkeypatch.setattr(ReferenceCounter, "handle_add_borrower", forgetful)
    first_failure(range(10), "objects", "none", "no-premature-free")


def test_a_lease_never_returned_is_caught_within_5_seeds(monkeypatch):
    def keep(self, queue, lease, worker_ok):
        queue.leases.remove(lease)  # forget it without telling the node manager

    monkeypatch.setattr(NormalTaskSubmitter, "_return_lease", keep)
    result = first_failure(range(5), "dag", "none", "nothing-leaks-at-quiescence")
    assert "lease" in result.message


def test_dropping_a_reconstructed_result_is_caught_within_40_seeds(monkeypatch):
    original_recover = ObjectRecoveryManager.handle_recover_object
    original_complete = TaskManager.complete
    reconstructing: set = set()

    def recover(self, conn, object_id, lost):
        reconstructing.add(object_id)
        return original_recover(self, conn, object_id, lost)

    def complete(self, task, results):
        if reconstructing.intersection(task.spec.return_ids):
            task.state = "FINISHED"  # the re-execution's result goes nowhere
            self.tasks.pop(TaskID(task.spec.task_id), None)
            return
        original_complete(self, task, results)

    monkeypatch.setattr(ObjectRecoveryManager, "handle_recover_object", recover)
    monkeypatch.setattr(TaskManager, "complete", complete)
    first_failure(range(40), "objects", "node_crash", "no-hang")


def test_gpu_ids_handed_out_twice_are_caught_within_15_seeds(monkeypatch):
    # Every GPU task is told it holds device 0, whatever its lease reserved.
    original = NormalTaskSubmitter._push

    async def all_on_zero(self, key, queue, lease, task):
        lease.gpu_ids = [0 for _ in lease.gpu_ids]
        return await original(self, key, queue, lease, task)

    monkeypatch.setattr(NormalTaskSubmitter, "_push", all_on_zero)
    first_failure(range(15), "gpus", "none", "gpu-never-held-past-its-capacity")


def test_gpu_fractions_stacked_past_a_device_are_caught_within_20_seeds(monkeypatch):
    # A fraction goes to the first device it would fit in empty, whatever
    # that device already lends: two 0.6-GPU tasks share one device.
    from tray.core import scheduling

    def choose(self, amount):
        if 0 < amount < 1 - scheduling.EPSILON:
            return [(min(self.capacity), amount)]
        return original(self, amount)

    original = scheduling.GpuAllocator._choose
    monkeypatch.setattr(scheduling.GpuAllocator, "_choose", choose)
    result = first_failure(range(20), "gpus", "none", "gpu-never-held-past-its-capacity")
    assert "past its capacity" in result.message


def test_actor_names_lost_in_a_gcs_restart_are_caught_within_10_seeds(monkeypatch):
    # A restarted GCS recovers its actors but not their names.
    original = ActorManager.__init__

    def forgetful(self, *args, **kwargs):
        original(self, *args, **kwargs)
        if self.actors:
            self.names.clear()

    monkeypatch.setattr(ActorManager, "__init__", forgetful)
    result = first_failure(range(10), "named", "gcs_restart", "runs-without-crashing")
    assert "ValueError" in result.message


def test_constructor_arguments_released_at_the_first_start_are_caught_within_15_seeds(
        monkeypatch):
    # Released once the actor first runs (tray before the chaos profile
    # found it): a restart finds its constructor's arguments freed.
    async def release_early(self, actor, holds):
        try:
            await self.actor_info(self.actor_state(actor.actor_id))
        finally:
            self._references.release_submitted(holds)

    monkeypatch.setattr(ActorTaskSubmitter, "_release_when_done", release_early)
    first_failure(range(15), "restarts", "chaos", "no-premature-free")


def test_actor_calls_that_stop_retrying_are_caught_within_15_seeds(monkeypatch):
    # "A runtime that stopped retrying on worker death would pass most
    # seeds" (issue 12): calls to actors with max_task_retries=-1 that fail
    # at the first crash are not a permitted outcome any more.
    original = ActorTaskSubmitter.submit

    async def no_retries(self, task, state):
        task.retries_left = 0
        return await original(self, task, state)

    monkeypatch.setattr(ActorTaskSubmitter, "submit", no_retries)
    first_failure(range(15), "restarts", "worker_crash", "unlimited-retries-never-give-up")


def test_tasks_that_stop_retrying_on_worker_death_are_caught_within_12_seeds(monkeypatch):
    # Issue 12: "a runtime that stopped retrying on worker death would pass
    # most seeds". A task with a finite budget that fails at its first
    # crash is caught by the budget check, not only unlimited ones.
    original = CoreWorker.submit_task

    def stingy(self, **kwargs):
        refs = original(self, **kwargs)
        if kwargs.get("actor") is None:
            task = self.task_manager.get(refs[0].task_id()) if refs else None
            if task is not None and task.retries_left > 0:
                task.retries_left = 0
        return refs

    monkeypatch.setattr(CoreWorker, "submit_task", stingy)
    result = first_failure(range(12), "mixed", "chaos", "gives-up-only-when-the-budget-is-spent")
    assert "gave up after 0 retries" in result.message


def test_actors_that_stop_restarting_early_are_caught_within_12_seeds(monkeypatch):
    original = ActorManager._actor_failed

    def no_restarts(self, actor, reason):
        if actor.spec.max_restarts > 0:
            actor.restarts = actor.spec.max_restarts  # the budget "spent" at the first crash
        return original(self, actor, reason)

    monkeypatch.setattr(ActorManager, "_actor_failed", no_restarts)
    result = first_failure(range(12), "actors", "chaos", "gives-up-only-when-the-budget-is-spent")
    assert "after 0 restarts" in result.message



def test_wait_reporting_unfinished_refs_ready_is_caught_within_5_seeds(monkeypatch):
    async def hasty(self, refs, num_returns, timeout, fetch_local):
        return refs[:num_returns], refs[num_returns:]  # "ready" without looking

    monkeypatch.setattr(ObjectGetter, "wait", hasty)
    result = first_failure(range(5), "wait", "none", "wait-ready-means-ready")
    assert "get did not answer" in result.message


def test_a_spurious_retry_within_the_budget_is_caught_within_3_seeds(monkeypatch):
    # Issue 12: retries were counted, not attributed. The owner drops each
    # task's first successful reply and runs the task again, out of its
    # budget, as if its worker had died: within 1 + max_retries, so only
    # the attribution of every extra run to a fault can tell.
    plant_spurious_retries(monkeypatch)
    result = first_failure(range(3), "mixed", "default",
                            "every-re-execution-has-a-fault-behind-it")
    assert "no fault hit that worker" in result.message


def test_reconstruction_refused_with_retries_left_is_caught_within_12_seeds(monkeypatch):
    # Issue 12: "ObjectLostError is accepted whenever processes were
    # killed". The owner says a lost result's retries are used up while its
    # task has retries left: only a check of the error against the trace
    # (the task's retries and re-runs) can tell.
    original = ObjectRecoveryManager.handle_recover_object

    def stingy(self, conn, object_id, lost):
        task = self._task_manager.lineage.get(ObjectID(object_id).task_id())
        if task is not None:
            task.retries_left = 0
        return original(self, conn, object_id, lost)

    monkeypatch.setattr(ObjectRecoveryManager, "handle_recover_object", stingy)
    result = first_failure(range(12), "mixed", "default",
                            "object-lost-only-when-it-cannot-be-rebuilt")
    assert "it can still be re-created" in result.message


def test_lineage_one_level_deep_is_caught_within_12_seeds(monkeypatch):
    # tray before lineage pinning: a finished task in lineage did not keep
    # its arguments, so a chain lost with its node could be rebuilt one
    # level only ("its argument ... was freed").
    def unpinned(self, task_id, task):
        self.lineage.pop(task_id, None)
        self.lineage[task_id] = task

    monkeypatch.setattr(TaskManager, "_keep_lineage", unpinned)
    result = first_failure(range(12), "mixed", "default",
                            "object-lost-only-when-it-cannot-be-rebuilt")
    assert "was freed" in result.message


def test_a_cancel_that_leaves_queued_tasks_queued_is_caught_within_5_seeds(monkeypatch):
    # Cancels only what runs: a queued task stays queued and runs later.
    original = TaskCanceller._cancel_owned

    async def running_only(self, task_id, force, recursive):
        task = self._task_manager.get(task_id)
        if task is not None and task.pushed_to is None:
            return
        await original(self, task_id, force, recursive)

    monkeypatch.setattr(TaskCanceller, "_cancel_owned", running_only)
    result = first_failure(range(5), "mixed", "default", "get-returns-model-value")
    assert "cancelled while queued" in result.message


def test_an_actor_never_told_of_a_cancelled_call_is_caught_within_3_seeds(monkeypatch):
    # Red team 4's miss: the owner fails the call but never tells the actor,
    # where the call waits for its turn and then runs.
    async def owner_only(self, task_id, force, recursive):
        task = self._task_manager.get(task_id)
        if task is not None and task.spec.actor_id is not None:
            self._task_manager.fail(task, tex.TaskCancelledError("cancelled"))
            return
        await original(self, task_id, force, recursive)

    import tray.exceptions as tex

    original = TaskCanceller._cancel_owned
    monkeypatch.setattr(TaskCanceller, "_cancel_owned", owner_only)
    first_failure(range(3), "cancel", "default", "retry-count-exact")


def test_a_force_cancel_that_spares_the_worker_is_caught_within_10_seeds(monkeypatch):
    # (In the default sweep, mixed/default, at seed 6; here the cancel workload's.)
    original = TaskReceiver.handle_cancel_task

    async def gentle(self, conn, task_id, force, recursive):
        await original(self, conn, task_id, False, recursive)

    monkeypatch.setattr(TaskReceiver, "handle_cancel_task", gentle)
    first_failure(range(10), "cancel", "none", "force-cancel-kills-the-worker")


def test_a_recursive_cancel_that_spares_the_children_is_caught_within_10_seeds(monkeypatch):
    # (In the default sweep, mixed/default, at seed 15; here the cancel workload's.)
    async def childless(self, task_id, force):
        return None

    monkeypatch.setattr(TaskCanceller, "cancel_children", childless)
    first_failure(range(10), "cancel", "none", "recursive-cancel-cancels-children")


def test_a_call_failed_for_a_crash_it_never_met_is_caught_within_10_seeds(monkeypatch):
    # A call that finds its actor's process gone before it is sent does not
    # wait for the restart: it fails as a call cut off in flight would (the
    # bug of 2026-11-27: ActorDiedError "died while running" for a call made
    # after the crash). The default profile catches it too, at seed 11.
    async def impatient(self, state, unreachable):
        return False

    monkeypatch.setattr(ActorTaskSubmitter, "_next_incarnation", impatient)
    result = first_failure(range(10), "restarts_unretried", "none", "get-returns-model-value")
    assert "after 1 crash(es)" in result.message
