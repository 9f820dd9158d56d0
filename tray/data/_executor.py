"""The streaming executor: blocks flow through operators as object refs.

A dataset's plan compiles (``_plan``) into a tree of physical operators
(``_operators``). This module runs that tree in the consuming process,
one loop, no threads:

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

import sys
import time
from dataclasses import dataclass

import tray
from tray import exceptions

from ._context import DataContext
from ._operators import InputOperator, Operator, UnionOperator

# ============================================================ statistics


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
            release = getattr(op, "release_when_done", None)
            if release is not None:
                release()
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

    if not simtest.is_simulated():
        return 0
    return int(getattr(simtest.cluster(), "object_store_bytes", 0) or 0)


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
