"""The host loop: a simulated cluster's trio run, started in guest mode and
stepped tick by tick from the driver's thread on virtual time.

``SimCluster.start`` starts the run (trio's deterministic scheduling on,
seeded from the cluster's seed) and takes it over (``_trio_private``);
each blocking call of the driver's code pumps it (``_pump``) until its
answer is there, moving the ``VirtualClock`` to the next deadline whenever
no task can run, waking the ``_Timers`` and the network's deliveries due
then, and running the cyclic garbage collector and the invariant checks at
fixed tick counts, so that a seed gives the same run every time."""

from __future__ import annotations

import collections
import contextlib
import gc
import heapq
import math
import sys

import outcome
import trio

from ... import _trio_private
from ...exceptions import TrayError
from .patches import _active, _install_patches, _remove_patches
from .validation import _ChangeTracker

# A blocking call waiting longer than this in virtual time is a hang.
HANG_TIMEOUT_S = 24 * 3600.0
# The cyclic garbage collector is off during a run (when it runs would
# depend on allocation counts, which differ between a cold and a warm
# process, and collecting a cycle holding an ObjectRef frees an object);
# it runs instead at deterministic points: every this many host ticks, over
# the young generations (what survived since the last collection: a cost
# that follows the work done), and every FULL_GC_EVERY-th time over the
# whole heap (a cycle reaching into older objects waits for that one).
# Every collection was a full one: its cost followed the heap, so a run
# holding N pending tasks paid O(N) every period, O(N^2) in all (1M
# simulated tasks: ~0.74 ms of CPU per task in collections alone).
GC_EVERY_TICKS = 200_000
FULL_GC_EVERY = 16

# When this process starts a simulated cluster that checks invariants
# (simtest's sweeps: a cluster per seed) with modules imported since it last
# did (the first time; and after a seed imported a library lazily: pandas,
# pyarrow, torch), the objects alive then (modules, classes, the program's
# own state) are moved out of the cyclic collector's sight (gc.freeze):
# every deterministic gc.collect() of a run (at start, every GC_EVERY_TICKS,
# simtest's quiescence) then walks only what the simulations allocated:
# ~2 ms instead of ~40-80 ms with numpy, trio and all of tray imported, and
# ~100 ms with pandas and pyarrow. The cost: a cycle among those objects
# that becomes garbage later is never collected (refcounting still frees
# everything else), a set bounded by the imports; a plain
# tray.init(backend="sim") program does not pay it.
_heap_frozen = {"modules": 0}


class SimulationTimeLimit(BaseException):
    """The simulated program ran past ``SimCluster.time_limit_s`` of virtual
    time (set by a harness: a program that polls forever is a hang no single
    blocking call shows). A BaseException, as KeyboardInterrupt: an
    ``except Exception`` in the program must not swallow it and poll on."""



class _DriverExceptionHidden(Exception):
    """The exception the simulated processes see as being handled while the
    driver's code runs the simulation from inside an ``except`` block (a
    ``tray.get`` in a handler). In a real cluster every process handles its
    own exceptions; here the processes' coroutines run in the driver's
    thread, and an exception raised in one chained to the driver's
    (``__context__``), with its traceback, its frames and every ref in them.
    A process that kept such an exception (a coroutine awaiting inside its
    ``except`` block, as the GCS's actor scheduler does after a lost lease
    request) kept the driver's refs alive past their last use: tune chaos
    seed 86 leaked the returns of the runners' ``serve`` calls, held by the
    driver's ``except`` frame of a lost runner. This stand-in is raised
    and caught around those steps instead, with no context and no
    traceback: what chains to it holds nothing."""


class VirtualClock(trio.abc.Clock):
    """Virtual time that jumps straight to the next deadline when no task
    can run, as ``MockClock(autojump_threshold=0)`` does, one guest tick
    sooner and with no clock arithmetic on real time.

    MockClock autojumps in a tick of its own: the tick that finds every task
    blocked polls for I/O, the next one sees nothing came and jumps, the one
    after that expires the deadlines and runs their tasks (three host ticks
    per point of virtual time). Here the run loop's question "how long until
    the next deadline?" records the deadline and answers 0; the host loop
    (``SimCluster._pump``) moves the time there right before the next tick,
    unless the driver queued work meanwhile (then that work runs first, at
    the time it was queued, and the jump is asked again). Measured on a
    3-node sim of 20,000 trivial tasks: about 30% fewer host ticks."""

    def __init__(self) -> None:
        self._now_s = 0.0
        self.next_deadline_s: float | None = None  # a jump the run loop asked for
        # The network's next delivery to a parked receiver (SimNetwork's
        # host-driven delivery): a deadline trio does not know about.
        self.next_delivery_s = lambda: math.inf

    def start_clock(self) -> None:
        pass

    def current_time(self) -> float:
        return self._now_s

    def deadline_to_sleep_time(self, deadline: float) -> float:
        # Never a positive timeout: the guest run would then wait for I/O in
        # a thread, and the host loop would find its queue empty meanwhile.
        deadline = min(deadline, self.next_delivery_s())
        if deadline != math.inf and deadline > self._now_s:
            self.next_deadline_s = deadline
        return 0.0

    def jump_to_next_deadline(self) -> None:
        if self.next_deadline_s is not None and self.next_deadline_s > self._now_s:
            self._now_s = self.next_deadline_s
        self.next_deadline_s = None

    def jump(self, seconds: float) -> None:
        """Move virtual time forward by ``seconds`` (MockClock's API)."""
        if seconds < 0:
            raise ValueError("time can't go backwards")
        self._now_s += seconds


class _HostInbox:
    """What the host thread (the driver's code, between guest ticks) queues
    for the run: ``SimCluster.call_soon``.

    trio's own way in, ``run_sync_soon``, writes a byte to its wake-up
    socket per call and makes the next tick poll for it (a syscall each: the
    driver's calls queue one per ``.remote()``, ~8% of a 3-node sim of
    trivial tasks). The host and the run share a thread here, so a
    callback needs no more than a deque and a parked task: ``put`` appends
    and reschedules that task (as the network wakes a parked receiver); the
    task runs what was queued, in order, in the next tick, as the entry
    queue's task would have."""

    def __init__(self) -> None:
        self.queue: collections.deque = collections.deque()  # emptied every tick it is woken
        self.task = None  # the parked task; None while it runs (or before it starts)
        self.reschedule = None  # the trio runner's

    def put(self, fn) -> None:
        self.queue.append(fn)
        task = self.task
        if task is not None:
            self.task = None
            self.reschedule(task)

    async def run(self) -> None:
        self.task = None
        me = trio.lowlevel.current_task()

        def abort(_raise_cancel) -> trio.lowlevel.Abort:
            if self.task is me:
                self.task = None
            return trio.lowlevel.Abort.SUCCEEDED

        while True:
            for _ in range(len(self.queue)):  # bounded: what they queue runs next time
                self.queue.popleft()()
            if self.queue:
                await trio.lowlevel.cancel_shielded_checkpoint()
                continue
            self.task = me
            await trio.lowlevel.wait_task_rescheduled(abort)


class _Timers:
    """``trio.sleep`` in simulated code (a task's cost, heartbeats, the
    memory monitor, user code's ``time.sleep``): the task parks in this
    heap and the host loop wakes it right after it moves the virtual clock
    there, as it wakes a receiver whose message arrived.

    trio's own sleep is a cancel scope with a deadline: its end cancels the
    scope and raises Cancelled through the sleeping task's frames, ~20 us
    where a reschedule costs ~3 (that wake-up path was ~8% of a 3-node sim
    of trivial tasks, one sleep each). A sleep here is cancellable as
    trio's (the abort marks its entry dead) and wakes in the same host tick
    trio's deadline would have."""

    def __init__(self) -> None:
        self.heap: list = []  # [wake_at, seq, task or None once aborted]
        self._seq = 0
        self.reschedule = None  # the trio runner's

    async def sleep_until(self, wake_at: float) -> None:
        self._seq += 1
        entry = [wake_at, self._seq, trio.lowlevel.current_task()]
        heapq.heappush(self.heap, entry)

        def abort(_raise_cancel) -> trio.lowlevel.Abort:
            entry[2] = None
            return trio.lowlevel.Abort.SUCCEEDED

        await trio.lowlevel.wait_task_rescheduled(abort)

    def next_s(self) -> float:
        heap = self.heap
        while heap and heap[0][2] is None:
            heapq.heappop(heap)
        return heap[0][0] if heap else math.inf

    def wake_due(self, now: float) -> None:
        heap = self.heap
        while heap and heap[0][0] <= now:
            task = heapq.heappop(heap)[2]
            if task is not None:
                self.reschedule(task)



class GuestRunEngine:
    """``SimCluster``'s host loop (a part of its class, see cluster.py):
    starting the guest run, stepping it until a condition holds, running a
    call in it, and shutting it down. It drives what the cluster built:
    ``clock``, ``network``, ``_inbox``, ``_timers``, ``_host_queue``."""

    def start(self) -> None:
        self._scheduler_state = _trio_private.scheduling_state()
        _trio_private.schedule_deterministically(f"{self.seed}:trio")
        trio.lowlevel.start_guest_run(
            self._main, run_sync_soon_threadsafe=self._host_queue.append,
            done_callback=self._done, clock=self.clock, host_uses_signal_set_wakeup_fd=True)
        guest = _trio_private.take_over_guest_run(self._host_queue.popleft(), self._done)
        self._ticker = guest.ticks
        self._entry_queue = guest.entry_queue
        self.network.drive_deliveries(guest.reschedule)
        self._inbox.reschedule = self._timers.reschedule = guest.reschedule
        network, timers = self.network, self._timers
        self.clock.next_delivery_s = lambda: min(network.next_delivery_s(), timers.next_s())
        if self.validate_every_steps:
            tracker = _ChangeTracker(self)
            guest.instruments.add_instrument(tracker)
            guest.instruments.step_tracker = tracker
        _install_patches()
        self._gc_was_enabled = gc.isenabled()
        gc.collect()
        if self.validate_every_steps and len(sys.modules) != _heap_frozen["modules"]:
            _heap_frozen["modules"] = len(sys.modules)
            gc.freeze()
        gc.disable()
        self._ticks = 0
        _active["cluster"] = self
        _active["last"] = self
        try:
            self._pump(lambda: self._ready, "cluster start")
        except BaseException:
            self.shutdown()
            raise
        # This thread's run state between steps (_outside_users_trio_run).
        self._run_context = _trio_private.run_context_snapshot()

    def _done(self, result: outcome.Outcome) -> None:
        self._finished = result

    def _pump(self, condition, what: str) -> None:
        if sys.exception() is None:
            self._steps(condition, what)
            return
        # The driver's code is handling an exception: the simulated
        # processes must not see it (see _DriverExceptionHidden).
        handled = sys.exception()
        handled_context = handled.__context__
        try:
            raise _DriverExceptionHidden("(the driver's code was handling an exception)")
        except _DriverExceptionHidden as stand_in:
            stand_in.__context__ = stand_in.__traceback__ = None
            try:
                self._steps(condition, what)
            except BaseException as error:
                if error.__context__ is stand_in:
                    # What it would chain to, raised in the driver's handler
                    # (where the one handled keeps its own).
                    error.__context__ = handled_context if error is handled else handled
                raise
        finally:
            del handled, handled_context

    def _steps(self, condition, what: str) -> None:
        deadline = min(self.clock.current_time() + HANG_TIMEOUT_S, self.time_limit_s)
        ticker = self._ticker
        # The driver's code ran since the last step: it changed the driver's
        # state (what it changes elsewhere, it changes through call_soon or
        # the fault API, whose steps run outside every process: all are
        # checked then).
        driver = self.processes.get("n0/driver")
        if driver is None:
            self._all_changed = True
        elif not driver.changed:
            driver.changed = True
            self._changed_processes.append(driver)
        # (The loop's objects in locals: this runs once per host tick, ~7
        # per simulated task.)
        clock, network, timers = self.clock, self.network, self._timers
        inbox_queue, entry = self._inbox.queue, self._entry_queue
        entry_queue_pending = _trio_private.entry_queue_pending
        host_queue, due, sleeping = self._host_queue, network._due, timers.heap
        while not condition():
            if self._finished is not None:
                self._raise_if_failed()
                raise TrayError(f"the simulated cluster stopped during {what}")
            if host_queue or ticker.finished:
                # trio handed the host a callback: it wants to poll in a
                # thread, which this loop never does (see GuestTicks).
                raise TrayError(f"the simulation stalled during {what}")
            if inbox_queue or entry_queue_pending(entry):
                clock.next_deadline_s = None  # the driver's work runs first, now
            else:
                clock.jump_to_next_deadline()
            if due:
                network.deliver_due(clock._now_s)
            if sleeping:
                timers.wake_due(clock._now_s)
            ticker.tick()
            self._ticks += 1
            ticks = self._ticks
            if self.validate_every_steps and ticks % self.validate_every_steps == 0 \
                    and (self._all_changed or self._changed_processes):
                self.validate_components(changed_only=True)
            if ticks % GC_EVERY_TICKS == 0:
                gc.collect(2 if ticks % (GC_EVERY_TICKS * FULL_GC_EVERY) == 0 else 1)
                self._all_changed = True  # finalizers may have run anywhere
            if clock._now_s > deadline:
                if clock._now_s > self.time_limit_s:
                    raise SimulationTimeLimit(
                        f"the program ran past {self.time_limit_s:.0f} s of virtual time "
                        f"(during {what}): it makes no progress (a hang)")
                raise TrayError(f"{what} waited {HANG_TIMEOUT_S} s of virtual time: the "
                                "simulated cluster cannot make progress (a hang)")

    def run(self, async_fn, *args):
        """Run ``async_fn`` as a task of the driver; block until it returns."""
        if self._finished is not None:
            raise TrayError("the simulated cluster has shut down")
        box: list = []

        async def runner() -> None:
            box.append(await outcome.acapture(async_fn, *args))

        self.driver.spawn(runner)
        self._pump(lambda: bool(box), getattr(async_fn, "__name__", "a call"))
        return box[0].unwrap()

    def wait_in_thread(self, predicate, timeout: float | None) -> bool:
        """The driver's thread asleep on a condition (``SimThreadCondition``,
        the driver-thread path): the run is stepped until ``predicate()``
        holds or ``timeout`` seconds of virtual time pass (a timer task of
        the driver's, cancelled once the wait ends); returns
        ``predicate()``. What would wake a real thread (the loop's
        ``notify_all``) has then happened in the run."""
        if predicate():
            return True
        expired: list = []
        scope = trio.CancelScope()
        if timeout is not None:
            async def timer() -> None:
                with scope:
                    await trio.sleep(timeout)
                    expired.append(True)
            self.driver.spawn(timer)
        try:
            with self._outside_users_trio_run():
                self._pump(lambda: bool(expired) or predicate(), "a wait of the driver's thread")
        finally:
            scope.cancel()
        return predicate()

    @contextlib.contextmanager
    def _outside_users_trio_run(self):
        """As api/blocking's: the driver's code may wait from inside a trio
        run of its own (asyncio.run on trio-asyncio): its run state is set
        aside while this run steps."""
        if not trio.lowlevel.in_trio_run():
            yield
            return
        root = self._nursery.parent_task
        while root.parent_nursery is not None:
            root = root.parent_nursery.parent_task
        if trio.lowlevel.current_root_task() is root:
            yield
            return
        with _trio_private.run_state_replaced(self._run_context):
            yield

    def call_soon(self, fn, process=None) -> None:
        """Run ``fn`` in the trio run soon; callable from the driver's thread.
        ``process``: the one process whose state ``fn`` may change (None:
        any), for the change tracker."""

        def picked_up() -> None:
            fn()

        picked_up.changes_process = process
        self._inbox.put(picked_up)

    def shutdown(self) -> None:
        try:
            if self._finished is None and self._token is not None:
                # Processes are torn down mid-step from here on: their state
                # is not expected to hold together any more.
                self.validate_every_steps = 0
                self._stopping = True
                if self.driver is not None:
                    self.driver.begin_shutdown()
                self._token.run_sync_soon(self._nursery.cancel_scope.cancel)
                self._pump(lambda: self._finished is not None, "shutdown")
        finally:
            if self._finished is None and self._token is not None:
                # The run could not end (a hang or a crash during shutdown,
                # already raising): abandon it as trio does a finished one,
                # so this process can start another cluster, not fail every
                # later one with "run() from inside a run()".
                _trio_private.abandon_run()
            self.trace.close()
            _active["cluster"] = None
            _remove_patches()
            if getattr(self, "_gc_was_enabled", False):
                gc.enable()
            if self._scheduler_state is not None:
                _trio_private.restore_scheduling(self._scheduler_state)
                self._scheduler_state = None
        self._raise_if_failed()

    def _raise_if_failed(self) -> None:
        if isinstance(self._finished, outcome.Error) and not self._failure_reported:
            self._failure_reported = True
            raise TrayError("the simulated cluster crashed") from self._finished.error

