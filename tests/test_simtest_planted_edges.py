"""The ``edges`` piece (tray/simtest/pieces_edges.py) catches bugs planted
in the core (by monkeypatching, never by editing it) on the right invariant
within a stated number of seeds; and the bug it found stays fixed."""

from __future__ import annotations

from planting import first_failure  # (tests/ is on sys.path)

from tray.core.gcs.actor_manager import ActorManager
from tray.core.worker.task_manager import TaskManager
from tray.simtest import runner


def test_edges_is_green_on_a_few_seeds():
    # 184: a call sent to an actor just after its owner was killed ran
    # (the GCS restarting delayed the actor's end): the piece now calls it
    # once the faults are over, when its end is due.
    for seed in [*range(4), 184]:
        result = runner.run_seed(seed, "edges", "default")
        assert result.ok, (seed, result.invariant, result.message)


def test_retry_exceptions_ignoring_the_class_list_is_caught_within_10_seeds(monkeypatch):
    # retry_exceptions=[EdgeError] retries every application error.
    original = TaskManager.should_retry_exception

    def any_class(task, results):
        if task.spec.retry_exceptions and task.retries_left != 0:
            return True
        return original(task, results)

    monkeypatch.setattr(TaskManager, "should_retry_exception", staticmethod(any_class))
    first_failure(range(10), "edges", "none", "retry-count-exact")


def test_owned_actor_outliving_its_owner_is_caught_within_20_seeds(monkeypatch):
    # The GCS forgets to end the actors a dead worker owned.
    monkeypatch.setattr(ActorManager, "handle_owner_died", lambda self, conn, owner: None)
    result = first_failure(range(20), "edges", "none", "get-returns-model-value")
    assert "owner died" in result.message


def test_a_pending_calls_limit_that_forgets_finished_calls_is_caught_within_20_seeds(
        monkeypatch):
    # The limit counts every call ever made, not the pending ones: once the
    # first calls are done, the actor refuses the next call all the same.
    from tray import exceptions
    from tray.core.worker.actor_task_submitter import ActorTaskSubmitter

    def check_pending_calls(state, max_pending_calls):
        if 0 <= max_pending_calls <= state.next_seq:
            raise exceptions.PendingCallsLimitExceeded("over the limit")

    monkeypatch.setattr(ActorTaskSubmitter, "check_pending_calls",
                        staticmethod(check_pending_calls))
    result = first_failure(range(20), "edges", "none", "api-outcome-as-ray")
    assert "pending ones are done: refused" in result.message
