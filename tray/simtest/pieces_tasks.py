"""Workload pieces over tasks: graphs of small values (``dag``), nested
submission from inside tasks (``nested``), application errors and retries
(``retries``), ``tray.cancel`` (``cancellation``), tasks and an actor in a
placement group (``placement_groups``) and GPU tasks (``gpus``).

Each piece is a function ``(program) -> None`` that submits work through the
public API and records what the reference model expects of each ref
(``program.expect``); its randomness comes only from ``program.rng``."""

from __future__ import annotations

import tray

from . import remote_code
from .remote_code import (
    FlakyError,
    Squarer,
    add,
    fan_in,
    flaky,
    gated,
    leaf,
    long_sleeper,
    nested_sum,
    on_gpu,
    sleeper,
    sleeping_parent,
)


def dag(program) -> None:
    """Chains, trees, fan-in/fan-out and diamonds over small values."""
    rng = program.rng
    shape = rng.choice(["chain", "tree", "fan", "diamond"])
    retries = program.task_retries()
    fn = lambda f: f.options(max_retries=retries)  # noqa: E731
    if shape == "chain":
        n = rng.randint(2, 8)
        ref, value = fn(leaf).remote(program.key("chain0"), 2), 4
        for i in range(n):
            ref = fn(add).remote(program.key(f"chain{i + 1}"), ref, i)
            value += i
        program.expect(ref, value, label=f"chain of {n}", retries=retries)
    elif shape == "tree":
        n = rng.randint(2, 12)
        refs = [fn(leaf).remote(program.key(f"tree-leaf{i}"), i, rng.random() * 0.05)
                for i in range(n)]
        values = [i * i for i in range(n)]
        while len(refs) > 1:
            a, b = refs.pop(0), refs.pop(0)
            refs.append(fn(add).remote(program.key("tree-add"), a, b))
            values.append(values.pop(0) + values.pop(0))
        program.expect(refs[0], values[0], label=f"tree of {n}", retries=retries)
    elif shape == "fan":
        n = rng.randint(2, 10)
        refs = [fn(leaf).remote(program.key(f"fan{i}"), i, rng.random() * 0.05) for i in range(n)]
        total = fn(fan_in).remote(program.key("fan-in"), *refs)
        program.expect(total, sum(i * i for i in range(n)), label="fan-in", retries=retries)
        for i, ref in enumerate(refs):
            program.expect(ref, i * i, label=f"fan-out {i}", retries=retries)
    else:
        top = fn(leaf).remote(program.key("diamond-top"), 3)
        left = fn(add).remote(program.key("diamond-left"), top, 1)
        right = fn(add).remote(program.key("diamond-right"), top, 2)
        bottom = fn(add).remote(program.key("diamond-bottom"), left, right)
        program.expect(bottom, (9 + 1) + (9 + 2), label="diamond", retries=retries)


def nested(program) -> None:
    rng = program.rng
    # Parents block in get() and lend their CPU back while they wait, so a
    # tree with more blocked parents than the cluster has CPUs (up to 5 on
    # a 1-CPU cluster) still finishes.
    n, depth = rng.randint(1, 4), rng.randint(1, 2)
    retries = program.task_retries()
    ref = nested_sum.options(max_retries=retries).remote(program.key("nested"), n, depth)

    def model(n: int, depth: int) -> int:
        if depth <= 1:
            return sum(i * i for i in range(n))
        return sum(model(i + 1, depth - 1) for i in range(n))

    # Children may be resubmitted by a re-executed parent under new keys, so
    # only the parent's own count is bounded here.
    program.expect(ref, model(n, depth), label=f"nested {n}x{depth}",
                   nested=True)


def retries(program) -> None:
    """Application errors and retry_exceptions: the count is exact."""
    rng = program.rng
    max_retries = rng.randint(0, 3)
    failures = rng.randint(0, 4)
    key = program.key("flaky", retries=max_retries)
    ref = flaky.options(max_retries=max_retries, retry_exceptions=True).remote(key, failures)
    if failures <= max_retries:
        # A crash after the body ran (before its reply) costs one more run:
        # the attempt it returns may be later than the first success.
        expected = ("int between", failures + 1, max_retries + 1) if program.kills \
            else failures + 1
        program.expect(ref, expected, label="flaky succeeds", app_retries=True,
                       retries=max_retries)
    else:
        program.expect(ref, program.error(FlakyError), label="flaky fails", app_retries=True,
                       retries=max_retries)
    if not program.kills:
        program.exact_executions(key, min(failures, max_retries) + 1)


def placement_groups(program) -> None:
    """A placement group (of memory, so it starves no other piece of CPUs)
    with tasks and a restarting actor in its bundles; bundles lost with a
    node are placed again and the work still comes back. Groups are removed
    at quiescence, which must leave no resource reserved."""
    from tray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    rng = program.rng
    nodes = sum(1 for node in tray.nodes() if node["Alive"])
    strategy = rng.choice(["PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"])
    count = rng.randint(1, min(3, nodes) if strategy == "STRICT_SPREAD" else 3)
    group = program.placement_group([{"memory": 4e6} for _ in range(count)], strategy)
    for i in range(rng.randint(1, 6)):
        index = rng.choice([-1, *range(count)])
        where = PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=index)
        key = program.key("in-group", retries=-1)
        program.placed(key, "group", group.id.hex(), index)
        ref = leaf.options(num_cpus=0, memory=1e6, max_retries=-1,
                           scheduling_strategy=where).remote(key, i, rng.random() * 0.1)
        program.expect(ref, i * i, label=f"task {i} in a {strategy} group")
    if rng.random() < 0.5:
        where = PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=0)
        key = program.key("grouped-squarer", retries=-1)
        program.placed(f"{key}:init", "group", group.id.hex(), 0)
        squarer = program.actor(Squarer.options(num_cpus=0, memory=1e6, max_restarts=-1,
                                                max_task_retries=-1, scheduling_strategy=where),
                                key)
        for i in range(rng.randint(1, 5)):
            program.expect(squarer.square.remote(i, rng.random() * 0.05), i * i,
                           label=f"call {i} to an actor in a group", actor_call=True)


def gpus(program) -> None:
    """GPU tasks on nodes with GPUs, whole or fractional (Ray's num_gpus=0.5:
    tasks share a device while their fractions fit in it): at the end, no
    GPU id of a node was held past its capacity (``check_gpu_exclusive``),
    and each task saw exactly one device."""
    if not tray.cluster_resources().get("GPU"):
        return
    rng = program.rng
    retries = program.task_retries()
    fractional = rng.random() < 0.5
    for i in range(rng.randint(2, 8)):
        sleep_s = rng.random() * 0.2
        amount = rng.choice([1.0, 0.5, 0.6, 0.3, 0.25]) if fractional else 1.0
        ref = on_gpu.options(max_retries=retries, num_gpus=amount).remote(
            program.key(f"gpu{i}"), sleep_s, amount)
        program.expect(ref, 1, label=f"GPU task {i} ({amount:g} GPU)", retries=retries)


def _until_started(program, key: str, ref, at_least: int = 1, polls: int = 60) -> int:
    """Lets virtual time run (0.02 s at a time) until ``key``'s body ran
    ``at_least`` times or ``ref`` is done; returns how often it ran."""
    for _ in range(polls):
        if remote_code.LEDGER.executions.get(key, 0) >= at_least:
            break
        ready, _ = tray.wait([ref], timeout=0.02, fetch_local=False)
        if ready:
            break
    return remote_code.LEDGER.executions.get(key, 0)


def cancellation(program) -> None:
    """``tray.cancel`` as Ray's (ray.cancel's documentation): a task still
    pending is never executed and ``get`` raises ``TaskCancelledError``; a
    running one is interrupted (``force=False``) or its worker exits
    (``force=True``; Ray raises ``WorkerCrashedError`` then, tray
    ``TaskCancelledError``: both accepted), and it is not retried; a task that
    already finished keeps its value; ``recursive=True`` (the default)
    cancels the children it submitted too."""
    rng = program.rng
    # Queued: its argument is a slow task's result (retried without limit,
    # so it cannot fail), so it cannot have started when the cancel returns.
    gate_key = program.key("gate", retries=-1)
    gate = sleeper.options(max_retries=-1).remote(gate_key, 1.0)
    queued_key = program.key("queued", retries=0)
    queued = gated.options(max_retries=0).remote(queued_key, gate)
    tray.cancel(queued, force=rng.random() < 0.5)
    program.expect(queued, program.error(tray.exceptions.TaskCancelledError),
                   label="cancelled while queued", strict=True)
    program.exact_executions(queued_key, 0)  # never, whatever the faults
    program.expect(gate, gate_key, label="the queued task's argument", unlimited=True)
    del gate
    # Running: a long sleeper cancelled once its body started.
    force = rng.random() < 0.5
    key = program.key("running", retries=rng.choice([0, 2]))
    ref = long_sleeper.options(max_retries=program.limits[key] - 1).remote(key, 5.0)
    ran = _until_started(program, key, ref)
    tray.cancel(ref, force=force)
    errors = (tray.exceptions.TaskCancelledError, tray.exceptions.WorkerCrashedError) \
        if force else tray.exceptions.TaskCancelledError
    if ran:
        program.expect(ref, program.error(errors), label=f"cancelled while running "
                       f"(force={force})")
        program.cancelled_run(key, ran, force, task=ref.task_id().hex())
    else:  # (it may not have started: a busy or faulty cluster)
        program.expect(ref, program.CANCELLED_OR_VALUE, label="cancelled, perhaps running")
    # Recursive: a parent waiting on its children (or on children waiting
    # on grandchildren), cancelled with all of them at every depth; a plain
    # cancel leaves them alone.
    if rng.random() < 0.8:
        recursive = rng.random() < 0.7
        depth = rng.choice([1, 2, 2])
        parent_key = program.key("parent", retries=0)
        # Children a recursive cancel stops sleep long (reaching their end is
        # the bug); a plain cancel leaves them running, as Ray's does, so they
        # are short: three in a row on one CPU must end within QUIESCE_S, or
        # their lease is still taken then (cancel seed 236 under chaos).
        parent = sleeping_parent.options(max_retries=0).remote(
            parent_key, rng.randint(1, 3 if depth == 1 else 2), 5.0 if recursive else 0.5,
            depth)
        ran = _until_started(program, parent_key, parent)
        tray.cancel(parent, force=False, recursive=recursive)
        program.expect(parent, program.CANCELLED_OR_VALUE if not ran else
                       program.error(tray.exceptions.TaskCancelledError),
                       label=f"parent cancelled (recursive={recursive}, depth={depth})")
        if ran and recursive:
            program.cancelled_children(f"{parent_key}#{ran}:", task=parent.task_id().hex())
        elif ran:
            program.uncancelled_children(f"{parent_key}#{ran}:", task=parent.task_id().hex())
    _cancel_actor_call(program)
    # Finished: a cancel after the end changes nothing.
    done = leaf.options(max_retries=3).remote(program.key("done", retries=3), 7)
    tray.wait([done], timeout=program.wait_timeout_s, fetch_local=False)
    finished = bool(tray.wait([done], timeout=0, fetch_local=False)[0])
    tray.cancel(done)
    program.expect(done, 49 if finished else program.CANCELLED_OR_VALUE,
                   label="cancelled after it finished")


def _cancel_actor_call(program) -> None:
    """An actor call cancelled while it waits behind another (Ray: a pending
    actor task is cancelled and never runs; a running one of a regular actor
    is not interrupted). In half the seeds, drawn apart from the program's
    draws so that those stay as they were."""
    import random

    import tray.simtest

    from .remote_code import Squarer

    rng = random.Random(f"{tray.simtest.cluster().seed}:cancel-actor-call")
    if rng.random() < 0.5:
        return
    actor = program.actor(Squarer.options(num_cpus=0, max_restarts=-1, max_task_retries=-1),
                          program.key("cancel-actor", retries=-1))
    busy_key = program.key("actor call before", retries=-1)
    busy = actor.run.remote(busy_key, 1.0)
    _until_started(program, busy_key, busy)  # (then the next call waits at the actor)
    waiting_key = program.key("actor call cancelled", retries=0)
    waiting = actor.run.remote(waiting_key, 0.0)
    tray.cancel(waiting)
    program.expect(busy, busy_key, label="an actor call a later call's cancel left alone",
                   actor_call=True, unlimited=True)
    # (Whatever the faults: a restart re-sends calls, never a cancelled one.)
    program.expect(waiting, program.error(tray.exceptions.TaskCancelledError),
                   label="an actor call cancelled while it waited", strict=True)
    program.exact_executions(waiting_key, 0)
