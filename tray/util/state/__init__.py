"""The state API, as Ray's ``ray.util.state``: what the cluster runs, now.

::

    from tray.util.state import list_actors, list_tasks, summarize_tasks
    list_actors(filters=[("state", "=", "ALIVE")])
    list_tasks(filters=[("state", "!=", "FINISHED")], detail=True, limit=50)
    summarize_tasks()

Functions (Ray's names and fields): ``list_nodes``, ``list_actors``,
``list_tasks``, ``list_objects``, ``list_workers``, ``list_jobs``,
``list_placement_groups``, ``get_actor``, ``get_task``, ``get_node``,
``summarize_tasks``, ``summarize_actors``, ``summarize_objects``, and
``memory_summary`` (the data behind ``tray memory``). Each ``list_*``
returns a list of state records (``ActorState``, ``TaskState``...,
dataclasses that also read like dicts: ``actor["state"]``), at most
``limit`` (100 by default, as Ray's), filtered by ``filters`` — a list of
``(key, predicate, value)`` with predicate ``"="`` or ``"!="``, ANDed;
values compare as strings, and state-like keys (``state``, ``type``...)
case-insensitively. Unknown keys or predicates raise ``ValueError`` naming
what is allowed. ``detail=False`` leaves the detail-only fields ``None``
(Ray's columns).

**Where the answers come from.** Nodes, actors, placement groups and jobs:
the GCS's tables. Tasks: the GCS's task event table, fed by every process
in batches every ``task_events_flush_period_s`` (1 s): a task shows up to
a second late, and ``TaskState`` rows are kept for the newest 100,000
attempts (``list_tasks`` warns when some were dropped). Objects and
workers: each node's manager and each worker, asked once per call (as Ray
asks every core worker through its raylet).

**Reaching the cluster — the entry point for the CLI and the dashboard.**
Every function takes ``address``:

* ``address=None`` in a process that called ``tray.init()`` (or inside a
  task): through that connection, on either backend (the simulator too).
* ``address="auto"`` or ``address="host:port"`` (the GCS's, as ``tray start
  --head`` prints it): from *any* process on this machine, without joining
  the cluster or registering a job — the token comes from
  ``$TRAY_CLUSTER_TOKEN`` or the session files of the cluster started here
  (``tray.backends.local.resolve_cluster``). ``address=None`` in a process
  that is not connected means ``"auto"``. Each call opens short-lived
  connections (one to the GCS, one per node or worker it must ask) and
  runs its own trio loop: call it from a plain thread (in an asyncio
  server, ``await asyncio.to_thread(list_actors, address=...)``).

Errors: ``tray.exceptions.TrayError`` when no cluster answers at the
address (or rejects the token), ``ValueError`` for bad filters, limits or
ids."""

from __future__ import annotations

import dataclasses
import os
import time
import warnings
from collections import Counter
from dataclasses import dataclass, field

from ... import exceptions

DEFAULT_LIMIT = 100
# How long one query may take (Ray's default for the state API too).
DEFAULT_TIMEOUT_S = 30.0
_PREDICATES = ("=", "!=")
# Keys whose values are Ray enum names: compared case-insensitively.
_ENUM_KEYS = {"state", "type", "reference_type", "task_status", "worker_type", "status",
              "error_type", "strategy"}


def _detail() -> dict:
    return {"detail": True}


class _Record:
    """A state record reads like a dict too (``row["state"]``), as Ray's do."""

    def __getitem__(self, key: str):
        try:
            return getattr(self, key)
        except AttributeError:
            raise KeyError(key) from None

    def get(self, key: str, default=None):
        return getattr(self, key, default)

    def keys(self) -> list[str]:
        return [f.name for f in dataclasses.fields(self)]

    def asdict(self) -> dict:
        return dataclasses.asdict(self)


@dataclass
class NodeState(_Record):
    node_id: str
    node_ip: str
    is_head_node: bool
    state: str  # ALIVE | DEAD
    node_name: str
    resources_total: dict
    resources_available: dict | None = field(default=None, metadata=_detail())
    address: str | None = field(default=None, metadata=_detail())
    object_store_total_bytes: int | None = field(default=None, metadata=_detail())
    session_dir: str | None = field(default=None, metadata=_detail())


@dataclass
class ActorState(_Record):
    actor_id: str
    class_name: str
    state: str  # DEPENDENCIES_UNREADY | PENDING_CREATION | ALIVE | RESTARTING | DEAD
    job_id: str
    name: str
    node_id: str | None
    pid: int | None
    ray_namespace: str
    num_restarts: int
    worker_id: str | None = field(default=None, metadata=_detail())
    required_resources: dict | None = field(default=None, metadata=_detail())
    death_cause: str | None = field(default=None, metadata=_detail())
    is_detached: bool | None = field(default=None, metadata=_detail())
    placement_group_id: str | None = field(default=None, metadata=_detail())
    repr_name: str | None = field(default=None, metadata=_detail())
    max_restarts: int | None = field(default=None, metadata=_detail())
    owner_address: str | None = field(default=None, metadata=_detail())
    address: str | None = field(default=None, metadata=_detail())
    # [{"state": ..., "created_ms": ...}] as Ray's task events.
    events: list | None = field(default=None, metadata=_detail())


@dataclass
class TaskState(_Record):
    task_id: str
    attempt_number: int
    name: str
    state: str
    job_id: str
    actor_id: str | None
    type: str  # NORMAL_TASK | ACTOR_TASK | ACTOR_CREATION_TASK
    func_or_class_name: str
    parent_task_id: str
    node_id: str | None
    worker_id: str | None
    worker_pid: int | None
    error_type: str | None
    language: str | None = field(default=None, metadata=_detail())
    required_resources: dict | None = field(default=None, metadata=_detail())
    placement_group_id: str | None = field(default=None, metadata=_detail())
    events: list | None = field(default=None, metadata=_detail())
    profiling_data: list | None = field(default=None, metadata=_detail())
    creation_time_ms: int | None = field(default=None, metadata=_detail())
    start_time_ms: int | None = field(default=None, metadata=_detail())
    end_time_ms: int | None = field(default=None, metadata=_detail())
    error_message: str | None = field(default=None, metadata=_detail())


@dataclass
class ObjectState(_Record):
    object_id: str
    object_size: int | None
    task_status: str
    reference_type: str
    call_site: str
    type: str  # DRIVER | WORKER: the kind of process holding the reference
    pid: int | None
    ip: str | None
    node_id: str | None = field(default=None, metadata=_detail())
    worker_id: str | None = field(default=None, metadata=_detail())
    owner_address: str | None = field(default=None, metadata=_detail())
    owned: bool | None = field(default=None, metadata=_detail())
    locations: list | None = field(default=None, metadata=_detail())


@dataclass
class WorkerState(_Record):
    worker_id: str
    is_alive: bool
    worker_type: str  # WORKER | DRIVER
    exit_type: str | None
    node_id: str | None
    ip: str | None
    pid: int | None
    state: str | None = field(default=None, metadata=_detail())  # tray's: idle|leased|actor...
    address: str | None = field(default=None, metadata=_detail())


@dataclass
class JobState(_Record):
    job_id: str
    submission_id: str | None
    type: str  # DRIVER | SUBMISSION
    status: str
    entrypoint: str
    driver_address: str | None = None
    message: str | None = field(default=None, metadata=_detail())
    start_time: int | None = field(default=None, metadata=_detail())
    end_time: int | None = field(default=None, metadata=_detail())
    metadata: dict | None = field(default=None, metadata=_detail())


@dataclass
class PlacementGroupState(_Record):
    placement_group_id: str
    name: str
    state: str
    strategy: str | None = field(default=None, metadata=_detail())
    bundles: list | None = field(default=None, metadata=_detail())
    is_detached: bool | None = field(default=None, metadata=_detail())


# ============================================================ the client


class _Client:
    """One query's way to the cluster: the connected driver, or one-shot
    authenticated connections from a process that is not part of it."""

    def __init__(self, address: str | None, timeout: float | None = None) -> None:
        from ...core.context import get_worker

        if timeout is not None and (isinstance(timeout, bool) or
                                    not isinstance(timeout, (int, float)) or timeout <= 0):
            raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
        self.timeout_s = DEFAULT_TIMEOUT_S if timeout is None else float(timeout)
        self.worker = get_worker(required=False) if address is None else None
        self.gcs = self.token = None
        if self.worker is None:
            from ...backends.local import resolve_cluster

            self.gcs, self.token = resolve_cluster(address or "auto")

    def _run(self, calls: list[tuple]) -> list:
        """Run ``[(address or None for the GCS, method, *args)]``; each
        result, or the exception it raised (one failed node or worker must
        not fail the listing)."""
        if self.worker is not None:
            worker = self.worker

            async def gather():
                import trio

                results = []
                with trio.move_on_after(self.timeout_s):
                    for target, method, *args in calls:
                        try:
                            if target is None:
                                results.append(await worker.gcs_call(method, *args))
                            else:
                                results.append(await worker.endpoint.call(target, method,
                                                                          *args))
                        except Exception as error:  # noqa: BLE001 - reported per call
                            results.append(error)
                    return results
                raise exceptions.TrayError(f"the state query did not finish within "
                                           f"{self.timeout_s} s (pass timeout= to wait longer)")

            from ...api.blocking import block

            return block(worker, gather)
        import trio

        from ...backends.local import query_gcs

        async def gather_outside():
            results = []
            with trio.move_on_after(self.timeout_s):
                for target, method, *args in calls:
                    try:
                        results.append(await query_gcs(target or self.gcs, self.token,
                                                       method, *args))
                    except Exception as error:  # noqa: BLE001 - reported per call
                        if target is None:
                            raise
                        results.append(error)
                return results
            raise exceptions.TrayError(f"the state query did not finish within "
                                       f"{self.timeout_s} s (pass timeout= to wait longer)")

        return trio.run(gather_outside)

    def gcs_call(self, method: str, *args):
        result = self._run([(None, method, *args)])[0]
        if isinstance(result, Exception):
            raise result
        return result

    def flush_own_events(self) -> None:
        """A connected driver's own buffered task events go to the GCS first."""
        if self.worker is not None:
            from ...api.blocking import block

            block(self.worker, self.worker.task_events.flush)


def _to_epoch_ms(gcs_time: float | None, gcs_now: float) -> int | None:
    """A time on the GCS's loop clock as ms since the epoch (this machine's
    clock; the simulator's driver reads real time, so simulated times come
    out as dates around the query, spaced in virtual seconds)."""
    if gcs_time is None:
        return None
    return int((time.time() - (gcs_now - gcs_time)) * 1000)


# ============================================================ filtering


def _check_query(cls, filters, limit) -> list:
    if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool)
                              or limit <= 0):
        raise ValueError(f"limit must be a positive integer, got {limit!r}")
    known = [f.name for f in dataclasses.fields(cls)]
    checked = []
    for item in filters or []:
        if not isinstance(item, (tuple, list)) or len(item) != 3:
            raise ValueError(f"a filter is a (key, predicate, value) tuple, got {item!r}")
        key, predicate, value = item
        if key not in known:
            raise ValueError(f"unknown filter key {key!r} for {cls.__name__}; the keys are: "
                             f"{', '.join(known)}")
        if predicate not in _PREDICATES:
            raise ValueError(f"unsupported filter predicate {predicate!r}; use one of "
                             f"{', '.join(repr(p) for p in _PREDICATES)}")
        checked.append((key, predicate, value))
    return checked


def _normal(key: str, value) -> str:
    text = "" if value is None else str(value)
    if isinstance(value, bool):
        text = text.lower()
    return text.upper() if key in _ENUM_KEYS else text


def _matches(record, filters: list) -> bool:
    for key, predicate, value in filters:
        equal = _normal(key, getattr(record, key)) == _normal(key, value)
        if equal != (predicate == "="):
            return False
    return True


def _finish(cls, records: list, filters: list, limit: int | None, detail: bool,
            what: str) -> list:
    chosen = [record for record in records if _matches(record, filters)]
    limit = DEFAULT_LIMIT if limit is None else limit
    if len(chosen) > limit:
        warnings.warn(f"{len(chosen)} {what} match, showing {limit} (pass limit= to see more)",
                      stacklevel=3)
        chosen = chosen[:limit]
    if not detail:
        hidden = [f.name for f in dataclasses.fields(cls) if f.metadata.get("detail")]
        for record in chosen:
            for name in hidden:
                setattr(record, name, None)
    return chosen


def _job_hex(job: int | None) -> str:
    from ...core.ids import JobID

    return JobID.from_int(job).hex() if job is not None else ""


# ================================================================= nodes


def _node_rows(client: _Client) -> list:
    return client.gcs_call("get_all_nodes")


def _node_ip(node) -> str:
    if node.ip and node.ip != "local":
        return node.ip
    address = node.address
    if address.startswith("tcp:"):
        return address[4:].rpartition(":")[0]
    return "127.0.0.1"


def list_nodes(address: str | None = None, filters: list | None = None,
               limit: int | None = None, timeout: float | None = None,
               detail: bool = False, raise_on_missing_output: bool = True) -> list[NodeState]:
    """Every node the cluster has known (alive and dead), the first
    registered marked as the head."""
    checked = _check_query(NodeState, filters, limit)
    client = _Client(address, timeout)
    nodes = _node_rows(client)
    stats = client._run([(node.address, "get_node_stats") for node in nodes if node.alive]) \
        if detail else []
    available = {}
    for node, stat in zip([n for n in nodes if n.alive], stats, strict=False):
        if isinstance(stat, dict):
            available[node.node_id] = stat["available"]
    records = [NodeState(
        node_id=node.node_id, node_ip=_node_ip(node), is_head_node=index == 0,
        state="ALIVE" if node.alive else "DEAD", node_name=node.hostname or _node_ip(node),
        resources_total={**node.resources,
                         "object_store_memory": float(node.object_store_bytes)},
        resources_available=available.get(node.node_id), address=node.address,
        object_store_total_bytes=node.object_store_bytes,
        session_dir=node.session_dir or None) for index, node in enumerate(nodes)]
    return _finish(NodeState, records, checked, limit, detail, "nodes")


def get_node(id: str, address: str | None = None, timeout: float | None = None
             ) -> NodeState | None:
    found = list_nodes(address, filters=[("node_id", "=", id)], detail=True, limit=1,
                       timeout=timeout)
    return found[0] if found else None


# ================================================================ actors


def _actor_records(client: _Client, actor_id: str | None = None) -> list[ActorState]:
    reply = client.gcs_call("list_actor_states", actor_id)
    now = reply["now"]
    filters = [("type", "=", "ACTOR_CREATION_TASK")]
    if actor_id is not None:
        filters.append(("actor_id", "=", actor_id))
    creations = {}
    for row in client.gcs_call("get_task_events", None, None, filters, None)["rows"]:
        creations[row["actor_id"]] = row
    records = []
    known = set()
    for row in reply["rows"]:
        known.add(row["actor_id"])
        creation = creations.get(row["actor_id"])
        alive_here = row["state"] == "ALIVE" and creation is not None and \
            creation.get("worker_id") == row["worker_id"]
        records.append(ActorState(
            actor_id=row["actor_id"], class_name=row["class_name"], state=row["state"],
            job_id=_job_hex(row["job_id"]), name=row["name"], node_id=row["node_id"],
            pid=creation["worker_pid"] if alive_here else None,
            ray_namespace=row["ray_namespace"], num_restarts=row["num_restarts"],
            worker_id=row["worker_id"], required_resources=row["required_resources"],
            death_cause=row["death_cause"], is_detached=row["is_detached"],
            placement_group_id=row["placement_group_id"],
            repr_name=f"{row['class_name']}({row['actor_id'][:8]})",
            max_restarts=row["max_restarts"], owner_address=row["owner_address"],
            address=row["address"],
            events=[{"state": state, "created_ms": _to_epoch_ms(at, now)}
                    for state, at in row["state_times"]]))
    # Actors whose owners still wait for their constructors' arguments:
    # the GCS has not heard of them yet (Ray registers them first).
    for actor, creation in sorted(creations.items()):
        if actor in known or creation["state"] != "PENDING_ARGS_AVAIL":
            continue
        class_name = (creation["name"] or "").removesuffix(".__init__")
        records.append(ActorState(
            actor_id=actor, class_name=class_name, state="DEPENDENCIES_UNREADY",
            job_id=_job_hex(creation["job_id"]), name="", node_id=None, pid=None,
            ray_namespace="", num_restarts=0, owner_address=creation["owner"],
            required_resources=creation["required_resources"]))
    return records


def list_actors(address: str | None = None, filters: list | None = None,
                limit: int | None = None, timeout: float | None = None,
                detail: bool = False, raise_on_missing_output: bool = True
                ) -> list[ActorState]:
    """Every actor of the cluster's life (dead ones too), by actor id."""
    checked = _check_query(ActorState, filters, limit)
    client = _Client(address, timeout)
    return _finish(ActorState, _actor_records(client), checked, limit, detail, "actors")


def get_actor(id: str, address: str | None = None, timeout: float | None = None
              ) -> ActorState | None:
    """One actor by its hex id (all fields), or None."""
    if not isinstance(id, str) or not id:
        raise ValueError(f"get_actor() needs an actor id (hex), got {id!r}")
    client = _Client(address, timeout)
    found = _actor_records(client, id)
    return found[0] if found else None


# ================================================================= tasks


# TaskState fields the GCS's rows hold as they are: filters on them are
# applied there (with the limit, when every filter is one of them).
_ROW_KEYS = {"task_id", "attempt_number", "name", "state", "actor_id", "type",
             "func_or_class_name", "parent_task_id", "node_id", "worker_id", "worker_pid",
             "error_type"}


def _task_reply(client: _Client, task_id: str | None = None, filters: list = (),
                limit: int | None = None) -> dict:
    client.flush_own_events()
    at_gcs = [(key, predicate, _normal(key, value)) for key, predicate, value in filters
              if key in _ROW_KEYS]
    all_there = len(at_gcs) == len(filters)
    return client.gcs_call("get_task_events", task_id, None, at_gcs,
                           limit if all_there else None)


_STATE_RANK = {"PENDING_ARGS_AVAIL": 0, "PENDING_NODE_ASSIGNMENT": 1,
               "SUBMITTED_TO_WORKER": 2, "RUNNING": 3, "FINISHED": 4, "FAILED": 5}


def _task_record(row: dict, now: float) -> TaskState:
    # In the order a task goes through its states, with times made
    # non-decreasing: the owner's and the executor's clocks agree only to
    # within a message's latency, and a fast task's RUNNING could otherwise
    # come after its end.
    events = []
    for state, at in sorted(row["events"].items(), key=lambda item: _STATE_RANK[item[0]]):
        events.append((state, max(at, events[-1][1]) if events else at))
    times = dict(events)
    start = times.get("RUNNING")
    end = times.get("FAILED", times.get("FINISHED")) \
        if row["state"] in ("FINISHED", "FAILED") else None
    created = events[0][1] if events else None
    return TaskState(
        task_id=row["task_id"], attempt_number=row["attempt_number"],
        name=row["name"] or "", state=row["state"], job_id=_job_hex(row["job_id"]),
        actor_id=row["actor_id"], type=row["type"] or "NORMAL_TASK",
        func_or_class_name=row["func_or_class_name"] or "",
        parent_task_id=row["parent_task_id"] or "", node_id=row["node_id"],
        worker_id=row["worker_id"], worker_pid=row["worker_pid"],
        error_type=row["error_type"], language="PYTHON",
        required_resources=row["required_resources"],
        placement_group_id=row["placement_group_id"],
        events=[{"state": state, "created_ms": _to_epoch_ms(at, now)} for state, at in events],
        profiling_data=[{"event_name": name, "start_time_ms": _to_epoch_ms(start_at, now),
                         "end_time_ms": _to_epoch_ms(end_at, now)}
                        for name, start_at, end_at in row["spans"]],
        creation_time_ms=_to_epoch_ms(created, now), start_time_ms=_to_epoch_ms(start, now),
        end_time_ms=_to_epoch_ms(end, now), error_message=row["error_message"])


def _warn_dropped(reply: dict) -> None:
    dropped = reply["dropped_at_gcs"] + reply["dropped_at_sources"]
    if dropped:
        warnings.warn(f"{dropped} task attempts are missing from the listing: the GCS kept "
                      f"the newest {reply['stored']} ({reply['dropped_at_gcs']} dropped there, "
                      f"{reply['dropped_at_sources']} by full event buffers)", stacklevel=3)


def _check_events_enabled() -> None:
    if os.environ.get("TRAY_TASK_EVENTS", "1") == "0":
        warnings.warn("task events are turned off in this process (TRAY_TASK_EVENTS=0): "
                      "tasks may be missing", stacklevel=3)


def list_tasks(address: str | None = None, filters: list | None = None,
               limit: int | None = None, timeout: float | None = None,
               detail: bool = False, raise_on_missing_output: bool = True
               ) -> list[TaskState]:
    """Task attempts (one row per attempt, as Ray's): the newest ``limit``
    that match, oldest first — the tasks and actor calls every process
    submitted and ran, from the task events (up to ~1 s late). Actor
    constructors appear as ``ACTOR_CREATION_TASK``."""
    checked = _check_query(TaskState, filters, limit)
    _check_events_enabled()
    client = _Client(address, timeout)
    limit = DEFAULT_LIMIT if limit is None else limit
    reply = _task_reply(client, None, checked, limit)
    _warn_dropped(reply)
    records = [_task_record(row, reply["now"]) for row in reply["rows"]]
    if reply.get("more"):
        warnings.warn(f"more than {limit} task attempts match, showing the newest {limit} "
                      "(pass limit= to see more)", stacklevel=2)
    return _finish(TaskState, records, checked, limit, detail, "task attempts")


def get_task(id: str, address: str | None = None, timeout: float | None = None,
             attempt: int | None = None) -> TaskState | None:
    """A task by hex id (its latest attempt, or ``attempt``), all fields; None if unknown."""
    if not isinstance(id, str) or not id:
        raise ValueError(f"get_task() needs a task id (hex), got {id!r}")
    client = _Client(address, timeout)
    reply = _task_reply(client, id)
    rows = [row for row in reply["rows"] if attempt is None or row["attempt_number"] == attempt]
    if not rows:
        return None
    row = max(rows, key=lambda r: r["attempt_number"])
    return _task_record(row, reply["now"])


# ======================================================== objects, memory


def _process_addresses(client: _Client) -> list[tuple[str, str]]:
    """(node id, address) of every worker and driver to ask for objects."""
    nodes = [node for node in _node_rows(client) if node.alive]
    lists = client._run([(node.address, "list_workers") for node in nodes])
    addresses = []
    for node, workers in zip(nodes, lists, strict=True):
        if isinstance(workers, Exception):
            continue
        for worker in workers:
            if worker["address"] and worker["state"] != "dead":
                addresses.append((node.node_id, worker["address"]))
    for _job, driver, ended in client.gcs_call("list_driver_jobs"):
        if not ended:
            addresses.append(("", driver))
    if client.worker is not None and all(a != client.worker.address for _, a in addresses):
        addresses.append((client.worker.node_id, client.worker.address))
    return addresses


def _object_reports(client: _Client) -> list[dict]:
    targets = _process_addresses(client)
    reports = client._run([(address, "object_report") for _, address in targets])
    # (A driver that is gone is no news: the job table keeps every driver.)
    missing = [address for (node_id, address), report in zip(targets, reports, strict=True)
               if not isinstance(report, dict) and node_id]
    if missing:
        # A worker that exited between the listing and the question, or one
        # that did not answer: its references are missing (Ray's "partial").
        warnings.warn(f"{len(missing)} of {len(targets)} processes did not report their "
                      f"objects (gone, or not answering): {', '.join(missing[:3])}",
                      stacklevel=3)
    return [report for report in reports if isinstance(report, dict)]


def list_objects(address: str | None = None, filters: list | None = None,
                 limit: int | None = None, timeout: float | None = None,
                 detail: bool = False, raise_on_missing_output: bool = True
                 ) -> list[ObjectState]:
    """Every object reference held in the cluster: one row per (object,
    process holding it), as Ray's. ``object_size`` is known for values held
    in memory and for stored values on the holder's node; ``call_site`` is
    ``"disabled"`` (tray does not record where refs were made)."""
    checked = _check_query(ObjectState, filters, limit)
    client = _Client(address, timeout)
    ips = {node.node_id: _node_ip(node) for node in _node_rows(client)}
    records = []
    for report in _object_reports(client):
        for row in report["rows"]:
            records.append(ObjectState(
                object_id=row["object_id"], object_size=row["object_size"],
                task_status=row["task_status"], reference_type=row["reference_type"],
                call_site="disabled", type=report["type"], pid=report["pid"],
                ip=ips.get(report["node_id"]), node_id=report["node_id"],
                worker_id=report["worker_id"] or report["address"],
                owner_address=row["owner_address"], owned=row["owned"],
                locations=row["locations"]))
    return _finish(ObjectState, records, checked, limit, detail, "object references")


def _directory_bytes(path: str | None) -> int | None:
    """Bytes of the files in ``path`` (a spill directory), None if it is not here."""
    if not path or not os.path.isdir(path):
        return None
    total = 0
    for entry in os.scandir(path):
        if entry.is_file(follow_symlinks=False) and not entry.name.startswith("."):
            total += entry.stat(follow_symlinks=False).st_size
    return total


def memory_summary(address: str | None = None, timeout: float | None = None) -> dict:
    """What ``tray memory`` prints: every reference grouped by the process
    holding it (with its size, reference type and the owner), and each
    node's object store: used and total bytes, and bytes spilled to disk
    (``None`` when the node's spill directory is not on this machine)::

        {"nodes": [{"node_id", "node_ip", "store_used_bytes",
                    "store_total_bytes", "spilled_bytes", "spilled_objects"}],
         "processes": [{"node_id", "pid", "type", "worker_id", "address",
                        "objects": [ObjectState as dict], "left_out"}],
         "totals": {"objects", "object_bytes", "by_reference_type": {...}}}"""
    client = _Client(address, timeout)
    nodes = [node for node in _node_rows(client) if node.alive]
    stats = client._run([(node.address, "get_node_stats") for node in nodes])
    node_rows = []
    for node, stat in zip(nodes, stats, strict=True):
        spill = node.spill_directory
        spilled_objects = None
        if spill and os.path.isdir(spill):
            spilled_objects = sum(1 for entry in os.scandir(spill)
                                  if not entry.name.startswith("."))
        node_rows.append({
            "node_id": node.node_id, "node_ip": _node_ip(node),
            "store_used_bytes": stat["store_used_bytes"] if isinstance(stat, dict) else None,
            "store_total_bytes": node.object_store_bytes,
            "spilled_bytes": _directory_bytes(spill) if spill else 0,
            "spilled_objects": spilled_objects if spill else 0})
    processes = []
    totals = Counter()
    size_total = 0
    for report in _object_reports(client):
        objects = []
        for row in report["rows"]:
            objects.append({"object_id": row["object_id"], "object_size": row["object_size"],
                            "reference_type": row["reference_type"],
                            "task_status": row["task_status"],
                            "owner_address": row["owner_address"], "owned": row["owned"],
                            "call_site": "disabled"})
            totals[row["reference_type"]] += 1
            size_total += row["object_size"] or 0
        processes.append({"node_id": report["node_id"], "pid": report["pid"],
                          "type": report["type"], "worker_id": report["worker_id"],
                          "address": report["address"], "objects": objects,
                          "left_out": report["left_out"]})
    return {"nodes": node_rows, "processes": processes,
            "totals": {"objects": sum(totals.values()), "object_bytes": size_total,
                       "by_reference_type": dict(sorted(totals.items()))}}


# ================================================================ workers


def list_workers(address: str | None = None, filters: list | None = None,
                 limit: int | None = None, timeout: float | None = None,
                 detail: bool = False, raise_on_missing_output: bool = True
                 ) -> list[WorkerState]:
    """Every worker process each live node knows (and every driver), with
    its pid where a task it ran said so."""
    checked = _check_query(WorkerState, filters, limit)
    client = _Client(address, timeout)
    nodes = [node for node in _node_rows(client) if node.alive]
    lists = client._run([(node.address, "list_workers") for node in nodes])
    try:
        pids = client.gcs_call("worker_pids")
    except Exception:  # noqa: BLE001 - pids are a nicety
        pids = {}
    records = []
    for node, workers in zip(nodes, lists, strict=True):
        if isinstance(workers, Exception):
            continue
        for worker in workers:
            alive = worker["state"] != "dead"
            records.append(WorkerState(
                worker_id=worker["worker_id"], is_alive=alive, worker_type="WORKER",
                exit_type=None if alive else "SYSTEM_ERROR", node_id=node.node_id,
                ip=_node_ip(node), pid=pids.get(worker["worker_id"]), state=worker["state"],
                address=worker["address"]))
    for _job, driver, ended in client.gcs_call("list_driver_jobs"):
        records.append(WorkerState(worker_id=driver, is_alive=not ended, worker_type="DRIVER",
                                   exit_type="INTENDED_USER_EXIT" if ended else None,
                                   node_id=None, ip=None, pid=None, address=driver))
    return _finish(WorkerState, records, checked, limit, detail, "workers")


# =================================================================== jobs


def list_jobs(address: str | None = None, filters: list | None = None,
              limit: int | None = None, timeout: float | None = None,
              detail: bool = False, raise_on_missing_output: bool = True) -> list[JobState]:
    """Drivers' jobs (every ``tray.init`` that joined, by job id) and
    submitted jobs (``tray job submit``, by submission id)."""
    import json

    checked = _check_query(JobState, filters, limit)
    client = _Client(address, timeout)
    # A driver's job is over once its driver went away (Ray's is_dead: the
    # dashboard shows such a job SUCCEEDED).
    records = [JobState(job_id=_job_hex(job), submission_id=None, type="DRIVER",
                        status="SUCCEEDED" if ended else "RUNNING", entrypoint="",
                        driver_address=driver)
               for job, driver, ended in client.gcs_call("list_driver_jobs")]
    try:
        submissions = client.gcs_call("job_submission_list")
    except Exception:  # noqa: BLE001 - a GCS without the job manager's table
        submissions = []
    for submission_id, record in submissions:
        try:
            info = json.loads(record)
        except ValueError:
            continue
        records.append(JobState(
            job_id=submission_id, submission_id=submission_id, type="SUBMISSION",
            status=str(info.get("status", "")), entrypoint=info.get("entrypoint", ""),
            message=info.get("message"), start_time=info.get("start_time"),
            end_time=info.get("end_time"), metadata=info.get("metadata")))
    return _finish(JobState, records, checked, limit, detail, "jobs")


# ======================================================= placement groups


def list_placement_groups(address: str | None = None, filters: list | None = None,
                          limit: int | None = None, timeout: float | None = None,
                          detail: bool = False, raise_on_missing_output: bool = True
                          ) -> list[PlacementGroupState]:
    checked = _check_query(PlacementGroupState, filters, limit)
    client = _Client(address, timeout)
    records = [PlacementGroupState(
        placement_group_id=info.pg_id, name=info.name, state=info.state,
        strategy=info.strategy, bundles=[dict(b) for b in info.bundles],
        is_detached=info.detached) for info in client.gcs_call("list_placement_groups")]
    return _finish(PlacementGroupState, records, checked, limit, detail, "placement groups")


# ============================================================= summaries


def summarize_tasks(address: str | None = None, timeout: float | None = None,
                    raise_on_missing_output: bool = True) -> dict:
    """Task attempts counted by function (Ray's ``summary by func_name``):
    ``{"summary": {name: {"func_or_class_name", "type", "state_counts"}},
    "total_tasks", "total_actor_tasks", "total_actor_scheduled"}``."""
    client = _Client(address, timeout)
    client.flush_own_events()
    reply = client.gcs_call("summarize_task_events")
    _warn_dropped(reply)
    summary = reply["summary"]
    totals = Counter()
    for entry in summary.values():
        totals[entry["type"]] += sum(entry["state_counts"].values())
    return {"summary": dict(sorted(summary.items())),
            "total_tasks": totals["NORMAL_TASK"], "total_actor_tasks": totals["ACTOR_TASK"],
            "total_actor_scheduled": totals["ACTOR_CREATION_TASK"]}


def summarize_actors(address: str | None = None, timeout: float | None = None,
                     raise_on_missing_output: bool = True) -> dict:
    """Actors counted by class: ``{"summary": {class: {"class_name",
    "state_counts"}}, "total_actors"}``."""
    actors = list_actors(address, limit=10**9, timeout=timeout)
    summary: dict = {}
    for actor in actors:
        entry = summary.setdefault(actor.class_name, {"class_name": actor.class_name,
                                                      "state_counts": {}})
        entry["state_counts"][actor.state] = entry["state_counts"].get(actor.state, 0) + 1
    return {"summary": dict(sorted(summary.items())), "total_actors": len(actors)}


def summarize_objects(address: str | None = None, timeout: float | None = None,
                      raise_on_missing_output: bool = True) -> dict:
    """Object references counted by reference type and task status, with
    their known total size: ``{"summary": {"total_objects",
    "total_size_bytes", "by_reference_type", "by_task_status"},
    "total_objects"}``."""
    objects = list_objects(address, limit=10**9, timeout=timeout)
    by_type = Counter(o.reference_type for o in objects)
    by_status = Counter(o.task_status for o in objects)
    size = sum(o.object_size or 0 for o in objects)
    return {"summary": {"total_objects": len(objects), "total_size_bytes": size,
                        "by_reference_type": dict(sorted(by_type.items())),
                        "by_task_status": dict(sorted(by_status.items()))},
            "total_objects": len(objects)}


__all__ = ["ActorState", "JobState", "NodeState", "ObjectState", "PlacementGroupState",
           "TaskState", "WorkerState", "get_actor", "get_node", "get_task", "list_actors",
           "list_jobs", "list_nodes", "list_objects", "list_placement_groups", "list_tasks",
           "list_workers", "memory_summary", "summarize_actors", "summarize_objects",
           "summarize_tasks", "DEFAULT_LIMIT"]
