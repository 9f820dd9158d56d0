"""The records that cross between processes, typed.

Every message is a small dataclass (frozen where nobody needs to change it)
rather than a tagged tuple or a dict told apart by which key is present, so
a reader sees what a message holds and a type checker sees a missing case.
They are plain data: they pickle, and nothing mutable in them is shared by
reference between processes (the transports copy every message; the
simulated one shares a frozen message whose fields are all immutable,
``transports/sim.copy_message``: keep frozen ones free of lists and dicts
where that is natural, and they cross simulated processes for free).

* Results and object states: ``InlineResult`` (the value travels in the
  message), ``StoredResult`` (the value is in node stores, at
  ``locations``), ``FailedResult`` (the error ``get`` raises).
* Leases: ``LeaseRequest``, answered by ``LeaseGranted``, ``Spillback``,
  ``Infeasible`` or ``LeaseWithdrawn``.
* Membership: ``NodeRecord`` (the GCS's row for a node), views as
  ``scheduling.NodeView`` per node, ``ViewUpdate``, ``HeartbeatReply``.
* Actors: ``ActorSpec`` (what the owner registers), ``ActorRecord`` (the
  GCS's row, stored in ``Storage`` with a ``version``), ``ActorInfo`` (what
  callers learn); its state an ``ActorStatus``.
* Placement groups: ``PlacementGroupSpec``, ``PlacementGroupRecord``
  (stored, versioned), ``PlacementGroupInfo``; the state a
  ``PlacementGroupStatus``.
* Replies of the node manager (``WorkerRegistered``, ``WorkerFailureCause``,
  ``NodeStats``, ``WorkerRow``) and of the state API's questions
  (``TaskEventPage``, ``TaskSummaryReply``, ``ActorStatePage``,
  ``ObjectReport``: typed envelopes around rows that stay dicts).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from .scheduling import NodeView, Strategy
from .serialization import KIND_ERROR, SerializedObject, pickled_by_fields
from .task_spec import TaskSpec

# ==================================================== results and objects


@pickled_by_fields
@dataclass(frozen=True, slots=True)
class InlineResult:
    """A value small enough to travel inside messages."""
    value: SerializedObject

    @property
    def serialized(self) -> SerializedObject:
        return self.value


@pickled_by_fields
@dataclass(frozen=True, slots=True)
class StoredResult:
    """A value in node stores: ``locations`` are (node id, node manager
    address) pairs; ``contained`` the (object id, owner) of refs inside it."""
    locations: list
    contained: list = field(default_factory=list)


@pickled_by_fields
@dataclass(frozen=True, slots=True)
class FailedResult:
    """The error that ``get`` raises for this object."""
    error: SerializedObject

    @property
    def serialized(self) -> SerializedObject:
        return self.error


TaskResult = InlineResult | StoredResult | FailedResult
# What an owner says of an object it owns: the same three shapes.
ObjectStatus = TaskResult


def inline_or_failed(value: SerializedObject) -> InlineResult | FailedResult:
    """An in-memory value as a result: errors are kept as serialized values too."""
    return FailedResult(value) if value.kind == KIND_ERROR else InlineResult(value)


@pickled_by_fields
@dataclass(frozen=True, slots=True)
class TaskReply:
    """A worker's answer to a pushed task or an actor call: one result per
    return, and whether the task raised (so the owner may retry it).
    ``worker_exiting``: the worker ran its function's ``max_calls``-th call
    and exits now, so its lease must not take another task (Ray's
    PushTaskReply.worker_exiting)."""
    results: list  # [TaskResult]
    application_error: bool = False
    worker_exiting: bool = False


# ================================================================= leases


@pickled_by_fields
@dataclass(frozen=True, slots=True)
class LeaseRequest:
    resources: dict
    strategy: Strategy
    owner: str  # who holds the lease and must return it
    hops: int = 0  # spillbacks so far
    for_actor: str | None = None  # an actor's dedicated worker (the GCS asks)
    # Its task may run again if its worker dies (max_retries != 0): the
    # memory monitor kills retriable work first.
    retriable: bool = True
    # The task's runtime_env hash: its worker must be set up for that env
    # (tray.runtime_env); "" for none.
    runtime_env_hash: str = ""
    # Its tasks' depth (TaskSpec.depth): the node grants deeper requests first.
    depth: int = 1


@pickled_by_fields
@dataclass(frozen=True, slots=True)
class LeaseGranted:
    lease_id: int
    node_id: str
    gpu_ids: list
    worker_id: str
    worker_address: str


@pickled_by_fields
@dataclass(frozen=True, slots=True)
class Spillback:
    """Ask the node manager at ``address`` instead."""
    address: str
    node_id: str


@pickled_by_fields
@dataclass(frozen=True, slots=True)
class Infeasible:
    """No node (or not the required one) could ever run the request."""
    reason: str


@pickled_by_fields
@dataclass(frozen=True, slots=True)
class LeaseWithdrawn:
    """The requester went away while the request waited; nobody reads this."""


LeaseReply = LeaseGranted | Spillback | Infeasible | LeaseWithdrawn


# ============================================================= membership


@dataclass
class NodeRecord:
    """A node as the GCS knows it (and stores it)."""
    node_id: str
    address: str  # the node manager's
    resources: dict
    available: dict
    object_store_bytes: int = 0
    alive: bool = True
    # Where the node keeps things, for drivers that attach on its machine.
    hostname: str = ""
    ip: str = ""
    store_directory: str = ""
    spill_directory: str = ""
    session_dir: str = ""

    def view(self) -> NodeView:
        return NodeView(self.node_id, self.address, dict(self.resources), dict(self.available),
                        self.alive)


@pickled_by_fields
@dataclass(frozen=True, slots=True)
class ViewUpdate:
    """The cluster view, whole or as what changed in it (see
    gcs/node_table.py): ``nodes`` holds every node when ``base_version`` is
    -1, else only the nodes that changed after ``base_version``; applying it
    brings a view to ``version`` of the GCS incarnation ``epoch``."""
    epoch: int
    version: int
    base_version: int
    nodes: dict  # node id -> NodeView


@pickled_by_fields
@dataclass(frozen=True, slots=True)
class HeartbeatReply:
    view: ViewUpdate | None  # None when `dead`
    dead: bool = False  # the GCS declared the sender dead: it must fence itself


# ================================================================= actors



class ActorStatus(enum.StrEnum):
    """Where an actor is in its life, as the GCS keeps it (Ray's
    ``ActorTableData.ActorState``): ``PENDING_CREATION -> ALIVE ->
    (RESTARTING -> ALIVE)* -> DEAD`` (``gcs/actor_manager.py``). As
    ``task_status.TaskStatus``, valued by the names; the state API's rows
    carry the text. Named Status, not State: ``tray.util.state.ActorState``
    is the state API's actor record."""
    PENDING_CREATION = "PENDING_CREATION"
    ALIVE = "ALIVE"
    RESTARTING = "RESTARTING"
    DEAD = "DEAD"


@dataclass(frozen=True)
class ActorSpec:
    """An actor as its owner registers it; never changes afterwards."""
    actor_id: str
    class_name: str
    name: str | None
    namespace: str
    get_if_exists: bool
    owner_address: str
    detached: bool
    max_restarts: int
    max_task_retries: int
    resources: dict
    strategy: Strategy
    is_async: bool
    method_meta: dict
    creation: TaskSpec  # the constructor call
    max_concurrency: int | None = None
    max_pending_calls: int = -1  # per caller process; -1: no limit
    concurrency_groups: dict = field(default_factory=dict)  # name -> max concurrency
    # The owner's node: when the GCS declares it dead, the owner is gone too,
    # although its own connection may have closed unseen (while the GCS was
    # restarting) and no worker death was reported (its node went with it).
    owner_node_id: str = ""


@pickled_by_fields
@dataclass(frozen=True, slots=True)
class ActorDeathCause:
    reason: str
    error: SerializedObject | None = None  # the constructor's exception, if that was it
    placement_group_removed: bool = False  # it died because its group was removed


@dataclass
class ActorRecord:
    """The GCS's row for an actor. Stored (pickled) in ``Storage``, so a
    restarted GCS (Redis) reads it back: ``version`` changes when the shape
    of this record does."""
    VERSION = 1

    spec: ActorSpec
    state: ActorStatus = ActorStatus.PENDING_CREATION
    address: str | None = None
    worker_id: str | None = None
    node_id: str | None = None
    lease_id: int | None = None
    restarts: int = 0
    incarnation: int = 0  # counts creations; callers wait for a newer one after a death
    death_cause: ActorDeathCause | None = None
    # tray.kill(no_restart=False): the next restart does not spend the budget.
    restart_budget_bypass: bool = False
    version: int = VERSION

    @property
    def actor_id(self) -> str:
        return self.spec.actor_id

    def info(self) -> ActorInfo:
        spec = self.spec
        return ActorInfo(actor_id=spec.actor_id, state=self.state, address=self.address,
                         worker_id=self.worker_id, node_id=self.node_id, name=spec.name,
                         namespace=spec.namespace, restarts=self.restarts,
                         max_restarts=spec.max_restarts, death_cause=self.death_cause,
                         incarnation=self.incarnation, class_name=spec.class_name,
                         max_task_retries=spec.max_task_retries, is_async=spec.is_async,
                         method_meta=spec.method_meta,
                         max_pending_calls=spec.max_pending_calls)


@dataclass(frozen=True)
class ActorInfo:
    """What callers learn of an actor from the GCS."""
    actor_id: str
    state: ActorStatus
    address: str | None
    worker_id: str | None
    node_id: str | None
    name: str | None
    namespace: str
    restarts: int
    max_restarts: int
    death_cause: ActorDeathCause | None
    incarnation: int
    class_name: str
    max_task_retries: int
    is_async: bool
    method_meta: dict
    max_pending_calls: int = -1


@pickled_by_fields
@dataclass(frozen=True, slots=True)
class ActorCreation:
    """The GCS's reply to ``create_actor``: ``existing`` is the live actor of
    that name when the owner asked for ``get_if_exists``."""
    existing: ActorInfo | None = None


# ======================================================= placement groups



class PlacementGroupStatus(enum.StrEnum):
    """Where a placement group is (Ray's ``PlacementGroupTableData``
    states): PENDING until every bundle is reserved, then CREATED;
    RESCHEDULING when a node holding some of its bundles died; REMOVED for
    good (``gcs/placement_group_manager.py``). Valued by the names, as
    ``ActorStatus``."""
    PENDING = "PENDING"
    CREATED = "CREATED"
    RESCHEDULING = "RESCHEDULING"
    REMOVED = "REMOVED"


@dataclass(frozen=True)
class PlacementGroupSpec:
    """A placement group as its creator asks for it; never changes."""
    pg_id: str
    name: str
    namespace: str
    bundles: list  # [{resource: amount}]
    strategy: str  # PACK | SPREAD | STRICT_PACK | STRICT_SPREAD
    detached: bool
    owner_address: str


@dataclass
class PlacementGroupRecord:
    """The GCS's row for a placement group (stored; ``version`` changes with
    the shape of this record)."""
    VERSION = 1

    spec: PlacementGroupSpec
    state: PlacementGroupStatus = PlacementGroupStatus.PENDING
    bundle_nodes: dict = field(default_factory=dict)  # bundle index -> node id
    version: int = VERSION

    @property
    def pg_id(self) -> str:
        return self.spec.pg_id


@dataclass(frozen=True)
class PlacementGroupInfo:
    """What callers learn of a placement group."""
    pg_id: str
    name: str
    namespace: str
    bundles: list
    strategy: str
    state: PlacementGroupStatus
    detached: bool
    bundle_nodes: dict  # bundle index -> node id (placed bundles only)
    bundle_addresses: dict  # bundle index -> that node's node manager address


# =================================================== node manager replies


@pickled_by_fields
@dataclass(frozen=True, slots=True)
class WorkerRegistered:
    """The node manager's reply to ``register_worker``."""
    node_id: str


@pickled_by_fields
@dataclass(frozen=True, slots=True)
class WorkerFailureCause:
    """Why a lease's worker died, as its node knows it (the reply to
    ``worker_failure_cause``): ``kind`` "out_of_memory" (its memory monitor
    killed it), ``message`` the reason as the owner's error tells it (with
    the numbers the monitor decided on: ``MemoryKill.describe``),
    ``should_retry`` whether its owner had other tasks running there."""
    kind: str
    message: str
    should_retry: bool


@pickled_by_fields
@dataclass(frozen=True, slots=True)
class NodeStats:
    """A node's reply to ``get_node_stats``: its resources (``total``,
    ``available``: name -> amount), live workers and workers started so far,
    leases held, and its object store's use."""
    node_id: str
    total: dict
    available: dict
    workers: int
    workers_started: int
    leases: int
    store_used_bytes: int


@pickled_by_fields
@dataclass(frozen=True, slots=True)
class WorkerRow:
    """One of a node's worker processes (``list_workers``): ``state`` is
    the text of its ``worker_pool.WorkerState``."""
    worker_id: str
    address: str | None
    state: str
    lease_id: int | None


# ============================================== GCS introspection replies
# The rows stay dicts (and tuples): a page may carry 100,000 of them, and
# building them is the cost of a query; the envelope is typed.


@pickled_by_fields
@dataclass(frozen=True, slots=True)
class TaskEventPage:
    """The GCS's reply to ``get_task_events``: the chosen attempts' rows
    (oldest first), its clock's ``now``, what its bounded tables dropped
    (``dropped_at_gcs``, ``dropped_at_sources``), whether more matched
    than the limit, and how many rows it keeps."""
    rows: list  # [dict]: see gcs/task_event_table.py
    now: float
    dropped_at_gcs: int
    more: bool
    dropped_at_sources: int
    stored: int


@pickled_by_fields
@dataclass(frozen=True, slots=True)
class TaskSummaryReply:
    """The GCS's reply to ``summarize_task_events``: attempts counted by
    function (name -> {"func_or_class_name", "type", "state_counts"}), with
    what was dropped and how many rows it keeps, as ``TaskEventPage``."""
    summary: dict
    dropped_at_gcs: int
    dropped_at_sources: int
    stored: int


@pickled_by_fields
@dataclass(frozen=True, slots=True)
class ActorStatePage:
    """The GCS's reply to ``list_actor_states``: a dict per actor (Ray's
    ActorState fields), with the times on its clock, whose ``now`` it is."""
    rows: list  # [dict]: see gcs/actor_manager.py
    now: float


# ================================================== core worker replies


@pickled_by_fields
@dataclass(frozen=True, slots=True)
class ObjectReport:
    """A worker's or driver's reply to ``object_report``: a dict per object
    it references (``worker/state_report.py``; at most
    ``OBJECT_REPORT_MAX``, ``left_out`` counts the rest), and who it is:
    its pid, node, ``worker_type`` ("DRIVER" or "WORKER"), worker id and
    address."""
    rows: list  # [dict]
    left_out: int
    pid: int
    node_id: str
    worker_type: str
    worker_id: str
    address: str
