"""Bugs planted in the core for the simtest's own tests (tests/ is on
sys.path): each makes the runtime wrong in one known way, so a test can
show that a sweep catches it."""

from __future__ import annotations


def plant_spurious_retries(monkeypatch) -> None:
    """The owner drops each normal task's first successful reply and runs
    the task again, out of its budget, as if its worker had died: within
    ``1 + max_retries``, so only the attribution of every extra run to a
    fault can tell."""
    from tray.core.worker.normal_task_submitter import NormalTaskSubmitter
    from tray.core.worker.task_manager import TaskManager, spend_retry

    original_init, original_complete = NormalTaskSubmitter.__init__, TaskManager.complete
    submitters: dict = {}
    again: set = set()

    def remember(self, *args, **kwargs):
        original_init(self, *args, **kwargs)
        submitters[id(self._task_manager)] = self

    def complete(self, task, results):
        spec = task.spec
        submitter = submitters.get(id(self))
        if submitter is not None and spec.actor_id is None and task.retries_left != 0 \
                and spec.task_id not in again:
            again.add(spec.task_id)
            spend_retry(task)
            submitter.enqueue(task)
            return
        original_complete(self, task, results)

    monkeypatch.setattr(NormalTaskSubmitter, "__init__", remember)
    monkeypatch.setattr(TaskManager, "complete", complete)


def first_failure(seeds, workload: str, faults: str, invariant: str):
    """The first seed's result whose sweep fails on ``invariant``; the test
    fails (naming what else broke) when none does."""
    import pytest

    from tray.simtest import runner

    seen = []
    for seed in seeds:
        result = runner.run_seed(seed, workload, faults)
        if not result.ok:
            seen.append((seed, result.invariant, result.message[:300]))
            if result.invariant == invariant:
                return result
    pytest.fail(f"the planted bug went unnoticed (failures on other invariants: {seen})")
