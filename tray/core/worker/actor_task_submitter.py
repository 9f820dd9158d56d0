"""Submitting actor calls, and registering actors with the GCS.

Calls from this process to one actor are stamped with consecutive sequence
numbers (``seq``) and sent straight to the actor's worker as soon as their
arguments exist; the actor runs each caller's calls in ``seq`` order
(``actor_host``). With each call goes the caller's *floor*: the lowest
sequence number it still waits for, so the actor can forget replies it kept
for re-sent calls and skip gaps left by calls that will never come.

Where the actor is comes from the GCS: ``wait_actor_ready`` long-polls until
the actor is alive in an incarnation newer than the one this process last
saw die (or dead for good). A call cut off by a broken connection is re-sent
within ``max_task_retries``; otherwise it fails with ``ActorDiedError`` (the
actor is dead) or ``ActorUnavailableError`` (it is restarting, or only the
connection broke and the call may or may not have run). A call that finds
nothing listening at the actor's address before it is sent waits for the
next incarnation and spends no retry: it cannot have run. Any other error on a
call's way (the GCS unreachable, the actor refusing it) fails that call, and
only that call.

A call that ends without being sent (its argument failed, it was cancelled,
the GCS was unreachable) leaves a gap in the sequence that calls sent after
it would wait on forever: the actor is told the caller's new floor
(``actor_floor``) so they run.

A call that fails here while a copy of it is at a live actor that has not
answered (the connection broke and the actor still answers, so the call
may or may not have run; or it was cancelled on its way: the actor is told,
and skips it if it has not started, but the cancel may be lost with a
connection) may still run there after the caller gave up, and borrow the
refs inside its arguments:
the actor registers its borrows with their owner when it unpacks them,
which may be long after the failure (simtest default seed 168: a reset
cut off ``hold([ref])``, the caller freed ``ref``, and the actor's
registration arrived after the free; the actor then read a freed object).
So such an *unsettled* call keeps its argument holds (``submitted``) until
its fate at the actor is known: its reply arrives after all (a cancelled
call's does), the process it went to is found gone, or the GCS reports
that incarnation dead or replaced (then whatever it borrowed went with
it). So an actor that lives on (a detached one, say) keeps them until a
reply or its end. Ray fails such a call after a grace period for news of
the actor's death (``timeout_ms_task_wait_for_death_info``) and then
releases its arguments (``FailPendingTask``), knowing no borrower the lost
reply would have named; tray's simulated resets break connections to live
actors far more often than gRPC channels break, so it waits for the fate
instead. The call's hold on its actor's handle reference goes at once:
kept, it would keep the actor in scope, and so alive, for as long as it
waits for the actor's end. Each actor with unsettled calls has one task
that long-polls the GCS for that end (``_watch_unsettled``).

``max_pending_calls`` (per caller process and actor; -1: no limit) makes
``.remote()`` raise ``PendingCallsLimitExceeded`` while that many calls are
pending, as Ray does.

Creation: the owner registers the actor (its ``ActorSpec``) with the GCS,
which schedules it; the owner holds the constructor's argument refs until
the actor is alive or dead.

Lifetime by handles (Ray's rule: a non-detached actor ends when every
handle to it is gone, anywhere in the cluster, and the calls already made
have finished). tray reuses the reference counter rather than a second
protocol: the creator owns the actor's *handle reference* (an object id
derived from the actor id, ``reference_counter.actor_handle_id``) and
every ``ActorHandle`` holds an ``ObjectRef`` to it. Pickling a handle (a
task argument, a return value, inside a ``put`` object, an actor's
constructor argument) therefore makes the receiver a borrower through the
existing borrower protocol, with its guarantees (a value returned or passed
on registers its borrowers before the sender lets go; a dead borrower is
dropped). Each call also holds the reference (``submitted``) until its
reply arrives, in the caller's own table, so a borrower with calls in
flight does not let go, and ``A.remote().f.remote()`` runs ``f`` before
``A`` goes. When the owner's entry reaches zero, ``actor_out_of_scope``
asks the GCS to end the actor: no restart, later calls fail with
``ActorDiedError``, and the actor's worker exits gracefully (``atexit``
handlers run on real processes). The alternative, Ray's dedicated
``WaitForActorRefDeleted`` exchange between GCS and owner, would duplicate
what borrowing already solves. Detached actors get no handle reference:
only ``tray.kill`` (or ``exit_actor``) ends them. A handle from
``get_actor`` or ``get_if_exists`` registers as a borrower of the owner's
reference at once; the owner dying ends its non-detached actors as
before (fate-sharing in the GCS)."""

from __future__ import annotations

import dataclasses
from collections import OrderedDict
from dataclasses import dataclass, field

import trio

from ... import exceptions
from ..ids import TaskID
from ..messages import ActorInfo, ActorSpec, ActorStatus
from ..rpc import Endpoint, HandshakeBroken, PeerDisconnected
from ..serialization import deserialize
from ..task_status import TaskStatus
from .dependency_resolver import DependencyResolver
from .function_table import FunctionTable
from .gcs_client import GcsClient
from .loop_bridge import LoopBridge
from .outbox import Outbox
from .reference_counter import ReferenceCounter, actor_handle_id
from .task_manager import PendingTask, TaskManager, spend_retry

# How long a call that found nothing listening at its actor's address waits
# for the GCS to report the next incarnation before it fails as a call cut
# off does (in the simulator: virtual seconds).
UNSENT_CALL_WAIT_S = 30.0


@dataclass
class ActorState:
    """Caller-side view of an actor."""
    actor_id: str
    next_seq: int = 0
    # seq -> True. Keys go in only in increasing order (``next_call``), so
    # the first key is the lowest: ``floor()`` is O(1), where ``min()`` cost
    # O(calls in flight) per call (a burst of 1,000 calls was quadratic).
    # An OrderedDict, not a dict: a dict's first key after many pops from
    # the front is found by skipping the holes they left (measured, 1,000
    # in flight: 1.3 us per call; OrderedDict 0.36 us).
    unfinished: OrderedDict = field(default_factory=OrderedDict)
    info: ActorInfo | None = None
    seen_incarnation: int = 0
    refresh: trio.Event | None = None
    # The highest floor this process told the incarnation ``told_incarnation``
    # (in a call or an ``actor_floor``): that incarnation may hold calls that
    # wait for one below any higher floor.
    told_incarnation: int = 0
    floor_told: int = 0
    # Calls that failed here while a live actor may still run them: task id
    # -> UnsettledCall, whose argument holds wait for the call's fate there
    # (see the header). Not bounded by a number: releasing one early frees
    # what the actor may borrow; each entry is a call this process made,
    # and goes when its incarnation ends (``_watch_unsettled``, running
    # while ``watching``).
    unsettled: dict = field(default_factory=dict)
    watching: bool = False

    def floor(self) -> int:
        """The lowest call still unfinished (``next_seq`` when none is)."""
        return next(iter(self.unfinished), self.next_seq)

    def told(self, incarnation: int, floor: int) -> None:
        """The floor ``floor`` went to that incarnation (a new incarnation
        knows only what was sent to it)."""
        if incarnation != self.told_incarnation:
            self.told_incarnation, self.floor_told = incarnation, floor
        else:
            self.floor_told = max(self.floor_told, floor)


@dataclass(frozen=True)
class UnsettledCall:
    """A failed call a live actor may still run: the incarnation that holds
    a copy of it, and the argument holds kept until that copy's fate is known."""
    incarnation: int
    holds: tuple


@dataclass(frozen=True)
class ActorSubmitterStatistics:
    actors_known: int  # actors this process called or created
    calls_pending: int  # calls sent or waiting to be, not answered yet
    calls_sent_at_once: int  # sends by ``send_now`` (no task), since the start
    calls_sent_by_task: int  # sends (and re-sends) by ``submit``'s task
    calls_unsettled: int = 0  # failed calls whose arguments wait for their fate at the actor


def actor_died_error(info: ActorInfo, call_name: str) -> Exception:
    cause = info.death_cause
    reason = cause.reason if cause is not None else "it died"
    cause_error = deserialize(cause.error) if cause is not None and cause.error is not None \
        else None
    detail = f"\n{cause_error}" if cause_error is not None else ""
    error_class = exceptions.ActorPlacementGroupRemoved \
        if cause is not None and cause.placement_group_removed else exceptions.ActorDiedError
    return error_class(
        f"the actor {info.class_name} ({info.actor_id}) is dead, so {call_name} "
        f"cannot run: {reason}{detail}", info.actor_id, cause_error)


class ActorTaskSubmitter:
    def __init__(self, *, address: str, name: str, endpoint: Endpoint, gcs: GcsClient,
                 bridge: LoopBridge, outbox: Outbox, tracer, task_manager: TaskManager,
                 resolver: DependencyResolver, functions: FunctionTable,
                 references: ReferenceCounter, events=None) -> None:
        self._address = address
        self._events = events  # the owner's task events (its constructor call's end)
        self._outbox = outbox
        self._name = name
        self._endpoint = endpoint
        self._gcs = gcs
        self._bridge = bridge
        self._tracer = tracer
        self._task_manager = task_manager
        self._resolver = resolver
        self._functions = functions
        self._references = references
        # One entry per actor this process has called or created.
        self.actors: dict[str, ActorState] = {}
        self._sent_at_once = 0
        self._sent_by_task = 0
        # Nodes the GCS declared dead (``node_died``; ids are never reused):
        # nothing of theirs is waited for, though the network may still
        # hold a handshake with them up (a partition).
        self._dead_nodes: set[str] = set()
        task_manager.args_to_release = self._args_to_release

    def statistics(self) -> ActorSubmitterStatistics:
        return ActorSubmitterStatistics(
            len(self.actors), sum(len(state.unfinished) for state in self.actors.values()),
            self._sent_at_once, self._sent_by_task,
            sum(len(state.unsettled) for state in self.actors.values()))

    def actor_state(self, actor_id: str) -> ActorState:
        state = self.actors.get(actor_id)
        if state is None:
            state = self.actors[actor_id] = ActorState(actor_id)
        return state

    def validate_state(self) -> None:
        for actor_id, state in self.actors.items():
            assert state.actor_id == actor_id, actor_id
            assert all(0 <= seq < state.next_seq for seq in state.unfinished), \
                (actor_id, state.next_seq, sorted(state.unfinished))
            assert list(state.unfinished) == sorted(state.unfinished), actor_id  # floor()
            if state.info is not None:
                assert state.info.actor_id == actor_id, actor_id
            # Unsettled calls: ended here, their holds still counted, and
            # watched for the end of their incarnation.
            assert state.watching or not state.unsettled, actor_id
            for task_id, call in state.unsettled.items():
                assert not self._task_manager.is_pending(TaskID(task_id)), (actor_id, task_id)
                assert call.holds, (actor_id, task_id)
                for oid in call.holds:
                    entry = self._references.refs.get(oid)
                    assert entry is not None, (actor_id, task_id, oid)
                    assert entry.submitted > 0, (actor_id, task_id, oid)

    @staticmethod
    def check_pending_calls(state: ActorState, max_pending_calls: int) -> None:
        """Raise PendingCallsLimitExceeded when ``max_pending_calls`` (-1: no
        limit) calls to the actor are pending from this process."""
        if 0 <= max_pending_calls <= len(state.unfinished):
            raise exceptions.PendingCallsLimitExceeded(
                f"the actor {state.actor_id} has {len(state.unfinished)} calls pending from "
                f"this process, its max_pending_calls={max_pending_calls}; wait for some to "
                "finish (tray.get or tray.wait) before calling it again")

    def next_call(self, state: ActorState) -> int:
        """The sequence number of a new call to the actor."""
        seq = state.next_seq
        state.next_seq += 1
        state.unfinished[seq] = True
        return seq

    # ---------------------------------------------------------------- calls

    async def actor_info(self, state: ActorState) -> ActorInfo:
        while state.info is None or (state.info.state != ActorStatus.DEAD and
                                     state.info.incarnation <= state.seen_incarnation):
            if state.refresh is not None:
                await state.refresh.wait()
                continue
            state.refresh = trio.Event()
            try:
                state.info = await self._gcs.call("wait_actor_ready", state.actor_id,
                                                  state.seen_incarnation)
            finally:
                state.refresh.set()
                state.refresh = None
        return state.info

    def send_now(self, task: PendingTask, state: ActorState) -> bool:
        """The fast path of a call, taken where nothing needs waiting for: no
        argument to resolve, the actor alive at a known address with an
        open connection. The call is sent here, at once and in call order
        (``Connection.start_call``: queued for the connection's writer, so a
        burst leaves in one write), and its reply ends it from the
        connection's receive loop: no task, no scheduling step per call.
        False (nothing done) where ``submit`` must run instead.

        Measured (2026-11-23, 1:1 actor calls async, before this path): a
        task per call started one per scheduling step (to keep the calls in
        order, core_worker._send_queued_calls) and one socket write per call
        were most of the caller's time per call besides building it."""
        info = state.info
        spec = task.spec
        if task.done or info is None or info.state != ActorStatus.ALIVE or not info.address or \
                info.incarnation <= state.seen_incarnation or state.refresh is not None:
            return False
        if spec.ref_args():
            return False  # the resolver may wait for them
        connection = self._endpoint.open_connection(info.address)
        if connection is None:
            return False
        task.spec = spec = spec.replace(floor=state.floor())

        def on_reply(ok: bool, value) -> None:
            self._on_reply(task, state, info, ok, value)

        if not connection.start_call("actor_call", spec, on_reply=on_reply):
            return False
        state.told(info.incarnation, spec.floor)
        task.unanswered_incarnation = info.incarnation
        self._sent_at_once += 1
        self._task_manager.set_state(task, TaskStatus.PENDING_NODE_ASSIGNMENT)
        self._task_manager.set_state(task, TaskStatus.SUBMITTED_TO_WORKER)
        return True

    def _on_reply(self, task: PendingTask, state: ActorState, info: ActorInfo, ok: bool,
                  value) -> None:
        """The reply to a call ``send_now`` sent (as ``_submit`` handles it)."""
        if not ok and isinstance(value, PeerDisconnected):
            # The slow path takes over: re-sent within its retries, or failed.
            try:
                self._bridge.start_soon(self.submit, task, state, info)
            except RuntimeError:  # the process is ending
                pass
            return
        self._answered(task, state)
        answered_by = None
        try:
            if ok:
                self._task_manager.complete(task, value.results)
                answered_by = info.incarnation
            else:
                self._task_manager.fail(task, value)  # the actor refused it
        except Exception as error:  # noqa: BLE001 - as in submit: this call fails, alone
            self._task_manager.fail(task, error)
            answered_by = None
        self._call_ended(task, state, answered_by)

    def address_of_call(self, task: PendingTask) -> str | None:
        """The address of the actor incarnation a call was sent to and has
        not answered from; None when it was not sent (or went to an
        incarnation since replaced)."""
        state = self.actors.get(task.spec.actor_id)
        info = state.info if state is not None else None
        if task.unanswered_incarnation is None or info is None or \
                info.incarnation != task.unanswered_incarnation:
            return None
        return info.address

    async def submit(self, task: PendingTask, state: ActorState,
                     cut_off_from: ActorInfo | None = None) -> None:
        """Send one call (re-sending it within its retries) and record its
        outcome; any error on its way fails this call, never the process.
        ``cut_off_from``: the connection to that actor broke while the call
        was in flight (sent by ``send_now``)."""
        answered_by = None
        try:
            answered_by = await self._submit(task, state, cut_off_from)
        except Exception as error:  # noqa: BLE001 - the GCS unreachable, the actor refused it
            self._task_manager.fail(task, error)
        finally:
            self._call_ended(task, state, answered_by)

    async def _submit(self, task: PendingTask, state: ActorState,
                      cut_off_from: ActorInfo | None) -> int | None:
        """The incarnation that answered the call (it ran there), or None."""
        spec = task.spec
        if cut_off_from is None:
            failure = await self._resolver.resolve(task)
            if failure is not None:
                self._task_manager.fail(task, failure)
                return None
        # (cancel() may end it while it waits; a broken connection is looked
        # into all the same: later calls must not go to a dead incarnation)
        while cut_off_from is not None or not task.done:
            if cut_off_from is None:
                self._task_manager.set_state(task, TaskStatus.PENDING_NODE_ASSIGNMENT)
                info = await self.actor_info(state)
                if info.state == ActorStatus.DEAD:
                    self._task_manager.fail(task, actor_died_error(info, spec.name))
                    return None
                if task.done:  # cancelled while it waited for the actor
                    return None
                try:
                    if info.node_id in self._dead_nodes:
                        raise PeerDisconnected(info.address)  # fenced, if it still lives
                    await self._endpoint.connect(info.address)
                except HandshakeBroken:
                    pass  # it may still listen: the call is cut off below
                except PeerDisconnected:
                    # Nothing listens there, and the call never left: it cannot
                    # have run, so it spends no retry and waits for the actor's
                    # next incarnation (Ray's callers queue calls while the
                    # actor restarts), or its end.
                    if await self._next_incarnation(state, info):
                        continue
                    cut_off_from = info  # no news in time: as a call cut off
                    continue
                if task.done:  # cancelled while it connected: it is not sent
                    return None
                task.spec = spec = task.spec.replace(floor=state.floor())
                state.told(info.incarnation, spec.floor)
                self._task_manager.set_state(task, TaskStatus.SUBMITTED_TO_WORKER)
                self._sent_by_task += 1
                task.unanswered_incarnation = info.incarnation
                try:
                    reply = await self._endpoint.call(info.address, "actor_call", spec)
                except PeerDisconnected:
                    cut_off_from = info
                except Exception:
                    self._answered(task, state)  # it answered with an error (it refused it)
                    raise
                else:
                    self._answered(task, state)
                    self._task_manager.complete(task, reply.results)
                    return info.incarnation
            info, cut_off_from = cut_off_from, None
            # Dead, or (when it still answers) only the connection broke:
            # then the actor lives on, and the call may or may not have run.
            cut_off = info.node_id not in self._dead_nodes and \
                await self._endpoint.reachable(info.address)
            if not cut_off:
                state.seen_incarnation = max(state.seen_incarnation, info.incarnation)
                # Gone, and what it borrowed with it: no copy is left to run.
                self._answered(task, state)
            if task.retries_left != 0 and not task.cancelled:
                spend_retry(task)
                self._tracer.record(self._name, "actor_call_retry", task=spec.task_id)
                continue
            if cut_off:
                error = exceptions.ActorUnavailableError(
                    f"the connection to actor {state.actor_id} broke during {spec.name}; "
                    "the call may or may not have run, and was not retried "
                    "(max_task_retries=0)", state.actor_id)
            else:
                error = await self._actor_failure(state, spec)
            self._task_manager.fail(task, error)
            return None
        return None

    async def _next_incarnation(self, state: ActorState, unreachable: ActorInfo) -> bool:
        """Wait (at most ``UNSENT_CALL_WAIT_S``) for the GCS to report the
        actor alive in an incarnation after ``unreachable``, where nothing
        listens, or dead; True when it did. The GCS may not have heard of
        the death yet; a live process that refused the connection (a real
        one under load can) must not hold the call for ever."""
        with trio.move_on_after(UNSENT_CALL_WAIT_S):
            info = await self._gcs.call("wait_actor_ready", state.actor_id,
                                        unreachable.incarnation)
            state.seen_incarnation = max(state.seen_incarnation, unreachable.incarnation)
            if state.info is None or info.incarnation >= state.info.incarnation:
                state.info = info
            return True
        return False

    # ------------------------------------------------------ unsettled calls

    def _answered(self, task: PendingTask, state: ActorState) -> None:
        """No copy of the call is out any more: the actor answered it, or
        the process it went to is gone. A call that failed here meanwhile
        (cancelled) lets go of its arguments now."""
        task.unanswered_incarnation = None
        call = state.unsettled.pop(task.spec.task_id, None)
        if call is not None:
            self._tracer.record(self._name, "actor_call_settled", task=task.spec.task_id)
            self._references.release_submitted(call.holds)

    def _args_to_release(self, task: PendingTask) -> list:
        """The task manager's hook for an actor call that fails while a copy
        of it is at an actor that has not answered: keep its argument holds
        until the call settles there (see the header); the hold on the
        actor's own handle reference goes now."""
        spec = task.spec
        state = self.actors.get(spec.actor_id)
        if state is None:
            return task.arg_refs
        handle = actor_handle_id(spec.actor_id)
        kept = tuple(oid for oid in task.arg_refs if oid != handle)
        if not kept:
            return task.arg_refs
        if not state.watching:
            try:
                self._bridge.start_soon(self._watch_unsettled, state)
            except RuntimeError:  # the process is ending: nothing is borrowed after it
                return task.arg_refs
            state.watching = True
        state.unsettled[spec.task_id] = UnsettledCall(task.unanswered_incarnation, kept)
        self._tracer.record(self._name, "actor_call_unsettled", task=spec.task_id,
                            incarnation=task.unanswered_incarnation)
        return [oid for oid in task.arg_refs if oid == handle]

    async def _watch_unsettled(self, state: ActorState) -> None:
        """Release the unsettled calls' arguments as the incarnations they
        went to end: the GCS answers ``wait_actor_ready`` when the actor is
        dead, or alive in a newer incarnation (the older one is dead then).
        A GCS unreachable for long is asked again: giving up would free
        what a live actor may borrow."""
        try:
            while state.unsettled:
                oldest = min(call.incarnation for call in state.unsettled.values())
                try:
                    info = await self._gcs.call("wait_actor_ready", state.actor_id, oldest)
                except exceptions.TrayError:
                    # The GCS stayed away past gcs_reconnect_timeout_s (or a
                    # long poll outlived it): ask again, which waits as long.
                    continue
                except ValueError:  # the GCS knows no such actor any more
                    info = None
                for task_id, call in list(state.unsettled.items()):
                    if info is None or info.state == ActorStatus.DEAD or \
                            call.incarnation < info.incarnation:
                        del state.unsettled[task_id]
                        self._tracer.record(self._name, "actor_call_settled", task=task_id)
                        self._references.release_submitted(call.holds)
        finally:
            state.watching = False

    def _call_ended(self, task: PendingTask, state: ActorState,
                    answered_by: int | None) -> None:
        """A call ended (answered by incarnation ``answered_by``, or not
        answered: None). Calls at the actor after one that never ran there
        wait for it until a floor passes it, so the actor is told the new
        floor whenever it passed what that incarnation knows — unless the
        call ran at that very incarnation and the floor is just past it (the
        actor moved past it by itself). That covers a call that never ran,
        one whose earlier calls were still pending when it failed (simtest
        chaos seed 559: call #4 failed while #0-#3 were in flight, and the
        actor waited for #4 forever), and calls answered by an incarnation
        that died since (default seeds 1261, 8114, chaos 9399: #5 ran at
        incarnation 1, #4 and #6 were re-sent to incarnation 2 with floor 4,
        and #6 waited there for #5 once #4 ran)."""
        seq = task.spec.seq
        state.unfinished.pop(seq, None)
        info = state.info
        if info is None or info.state != ActorStatus.ALIVE or not info.address:
            return  # no live incarnation to tell: calls sent to the next carry the floor
        floor = state.floor()
        known = state.floor_told if state.told_incarnation == info.incarnation else 0
        if floor <= known or (answered_by == info.incarnation and floor <= seq + 1):
            return
        self._outbox.send_later(info.address, "actor_floor", self._address, floor)
        state.told(info.incarnation, floor)

    async def kill_actor(self, actor_id: str, no_restart: bool) -> None:
        await self._gcs.call("kill_actor", actor_id, no_restart)
        state = self.actors.get(actor_id)
        if state is not None and state.info is not None:
            # Later calls from here wait for the next incarnation (or death).
            state.seen_incarnation = max(state.seen_incarnation, state.info.incarnation)

    def actor_out_of_scope(self, actor_id: str) -> None:
        """No handle to the actor (created here) is left, and no call is
        pending: the GCS ends it (idempotent, so a retry is harmless)."""
        if self._outbox.shutting_down:
            return  # the process is ending: the GCS ends its actors with it
        self._tracer.record(self._name, "actor_handles_gone", actor=actor_id)
        try:
            self._bridge.start_soon(self._tell_out_of_scope, actor_id)
        except Exception:  # noqa: BLE001 - the loop has ended: as above
            pass

    async def _tell_out_of_scope(self, actor_id: str) -> None:
        try:
            await self._gcs.call("actor_out_of_scope", actor_id)
        except (PeerDisconnected, exceptions.TrayError):
            pass  # the GCS stayed away; the owner's exit ends the actor then

    async def _actor_failure(self, state: ActorState, spec) -> Exception:
        """The error for a call whose actor died under it (not retried)."""
        try:
            info = await self._gcs.call("get_actor", state.actor_id)
        except exceptions.TrayError:
            info = None
        if info is not None and info.state == ActorStatus.DEAD:
            state.info = info
            return actor_died_error(info, spec.name)
        # The GCS may not have heard of the death yet: the actor restarts if
        # its budget allows.
        if info is not None and (info.state in (ActorStatus.RESTARTING,
                                                ActorStatus.PENDING_CREATION) or
                                 info.max_restarts == -1 or
                                 info.restarts < info.max_restarts):
            return exceptions.ActorUnavailableError(
                f"the actor {state.actor_id} ({info.class_name}) died while running "
                f"{spec.name} and is restarting; the call was not retried "
                "(max_task_retries=0)", state.actor_id)
        return exceptions.ActorDiedError(
            f"the actor {state.actor_id} died while running {spec.name}; the call was not "
            "retried (max_task_retries=0)", state.actor_id)

    def node_died(self, node_id: str) -> set:
        """The GCS declared a node dead: the addresses of the actors this
        process knows to live on it (to drop), none of which is waited for
        any more, even if a partition still holds it (restarts default seed
        2: a call cut off by the node's death asked whether the actor still
        listened, and waited for the partition to heal)."""
        self._dead_nodes.add(node_id)
        return {state.info.address for state in self.actors.values()
                if state.info is not None and state.info.node_id == node_id
                and state.info.address}

    # ------------------------------------------------------------- creation

    async def register(self, actor: ActorSpec, holds: list) -> ActorInfo | None:
        """Register ``actor`` with the GCS once its constructor's arguments
        exist; returns the live actor of its name instead when the owner
        asked for ``get_if_exists`` and there is one."""
        spec = actor.creation
        await self._functions.ensure_exported(spec.function_id)
        task = PendingTask(spec, 0, holds)
        failure = await self._resolver.resolve(task)
        if failure is not None:
            self._references.release_submitted(holds)
            raise await self._references.deserialize(failure)
        if task.spec is not spec:  # its constructor's arguments, resolved
            actor = dataclasses.replace(actor, creation=task.spec)
        reply = await self._gcs.call("create_actor", actor)
        if reply.existing is not None:
            self._references.release_submitted(holds)
            return reply.existing
        self._tracer.record(self._name, "actor_submitted", actor=actor.actor_id)
        self._bridge.spawn(self._release_when_done, actor, holds)
        return None

    async def _release_when_done(self, actor: ActorSpec, holds: list) -> None:
        """Hold the constructor's arguments while the actor may run its
        constructor again: until it is dead, or alive with no restart left
        (a restart needs the same arguments, as in Ray; the simtest chaos
        profile found restarts failing with "object ... was freed" when they
        were released at the first start). Also stops when the GCS stays
        unreachable: then calls to the actor fail, and nothing waits here.
        The first ALIVE (or a DEAD before it) ends the constructor call in
        the owner's task events: its worker's own report may never come (a
        worker killed before its next flush)."""
        seen_incarnation = 0
        ended = False
        try:
            while True:
                info = await self._gcs.call("wait_actor_ready", actor.actor_id,
                                            seen_incarnation)
                if not ended and self._events is not None and \
                        info.state in (ActorStatus.ALIVE, ActorStatus.DEAD):
                    ended = True
                    if info.state == ActorStatus.ALIVE:
                        self._events.task_state(actor.creation, TaskStatus.FINISHED,
                                                actor_id=actor.actor_id)
                    else:
                        self._events.task_state(
                            actor.creation, TaskStatus.FAILED, actor_id=actor.actor_id,
                            error=exceptions.ActorDiedError(
                                f"the actor {actor.actor_id} died before it was alive"))
                if info.state == ActorStatus.DEAD or info.max_restarts == 0 or \
                        0 < info.max_restarts <= info.restarts:
                    break
                seen_incarnation = info.incarnation
        except (PeerDisconnected, exceptions.TrayError, ValueError):
            pass
        self._references.release_submitted(holds)
