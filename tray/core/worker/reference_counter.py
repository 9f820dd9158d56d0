"""The reference table: every object this process owns or borrows.

One ``RefEntry`` per object id, owned (this process created it with
``.remote()`` or ``put``) or borrowed (a ref arrived from elsewhere). An
entry counts who still needs the object; when every count is zero the
entry goes, and for an owned object every copy is freed. The counts, and
when each moves:

* ``local``: ``ObjectRef`` instances alive in this process — up when one is
  made, down in its ``__del__``.
* ``submitted``: tasks (and actor creations) this process submitted that
  take the object as an argument — up when the arguments are packed, down
  when the task finishes (or when a reconstruction that held it ends).
* ``contained``: objects this process knows of whose value holds a ref to
  this one — up when such a value is stored or a returned value is adopted,
  down when that outer object is freed.
* ``borrowers`` (owned objects only): other processes holding refs, each
  with a count of its registrations — up on ``add_borrower``, down on
  ``remove_borrower``; a borrower that died is dropped entirely.

An owned entry also holds the object's value state, as the owner knows it:
``ready``, the value itself when small (``inline``) or where copies live
(``locations``), and the refs inside it (``contained_refs``).

Invariants (``validate_state``, one fact per assert): counts are never
negative; an entry whose counts are all zero exists only while the task that
makes it runs; a borrowed entry has no borrowers of its own and no value
state; an event to wait on exists only while the object is not ready.

A borrowed entry that reaches zero tells its owner (``remove_borrower``).
Messages go through the outbox, so they leave in order.

Actor handles are counted here too (see ``actor_task_submitter``): a
non-detached actor has a *handle reference*, an object id made from the
actor's id (``actor_handle_id``) that its creator owns and that never has
a value. Every ``ActorHandle`` holds a ref to it, and every call submitted
through a handle holds it as ``submitted``; so a handle pickled anywhere
makes the receiver a borrower by the protocol above, and the owner's entry
reaches zero only when no handle is left anywhere and no call is pending.
Then ``actor_out_of_scope`` tells the actor's side to end the actor. The
statistics count these entries apart from objects (they hold no value)."""

from __future__ import annotations

from dataclasses import dataclass, field

import trio

from ..ids import ObjectID
from ..object_ref import ObjectRef, _new_borrows
from ..rpc import Endpoint, PeerDisconnected
from ..serialization import SerializedObject, deserialize
from .loop_bridge import LoopBridge
from .outbox import Outbox

# The index of an actor's handle reference: task returns count from 1 and
# ``put`` objects from 2**31, so no object has index 0.
_ACTOR_HANDLE_INDEX = (0).to_bytes(4, "big")


def actor_handle_id(actor_id: str) -> ObjectID:
    """The handle reference of the actor ``actor_id`` (hex)."""
    return ObjectID(bytes.fromhex(actor_id) + _ACTOR_HANDLE_INDEX)


def is_actor_handle(object_id: ObjectID) -> bool:
    return object_id.binary()[16:] == _ACTOR_HANDLE_INDEX


@dataclass(frozen=True)
class ReferenceStatistics:
    objects: int  # entries, owned and borrowed (actor handles apart)
    owned: int
    borrowed: int
    # (object id hex, sorted borrower addresses) of every owned object.
    owned_objects: tuple = ()
    # Handle references of actors: (actor id hex, owned, sorted borrowers).
    actor_handles: tuple = ()


@dataclass
class RefEntry:
    owner: str
    owned: bool
    local: int = 0
    submitted: int = 0
    contained: int = 0
    borrowers: dict = field(default_factory=dict)  # owner side: address -> count
    # The value: inline (value or error) or in node stores.
    ready: bool = False
    inline: SerializedObject | None = None
    # Tuples, replaced whole, never changed in place: an empty one (most
    # entries' locations and contained refs) is the shared () that the
    # cyclic GC does not track. Two empty lists per entry were a quarter of
    # the tracked objects a live ref leaves, and every full collection walks
    # them all (put cost grew with the refs held: 11 -> 32 us at 100k).
    locations: tuple = ()  # ((node_id, node manager address), ...)
    contained_refs: tuple = ()  # ((oid bytes, owner), ...) inside the value
    event: trio.Event | None = None
    # Owned objects only: finished tasks kept in the owner's lineage that
    # took this object as an argument. A task result's entry is pinned, not
    # its value: with every other count at zero its stored copies are freed,
    # and the entry stays so that re-running one of those tasks can re-create
    # this argument from its own lineage (reconstruction several levels
    # deep). A put (an argument too large to travel inline is one) cannot be
    # re-created, so its value stays pinned.
    lineage: int = 0

    def total(self) -> int:
        return self.local + self.submitted + self.contained + len(self.borrowers)


class ReferenceCounter:
    def __init__(self, *, address: str, name: str, endpoint: Endpoint, outbox: Outbox,
                 bridge: LoopBridge, tracer, store, node_id: str, node_manager_address: str,
                 config, task_pending, lineage_released,
                 actor_out_of_scope=None) -> None:
        self.address = address
        self._name = name
        self._endpoint = endpoint
        self._outbox = outbox
        self._bridge = bridge
        self._tracer = tracer
        self._store = store
        self._node_id = node_id
        self._node_manager_address = node_manager_address
        self._config = config
        # task_pending(task_id): is the task that makes this object still running?
        self._task_pending = task_pending
        # lineage_released(task_id): one of the task's results was freed.
        self._lineage_released = lineage_released
        # actor_out_of_scope(actor_id hex): the last handle of an actor this
        # process created is gone, and no call to it is pending.
        self._actor_out_of_scope = actor_out_of_scope
        # Grows with the objects the program holds; each entry is freed when
        # its last reference goes (the object store's capacity bounds the big ones).
        self.refs: dict[ObjectID, RefEntry] = {}
        # Borrower address -> the owned objects it borrows (a dict as an
        # ordered set: a dead borrower's objects are released in the order
        # it borrowed them, the same in every run). A borrower's death costs
        # what it borrowed, not a scan of every ref held.
        self._borrowed_by: dict[str, dict[ObjectID, None]] = {}
        # Node id -> the owned objects with a copy there (``locations``,
        # changed through ``set_locations``; ``forget_node`` drops a dead
        # node's whole set): a node's death costs the objects it held, not a
        # scan of every ref held.
        self._on_node: dict[str, set[ObjectID]] = {}
        # Counts every owned object made ready; any thread may read it (a
        # driver thread's ``wait`` reads it before looking at entries, and
        # the loop tells from it whether one became ready since).
        self.ready_generation = 0
        # key -> callback(object_id, entry), called for every owned object
        # made ready: one per user thread blocked in ``wait``
        # (``CoreWorker.wait_from_thread``), so bounded by the user's threads.
        self.ready_listeners: dict = {}

    def statistics(self) -> ReferenceStatistics:
        entries = sorted(self.refs.items(), key=lambda kv: kv[0].hex())
        handles = tuple((oid.hex()[:32], entry.owned, tuple(sorted(entry.borrowers)))
                        for oid, entry in entries if is_actor_handle(oid))
        owned = tuple((oid.hex(), tuple(sorted(entry.borrowers)))
                      for oid, entry in entries if entry.owned and not is_actor_handle(oid))
        objects = len(self.refs) - len(handles)
        return ReferenceStatistics(objects=objects, owned=len(owned),
                                   borrowed=objects - len(owned), owned_objects=owned,
                                   actor_handles=handles)

    def validate_state(self) -> None:
        # Simtest runs this after every simulated step of the owner, over
        # every ref (the driver's checks were a third of a chaos seed's CPU).
        # Each entry is first tested by one expression that holds exactly
        # when every assert of _validate_entry holds, except an entry
        # kept only for its task's reply (that one needs the task's state):
        # an entry that does not pass it goes through the asserts, which
        # say what broke.
        address = self.address
        for object_id, entry in self.refs.items():
            borrowers = entry.borrowers
            owned = entry.owned
            lineage = entry.lineage
            if entry.local < 0 or entry.submitted < 0 or entry.contained < 0 or lineage < 0 \
                    or owned != (entry.owner == address) or (lineage and not owned) \
                    or (entry.ready and entry.event is not None) \
                    or (borrowers and min(borrowers.values()) <= 0) \
                    or (not owned and (borrowers or entry.ready or entry.inline is not None
                                       or entry.locations or entry.contained_refs)) \
                    or not (lineage or entry.local or entry.submitted or entry.contained
                            or borrowers):
                self._validate_entry(object_id, entry)
            for borrower in borrowers:
                assert object_id in self._borrowed_by.get(borrower, ()), (object_id, borrower)
            for node_id, _manager in entry.locations:
                assert object_id in self._on_node.get(node_id, ()), (object_id, node_id)
        for node_id, object_ids in self._on_node.items():
            assert object_ids, node_id
            for object_id in object_ids:
                entry = self.refs[object_id]
                assert any(location[0] == node_id for location in entry.locations), \
                    (object_id, node_id)

    def _validate_entry(self, object_id: ObjectID, entry: RefEntry) -> None:
        assert entry.local >= 0, (object_id, entry)
        assert entry.submitted >= 0, (object_id, entry)
        assert entry.contained >= 0, (object_id, entry)
        assert all(count > 0 for count in entry.borrowers.values()), (object_id, entry)
        assert entry.owned == (entry.owner == self.address), (object_id, entry)
        assert entry.lineage >= 0 and (entry.owned or not entry.lineage), (object_id, entry)
        if entry.total() == 0 and not entry.lineage:
            # Kept only for the reply of the task that makes it.
            assert entry.owned, (object_id, entry)
            assert not entry.ready, (object_id, entry)
            assert self._task_pending(object_id.task_id()), (object_id, entry)
        if not entry.owned:
            assert not entry.borrowers, (object_id, entry)
            assert not entry.ready, (object_id, entry)
            assert entry.inline is None, (object_id, entry)
            assert not entry.locations, (object_id, entry)
            assert not entry.contained_refs, (object_id, entry)
        if entry.ready:
            assert entry.event is None, (object_id, entry)

    def entry(self, object_id: ObjectID) -> RefEntry | None:
        return self.refs.get(object_id)

    def _entry_for(self, object_id: ObjectID, owner: str) -> RefEntry:
        entry = self.refs.get(object_id)
        if entry is None:
            entry = self.refs[object_id] = RefEntry(owner=owner, owned=owner == self.address)
        return entry

    # ------------------------------------------------------------ local refs

    def add_local_ref(self, object_id: ObjectID, owner: str) -> None:
        self._entry_for(object_id, owner).local += 1

    def remove_local_ref(self, object_id: ObjectID) -> None:
        if self._bridge.off_loop_thread():
            # A ref dropped in a thread other than the loop's: count it down
            # on the loop.
            try:
                self._bridge.call_soon_from_outside(lambda: self._release_local_ref(object_id))
            except Exception:  # the loop has ended
                pass
            return
        self._release_local_ref(object_id)

    def _release_local_ref(self, object_id: ObjectID) -> None:
        entry = self.refs.get(object_id)
        if entry is None:
            return
        entry.local -= 1
        assert entry.local >= 0, object_id
        self.maybe_release(object_id, entry)

    def maybe_release(self, object_id: ObjectID, entry: RefEntry) -> None:
        if entry.total() > 0 or self.refs.get(object_id) is not entry:
            return
        if entry.owned and not entry.ready and self._task_pending(object_id.task_id()):
            return  # the task is still running; its reply releases the object
        if entry.lineage and entry.owned:
            if object_id.is_put():
                # Only lineage needs it, value and all. The actor handles in
                # it keep their actors no more: only a re-run of a task it is
                # an argument of can reach them, and an actor ends when the
                # program's last handle goes (Ray's rule; lifetimes chaos
                # seed 479: an argument passed through the store kept its
                # actor, and that actor's CPU, for as long as the task's
                # result was referenced).
                self._release_contained_handles(entry)
                return
            # Only lineage needs it: free the stored copies, keep the entry
            # (a small inline value stays with it).
            for manager in sorted({manager for _node_id, manager in entry.locations}):
                self._outbox.send_later(manager, "free_objects", [object_id.binary()])
            self.set_locations(object_id, entry, ())
            self.release_contained(entry.contained_refs)
            entry.contained_refs = ()
            return
        del self.refs[object_id]
        if entry.owned and is_actor_handle(object_id):
            self._tracer.record(self._name, "actor_out_of_scope", actor=object_id.hex()[:32])
            if self._actor_out_of_scope is not None:
                self._actor_out_of_scope(object_id.hex()[:32])
        elif entry.owned:
            self._lineage_released(object_id.task_id())
            self._tracer.record(self._name, "object_freed", object=object_id)
            by_node: dict[str, list] = {}
            for _node_id, manager in entry.locations:
                by_node.setdefault(manager, []).append(object_id.binary())
            for manager, ids in sorted(by_node.items()):
                self._outbox.send_later(manager, "free_objects", ids)
            self.set_locations(object_id, entry, ())
            self.release_contained(entry.contained_refs)
        else:
            self._outbox.send_later(entry.owner, "remove_borrower", object_id.binary(),
                                    self.address)

    # ------------------------------------------------- submitted and contained

    def hold_submitted(self, object_id: ObjectID, owner: str) -> None:
        """A task this process submits takes the object as an argument."""
        self._entry_for(object_id, owner).submitted += 1

    def release_submitted(self, holds: list) -> None:
        """The tasks holding these objects as arguments are done with them."""
        for oid in holds:
            entry = self.refs.get(oid)
            if entry is not None:
                entry.submitted -= 1
                self.maybe_release(oid, entry)

    def _release_contained_handles(self, entry: RefEntry) -> None:
        handles = tuple(ref for ref in entry.contained_refs
                        if is_actor_handle(ObjectID(ref[0])))
        if handles:
            entry.contained_refs = tuple(ref for ref in entry.contained_refs
                                         if ref not in handles)
            self.release_contained(handles)

    def release_contained(self, contained: list) -> None:
        for oid_bytes, _owner in contained:
            oid = ObjectID(oid_bytes)
            entry = self.refs.get(oid)
            if entry is not None:
                entry.contained -= 1
                self.maybe_release(oid, entry)

    def hold_contained(self, contained: list) -> None:
        for oid_bytes, owner in contained:
            self._entry_for(ObjectID(oid_bytes), owner).contained += 1

    def adopt_contained(self, entry: RefEntry, contained: list) -> None:
        """The executor made this process a borrower of each ref inside a
        returned value; hold them while the returned object lives. A value
        that replaces an earlier one (a result re-created from lineage) lets
        go of what the earlier one held."""
        previous, entry.contained_refs = entry.contained_refs, tuple(contained)
        for oid_bytes, owner in contained:
            oid = ObjectID(oid_bytes)
            existing = self.refs.get(oid)
            if existing is None:
                self.refs[oid] = RefEntry(owner=owner, owned=owner == self.address, contained=1)
                continue
            existing.contained += 1
            if owner != existing.owner and not existing.owned and owner != self.address:
                # A re-created result: its task ran again on another worker,
                # which put the inner objects again under the same ids and
                # owns them now (its executor registered us there). Our
                # registration with the old owner goes, the new one stays:
                # undoing the new one freed the objects under us (mixed
                # chaos seed 158).
                self._outbox.send_later(existing.owner, "remove_borrower", oid_bytes,
                                        self.address)
                existing.owner = owner
            elif owner != self.address:
                # Already registered as a borrower: undo the executor's extra registration.
                self._outbox.send_later(owner, "remove_borrower", oid_bytes, self.address)
            else:
                self.handle_remove_borrower(None, oid_bytes, self.address)
        self.release_contained(previous)

    def balance_contained_borrows(self, contained: list) -> None:
        """A returned value nobody holds: undo the borrows made for its refs."""
        for oid_bytes, owner in contained:
            self._outbox.send_later(owner, "remove_borrower", oid_bytes, self.address)

    # ------------------------------------------------------------- values

    def store_value(self, object_id: ObjectID, entry: RefEntry,
                    serialized: SerializedObject) -> None:
        """The value of an owned object: inline when small, else in this node's store."""
        entry.contained_refs = tuple(serialized.contained)
        self.hold_contained(entry.contained_refs)
        if serialized.size_bytes() <= self._config.inline_object_max_bytes:
            entry.inline = serialized
        else:
            self._store.put(object_id.binary(), serialized.data, serialized.buffers,
                            owner=self.address)
            self.set_locations(object_id, entry, ((self._node_id, self._node_manager_address),))
        self.mark_ready(object_id, entry)

    def mark_ready(self, object_id: ObjectID, entry: RefEntry) -> None:
        """An owned object's value (or error) is in: its waiters run."""
        entry.ready = True
        self.ready_generation += 1
        if entry.event is not None:
            entry.event.set()
            entry.event = None
        if self.ready_listeners:
            for listener in tuple(self.ready_listeners.values()):
                listener(object_id, entry)

    def handle_add_location(self, conn, object_id: bytes, node_id: str, manager: str) -> None:
        entry = self.refs.get(ObjectID(object_id))
        if entry is None or not entry.owned:
            self._outbox.send_later(manager, "free_objects", [object_id])  # freed meanwhile
            return
        if (node_id, manager) not in entry.locations:
            self.set_locations(ObjectID(object_id), entry, entry.locations + ((node_id, manager),))

    def handle_objects_here(self, conn, node_id: str, manager: str, object_ids: list) -> list:
        """Which of these objects, stored on that node, this owner keeps
        there: those it knows there, and those not made yet (a task may be
        storing one there right now). The node frees the others."""
        held = []
        for object_id in object_ids:
            entry = self.refs.get(ObjectID(object_id))
            if entry is None or not entry.owned:
                continue
            if not entry.ready or (node_id, manager) in entry.locations:
                held.append(object_id)
        return held

    def has_copy_here(self, object_id: ObjectID) -> bool:
        """Does this process's node store hold a copy of the object?"""
        return self._store.contains(object_id.binary())

    def set_locations(self, object_id: ObjectID, entry: RefEntry, locations: tuple) -> None:
        """Where copies of an owned object live now: the one way
        ``entry.locations`` changes, so that ``_on_node`` stays true."""
        on_node = self._on_node
        for node_id, _manager in entry.locations:
            object_ids = on_node.get(node_id)
            if object_ids is not None:
                object_ids.discard(object_id)
                if not object_ids:
                    del on_node[node_id]
        entry.locations = locations
        for node_id, _manager in locations:
            object_ids = on_node.get(node_id)
            if object_ids is None:
                object_ids = on_node[node_id] = set()
            object_ids.add(object_id)

    def forget_node(self, node_id: str) -> None:
        """A node died: the copies it held are gone. (Each entry's copies
        are filtered on their own: the order does not matter.)"""
        for object_id in self._on_node.pop(node_id, ()):
            entry = self.refs[object_id]
            entry.locations = tuple(loc for loc in entry.locations if loc[0] != node_id)

    # ------------------------------------------------------------- borrowers

    def handle_add_borrower(self, conn, object_id: bytes, borrower: str) -> bool:
        oid = ObjectID(object_id)
        entry = self.refs.get(oid)
        if entry is None or not entry.owned:
            return False
        entry.borrowers[borrower] = entry.borrowers.get(borrower, 0) + 1
        self._borrowed_by.setdefault(borrower, {})[oid] = None
        return True

    def handle_add_borrower_oneway(self, conn, object_id: bytes, borrower: str) -> None:
        self.handle_add_borrower(conn, object_id, borrower)

    def handle_remove_borrower(self, conn, object_id: bytes, borrower: str) -> None:
        oid = ObjectID(object_id)
        entry = self.refs.get(oid)
        if entry is None or borrower not in entry.borrowers:
            return
        entry.borrowers[borrower] -= 1
        if entry.borrowers[borrower] <= 0:
            del entry.borrowers[borrower]
            self._forget_borrow(borrower, oid)
        self.maybe_release(oid, entry)

    def _forget_borrow(self, borrower: str, oid: ObjectID) -> None:
        borrowed = self._borrowed_by.get(borrower)
        if borrowed is not None:
            borrowed.pop(oid, None)
            if not borrowed:
                del self._borrowed_by[borrower]

    def peer_gone(self, address: str) -> None:
        """A process died: it borrows nothing any more."""
        for object_id in self._borrowed_by.pop(address, ()):
            entry = self.refs.get(object_id)
            if entry is not None and entry.owned and address in entry.borrowers:
                del entry.borrowers[address]
                self.maybe_release(object_id, entry)

    def register_borrow_later(self, object_id: ObjectID, owner: str) -> None:
        self._outbox.send_later(owner, "add_borrower_oneway", object_id.binary(), self.address)

    async def _register_borrows(self, refs: list) -> None:
        """Register this process as a borrower of each ref with its owner,
        and return once every owner has (or has gone). Reliable: a reset on
        the way neither loses a registration (the owner would free what is
        borrowed) nor applies it twice (a leak)."""
        async def register(ref: ObjectRef) -> None:
            try:
                await self._endpoint.call_reliable(ref._owner, "add_borrower_oneway",
                                                   ref.binary(), self.address)
            except PeerDisconnected:
                pass  # the owner died: get() on this ref reports OwnerDiedError
        if len(refs) == 1:
            await register(refs[0])
            return
        async with trio.open_nursery() as nursery:
            for ref in refs:
                nursery.start_soon(register, ref)

    async def deserialize(self, serialized: SerializedObject):
        """Deserialize, registering this process as borrower of every new
        ref inside before the value reaches user code."""
        borrows: list = []
        token = _new_borrows.set(borrows)
        try:
            value = deserialize(serialized)
        finally:
            _new_borrows.reset(token)
        if borrows:
            await self._register_borrows(borrows)
        return value
