"""Regression tests for the bends found by bench/scale_curves.py (issue 14):
work that was linear in the size of a table for each event, O(n²) in all.

Speed is measured in the bench, never asserted here: each test checks the
structure that keeps an event's cost to what it concerns (an index that
matches the table it indexes, one wake-up instead of one per waiter, no
wake-up when there is nothing to do), and that the behaviour stayed."""

from __future__ import annotations

import trio
import trio.testing

import tray
from tray.core.config import Config
from tray.core.gcs.actor_manager import ActorManager
from tray.core.messages import ActorStatus
from tray.core.node.worker_pool import WorkerPool, WorkerState
from tray.core.task_status import TaskStatus
from tray.core.worker.task_events import TaskEventBuffer
from tray.simtest import cluster as current_cluster
from tray.util.scheduling_strategies import NodeAffinitySchedulingStrategy


@tray.remote(num_cpus=0)
class Counter:
    def __init__(self):
        self.count = 0

    def add(self):
        self.count += 1
        return self.count


def _actor_manager(cluster) -> ActorManager:
    return cluster.processes[cluster.gcs_address].component.actor_manager


def test_actor_indexes_follow_kills_restarts_and_deaths():
    # The GCS finds a dead worker's, a dead node's and a closed owner's
    # actors through indexes (ActorManager._by_worker/_by_node/_by_owner);
    # a scan of every actor made killing n actors O(n²). The indexes must
    # follow every change of state, or a death would miss its actor.
    tray.init(backend="sim", seed=3, num_nodes=2, num_cpus=2)
    try:
        cluster = current_cluster()
        actors = [Counter.remote() for _ in range(12)]
        restartable = Counter.options(max_restarts=1).remote()
        assert tray.get([a.add.remote() for a in actors + [restartable]]) == [1] * 13
        manager = _actor_manager(cluster)
        manager.validate_state()  # checks every index against the table
        alive = [a for a in manager.actors.values() if a.state == ActorStatus.ALIVE]
        assert len(alive) == 13
        assert sum(len(ids) for ids in manager._by_worker.values()) == 13
        assert sum(len(ids) for ids in manager._by_node.values()) == 13

        for actor in actors[:6]:  # one at a time, as the bench's 5,000
            tray.kill(actor)
        tray.kill(restartable, no_restart=False)  # a restart moves it to a new worker
        assert tray.get(restartable.add.remote()) == 1
        del actors[:6]
        cluster.advance(1.0)
        manager.validate_state()
        states = sorted(a.state for a in manager.actors.values())
        assert states.count(ActorStatus.DEAD) == 6 and states.count(ActorStatus.ALIVE) == 7
        assert sum(len(ids) for ids in manager._by_worker.values()) == 7
        # The handle's owner (the driver) still owns all 13, the dead included.
        assert len(manager._by_owner) == 1
        assert len(next(iter(manager._by_owner.values()))) == 13
        assert tray.get([a.add.remote() for a in actors]) == [2] * 6
    finally:
        tray.shutdown()


def test_many_actors_waiting_for_workers_wake_one_at_a_time(monkeypatch):
    # 40 actors on one node at once: each worker that registers wakes the
    # one waiting lease it fits, not every waiting lease (each woken one
    # rescanned the idle workers: O(waiters) per registration). The count
    # of wake-ups stays linear in the actors.
    wakes = []
    original = WorkerPool._wake

    def counting(self, waiter):
        wakes.append(len(self._waiters))
        original(self, waiter)

    monkeypatch.setattr(WorkerPool, "_wake", counting)
    tray.init(backend="sim", seed=5, num_nodes=1, num_cpus=2)
    try:
        actors = [Counter.remote() for _ in range(40)]
        assert tray.get([a.add.remote() for a in actors]) == [1] * 40
        assert 0 < len(wakes) <= 2 * 40, len(wakes)
        pool = current_cluster().processes["n0/raylet"].component.pool
        pool.validate_state()  # counters and the address index match the workers
        assert not pool._waiters
    finally:
        tray.shutdown()


def test_a_waiter_the_new_worker_does_not_fit_is_not_stranded():
    # At the worker cap, a lease for another runtime_env waits; when a
    # worker is given back, the first waiter it fits is woken, and the
    # others are woken in turn to make room (stop an unfit idle worker).
    tray.init(backend="sim", seed=1, num_nodes=1, num_cpus=4,
              config=Config(workers_per_node_max=2))
    try:
        @tray.remote
        def where(tag):
            import os
            return tag, os.environ.get("SCALE_BENDS_TAG", "")

        plain = [where.remote(i) for i in range(4)]
        tagged = [where.options(runtime_env={"env_vars": {"SCALE_BENDS_TAG": "x"}})
                  .remote(i) for i in range(4)]
        assert tray.get(plain, timeout=120) == [(i, "") for i in range(4)]
        assert tray.get(tagged, timeout=120) == [(i, "x") for i in range(4)]
    finally:
        tray.shutdown()


class _Endpoint:
    def __init__(self):
        self.sent = []

    async def notify(self, address, method, batch):
        self.sent.append((trio.current_time(), method, [e[0] for e in batch.events]))


class _Spec:
    def __init__(self, index):
        self.task_id = bytes([index]) * 16
        self.attempt = 0
        self.actor_id = None
        self.method = None
        self.name = f"task{index}"
        self.job_id = "01"
        self.parent_task_id = b"\0" * 16
        self.resources = {"CPU": 1.0}
        self.strategy = None
        self.caller = "driver"


def test_task_event_flusher_sleeps_while_the_buffer_is_empty(monkeypatch):
    # Every process woke each flush period with nothing to send (a third of
    # the samples with 1,000 idle simulated actors): the flusher now waits
    # for a first record, then one period, then sends the batch.
    sleeps = []
    real_sleep = trio.sleep

    async def counting_sleep(seconds):
        sleeps.append(seconds)
        await real_sleep(seconds)

    config = Config(task_events_flush_period_s=1.0)
    endpoint = _Endpoint()
    buffer = TaskEventBuffer(address="driver", node_id="n", worker_id="w", endpoint=endpoint,
                             gcs_address="gcs", config=config)

    async def main():
        monkeypatch.setattr(trio, "sleep", counting_sleep)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(buffer.run)
            await real_sleep(100.0)
            assert sleeps == [] and endpoint.sent == []  # idle: no wake-up at all
            buffer.task_state(_Spec(1), TaskStatus.PENDING_ARGS_AVAIL)
            buffer.task_state(_Spec(2), TaskStatus.PENDING_ARGS_AVAIL)
            await real_sleep(0.5)
            buffer.task_state(_Spec(3), TaskStatus.PENDING_ARGS_AVAIL)  # joins the same batch
            await real_sleep(10.0)
            assert sleeps == [1.0]
            assert [(t, ids) for t, _, ids in endpoint.sent] == \
                [(101.0, [(bytes([i]) * 16).hex() for i in (1, 2, 3)])]
            buffer.task_state(_Spec(4), TaskStatus.PENDING_ARGS_AVAIL)  # a new first record
            await real_sleep(10.0)
            assert len(sleeps) == 2 and len(endpoint.sent) == 2
            assert endpoint.sent[1][0] == 111.5  # one period after record 4 (t=110.5)
            nursery.cancel_scope.cancel()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


def test_a_flush_sends_its_records_in_bounded_messages_and_leaves_later_ones(monkeypatch):
    # One batch of a second's records held a driver's loop ~4 ms (the tail
    # of task latency): a flush sends at most FLUSH_BATCH_MAX per message,
    # oldest first, and what is buffered while it sends waits for the next.
    from tray.core.worker import task_events

    monkeypatch.setattr(task_events, "FLUSH_BATCH_MAX", 64)
    endpoint = _Endpoint()
    buffer = TaskEventBuffer(address="driver", node_id="n", worker_id="w", endpoint=endpoint,
                             gcs_address="gcs", config=Config())
    sending = endpoint.notify

    async def notify(address, method, batch):  # (a send that does not yield)
        await sending(address, method, batch)
        if len(endpoint.sent) == 1:
            buffer.task_state(_Spec(250), TaskStatus.PENDING_ARGS_AVAIL)  # arrives mid-flush

    endpoint.notify = notify
    seen_between: set = set()  # how many batches had gone when another task ran

    async def other_task():
        while len(endpoint.sent) < 4:
            seen_between.add(len(endpoint.sent))
            await trio.sleep(0)

    async def main():
        for index in range(200):
            buffer.task_state(_Spec(index), TaskStatus.PENDING_ARGS_AVAIL)
        buffer._has_events = trio.Event()  # (as the flusher's loop does before a flush)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(other_task)
            await trio.sleep(0)
            await buffer.flush()
        sent = [ids for _, _, ids in endpoint.sent]
        assert [len(ids) for ids in sent] == [64, 64, 64, 8]
        assert seen_between & {1, 2, 3}  # the loop was free between the batches
        assert sum(sent, []) == [(bytes([i]) * 16).hex() for i in range(200)]
        # The late record waits, and the flusher is told the buffer is not empty.
        assert list(buffer._events) == [(bytes([250]) * 16, 0)] and buffer._has_events.is_set()
        await buffer.flush()
        assert endpoint.sent[-1][2] == [(bytes([250]) * 16).hex()] and not buffer._events

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


def test_node_addresses_are_indexed_and_a_restarted_node_replaces_its_predecessor():
    # The GCS's node table answers "is this address a node's?" (for each
    # closed connection) and "who was at this address before?" (for each
    # join) from an index, not a scan of every node.
    tray.init(backend="sim", seed=2, num_nodes=3, num_cpus=1)
    try:
        cluster = current_cluster()
        table = cluster.processes[cluster.gcs_address].component.node_table
        assert set(table.addresses()) == {f"n{i}/raylet" for i in range(3)}
        first = {node_id for node_id, node in table.nodes.items() if node.address == "n1/raylet"}
        cluster.kill_node(next(iter(first)), restart_after_s=0.5)
        cluster.advance(5.0)
        table = cluster.processes[cluster.gcs_address].component.node_table
        table.validate_state()  # every node indexed under its address
        at_n1 = {node_id: node.alive for node_id, node in table.nodes.items()
                 if node.address == "n1/raylet"}
        assert len(at_n1) == 2 and sum(at_n1.values()) == 1, at_n1
        assert not any(at_n1[node_id] for node_id in first)  # the predecessor is dead
        assert set(table.addresses()) == {f"n{i}/raylet" for i in range(3)}
        assert tray.get(_one.remote()) == 1
    finally:
        tray.shutdown()


@tray.remote
def _one():
    return 1


def test_a_node_forgets_its_oldest_dead_workers(monkeypatch):
    # Actors that come and go left one row per dead worker for good; a node
    # keeps the last DEAD_WORKERS_KEPT (the state API shows why they died).
    from tray.core.node import worker_pool

    monkeypatch.setattr(worker_pool, "DEAD_WORKERS_KEPT", 5)
    tray.init(backend="sim", seed=4, num_nodes=1, num_cpus=2)
    try:
        for _ in range(3):
            actors = [Counter.remote() for _ in range(4)]
            assert tray.get([a.add.remote() for a in actors]) == [1] * 4
            for actor in actors:
                tray.kill(actor)
            current_cluster().advance(1.0)
        pool = current_cluster().processes["n0/raylet"].component.pool
        pool.validate_state()
        dead = [w for w in pool.workers.values() if w.state == WorkerState.DEAD]
        assert len(dead) == 5, len(dead)
        assert pool.started >= 12  # twelve actors, each a worker of its own
        assert tray.get(Counter.remote().add.remote()) == 1
    finally:
        tray.shutdown()


def test_a_live_small_object_leaves_four_objects_for_the_collector(one_node):
    # Every full collection of CPython's cyclic GC walks every tracked
    # object, so the cost of a put grew with the refs the driver held (the
    # "live objects" curve of bench/README.md: 11 -> 32 us per put from 1k
    # to 100k). A live put left 8 tracked objects, four of them empty lists
    # (the entry's locations and contained refs, the value's buffers and
    # contained refs); those are now the shared, untracked ().
    import gc

    assert tray.get(tray.put(b"warm")) == b"warm"
    gc.collect()
    before = len(gc.get_objects())
    refs = [tray.put(b"x" * 100) for _ in range(1000)]
    assert tray.get(refs) == [b"x" * 100] * 1000  # (every put registered)
    gc.collect()
    per_ref = (len(gc.get_objects()) - before) / len(refs)
    # The ref, its id, the owner's entry and the inline value.
    assert per_ref < 4.5, per_ref


@tray.remote
def _after(gate) -> int:
    return 1


@tray.remote
def _gate() -> int:
    import time

    time.sleep(5.0)  # long enough to be seen pending on a loaded machine
    return 0


def test_a_pending_task_leaves_no_empty_list_for_the_collector(one_node):
    # A pending task's objects are walked by every full collection while it
    # waits: 100k tasks submitted at once paid ~45% of their submission in
    # the collector (CPU per task 97 -> 172 us from 10k to 100k, 84 with the
    # collector off). Its arguments, return ids and held refs were lists,
    # three of the ten tracked objects a task left; they are tuples now, and
    # a task with no ref argument leaves none tracked.
    import gc

    from tray.core.context import get_worker

    gate = _gate.remote()
    refs = [_after.remote(gate) for _ in range(3)]  # pending until the gate is done
    plain = [_gate.remote() for _ in range(3)]  # pending while they sleep
    # Through the driver's loop, after the submissions queued before it.
    assert tray.wait(refs + plain, num_returns=6, timeout=0) == ([], refs + plain)
    manager = get_worker().task_manager
    waiting = [manager.tasks[ref.object_id().task_id()] for ref in refs + plain
               if ref.object_id().task_id() in manager.tasks]
    assert len(waiting) == 6, "tasks finished before they were looked at"
    gc.collect()  # (tuples of untracked items are untracked by a collection)
    for task in waiting:
        assert type(task.spec.args) is tuple and type(task.spec.return_ids) is tuple
        assert type(task.arg_refs) is tuple
        assert not gc.is_tracked(task.spec.return_ids)
        if not task.spec.args:
            assert not gc.is_tracked(task.spec.args) and not gc.is_tracked(task.arg_refs)
    assert tray.get(refs + plain) == [1, 1, 1, 0, 0, 0]


@tray.remote(max_retries=-1)
def _stored(i: int) -> bytes:
    return bytes([i]) * 200_000  # above inline_object_max_bytes: kept in a node's store


def test_a_dead_nodes_copies_are_found_through_an_index_by_node():
    # An owner forgets a dead node's copies through an index by node
    # (ReferenceCounter._on_node); a scan of every ref held made each node
    # death cost every live object. The index must follow every change of
    # an entry's locations, or a death would leave a copy behind.
    from tray.core.context import get_worker

    tray.init(backend="sim", seed=5, num_nodes=3, num_cpus=2)
    try:
        sim = current_cluster()
        _head, victim, other = sim.node_ids()

        def on(node_id):
            return NodeAffinitySchedulingStrategy(node_id, soft=True)
        lost = [_stored.options(scheduling_strategy=on(victim)).remote(i) for i in range(3)]
        kept = [_stored.options(scheduling_strategy=on(other)).remote(i) for i in range(3, 5)]
        tray.wait(lost + kept, num_returns=5, fetch_local=False)
        references = get_worker().references
        references.validate_state()  # checks the index against every entry's locations
        assert references._on_node[victim] == {ref.object_id() for ref in lost}
        assert references._on_node[other] == {ref.object_id() for ref in kept}

        sim.kill_node(victim)
        sim.advance(60.0)  # the GCS declares it dead; the owner forgets its copies
        assert victim not in references._on_node
        assert all(not references.refs[ref.object_id()].locations for ref in lost)
        assert references._on_node[other] == {ref.object_id() for ref in kept}
        references.validate_state()
        # Lineage re-creates the lost ones elsewhere, and the index follows.
        assert tray.get(lost + kept) == [bytes([i]) * 200_000 for i in range(5)]
        references.validate_state()
        assert victim not in references._on_node
    finally:
        tray.shutdown()


def test_the_simulator_collects_young_generations_often_and_the_heap_seldom(monkeypatch):
    # The simulator runs the cyclic GC itself, at deterministic ticks. Every
    # one of those was a full collection, whose cost follows the heap: a run
    # holding 1M pending tasks paid it every period (1,390 against ~650 us
    # of CPU per task at 100k). Now most are young ones (gen 1), and every
    # FULL_GC_EVERY-th is full, at ticks the seed alone decides.
    import gc

    import tray.backends.sim.engine as sim_engine

    # (Often enough that 400 tasks see several periods: since a get of many
    # refs takes no task per ref, they take ~1,500 ticks, not 2,000+.)
    monkeypatch.setattr(sim_engine, "GC_EVERY_TICKS", 250)
    monkeypatch.setattr(sim_engine, "FULL_GC_EVERY", 4)

    @tray.remote
    def square(x):
        return x * x

    def run() -> tuple[list, str]:
        collections: list = []

        def seen(phase, info):
            if phase == "start" and tray.is_initialized():
                collections.append(info["generation"])
        gc.callbacks.append(seen)
        try:
            tray.init(backend="sim", seed=7, num_cpus=2)
            start = len(collections)  # (init's own full collection apart)
            assert tray.get([square.remote(i) for i in range(400)]) == \
                [i * i for i in range(400)]
            digest = tray.simtest.trace_digest()
            tray.shutdown()
        finally:
            gc.callbacks.remove(seen)
        return collections[start:], digest

    first, second = run(), run()
    generations, _ = first
    assert generations.count(2) >= 1 and generations.count(1) >= 3 * generations.count(2), \
        generations
    assert first == second  # the same collections at the same ticks: the same trace


@tray.remote(num_cpus=1)
def _sleeping(seconds: float) -> int:
    import time

    time.sleep(seconds)
    return 1


@tray.remote(num_cpus=0)
class _Submitter:
    def submit(self, n: int) -> list:
        return [_sleeping.remote(1000.0) for _ in range(n)]


def test_a_workers_and_an_owners_leases_are_found_through_indexes():
    # A node finds the lease of a worker that died or blocked, and the
    # leases of an owner that went away, through indexes
    # (WorkerInfo.lease_id, LeaseManager._leases_by_owner). Each was a scan of
    # every lease on the node: killing n actors on one node cost O(n²).
    # The indexes must follow every grant and release, or a death would
    # leave a lease (and its resources) behind.
    tray.init(backend="sim", seed=4, num_cpus=2)
    try:
        sim = current_cluster()
        leases = sim.processes["n0/raylet"].component.leases
        actors = [Counter.remote() for _ in range(12)]
        assert tray.get([actor.add.remote() for actor in actors]) == [1] * 12
        submitter = _Submitter.remote()
        running = tray.get(submitter.submit.remote(2))  # owned by the submitter
        sim.advance(1.0)
        leases.validate_state()  # checks both indexes against every lease
        task_leases = [lease for lease in leases.leases.values() if lease.for_actor is None]
        assert len(task_leases) == 2, leases.leases
        owner = task_leases[0].owner
        assert {lease.owner for lease in task_leases} == {owner}
        assert leases._leases_by_owner[owner] == {lease.lease_id for lease in task_leases}
        for lease in leases.leases.values():
            assert leases._lease_of_worker(lease.worker_id) is lease

        for actor in actors[:6]:
            tray.kill(actor)
        sim.advance(5.0)
        leases.validate_state()
        assert sum(lease.for_actor is not None for lease in leases.leases.values()) == 7

        # The owner's death ends its task leases, found through the index.
        tray.kill(submitter)
        sim.advance(5.0)
        leases.validate_state()
        assert owner not in leases._leases_by_owner
        assert not [lease for lease in leases.leases.values() if lease.for_actor is None]
        assert leases.available["CPU"] == 2.0
        assert tray.get([actor.add.remote() for actor in actors[6:]]) == [2] * 6
        del running
    finally:
        tray.shutdown()
