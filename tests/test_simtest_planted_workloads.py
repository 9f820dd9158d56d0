"""Proving the lifecycle workloads (memory, inflight, recycle): known bugs
planted one at a time (by monkeypatching tray's core, never by editing it)
must make their sweep fail, on the right invariant, within a stated number
of seeds (each seed takes well under a second of wall time)."""

from __future__ import annotations

from planting import first_failure  # (tests/ is on sys.path)

from tray.core.node import memory_monitor
from tray.core.node.memory_monitor import MemoryMonitor
from tray.core.worker.actor_task_submitter import ActorTaskSubmitter
from tray.core.worker.task_receiver import TaskReceiver
from tray.simtest import runner
from tray.simtest.pieces_memory import expected_victim


def _sweep_is_green(seeds, workload: str, faults: str) -> None:
    failed = [(seed, result.invariant) for seed in seeds
              if not (result := runner.run_seed(seed, workload, faults)).ok]
    assert not failed, failed


# ================================================================ memory


def test_the_policy_model_follows_the_documented_order():
    # (lease, granted, retriable, actor, owner)
    assert expected_victim([(1, 1, False, "", "a"), (2, 2, True, "", "a"),
                            (3, 3, False, "x", "")]) == (2, False)
    # The largest owner group, its newest grant; retried: others of its owner ran there.
    assert expected_victim([(1, 1, True, "", "a"), (2, 2, True, "", "b"),
                            (3, 3, True, "", "a"), (4, 4, True, "", "b"),
                            (5, 5, True, "", "b")]) == (5, True)
    # Equal groups: the one whose oldest grant is the newest.
    assert expected_victim([(1, 1, True, "", "a"), (2, 2, True, "", "b"),
                            (3, 3, True, "", "b"), (4, 4, True, "", "a")]) == (3, True)
    # Not retried: one group, whatever the owners; actors only with no task.
    assert expected_victim([(1, 1, False, "", "a"), (2, 2, False, "", "b")]) == (2, False)
    assert expected_victim([(7, 7, False, "actor", "gcs")]) == (7, False)
    assert expected_victim([]) is None


def test_the_memory_workload_reaches_kills_retries_and_out_of_memory_errors(monkeypatch):
    from tray.simtest import pieces_memory

    seen = []
    original = pieces_memory.memory_kills

    def counting(cluster):
        kills = original(cluster)
        seen.extend(kills)
        return kills

    monkeypatch.setattr(pieces_memory, "memory_kills", counting)
    _sweep_is_green(range(6), "memory", "none")
    assert any(retried for *_, retried in seen), seen
    assert any(not retried for *_, retried in seen), seen


def test_a_monitor_that_kills_the_oldest_task_is_caught_within_5_seeds(monkeypatch):
    def oldest(leases):
        chosen = original(leases)
        if chosen is None:
            return None
        victim, retry = chosen
        same = [lease for lease in leases if lease.worker_id and
                lease.for_actor == victim.for_actor and lease.retriable == victim.retriable]
        return min(same, key=lambda lease: lease.granted), retry

    original = memory_monitor.choose_victim
    monkeypatch.setattr(memory_monitor, "choose_victim", oldest)
    first_failure(range(5), "memory", "none", "memory-monitor-kills-by-policy")


def test_a_monitor_that_kills_unretried_tasks_first_is_caught_within_10_seeds(monkeypatch):
    def unretried_first(leases):
        unretried = [lease for lease in leases if lease.worker_id and not lease.retriable
                     and lease.for_actor is None]
        if unretried:
            return max(unretried, key=lambda lease: lease.granted), False
        return original(leases)

    original = memory_monitor.choose_victim
    monkeypatch.setattr(memory_monitor, "choose_victim", unretried_first)
    first_failure(range(10), "memory", "none", "memory-monitor-kills-by-policy")


def test_a_memory_kill_that_is_never_retried_is_caught_within_5_seeds(monkeypatch):
    original = MemoryMonitor.handle_worker_failure_cause

    def never_retry(self, conn, lease_id):
        cause = original(self, conn, lease_id)
        return None if cause is None else type(cause)(cause.kind, cause.message, False)

    monkeypatch.setattr(MemoryMonitor, "handle_worker_failure_cause", never_retry)
    first_failure(range(5), "memory", "none",
                   "out-of-memory-error-only-when-the-policy-gives-up")


def test_a_monitor_that_stops_killing_is_caught_within_5_seeds(monkeypatch):
    monkeypatch.setattr(memory_monitor, "choose_victim", lambda leases: None)
    first_failure(range(5), "memory", "none", "memory-monitor-acts-above-threshold")


def test_memory_kept_by_a_dead_process_is_caught_within_5_seeds(monkeypatch):
    import sys

    from tray.backends.sim.memory import SimulatedMemory

    original = SimulatedMemory.free

    def kept_at_exit(self, address, size_bytes=None):
        # Only a task's own free_memory() frees; a process's end keeps it.
        if sys._getframe(1).f_code.co_name == "free_memory":
            original(self, address, size_bytes)

    monkeypatch.setattr(SimulatedMemory, "free", kept_at_exit)
    first_failure(range(5), "memory", "none", "memory-returned-when-process-ends")


def test_a_memory_kill_retried_at_once_is_caught_within_5_seeds(monkeypatch):
    from tray.core.worker.normal_task_submitter import NormalTaskSubmitter
    from tray.core.worker.task_manager import next_attempt

    async def at_once(self, task):
        task.oom_retries += 1
        next_attempt(task)
        self._tracer.record(self._name, "task_retry", task=task.spec.task_id,
                            attempt=task.spec.attempt, reason="out of memory")
        self.enqueue(task)

    monkeypatch.setattr(NormalTaskSubmitter, "_retry_after_oom", at_once)
    first_failure(range(5), "memory", "none", "memory-kill-retried-after-its-backoff")


# ================================================================ inflight


def test_unretried_calls_sent_again_after_a_crash_are_caught_within_5_seeds(monkeypatch):
    # A call with max_task_retries=0 cut off by its actor's crash is sent
    # again to the restarted actor (as if it had a retry).
    original = ActorTaskSubmitter.submit

    async def resend(self, task, state, *args):
        if task.retries_left == 0:
            task.retries_left = 1
        return await original(self, task, state, *args)

    monkeypatch.setattr(ActorTaskSubmitter, "submit", resend)
    first_failure(range(5), "inflight", "none", "inflight-calls-fail-or-retry-by-their-budget")


# ================================================================ recycle


def test_a_worker_that_exits_before_its_reply_is_caught_within_5_seeds(monkeypatch):
    original = TaskReceiver._count_call

    def exit_at_once(self, spec, max_calls):
        retiring = original(self, spec, max_calls)
        if retiring:
            self._exit_process()
        return retiring

    monkeypatch.setattr(TaskReceiver, "_count_call", exit_at_once)
    first_failure(range(5), "recycle", "none", "get-returns-model-value")


def test_max_calls_off_by_one_is_caught_within_5_seeds(monkeypatch):
    original = TaskReceiver._count_call

    def one_more(self, spec, max_calls):
        return original(self, spec, max_calls + 1)

    monkeypatch.setattr(TaskReceiver, "_count_call", one_more)
    first_failure(range(5), "recycle", "none", "max-calls-worker-retires-after-exactly-n-calls")


def test_max_calls_one_short_is_caught_within_5_seeds(monkeypatch):
    original = TaskReceiver._count_call

    def one_less(self, spec, max_calls):
        return original(self, spec, max(1, max_calls - 1))

    monkeypatch.setattr(TaskReceiver, "_count_call", one_less)
    first_failure(range(5), "recycle", "none", "max-calls-worker-retires-after-exactly-n-calls")


# ======================================================== the state API


def _state_planted(monkeypatch, bend) -> None:
    from tray.core.gcs.task_event_table import TaskEventTable

    original = TaskEventTable.handle_get_task_events

    def bent(self, conn, task_id=None, job_id=None, filters=None, limit=None):
        return bend(original, self, conn, task_id, job_id, filters, limit)

    monkeypatch.setattr(TaskEventTable, "handle_get_task_events", bent)
    first_failure(range(3), "state", "default", "state-queries-agree")


def test_a_limit_that_keeps_the_oldest_rows_is_caught_within_3_seeds(monkeypatch):
    import dataclasses

    def oldest(original, self, conn, task_id, job_id, filters, limit):
        page = original(self, conn, task_id, job_id, filters, None)
        rows = page.rows if limit is None else page.rows[:limit]
        return dataclasses.replace(page, rows=rows, more=len(page.rows) > len(rows))

    _state_planted(monkeypatch, oldest)


def test_a_filter_that_ignores_its_predicate_is_caught_within_3_seeds(monkeypatch):
    def equal_only(original, self, conn, task_id, job_id, filters, limit):
        filters = [(key, "=", value) for key, _predicate, value in filters or ()]
        return original(self, conn, task_id, job_id, filters, limit)

    _state_planted(monkeypatch, equal_only)



def test_an_actor_query_by_id_answering_another_actor_is_caught_within_3_seeds(monkeypatch):
    from tray.core.gcs.actor_manager import ActorManager

    original = ActorManager.handle_list_actor_states

    def first_actor_whatever_the_id(self, conn, actor_id=None):
        page = original(self, conn, None)
        if actor_id is not None:
            import dataclasses

            page = dataclasses.replace(page, rows=page.rows[:1])
        return page

    monkeypatch.setattr(ActorManager, "handle_list_actor_states", first_actor_whatever_the_id)
    first_failure(range(3), "state", "default", "state-queries-agree")
