"""A node's worker processes: started on demand, handed out idle, reaped.

A worker is started through the backend's ``Spawner`` (a subprocess, or a
simulated process) and registers when ready. Each worker is in one state
(a ``WorkerState``):

  starting -> idle <-> leased      (runs normal tasks for one owner at a time)
                   \\-> actor       (hosts one actor until it dies)
  any -> dead

A worker that ran a task with GPUs only ever runs tasks with GPUs, and one
that ran a CPU-only task only CPU-only tasks (``WorkerInfo.gpu``), as in
Ray: state a GPU library left in a process (a CUDA context, memory it
holds) stays out of CPU-only work, and the reverse. In the same way a
worker belongs to the runtime_env of its first lease
(``WorkerInfo.runtime_env_hash``, from the lease request): its process was
set up for that env (code on ``sys.path``, cwd, environment variables, a pip
env's packages) and runs only tasks and actors of that env. A worker started
for an env has its ``env_vars`` in its environment from the start (read
once per env from the GCS, where the submitter stored the env); a
prestarted worker takes an env only if it sets no variables.

Idle workers beyond one per CPU (or the prestart count) are stopped after
``idle_worker_timeout_s``. At most ``workers_per_node_max`` live at once: a
lease that needs a worker beyond that waits until one is free, as an actor
stays pending in Ray when a node cannot start more. The node says so where
the caller looks (``worker_limit_waits``, in its demand report: the state
API gives a waiting actor's reason, ``tray status`` the node at its cap).
At the cap a freed worker goes to a waiting task before a waiting actor
creation (FIFO within each): an actor keeps its worker for good, a task
gives it back, so actors that cannot all start never shut tasks out (2,000
actors on one node made a plain task wait over a minute). A worker that exits before registering (by
itself: not killed by a signal) counts as a failed start; after
``worker_start_failures_max`` in a row, lease requests fail with the reason
instead of waiting for workers that never come.

The pool never holds resources: leases do (``lease_manager``). When a
worker dies, the lease manager releases whatever lease it held (the hook
``release_leases_of``), and the GCS is told if it was leased or hosted an
actor (its owner or its actor must learn of it)."""

from __future__ import annotations

import enum
import json
import logging
from collections import deque
from dataclasses import dataclass

import trio

from ... import exceptions
from ..ids import WorkerID
from ..messages import WorkerRegistered
from ..rpc import Endpoint, PeerDisconnected
from ..runtime_env_keys import ENV_KV_PREFIX

logger = logging.getLogger("tray.node")

# Dead workers a node still lists (the state API's list_workers shows why
# they died); the oldest are forgotten beyond this, so a node whose actors
# come and go does not grow its table without end (5,000 actors killed on
# one node left 5,000 rows that every statistics() call scanned).
DEAD_WORKERS_KEPT = 1024

# Actors waiting at the worker cap a node names in its demand report (the
# state API gives each its reason); the leases are all counted.
WAITING_ACTORS_LISTED = 1024

# Runtime envs whose env_vars a node remembers (read once from the GCS);
# the oldest is forgotten beyond this (it is read again when needed).
ENV_VARS_CACHE_MAX = 1024


class WorkerState(enum.StrEnum):
    """Where a worker process is in its life (the text is what the state
    API's ``list_workers`` shows: it travels as ``.value``)."""
    STARTING = "starting"  # its process is starting; it has not registered yet
    IDLE = "idle"  # registered, in the idle list, waiting for a lease
    LEASED = "leased"  # runs normal tasks for one lease holder
    ACTOR = "actor"  # hosts one actor until it dies
    DEAD = "dead"  # its process is gone (listed until DEAD_WORKERS_KEPT newer deaths)


@dataclass
class WorkerInfo:
    worker_id: str
    address: str = ""
    state: WorkerState = WorkerState.STARTING
    lease_id: int = 0
    # Set by its first lease: True once it ran work with GPUs, False once
    # it ran CPU-only work; None while it has run nothing.
    gpu: bool | None = None
    # Set by its first lease too: the hash of the runtime_env it is set up
    # for ("" : none); None while it has run nothing.
    runtime_env_hash: str | None = None


@dataclass(frozen=True)
class WorkerPoolStatistics:
    starting: int
    idle: int
    leased: int
    actor: int
    dead: int
    busy_workers: tuple  # ids of workers leased or hosting an actor
    started: int = 0  # worker processes this node started, ever
    waiting: int = 0  # leases waiting for a worker (to start, or to be free at the cap)


@dataclass(frozen=True)
class WorkerLimitWaits:
    """Leases waiting for a worker at the cap (``worker_limit_waits``)."""
    limit: int  # workers_per_node_max
    leases: int  # leases waiting for a worker to be free
    actors: tuple  # ids of the actors among them, oldest first (at most WAITING_ACTORS_LISTED)


class WorkerPool:
    def __init__(self, *, node_id: str, endpoint: Endpoint, nursery: trio.Nursery, tracer,
                 config, spawner, rng, gcs_address: str, cpus: int,
                 prestart_workers: int) -> None:
        self._node_id = node_id
        self._trace_name = node_id[:8]
        self._endpoint = endpoint
        self._nursery = nursery
        self._tracer = tracer
        self._config = config
        self._spawner = spawner
        self._rng = rng
        self._gcs_address = gcs_address
        self._cpus = cpus
        self.prestart_workers = prestart_workers
        # Every worker this node started, the last DEAD_WORKERS_KEPT dead
        # ones included: live ones are capped at workers_per_node_max.
        self.workers: dict[str, WorkerInfo] = {}
        self._dead: deque = deque()  # ids of dead workers still listed, oldest first
        self.idle: list[str] = []
        self.idle_since: dict[str, float] = {}
        self._asked_to_exit: set = set()  # idle workers asked whether they may go
        # Counted as they change, not by a scan of every worker ever started
        # (each lease's take_worker read both; with thousands of actors on a
        # node that was O(workers) per lease): live workers, and those
        # starting (a dict as an ordered set).
        self._live = 0
        self._starting: dict[str, None] = {}
        # Worker address -> id, for a closed connection.
        self._by_address: dict[str, str] = {}
        # Leases waiting for a worker, oldest first: (fits(worker), event,
        # the actor id of an actor creation's lease or None). A worker that
        # becomes idle wakes the first waiter it fits, and a death the first
        # waiter, not every waiter (each woken waiter rescanned the idle
        # list: O(waiters) wake-ups per registration, O(n²) for n actors
        # created at once); at the cap tasks first. See ``_wake_waiters``.
        self._waiters: deque = deque()
        self.failed_worker_starts = 0
        self.last_start_failure = ""
        self.started = 0
        # Set by the node manager: release_leases_of(worker_id) when a worker dies.
        self.release_leases_of = None
        # runtime_env hash -> its env_vars, as stored in the GCS (store_env).
        self._env_vars: dict[str, dict] = {}

    def statistics(self) -> WorkerPoolStatistics:
        counts = dict.fromkeys(WorkerState, 0)
        for worker in self.workers.values():
            counts[worker.state] += 1
        busy = tuple(sorted(w.worker_id for w in self.workers.values()
                            if w.state in (WorkerState.LEASED, WorkerState.ACTOR)))
        return WorkerPoolStatistics(
            starting=counts[WorkerState.STARTING], idle=counts[WorkerState.IDLE],
            leased=counts[WorkerState.LEASED], actor=counts[WorkerState.ACTOR],
            dead=counts[WorkerState.DEAD], busy_workers=busy, started=self.started,
            waiting=len(self._waiters))

    def at_cap(self) -> bool:
        return self._live >= self._config.workers_per_node_max

    def worker_limit_waits(self) -> WorkerLimitWaits | None:
        """The leases waiting for a worker to be free at the cap, or None
        (below it, a waiting lease waits only for a worker to start)."""
        if not self._waiters or not self.at_cap():
            return None
        actors = []
        for waiter in self._waiters:
            if waiter[2] is not None and len(actors) < WAITING_ACTORS_LISTED:
                actors.append(waiter[2])
        return WorkerLimitWaits(self._config.workers_per_node_max, len(self._waiters),
                                tuple(actors))

    def validate_state(self) -> None:
        assert len(self.idle) == len(set(self.idle)), "a worker is idle twice"
        for worker_id in self.idle:
            assert self.workers[worker_id].state == WorkerState.IDLE, worker_id
        idle = set(self.idle)
        for worker_id, worker in self.workers.items():
            assert worker.worker_id == worker_id, worker_id
            if worker.state == WorkerState.IDLE:
                assert worker_id in idle, f"idle worker {worker_id} is not in the idle list"
        assert self.live_count() <= self._config.workers_per_node_max, self.live_count()
        live = [w for w in self.workers.values() if w.state != WorkerState.DEAD]
        assert self._live == len(live), (self._live, len(live))
        assert len(self._dead) == len(self.workers) - len(live) <= DEAD_WORKERS_KEPT
        assert list(self._starting) == [w.worker_id for w in self.workers.values()
                                        if w.state == WorkerState.STARTING], self._starting
        for address, worker_id in self._by_address.items():
            worker = self.workers[worker_id]
            assert worker.address == address and worker.state != WorkerState.DEAD, worker_id

    def live_count(self) -> int:
        return self._live

    def prestart(self) -> None:
        for _ in range(min(self.prestart_workers, self._config.workers_per_node_max)):
            self.start_worker()

    def handle_register_worker(self, conn, worker_id: str, address: str) -> WorkerRegistered:
        worker = self.workers.get(worker_id)
        if worker is None or worker.state == WorkerState.DEAD:
            raise ValueError(f"unknown worker {worker_id}")
        if worker.state != WorkerState.STARTING:
            # Registered already: the reply was lost in a reset and the
            # worker asked again. It may be leased by now (simtest chaos
            # seed 235 found it made idle under its lease).
            return WorkerRegistered(self._node_id)
        worker.address = address
        worker.state = WorkerState.IDLE
        del self._starting[worker_id]
        self._by_address[address] = worker_id
        self.idle.append(worker_id)
        self.idle_since[worker_id] = trio.current_time()
        self._tracer.record(self._trace_name, "worker_registered", worker=worker_id)
        logger.debug("worker %s registered at %s", worker_id[:8], address)
        self.failed_worker_starts = 0
        self._wake_waiters(worker)
        return WorkerRegistered(self._node_id)

    def start_worker(self, runtime_env_hash: str | None = None,
                     env_vars: dict | None = None) -> None:
        """Start a worker: for any work (``runtime_env_hash`` None: prestarted),
        or for one runtime_env, its ``env_vars`` in its process environment
        from the start, as Ray starts them."""
        assert self.live_count() < self._config.workers_per_node_max, self.live_count()
        worker_id = WorkerID.from_random(self._rng).hex()
        self.workers[worker_id] = WorkerInfo(worker_id, runtime_env_hash=runtime_env_hash)
        self._live += 1
        self._starting[worker_id] = None
        self.started += 1
        self._tracer.record(self._trace_name, "worker_start", worker=worker_id)
        logger.debug("starting worker %s", worker_id[:8])
        try:
            self._spawner.start_worker(worker_id, dict(env_vars or {}))
        except Exception as error:
            # Not even started (an environment too large to exec: E2BIG):
            # gone at once, or the next start would wait for it for good
            # (one starts at a time). Not counted against the node: it is
            # this start's environment, not the node, that failed.
            self.worker_died(self.workers[worker_id], f"its process did not start: {error}")
            raise

    async def _env_vars_of(self, runtime_env_hash: str) -> dict:
        """The env_vars of a runtime_env, read from the GCS once; {} if it
        cannot be read (the worker's own setup still applies them, later)."""
        if not runtime_env_hash:
            return {}
        cached = self._env_vars.get(runtime_env_hash)
        if cached is not None:
            return cached
        try:
            blob = await self._endpoint.call(self._gcs_address, "kv_get",
                                             ENV_KV_PREFIX + runtime_env_hash)
        except Exception as error:  # noqa: BLE001 - the GCS is away: start it without
            logger.warning("could not read runtime_env %s from the GCS: %s",
                           runtime_env_hash, error)
            return {}
        env_vars = dict(json.loads(blob).get("env_vars") or {}) if blob else {}
        if len(self._env_vars) >= ENV_VARS_CACHE_MAX:
            del self._env_vars[next(iter(self._env_vars))]
        self._env_vars[runtime_env_hash] = env_vars
        return env_vars

    async def take_worker(self, gpu: bool = False, runtime_env_hash: str = "",
                          actor_id: str | None = None) -> WorkerInfo:
        """An idle worker fit for work with (``gpu``) or without GPUs, in the
        runtime_env named by ``runtime_env_hash``, starting one if none is;
        waits for it, and, at ``workers_per_node_max`` live workers, for one
        to be free (an idle worker of another kind or env is stopped to make
        room; a task's lease is served before an actor creation's,
        ``actor_id``). Workers are pooled per runtime_env as in Ray: one set up for
        an env (its code on ``sys.path``, its packages imported) never runs
        a task of another.

        One worker starts at a time: on a small machine, workers starting
        together slow each other (and everything else) down, while leases
        that wait for a worker mostly get one that a finished task gives
        back (measured: 8 half-CPU tasks on 4 CPUs, 2 cores, took 2.8 s with
        a start per waiting lease, 0.5-1.2 s one at a time)."""
        warned = False
        env_vars = await self._env_vars_of(runtime_env_hash)

        def fits(worker: WorkerInfo) -> bool:
            # A prestarted worker takes an env only if the env sets no
            # variables: those are in a worker's environment from its start.
            return worker.state == WorkerState.IDLE and \
                (worker.gpu is None or worker.gpu == gpu) and \
                (worker.runtime_env_hash == runtime_env_hash or
                 (worker.runtime_env_hash is None and not env_vars))

        waiter = None
        try:
            while True:
                for worker_id in self.idle:
                    worker = self.workers[worker_id]
                    if fits(worker):
                        self.idle.remove(worker_id)
                        worker.gpu = gpu
                        worker.runtime_env_hash = runtime_env_hash
                        return worker
                if self.failed_worker_starts >= self._config.worker_start_failures_max:
                    raise exceptions.TrayError(
                        f"workers fail to start on node {self._node_id} "
                        f"({self.failed_worker_starts} in a row; last: "
                        f"{self.last_start_failure})")
                if not self._starting:
                    if self.live_count() >= self._config.workers_per_node_max and self.idle \
                            and await self._make_room():
                        continue  # (the world moved while the workers were asked)
                    if self.live_count() < self._config.workers_per_node_max:
                        self.start_worker(runtime_env_hash, env_vars)
                    elif not warned:
                        warned = True
                        logger.warning(
                            "node %s has %d workers, its maximum (workers_per_node_max): a "
                            "%s waits for one of them to be free (idle workers of another "
                            "kind are stopped only if they own no objects or actors)",
                            self._node_id, self.live_count(),
                            "task" if actor_id is None else f"creation of actor {actor_id}")
                        self._tracer.record(self._trace_name, "worker_cap_reached",
                                            workers=self.live_count())
                waiter = (fits, trio.Event(), actor_id)
                self._waiters.append(waiter)
                await waiter[1].wait()  # the waker took it off the queue
                waiter = None
        finally:
            if waiter is not None:  # cancelled while waiting
                self._waiters.remove(waiter)
            # The next waiter may have to start a worker (one starts at a
            # time, and the one that started last was this caller's).
            if self._waiters and not self._starting:
                self._wake(self._first_waiter())

    async def _make_room(self) -> bool:
        """At the cap, with only idle workers of another kind (GPU or not,
        or another runtime_env): ask them, oldest first, to exit, as
        reaping does (``_ask_to_exit``: one that owns objects or actors
        refuses, for they would die with it), and stop the first that
        agrees. False when none did (then the caller waits for a worker)."""
        for worker_id in list(self.idle):
            worker = self.workers.get(worker_id)
            if worker is None or worker_id in self._asked_to_exit:
                continue
            since = self.idle_since.get(worker_id)
            self._asked_to_exit.add(worker_id)
            try:
                may_exit = await self._endpoint.call(worker.address, "exit_if_idle")
            except Exception as error:  # noqa: BLE001 - as in _ask_to_exit
                may_exit = not isinstance(error, PeerDisconnected)
            finally:
                self._asked_to_exit.discard(worker_id)
            if may_exit and worker.state == WorkerState.IDLE and worker_id in self.idle and \
                    self.idle_since.get(worker_id) == since:
                self._spawner.kill_worker(worker_id)
                self.worker_died(worker, "idle, of another kind (GPU or CPU-only, or another "
                                         "runtime_env), to make room")
                return True
        return False

    def put_back(self, worker: WorkerInfo) -> None:
        """An idle worker taken for a lease that was not granted after all."""
        self.idle.insert(0, worker.worker_id)
        self._wake_waiters(worker)

    def lease_ended(self, worker_id: str, worker_ok: bool, for_actor: bool) -> None:
        """The lease on ``worker_id`` was returned: the worker goes back to the
        idle pool, or, returned as broken, is killed."""
        worker = self.workers.get(worker_id)
        if worker is not None and worker.state in (WorkerState.LEASED, WorkerState.ACTOR):
            if worker_ok and not for_actor:
                worker.state = WorkerState.IDLE
                self.idle.append(worker.worker_id)
                self.idle_since[worker.worker_id] = trio.current_time()
                self._wake_waiters(worker)
            elif not worker_ok:
                self._spawner.kill_worker(worker.worker_id)
                self.worker_died(worker, "returned as broken")

    def worker_process_exited(self, worker_id: str, exit_code: int) -> None:
        """The spawner saw a worker process end (a backend calls this)."""
        worker = self.workers.get(worker_id)
        if worker is None or worker.state == WorkerState.DEAD:
            return
        if worker.state == WorkerState.STARTING:
            why = f"worker {worker_id[:8]} exited with code {exit_code} before registering"
            if exit_code >= 0:
                # A start that failed by itself (a bad interpreter, an import
                # error) counts; one killed by a signal from outside (a kill,
                # the OOM killer) says nothing about the next start (the local
                # chaos test SIGKILLs workers every 0.5 s, starting ones too).
                self.failed_worker_starts += 1
                self.last_start_failure = why
                logger.error("%s", why)
            self.worker_died(worker, why)
            return
        self.worker_died(worker, f"its process exited with code {exit_code}")

    def _wake_waiters(self, idle: WorkerInfo | None = None) -> None:
        """Wake one waiting lease: the first that ``idle`` (a worker just
        made idle) fits, else the first (it may start a worker, or make
        room at the cap). A woken waiter that finds nothing waits again.
        At the cap, tasks' leases come first: a worker given to a task comes
        back, one given to an actor never does (an actor that cannot start
        must not hold up every task behind it). O(waiters), as ``_wake``'s
        removal is."""
        if not self._waiters:
            return
        if idle is not None:
            if self.at_cap():
                for waiter in self._waiters:
                    if waiter[2] is None and waiter[0](idle):
                        self._wake(waiter)
                        return
            for waiter in self._waiters:
                if waiter[0](idle):
                    self._wake(waiter)
                    return
        self._wake(self._first_waiter())

    def _first_waiter(self) -> tuple:
        """The waiter to wake when no particular worker is free: the oldest,
        at the cap the oldest task's lease if any waits."""
        if self.at_cap():
            for waiter in self._waiters:
                if waiter[2] is None:
                    return waiter
        return self._waiters[0]

    def _wake(self, waiter: tuple) -> None:
        self._waiters.remove(waiter)
        waiter[1].set()

    def connection_closed(self, address: str) -> None:
        worker_id = self._by_address.get(address)
        if worker_id is not None:
            self.worker_died(self.workers[worker_id], "its connection closed")

    def worker_died(self, worker: WorkerInfo, reason: str) -> None:
        previous = worker.state
        worker.state = WorkerState.DEAD
        if previous != WorkerState.DEAD:
            self._live -= 1
            self._dead.append(worker.worker_id)
            while len(self._dead) > DEAD_WORKERS_KEPT:
                del self.workers[self._dead.popleft()]
        self._starting.pop(worker.worker_id, None)
        if self._by_address.get(worker.address) == worker.worker_id:
            del self._by_address[worker.address]
        self.idle_since.pop(worker.worker_id, None)
        if worker.worker_id in self.idle:
            self.idle.remove(worker.worker_id)
        self._tracer.record(self._trace_name, "worker_died", worker=worker.worker_id,
                            reason=reason)
        logger.debug("worker %s died: %s", worker.worker_id[:8], reason)
        self.release_leases_of(worker.worker_id)
        self._wake_waiters()  # below the cap again: a waiting lease may start a worker
        if previous in (WorkerState.LEASED, WorkerState.ACTOR):
            self._nursery.start_soon(self._report_worker_death, worker.worker_id, reason,
                                     worker.address)

    async def _report_worker_death(self, worker_id: str, reason: str, address: str) -> None:
        """Tell the GCS, as a call it must answer: a report lost while the
        GCS restarts would leave an actor that died then "alive" for good
        (and its callers waiting). Retried for ``gcs_reconnect_timeout_s``.
        With the worker's address: the actors and groups it owned go too."""
        deadline = trio.current_time() + self._config.gcs_reconnect_timeout_s
        while True:
            try:
                await self._endpoint.call(self._gcs_address, "worker_died", worker_id,
                                          self._node_id, reason, address)
                return
            except PeerDisconnected:
                if trio.current_time() >= deadline:
                    logger.error("could not tell the GCS that worker %s died (%s)",
                                 worker_id[:8], reason)
                    return
                await trio.sleep(self._config.heartbeat_period_s)
            except Exception as error:  # noqa: BLE001 - the GCS failed the report
                logger.error("the GCS failed the report that worker %s died: %s",
                             worker_id[:8], error)
                return

    def kill_worker(self, worker_id: str, reason: str) -> None:
        """Kill a live worker now (the memory monitor does)."""
        worker = self.workers[worker_id]
        self._spawner.kill_worker(worker_id)
        self.worker_died(worker, reason)

    def handle_kill_worker(self, conn, worker_id: str) -> None:
        worker = self.workers.get(worker_id)
        if worker is None or worker.state == WorkerState.DEAD:
            return
        self._spawner.kill_worker(worker_id)
        self.worker_died(worker, "killed")

    def reap_idle(self) -> None:
        """Idle workers beyond one per CPU go after ``idle_worker_timeout_s``,
        if they agree (``_ask_to_exit``)."""
        keep = max(self._cpus, self.prestart_workers)
        now = trio.current_time()
        for worker_id in self.idle[:max(0, len(self.idle) - keep)]:
            if now - self.idle_since.get(worker_id, now) < self._config.idle_worker_timeout_s:
                break
            if worker_id not in self._asked_to_exit:
                self._asked_to_exit.add(worker_id)
                self._nursery.start_soon(self._ask_to_exit, self.workers[worker_id])

    async def _ask_to_exit(self, worker: WorkerInfo) -> None:
        """An idle worker past its time is asked whether it may go, as Ray's
        raylet asks (CoreWorker::HandleExit): one that owns objects or actors
        says no, for they die with their owner (chaos seed 3639: an owner
        reaped as idle failed a borrower's get with OwnerDiedError). It stays
        idle, last in line, and is asked again after another timeout."""
        since = self.idle_since.get(worker.worker_id)
        try:
            may_exit = await self._endpoint.call(worker.address, "exit_if_idle")
        except Exception as error:  # noqa: BLE001 - cut off (asked again), or cannot say
            may_exit = not isinstance(error, PeerDisconnected)
        finally:
            self._asked_to_exit.discard(worker.worker_id)
        if worker.state != WorkerState.IDLE or self.idle_since.get(worker.worker_id) != since:
            return  # leased meanwhile (perhaps idle again since), or dead
        if may_exit:
            self._spawner.kill_worker(worker.worker_id)
            self.worker_died(worker, "idle")
        else:
            self.idle.remove(worker.worker_id)
            self.idle.append(worker.worker_id)
            self.idle_since[worker.worker_id] = trio.current_time()

    def kill_all(self) -> None:
        for worker in sorted(self.workers.values(), key=lambda w: w.worker_id):
            if worker.state != WorkerState.DEAD:
                self._spawner.kill_worker(worker.worker_id)
