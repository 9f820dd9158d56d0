"""Proving the checks of where work runs, when ``wait`` returns and how far
a cancel reaches (``tray/simtest/checks.py``: ``check_placements``,
``check_waits``, ``check_cancels``): bugs planted one at a time by
monkeypatching tray's core (never by editing it) must make a small sweep fail
on the right invariant, within the stated number of seeds."""

from __future__ import annotations

import trio
from planting import first_failure  # (tests/ is on sys.path)

from tray.core import scheduling
from tray.core.worker.cancellation import TaskCanceller
from tray.core.worker.object_getter import ObjectGetter
from tray.core.worker.task_receiver import TaskReceiver

# ------------------------------------------------------------------ wait


def test_a_wait_that_wakes_late_is_caught_within_5_seeds(monkeypatch):
    # Once enough refs are ready, the waiter oversleeps a tenth of a second
    # before it answers (within its timeout: only the timing is wrong).
    original = ObjectGetter._wait

    async def drowsy(self, refs, num_returns, timeout, fetch_local):
        answer = await original(self, refs, num_returns, timeout, fetch_local)
        await trio.sleep(0.1)
        return answer

    monkeypatch.setattr(ObjectGetter, "_wait", drowsy)
    result = first_failure(range(5), "wait", "none", "wait-returns-once-enough-are-ready")
    assert "later" in result.message


def test_a_wait_that_gives_up_before_its_timeout_is_caught_within_20_seeds(monkeypatch):
    # Waits half its timeout (a unit slip), then answers with what is ready.
    original = ObjectGetter._wait

    async def impatient(self, refs, num_returns, timeout, fetch_local):
        return await original(self, refs, num_returns,
                              None if timeout is None else timeout / 2, fetch_local)

    monkeypatch.setattr(ObjectGetter, "_wait", impatient)
    first_failure(range(20), "wait", "none", "wait-never-returns-early")


def test_a_wait_that_answers_in_the_order_refs_became_ready_is_caught_within_10_seeds(
        monkeypatch):
    # The ready ones in reverse of the order given (as if sorted by when
    # they became ready, newest first).
    original = ObjectGetter.wait

    async def reordered(self, refs, num_returns, timeout, fetch_local):
        ready, pending = await original(self, refs, num_returns, timeout, fetch_local)
        return list(reversed(ready)), pending

    monkeypatch.setattr(ObjectGetter, "wait", reordered)
    first_failure(range(10), "wait", "none", "wait-returns-refs-in-order")


# ---------------------------------------------------------------- cancel


def test_a_recursive_cancel_one_level_deep_is_caught_within_25_seeds(monkeypatch):
    # The children of the cancelled task are cancelled, but as plain
    # cancels: their own children (the grandchildren) run on to their end.
    async def one_level(self, task_id, force):
        for child in list(self._task_manager.tasks.values()):
            if child.spec.parent_task_id == task_id:
                await self._cancel_owned(child.spec.task_id, force, False)

    monkeypatch.setattr(TaskCanceller, "cancel_children", one_level)
    result = first_failure(range(25), "cancel", "none", "recursive-cancel-cancels-children")
    assert "#1:0#" in result.message  # a grandchild


def test_a_plain_cancel_that_cancels_the_children_too_is_caught_within_20_seeds(monkeypatch):
    original = TaskReceiver.handle_cancel_task

    async def always_recursive(self, conn, task_id, force, recursive):
        await original(self, conn, task_id, force, True)

    monkeypatch.setattr(TaskReceiver, "handle_cancel_task", always_recursive)
    first_failure(range(20), "cancel", "none", "plain-cancel-leaves-children-alone")


# ------------------------------------------------------------- placement


def test_spread_that_never_moves_on_is_caught_within_5_seeds(monkeypatch):
    # The round-robin cursor is never advanced: every SPREAD request goes
    # to the first node with room.
    original = scheduling.pick_node

    def stuck(request, strategy, local_node_id, view, state, threshold):
        state.spread_next = 0
        return original(request, strategy, local_node_id, view, state, threshold)

    monkeypatch.setattr(scheduling, "pick_node", stuck)
    first_failure(range(5), "objects", "none", "spread-tasks-spread-over-the-nodes")


def test_a_soft_node_affinity_taken_for_default_is_caught_within_10_seeds(monkeypatch):
    # A soft affinity is scheduled like DEFAULT: locally, while there is room.
    original = scheduling.pick_node

    def careless(request, strategy, local_node_id, view, state, threshold):
        if isinstance(strategy, scheduling.NodeAffinityStrategy) and strategy.soft:
            strategy = scheduling.DefaultStrategy()
        return original(request, strategy, local_node_id, view, state, threshold)

    monkeypatch.setattr(scheduling, "pick_node", careless)
    result = first_failure(range(10), "objects", "none", "node-affinity-honoured")
    assert "soft=True" in result.message


def test_a_hard_node_affinity_that_spills_is_caught_within_10_seeds(monkeypatch):
    # A hard affinity is treated as soft, and a node "has no room" for it
    # (0-CPU tasks always fit: the slip only shows because it spills).
    original = scheduling.pick_node

    def spilling(request, strategy, local_node_id, view, state, threshold):
        if isinstance(strategy, scheduling.NodeAffinityStrategy) and not strategy.soft:
            return original(request, scheduling.SpreadStrategy(), local_node_id, view, state,
                            threshold)
        return original(request, strategy, local_node_id, view, state, threshold)

    monkeypatch.setattr(scheduling, "pick_node", spilling)
    result = first_failure(range(10), "objects", "none", "node-affinity-honoured")
    assert "soft=False" in result.message


def test_default_that_skips_an_idle_local_node_is_caught_within_10_seeds(monkeypatch):
    # The locality test compares the wrong way: an idle local node is
    # "busy", and the task goes to the least utilized node, the local one
    # last among equals.
    original = scheduling.pick_node

    def far(request, strategy, local_node_id, view, state, threshold):
        if isinstance(strategy, scheduling.DefaultStrategy):
            others = {node_id: node for node_id, node in view.items()
                      if node_id != local_node_id}
            if others:
                choice = original(request, strategy, None, others, state, threshold)
                if choice != scheduling.INFEASIBLE:
                    return choice
        return original(request, strategy, local_node_id, view, state, threshold)

    monkeypatch.setattr(scheduling, "pick_node", far)
    first_failure(range(10), "objects", "none", "default-strategy-runs-locally-first")


def test_work_in_any_bundle_of_its_group_is_caught_within_15_seeds(monkeypatch):
    # The bundle index is dropped on the way: the owner asks the node of
    # any bundle of the group, and that node grants from any of its bundles.
    import dataclasses

    from tray.core.node.lease_manager import LeaseManager
    from tray.core.worker.normal_task_submitter import NormalTaskSubmitter

    original_manager = NormalTaskSubmitter._bundle_manager

    async def any_manager(self, queue, spec):
        anywhere = dataclasses.replace(spec.strategy, bundle_index=-1)
        return await original_manager(self, queue, dataclasses.replace(spec, strategy=anywhere))

    def any_bundle(self, strategy):
        return [key for key in sorted(self.bundles) if key[0] == strategy.placement_group_id]

    monkeypatch.setattr(NormalTaskSubmitter, "_bundle_manager", any_manager)
    monkeypatch.setattr(LeaseManager, "_bundles_for", any_bundle)
    first_failure(range(15), "groups", "none", "placement-group-work-runs-in-its-bundle")
