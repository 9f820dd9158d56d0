"""The reference model: what a workload expects of every ref it submits.

A workload is handed a ``Program``: the seed's RNG (``{seed}:workload``),
unique keys for counting executions, and ``expect`` to record, for each ref
it will check, the value the model says it has (or the error, or a
sentinel such as ``ANY_INT``) with the retry budget behind it. The runner
reads every expectation after the faults stop and the checks (``checks``)
judge each answer against it; the program's other records (execution
limits, actor calls, cancels, its own node kills) feed the same checks."""

from __future__ import annotations

import random
from dataclasses import dataclass

import tray
from tray import exceptions

WAIT_TIMEOUT_S = 5.0
# A ref `wait(fetch_local=True)` reported ready answers `get` within this.
READY_GET_S = 0.05


class _Sentinel:
    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name


class Shaped:
    """An expected value judged by a predicate (compares equal to a value
    the predicate accepts), with the model's description for messages."""

    def __init__(self, description: str, accepts) -> None:
        self.description = description
        self.accepts = accepts

    def __eq__(self, other) -> bool:
        return bool(self.accepts(other))

    __hash__ = None

    def __repr__(self) -> str:
        return self.description


@dataclass
class WaitCall:
    """One ``tray.wait`` as the driver made it (``Program.timed_wait``):
    what it was given, when it was called and returned (the trace's
    virtual time), and which positions of ``refs`` it returned ready."""
    label: str
    tasks: list  # the task (hex) behind each ref, in the order given
    num_returns: int
    timeout: float | None
    fetch_local: bool
    inline: bool  # small results, ready in the driver once their task finished
    started_s: float
    returned_s: float
    ready: list  # positions in the order given
    pending: list


@dataclass
class ExpectError:
    error_class: type


@dataclass
class Expectation:
    ref: object
    expected: object
    label: str
    app_retries: bool = False  # the task retries application errors
    # Retried and restarted without limit (max_retries=-1, or an actor with
    # max_restarts=-1 and max_task_retries=-1): no fault may make it give up
    # (GIVING_UP_ERRORS), only take longer.
    unlimited: bool = False
    # The finite budget of the work behind this ref: a task's max_retries, or
    # an actor's max_restarts for its calls (None: not known or unlimited).
    # Giving up (GIVING_UP_ERRORS) needs the budget spent: so many retries
    # of the task that gave up, or restarts of the actor (``actor``: its id).
    budget: int | None = None
    actor: str | None = None
    # Only the expected outcome will do, whatever the faults (a cancelled
    # task that never started has nothing a fault could change).
    strict: bool = False


class Program:
    """What a workload sees: the seed's RNG, unique keys for execution
    counting, and ``expect`` to record the reference model's answers."""

    ANY_INT = _Sentinel("ANY_INT")
    ANY_LIST = _Sentinel("ANY_LIST")
    CANCELLED_OR_VALUE = _Sentinel("CANCELLED_OR_VALUE")

    def __init__(self, seed: int, kills: bool) -> None:
        self.rng = random.Random(f"{seed}:workload")
        self.kills = kills
        self.schedule: list = []  # the seed's faults (faults.Fault), set by the runner
        self.wait_timeout_s = WAIT_TIMEOUT_S
        self.expectations: list[Expectation] = []
        self.limits: dict[str, int] = {}  # execution key -> max executions (-1: any)
        self.exact: dict[str, int] = {}
        self.actor_calls: dict[str, dict] = {}  # actor key -> {(caller, seq): limit}
        self.actors: list = []
        self.placement_groups: list = []  # removed at quiescence
        self.laters: list = []
        self.max_restarts: dict[str, int] = {}  # actor key -> its finite max_restarts
        self.cluster = None  # the simulated cluster, once the values are checked
        self.not_ready: list[str] = []  # refs wait reported ready that get did not answer
        self.cancels: list[tuple] = []  # (key, runs when cancelled, force, task id hex)
        self.cancelled_prefixes: list[tuple] = []  # (key prefix, parent task hex)
        self.own_faults: list[str] = []  # faults the workload itself caused (kill_node)
        self.waits: list[WaitCall] = []  # every timed_wait, for check_waits
        # (execution key, strategy kind, target): where the work behind the
        # key must run (check_placements): ("group", pg hex, bundle index),
        # ("node", node hex, soft), ("spread", batch name, alive nodes),
        # ("local", the driver's node hex, when it was submitted)
        self.placements: list[tuple] = []
        self.group_strategies: dict[str, str] = {}  # placement group hex -> its strategy
        # Non-recursive cancels: (children's key prefix, the parent's task hex);
        # their children are left alone (check_cancels).
        self.uncancelled_prefixes: list[tuple] = []
        self._keys = 0
        self._retries = 0

    def key(self, name: str, retries: int | None = None) -> str:
        self._keys += 1
        key = f"{name}-{self._keys}"
        retries = self._retries if retries is None else retries
        self.limits[key] = -1 if retries < 0 else 1 + retries
        return key

    def task_retries(self) -> int:
        self._retries = self.rng.choice([0, 1, 3, -1] if self.kills else [0, 3])
        return self._retries

    def expect(self, ref, expected, *, label: str, app_retries: bool = False,
               unlimited: bool = False, retries: int | None = None,
               max_restarts: int | None = None, actor=None, strict: bool = False,
               **_details) -> None:
        """Record the model's answer for ``ref``. ``retries`` (the
        max_retries every task behind it has at least), or ``max_restarts``
        with the ``actor`` handle for a call, give the finite budget that
        must be spent before it may fail for a crash; ``_details``
        (actor_call=True, nested=True, ...) only document the call site."""
        budget = retries if retries is not None else max_restarts
        if budget is not None and budget < 0:
            budget = None
        actor_id = str(actor._actor_id) if actor is not None else None
        self.expectations.append(Expectation(ref, expected, label, app_retries, unlimited,
                                             budget, actor_id, strict))

    def cancelled_run(self, key: str, runs: int, force: bool, task: str | None = None) -> None:
        """``key``'s task was cancelled while its ``runs``-th run was going:
        it never runs again nor reaches its end, and with ``force`` the
        worker of that run is gone. ``task`` (its id, hex) lets the check
        count a retry that began before the cancel as the run it cancelled."""
        self.cancels.append((key, runs, force, task))

    def cancelled_children(self, prefix: str, task: str | None = None) -> None:
        """A recursive cancel: no child whose key starts with ``prefix``
        reaches its end — if the cancel found its parent (``task``, hex)
        unfinished: a parent that had ended by itself (a child lost with its
        node failed it) is not cancelled, nor are its children, as in Ray
        (mixed default seed 3261)."""
        self.cancelled_prefixes.append((prefix, task))

    def timed_wait(self, refs: list, *, num_returns: int = 1, timeout: float | None,
                   fetch_local: bool = True, label: str, inline: bool = False) -> tuple:
        """``tray.wait``, recorded with when it was called and returned, for
        ``check_waits``: it returns as soon as ``num_returns`` refs are ready
        (``inline``: small results of tasks the driver submitted, ready once
        the trace shows their task finished), never before with fewer unless
        its timeout passed, and the first ready ones in the order given."""
        from . import cluster

        clock = cluster().clock
        started_s = clock.current_time()
        ready, pending = tray.wait(refs, num_returns=num_returns, timeout=timeout,
                                   fetch_local=fetch_local)
        returned_s = clock.current_time()
        position = {ref: i for i, ref in enumerate(refs)}
        self.waits.append(WaitCall(label, [ref.task_id().hex() for ref in refs], num_returns,
                                   timeout, fetch_local, inline, started_s, returned_s,
                                   [position.get(ref, -1) for ref in ready],
                                   [position.get(ref, -1) for ref in pending]))
        return ready, pending

    def placed(self, key: str, kind: str, target, detail=None) -> None:
        """Every run of ``key``'s body must be where its strategy puts it
        (``check_placements``): ``group`` (``target`` the placement group's
        hex id, ``detail`` the bundle index, -1 any): on a node holding that
        bundle; ``node`` (``target`` a node's hex id, ``detail`` soft): on
        that node (soft: unless it died or was cut off); ``local``
        (``target`` the driver's node, idle at ``detail``, the virtual time
        it was submitted): there, unless that node took other work since;
        ``spread``
        (``target`` the batch's name): the batch's tasks spread over the
        nodes alive throughout."""
        self.placements.append((key, kind, target, detail))

    def uncancelled_children(self, prefix: str, task: str | None = None) -> None:
        """A cancel with recursive=False of a parent (``task``, hex): its
        children (keys starting with ``prefix``) are left alone and, without
        a killing fault, each runs once to its end."""
        self.uncancelled_prefixes.append((prefix, task))

    def error(self, error_class) -> ExpectError:
        return ExpectError(error_class)

    def actor(self, actor_class, key: str | None = None):
        handle = actor_class.remote(key) if key is not None else actor_class.remote()
        self.actors.append(handle)
        return handle

    def actor_call(self, actor_key: str, caller: str, seq: int, max_task_retries: int) -> None:
        limit = -1 if max_task_retries < 0 else 1 + max_task_retries
        self.actor_calls.setdefault(actor_key, {})[(caller, seq)] = limit

    def check_ready(self, refs: list, label: str) -> None:
        """``wait(fetch_local=True)`` reported ``refs`` ready: ``get`` must
        answer each (a value or its error) without waiting on work or
        transfers."""
        for ref in refs:
            try:
                tray.get(ref, timeout=READY_GET_S)
            except exceptions.GetTimeoutError:
                self.not_ready.append(f"{label}: wait reported {ref!r} ready, and get did not "
                                      f"answer within {READY_GET_S} s of virtual time")
            except Exception:  # noqa: BLE001 - a ready error is ready
                pass

    def actor_restarts(self, actor_key: str, max_restarts: int) -> None:
        """The actor may come back at most ``max_restarts`` times."""
        if max_restarts >= 0:
            self.max_restarts[actor_key] = max_restarts

    def exact_executions(self, key: str, count: int) -> None:
        self.exact[key] = count

    def placement_group(self, bundles: list, strategy: str):
        from ..util import placement_group

        group = placement_group(bundles, strategy=strategy)
        self.placement_groups.append(group)
        self.group_strategies[group.id.hex()] = strategy
        return group

    def later(self, fn) -> None:
        self.laters.append(fn)

    def kill_node(self, node_id: str, restart_after_s: float | None) -> None:
        """A workload's own node crash, at a moment the program chose (the
        lineage workload's: after the work on that node finished; the
        autoscaler's: a scaled node mid-burst, never restarted). It is
        recorded like the injector's faults, so the checks attribute what it
        causes, and from then on the errors of killed processes are
        permitted."""
        from . import cluster as current_cluster

        cluster = current_cluster()
        restart = "never" if restart_after_s is None else f"{restart_after_s:.3f}"
        what = (f"t={cluster.clock.current_time():.3f}s node_crash "
                f"restart_after_s={restart} node={node_id[:8]} (by the workload)")
        cluster.trace.record("simtest", "fault", what=what)
        self.own_faults.append(what)
        self.kills = True
        cluster.kill_node(node_id, restart_after_s=restart_after_s)
