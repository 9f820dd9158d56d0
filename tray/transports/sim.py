"""The simulated network: ordered, reliable streams on virtual time.

Each message is copied on send (``copy_message``), so simulated processes
never share a mutable object by reference. Every message gets a latency
from the network's seeded RNG; a stream delivers in order (a message is
never delivered before the one sent ahead of it), so faults follow the
semantics of a real stream — it can stall or break, but never reorder or
drop a message in the middle.

A stream's end closes when its process ends: messages already sent still
arrive, then the peer's ``receive`` raises ConnectionClosed, and sends to a
closed stream raise it at once.

Network faults (driven by the simulated cluster's fault API) act between
*machines* (the ``nK`` prefix of an address): a partition or a stall holds
back the head of every stream crossing it — and so everything behind it —
until it heals; a slow machine multiplies the latency of its streams; a
reset closes both ends of every stream of a machine at once. A *lagging*
process (``lag``) has what it sends held back for a while, then the fault
API resets its streams, and what was held is lost with them: connections
whose return path went quiet and then broke (the process had handled what
reached it, but its acknowledgements never came back, so the senders send
it all again; see ``replay_after_reset``).

The network also keeps the model of what ``rpc``'s reliable one-way
messages promise (handled once per receiver): ``reliable_new`` counts, per
receiving address, the RELIABLE frames delivered that are new to it by
their sender's address, session (from the connection's hello) and sequence
number; the receiver's endpoint must have handled exactly that many
(``Endpoint.reliable_handled``, compared by the simtest's checks)."""

from __future__ import annotations

import dataclasses
import enum
import heapq
import math
import operator
import pickle
import random
from collections import deque

import trio

from ..core.ids import BaseID
from ..core.interfaces import ConnectionClosed
from ..core.serialization import SerializedObject

# ============================================================ copy on send
# A simulated message must reach its receiver as an object graph of its
# own: nothing the sender keeps may change under the receiver, nor the
# other way round. Pickling the message on send and unpickling it on
# delivery does that for anything, but the hot messages are tuples of
# dataclasses (a pushed TaskSpec, a TaskReply of InlineResults), and the
# dataclasses' pickle support is Python code (``fields()`` on every
# instance, ``object.__setattr__`` per field of a frozen one): 15-30 us per
# message each way, ~60 us of a simulated task's ~400. ``copy_message``
# copies instead, in a pass that knows those shapes:
#
# * what cannot change is shared, not copied: str, bytes, numbers, None,
#   ids, enum members, and tuples, frozensets and frozen dataclasses made
#   only of such things;
# * lists, dicts, sets, bytearrays and the other dataclasses are rebuilt
#   with their contents copied the same way; a SerializedObject's buffers
#   come out as pickle brings them (bytes, or a bytearray for a writable one);
# * anything else (exceptions, ObjectRefs and every class with a pickle hook
#   of its own, subclasses of the containers above) goes through a pickle
#   round trip of its own, so its hooks run as before;
# * a list of ``LIST_PICKLED_FROM_ITEMS`` items or more (a flush of task
#   events) goes through one pickle round trip whole: pickle's C loop beats
#   this pass's Python one on plain data that long.
#
# What pickle did and this does not: keep two references to one mutable
# object inside a message one object (each is copied on its own; no
# message relies on that), and survive a cycle (a message with one is
# copied by pickle whole, after the recursion limit says so).

_SHARED_TYPES = frozenset({str, bytes, int, float, complex, bool, type(None), range})
_copiers: dict = {}  # type -> its copy function; bounded by the types that are sent


def copy_message(message):
    """The receiver's own copy of ``message`` (see above)."""
    try:
        return _copy(message)
    except RecursionError:
        return _pickled_copy(message)


def _copy(value):
    kind = type(value)
    if kind in _SHARED_TYPES:
        return value
    copier = _copiers.get(kind)
    if copier is None:
        copier = _copiers[kind] = _copier_for(kind)
    return copier(value)


def _pickled_copy(value):
    return pickle.loads(pickle.dumps(value, protocol=5))


def _shared(value):
    return value


# (Each copier tests for the shared types inline before calling _copy: most
# items are str, int or bytes, and a call costs more than the test.)

def _copy_tuple(value: tuple):
    copied = tuple([item if type(item) in _SHARED_TYPES else _copy(item) for item in value])
    if all(map(operator.is_, copied, value)):
        return value  # immutable all the way down: shared
    return copied


def _copy_frozenset(value: frozenset):
    copied = [item if type(item) in _SHARED_TYPES else _copy(item) for item in value]
    if all(map(operator.is_, copied, value)):
        return value
    return frozenset(copied)


# A list at least this long is copied by one pickle round trip (in C)
# instead of item by item in Python: a flush of task events (hundreds of
# tuples of dicts) copied ~2-2.5x faster so, ~1/40 of a simulated task.
# pickle is what every message went through before copy_message: the same
# hooks run, and each item arrives as its own copy.
LIST_PICKLED_FROM_ITEMS = 64


def _copy_list(value: list) -> list:
    if len(value) >= LIST_PICKLED_FROM_ITEMS:
        return _pickled_copy(value)
    return [item if type(item) in _SHARED_TYPES else _copy(item) for item in value]


def _copy_dict(value: dict) -> dict:
    # Copied in C, then only what must be copied replaced: most dicts sent
    # (task events' records, resources) hold only str keys and plain values,
    # and a dict built in Python cost ~1.6x this.
    copied = value.copy()
    for key, item in value.items():
        if type(key) not in _SHARED_TYPES:
            return _copy_dict_and_keys(value)
        if type(item) not in _SHARED_TYPES:
            copied[key] = _copy(item)
    return copied


def _copy_dict_and_keys(value: dict) -> dict:
    """A dict with a key of a type that is not shared (a tuple, an id)."""
    return {key if type(key) in _SHARED_TYPES else _copy(key):
            item if type(item) in _SHARED_TYPES else _copy(item)
            for key, item in value.items()}


def _copy_set(value: set) -> set:
    return {item if type(item) in _SHARED_TYPES else _copy(item) for item in value}


def _copy_serialized(value: SerializedObject) -> SerializedObject:
    # As its __reduce_ex__ and an in-band pickle would: read-only buffers
    # arrive as bytes, writable ones as bytearrays.
    buffers = []
    for buffer in value.buffers:
        if type(buffer) is bytes:
            buffers.append(buffer)
        else:
            view = memoryview(buffer).cast("B")
            buffers.append(bytes(view) if view.readonly else bytearray(view))
    return SerializedObject(value.data, buffers or (),
                            _copy_list(value.contained) if value.contained else (), value.kind)


_PICKLE_HOOKS = ("__reduce__", "__reduce_ex__", "__getnewargs__", "__getnewargs_ex__")


def _copier_for(kind: type):
    """How to copy a value of ``kind`` (called once per type)."""
    simple = {tuple: _copy_tuple, list: _copy_list, dict: _copy_dict, set: _copy_set,
              frozenset: _copy_frozenset, bytearray: bytearray,
              SerializedObject: _copy_serialized}
    if kind in simple:
        return simple[kind]
    if issubclass(kind, enum.Enum):
        return _shared  # pickled by name: the same member
    if issubclass(kind, BaseID) and all(
            getattr(kind, hook) is getattr(BaseID, hook) for hook in _PICKLE_HOOKS
            if hasattr(BaseID, hook)):
        return _shared  # bytes and their hash, never changed
    if dataclasses.is_dataclass(kind) and _plain_dataclass(kind):
        return _dataclass_copier(kind)
    return _pickled_copy


def _plain_dataclass(kind: type) -> bool:
    """Does pickle copy ``kind`` field by field (no hook of its own, or
    ``serialization.pickled_by_fields``'s)?"""
    for hook in _PICKLE_HOOKS:
        own = getattr(kind, hook, None)
        if own is not getattr(object, hook, None) and \
                not getattr(own, "pickled_by_fields", False):
            return False
    getstate = getattr(kind, "__getstate__", None)
    if getstate is not object.__getstate__ and \
            getattr(getstate, "__name__", "") != "_dataclass_getstate":
        return False
    setstate = getattr(kind, "__setstate__", None)
    return setstate is None or getattr(setstate, "__name__", "") == "_dataclass_setstate"


def _dataclass_copier(kind: type):
    names = tuple(field.name for field in dataclasses.fields(kind))
    frozen = kind.__dataclass_params__.frozen
    slotted = "__dict__" not in dir(kind)
    if not slotted and any(getattr(base, "__slots__", ()) for base in kind.__mro__[:-1]):
        return _pickled_copy  # slots and a __dict__: as pickle does, not field by field
    new_instance = object.__new__
    set_field = object.__setattr__
    if slotted:
        read = operator.attrgetter(*names) if len(names) > 1 else \
            (lambda value: (getattr(value, names[0]),)) if names else (lambda value: ())

        def copy_slotted(value):
            old = read(value)
            copied = [item if type(item) in _SHARED_TYPES else _copy(item) for item in old]
            if frozen and all(map(operator.is_, copied, old)):
                return value  # frozen and immutable all the way down: shared
            instance = new_instance(kind)
            for name, item in zip(names, copied, strict=True):
                set_field(instance, name, item)
            return instance
        return copy_slotted

    def copy_with_dict(value):
        # pickle's default: the instance's __dict__, whatever it holds. The
        # dict is copied in C and only what must be copied is replaced (most
        # of a TaskSpec's ~30 fields are str, int or bytes: a dict built in
        # Python was ~40% of a pushed task's copy).
        old = value.__dict__
        state = None
        for key, item in old.items():
            if type(item) not in _SHARED_TYPES:
                copied = _copy(item)
                if copied is not item:
                    if state is None:
                        state = old.copy()
                    state[key] = copied
        if state is None:
            if frozen:
                return value  # frozen and immutable all the way down: shared
            state = old.copy()
        instance = new_instance(kind)
        set_field(instance, "__dict__", state)
        return instance
    return copy_with_dict


class _Pipe:
    """One direction of a stream.

    A receiver with nothing to take parks until the head message's delivery
    time, and a message costs it one park and one wake-up (not a wake-up on
    send to arm a timer and another on delivery). Two ways:

    * in a simulated cluster, the network keeps a heap of delivery times
      for parked receivers and the host loop wakes them right after it moves
      the virtual clock (``SimNetwork.deliver_due``): no cancel scope, no
      trio deadline, no Cancelled raised per message;
    * elsewhere (a bare ``trio.run``), the receiver parks in a cancel scope
      whose deadline the sender moves to the message's delivery time.

    A close wakes the receiver at once either way."""

    __slots__ = ("items", "closed", "waiter", "task", "last_delivery")

    def __init__(self) -> None:
        self.items: deque = deque()
        self.closed = False
        self.waiter: trio.CancelScope | None = None  # a parked receiver's scope
        self.task = None  # a parked receiver's trio task (host-driven delivery)
        self.last_delivery = 0.0


class SimStream:
    def __init__(self, network: SimNetwork, owner: str, peer: str, outgoing: _Pipe,
                 incoming: _Pipe, remote: bool) -> None:
        self._network = network
        self.owner = owner
        self.peer = peer
        self._out = outgoing
        self._in = incoming
        self._remote = remote
        self.closed = False
        self.partner: SimStream | None = None
        # Machines, for the network's faults: messages flow from peer to owner.
        self._from = SimNetwork.node_of(peer)
        self._to = SimNetwork.node_of(owner)
        # The sender's (address, session) as its hello said (received here).
        self.hello: tuple | None = None

    def send_nowait(self, message) -> bool:
        out = self._out
        if self.closed or out.closed:
            raise ConnectionClosed(f"{self.owner} -> {self.peer}: stream closed")
        # The one copy a message gets: the receiver gets this one, so
        # simulated processes never share a mutable object.
        data = copy_message(message)
        network = self._network
        latency = network.latency(self._remote)
        if network.slow:
            latency *= network.slowdown(self._to, self._from)
        deliver_at = max(out.last_delivery, trio.current_time() + latency)
        if network.lagging:
            deliver_at = max(deliver_at, network.lag_until(self.owner))
        out.last_delivery = deliver_at
        out.items.append((deliver_at, data))
        if out.task is not None:
            if len(out.items) == 1:
                network.deliver_at(deliver_at, out)
        elif out.waiter is not None and deliver_at < out.waiter.deadline:
            out.waiter.deadline = deliver_at
        return True

    async def send(self, message) -> None:
        self.send_nowait(message)

    async def receive(self):
        pipe = self._in
        network = self._network
        while True:
            if self.closed:
                raise ConnectionClosed(f"{self.owner}: stream closed")
            if pipe.items:
                deliver_at, data = pipe.items[0]
                if self._remote:
                    held = network.held(self._from, self._to)
                    if held is not None:
                        await held
                        continue
                if deliver_at <= trio.current_time():
                    pipe.items.popleft()
                    message = data
                    network.delivered(self.owner, self.peer, message, self)
                    return message
                wake_at = deliver_at
            elif pipe.closed:
                raise ConnectionClosed(f"{self.peer} closed the stream to {self.owner}")
            else:
                wake_at = math.inf
            if network.host_driven:
                await network.park(pipe, wake_at)
                continue
            with trio.CancelScope(deadline=wake_at) as scope:
                pipe.waiter = scope
                try:
                    await trio.sleep_forever()
                finally:
                    if pipe.waiter is scope:
                        pipe.waiter = None

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self._out.closed = True
        self._network.wake(self._out)
        self._network.wake(self._in)

    async def aclose(self) -> None:
        self.close()


class SimNetwork:
    """Listeners by address, and the latency model."""

    def __init__(self, rng: random.Random, tracer, latency_local_s: tuple = (20e-6, 100e-6),
                 latency_remote_s: tuple = (100e-6, 1e-3)) -> None:
        self.rng = rng
        self.tracer = tracer
        # A Trace records a delivery through its own fast path (the same
        # event); any other tracer (tests' NullTracer) through record().
        self._record_receive = getattr(tracer, "record_receive", None) or (
            lambda receiver, sender, message: tracer.record(receiver, "recv", peer=sender,
                                                            msg=message))
        self.latency_local_s = latency_local_s
        self.latency_remote_s = latency_remote_s
        self._listeners: dict[str, trio.MemorySendChannel] = {}
        self._streams: dict[str, list[SimStream]] = {}
        self.messages_delivered = 0
        self.dead: set[str] = set()  # addresses whose process died
        # Faults between machines ("n0", "n1", ...).
        self.blocked: set[tuple[str, str]] = set()  # (from, to) pairs held back
        self.stalled_until: dict[str, float] = {}  # machine -> virtual time
        self.slow: dict[str, float] = {}  # machine -> latency factor
        # Lagging processes (``lag``): address -> until when what it sends
        # is held back.
        self.lagging: dict[str, float] = {}
        # Reliable messages (see the module docstring): receiver address ->
        # {(sender address, session): the last sequence number new to it},
        # and how many RELIABLE frames new to it were delivered.
        self.reliable_seen: dict[str, dict] = {}
        self.reliable_new: dict[str, int] = {}
        self.reliable_replayed = 0  # RELIABLE frames delivered again (not new)
        self.reliable_delivered = 0  # RELIABLE frames delivered, new or not
        # A callback for the next process a reliable message is new to
        # (``arm_on_reliable``): the fault API lags that one.
        self.armed_on_reliable = None
        self._changed = trio.Event()
        # Host-driven delivery (drive_deliveries): parked receivers' wake-ups.
        self.host_driven = False
        self._reschedule = None
        self._due: list = []  # heap of (deliver_at, seq, pipe)
        self._due_seq = 0

    # ------------------------------------------------------------- delivery

    def drive_deliveries(self, reschedule) -> None:
        """From now on the host loop wakes parked receivers: it asks
        ``next_delivery_s()`` when choosing the next virtual time and calls
        ``deliver_due()`` after moving the clock; ``reschedule`` is the trio
        runner's (callable between guest ticks and inside them)."""
        self.host_driven = True
        self._reschedule = reschedule

    def deliver_at(self, deliver_at: float, pipe: _Pipe) -> None:
        self._due_seq += 1
        heapq.heappush(self._due, (deliver_at, self._due_seq, pipe))

    async def park(self, pipe: _Pipe, wake_at: float) -> None:
        task = trio.lowlevel.current_task()
        pipe.task = task
        if wake_at != math.inf:
            self.deliver_at(wake_at, pipe)

        def abort(_raise_cancel) -> trio.lowlevel.Abort:
            if pipe.task is task:
                pipe.task = None
            return trio.lowlevel.Abort.SUCCEEDED

        await trio.lowlevel.wait_task_rescheduled(abort)

    def wake(self, pipe: _Pipe) -> None:
        """Wake the pipe's parked receiver now (its stream closed)."""
        if pipe.waiter is not None:
            pipe.waiter.cancel()
            pipe.waiter = None
        task = pipe.task
        if task is not None:
            pipe.task = None
            self._reschedule(task)

    def next_delivery_s(self) -> float:
        """When the next parked receiver's message arrives (inf: none)."""
        due = self._due
        while due and due[0][2].task is None:  # woken already (a close)
            heapq.heappop(due)
        return due[0][0] if due else math.inf

    def deliver_due(self, now: float) -> None:
        """Wake every parked receiver whose head message has arrived by ``now``."""
        due = self._due
        while due and due[0][0] <= now:
            _, _, pipe = heapq.heappop(due)
            task = pipe.task
            if task is not None and pipe.items and pipe.items[0][0] <= now:
                pipe.task = None
                self._reschedule(task)

    # ------------------------------------------------------------- faults

    def held(self, source: str, target: str):
        """None if a message may cross from machine ``source`` to ``target``
        now, else an awaitable that returns when that may have changed."""
        if source == target or not (self.blocked or self.stalled_until):
            return None  # (no partition or stall anywhere: every remote receive asks)
        until = max(self.stalled_until.get(source, 0.0), self.stalled_until.get(target, 0.0))
        blocked = (source, target) in self.blocked
        if not blocked and until <= trio.current_time():
            return None
        return self._wait_for_change(None if blocked else until)

    async def _wait_for_change(self, until: float | None) -> None:
        with trio.move_on_at(until if until is not None else math.inf):
            await self._changed.wait()

    def _faults_changed(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    def slowdown(self, a: str, b: str) -> float:
        return max(self.slow.get(a, 1.0), self.slow.get(b, 1.0))

    def partition(self, group_a: list[str], group_b: list[str], one_way: bool = False) -> None:
        """Hold back traffic from machines in ``group_a`` to ``group_b`` (and
        back, unless ``one_way``)."""
        for a in group_a:
            for b in group_b:
                self.blocked.add((a, b))
                if not one_way:
                    self.blocked.add((b, a))
        self._faults_changed()

    def stall(self, machine: str, seconds: float) -> None:
        """Every stream to or from ``machine`` stops delivering for ``seconds``."""
        self.stalled_until[machine] = max(self.stalled_until.get(machine, 0.0),
                                          trio.current_time() + seconds)
        self._faults_changed()

    def set_slow(self, machine: str, factor: float) -> None:
        if factor == 1.0:
            self.slow.pop(machine, None)
        else:
            self.slow[machine] = factor

    def heal(self) -> None:
        """End every partition, stall and slowdown."""
        self.blocked.clear()
        self.stalled_until.clear()
        self.slow.clear()
        self._faults_changed()

    def lag(self, address: str, seconds: float) -> None:
        """For ``seconds``, hold back every message the process at
        ``address`` sends (to local peers too) past the end of the lag: a
        reset of its connections then (the fault API's
        ``replay_after_reset``) loses what was held with them."""
        self.lagging[address] = max(self.lagging.get(address, 0.0),
                                    trio.current_time() + seconds)

    # A message held by a lag is due this long after the lag ends (the
    # reset that ends the lag closes its stream first).
    LAG_HOLD_PAST_S = 1.0

    def lag_until(self, sender: str) -> float:
        """The earliest delivery of a message ``sender`` sends now that a
        lag allows (0: no lag holds it)."""
        until = self.lagging.get(sender, 0.0)
        if until <= trio.current_time():
            return 0.0
        return until + self.LAG_HOLD_PAST_S

    def end_lag(self, address: str) -> None:
        self.lagging.pop(address, None)

    def reset_process(self, address: str) -> None:
        """Break every stream of the process at ``address``: both ends close."""
        for stream in list(self._streams.get(address, ())):
            stream.close()
            if stream.partner is not None:
                stream.partner.close()

    def reset(self, machine: str) -> None:
        """Break every stream of the processes on ``machine``: both ends close."""
        for owner in sorted(self._streams):
            if self.node_of(owner) != machine:
                continue
            for stream in self._streams[owner]:
                stream.close()
                if stream.partner is not None:
                    stream.partner.close()

    def latency(self, remote: bool) -> float:
        low, high = self.latency_remote_s if remote else self.latency_local_s
        return low + (high - low) * self.rng.random()

    def delivered(self, receiver: str, sender: str, message, stream=None) -> None:
        self.messages_delivered += 1
        if len(message) == 4:
            kind, call_id, method, _ = message
            summary = f"reply#{call_id}" if kind == 1 else f"ack#{call_id}" if kind == 4 \
                else "welcome" if kind == 5 else method
            if kind == 3 and stream is not None:  # rpc's RELIABLE
                self._reliable_delivered(receiver, stream.hello, call_id)
        else:
            summary = str(message[0])
            if stream is not None and len(message) == 3 and message[0] == "hello":
                stream.hello = (message[1], message[2])
        self._record_receive(receiver, sender, summary)

    def _reliable_delivered(self, receiver: str, hello: tuple | None, seq: int) -> None:
        """The model of rpc's promise: a reliable message is new to its
        receiver (to be handled) unless one of its sender's session with
        this sequence number or a later one was delivered to it before."""
        self.reliable_delivered += 1
        seen = self.reliable_seen.setdefault(receiver, {})
        last = seen.get(hello, 0)
        if seq > last:
            seen[hello] = seq
            self.reliable_new[receiver] = self.reliable_new.get(receiver, 0) + 1
            armed = self.armed_on_reliable
            if armed is not None:
                self.armed_on_reliable = None
                armed(receiver)
        else:
            self.reliable_replayed += 1

    def transport(self, owner: str) -> SimTransport:
        return SimTransport(self, owner)

    def close_all(self, owner: str) -> None:
        """The process at ``owner`` died: close every stream end it held.
        Until a process serves at that address again, code of the dead one
        still unwinding can open no new stream."""
        self.dead.add(owner)
        # A process at this address later is a new receiver (a new endpoint).
        self.reliable_seen.pop(owner, None)
        self.reliable_new.pop(owner, None)
        for stream in self._streams.pop(owner, []):
            stream.close()
        channel = self._listeners.pop(owner, None)
        if channel is not None:
            channel.close()

    def _track(self, stream: SimStream) -> None:
        streams = self._streams.setdefault(stream.owner, [])
        if len(streams) > 64 and len(streams) % 64 == 0:
            streams[:] = [s for s in streams if not s.closed]
        streams.append(stream)

    @staticmethod
    def node_of(address: str) -> str:
        return address.split("/", 1)[0]


class SimTransport:
    def __init__(self, network: SimNetwork, owner: str) -> None:
        self.network = network
        self.owner = owner

    async def serve(self, address: str, on_stream, *, task_status=trio.TASK_STATUS_IGNORED):
        if address in self.network._listeners:
            raise OSError(f"address {address} is already in use")
        self.network.dead.discard(address)
        send, receive = trio.open_memory_channel(math.inf)
        self.network._listeners[address] = send
        task_status.started()
        try:
            async with trio.open_nursery() as nursery:
                async for stream in receive:
                    nursery.start_soon(self._handle, on_stream, stream)
        finally:
            if self.network._listeners.get(address) is send:
                del self.network._listeners[address]

    def flush_queued(self) -> None:
        """Nothing to do: a simulated stream hands each message to the
        network as it is sent (``send_nowait`` included)."""

    @staticmethod
    async def _handle(on_stream, stream: SimStream) -> None:
        try:
            await on_stream(stream)
        finally:
            stream.close()

    async def connect(self, address: str) -> SimStream:
        if self.owner in self.network.dead:
            raise ConnectionClosed(f"{self.owner} has exited")
        channel = self.network._listeners.get(address)
        if channel is None:
            raise ConnectionClosed(f"nothing listens at {address}")
        remote = SimNetwork.node_of(address) != SimNetwork.node_of(self.owner)
        forward, backward = _Pipe(), _Pipe()
        mine = SimStream(self.network, self.owner, address, forward, backward, remote)
        theirs = SimStream(self.network, address, self.owner, backward, forward, remote)
        mine.partner, theirs.partner = theirs, mine
        self.network._track(mine)
        self.network._track(theirs)
        try:
            channel.send_nowait(theirs)
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            raise ConnectionClosed(f"nothing listens at {address}") from None
        return mine
