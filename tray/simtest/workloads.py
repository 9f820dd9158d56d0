"""Randomized tray programs with reference models that know the right answers.

Each workload is a function ``(program) -> None`` that submits work through
the public API and records, for every ref it will check, what the reference
model expects (``program.expect``). The runner then gets every ref after the
faults stop and checks the value, or that the error is one the injected
faults and the task's options permit.

Execution counting: the whole simulated cluster lives in this one process,
and the remote functions and classes here are pickled by reference (they
live in an importable module), so the "workers" run these very functions
and update the module-level ``LEDGER``. Each body counts itself under a key
its caller chose, which gives the runner the at-most-``1 + retries`` and the
per-caller actor ordering invariants without any help from the runtime.

Randomness comes only from ``program.rng`` (``random.Random(f"{seed}:workload")``).
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field

import numpy as np

import tray

# ================================================================ the ledger


@dataclass
class Ledger:
    """What the simulated user code did, as seen from inside it."""
    executions: dict = field(default_factory=dict)  # key -> times the body ran
    # actor key -> [(incarnation, caller, seq)] in execution order
    actor_log: dict = field(default_factory=dict)
    # (node id, GPU id) -> [(start, end)] of finished GPU task bodies, virtual time
    gpu_spans: dict = field(default_factory=dict)
    workers: dict = field(default_factory=dict)  # key -> ids of the workers that ran it

    def ran(self, key: str) -> int:
        count = self.executions.get(key, 0) + 1
        self.executions[key] = count
        return count


LEDGER = Ledger()


def reset_ledger() -> Ledger:
    global LEDGER
    LEDGER = Ledger()
    return LEDGER


# Remote functions and classes reach the ledger only through these plain
# module-level functions: cloudpickle pickles them by reference (a decorated
# remote function itself is pickled by value, with copies of its globals).

def _ran(key: str) -> int:
    return LEDGER.ran(key)


def _log_call(actor_key: str, incarnation: int, caller: str, seq: int) -> None:
    LEDGER.ran(f"{actor_key}:{caller}:{seq}")
    LEDGER.actor_log.setdefault(actor_key, []).append((incarnation, caller, seq))


def _log_worker(key: str, worker_id: str) -> None:
    LEDGER.workers.setdefault(key, []).append(worker_id)


def _gpu_span(node_id: str, gpu_ids: list, start_s: float, end_s: float) -> None:
    for gpu in gpu_ids:
        LEDGER.gpu_spans.setdefault((node_id, gpu), []).append((start_s, end_s))


class FlakyError(Exception):
    """Raised on purpose by ``flaky`` until it has failed often enough."""


# ============================================================ remote code


@tray.remote
def leaf(key: str, x: int, sleep_s: float = 0.0) -> int:
    _ran(key)
    if sleep_s:
        time.sleep(sleep_s)
    return x * x


@tray.remote
def add(key: str, a, b):
    _ran(key)
    return a + b


@tray.remote
def fan_in(key: str, *values) -> int:
    _ran(key)
    return sum(values)


@tray.remote
def nested_sum(key: str, n: int, depth: int) -> int:
    """sum(i*i for i < n), through child tasks ``depth`` levels deep."""
    attempt = _ran(key)
    if depth <= 1:
        children = [leaf.remote(f"{key}#{attempt}:{i}", i) for i in range(n)]
    else:
        children = [nested_sum.remote(f"{key}#{attempt}:{i}", i + 1, depth - 1)
                    for i in range(n)]
    return sum(tray.get(children))


@tray.remote
def make_array(key: str, size: int, fill: float):
    _ran(key)
    return np.full(size, fill, dtype=np.float64)


@tray.remote
def array_plus_one(key: str, array, sleep_s: float):
    """One link of a chain of large objects, slow enough that the chain
    spans the fault window."""
    _ran(key)
    time.sleep(sleep_s)
    return array + 1.0


@tray.remote
def array_sum(key: str, array) -> float:
    _ran(key)
    return float(array.sum())


@tray.remote
def flaky(key: str, failures: int) -> int:
    """Fails its first ``failures`` executions, then returns the attempt number."""
    attempt = _ran(key)
    if attempt <= failures:
        raise FlakyError(f"{key}: planned failure {attempt} of {failures}")
    return attempt


@tray.remote
def sleeper(key: str, sleep_s: float) -> str:
    _ran(key)
    time.sleep(sleep_s)
    return key


@tray.remote
class Account:
    """A ledger actor: deposits from several callers, each call logged with
    its caller and that caller's sequence number."""

    def __init__(self, key: str) -> None:
        self.key = key
        self.incarnation = _ran(f"{key}:init")
        self.balance = 0

    def deposit(self, caller: str, seq: int, amount: int) -> int:
        _log_call(self.key, self.incarnation, caller, seq)
        self.balance += amount
        return self.balance

    def total(self, caller: str, seq: int) -> int:
        _log_call(self.key, self.incarnation, caller, seq)
        return self.balance


@tray.remote
class Squarer:
    """A stateless actor: however often it restarts, and however often a
    call is re-sent, each call's value is exact."""

    def __init__(self, key: str) -> None:
        _ran(f"{key}:init")

    def square(self, x: int, sleep_s: float) -> int:
        time.sleep(sleep_s)
        return x * x


def _balances(total: int, fallible: list[int]):
    """What a balance may be: ``total``, less the amounts of any of the
    ``fallible`` deposits (whose calls may have failed without running)."""
    if not fallible:
        return total
    return ("one of", *sorted({total - sum(chosen) for size in range(len(fallible) + 1)
                               for chosen in itertools.combinations(fallible, size)}))


@tray.remote
def account_caller(key: str, account, caller: str, amounts: list) -> list:
    """A task that calls an actor: each caller's calls keep their order."""
    _ran(key)
    refs = [account.deposit.remote(caller, seq, amount) for seq, amount in enumerate(amounts)]
    return tray.get(refs)


@tray.remote(num_returns=3)
def triple(key: str, x: int):
    _ran(key)
    return x, x + 1, [x] * 2


@tray.remote
def make_refs(key: str, n: int) -> list:
    """A result holding refs this task's worker owns: the caller borrows
    them, and the worker must outlive its idle time while they are in use."""
    _ran(key)
    return [tray.put(i * 10) for i in range(n)]


@tray.remote
def sum_boxed(key: str, boxed: list) -> int:
    """Reads refs it got inside a list (borrowed, not resolved for it)."""
    _ran(key)
    return sum(tray.get(boxed))


@tray.remote(num_gpus=1)
def on_gpu(key: str, sleep_s: float) -> int:
    """Holds its GPU for a while, logging which one and when (virtual time)."""
    _ran(key)
    gpu_ids = list(tray.get_gpu_ids())
    node_id = tray.get_runtime_context().get_node_id()
    start_s = time.time()
    time.sleep(sleep_s)
    _gpu_span(node_id, gpu_ids, start_s, time.time())
    return len(gpu_ids)


@tray.remote
class Splitter:
    """An actor whose method returns several objects."""

    def __init__(self, key: str) -> None:
        _ran(f"{key}:init")

    @tray.method(num_returns=2)
    def split(self, x: int):
        return x, -x


@tray.remote
class Holder:
    """Keeps a ref it was given inside a list (so it is borrowed, not
    resolved) and reads it later."""

    def __init__(self) -> None:
        self.held = []

    def hold(self, boxed: list) -> bool:
        self.held.append(boxed[0])
        return True

    def read(self) -> float:
        return float(sum(float(np.asarray(tray.get(ref)).sum()) for ref in self.held))


# ================================================================ programs

# Every workload piece is a function (program) -> None.


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


def wait_loop(program) -> None:
    """``wait`` over small and large results, with and without
    ``fetch_local``, with short and long timeouts: with ``fetch_local``
    every ref it reports ready must be ready (``Program.check_ready``)."""
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
        ready, pending = tray.wait(pending, num_returns=1, timeout=timeout_s,
                                   fetch_local=fetch_local)
        if fetch_local:  # (otherwise a ready object may still be a transfer away)
            program.check_ready(ready, "wait loop (fetch_local)")
        for ref in ready:
            program.expect(ref, expected[ref], label="wait loop", unlimited=retries < 0,
                           retries=retries)
    for ref in pending:
        program.expect(ref, expected[ref], label="wait loop (late)", unlimited=retries < 0,
                       retries=retries)


def actors(program) -> None:
    """A ledger actor with several callers: the driver and tasks."""
    rng = program.rng
    key = program.key("account")
    restarts = rng.choice([0, 0, 1, 3]) if program.kills else 0
    task_retries = rng.choice([0, 1, -1]) if restarts else 0
    options = {"max_restarts": restarts, "max_task_retries": task_retries}
    style = rng.choice(["plain", "named", "detached"])
    if style != "plain":
        options["name"] = f"{key}-{style}"
    if style == "detached":
        options["lifetime"] = "detached"
    account = program.actor(Account.options(**options), key)
    program.actor_restarts(key, restarts)
    if style != "plain":
        account = tray.get_actor(options["name"])
    state_safe = restarts == 0  # restarted actors lose their balance
    amounts_total = 0
    callers = rng.randint(1, 3)  # caller tasks block in get() on their calls
    driver_amounts = [rng.randint(1, 9) for _ in range(rng.randint(1, 6))]
    # Some amounts come from tasks, so calls become ready out of order and
    # the actor must hold the early arrivals back.
    running = 0
    # The amounts of earlier deposits whose argument is a task's result: a
    # task whose retries all died fails its call, which never runs (the
    # actor goes on), so a balance lacks any of these (chaos seed 586).
    fallible: list[int] = []
    for seq, amount in enumerate(driver_amounts):
        arg = amount
        from_task = rng.random() < 0.4
        if from_task:
            arg = add.remote(program.key("amount", retries=3), amount, 0)
        ref = account.deposit.remote("driver", seq, arg)
        running += amount
        program.expect(ref, _balances(running, fallible) if state_safe and callers == 1
                       else program.ANY_INT, actor_call=True, max_task_retries=task_retries,
                       label="deposit", max_restarts=restarts, actor=account)
        program.actor_call(key, "driver", seq, task_retries)
        if from_task:
            fallible.append(amount)
    amounts_total += sum(driver_amounts)
    for c in range(1, callers):
        amounts = [rng.randint(1, 9) for _ in range(rng.randint(1, 5))]
        caller = program.key(f"caller{c}", retries=0)
        ref = account_caller.options(max_retries=0).remote(caller, account, caller, amounts)
        program.expect(ref, program.ANY_LIST, label="actor caller task", nested=True)
        amounts_total += sum(amounts)
        for seq in range(len(amounts)):
            program.actor_call(key, caller, seq, task_retries)
    final = account.total.remote("driver", len(driver_amounts))
    program.actor_call(key, "driver", len(driver_amounts), task_retries)
    if callers == 1:
        program.expect(final, _balances(amounts_total, fallible) if state_safe
                       else program.ANY_INT, actor_call=True,
                       max_task_retries=task_retries, label="final balance",
                       max_restarts=restarts, actor=account)
    else:
        program.expect(final, program.ANY_INT, actor_call=True, max_task_retries=task_retries,
                       label="balance", max_restarts=restarts, actor=account)


def restarts(program) -> None:
    """Long-lived actors with unlimited restarts and re-sent calls, called
    throughout the fault window: every call must come back with its value."""
    rng = program.rng
    cpus = 0  # holding CPU for the whole run would starve the 1-CPU tasks of other pieces
    actors = [program.actor(Squarer.options(max_restarts=-1, max_task_retries=-1,
                                            num_cpus=cpus), program.key("squarer", retries=-1))
              for _ in range(rng.randint(1, 3))]
    for i in range(rng.randint(10, 40)):
        ref = actors[i % len(actors)].square.remote(i, rng.random() * 0.05)
        program.expect(ref, i * i, label=f"call {i} to a restarting actor", actor_call=True,
                       unlimited=True)


def restarts_unretried(program) -> None:
    """An actor with Ray's default ``max_task_retries=0`` (each call at most
    once) and unlimited restarts, whose process the workload crashes itself
    between calls, none in flight: each call made after a crash (before the
    GCS heard of it, during the restart, or after) cannot have run on the
    dead process, so it waits for the new one and comes back with its
    value. Under a schedule that kills, a fault may cut a call off (then it
    may fail); under one that does not, every call must succeed. Not a
    piece of ``mixed``: its own kills would make every seed a killing one."""
    rng = program.rng
    sim = tray.simtest.cluster()
    squarer = program.actor(Squarer.options(max_restarts=-1, max_task_retries=0, num_cpus=0),
                            program.key("unretried", retries=-1))
    for i in range(rng.randint(2, 5)):
        ref = squarer.square.remote(i, rng.random() * 0.02)
        program.expect(ref, i * i, label=f"call {i} after {i} crash(es) of its actor",
                       actor_call=True)
        try:
            tray.get(ref)  # none in flight at the crash (the value is checked later)
        except Exception:  # noqa: BLE001 - judged with the other expectations
            pass
        try:
            sim.kill_actor_worker(squarer)
        except tray.exceptions.TrayError:
            pass  # the GCS is restarting: no crash this round
        time.sleep(rng.choice([0.0, rng.random() * 0.05, rng.random() * 0.5]))


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
        ref = leaf.options(num_cpus=0, memory=1e6, max_retries=-1,
                           scheduling_strategy=where).remote(
            program.key("in-group", retries=-1), i, rng.random() * 0.1)
        program.expect(ref, i * i, label=f"task {i} in a {strategy} group")
    if rng.random() < 0.5:
        where = PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=0)
        squarer = program.actor(Squarer.options(num_cpus=0, memory=1e6, max_restarts=-1,
                                                max_task_retries=-1, scheduling_strategy=where),
                                program.key("grouped-squarer", retries=-1))
        for i in range(rng.randint(1, 5)):
            program.expect(squarer.square.remote(i, rng.random() * 0.05), i * i,
                           label=f"call {i} to an actor in a group", actor_call=True)


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


@tray.remote
def gated(key: str, gate) -> int:
    """Runs only once its argument exists: cancelled before that, never."""
    _ran(key)
    return gate


@tray.remote
def long_sleeper(key: str, sleep_s: float) -> str:
    """Logs its worker when it starts and its end when it gets there: a
    cancelled run never ends, and a force-cancelled one's worker is gone."""
    _ran(key)
    _log_worker(key, tray.get_runtime_context().get_worker_id())
    time.sleep(sleep_s)
    _ran(f"{key}:end")
    return key


@tray.remote
def sleeping_parent(key: str, children: int, sleep_s: float) -> int:
    """Starts ``children`` long sleepers (keys by this run's attempt) and
    waits for them: a recursive cancel of this task cancels them too."""
    attempt = _ran(key)
    refs = [long_sleeper.options(max_retries=0).remote(f"{key}#{attempt}:{i}", sleep_s)
            for i in range(children)]
    return len(tray.get(refs))


def _until_started(program, key: str, ref, at_least: int = 1, polls: int = 60) -> int:
    """Lets virtual time run (0.02 s at a time) until ``key``'s body ran
    ``at_least`` times or ``ref`` is done; returns how often it ran."""
    for _ in range(polls):
        if LEDGER.executions.get(key, 0) >= at_least:
            break
        ready, _ = tray.wait([ref], timeout=0.02, fetch_local=False)
        if ready:
            break
    return LEDGER.executions.get(key, 0)


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
    # Recursive: a parent waiting on its children, cancelled with them.
    if rng.random() < 0.5:
        recursive = rng.random() < 0.7
        parent_key = program.key("parent", retries=0)
        # Children a recursive cancel stops sleep long (reaching their end is
        # the bug); a plain cancel leaves them running, as Ray's does, so they
        # are short: three in a row on one CPU must end within QUIESCE_S, or
        # their lease is still taken then (cancel seed 236 under chaos).
        parent = sleeping_parent.options(max_retries=0).remote(parent_key, rng.randint(1, 3),
                                                               5.0 if recursive else 1.0)
        ran = _until_started(program, parent_key, parent)
        tray.cancel(parent, force=False, recursive=recursive)
        program.expect(parent, program.CANCELLED_OR_VALUE if not ran else
                       program.error(tray.exceptions.TaskCancelledError),
                       label=f"parent cancelled (recursive={recursive})")
        if ran and recursive:
            program.cancelled_children(f"{parent_key}#{ran}:", task=parent.task_id().hex())
    # Finished: a cancel after the end changes nothing.
    done = leaf.options(max_retries=3).remote(program.key("done", retries=3), 7)
    tray.wait([done], timeout=program.wait_timeout_s, fetch_local=False)
    finished = bool(tray.wait([done], timeout=0, fetch_local=False)[0])
    tray.cancel(done)
    program.expect(done, 49 if finished else program.CANCELLED_OR_VALUE,
                   label="cancelled after it finished")


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


def named(program) -> None:
    """A named actor (detached or not), looked up by name only after the
    faults, GCS restarts included: the name survives, and so does the actor
    (it restarts without limit)."""
    rng = program.rng
    name = program.key("named")
    detached = rng.random() < 0.5
    options = {"name": name, "max_restarts": -1, "max_task_retries": -1, "num_cpus": 0}
    if detached:
        options["lifetime"] = "detached"
    handle = program.actor(Squarer.options(**options), program.key("named init", retries=-1))
    x = rng.randint(2, 30)
    program.expect(handle.square.remote(x, 0.0), x * x, label="named actor, first call",
                   actor_call=True, unlimited=True)

    def look_up() -> None:
        found = tray.get_actor(name)  # raises ValueError if the name was lost
        program.expect(found.square.remote(x + 1, 0.0), (x + 1) ** 2,
                       label=f"named actor ({'detached' if detached else 'owned'}) found "
                             "by name after the faults", actor_call=True, unlimited=True)
    program.later(look_up)


def gpus(program) -> None:
    """GPU tasks on nodes with GPUs: at the end, no GPU id of a node was held
    by two task bodies at once (``check_gpu_exclusive``)."""
    if not tray.cluster_resources().get("GPU"):
        return
    rng = program.rng
    retries = program.task_retries()
    for i in range(rng.randint(2, 8)):
        ref = on_gpu.options(max_retries=retries).remote(program.key(f"gpu{i}"),
                                                         rng.random() * 0.2)
        program.expect(ref, 1, label=f"GPU task {i}", retries=retries)


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


def check_gpu_exclusive(ledger: Ledger) -> str | None:
    """Why the ledger shows a GPU held twice at once, or None."""
    for (node_id, gpu), spans in sorted(ledger.gpu_spans.items()):
        spans = sorted(spans)
        for (start_a, end_a), (start_b, _end_b) in zip(spans, spans[1:], strict=False):
            if start_b < end_a:
                return (f"GPU {gpu} of node {node_id[:8]} was held by two tasks at once: "
                        f"[{start_a:.6f}, {end_a:.6f}) and from {start_b:.6f}")
    return None


PIECES = {
    "dag": dag, "nested": nested, "objects": objects, "wait": wait_loop, "actors": actors,
    "retries": retries, "cancel": cancellation, "restarts": restarts,
    "groups": placement_groups, "chains": chains, "returns": returns, "named": named,
    "gpus": gpus, "lineage": lineage,
}


def mixed(program) -> None:
    names = sorted(PIECES)
    for _ in range(program.rng.randint(3, 6)):
        PIECES[program.rng.choice(names)](program)


def _library_workloads() -> dict:
    """The libraries' workloads (tray.data, tray.tune, ...): each library keeps
    its programs and reference models in a module ``workloads_<library>.py``
    beside this one, exporting a ``WORKLOADS`` dict of its own."""
    import importlib
    import os
    import pkgutil

    found: dict = {}
    here = os.path.dirname(__file__)
    for info in sorted(pkgutil.iter_modules([here]), key=lambda info: info.name):
        if info.name.startswith("workloads_"):
            module = importlib.import_module(f"{__package__}.{info.name}")
            found.update(module.WORKLOADS)
    return found


WORKLOADS = {**PIECES, "mixed": mixed, "lineage": lambda program: lineage(program, alone=True),
             "restarts_unretried": restarts_unretried,
             **_library_workloads()}
