"""Every use tray makes of trio's private internals, in one place.

tray relies on a few things trio does not promise: its switch for
deterministic scheduling (the simulator's seeds replay because of it), the
thread's run state (``GLOBAL_RUN_CONTEXT``), and the parts of a guest run
that the simulator drives by hand (``GuestState``'s fields, the runner's I/O
manager, instrument table and entry queue). The alternatives were to copy
trio's run loop (thousands of lines to keep in step) or to give those
speed-ups and the determinism up; instead each access is named here, once,
with what it relies on, and the rest of tray calls these functions.

trio's version is pinned. ``PRIVATE_NAMES`` lists every private name this
module touches, as a dotted path from ``trio``; the canary test
(tests/test_trio_canary.py) checks that each still exists in the installed
trio, so an upgrade that moves one fails there, not somewhere in a run.

To add an access: write a small function (or constant) in the section of
its concern with a docstring saying what it relies on, and add each private
name it reaches to ``PRIVATE_NAMES``."""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Callable
from typing import NamedTuple

import outcome
import trio
import trio._core._entry_queue as trio_entry_queue
import trio._core._instrumentation as trio_instrumentation
import trio._core._run as trio_run
from sniffio import thread_local as sniffio_library

# Every private trio name used below, as a dotted path from the top-level
# package (a module, then attributes): the canary test resolves each one.
PRIVATE_NAMES: tuple[str, ...] = (
    # Deterministic scheduling.
    "trio._core._run._ALLOW_DETERMINISTIC_SCHEDULING",
    "trio._core._run._r",
    # The thread's run state.
    "trio._core._run.GLOBAL_RUN_CONTEXT",
    # Driving a guest run.
    "trio._core._run.GuestState.guest_tick",
    "trio._core._run.GuestState.runner",
    "trio._core._run.GuestState.unrolled_run_gen",
    "trio._core._run.GuestState.unrolled_run_next_send",
    "trio._core._run.Runner.main_task_outcome",
    "trio._core._run.Runner.io_manager",
    "trio._core._run.Runner.instruments",
    "trio._core._run.Runner.entry_queue",
    "trio._core._run.Runner.reschedule",
    "trio._core._run.TheIOManager.get_events",
    "trio._core._run.TheIOManager.process_events",
    "trio._core._run.TheIOManager._registered",
    # A forked child's own epoll instance (Linux's I/O manager only).
    "trio._core._run.TheIOManager._epoll",
    # The entry queue (what run_sync_soon queues).
    "trio._core._entry_queue.EntryQueue.task",
    "trio._core._entry_queue.EntryQueue.queue",
    "trio._core._entry_queue.EntryQueue.idempotent_queue",
    # The instrument table.
    "trio._core._instrumentation.Instruments",
    "trio._core._instrumentation.Instruments.add_instrument",
    "trio._core._instrumentation.Instruments.remove_instrument",
    "trio._core._instrumentation.Instruments.call",
    "trio._core._instrumentation.INSTRUMENT_LOGGER",
)


# ================================================== deterministic scheduling


def scheduling_state() -> tuple:
    """trio's scheduling switch and the state of its scheduling RNG
    (``_ALLOW_DETERMINISTIC_SCHEDULING``, ``_r``), to hand back to
    ``restore_scheduling`` later."""
    return (trio_run._ALLOW_DETERMINISTIC_SCHEDULING, trio_run._r.getstate())


def schedule_deterministically(seed) -> None:
    """Switch trio's scheduling to deterministic and seed the RNG its
    scheduler draws from (batch order, task order) with ``seed``: runs
    started from here on order their tasks by the seed alone."""
    trio_run._ALLOW_DETERMINISTIC_SCHEDULING = True
    trio_run._r.seed(seed)


def restore_scheduling(state: tuple) -> None:
    """Put back what ``scheduling_state`` returned."""
    trio_run._ALLOW_DETERMINISTIC_SCHEDULING = state[0]
    trio_run._r.setstate(state[1])


# ===================================================== the thread's run state


def run_context_snapshot() -> dict:
    """A copy of this thread's trio run state (``GLOBAL_RUN_CONTEXT``'s
    attributes: the runner, the current task), as it is between two steps of
    a guest run."""
    return dict(vars(trio_run.GLOBAL_RUN_CONTEXT))


def abandon_run() -> None:
    """Forget this thread's trio run, as trio does when a run finishes
    (``GLOBAL_RUN_CONTEXT`` emptied): a run that cannot end is abandoned, so
    that the thread can start another instead of failing with "run() from
    inside a run()"."""
    trio_run.GLOBAL_RUN_CONTEXT.__dict__.clear()


def has_run() -> bool:
    """Whether this thread has a trio run's state (a run in progress, or one
    left behind by a run that never finished)."""
    return hasattr(trio_run.GLOBAL_RUN_CONTEXT, "runner")


@contextlib.contextmanager
def run_state_replaced(replacement: dict):
    """For the block's duration, this thread's trio run state is
    ``replacement`` (a ``run_context_snapshot()`` of another run, or {} for
    none); the thread's own is put back after. The API's blocking calls use
    it when the user's code runs inside a trio run of its own (asyncio.run on
    trio-asyncio's loop, a user's trio.run): see tray/api/blocking.py."""
    run_state = trio_run.GLOBAL_RUN_CONTEXT
    saved = dict(vars(run_state))
    for name in saved:
        delattr(run_state, name)
    for name, value in replacement.items():
        setattr(run_state, name, value)
    try:
        yield
    finally:
        for name in list(vars(run_state)):
            delattr(run_state, name)
        for name, value in saved.items():
            setattr(run_state, name, value)


def current_epoll():
    """The epoll object of this thread's trio run (its I/O manager's), or
    None where the thread runs no trio loop. A trio whose Linux I/O manager
    lost its ``_epoll`` raises: the canary test names it first."""
    run_state = trio_run.GLOBAL_RUN_CONTEXT
    if not hasattr(run_state, "runner"):
        return None
    if not sys.platform.startswith("linux"):
        return None  # not the epoll I/O manager
    return run_state.runner.io_manager._epoll


# ======================================================= driving a guest run


class GuestTicks:
    """trio's guest run, one tick per call of ``tick()``, for the host loop.

    trio's own guest tick (``GuestState.guest_tick``) is written for a host
    event loop in another library: each tick wraps what it sends and what
    the I/O poll returned in ``outcome`` objects, and queues the next tick
    through ``run_sync_soon`` for the host to pop (~5% of a 3-node sim of
    trivial tasks went to that wrapping and queueing). Here the host loop
    is ``SimCluster._pump``, in the same thread, calling ticks back to back;
    this sends the run generator what trio's tick would, in the same order
    (the run's steps, then the I/O poll whose result the next tick gets),
    so a seed's schedule and digest are what they were. The clock never
    asks for a positive timeout (``VirtualClock.deadline_to_sleep_time``),
    so trio's other branch, polling in a thread, is never needed. This
    relies on the private ``GuestState`` fields ``runner`` and
    ``unrolled_run_gen``; trio's version is pinned and a canary test
    watches them."""

    def __init__(self, guest_state, done_callback) -> None:
        self._run = guest_state.unrolled_run_gen
        self._runner = guest_state.runner
        self._done = done_callback
        self._events = guest_state.unrolled_run_next_send.unwrap()  # the start-up poll's
        self._poll_error: BaseException | None = None  # the I/O poll raised: thrown in next
        self.finished = False

    def tick(self) -> None:
        prev_library, sniffio_library.name = sniffio_library.name, "trio"
        try:
            if self._poll_error is None:
                self._run.send(self._events)
            else:
                error, self._poll_error = self._poll_error, None
                self._run.throw(error)
        except StopIteration:
            self.finished = True
            assert self._runner.main_task_outcome is not None
            self._done(self._runner.main_task_outcome)
            return
        except trio.TrioInternalError as error:
            self.finished = True
            self._done(outcome.Error(error))
            return
        finally:
            sniffio_library.name = prev_library
        try:
            self._events = self._runner.io_manager.get_events(0)
        except BaseException as error:  # noqa: BLE001 - handed to the run, as trio's tick does
            self._poll_error = error


class QuietIOManager:
    """trio's I/O manager, minus the epoll call of every guest tick while
    there is nothing it could report.

    In a simulation the only file descriptor trio watches is its wake-up
    socket, which only ``run_sync_soon`` (the driver's calls) writes, right
    after queueing the call. Each guest tick polls for I/O with a zero
    timeout: while the entry queue is empty (and nothing else is watched)
    that poll can find nothing, so it is skipped (a syscall per tick, ~6%
    of a 3-node sim's samples). Everything else is trio's own manager."""

    def __init__(self, inner, entry_queue) -> None:
        self._inner = inner
        self._entry_queue = entry_queue

    def process_events(self, events) -> None:
        if events:
            self._inner.process_events(events)

    def get_events(self, timeout: float):
        entry = self._entry_queue
        if timeout == 0 and not entry.queue and not entry.idempotent_queue and \
                len(self._inner._registered) <= 1:
            return []
        return self._inner.get_events(timeout)

    def __getattr__(self, name: str):
        return getattr(self._inner, name)


class DictInstruments(dict):
    """trio's instrument table as a plain dict.

    trio's ``Instruments`` is a ``UserDict``: the run loop's checks ``hook
    in runner.instruments`` (two per task step, one per reschedule, spawn,
    exit and per tick: ~50 per simulated task) each call its Python
    ``__contains__`` (~1% of the instructions of a 3-node sim of trivial
    tasks, cachegrind). A dict answers ``in`` in C. trio's own methods do
    the rest (they reach the table as ``self.data``, which is this dict);
    the contents are trio's, carried over.

    The change tracker's ``before_task_step`` (every task step of a run
    that checks invariants) is called straight when it is that hook's only
    instrument: trio's ``call`` copies the hook's table and looks the method
    up per call (1.8% of a simtest seed); an exception disables it as
    trio's would."""

    def __init__(self, instruments) -> None:
        super().__init__(instruments.data)
        self.step_tracker: trio.abc.Instrument | None = None

    @property
    def data(self) -> dict:
        return self

    add_instrument = trio_instrumentation.Instruments.add_instrument
    remove_instrument = trio_instrumentation.Instruments.remove_instrument
    _call_each = trio_instrumentation.Instruments.call

    def call(self, hookname: str, *args) -> None:
        tracker = self.step_tracker
        if tracker is not None and hookname == "before_task_step":
            hooked = self[hookname]
            if len(hooked) == 1 and tracker in hooked:
                try:
                    tracker.before_task_step(*args)
                except BaseException:
                    self.remove_instrument(tracker)
                    _INSTRUMENT_LOGGER.exception(
                        "Exception raised when calling %r on instrument %r. Instrument has "
                        "been disabled.", hookname, tracker)
                return
        self._call_each(hookname, *args)


_INSTRUMENT_LOGGER: logging.Logger = trio_instrumentation.INSTRUMENT_LOGGER


class GuestRun(NamedTuple):
    """What the host loop holds of a guest run it took over."""

    ticks: GuestTicks  # steps the run, one tick per call
    entry_queue: object  # trio's EntryQueue (what run_sync_soon queued)
    reschedule: Callable  # the runner's reschedule(task), trio.lowlevel.reschedule's own
    instruments: DictInstruments  # the runner's instrument table, now a dict


def take_over_guest_run(first_tick, done_callback) -> GuestRun:
    """Take over the guest run whose first tick ``start_guest_run`` handed
    the host (``first_tick``, the bound ``GuestState.guest_tick``): the host
    loop steps it with ``GuestTicks``; its runner's I/O manager becomes a
    ``QuietIOManager`` and its instrument table a ``DictInstruments``."""
    guest_state = first_tick.__self__
    runner = guest_state.runner
    ticks = GuestTicks(guest_state, done_callback)
    runner.io_manager = QuietIOManager(runner.io_manager, runner.entry_queue)
    runner.instruments = DictInstruments(runner.instruments)
    return GuestRun(ticks, runner.entry_queue, runner.reschedule, runner.instruments)


# ===================================================== the entry queue


# The coroutine code of trio's entry queue task (the one system task that
# runs what was queued from outside the run).
ENTRY_QUEUE_TASK_CODE = trio_entry_queue.EntryQueue.task.__code__


def entry_queue_pending(entry_queue) -> bool:
    """Whether ``run_sync_soon`` queued anything the entry queue's task has
    not run yet (its plain or its idempotent queue)."""
    return bool(entry_queue.queue or entry_queue.idempotent_queue)


def entry_queue_has_idempotent(entry_queue) -> bool:
    """Whether anything waits in the entry queue's idempotent queue."""
    return bool(entry_queue.idempotent_queue)


def entry_queue_callbacks(entry_queue) -> list:
    """The callbacks waiting in the entry queue's plain queue, in order."""
    return [sync_fn for sync_fn, _ in entry_queue.queue]
