"""Logical plans and their compilation to physical operators.

A ``Dataset`` is an immutable node of a logical plan: transforms add a
node and return a new dataset; nothing runs until a consumer asks. On
execution the plan compiles into the physical operators of ``_operators``;
the one optimisation is Ray's most important: adjacent map operators that
run as tasks with the same resources are **fused** into one task (their
transform chains concatenated), reads included, so read -> map_batches ->
filter is one task per block and one block in the store, not three.
A map on an actor pool takes in the plain task map or read before it (its
actors run the read and the maps, as Ray's ``ReadRange->MapBatches(C)``
does), so that no task feeds a pool as large as the cluster; nothing after
a pool is fused into it (its actors hold state that tasks cannot).

``execute_plan`` compiles a plan and runs it with the streaming executor;
every consumer of a dataset (and each epoch of a ``streaming_split``)
goes through it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from . import _executor as E
from . import _operators as O
from . import _transforms as T
from ._context import DataContext


@dataclass(eq=False)
class LogicalOp:
    kind: str  # "input", "read", "map", "all_to_all", "limit", "union"
    name: str
    inputs: list = field(default_factory=list)
    params: dict = field(default_factory=dict)


def input_op(name: str, bundles: list) -> LogicalOp:
    return LogicalOp("input", name, [], {"bundles": list(bundles)})


def read_op(name: str, read_tasks: list) -> LogicalOp:
    return LogicalOp("read", name, [], {"read_tasks": list(read_tasks)})


def map_op(parent: LogicalOp, name: str, transform: T.Transform, *, remote_args=None,
           pool_size=None, concurrency=None, min_rows_per_bundle=None,
           explicit_batch_size=False) -> LogicalOp:
    return LogicalOp("map", name, [parent], {
        "transform": transform, "remote_args": dict(remote_args or {}),
        "pool_size": pool_size, "concurrency": concurrency,
        "min_rows_per_bundle": min_rows_per_bundle,
        "explicit_batch_size": explicit_batch_size})


def all_to_all_op(parents: list, name: str, plan_fn) -> LogicalOp:
    """``plan_fn(*bundles_per_input)`` is a generator of rounds (``_shuffle``)."""
    return LogicalOp("all_to_all", name, list(parents), {"plan_fn": plan_fn})


def limit_op(parent: LogicalOp, limit: int) -> LogicalOp:
    return LogicalOp("limit", f"Limit[{limit}]", [parent], {"limit": limit})


def union_op(parents: list) -> LogicalOp:
    return LogicalOp("union", "Union", list(parents))


def _fusable(op: O.Operator, node: LogicalOp) -> bool:
    """Fuse unless resources differ, an actor pool is involved, or the map
    asked for batches of a size that only bundling the blocks of a map
    before it could give. Into a read it always fuses, as in Ray: a read
    task's output is a whole file or range, and batches are cut from it."""
    params = node.params
    return (isinstance(op, O.MapOperator)
            and (op.is_read or not params.get("explicit_batch_size")) and op.pool_size is None and params["pool_size"] is None
            and op.concurrency == params["concurrency"]
            and _resources(op.remote_args) == _resources(params["remote_args"])
            and not getattr(op, "_started", False))


def _fusable_into_pool(op: O.Operator, node: LogicalOp) -> bool:
    """A map on an actor pool takes in the task-based map (or read) before
    it when that asked for no resources of its own (only retries) and no
    batches of its own size."""
    params = node.params
    return (isinstance(op, O.MapOperator) and params["pool_size"] is not None
            and op.pool_size is None and op.concurrency is None
            and not _resources(op.remote_args)
            and (op.is_read or not params.get("explicit_batch_size"))
            and not getattr(op, "_started", False))


def _resources(remote_args: dict) -> tuple:
    """What must match for two map operators to share tasks (retries may
    differ: the fused task takes the larger budget)."""
    return tuple(sorted((k, repr(v)) for k, v in remote_args.items() if k != "max_retries"))


def compile_plan(node: LogicalOp) -> O.Operator:
    """The physical operator tree for ``node`` (a fresh one per execution)."""
    if node.kind == "input":
        return O.InputOperator(node.name, node.params["bundles"])
    if node.kind == "read":
        source = O.InputOperator(f"{node.name}Tasks", [
            O.Bundle([], [], items=[task]) for task in node.params["read_tasks"]])
        retries = DataContext.get_current().task_max_retries
        return O.MapOperator(node.name, source, [T.ReadTransform(node.name)],
                             remote_args={"max_retries": retries}, is_read=True)
    if node.kind == "map":
        upstream = compile_plan(node.inputs[0])
        params = node.params
        if _fusable(upstream, node):
            retries = [upstream.remote_args.get("max_retries"),
                       params["remote_args"].get("max_retries")]
            upstream.remote_args.update(params["remote_args"])
            if None not in retries:
                upstream.remote_args["max_retries"] = -1 if -1 in retries else max(retries)
            upstream.chain = [*upstream.chain, params["transform"]]
            upstream.name = f"{upstream.name}->{node.name}"
            return upstream
        if _fusable_into_pool(upstream, node):
            # Ray fuses the tasks before an actor pool into it (ReadRange->
            # MapBatches(C) runs on the actors): then no task feeds the pool,
            # and a pool as large as the cluster cannot starve its input.
            fused = O.MapOperator(f"{upstream.name}->{node.name}", upstream.inputs[0],
                                  [*upstream.chain, params["transform"]],
                                  remote_args=params["remote_args"],
                                  pool_size=params["pool_size"],
                                  min_rows_per_bundle=None if upstream.is_read
                                  else params["min_rows_per_bundle"],
                                  is_read=upstream.is_read)
            return fused
        return O.MapOperator(node.name, upstream, [params["transform"]],
                             remote_args=params["remote_args"], pool_size=params["pool_size"],
                             concurrency=params["concurrency"],
                             min_rows_per_bundle=params["min_rows_per_bundle"])
    if node.kind == "all_to_all":
        return O.AllToAllOperator(node.name, [compile_plan(p) for p in node.inputs],
                                  node.params["plan_fn"])
    if node.kind == "limit":
        return O.LimitOperator(node.name, compile_plan(node.inputs[0]), node.params["limit"])
    if node.kind == "union":
        return O.UnionOperator(node.name, [compile_plan(p) for p in node.inputs])
    raise ValueError(f"unknown logical operator kind {node.kind!r}")


def describe(node: LogicalOp) -> str:
    """The plan as Ray prints it: ``Map(f) <- ReadRange``."""
    if not node.inputs:
        return node.name
    inner = " + ".join(describe(p) for p in node.inputs)
    return f"{node.name} <- {inner}" if len(node.inputs) == 1 else f"{node.name} <- ({inner})"


# ================================================================ execution


def execute_plan(node: LogicalOp, context: DataContext | None = None, stats_sink=None):
    """Run ``node``; yields bundles. ``stats_sink(executor)`` gets the
    executor at the end, for ``stats()``."""
    executor = E.StreamingExecutor(compile_plan(node), context)
    try:
        yield from executor.run()
    finally:
        if stats_sink is not None:
            stats_sink(executor)
