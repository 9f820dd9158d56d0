"""Actors (``list_actors``, ``get_actor``): the GCS's actor table, with each
actor's pid from its creation task's events, and the actors whose owners
still wait for their constructors' arguments (known only from the task
events).
"""

from __future__ import annotations

from ...core.task_status import TaskStatus
from ...core.worker.task_events import TaskType
from ._client import Client, job_hex, to_epoch_ms
from ._query import check_query, finish
from ._records import ActorState


def _actor_records(client: Client, actor_id: str | None = None) -> list[ActorState]:
    reply = client.gcs_call("list_actor_states", actor_id)
    now = reply.now
    filters = [("type", "=", TaskType.ACTOR_CREATION_TASK.value)]
    if actor_id is not None:
        filters.append(("actor_id", "=", actor_id))
    creations = {}
    for row in client.gcs_call("get_task_events", None, None, filters, None).rows:
        creations[row["actor_id"]] = row
    records = []
    known = set()
    for row in reply.rows:
        known.add(row["actor_id"])
        creation = creations.get(row["actor_id"])
        alive_here = row["state"] == "ALIVE" and creation is not None and \
            creation.get("worker_id") == row["worker_id"]
        records.append(ActorState(
            actor_id=row["actor_id"], class_name=row["class_name"], state=row["state"],
            job_id=job_hex(row["job_id"]), name=row["name"], node_id=row["node_id"],
            pid=creation["worker_pid"] if alive_here else None,
            ray_namespace=row["ray_namespace"], num_restarts=row["num_restarts"],
            worker_id=row["worker_id"], required_resources=row["required_resources"],
            death_cause=row["death_cause"], pending_reason=row.get("pending_reason"),
            is_detached=row["is_detached"],
            placement_group_id=row["placement_group_id"],
            repr_name=f"{row['class_name']}({row['actor_id'][:8]})",
            max_restarts=row["max_restarts"], owner_address=row["owner_address"],
            address=row["address"],
            events=[{"state": state, "created_ms": to_epoch_ms(at, now)}
                    for state, at in row["state_times"]]))
    # Actors whose owners still wait for their constructors' arguments:
    # the GCS has not heard of them yet (Ray registers them first).
    for actor, creation in sorted(creations.items()):
        if actor in known or creation["state"] != TaskStatus.PENDING_ARGS_AVAIL:
            continue
        class_name = (creation["name"] or "").removesuffix(".__init__")
        records.append(ActorState(
            actor_id=actor, class_name=class_name, state="DEPENDENCIES_UNREADY",
            job_id=job_hex(creation["job_id"]), name="", node_id=None, pid=None,
            ray_namespace="", num_restarts=0, owner_address=creation["owner"],
            required_resources=creation["required_resources"]))
    return records


def list_actors(address: str | None = None, filters: list | None = None,
                limit: int | None = None, timeout: float | None = None,
                detail: bool = False, raise_on_missing_output: bool = True
                ) -> list[ActorState]:
    """Every actor of the cluster's life (dead ones too), by actor id."""
    checked = check_query(ActorState, filters, limit)
    client = Client(address, timeout)
    return finish(ActorState, _actor_records(client), checked, limit, detail, "actors")


def get_actor(id: str, address: str | None = None, timeout: float | None = None
              ) -> ActorState | None:
    """One actor by its hex id (all fields), or None."""
    if not isinstance(id, str) or not id:
        raise ValueError(f"get_actor() needs an actor id (hex), got {id!r}")
    client = Client(address, timeout)
    found = _actor_records(client, id)
    return found[0] if found else None
