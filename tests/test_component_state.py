"""Every stateful component of the core explains itself and checks itself.

Each component of the core worker, the node manager and the GCS that keeps
state has ``statistics()`` (a frozen record of cheap counts, as trio's
primitives have) and ``validate_state()`` (its invariants, one fact per
assert, as dask's worker state machine has); its facade's ``statistics()``
carries the component's record and its ``validate_state()`` chains the
component's, so the simulator, which checks each changed process after every
step, checks them all. These tests hold the list of such components (and of
those that keep no state) against the running code both ways, run them on a
small simulated program, show that calling them changes nothing the
simulation does (its trace digest), and plant one inconsistency per check to
see it caught."""

from __future__ import annotations

import dataclasses
import enum
import importlib
import inspect
import pkgutil
from collections import deque
from types import SimpleNamespace

import pytest
import trio

import tray
import tray.core
from tray.core.config import Config
from tray.core.gcs.actor_manager import ActorManager, ActorManagerStatistics
from tray.core.gcs.demand import DemandTable, DemandTableStatistics
from tray.core.gcs.gcs_server import GcsServer, GcsStatistics
from tray.core.gcs.kv_store import KvStore, KvStoreStatistics
from tray.core.gcs.node_table import NodeTable, NodeTableStatistics
from tray.core.gcs.placement_group_manager import (
    PlacementGroupManager,
    PlacementGroupStatistics,
)
from tray.core.gcs.task_event_table import TaskEventTable, TaskEventTableStatistics
from tray.core.ids import JobID
from tray.core.node.demand_reporter import DemandReporter, DemandReporterStatistics
from tray.core.node.lease_manager import LeaseManager, LeaseStatistics
from tray.core.node.memory_monitor import MemoryMonitor, MemoryMonitorStatistics
from tray.core.node.node_manager import NodeManager, NodeManagerStatistics
from tray.core.node.object_manager import ObjectManager, ObjectManagerStatistics
from tray.core.node.worker_pool import WorkerPool, WorkerPoolStatistics
from tray.core.rpc import Connection, ConnectionStatistics, Endpoint, EndpointStatistics
from tray.core.scheduling import GpuAllocator
from tray.core.trace import Trace
from tray.core.worker.actor_host import ActorHost, ActorHostStatistics
from tray.core.worker.actor_task_submitter import ActorSubmitterStatistics, ActorTaskSubmitter
from tray.core.worker.cancellation import TaskCanceller
from tray.core.worker.core_worker import CoreWorker, CoreWorkerStatistics
from tray.core.worker.dependency_resolver import DependencyResolver
from tray.core.worker.function_table import FunctionTable, FunctionTableStatistics
from tray.core.worker.gcs_client import GcsClient
from tray.core.worker.loop_bridge import LoopBridge
from tray.core.worker.normal_task_submitter import NormalTaskSubmitter, SubmitterStatistics
from tray.core.worker.object_getter import ObjectGetter
from tray.core.worker.object_recovery import ObjectRecoveryManager
from tray.core.worker.outbox import Outbox, OutboxStatistics
from tray.core.worker.reference_counter import ReferenceCounter, ReferenceStatistics
from tray.core.worker.task_args import TaskArgs
from tray.core.worker.task_events import (
    TaskAttemptEvents,
    TaskEventBuffer,
    TaskEventBufferStatistics,
)
from tray.core.worker.task_manager import TaskManager, TaskManagerStatistics
from tray.core.worker.task_receiver import TaskReceiver, TaskReceiverStatistics
from tray.core.worker.task_submission import TaskSubmission, TaskSubmissionStatistics
from tray.core.worker.thread_inbox import SingleThread, ThreadInbox, ThreadInboxStatistics
from tray.core.worker.thread_waits import ThreadWaits, ThreadWaitsStatistics
from tray.simtest import cluster as current_cluster
from tray.simtest import trace_digest

FACADES = (CoreWorker, NodeManager, GcsServer)

# Every component of the core that keeps state, and the record its
# statistics() returns.
STATEFUL = {
    # GCS
    GcsServer: GcsStatistics,
    NodeTable: NodeTableStatistics,
    ActorManager: ActorManagerStatistics,
    PlacementGroupManager: PlacementGroupStatistics,
    KvStore: KvStoreStatistics,
    DemandTable: DemandTableStatistics,
    TaskEventTable: TaskEventTableStatistics,
    # node manager
    NodeManager: NodeManagerStatistics,
    WorkerPool: WorkerPoolStatistics,
    LeaseManager: LeaseStatistics,
    MemoryMonitor: MemoryMonitorStatistics,
    DemandReporter: DemandReporterStatistics,
    ObjectManager: ObjectManagerStatistics,
    # core worker
    CoreWorker: CoreWorkerStatistics,
    ReferenceCounter: ReferenceStatistics,
    TaskManager: TaskManagerStatistics,
    TaskSubmission: TaskSubmissionStatistics,
    NormalTaskSubmitter: SubmitterStatistics,
    ActorTaskSubmitter: ActorSubmitterStatistics,
    ActorHost: ActorHostStatistics,
    TaskReceiver: TaskReceiverStatistics,
    FunctionTable: FunctionTableStatistics,
    Outbox: OutboxStatistics,
    TaskEventBuffer: TaskEventBufferStatistics,
    ThreadInbox: ThreadInboxStatistics,
    ThreadWaits: ThreadWaitsStatistics,
    # every service's connections (a Connection lives in its endpoint's tables)
    Endpoint: EndpointStatistics,
    Connection: ConnectionStatistics,
}

# Components that keep no state of their own: their collaborators' tables
# hold what they work on.
STATELESS = {DependencyResolver, GcsClient, ObjectGetter, ObjectRecoveryManager, TaskCanceller,
             TaskArgs, LoopBridge, SingleThread}

# Objects of tray.core that the services hold and that are not components:
# a value, the run's trace (the backend's, handed in as env.tracer), and a
# part of the lease manager, which checks it with its own state.
NOT_COMPONENTS = {JobID, Trace, GpuAllocator}


@tray.remote
def add_one(x: int) -> int:
    return x + 1


@tray.remote
def total(values: list) -> int:
    return sum(values)


@tray.remote
class Counter:
    def __init__(self) -> None:
        self.count = 0

    def add(self, amount: int) -> int:
        self.count += amount
        return self.count


def _program(after_each=None) -> None:
    """A few tasks, an actor, a put; ``after_each()`` between the steps."""
    after_each = after_each or (lambda: None)
    assert tray.get([add_one.remote(i) for i in range(4)]) == [1, 2, 3, 4]
    after_each()
    counter = Counter.remote()
    assert tray.get([counter.add.remote(1), counter.add.remote(2)]) == [1, 3]
    after_each()
    big = tray.put(list(range(10_000)))  # stored, not inline
    assert tray.get(total.remote(big)) == sum(range(10_000))
    after_each()
    assert tray.get(add_one.remote(tray.put(41))) == 42
    after_each()


# ------------------------------------------------------------------ helpers

def _attributes(value):
    if hasattr(value, "__dict__"):
        yield from vars(value).values()
    for cls in type(value).__mro__:
        for name in getattr(cls, "__slots__", ()):
            if hasattr(value, name):
                yield getattr(value, name)


def _is_core_object(value) -> bool:
    """An object of a class of tray.core that is not a record (a
    dataclass), an enum member, an exception or a class."""
    return type(value).__module__.startswith("tray.core.") and \
        not dataclasses.is_dataclass(value) and \
        not isinstance(value, (enum.Enum, BaseException, type))


def _reachable(facade) -> list:
    """The facade and the objects of tray.core reachable from it through
    attributes (not through tables: entries of a dict are state, not parts)."""
    seen, found = {id(facade)}, [facade]
    for value in found:
        for attribute in _attributes(value):
            if _is_core_object(attribute) and id(attribute) not in seen:
                seen.add(id(attribute))
                found.append(attribute)
    return found


def _facades() -> list:
    processes = current_cluster().processes
    return [process.component for _, process in sorted(processes.items())
            if process.alive and isinstance(process.component, FACADES)]


def _component(address: str, attribute: str | None = None):
    component = current_cluster().processes[address].component
    return component if attribute is None else getattr(component, attribute)


def _records(record) -> set[type]:
    """The types of ``record`` and of every record inside it."""
    found = {type(record)}
    for field in dataclasses.fields(record):
        value = getattr(record, field.name)
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            found |= _records(value)
    return found


@pytest.fixture
def sim():
    tray.init(backend="sim", seed=0, num_cpus=2, validate_every_steps=1)
    try:
        _program()
        yield current_cluster()
    finally:
        tray.shutdown()


# ------------------------------------------------------------ the lists

def test_every_core_class_with_handlers_is_listed():
    classes = set()
    for module_info in pkgutil.walk_packages(tray.core.__path__, "tray.core."):
        module = importlib.import_module(module_info.name)
        for value in vars(module).values():
            if inspect.isclass(value) and value.__module__ == module.__name__ and \
                    any(name.startswith("handle_") for name in vars(value)):
                classes.add(value)
    assert classes, "no class of tray.core defines handle_* methods"
    unlisted = classes - STATEFUL.keys() - STATELESS
    assert not unlisted, f"classes with handlers in neither list: {unlisted}"


def test_every_object_the_services_hold_is_listed_and_every_listed_class_is_used(sim):
    found = {type(value) for facade in _facades() for value in _reachable(facade)}
    unlisted = found - STATEFUL.keys() - STATELESS - NOT_COMPONENTS
    assert not unlisted, f"objects of tray.core the services hold, in no list: {unlisted}"
    # (A connection is in its endpoint's tables, not an attribute.)
    unused = (STATEFUL.keys() | STATELESS) - found - {Connection}
    assert not unused, f"listed, but no service holds one: {unused}"


def test_every_stateful_component_has_both_methods():
    for cls, record in STATEFUL.items():
        assert callable(getattr(cls, "statistics", None)), cls.__name__
        assert callable(getattr(cls, "validate_state", None)), cls.__name__
        assert dataclasses.is_dataclass(record), record.__name__
        assert record.__dataclass_params__.frozen, record.__name__
    for cls in STATELESS:
        assert not hasattr(cls, "statistics"), cls.__name__
        assert not hasattr(cls, "validate_state"), cls.__name__


def test_stateless_components_hold_no_tables(sim):
    for facade in _facades():
        for value in _reachable(facade):
            if type(value) in STATELESS:
                tables = [name for name, attribute in vars(value).items()
                          if isinstance(attribute, (dict, list, set, deque))]
                assert not tables, (type(value).__name__, tables)


# ------------------------------------------------------- on a simulated run

def test_each_component_returns_its_record_and_passes_its_checks(sim):
    checked = set()
    for facade in _facades():
        components = _reachable(facade)
        endpoint = facade.endpoint
        components += [endpoint.open_connection(peer) for peer in endpoint.peers()
                       if endpoint.open_connection(peer) is not None]
        for component in components:
            cls = type(component)
            if cls not in STATEFUL:
                continue
            statistics = component.statistics()
            assert type(statistics) is STATEFUL[cls], cls.__name__
            component.validate_state()
            checked.add(cls)
    assert checked == STATEFUL.keys()


def test_each_facade_carries_and_checks_every_component(sim, monkeypatch):
    validated: set[int] = set()
    for cls in STATEFUL:
        original = cls.validate_state

        def validate_state(self, original=original) -> None:
            validated.add(id(self))
            original(self)

        monkeypatch.setattr(cls, "validate_state", validate_state)
    for facade in _facades():
        components = [value for value in _reachable(facade) if type(value) in STATEFUL]
        validated.clear()
        facade.validate_state()
        missed = [type(value).__name__ for value in components if id(value) not in validated]
        assert not missed, f"{type(facade).__name__}.validate_state skips {missed}"
        records = _records(facade.statistics())
        missing = [type(value).__name__ for value in components
                   if STATEFUL[type(value)] not in records]
        assert not missing, f"{type(facade).__name__}.statistics() lacks {missing}"


def _every_component_reports_and_checks() -> None:
    for facade in _facades():
        for component in _reachable(facade):
            if type(component) in STATEFUL:
                component.statistics()
                component.validate_state()


def _digest(seed: int, validate_every_steps: int, after_each=None) -> str:
    tray.init(backend="sim", seed=seed, num_cpus=2, validate_every_steps=validate_every_steps)
    try:
        _program(after_each)
    finally:
        tray.shutdown()
    return trace_digest()


def test_reporting_and_checking_change_nothing_the_simulation_does():
    # No mutation that matters, no random draw, no trace record: the same
    # seed's run leaves the same trace with the checks after every step and
    # with every component reporting and checking itself between the steps.
    plain = _digest(3, 0)
    assert _digest(3, 1) == plain
    assert _digest(3, 0, _every_component_reports_and_checks) == plain


# ------------------------------------------------ planted inconsistencies

def _plant_kv_store(monkeypatch):
    kv = _component("n0/gcs", "kv")
    keys = next(iter(kv._running_jobs.values()))
    monkeypatch.setitem(kv._running_jobs, "n9/driver", [keys[0]])  # one job, two drivers
    return kv


def _plant_node_table(monkeypatch):
    nodes = _component("n0/gcs", "node_table")
    node_id = next(iter(nodes.nodes))
    monkeypatch.setitem(nodes._at_address, "n9/raylet", {node_id: None})  # a wrong address
    return nodes


def _plant_actor_manager(monkeypatch):
    actors = _component("n0/gcs", "actor_manager")
    actor_id = next(iter(actors.actors))
    monkeypatch.setitem(actors._by_owner, "n9/driver", {actor_id: None})  # a second owner
    return actors


def _plant_placement_groups(monkeypatch):
    groups = _component("n0/gcs", "placement_groups")
    monkeypatch.setattr(groups, "preparing", {("no-such-group", 0, "n0")})
    return groups


def _plant_demand(monkeypatch):
    demand = _component("n0/gcs", "demand")
    monkeypatch.setitem(demand.reports, "ghost", SimpleNamespace(node_id="ghost"))
    return demand


def _plant_task_event_table(monkeypatch):
    table = _component("n0/gcs", "task_events")
    monkeypatch.setattr(table, "dropped_here", -1)
    return table


def _plant_object_manager(monkeypatch):
    objects = _component("n0/raylet", "objects")
    done = trio.Event()
    done.set()  # a pull still in the table after it woke its waiters
    monkeypatch.setitem(objects._pulls, bytes(28), done)
    return objects


def _plant_function_table(monkeypatch):
    functions = _component("n0/driver", "functions")
    # Waiting for upload, but not noted as exported.
    monkeypatch.setitem(functions._pending_exports, "0" * 32, b"blob")
    return functions


def _plant_outbox(monkeypatch):
    outbox = _component("n0/driver", "outbox")
    monkeypatch.setattr(outbox, "_queue", deque([("n0/gcs", None, ())]))  # no method
    return outbox


def _plant_task_receiver(monkeypatch):
    receiver = _component("n0/driver", "receiver")
    # A cancel requested of a task that does not run here.
    monkeypatch.setattr(receiver, "_cancel_requested", {bytes(24)})
    return receiver


def _plant_task_event_buffer(monkeypatch):
    events = _component("n0/driver", "task_events")
    record = TaskAttemptEvents(bytes(24), 0, states={"RUNNING": 0.0})
    monkeypatch.setattr(events, "_events", {(bytes(24), 1): record})  # under another attempt
    return events


def _plant_thread_inbox(monkeypatch):
    inbox = _component("n0/driver", "inbox")
    assert isinstance(inbox._taken, SingleThread)
    # Queued, with no drain coming.
    monkeypatch.setattr(inbox, "_ops", deque([(print, ())]))
    monkeypatch.setattr(inbox, "_scheduled", False)
    return inbox


def _plant_endpoint(monkeypatch):
    endpoint = _component("n0/driver", "endpoint")
    assert endpoint._reliable_seq >= 2
    # Reliable messages queued out of their order.
    monkeypatch.setitem(endpoint._unacked, "n9/raylet",
                        deque([(2, "free_objects", (), None), (1, "free_objects", (), None)]))
    return endpoint


def _plant_connection(monkeypatch):
    endpoint = _component("n0/driver", "endpoint")
    connection = endpoint.open_connection("n0/gcs")
    assert connection is not None
    monkeypatch.setattr(connection, "closed", True)  # closed, still in the table
    return endpoint


def _plant_fresh_connection(monkeypatch):
    # A fresh one: closed with a call still waiting for its reply.
    connection = Connection(None, {}, None, "n9/raylet", pending_calls_max=8)
    connection._next_call_id = 2
    connection._pending[1] = object()
    connection.closed = True
    return connection


def _plant_fresh_kv_store(monkeypatch):
    # A fresh one: more users' keys counted than its bound allows.
    from tray.backends.storage import MemoryStorage

    kv = KvStore(MemoryStorage(), tracer=None, config=Config(user_kv_keys_max=2))
    kv._user_keys = 3
    return kv


PLANTS = {
    "kv_store": _plant_kv_store,
    "kv_store_fresh": _plant_fresh_kv_store,
    "node_table": _plant_node_table,
    "actor_manager": _plant_actor_manager,
    "placement_groups": _plant_placement_groups,
    "demand": _plant_demand,
    "task_event_table": _plant_task_event_table,
    "object_manager": _plant_object_manager,
    "function_table": _plant_function_table,
    "outbox": _plant_outbox,
    "task_receiver": _plant_task_receiver,
    "task_event_buffer": _plant_task_event_buffer,
    "thread_inbox": _plant_thread_inbox,
    "endpoint": _plant_endpoint,
    "connection_in_table": _plant_connection,
    "connection_fresh": _plant_fresh_connection,
}


@pytest.mark.parametrize("where", sorted(PLANTS))
def test_a_planted_inconsistency_is_caught(sim, monkeypatch, where):
    facades = _facades()
    for facade in facades:
        facade.validate_state()  # sound before
    component = PLANTS[where](monkeypatch)
    with pytest.raises(AssertionError):
        component.validate_state()
    # Its service's check finds it too (the one the simulator runs).
    owners = [facade for facade in facades
              if any(value is component for value in _reachable(facade))]
    for facade in owners:
        with pytest.raises(AssertionError):
            facade.validate_state()
    monkeypatch.undo()
    for facade in facades:
        facade.validate_state()  # and sound again
