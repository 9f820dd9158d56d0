"""The ``paths`` piece (tray/simtest/pieces_paths.py) and the path knobs
(tray/simtest/faults.py ``PATH_KNOBS``) catch bugs planted in the core (by
monkeypatching, never by editing it) on the right invariant within a stated
number of seeds; and the bug the piece found stays fixed."""

from __future__ import annotations

import pytest
from planting import first_failure  # (tests/ is on sys.path)

import tray
from tray import exceptions
from tray.simtest import faults, runner


def test_paths_is_green_on_a_few_seeds():
    # none seed 0: a call sent right after __ray_terminate__ ran (below).
    for seed, profile in [(0, "none"), (0, "default"), (1, "default"), (2, "chaos")]:
        result = runner.run_seed(seed, "paths", profile)
        assert result.ok, (seed, profile, result.invariant, result.message)


def test_a_call_sent_right_after_ray_terminate_never_runs():
    # The calls reach the actor before it is up, so each waits in a task of
    # its own; the executor ran the call after __ray_terminate__ before the
    # terminate's task had begun the exit (found by paths none seed 0).
    from tray.simtest.remote_code_paths import Tally

    tray.init(backend="sim", seed=0, num_cpus=2)
    try:
        tally = Tally.remote("regression")
        first = [tally.__ray_ready__.remote(), tally.add.remote(3)]
        done = tally.__ray_terminate__.remote()
        after = tally.total.remote()
        assert tray.get(first) == [True, 3]
        for ref in (done, after):
            with pytest.raises(exceptions.ActorDiedError):
                tray.get(ref)
    finally:
        tray.shutdown()


def test_path_knobs_are_drawn_per_seed_for_the_fault_profiles_only():
    drawn = [faults.buggify(seed, "default") for seed in range(40)]
    assert any(drawn) and not all(drawn)  # about half the seeds turn none
    assert set().union(*drawn) <= set(faults.PATH_KNOBS)
    assert all(knobs[name] in faults.PATH_KNOBS[name] for knobs in drawn for name in knobs)
    assert all(faults.buggify(seed, "none") == {} for seed in range(40))
    assert all(faults.buggify(seed, "stall") == {} for seed in range(40))
    assert [faults.buggify(seed, "default") for seed in range(40)] == drawn  # replays


def test_executor_running_calls_of_an_exiting_actor_is_caught_within_6_seeds(monkeypatch):
    # The executor runs a call admitted before the actor began to exit.
    from tray.core.worker.actor_host import ActorHost

    async def execute(self, spec):
        context = self._call_context(spec)
        instance = self.instance

        async def bound_method():
            if spec.method in ("__ray_ready__", "__ray_terminate__"):
                return await self._builtin(spec)
            return getattr(instance, spec.method)
        return await self._receiver.execute(spec, context, bound_method)

    monkeypatch.setattr(ActorHost, "_execute", execute)
    result = first_failure(range(6), "paths", "none", "get-returns-model-value")
    assert "a call after __ray_terminate__" in result.message or \
        "a call after the actor quit" in result.message


def test_kv_put_ignoring_overwrite_false_is_caught_within_6_seeds(monkeypatch):
    from tray.core.gcs.kv_store import KvStore

    original = KvStore.handle_user_kv_put

    def put(self, conn, namespace, key, value, overwrite):
        return original(self, conn, namespace, key, value, True)

    monkeypatch.setattr(KvStore, "handle_user_kv_put", put)
    result = first_failure(range(6), "paths", "none", "api-outcome-as-ray")
    assert "kv step" in result.message


def test_kv_delete_by_prefix_deleting_one_key_is_caught_within_8_seeds(monkeypatch):
    from tray.core.gcs.kv_store import KvStore

    original = KvStore.handle_user_kv_del

    def delete(self, conn, namespace, key, by_prefix):
        return original(self, conn, namespace, key, False)

    monkeypatch.setattr(KvStore, "handle_user_kv_del", delete)
    result = first_failure(range(8), "paths", "none", "api-outcome-as-ray")
    assert "del_prefix" in result.message


def test_object_report_typing_pending_arguments_as_local_is_caught_within_6_seeds(
        monkeypatch):
    from tray.core.worker import state_report

    original = state_report._reference_type

    def reference_type(entry):
        return "LOCAL_REFERENCE" if entry.local else original(entry)

    monkeypatch.setattr(state_report, "_reference_type", reference_type)
    result = first_failure(range(6), "paths", "none", "api-outcome-as-ray")
    assert "list_objects" in result.message


def test_get_waiting_for_every_ref_despite_a_failure_is_caught_within_4_seeds(monkeypatch):
    # On the driver's thread path, get() of a list waits for every ref to
    # be ready, even once one of them failed.
    from tray.core.worker.thread_waits import ThreadWaits

    def ready(waiter, entry):
        waiter.pending -= 1
        if waiter.pending == 0:
            waiter.wake()

    monkeypatch.setattr(ThreadWaits, "_thread_ref_ready", staticmethod(ready))
    seeds = [seed for seed in range(20) if runner.driver_thread_path(seed)][:4]
    result = first_failure(seeds, "paths", "none", "api-outcome-as-ray")
    assert "waited for the other task's end" in result.message


def test_chunked_pull_misplacing_a_chunk_is_caught_by_the_default_sweep_of_objects(
        monkeypatch):
    # The path knobs make pulls chunked (object_chunk_bytes 16/64 KiB): a
    # chunk after the first written one byte off is caught only with them.
    from tray.core.node import object_manager

    original = object_manager._write_pieces

    def write(view, offset, pieces):
        if offset == 0:
            return original(view, offset, pieces)
        end = original(view, offset + 1, [bytes(memoryview(p).cast("B"))[:-1]
                                          for p in pieces])
        return end + 1

    monkeypatch.setattr(object_manager, "_write_pieces", write)
    seeds = [seed for seed in range(60)
             if faults.buggify(seed, "default").get("object_chunk_bytes")][:12]
    result = first_failure(seeds, "objects", "default", "get-returns-model-value")
    # The same seed without the knobs pulls in one chunk: the bug hides.
    monkeypatch.setattr(faults, "buggify", lambda seed, profile: {})
    assert runner.run_seed(result.seed, "objects", "default").ok


def test_a_concurrency_group_admitting_one_call_too_many_is_caught_within_12_seeds(
        monkeypatch):
    import trio

    from tray.core.worker.actor_host import ActorHost

    original = ActorHost._run_concurrent
    widened: set = set()

    async def run(self, queue, spec):
        if id(self) not in widened:  # each named group takes one call more than its limit
            widened.add(id(self))
            self._groups = {name: trio.Semaphore(slots.value + 1)
                            for name, slots in self._groups.items()}
        return await original(self, queue, spec)

    monkeypatch.setattr(ActorHost, "_run_concurrent", run)
    result = first_failure(range(12), "paths", "none", "api-outcome-as-ray")
    assert "concurrency groups" in result.message


def test_a_duplicate_striking_after_its_node_restarted_names_the_new_node():
    # mixed chaos seed 272: a duplicate fault fired while machine n1 ran one
    # node and struck (its lag, then the reset) after that machine's node had
    # restarted; its record named the dead node, so the task re-run it caused
    # was not attributed to it (every-re-execution-has-a-fault-behind-it).
    result = runner.run_seed(272, "mixed", "chaos")
    assert result.ok, (result.invariant, result.message)


def test_a_method_options_num_returns_ignored_is_caught_within_4_seeds(monkeypatch):
    # An actor method's .options(num_returns=2) keeps the method's own
    # number of returns (one ref, not two).
    from tray.api.actor import ActorMethod

    original = ActorMethod.options

    def options(self, **given):
        given.pop("num_returns", None)
        return original(self, **given)

    monkeypatch.setattr(ActorMethod, "options", options)
    result = first_failure(range(4), "paths", "none", "api-outcome-as-ray")
    assert "num_returns=2" in result.message


def test_capture_child_tasks_ignored_is_caught_within_10_seeds(monkeypatch):
    # A child with no strategy of its own never joins its parent's group,
    # placement_group_capture_child_tasks=True notwithstanding.
    from tray.core.worker import task_submission

    monkeypatch.setattr(task_submission, "captured", lambda context, strategy: strategy)
    result = first_failure(range(10), "paths", "none", "api-outcome-as-ray")
    assert "placement_group_capture_child_tasks" in result.message


def test_runtime_context_naming_another_node_is_caught_within_3_seeds(monkeypatch):
    # get_runtime_context().get_node_id() names the last node of the
    # cluster, wherever the code runs (right on a one-node cluster only).
    from tray.api.runtime_context import RuntimeContext
    from tray.simtest import cluster

    monkeypatch.setattr(RuntimeContext, "get_node_id",
                        lambda self: cluster()._node_ids[-1])
    result = first_failure(range(3), "paths", "none", "api-outcome-as-ray")
    assert "get_runtime_context()" in result.message
