"""Physical operators, and the bundles of blocks that flow between them.

A dataset's plan compiles (``_plan``) into a tree of these: an input of
bundles that exist already, maps (as tasks or on an actor pool, fused by
the compiler where they can share a task), all-to-all operators (sort,
shuffle, groupby, repartition, zip: they see every input before they
emit), a limit and a union. Each takes bundles into its input queues,
launches tasks when the executor lets it, and emits bundles in its inputs'
order; the ``StreamingExecutor`` (``_executor``) moves bundles between
them, keeps the memory budget, and waits on what they have in flight. It
reaches them only through this interface, and they reach it only through
``Executor`` below.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, field
from typing import Protocol

import tray

from . import _transforms as T
from ._block import BlockMetadata
from ._context import DataContext

# ============================================================ bundles


@dataclass
class Bundle:
    """Blocks moving between operators together: refs and their metadata.
    ``items`` instead holds read tasks (values) for a read operator."""
    refs: list
    metas: list
    pins: list = field(default_factory=list)  # lineage kept alive with the blocks
    items: list = field(default_factory=list)
    pinned_bytes: int = 0

    @property
    def num_rows(self) -> int:
        return sum(meta.num_rows for meta in self.metas)

    @property
    def size_bytes(self) -> int:
        return sum(meta.size_bytes for meta in self.metas) + self.pinned_bytes


@dataclass
class OperatorStats:
    name: str
    tasks: int = 0
    blocks_out: int = 0
    rows_out: int = 0
    bytes_out: int = 0
    task_s: float = 0.0  # time tasks spent in their transforms, summed


# ============================================================ the executor, as operators see it


class Executor(Protocol):
    """What an operator uses of the ``StreamingExecutor`` running it."""

    context: DataContext
    total_cpus: float
    operators: list  # topological: inputs first

    def fetch_metadata(self, ref, op: Operator):
        """The small value of a finished task, or its error, named after ``op``."""

    def stop_upstream(self, op: Operator) -> None:
        """Stop every operator above ``op`` (a limit was reached)."""


# ============================================================ operators


class Operator:
    """A physical operator: inputs come in, tasks run, outputs go out."""

    def __init__(self, name: str, inputs: list) -> None:
        self.name = name
        self.inputs = inputs
        self.queues = [collections.deque() for _ in inputs]
        self.inputs_done = [False] * len(inputs)
        self.outputs: collections.deque = collections.deque()
        self.stats = OperatorStats(name)
        self.stopped = False
        self.schema = None
        self.bar = None

    # -- wiring
    def add_input(self, bundle: Bundle, index: int) -> None:
        self.queues[index].append(bundle)

    def input_done(self, index: int) -> None:
        self.inputs_done[index] = True

    def all_inputs_done(self) -> bool:
        return all(self.inputs_done)

    # -- running
    def can_launch(self) -> bool:
        return False

    def estimate_bytes(self) -> int:
        return 0

    def launch(self, executor: Executor) -> None:
        raise NotImplementedError

    def in_flight(self) -> list:
        return []

    def on_ready(self, ref, executor: Executor) -> None:
        raise NotImplementedError

    def completed(self) -> bool:
        """No output will come any more (the outputs queue may still hold some)."""
        return self.stopped or (self.all_inputs_done() and not any(self.queues)
                                and not self.in_flight())

    def held_bytes(self) -> int:
        """Bytes of blocks this operator holds refs to, counted in the budget."""
        queued = sum(b.size_bytes for q in self.queues for b in q)
        return queued + sum(b.size_bytes for b in self.outputs)

    def emit(self, bundle: Bundle) -> None:
        for meta in bundle.metas:
            if self.schema is None and meta.schema is not None and meta.num_rows:
                self.schema = meta.schema
        self.stats.blocks_out += len(bundle.refs)
        self.stats.rows_out += bundle.num_rows
        self.stats.bytes_out += sum(meta.size_bytes for meta in bundle.metas)
        if self.bar is not None:
            self.bar.update(len(bundle.refs))
            self.bar.set_postfix_str(f"{self.stats.rows_out} rows", refresh=False)
        if all(meta.num_rows == 0 for meta in bundle.metas) and bundle.refs:
            return  # an empty block carries nothing further
        self.outputs.append(bundle)

    def stop(self) -> None:
        """Stop early (a limit downstream was reached): drop everything."""
        self.stopped = True
        for queue in self.queues:
            queue.clear()
        self.outputs.clear()
        self.shutdown()

    def shutdown(self) -> None:
        pass


class InputOperator(Operator):
    """Bundles that exist already (a materialized dataset, read tasks)."""

    def __init__(self, name: str, bundles: list) -> None:
        super().__init__(name, [])
        self._pending = collections.deque(bundles)

    def completed(self) -> bool:
        return self.stopped or not self._pending

    def release(self) -> None:
        while self._pending:
            self.outputs.append(self._pending.popleft())

    def held_bytes(self) -> int:
        return 0  # they live as long as the dataset that holds them


@dataclass
class _InFlight:
    seq: int
    block_ref: object
    inputs: Bundle
    estimate_bytes: int
    worker: int = -1


class MapOperator(Operator):
    """Runs a transform chain on each input bundle, as tasks or on a pool of
    actors; outputs come out in input order."""

    def __init__(self, name: str, input_op: Operator, chain: list, *, remote_args: dict,
                 pool_size: int | None = None, concurrency: int | None = None,
                 min_rows_per_bundle: int | None = None, is_read: bool = False) -> None:
        super().__init__(name, [input_op])
        self.chain = chain
        self.remote_args = dict(remote_args)
        self.pool_size = pool_size
        self.concurrency = concurrency
        self.min_rows_per_bundle = min_rows_per_bundle
        self.is_read = is_read
        self._tasks: dict = {}  # metadata ref -> _InFlight
        self._next_seq = 0
        self._next_out = 0
        self._finished: dict = {}  # seq -> Bundle, waiting for its turn
        self._out_bytes_seen = 0
        self._in_bytes_seen = 0
        self._chain_ref = None
        self._actors: list = []
        self._ready_refs: dict = {}  # actor ready ref -> index
        self._ready: list = []  # indexes of actors ready for calls
        self._calls: list = []  # calls in flight per actor
        self._cap = 1

    # -- setup
    def start(self, executor: Executor) -> None:
        self._chain_ref = tray.put(self.chain)
        if self.pool_size is not None:
            options = {"num_cpus": 1.0, "max_restarts": -1, "max_task_retries": -1}
            options.update({k: v for k, v in self.remote_args.items()
                            if k in ("num_cpus", "num_gpus", "resources", "memory",
                                     "scheduling_strategy", "max_restarts")})
            pool_cpus = self.pool_size * float(options.get("num_cpus") or 0)
            # Tasks after the pool wait for it to finish, which frees its
            # actors (release_when_done); tasks before it would never run.
            if pool_cpus >= executor.total_cpus and any(
                    isinstance(op, (MapOperator, AllToAllOperator)) and op.pool_size is None
                    for op in _upstream_of(self)):
                raise ValueError(
                    f"tray.data: the actor pool of {self.name} would take {pool_cpus:g} CPUs of "
                    f"the cluster's {executor.total_cpus:g}, leaving none for the tasks that "
                    "feed it, so the pipeline could never finish; give each actor fewer CPUs "
                    "(num_cpus=0.5) or lower concurrency")
            worker_class = T.MapWorker.options(**options)
            for index in range(self.pool_size):
                actor = worker_class.remote(self._chain_ref)
                self._actors.append(actor)
                self._calls.append(0)
                self._ready_refs[actor.ready.remote()] = index
            self._cap = self.pool_size * executor.context.max_tasks_in_flight_per_actor

        elif self.concurrency is not None:
            self._cap = self.concurrency
        else:
            self._cap = max(1, int(executor.total_cpus * executor.context.tasks_in_flight_per_cpu))

    # -- bundling
    def _next_bundle_ready(self) -> bool:
        queue = self.queues[0]
        if not queue:
            return False
        if self.is_read or not self.min_rows_per_bundle:
            return True
        rows = 0
        for bundle in queue:
            rows += bundle.num_rows
            if rows >= self.min_rows_per_bundle:
                return True
        return self.inputs_done[0]

    def _take_bundle(self) -> Bundle:
        queue = self.queues[0]
        if self.is_read or not self.min_rows_per_bundle:
            return queue.popleft()
        merged = Bundle([], [])
        while queue and (merged.num_rows < self.min_rows_per_bundle or not merged.refs):
            bundle = queue.popleft()
            merged.refs.extend(bundle.refs)
            merged.metas.extend(bundle.metas)
            merged.pins.extend(bundle.pins)
            merged.pinned_bytes += bundle.pinned_bytes
        return merged

    def can_launch(self) -> bool:
        if self.stopped or len(self._tasks) >= self._cap or not self._next_bundle_ready():
            return False
        if self._actors:
            return any(self._calls[i] < self._per_actor_cap for i in self._ready)
        return True

    @property
    def _per_actor_cap(self) -> int:
        return max(1, self._cap // max(1, len(self._actors)))

    def estimate_bytes(self) -> int:
        queue = self.queues[0]
        if not queue:
            return 0
        head = queue[0]
        if self.is_read:
            estimate = sum(item.estimated_bytes for item in head.items)
            if self.stats.tasks and self._tasks_done:
                return int(self._out_bytes_seen / self._tasks_done)
            return estimate
        if self._in_bytes_seen:
            return int(head.size_bytes * self._out_bytes_seen / self._in_bytes_seen)
        return head.size_bytes

    _tasks_done = 0

    # -- running
    def launch(self, executor: Executor) -> None:
        bundle = self._take_bundle()
        seq = self._next_seq
        self._next_seq += 1
        args = bundle.items if self.is_read else bundle.refs
        estimate = self._estimate_for(bundle)
        if self._actors:
            index = min((i for i in self._ready if self._calls[i] < self._per_actor_cap),
                        key=lambda i: (self._calls[i], i))
            block_ref, meta_ref = self._actors[index].map.remote(seq, *args)
            self._calls[index] += 1
        else:
            block_ref, meta_ref = T.map_task.options(num_returns=2, **self.remote_args).remote(
                self._chain_ref, seq, *args)
            index = -1
        self._tasks[meta_ref] = _InFlight(seq, block_ref, bundle, estimate, index)
        self.stats.tasks += 1

    def _estimate_for(self, bundle: Bundle) -> int:
        if self.is_read:
            if self._tasks_done:
                return int(self._out_bytes_seen / self._tasks_done)
            return sum(item.estimated_bytes for item in bundle.items)
        if self._in_bytes_seen:
            return int(bundle.size_bytes * self._out_bytes_seen / self._in_bytes_seen)
        return bundle.size_bytes

    def in_flight(self) -> list:
        return list(self._tasks) + list(self._ready_refs)

    def on_ready(self, ref, executor: Executor) -> None:
        if ref in self._ready_refs:
            index = self._ready_refs.pop(ref)
            tray.get(ref)  # raises if the constructor failed
            self._ready.append(index)
            self._ready.sort()
            return
        task = self._tasks.pop(ref)
        if task.worker >= 0:
            self._calls[task.worker] -= 1
        meta: BlockMetadata = executor.fetch_metadata(ref, self)
        self._tasks_done += 1
        self._out_bytes_seen += meta.size_bytes
        self._in_bytes_seen += task.inputs.size_bytes
        self.stats.task_s += meta.exec_s
        pins = [] if self.is_read else list(task.inputs.refs)
        pinned = 0 if self.is_read else sum(m.size_bytes for m in task.inputs.metas)
        self._finished[task.seq] = Bundle([task.block_ref], [meta], pins=pins,
                                          pinned_bytes=pinned)
        while self._next_out in self._finished:
            self.emit(self._finished.pop(self._next_out))
            self._next_out += 1

    def completed(self) -> bool:
        return self.stopped or (self.all_inputs_done() and not self.queues[0]
                                and not self._tasks and not self._finished)

    def held_bytes(self) -> int:
        in_flight = sum(t.inputs.size_bytes + t.estimate_bytes for t in self._tasks.values())
        waiting = sum(b.size_bytes for b in self._finished.values())
        return super().held_bytes() + in_flight + waiting

    def stop(self) -> None:
        self._tasks.clear()
        self._finished.clear()
        super().stop()

    def release_when_done(self) -> None:
        """Once every input went through the pool, its actors go, freeing
        their resources for the operators after it (Ray kills a finished
        pool's idle actors too): with a pool as large as the cluster, the
        tasks after it (a limit's slice, a map) could not run before."""
        if self._actors and self.completed():
            self.shutdown()

    def shutdown(self) -> None:
        for actor in self._actors:
            try:
                tray.kill(actor)
            except Exception:  # noqa: BLE001 - the actor may be gone already
                pass
        self._actors = []
        self._ready = []
        self._ready_refs = {}


def _upstream_of(op: Operator) -> list:
    found, stack = [], list(op.inputs)
    while stack:
        upstream = stack.pop()
        found.append(upstream)
        stack.extend(upstream.inputs)
    return found


class AllToAllOperator(Operator):
    """Collects every input, then runs a plan (a generator of task rounds,
    see ``_shuffle``); its outputs come out in the plan's order."""

    def __init__(self, name: str, inputs: list, plan_fn, *, emit_order: str = "plan") -> None:
        super().__init__(name, inputs)
        self.plan_fn = plan_fn  # (list of bundles per input) -> generator
        self._plan = None
        self._round: list = []  # calls of the current round
        self._pending: collections.deque = collections.deque()  # indexes not launched
        self._tasks: dict = {}  # last ref -> index in round
        self._results: list = []
        self._remaining = 0
        self._done = False
        self._held: list = []  # input bundles, held until the plan ends
        self._cap = 1

    def start(self, executor: Executor) -> None:
        self._cap = max(1, int(executor.total_cpus * executor.context.tasks_in_flight_per_cpu))

    def held_bytes(self) -> int:
        return 0  # materialized by nature; outside the streaming budget

    def _begin(self, executor) -> None:
        bundles = [list(queue) for queue in self.queues]
        for queue in self.queues:
            queue.clear()
        self._held = bundles
        self._plan = self.plan_fn(*bundles)
        self._advance(None, executor)

    def _advance(self, value, executor) -> None:
        try:
            calls = self._plan.send(value)
        except StopIteration as stop:
            self._finish(stop.value or [])
            return
        self._round = calls
        self._results = [None] * len(calls)
        self._pending = collections.deque(range(len(calls)))
        self._remaining = len(calls)
        if not calls:
            self._advance([], executor)

    def _finish(self, results: list) -> None:
        for result in results:
            self.emit(Bundle(list(result.block_refs), [result.value], pins=result.pins))
        self._done = True
        self._held = []
        self._plan = None

    def can_launch(self) -> bool:
        if self.stopped or self._done:
            return False
        if self._plan is None:
            return self.all_inputs_done()
        return bool(self._pending) and len(self._tasks) < self._cap

    def launch(self, executor: Executor) -> None:
        if self._plan is None:
            self._begin(executor)
            return
        index = self._pending.popleft()
        call = self._round[index]
        remote = call.remote.options(num_returns=call.num_blocks + 1,
                                     max_retries=executor.context.task_max_retries)
        refs = remote.remote(*call.args)
        refs = refs if isinstance(refs, list) else [refs]
        self._tasks[refs[-1]] = (index, refs[:-1])
        self.stats.tasks += 1

    def in_flight(self) -> list:
        return list(self._tasks)

    def on_ready(self, ref, executor: Executor) -> None:
        index, block_refs = self._tasks.pop(ref)
        from ._shuffle import CallResult

        value = executor.fetch_metadata(ref, self)
        if isinstance(value, BlockMetadata):
            self.stats.task_s += value.exec_s
        self._results[index] = CallResult(block_refs, value, self._round[index].pins)
        self._remaining -= 1
        if self._remaining == 0:
            self._advance(self._results, executor)

    def completed(self) -> bool:
        return self.stopped or self._done

    def shutdown(self) -> None:
        if self._plan is not None:
            self._plan.close()
            self._plan = None


class LimitOperator(Operator):
    """Passes the first ``limit`` rows, then stops everything upstream."""

    def __init__(self, name: str, input_op: Operator, limit: int) -> None:
        super().__init__(name, [input_op])
        self.limit = limit
        self.rows = 0
        self._slice = None  # (metadata ref, block ref, pins)
        self.reached = limit == 0

    def can_launch(self) -> bool:
        return bool(self.queues[0]) and self._slice is None and not self.reached

    def launch(self, executor: Executor) -> None:
        from ._shuffle import gather_rows

        bundle = self.queues[0].popleft()
        for ref, meta in zip(bundle.refs, bundle.metas, strict=False):
            if self.reached:
                break
            if self.rows + meta.num_rows <= self.limit:
                self.rows += meta.num_rows
                self.emit(Bundle([ref], [meta], pins=list(bundle.pins),
                                 pinned_bytes=bundle.pinned_bytes))
            else:
                wanted = self.limit - self.rows
                block_ref, meta_ref = gather_rows.options(
                    num_returns=2, max_retries=executor.context.task_max_retries).remote(
                    [(0, wanted)], ref)
                self._slice = (meta_ref, block_ref, [ref])
                self.stats.tasks += 1
                self.rows = self.limit
            if self.rows >= self.limit:
                self.reached = True
        if self.reached:
            self.queues[0].clear()
            if self._slice is None:
                executor.stop_upstream(self)

    def in_flight(self) -> list:
        return [self._slice[0]] if self._slice else []

    def on_ready(self, ref, executor: Executor) -> None:
        meta_ref, block_ref, pins = self._slice
        meta = executor.fetch_metadata(meta_ref, self)
        self._slice = None
        self.emit(Bundle([block_ref], [meta], pins=pins))
        executor.stop_upstream(self)

    def completed(self) -> bool:
        if self.reached and self._slice is None:
            return True
        return super().completed()


class UnionOperator(Operator):
    """The outputs of its inputs, one input after the other."""

    def can_launch(self) -> bool:
        return False

    def pump(self) -> None:
        for index, queue in enumerate(self.queues):
            while queue:
                self.emit(queue.popleft())
            if not self.inputs_done[index]:
                return  # later inputs wait their turn (order)

    def completed(self) -> bool:
        return self.stopped or (self.all_inputs_done() and not any(self.queues))
