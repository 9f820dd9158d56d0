"""The memory monitor: a node kills a worker before its machine runs out of
memory (Ray's OOM prevention).

Every ``memory_monitor_refresh_s`` the monitor reads the machine's memory
through the backend (``ProcessEnv.read_memory``: the real machine or
container in a local cluster, simulated memory in the simulator). When the
used fraction is above ``memory_usage_threshold`` it kills one worker,
chosen as Ray's default policy ("group by owner") does:

  1. work whose task is retried when its worker dies goes first; then tasks
     that are not retried; actors only when no task runs here;
  2. among the tasks of one kind, they are grouped by owner (non-retriable
     ones form a single group): the largest group, and among equal groups
     the one whose first lease is the newest;
  3. within the group, the most recently granted lease (grant order, not
     lease ids: those follow when resources were allocated).

The task is to be retried only if its group had other tasks (as Ray's
``should_retry``): the last task of an owner running here would only be
killed again, so it fails at once with ``OutOfMemoryError``. Killing the
newest work of the busiest owner frees memory while keeping the
oldest work, which has made the most progress, running. One kill per
refresh: the next reading sees the memory the dead worker gave back.

The owner of a killed task learns *why* its worker died by asking this node
(``worker_failure_cause``, by lease id), as a Ray owner asks its raylet:
the node keeps the cause of each kill (bounded: ``worker_kill_causes_max``,
the oldest go first). The owner retries a retriable task after a growing
delay, on a budget of its own (``task_oom_retries``, unlimited by default,
as Ray's), or fails it with ``OutOfMemoryError``. An actor
killed here dies with the cause as its death reason."""

from __future__ import annotations

import logging
from collections import OrderedDict
from dataclasses import dataclass

import trio

from ..interfaces import MemorySnapshot
from ..messages import WorkerFailureCause

logger = logging.getLogger("tray.node")


@dataclass(frozen=True)
class MemoryKill:
    """Why (and where) the monitor killed a worker: what its owner is told."""
    lease_id: int
    worker_id: str
    node_id: str
    used_bytes: int
    total_bytes: int
    threshold: float
    should_retry: bool  # its owner had other tasks running here

    def describe(self) -> str:
        gib = 1024 ** 3
        return (f"node {self.node_id} was running low on memory: "
                f"{self.used_bytes / gib:.2f} GiB used of {self.total_bytes / gib:.2f} GiB "
                f"({self.used_bytes / self.total_bytes:.3f}), above the memory usage "
                f"threshold {self.threshold} (memory_usage_threshold); the node killed worker "
                f"{self.worker_id[:8]}, the most recently started work. Use more memory per "
                "task (fewer at once, e.g. more num_cpus each), or raise the threshold "
                "(RAY_memory_usage_threshold); RAY_memory_monitor_refresh_ms=0 turns the "
                "monitor off")


@dataclass(frozen=True)
class MemoryMonitorStatistics:
    last_reading: MemorySnapshot | None
    kills: int


def choose_victim(leases) -> tuple[object, bool] | None:
    """(the lease whose worker goes, whether its task should be retried),
    or None (see the module docstring)."""
    tasks = [lease for lease in leases if lease.worker_id and lease.for_actor is None]
    actors = [lease for lease in leases if lease.worker_id and lease.for_actor is not None]
    for candidates in ([lease for lease in tasks if lease.retriable],
                       [lease for lease in tasks if not lease.retriable], actors):
        if not candidates:
            continue
        groups: dict = {}
        for lease in candidates:
            key = lease.owner if lease.retriable and lease.for_actor is None else ""
            groups.setdefault(key, []).append(lease)
        # Largest group; then the group whose oldest grant is the newest.
        group = max(groups.values(),
                    key=lambda members: (len(members), min(m.granted for m in members)))
        victim = max(group, key=lambda lease: lease.granted)
        return victim, victim.retriable and victim.for_actor is None and len(group) > 1
    return None


def _candidates(leases) -> str:
    """The leases the monitor chose among, for the trace (simtest checks the
    choice against the policy): ``lease:granted:retriable:actor:owner`` each,
    ``;``-separated (retriable 1/0; actor: its id, or empty)."""
    return ";".join(f"{lease.lease_id}:{lease.granted}:{int(lease.retriable)}:"
                    f"{lease.for_actor or ''}:{lease.owner}"
                    for lease in leases if lease.worker_id)


class MemoryMonitor:
    def __init__(self, *, node_id: str, config, tracer, read_memory, leases, pool) -> None:
        self._node_id = node_id
        self._trace_name = node_id[:8]
        self._config = config
        self._tracer = tracer
        self._read_memory = read_memory
        self._leases = leases
        self._pool = pool
        self.causes: OrderedDict[int, MemoryKill] = OrderedDict()
        self.kills = 0
        self.last_reading: MemorySnapshot | None = None

    def statistics(self) -> MemoryMonitorStatistics:
        return MemoryMonitorStatistics(self.last_reading, self.kills)

    def validate_state(self) -> None:
        assert len(self.causes) <= self._config.worker_kill_causes_max, len(self.causes)

    @property
    def enabled(self) -> bool:
        return self._read_memory is not None and self._config.memory_monitor_refresh_s > 0

    async def run(self) -> None:
        while True:
            await trio.sleep(self._config.memory_monitor_refresh_s)
            self.check()

    def check(self) -> MemoryKill | None:
        """Read the memory now and, above the threshold, kill one worker."""
        reading = self._read_memory()
        self.last_reading = reading
        threshold = self._config.memory_usage_threshold
        if reading.total_bytes <= 0 or reading.used_bytes / reading.total_bytes <= threshold:
            return None
        leases = sorted(self._leases.leases.values(), key=lambda lease: lease.lease_id)
        chosen = choose_victim(leases)
        if chosen is None:
            return None
        victim, should_retry = chosen
        kill = MemoryKill(victim.lease_id, victim.worker_id, self._node_id, reading.used_bytes,
                          reading.total_bytes, threshold, should_retry)
        self.causes[victim.lease_id] = kill
        while len(self.causes) > self._config.worker_kill_causes_max:
            self.causes.popitem(last=False)
        self.kills += 1
        self._tracer.record(self._trace_name, "memory_kill", lease=victim.lease_id,
                            worker=victim.worker_id, used_bytes=reading.used_bytes,
                            total_bytes=reading.total_bytes, candidates=_candidates(leases))
        logger.warning("%s", kill.describe())
        self._pool.kill_worker(victim.worker_id, f"killed by the memory monitor: "
                                                 f"{kill.describe()}")
        return kill

    def handle_worker_failure_cause(self, conn, lease_id: int) -> WorkerFailureCause | None:
        """Why the worker of this lease died, if this node killed it for
        memory (kind "out_of_memory", the message with the numbers); None
        when it is not known to have been killed here."""
        kill = self.causes.get(lease_id)
        if kill is None:
            return None
        return WorkerFailureCause("out_of_memory", kill.describe(), kill.should_retry)
