"""Workload pieces over objects: large NumPy values through put, task
arguments and results and a borrowing actor (``objects``), ``wait`` with and
without ``fetch_local`` (``wait_loop``), deep chains of large objects over
the nodes (``chains``), several returns and refs inside results
(``returns``) and lineage reconstruction of a chain lost with its node
(``lineage``).

Each piece is a function ``(program) -> None`` that submits work through the
public API and records what the reference model expects of each ref
(``program.expect``); its randomness comes only from ``program.rng``."""

from __future__ import annotations

import numpy as np

import tray

from .remote_code import (
    Holder,
    Splitter,
    array_plus_one,
    array_sum,
    leaf,
    make_array,
    make_refs,
    sum_boxed,
    triple,
)


def objects(program) -> None:
    """Large NumPy objects through put/get, as task arguments and results."""
    rng = program.rng
    size = rng.choice([20_000, 50_000, 200_000])  # 160 KB .. 1.6 MB: past the inline limit
    fill = float(rng.randint(1, 9))
    put_ref = tray.put(np.full(size, fill))
    program.expect(put_ref, ("array", size, fill), label="put", put=True)
    retries = program.task_retries()
    # SPREAD puts results on other nodes too, where a node crash loses them
    # (and the owner must re-create them from lineage).
    strategy = rng.choice(["DEFAULT", "SPREAD"])
    made = make_array.options(max_retries=retries, scheduling_strategy=strategy).remote(
        program.key("make"), size, fill + 1)
    program.expect(made, ("array", size, fill + 1), label="made array", retries=retries)
    # One result nobody else reads: its only copy is where it ran.
    lonely = make_array.options(max_retries=retries, scheduling_strategy="SPREAD").remote(
        program.key("lonely"), size, fill + 2)
    program.expect(lonely, ("array", size, fill + 2), label="lonely array", retries=retries)
    total = array_sum.options(max_retries=retries).remote(program.key("sum"), put_ref)
    program.expect(total, size * fill, label="sum of put", retries=retries)
    total2 = array_sum.options(max_retries=retries).remote(program.key("sum2"), made)
    program.expect(total2, size * (fill + 1), label="sum of result", retries=retries)
    if rng.random() < 0.5:
        # A borrower: an actor keeps a ref the driver then drops.
        holder = program.actor(Holder.options(max_restarts=0))
        boxed = tray.put(np.full(size, 2.0))
        program.expect(holder.hold.remote([boxed]), True, actor_call=True, label="hold",
                       max_restarts=0)
        del boxed
        # A hold cut off by a fault (ActorUnavailableError: it may not have
        # run) leaves the holder nothing to read.
        read = ("one of", size * 2.0, 0.0) if program.kills else size * 2.0
        program.later(lambda: program.expect(holder.read.remote(), read, actor_call=True,
                                             label="borrowed read", max_restarts=0))
    program.later(lambda: strategies(program))


def strategies(program) -> None:
    """Once the faults stopped: SPREAD tasks one after the other (no
    resources, so every node always has room for them) go round the nodes,
    a task pinned to each node (NodeAffinitySchedulingStrategy, hard and
    soft: it always has room) runs there, and DEFAULT tasks submitted while
    the driver's node is idle run there (``check_placements``)."""
    from tray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    rng = program.rng
    alive = sorted(node["NodeID"] for node in tray.nodes() if node["Alive"])
    batch = f"spread-{len(program.placements)}"
    for i in range(2 * len(alive)):
        key = program.key(f"{batch}-{i}", retries=-1)
        program.placed(key, "spread", batch, alive)
        ref = leaf.options(num_cpus=0, max_retries=-1, scheduling_strategy="SPREAD").remote(
            key, i)
        program.expect(ref, i * i, label=f"SPREAD task {i} of {2 * len(alive)}", unlimited=True)
        tray.wait([ref], timeout=program.wait_timeout_s, fetch_local=False)
    # DEFAULT: on the driver's node while it has room and is not busy (here:
    # idle when the task is submitted; needing a sliver of memory, each is a
    # scheduling class of its own, no lease of other work reused).
    from tray.core.scheduling import utilization

    from . import cluster

    head = tray.get_runtime_context().get_node_id()
    for i in range(rng.randint(1, 3)):
        key = program.key(f"local{i}", retries=-1)
        manager = next((process.component.leases for address, process in
                        sorted(cluster().processes.items()) if address.endswith("/raylet")
                        and process.alive and getattr(process.component, "node_id", None) == head
                        and hasattr(process.component, "leases")), None)
        if manager is not None and utilization(manager.total, manager.available) < 1e-9:
            program.placed(key, "local", head, cluster().clock.current_time())
        # (Each a class of its own: a lease kept a moment for the one before
        # would run it wherever that one ran: mixed chaos seed 103.)
        ref = leaf.options(num_cpus=0, memory=4321 + len(program.placements),
                           max_retries=-1).remote(key, i)
        program.expect(ref, i * i, label=f"DEFAULT task {i}", unlimited=True)
        tray.wait([ref], timeout=program.wait_timeout_s, fetch_local=False)
    for i, (target, soft) in enumerate((node, soft) for node in alive
                                       for soft in (False, True)):
        key = program.key(f"pinned{i}", retries=-1)
        program.placed(key, "node", target, soft)
        ref = leaf.options(num_cpus=0, max_retries=-1, scheduling_strategy=(
            NodeAffinitySchedulingStrategy(target, soft=soft))).remote(key, i)
        try:
            tray.get(ref, timeout=program.wait_timeout_s)
        except tray.exceptions.TaskError as error:
            # Hard: it fails only once its node is gone (alive when chosen,
            # perhaps crashed in the fault window and found dead since).
            if not soft and "not alive" in str(error) and target not in {
                    node["NodeID"] for node in tray.nodes() if node["Alive"]}:
                continue
        except Exception:  # noqa: BLE001 - judged as the expectation below
            pass
        program.expect(ref, i * i, label=f"task {i} pinned to a node (soft={soft})",
                       unlimited=True)


def wait_loop(program) -> None:
    """``wait`` over small and large results, with and without
    ``fetch_local``, with short and long timeouts, for one result or
    several: with ``fetch_local`` every ref it reports ready must be ready
    (``Program.check_ready``), and every call is timed (``check_waits``:
    it returns once ``num_returns`` are ready, not before with fewer unless
    its timeout passed, the first ready ones in the order given). Once the
    faults stopped, one last ``wait`` for all of them, without a timeout
    (or a long one), returns with all of them ready."""
    rng = program.rng
    n = rng.randint(2, 8)
    retries = program.task_retries()
    large = rng.random() < 0.4
    fetch_local = rng.random() < 0.5
    timeout_s = rng.choice([0.05, program.wait_timeout_s])
    if large:  # spread over the nodes, so fetch_local has something to fetch
        size = 20_000
        refs = [make_array.options(max_retries=retries, scheduling_strategy="SPREAD").remote(
            program.key(f"wait{i}"), size, float(i)) for i in range(n)]
        expected = {ref: ("array", size, float(i)) for i, ref in enumerate(refs)}
    else:
        refs = [leaf.options(max_retries=retries).remote(program.key(f"wait{i}"), i,
                                                         rng.random() * 0.2) for i in range(n)]
        expected = {ref: i * i for i, ref in enumerate(refs)}
    pending = list(refs)
    for _ in range(max(1, int(program.wait_timeout_s / timeout_s))):
        if not pending:
            break
        k = rng.choice([1, 1, 2, 3, len(pending)])
        ready, pending = program.timed_wait(pending, num_returns=min(k, len(pending)),
                                            timeout=timeout_s, fetch_local=fetch_local,
                                            label="wait loop", inline=not large)
        if fetch_local:  # (otherwise a ready object may still be a transfer away)
            program.check_ready(ready, "wait loop (fetch_local)")
        for ref in ready:
            program.expect(ref, expected[ref], label="wait loop", unlimited=retries < 0,
                           retries=retries)
    for ref in pending:
        program.expect(ref, expected[ref], label="wait loop (late)", unlimited=retries < 0,
                       retries=retries)
    everything = list(refs)
    rng.shuffle(everything)
    last_timeout = rng.choice([None, 60.0])
    local = rng.random() < 0.5
    del refs, pending, ready, expected

    def wait_for_all() -> None:
        # (After the faults: every ref resolves, to a value or its error.)
        program.timed_wait(everything, num_returns=len(everything), timeout=last_timeout,
                           fetch_local=local, label=f"wait for all (timeout={last_timeout})",
                           inline=not large)
        everything.clear()
    program.later(wait_for_all)


def chains(program) -> None:
    """Deep chains of large objects, as many as the cluster has CPUs and
    more, spread over the nodes and over the fault window: a node that dies
    takes links with it, and a task waiting for a lost link must not hold a
    CPU that the link's re-run needs (the node-death deadlock). Every chain
    ends with its exact sum."""
    rng = program.rng
    cpus = int(sum(node["Resources"].get("CPU", 0) for node in tray.nodes() if node["Alive"]))
    width = min(rng.randint(max(1, cpus), max(1, cpus) + 2), 6)  # (bounded: sweep speed)
    depth = rng.randint(2, 4)
    size = 15_000  # 120 KB: past the inline limit, so links live in node stores
    for lane in range(width):
        ref = make_array.options(max_retries=-1, scheduling_strategy="SPREAD").remote(
            program.key(f"chain{lane}-0", retries=-1), size, float(lane))
        for link in range(depth):
            ref = array_plus_one.options(max_retries=-1, scheduling_strategy="SPREAD").remote(
                program.key(f"chain{lane}-{link + 1}", retries=-1), ref,
                rng.random() * 0.15)
        total = array_sum.options(max_retries=-1).remote(
            program.key(f"chain{lane}-sum", retries=-1), ref)
        program.expect(total, float(size * (lane + depth)), label=f"chain {lane} of {depth}")


def returns(program) -> None:
    """Several returns from tasks and actor methods, and refs inside results
    and arguments (borrowing chains), read after the faults."""
    rng = program.rng
    retries = program.task_retries()
    x = rng.randint(1, 50)
    a, b, c = triple.options(max_retries=retries).remote(program.key("triple"), x)
    program.expect(b, x + 1, label="second of three returns", retries=retries)
    program.expect(a, x, label="first of three returns", retries=retries)
    program.expect(c, [x, x], label="third of three returns", retries=retries)
    splitter = program.actor(Splitter.options(max_restarts=-1, max_task_retries=-1,
                                              num_cpus=0), program.key("splitter", retries=-1))
    for i in range(rng.randint(1, 4)):
        plus, minus = splitter.split.remote(i)
        program.expect(minus, -i, label=f"actor return 2 of call {i}", actor_call=True,
                       unlimited=True)
        program.expect(plus, i, label=f"actor return 1 of call {i}", actor_call=True,
                       unlimited=True)
    n = rng.randint(1, 4)
    outer = make_refs.options(max_retries=retries).remote(program.key("make refs"), n)
    program.expect(outer, program.ANY_LIST, label="refs inside a result", retries=retries)

    def read_inner() -> None:
        # After the faults: the inner refs' owner is the worker that made
        # them; it must still be there (not reaped as idle) unless a fault
        # killed it, and a task borrowing them in turn reads them too.
        try:
            inner = tray.get(outer, timeout=program.wait_timeout_s)
        except Exception:  # noqa: BLE001 - checked as the expectation of `outer`
            return
        for i, ref in enumerate(inner):
            program.expect(ref, i * 10, label=f"ref {i} inside a result", retries=retries)
        total = sum_boxed.options(max_retries=retries).remote(program.key("sum boxed"),
                                                              list(inner))
        program.expect(total, sum(i * 10 for i in range(n)), label="borrowed refs summed", retries=retries)
    program.later(read_inner)


def lineage(program, *, alone: bool = False) -> None:
    """A chain of large objects 3 to 5 levels deep on one node, which dies
    once the whole chain finished: every level's value is lost, and the
    driver, holding only the last ref, needs each level re-run from the one
    below it (lineage reconstruction of a lost argument, recursively). With
    retries left the value comes back. Run ``alone`` on a schedule with no
    killing fault, each level runs exactly twice; in ``mixed`` the node is
    only killed when the schedule kills anyway (a crash there would void the
    other pieces' exact counts)."""
    from tray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    rng = program.rng
    head = tray.get_runtime_context().get_node_id()
    others = sorted(node["NodeID"] for node in tray.nodes()
                    if node["Alive"] and node["NodeID"] != head)
    if not others:
        return
    victim = rng.choice(others)
    depth = rng.randint(3, 5)
    retries = rng.choice([1, 2, 3, -1])
    size = 15_000  # 120 KB: past the inline limit, so every level lives in the victim's store
    # Soft: the re-runs go wherever they can once the victim is gone.
    where = NodeAffinitySchedulingStrategy(victim, soft=True)
    keys = [program.key(f"lineage{level}", retries=retries) for level in range(depth)]
    ref = make_array.options(max_retries=retries, scheduling_strategy=where).remote(
        keys[0], size, 1.0)
    for level in range(1, depth):
        ref = array_plus_one.options(max_retries=retries, scheduling_strategy=where).remote(
            keys[level], ref, 0.0)
    clean = not program.kills
    kill = alone or program.kills
    if kill:
        ready, _ = tray.wait([ref], timeout=program.wait_timeout_s, fetch_local=False)
        if ready and victim in {node["NodeID"] for node in tray.nodes() if node["Alive"]}:
            program.kill_node(victim, restart_after_s=round(rng.uniform(0.05, 0.5), 3))
            if clean:
                for key in keys:
                    program.exact_executions(key, 2)
    program.expect(ref, ("array", size, float(depth)), label=f"lineage {depth} deep, rebuilt "
                   "after its node died", retries=retries, unlimited=retries < 0)
