"""What a task is, as it travels: the spec an owner builds at ``.remote()``
and sends to the worker that runs it (and keeps as lineage to run it again).

A spec is plain data; everything in it pickles. Its arguments are typed:
an argument is either carried by value (``ArgByValue``: small values,
serialized inline) or by reference (``ArgByRef``: an object in some store,
named by its id and its owner's address). Before a task is sent, the owner
resolves its by-reference arguments (``DependencyResolver``), replacing the
small ones by their values, so a worker only fetches what is big.

A spec is frozen: what holds one (a pending task, the lineage, a message
on its way) sees it as it was built. The few fields that move after
construction move by a new spec in the holder's place (``replace``), each
for a stated reason: ``attempt`` counts executions (a retry sends the spec
again, one attempt on), ``seq`` numbers an actor call once it is on the
loop, ``floor`` tells an actor which of the caller's calls are finished,
``args``/``kwargs`` are resolved before it is sent, and an actor's host
runs its constructor as a call of one return (``num_returns``,
``return_ids``)."""

from __future__ import annotations

from dataclasses import dataclass

from .runtime_env_keys import env_hash
from .scheduling import Strategy
from .serialization import SerializedObject, pickled_by_fields


@pickled_by_fields
@dataclass(frozen=True, slots=True)
class ArgByValue:
    """An argument carried inside the spec."""
    value: SerializedObject


@pickled_by_fields
@dataclass(frozen=True, slots=True)
class ArgByRef:
    """An argument held in an object store: fetched by the executing worker."""
    object_id: bytes
    owner: str


TaskArg = ArgByValue | ArgByRef


# The fields ``TaskSpec.replace`` may change (see the header): none of them
# feeds ``__post_init__``.
REPLACEABLE_FIELDS = frozenset({"attempt", "seq", "floor", "args", "kwargs", "num_returns",
                                "return_ids"})


@pickled_by_fields
@dataclass(frozen=True)
class TaskSpec:
    task_id: bytes
    job_id: int
    name: str
    function_id: str
    args: tuple  # TaskArg
    kwargs: dict  # name -> TaskArg
    num_returns: int
    return_ids: tuple  # oid bytes
    caller: str  # the owner's address: where results and borrows go
    resources: dict
    strategy: Strategy
    max_retries: int = 0
    retry_exceptions: object = False  # bool, or a tuple of exception classes
    attempt: int = 0
    parent_task_id: bytes = b""
    namespace: str = ""
    # Actor calls only: the actor, the method, the caller's sequence number
    # for this call, and the lowest sequence number the caller still waits on.
    actor_id: str | None = None
    method: str | None = None
    seq: int = 0
    floor: int = 0
    concurrency_group: str = ""  # "" : the actor's default group
    # Normal tasks and actor creations: the runtime_env, resolved (local
    # paths already packed into package URIs, see tray.runtime_env), and
    # its hash, which names the worker pool it runs in on its node ("" for
    # none). Actor calls carry none: they run in their actor's.
    runtime_env: dict | None = None
    runtime_env_hash: str = ""
    # How many tasks deep it was submitted: 1 from a driver's script, one
    # more than its submitter's otherwise (Ray's TaskSpec depth). A node
    # grants the deeper of its waiting lease requests first.
    depth: int = 1

    def __post_init__(self) -> None:
        if self.runtime_env and not self.runtime_env_hash:
            object.__setattr__(self, "runtime_env_hash", env_hash(self.runtime_env))

    def replace(self, **changes) -> TaskSpec:
        """This spec with ``changes`` (of ``REPLACEABLE_FIELDS`` only).

        ``dataclasses.replace`` less its cost: it calls ``__init__`` with
        every field (~10 us for a spec's 25, twice per actor call: its
        ``seq`` and its ``floor``); this copies the fields' dict (~1 us).
        The same result for these fields, which ``__post_init__`` does
        not read."""
        assert changes.keys() <= REPLACEABLE_FIELDS, sorted(changes.keys() - REPLACEABLE_FIELDS)
        fields = self.__dict__.copy()
        fields.update(changes)
        spec = object.__new__(TaskSpec)
        object.__setattr__(spec, "__dict__", fields)
        return spec

    def ref_args(self) -> list[ArgByRef]:
        """The by-reference arguments, positional then keyword."""
        return [arg for arg in [*self.args, *self.kwargs.values()] if isinstance(arg, ArgByRef)]
