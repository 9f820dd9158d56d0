"""A task's arguments: packed into its spec, and held while it is pending.

Each argument travels one of two ways (``task_spec.ArgByValue`` /
``ArgByRef``): a ref is passed by reference to its object; a value is
serialized into the spec, unless it is larger than
``inline_object_max_bytes``, in which case it is stored first as an object
of its own (owned here) and passed by reference. Packing happens in the
caller's thread (a serialization error is the caller's); holding happens on
the loop: every object a pending task refers to — ref arguments, refs
inside values, the large values stored for it — is held in the reference
counter (``hold_submitted``) until the task finishes, so none is freed
under it. Nothing is kept here."""

from __future__ import annotations

from ..context import TaskContext
from ..ids import ObjectID
from ..object_ref import ObjectRef
from ..serialization import serialize, short_repr
from ..task_spec import ArgByRef, ArgByValue
from .reference_counter import ReferenceCounter


class TaskArgs:
    def __init__(self, *, address: str, config, references: ReferenceCounter,
                 next_put_id) -> None:
        self._address = address
        self._config = config
        self._references = references
        # next_put_id(context) -> ObjectID: an id for an object the task's
        # caller creates (handed out under the core worker's ids lock).
        self._next_put_id = next_put_id

    def pack(self, args: tuple, kwargs: dict, name: str,
             context: TaskContext) -> tuple[list, dict, list, list]:
        """Pack arguments, in any thread: returns them, the (oid, owner)
        pairs the task will hold (``hold``, on the loop), and the
        large values to store first as objects of their own (oid, value)."""
        holds: list = []
        stores: list = []

        def one(value, key):
            if isinstance(value, ObjectRef):
                holds.append((value.object_id(), value._owner))
                return ArgByRef(value.binary(), value._owner)
            try:
                serialized = serialize(value)
            except TypeError as error:
                # The label only now: repr() of every argument cost ~5% of a submission.
                label = f"#{key}" if isinstance(key, int) else repr(key)
                raise TypeError(f"Could not serialize the argument {label} ({short_repr(value, 60)}) "
                                f"of {name}: {error}") from error.__cause__
            if serialized.size_bytes() > self._config.inline_object_max_bytes:
                object_id = self._next_put_id(context)
                holds.append((object_id, self._address))
                stores.append((object_id, serialized))
                return ArgByRef(object_id.binary(), self._address)
            holds.extend((ObjectID(oid_bytes), owner) for oid_bytes, owner in serialized.contained)
            return ArgByValue(serialized)

        packed_args = tuple([one(value, i) for i, value in enumerate(args)])
        packed_kwargs = {key: one(value, key) for key, value in kwargs.items()}
        return packed_args, packed_kwargs, holds, stores

    def hold(self, holds: list, stores: list) -> tuple:
        """On the loop: hold the task's arguments and store its large ones;
        returns the oids held (released when the task finishes)."""
        references = self._references
        held: list = []
        try:
            for oid, owner in holds:
                references.hold_submitted(oid, owner)
                held.append(oid)
            for oid, serialized in stores:
                references.store_value(oid, references.refs[oid], serialized)
        except BaseException:
            references.release_submitted(held)
            raise
        return tuple(held)  # untracked by the collector when empty, as most are
