"""Serve and Data under simtest: the workloads' models catch bugs planted in
the libraries (by monkeypatching, never by editing them), on the right
invariant within a stated number of seeds; and the issue-41 bugs those
workloads reach (a Data pool as large as the cluster then ``take()``
hung; a sort with a list of directions sorted every key one way; Serve
sent every request of a sequential caller to one replica) stay fixed."""

from __future__ import annotations

import pytest
from planting import first_failure  # (tests/ is on sys.path)

import tray

# How many seeds each planted bug may take (the first that catches it, from
# the sweep that found it, plus a margin).
SEEDS = {"union": 5, "zip": 3, "sort": 10, "retry": 10,
         "healthy": 4, "impatient": 3, "count": 3, "spread": 4, "ongoing": 3,
         "proxy-dead": 2, "proxy-nodes": 4, "proxy-restart": 2, "proxy-stop": 1,
         "sick": 3, "reattach": 3, "flaky": 10, "max": 8}


# ====================================================== issue 41 regressions


@pytest.fixture
def two_cpus():
    tray.init(backend="sim", num_nodes=1, num_cpus=2, seed=0)
    yield
    tray.shutdown()


class _Double:
    def __call__(self, batch):
        return {"id": batch["id"] * 2}


def test_a_pool_as_large_as_the_cluster_then_take_finishes(two_cpus):
    # Before: the limit's slice task waited for a CPU the pool never freed
    # (take/show hung), and then any pool as large as the cluster was
    # refused at once; now the read runs on the pool's actors, the slice
    # needs no CPU and a finished pool frees its actors.
    import tray.data as td

    def ds():
        return td.range(100, override_num_blocks=4).map_batches(_Double, concurrency=2)

    assert ds().take(5) == [{"id": 2 * i} for i in range(5)]
    assert ds().count() == 100
    assert sum(len(b["id"]) for b in ds().iter_batches(batch_size=7)) == 100
    # A task map after the pool runs once the pool is done with its input.
    assert ds().map(lambda r: {"id": r["id"] + 1}).take(3) == [{"id": 1}, {"id": 3}, {"id": 5}]


def test_sort_takes_one_direction_per_key(two_cpus):
    import tray.data as td

    rows = [{"g": (i * 7) % 3, "k": (i * 5) % 11, "i": i} for i in range(30)]
    got = td.from_items(rows, override_num_blocks=4).sort(
        ["g", "k"], descending=[False, True]).take_all()
    expected = sorted(rows, key=lambda r: (r["g"], -r["k"]))
    assert [(r["g"], r["k"]) for r in got] == [(r["g"], r["k"]) for r in expected]
    got = td.from_items(rows, override_num_blocks=3).sort(
        ["g", "k"], descending=[True, False]).take_all()
    assert [(r["g"], r["k"]) for r in got] == \
        [(r["g"], r["k"]) for r in sorted(rows, key=lambda r: (-r["g"], r["k"]))]
    with pytest.raises(ValueError, match="one per key"):
        td.from_items(rows).sort(["g", "k"], descending=[True])


# ================================================================ Data, planted


def test_a_union_that_reorders_its_inputs_is_caught(monkeypatch):
    from tray.data._operators import UnionOperator

    def later_first(self):  # every input's bundles as they come, the last input first
        for index in reversed(range(len(self.queues))):
            while self.queues[index]:
                self.emit(self.queues[index].popleft())

    monkeypatch.setattr(UnionOperator, "pump", later_first)
    first_failure(range(SEEDS["union"]), "data", "none", "get-returns-model-value")


def test_a_zip_that_misaligns_its_rows_is_caught(monkeypatch):
    from tray.data import _shuffle

    original = _shuffle.zip_plan

    def misaligned(left, right):  # the right dataset's blocks in reverse order
        return (yield from original(left, list(reversed(right))))

    monkeypatch.setattr(_shuffle, "zip_plan", misaligned)
    first_failure(range(SEEDS["zip"]), "data", "none", "get-returns-model-value")


def test_a_sort_that_ignores_a_direction_is_caught(monkeypatch):
    from tray.data import _shuffle

    def first_only(keys, descending):  # the first key's direction for every key
        first = descending[0] if isinstance(descending, (list, tuple)) else descending
        return [bool(first)] * len(keys)

    monkeypatch.setattr(_shuffle, "_directions", first_only)
    first_failure(range(SEEDS["sort"]), "data", "none", "get-returns-model-value")


def test_a_block_dropped_when_its_task_was_retried_is_caught(monkeypatch):
    from tray.core.ids import TaskID
    from tray.core.worker.task_manager import TaskManager
    from tray.data._operators import MapOperator

    retried: set = set()
    complete, on_ready = TaskManager.complete, MapOperator.on_ready

    def noting(self, task, results):
        if task.spec.attempt > 0:
            retried.add(TaskID(task.spec.task_id))
        complete(self, task, results)

    def dropping(self, ref, executor):
        task = self._tasks.get(ref)
        on_ready(self, ref, executor)
        if task is not None and ref.task_id() in retried:
            for bundle in [*self._finished.values(), *self.outputs]:
                if task.block_ref in bundle.refs:
                    bundle.refs.clear()
                    bundle.metas.clear()

    monkeypatch.setattr(TaskManager, "complete", noting)
    monkeypatch.setattr(MapOperator, "on_ready", dropping)
    first_failure(range(SEEDS["retry"]), "data", "crash", "get-returns-model-value")


# =============================================================== Serve, planted


def test_a_status_healthy_too_early_is_caught(monkeypatch):
    # HEALTHY as soon as one replica of the new version runs, old ones or not.
    from tray.serve._deployment_state import DeploymentStateManager
    from tray.serve._status import DeploymentStatus, ReplicaState

    original = DeploymentStateManager.update_status

    def early(self, dep):
        original(self, dep)
        if dep.status == DeploymentStatus.UPDATING and any(
                r.version == dep.spec.version and r.state == ReplicaState.RUNNING
                for r in dep.replicas):
            dep.status = DeploymentStatus.HEALTHY

    monkeypatch.setattr(DeploymentStateManager, "update_status", early)
    first_failure(range(SEEDS["healthy"]), "serve", "none", "serve-status-follows-the-rollout")


def test_old_replicas_stopped_before_new_ones_serve_are_caught(monkeypatch):
    from tray.serve._deployment_state import DeploymentStateManager

    original = DeploymentStateManager.reconcile

    def impatient(self, dep, now):
        original(self, dep, now)
        for replica in list(dep.replicas):  # every old replica goes at once
            if replica.version != dep.spec.version and replica.serving():
                self._stop_replica(dep, replica, graceful=True)

    monkeypatch.setattr(DeploymentStateManager, "reconcile", impatient)
    first_failure(range(SEEDS["impatient"]), "serve", "none",
                   "serve-replica-count-follows-the-target")


def test_a_replica_count_off_by_one_is_caught(monkeypatch):
    from tray.serve._deployment_state import DeploymentStateManager

    original = DeploymentStateManager.reconcile

    def one_more(self, dep, now):
        dep.target_num += 1
        try:
            original(self, dep, now)
        finally:
            dep.target_num -= 1

    monkeypatch.setattr(DeploymentStateManager, "reconcile", one_more)
    first_failure(range(SEEDS["count"]), "serve", "none",
                   "serve-replica-count-follows-the-target")


def test_an_autoscaler_past_max_replicas_is_caught(monkeypatch):
    # A fresh red team's bug: the load's replica count, unbounded above.
    import math

    from tray.serve import _autoscaling

    original = _autoscaling.desired_replicas

    def unbounded(config, current, total_load):
        if current == 0:
            return original(config, current, total_load)
        return max(config.min_replicas, math.ceil(total_load / config.target_ongoing_requests))

    monkeypatch.setattr(_autoscaling, "desired_replicas", unbounded)
    first_failure(range(SEEDS["max"]), "serve", "none", "serve-replicas-converge-to-the-target")


def test_a_router_that_always_picks_the_first_replica_is_caught(monkeypatch):
    # tray before issue 41's fix: ties went to the first replica of the list.
    from tray.serve._handle import Router

    monkeypatch.setattr(Router, "_candidates", lambda self: list(self.replicas[:2]))
    first_failure(range(SEEDS["spread"]), "serve", "none", "serve-requests-spread-over-replicas")


def test_a_replica_past_max_ongoing_requests_is_caught(monkeypatch):
    from tray.serve._replica import _Limiter

    original = _Limiter.__init__

    def one_more(self, limit):
        original(self, limit + 1)

    monkeypatch.setattr(_Limiter, "__init__", one_more)
    monkeypatch.setattr(_Limiter, "set_limit", lambda self, limit: None)
    first_failure(range(SEEDS["ongoing"]), "serve", "none",
                   "serve-replica-runs-at-most-max_ongoing_requests")


# ======================================================= Serve's HTTP proxies, planted


def test_a_proxy_not_replaced_after_its_actor_died_is_caught(monkeypatch):
    # A failed health check marks the proxy UNHEALTHY but keeps its dead
    # actor (and checks it again for ever): no new proxy starts.
    from tray.serve import _proxy_state
    from tray.serve._status import ProxyStatus

    async def keeps(self, proxy):
        try:
            await _proxy_state.await_ref(proxy.handle.check_health.remote())
        except Exception as error:  # noqa: BLE001
            proxy.status = ProxyStatus.UNHEALTHY
            proxy.message = str(error)

    monkeypatch.setattr(_proxy_state.ProxyStateManager, "_check", keeps)
    first_failure(range(SEEDS["proxy-dead"]), "serve", "none", "serve-proxies-follow-the-nodes")


def test_nodes_read_once_are_caught(monkeypatch):
    # The alive nodes are asked once: a node that joins later gets no proxy.
    from tray.serve import _proxy_state

    monkeypatch.setattr(_proxy_state, "NODES_REFRESH_PERIOD_S", 1e9)
    first_failure(range(SEEDS["proxy-nodes"]), "serve", "none", "serve-proxies-follow-the-nodes")


def test_a_restarted_controller_replacing_its_proxies_is_caught(monkeypatch):
    # A restarted controller does not take its proxies back: it replaces them.
    from tray.serve import _proxy_state
    from tray.serve._status import ProxyStatus

    async def replaces(self, proxy):
        handle = await _proxy_state._common.lookup_actor.remote(
            _proxy_state.PROXY_NAME_PREFIX + proxy.node_id, _proxy_state.SERVE_NAMESPACE)
        await _proxy_state._kill_quietly(handle)
        proxy.handle = None
        proxy.status = ProxyStatus.UNHEALTHY
        proxy.retry_at_s = _proxy_state.loop_time()

    monkeypatch.setattr(_proxy_state.ProxyStateManager, "reattach", replaces)
    first_failure(range(SEEDS["proxy-restart"]), "serve", "none",
                  "serve-proxies-follow-the-nodes")


def test_a_stopped_proxy_left_in_the_table_is_caught(monkeypatch):
    # A proxy stopped (its node left) stays in the controller's table.
    from tray.serve import _proxy_state

    async def kept(self, proxy):
        if proxy.handle is not None:
            await _proxy_state._kill_quietly(proxy.handle)

    monkeypatch.setattr(_proxy_state.ProxyStateManager, "_stop", kept)
    # (From seed 3, the first of serve none's with a proxy on every node, so
    # that a node leaves: before it, the proxies are on the head only, and
    # serve.shutdown waits for their stops to time out.)
    first_failure(range(3, 3 + SEEDS["proxy-stop"]), "serve", "none", "serve-proxies-follow-the-nodes")


# ================================ Serve's health checks and restarts, planted


def test_a_replica_failing_its_health_checks_kept_is_caught(monkeypatch):
    # Failed health checks are counted, and never act.
    from tray.serve import _deployment_state

    monkeypatch.setattr(_deployment_state, "REPLICA_HEALTH_CHECK_UNHEALTHY_THRESHOLD", 10**9)
    first_failure(range(SEEDS["sick"]), "serve", "none", "serve-replicas-recover")


def test_a_replica_stopped_on_one_failed_check_is_caught(monkeypatch):
    # A single failed check stops the replica (no run of failures needed):
    # a replica failing every other check is replaced.
    from tray.serve import _deployment_state

    monkeypatch.setattr(_deployment_state, "REPLICA_HEALTH_CHECK_UNHEALTHY_THRESHOLD", 1)
    result = first_failure(range(SEEDS["flaky"]), "serve", "none", "serve-replicas-recover")
    assert "never two in a row" in result.message


def test_a_restarted_controller_replacing_its_replicas_is_caught(monkeypatch):
    # A restarted controller stops the replicas it finds (others start).
    from tray.serve import _common
    from tray.serve._deployment_state import DeploymentStateManager
    from tray.serve._status import ReplicaState

    async def replaces(self, dep, replica, stopping):
        replica.handle = await _common.lookup_actor.remote(replica.actor_name,
                                                           _common.SERVE_NAMESPACE)
        replica.created.set()
        replica.state = ReplicaState.RUNNING
        self._stop_replica(dep, replica, graceful=False)

    monkeypatch.setattr(DeploymentStateManager, "reattach", replaces)
    first_failure(range(SEEDS["reattach"]), "serve", "none", "serve-replicas-recover")


# ============================================ Serve's back-pressure, planted

# Seeds 0-1 draw no back-pressure phase; seed 2 runs it (1 replica,
# max_ongoing_requests=1, max_queued_requests=3, a burst of 5).
BACKPRESSURE_SEEDS = range(0, 3)


def test_a_queue_limit_one_request_late_is_caught(monkeypatch):
    # A fresh red team's miss: the router counts one queued request too few,
    # so one request past max_queued_requests waits instead of failing.
    from tray.serve._handle import Router

    original = Router._queued
    monkeypatch.setattr(Router, "_queued", lambda self: max(0, original(self) - 1))
    result = first_failure(BACKPRESSURE_SEEDS, "serve", "none", "serve-backpressure-as-limited")
    assert "the model refuses it" in result.message


def test_a_queue_limit_one_request_early_is_caught(monkeypatch):
    # The other way: the router counts a request that is about to queue
    # before it queues, and refuses one that max_queued_requests admits.
    from tray.serve._handle import Router

    original = Router._queued

    def one_more(self):
        queued = original(self)
        full = all(self._load(r) >= r.max_ongoing_requests for r in self.replicas)
        return queued + 1 if full else queued

    monkeypatch.setattr(Router, "_queued", one_more)
    result = first_failure(BACKPRESSURE_SEEDS, "serve", "none", "serve-backpressure-as-limited")
    assert "the model serves it" in result.message


# serve-batches-as-configured (tray/simtest/serve_requests.py): seeds 1 and 3
# run the batching phase.


def test_batches_one_past_max_batch_size_are_caught_within_2_seeds(monkeypatch):
    from tray.serve._batching import _BatchQueue

    monkeypatch.setattr(_BatchQueue, "max_batch_size",
                        property(lambda self: self.settings["max_batch_size"] + 1))
    first_failure([1, 3], "serve", "none", "serve-batches-as-configured")


def test_a_method_name_option_lost_is_caught_within_2_seeds(monkeypatch):
    from tray.serve._handle import DeploymentHandle

    original = DeploymentHandle.options

    def loses_the_method(self, **options):
        options.pop("method_name", None)
        return original(self, **options)

    monkeypatch.setattr(DeploymentHandle, "options", loses_the_method)
    first_failure([1, 3], "serve", "none", "serve-batches-as-configured")


# ========================================= the rest of tray.data's API, planted

# The data workload's column steps and extra consumers (tray/simtest/data_ops.py,
# an RNG of their own): under faults "none", seed 7 splits at indices, seed 10
# renames a column then splits, seed 12 renames and takes a std with Ray's
# default ddof. Seven seeds each.
DATA_OPS_SEEDS = range(6, 13)


def test_split_at_indices_one_row_late_is_caught(monkeypatch):
    from tray.data._dataset import Dataset

    original = Dataset.split_at_indices
    monkeypatch.setattr(Dataset, "split_at_indices",
                        lambda self, indices: original(self, [i + 1 for i in indices]))
    first_failure(DATA_OPS_SEEDS, "data", "none", "get-returns-model-value")


def test_a_std_with_ddof_0_by_default_is_caught(monkeypatch):
    from tray.data._dataset import Dataset
    from tray.data._grouped_data import GroupedData

    std, grouped_std = Dataset.std, GroupedData.std
    monkeypatch.setattr(Dataset, "std", lambda self, on, ddof=0: std(self, on, ddof))
    monkeypatch.setattr(GroupedData, "std",
                        lambda self, on=None, ddof=0: grouped_std(self, on, ddof))
    first_failure(DATA_OPS_SEEDS, "data", "none", "get-returns-model-value")


def test_rename_columns_dropping_a_column_is_caught(monkeypatch):
    from tray.data._dataset import Dataset

    original = Dataset.rename_columns

    def drops_one(self, names):  # the first renamed column is lost
        renamed = original(self, names)
        return renamed.drop_columns(
            [next(iter(names.values())) if isinstance(names, dict) else names[0]])

    monkeypatch.setattr(Dataset, "rename_columns", drops_one)
    first_failure(DATA_OPS_SEEDS, "data", "none", "get-returns-model-value")
