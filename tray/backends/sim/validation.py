"""Checking the simulated components' invariants during a run: after every
``validate_every_steps`` host ticks, ``validate_state()`` of each process
that ran since the last check (the change tracker, a trio instrument, marks
them), and the error that names the step where one broke."""

from __future__ import annotations

import contextvars
import operator
import traceback

import trio

from ..._trio_private import (
    ENTRY_QUEUE_TASK_CODE,
    entry_queue_callbacks,
    entry_queue_has_idempotent,
)
from ...exceptions import TrayError
from . import cluster_checks

# The simulated process whose code a trio task runs (set when the process
# starts; the tasks it spawns inherit it), for validating only what changed.
_current_process: contextvars.ContextVar = contextvars.ContextVar("tray_sim_process",
                                                                  default=None)


class SimulationInvariantError(TrayError):
    """A component's ``validate_state()`` failed after a simulated step: the
    state broke at that step (the seed replays it)."""

    def __init__(self, message: str, *, address: str, step: int, virtual_time_s: float,
                 invariant: str = "component-invariants-hold") -> None:
        super().__init__(message)
        self.address = address
        self.step = step
        self.virtual_time_s = virtual_time_s
        # The name of what broke: a component's own invariants, or one of
        # the cluster's checks across components (cluster_checks.py).
        self.invariant = invariant


class _ChangeTracker(trio.abc.Instrument):
    """Marks the simulated process whose task takes a step as changed, so
    that checking invariants after every step (simtest's
    ``validate_every_steps=1``) checks only the components that ran: a
    component's state changes only in its own process's tasks (messages
    arrive as copies), except where the cluster calls into it directly,
    which marks it too. A step outside any process (the driver's calls
    arriving, faults, chaos tasks) marks them all. Installed only while
    validating: it costs a call per task step.

    A task belongs to the process whose nursery it lives in. Most inherit
    that from the task that started them (``_current_process`` in their
    context), but a task started *into* a process's nursery from outside it
    does not: the driver's tasks that its thread queues (``call_soon``: the
    entry queue's system task starts them), a connection's clean-up after a
    fault closed it. Each such task is looked up once by its nursery's
    owner and remembered in its own context (and so in those it starts).
    Counted as "outside every process" instead, each of their steps made
    every process be checked."""

    def __init__(self, cluster) -> None:
        self.cluster = cluster  # the SimCluster
        # The coroutine code of the cluster's host inbox task (_HostInbox.run).
        self._inbox_code = type(cluster._inbox).run.__code__

    def before_task_step(self, task) -> None:
        process = task.context.get(_current_process)
        if process is None:
            code = task.coro.cr_code
            if code is self._inbox_code:
                self._queued_step(self.cluster._inbox.queue)
                return
            if code is ENTRY_QUEUE_TASK_CODE:
                self._entry_queue_step()
                return
            process = _process_of_nursery(task)
            if process is None:
                self.cluster._all_changed = True
                return
            task.context.run(_current_process.set, process)
        if not process.changed:
            process.changed = True
            self.cluster._changed_processes.append(process)

    def _entry_queue_step(self) -> None:
        """The step of trio's entry queue task runs the callbacks queued
        from outside the run (``SimCluster.call_soon``): each says which
        process it may change (the driver's queued calls: the driver);
        any other callback may change anything."""
        entry = self.cluster._entry_queue
        if entry_queue_has_idempotent(entry):
            self.cluster._all_changed = True
            return
        self._queued_step(entry_queue_callbacks(entry))

    def _queued_step(self, callbacks) -> None:
        """A step that runs ``callbacks`` (the inbox's, or the entry queue's)."""
        for sync_fn in callbacks:
            process = getattr(sync_fn, "changes_process", None)
            if process is None:
                self.cluster._all_changed = True
                return
            if not process.changed:
                process.changed = True
                self.cluster._changed_processes.append(process)


_address_of = operator.attrgetter("address")


def _process_of_nursery(task):
    """The simulated process whose nursery ``task`` (or an ancestor of it)
    lives in: the nearest enclosing task that knows its process."""
    nursery = task.parent_nursery
    while nursery is not None:
        parent = nursery.parent_task
        process = parent.context.get(_current_process)
        if process is not None:
            return process
        nursery = parent.parent_nursery
    return None


class InvariantChecks:
    """``SimCluster``'s invariant checks (a part of its class, see
    cluster.py), over its ``processes`` and the changes the tracker and the
    host loop marked (``_all_changed``, ``_changed_processes``)."""

    def validate_components(self, changed_only: bool = False) -> None:
        """Run ``validate_state()`` of every live process's component (only
        of those that ran since the last check: ``changed_only``); the
        first broken invariant raises SimulationInvariantError (once: the run
        is then over, and shutting it down checks nothing more)."""
        if self.invariant_failure is not None:
            return
        changed = self._changed_processes
        if not changed_only or self._all_changed:
            to_check = [process for _, process in sorted(self.processes.items())]
        elif len(changed) == 1:  # the common step: one process ran
            to_check = changed[:]
        else:
            # (By address, in the order they ran where a restarted process
            # shares its predecessor's.)
            to_check = sorted(changed, key=_address_of)
        self._all_changed = False
        changed.clear()
        for process in to_check:
            process.changed = False
            if not process.alive:
                continue
            validate = getattr(process.component, "validate_state", None)
            if validate is None:
                continue
            address = process.address
            try:
                validate()
                broken = cluster_checks.reliable_handled_once(self, process)
            except AssertionError as error:
                where = traceback.extract_tb(error.__traceback__)[-1]
                self.invariant_failure = SimulationInvariantError(
                    f"an invariant of {address} broke at step {self._ticks} (virtual time "
                    f"{self.clock.current_time():.6f} s): {where.filename.rsplit('/', 1)[-1]}:"
                    f"{where.lineno} `{where.line}` {error}", address=address,
                    step=self._ticks, virtual_time_s=self.clock.current_time())
                raise self.invariant_failure from error
            if broken is not None:
                self._fail_across(address, *broken)
        broken = cluster_checks.recovery_keeps_good_copies(self)
        if broken is not None:
            self._fail_across(None, *broken)

    def _fail_across(self, address: str | None, invariant: str, message: str) -> None:
        """One of the checks across components (cluster_checks.py) broke."""
        self.invariant_failure = SimulationInvariantError(
            f"{message} (at step {self._ticks}, virtual time "
            f"{self.clock.current_time():.6f} s)", address=address or "cluster",
            step=self._ticks, virtual_time_s=self.clock.current_time(), invariant=invariant)
        raise self.invariant_failure

