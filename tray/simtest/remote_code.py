"""The user code the simulated workers run, and the ledger it counts itself in.

Execution counting: the whole simulated cluster lives in this one process,
and the remote functions and classes here are pickled by reference (they
live in an importable module), so the "workers" run these very functions
and update the module-level ``LEDGER``. Each body counts itself under a key
its caller chose, which gives the runner the at-most-``1 + retries`` and the
per-caller actor ordering invariants without any help from the runtime.

``reset_ledger`` replaces ``LEDGER`` at the start of every seed: read it as
``remote_code.LEDGER``, never through a name imported once."""

from __future__ import annotations

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
    # Runs of the lifecycle pieces' code, in order: (key, function, worker id,
    # process address, the trace's virtual time); a run that got to its end also
    # counts ``<key>:end`` in ``executions``.
    runs: list = field(default_factory=list)
    # key -> [(node id hex, the trace's virtual time)]: where and when each
    # run of the body began (the placement and cancel checks read it).
    where: dict = field(default_factory=dict)
    tasks: dict = field(default_factory=dict)  # key -> the task id (hex) of each run

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
    from . import cluster

    LEDGER.where.setdefault(key, []).append((tray.get_runtime_context().get_node_id(),
                                             cluster().clock.current_time()))
    return LEDGER.ran(key)


def _log_call(actor_key: str, incarnation: int, caller: str, seq: int) -> None:
    LEDGER.ran(f"{actor_key}:{caller}:{seq}")
    LEDGER.actor_log.setdefault(actor_key, []).append((incarnation, caller, seq))


def _log_task(key: str) -> None:
    LEDGER.tasks.setdefault(key, []).append(tray.get_runtime_context().get_task_id())


def _log_worker(key: str, worker_id: str) -> None:
    LEDGER.workers.setdefault(key, []).append(worker_id)


def _log_run(key: str, function: str) -> None:
    from ..core.context import current_worker
    from . import cluster

    worker = current_worker.get(None)
    LEDGER.runs.append((key, function, tray.get_runtime_context().get_worker_id(),
                        getattr(worker, "address", ""), cluster().clock.current_time()))


def _gpu_span(node_id: str, gpu_ids: list, start_s: float, end_s: float,
              amount: float = 1.0) -> None:
    for gpu in gpu_ids:
        LEDGER.gpu_spans.setdefault((node_id, gpu), []).append((start_s, end_s, amount))


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

    def run(self, key: str, sleep_s: float) -> str:
        """Counts its run (``key``), sleeps, answers ``key``."""
        _ran(key)
        time.sleep(sleep_s)
        return key


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
def on_gpu(key: str, sleep_s: float, amount: float = 1.0) -> int:
    """Holds its GPU (``amount`` of it: its ``num_gpus``) for a while,
    logging which one, how much and when (virtual time)."""
    _ran(key)
    gpu_ids = list(tray.get_gpu_ids())
    node_id = tray.get_runtime_context().get_node_id()
    start_s = time.time()
    time.sleep(sleep_s)
    _gpu_span(node_id, gpu_ids, start_s, time.time(), amount)
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


# Cancellation's: a task that waits for its argument, one that logs its
# worker and its end, and a parent of such sleepers.


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
    _log_task(key)
    _log_worker(key, tray.get_runtime_context().get_worker_id())
    time.sleep(sleep_s)
    _ran(f"{key}:end")
    return key


@tray.remote
def sleeping_parent(key: str, children: int, sleep_s: float, depth: int = 1) -> int:
    """Starts ``children`` long sleepers (keys by this run's attempt), or
    with ``depth`` > 1 as many sleeping parents of their own, and waits for
    them: a recursive cancel of this task cancels every descendant, a plain
    one none. Logs its task id, when it has submitted them all, and its end."""
    attempt = _ran(key)
    _log_task(key)
    if depth > 1:
        refs = [sleeping_parent.options(max_retries=0).remote(
            f"{key}#{attempt}:{i}", children, sleep_s, depth - 1) for i in range(children)]
    else:
        refs = [long_sleeper.options(max_retries=0).remote(f"{key}#{attempt}:{i}", sleep_s)
                for i in range(children)]
    _ran(f"{key}#{attempt}:submitted")
    total = len(tray.get(refs))
    _ran(f"{key}:end")
    return total


# The lifecycle pieces' code (pieces_memory, pieces_lifecycle): tasks whose
# simulated memory rises as they work, an actor that holds memory, an actor
# whose calls say which incarnation ran them, and tasks whose workers are
# recycled (max_calls, idle exit) with objects owned by those workers.

GIB = 1024 ** 3


@tray.remote
def memory_hog(key: str, x: int, size_bytes: int, steps: int, step_s: float) -> int:
    """Allocates ``size_bytes`` of its machine's memory in ``steps`` steps,
    ``step_s`` apart (its memory rises with its work), then frees it all."""
    from . import cluster

    _ran(key)
    _log_run(key, "memory_hog")
    sim = cluster()
    for _ in range(steps):
        sim.allocate_memory(size_bytes // steps)
        time.sleep(step_s)
    sim.free_memory()
    _ran(f"{key}:end")
    _log_run(key, "memory_hog:end")
    return x * x + 1


@tray.remote
class MemoryActor:
    """An actor that holds memory for a while when asked (the monitor kills
    it only when no task runs on its node), and answers pings."""

    def __init__(self, key: str) -> None:
        self.key = key
        self.incarnation = _ran(f"{key}:init")

    def grab(self, size_bytes: int, hold_s: float) -> int:
        from . import cluster

        _log_run(f"{self.key}:grab", "MemoryActor.grab")
        sim = cluster()
        sim.allocate_memory(size_bytes)
        time.sleep(hold_s)
        sim.free_memory()
        return self.incarnation

    def ping(self, x: int) -> tuple:
        return x * x, self.incarnation


@tray.remote
class Counter:
    """An actor whose calls log their caller, sequence and incarnation, and
    their end, and answer with the incarnation that ran them."""

    def __init__(self, key: str) -> None:
        self.key = key
        self.incarnation = _ran(f"{key}:init")

    def step(self, caller: str, seq: int, x: int, sleep_s: float) -> tuple:
        _log_call(self.key, self.incarnation, caller, seq)
        time.sleep(sleep_s)
        _ran(f"{self.key}:{caller}:{seq}:end")
        return x * x, self.incarnation


def _recycled_body(key: str, function: str, x: int, boxes: int) -> tuple:
    _ran(key)
    _log_run(key, function)
    refs = [tray.put(x * 10 + i) for i in range(boxes)]
    _ran(f"{key}:end")
    return x * x, refs


@tray.remote(max_calls=1)
def recycled_1(key: str, x: int, boxes: int) -> tuple:
    return _recycled_body(key, "recycled_1", x, boxes)


@tray.remote(max_calls=2)
def recycled_2(key: str, x: int, boxes: int) -> tuple:
    return _recycled_body(key, "recycled_2", x, boxes)


@tray.remote(max_calls=3)
def recycled_3(key: str, x: int, boxes: int) -> tuple:
    return _recycled_body(key, "recycled_3", x, boxes)


@tray.remote
def reused(key: str, x: int, boxes: int) -> tuple:
    """No max_calls: its worker goes back idle, and may be reaped as idle
    unless it owns objects still referenced (the ``boxes`` it put)."""
    return _recycled_body(key, "reused", x, boxes)


MAX_CALLS = {"recycled_1": 1, "recycled_2": 2, "recycled_3": 3}
RECYCLED = {"recycled_1": recycled_1, "recycled_2": recycled_2, "recycled_3": recycled_3}


@tray.remote
class MemoryOwner:
    """A second owner of memory hogs (the monitor groups tasks by owner):
    submits them and hands the refs (which it owns) to the driver."""

    def submit(self, items: list) -> list:
        return [memory_hog.options(max_retries=retries, num_cpus=cpus).remote(
                    key, x, size_bytes, steps, step_s)
                for key, x, size_bytes, steps, step_s, retries, cpus in items]
