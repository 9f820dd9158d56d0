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

from ._actors import get_actor as get_actor
from ._actors import list_actors as list_actors
from ._jobs import list_jobs as list_jobs
from ._jobs import list_placement_groups as list_placement_groups
from ._nodes import get_node as get_node
from ._nodes import list_nodes as list_nodes
from ._nodes import list_workers as list_workers
from ._objects import list_objects as list_objects
from ._objects import memory_summary as memory_summary
from ._query import DEFAULT_LIMIT as DEFAULT_LIMIT
from ._records import ActorState as ActorState
from ._records import JobState as JobState
from ._records import NodeState as NodeState
from ._records import ObjectState as ObjectState
from ._records import PlacementGroupState as PlacementGroupState
from ._records import TaskState as TaskState
from ._records import WorkerState as WorkerState
from ._summaries import summarize_actors as summarize_actors
from ._summaries import summarize_objects as summarize_objects
from ._summaries import summarize_tasks as summarize_tasks
from ._tasks import get_task as get_task
from ._tasks import list_tasks as list_tasks

__all__ = ["ActorState", "JobState", "NodeState", "ObjectState", "PlacementGroupState",
           "TaskState", "WorkerState", "get_actor", "get_node", "get_task", "list_actors",
           "list_jobs", "list_nodes", "list_objects", "list_placement_groups", "list_tasks",
           "list_workers", "memory_summary", "summarize_actors", "summarize_objects",
           "summarize_tasks", "DEFAULT_LIMIT"]
