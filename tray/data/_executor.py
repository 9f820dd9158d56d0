"""The streaming executor: blocks flow through operators as object refs.

A dataset's plan compiles into a tree of physical operators (``_plan``).
This module runs that tree in the consuming process, one loop, no threads:

1. move every operator's finished outputs into its consumer's input queue;
2. launch tasks, most downstream operator first, while the memory budget
   allows (below);
3. hand the root's outputs to the consumer (a generator: the consumer's
   pace is the pipeline's pace);
4. block in ``tray.wait`` until some task finishes, then go to 1.

Only refs and small metadata pass through here; blocks stay in the object
store and go from task to task.

**Backpressure.** The budget is a share
(``DataContext.object_store_memory_fraction``, 0.5) of the smallest node's
object store (every block may land on one node, and the simulator's stores
do not spill), or ``execution_options.resource_limits.object_store_memory``. The executor
counts every block it holds a ref to — queued between operators, pinned
as lineage, the estimated output of every task in flight — and launches a
task only while that count plus the task's estimated output stays within
the budget. Downstream operators go first, since their tasks free their
inputs. One exception keeps the loop live: when nothing at all is in
flight, one task may launch whatever the count says. So a pipeline over a
dataset many times the store's size runs in the store's budget, at the
pace of its slowest operator. Ray Data's users' first complaint is memory
blow-ups; this is the answer (the alternative, Ray's per-operator
reservations, adapts better to skewed pipelines but is much harder to
reason about; here the invariant is one sum).

All-to-all operators (sort, shuffle, groupby, repartition, zip) must see
every input before they emit: what they hold is the dataset materialized,
outside the streaming budget (as in Ray; the local backend spills it).

**Lineage.** The core rebuilds a lost task result by re-running its task,
but not when that task's own argument was freed meanwhile. So an output
bundle pins the blocks its task read until the bundle itself is consumed:
one level of lineage, enough for a node crash that loses the blocks in
flight. A read task's arguments are values, so reads always recompute.

**Order and determinism.** Outputs leave every operator in the order of
its inputs (``preserve_order``, tray's default), so a dataset's rows come
out in the same order every run; in the simulator, the whole execution
replays from the seed.
"""

from __future__ import annotations

import collections
import sys
import time
from dataclasses import dataclass, field

import tray
from tray import exceptions

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


@dataclass(frozen=True)
class ExecutorStatistics:
    operators: int
    tasks_in_flight: int
    bundles_queued: int
    held_bytes: int
    peak_held_bytes: int
    budget_bytes: int


class DataTaskError(RuntimeError):
    """Only for internal invariants; user errors keep their own class."""


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

    def launch(self, executor: StreamingExecutor) -> None:
        raise NotImplementedError

    def in_flight(self) -> list:
        return []

    def on_ready(self, ref, executor: StreamingExecutor) -> None:
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
    def start(self, executor: StreamingExecutor) -> None:
        self._chain_ref = tray.put(self.chain)
        if self.pool_size is not None:
            options = {"num_cpus": 1.0, "max_restarts": -1, "max_task_retries": -1}
            options.update({k: v for k, v in self.remote_args.items()
                            if k in ("num_cpus", "num_gpus", "resources", "memory",
                                     "scheduling_strategy", "max_restarts")})
            pool_cpus = self.pool_size * float(options.get("num_cpus") or 0)
            if pool_cpus >= executor.total_cpus and any(
                    isinstance(op, MapOperator) and op.pool_size is None
                    for op in executor.operators):
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
    def launch(self, executor: StreamingExecutor) -> None:
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

    def on_ready(self, ref, executor: StreamingExecutor) -> None:
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

    def shutdown(self) -> None:
        for actor in self._actors:
            try:
                tray.kill(actor)
            except Exception:  # noqa: BLE001 - the actor may be gone already
                pass
        self._actors = []
        self._ready = []
        self._ready_refs = {}


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

    def start(self, executor: StreamingExecutor) -> None:
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

    def launch(self, executor: StreamingExecutor) -> None:
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

    def on_ready(self, ref, executor: StreamingExecutor) -> None:
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

    def launch(self, executor: StreamingExecutor) -> None:
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

    def on_ready(self, ref, executor: StreamingExecutor) -> None:
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


# ============================================================ the executor


class StreamingExecutor:
    """Runs one tree of operators; ``run()`` yields the root's bundles."""

    def __init__(self, root: Operator, context: DataContext | None = None) -> None:
        self.context = context or DataContext.get_current()
        self.root = root
        self.operators: list = []  # topological: inputs first
        self._downstream: dict = {}  # id(op) -> (consumer, input index)
        self._collect(root)
        if len(self.operators) > self.context.operators_max:
            raise ValueError(f"the plan has {len(self.operators)} operators; at most "
                             f"{self.context.operators_max} run at once")
        self.total_cpus = 1.0
        self.budget_bytes = 0
        self.peak_held_bytes = 0
        self.wall_s = 0.0
        self._owner: dict = {}  # in-flight ref -> operator
        self._bars = []

    def _collect(self, op: Operator) -> None:
        for index, upstream in enumerate(op.inputs):
            self._collect(upstream)
            self._downstream[id(upstream)] = (op, index)
        self.operators.append(op)

    # -- helpers for the operators
    def fetch_metadata(self, ref, op: Operator):
        """The small value of a finished task; a user error is raised with
        the operator's name and the original traceback."""
        try:
            return tray.get(ref)
        except exceptions.TaskError as error:
            raise _operator_error(error, op.name) from None
        except exceptions.TrayError as error:
            error.add_note(f"while running the tray.data operator {op.name}")
            raise

    def stop_upstream(self, op: Operator) -> None:
        for upstream in op.inputs:
            self._stop_tree(upstream)

    def _stop_tree(self, op: Operator) -> None:
        if not op.stopped:
            op.stop()
            op.inputs_done = [True] * len(op.inputs)
        for upstream in op.inputs:
            self._stop_tree(upstream)

    # -- the loop
    def _setup(self) -> None:
        resources = tray.cluster_resources()
        limits = self.context.execution_options.resource_limits
        self.total_cpus = float(limits.cpu or resources.get("CPU", 1.0) or 1.0)
        self.budget_bytes = int(limits.object_store_memory or
                                self.context.object_store_memory_fraction *
                                store_capacity_bytes())
        for op in self.operators:
            start = getattr(op, "start", None)
            if start is not None:
                start(self)
        self._open_bars()

    def held_bytes(self) -> int:
        return sum(op.held_bytes() for op in self.operators)

    def _move_outputs(self) -> bool:
        moved = False
        for op in self.operators:
            if isinstance(op, InputOperator):
                op.release()
            if isinstance(op, UnionOperator):
                op.pump()
            consumer = self._downstream.get(id(op))
            if consumer is None:
                continue
            target, index = consumer
            while op.outputs:
                target.add_input(op.outputs.popleft(), index)
                moved = True
            if op.completed() and not target.inputs_done[index]:
                target.input_done(index)
                moved = True
        return moved

    def _launch(self) -> bool:
        launched = False
        held = self.held_bytes()
        anything_in_flight = any(op.in_flight() for op in self.operators)
        for op in reversed(self.operators):  # downstream first
            while op.can_launch():
                estimate = op.estimate_bytes()
                budget_ok = held + estimate <= self.budget_bytes
                if not budget_ok and (anything_in_flight or launched or self.root.outputs):
                    break
                op.launch(self)
                held += estimate
                launched = True
                anything_in_flight = True
        self.peak_held_bytes = max(self.peak_held_bytes, self.held_bytes())
        return launched

    def run(self):
        started = time.perf_counter()
        self._setup()
        try:
            while True:
                progressed = True
                while progressed:
                    progressed = self._move_outputs()
                    progressed = self._launch() or progressed
                while self.root.outputs:
                    bundle = self.root.outputs.popleft()
                    yield bundle
                    self._move_outputs()
                    self._launch()
                if self.root.completed() and not self.root.outputs:
                    return
                self._owner = {ref: op for op in self.operators for ref in op.in_flight()}
                refs = list(self._owner)
                if not refs:
                    if self._move_outputs() or self._launch():
                        continue
                    raise DataTaskError(
                        "tray.data executor stalled with nothing in flight: "
                        + "; ".join(f"{op.name}: queued={[len(q) for q in op.queues]} "
                                    f"done={op.inputs_done} completed={op.completed()}"
                                    for op in self.operators))
                ready, rest = tray.wait(refs, num_returns=1)
                if rest:
                    more, _ = tray.wait(rest, num_returns=len(rest), timeout=0)
                    ready += more
                for ref in ready:
                    op = self._owner.pop(ref)
                    if not op.stopped:
                        op.on_ready(ref, self)
        finally:
            self.wall_s = time.perf_counter() - started
            for op in self.operators:
                op.shutdown()
            self._close_bars()

    # -- progress bars
    def _open_bars(self) -> None:
        if not self.context.enable_progress_bars or not _stderr_is_tty():
            return
        try:
            from tqdm import tqdm
        except ImportError:
            return
        shown = [op for op in self.operators if not isinstance(op, InputOperator)]
        for position, op in enumerate(shown):
            op.bar = tqdm(desc=op.name, position=position, unit=" blocks", leave=True,
                          file=sys.stderr, dynamic_ncols=True)
            self._bars.append(op.bar)

    def _close_bars(self) -> None:
        for bar in self._bars:
            bar.close()
        self._bars = []

    # -- stats
    def statistics(self) -> ExecutorStatistics:
        """Where the execution stands, as a frozen record."""
        return ExecutorStatistics(
            operators=len(self.operators),
            tasks_in_flight=sum(len(op.in_flight()) for op in self.operators),
            bundles_queued=sum(len(q) for op in self.operators for q in op.queues),
            held_bytes=self.held_bytes(), peak_held_bytes=self.peak_held_bytes,
            budget_bytes=self.budget_bytes)

    def summary(self) -> str:
        lines = []
        for op in self.operators:
            if isinstance(op, InputOperator):
                continue
            s = op.stats
            lines.append(f"Operator {op.name}: {s.tasks} tasks, {s.blocks_out} blocks, "
                         f"{s.rows_out} rows, {s.bytes_out / 1e6:.2f} MB out; "
                         f"{s.task_s:.3f} s in tasks")
        lines.append(f"Execution: {self.wall_s:.3f} s wall; peak {self.peak_held_bytes / 1e6:.2f}"
                     f" MB of blocks held, budget {self.budget_bytes / 1e6:.2f} MB")
        return "\n".join(lines)


def _stderr_is_tty() -> bool:
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False


def _operator_error(error: exceptions.TaskError, op_name: str) -> exceptions.TaskError:
    """The user's error, as raised by the operator: still an instance of
    the user's exception class, with the original traceback."""
    wrapped = exceptions.TaskError(f"tray.data operator {op_name}", error.traceback_str,
                                   error.cause)
    return wrapped.as_instanceof_cause()


# The simulator's default store is 2 GiB per node, the local backend's 30%
# of memory; without a way to ask, assume the smaller.
FALLBACK_STORE_BYTES = 2 * 1024**3


def _simulated_store_bytes() -> int:
    """In the simulator, the fault toolkit's cluster knows its store size."""
    from tray import simtest

    try:
        cluster = simtest.cluster()
    except exceptions.TrayError:
        return 0
    return int(getattr(cluster, "object_store_bytes", 0) or 0)


def store_capacity_bytes() -> int:
    """The smallest object store among the live nodes.

    The smallest, not the sum: the scheduler packs tasks onto the driver's
    node until it is half busy, so every block of a pipeline may land in
    one store, and the simulator's stores do not spill. tray's ``nodes()``
    does not report store sizes yet (Ray's reports ``object_store_memory``
    among the resources); both spellings are read when present, else the
    simulator's size, else a conservative default."""
    sizes = []
    for node in tray.nodes():
        if not node.get("Alive"):
            continue
        size = node.get("ObjectStoreMemory") or node.get("object_store_memory") or \
            node["Resources"].get("object_store_memory")
        if size:
            sizes.append(int(size))
    if sizes:
        return min(sizes)
    simulated = _simulated_store_bytes()
    if simulated:
        return simulated
    try:
        import psutil

        memory = psutil.virtual_memory().total
    except Exception:  # noqa: BLE001
        memory = FALLBACK_STORE_BYTES
    return int(min(FALLBACK_STORE_BYTES, 0.3 * memory))
