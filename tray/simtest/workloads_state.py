"""The state API under faults: tasks, failing tasks and an actor run while
the seed's faults fire; once they stop, the state API is asked what it saw.

Reference model (what must hold whatever the faults did — task events are
best effort, so a batch lost in a partition or a GCS restart may leave a
task in an earlier state or missing, never in a wrong one):

* every query answers (``list_tasks``, ``list_actors``, ``list_nodes``,
  ``list_objects``, ``summarize_tasks``, ``memory_summary``): a fault never
  makes the state API raise once the cluster has settled;
* every task row is in one of Ray's states and a ``FAILED`` row says why
  (``error_type``);
* a task that always raises is never ``FINISHED`` (in any attempt);
* the nodes the state API lists are the nodes ``tray.nodes()`` lists, alive
  as it says;
* the actor's row names its class and is ``ALIVE``, ``RESTARTING`` or
  ``DEAD`` (never unknown once created);
* the queries agree with the full listings (``state-queries-agree``): a
  ``limit`` gives the newest rows, oldest first; a filter (``=``, ``!=``, by
  the GCS or the client) exactly the matching rows; ``get_task`` the latest
  attempt; ``summarize_tasks``/``summarize_actors`` the listings' counts.

The values themselves are checked by the runner like any workload's, and the
runner's determinism check replays the seed: the queries are part of the
trace, so the state API is checked to replay bit for bit too.
"""

from __future__ import annotations

import time

import tray

STATES = {"PENDING_ARGS_AVAIL", "PENDING_NODE_ASSIGNMENT", "SUBMITTED_TO_WORKER", "RUNNING",
          "FINISHED", "FAILED"}


class StateWorkloadError(Exception):
    """What the always-failing task raises."""


@tray.remote(max_retries=-1)
def _state_step(x: int, sleep_s: float) -> int:
    time.sleep(sleep_s)
    return x + 1


@tray.remote(max_retries=0)
def _state_always_fails(sleep_s: float) -> int:
    time.sleep(sleep_s)
    raise StateWorkloadError("this task always fails")


@tray.remote(max_restarts=-1, max_task_retries=-1)
class _StateCounter:
    def __init__(self) -> None:
        self.count = 0

    def bump(self, sleep_s: float) -> int:
        time.sleep(sleep_s)
        self.count += 1
        return 1


def state_api(program) -> None:
    rng = program.rng
    chain = _state_step.remote(0, rng.uniform(0.0, 0.05))
    links = rng.randint(2, 5)
    for _ in range(links - 1):
        chain = _state_step.remote(chain, rng.uniform(0.0, 0.05))
    program.expect(chain, links, label="state: a chain of steps", unlimited=True)
    failing = [_state_always_fails.remote(rng.uniform(0.0, 0.05))
               for _ in range(rng.randint(1, 3))]
    for ref in failing:
        program.expect(ref, program.error(StateWorkloadError), label="state: always fails")
    counter = program.actor(_StateCounter)
    for _ in range(rng.randint(1, 4)):
        program.expect(counter.bump.remote(rng.uniform(0.0, 0.05)), 1, actor_call=True,
                       label="state: actor calls", unlimited=True)
    # More actors (draws of their own: those above stay as they were), so
    # that a query by actor id has others to tell its actor from.
    import random

    import tray.simtest

    extra = random.Random(f"{tray.simtest.cluster().seed}:state-actors")
    for _ in range(extra.randint(1, 3)):
        other = program.actor(_StateCounter)
        program.expect(other.bump.remote(0.0), 1, actor_call=True, unlimited=True,
                       label="state: another actor")
    failing_ids = {ref.task_id().hex() for ref in failing}
    program.later(lambda: _check_state(failing_ids))


def _check_state(failing_ids: set) -> None:
    from tray.util import state

    from .invariants import InvariantViolation

    time.sleep(2.0)  # (virtual) every process flushes its task events
    try:
        tasks = state.list_tasks(limit=10**6)
        actors = state.list_actors(limit=10**6)
        nodes = state.list_nodes(limit=10**6)
        state.list_objects(limit=10**6)
        state.summarize_tasks()
        state.memory_summary()
    except Exception as error:  # noqa: BLE001 - any failure is the finding
        raise InvariantViolation("state-api-answers",
                                 f"a state query raised {type(error).__name__}: {error}") \
            from error
    for task in tasks:
        if task.state not in STATES:
            raise InvariantViolation("task-rows-have-ray-states",
                                     f"task {task.name} ({task.task_id}) is {task.state!r}")
        if task.state == "FAILED" and not task.error_type:
            raise InvariantViolation("failed-tasks-say-why",
                                     f"task {task.name} ({task.task_id}) FAILED without an "
                                     "error type")
        if task.task_id in failing_ids and task.state == "FINISHED":
            raise InvariantViolation("a-raising-task-never-finishes",
                                     f"task {task.name} ({task.task_id}) always raises but "
                                     f"is FINISHED (attempt {task.attempt_number})")
    alive = {node["NodeID"]: node["Alive"] for node in tray.nodes()}
    listed = {node.node_id: node.state == "ALIVE" for node in nodes}
    if alive != listed:
        raise InvariantViolation("state-nodes-are-the-cluster-nodes",
                                 f"list_nodes says {listed}, tray.nodes() says {alive}")
    for actor in actors:
        if actor.class_name == "_StateCounter" and \
                actor.state not in ("ALIVE", "RESTARTING", "DEAD", "PENDING_CREATION"):
            raise InvariantViolation("actor-rows-have-ray-states",
                                     f"actor {actor.actor_id} is {actor.state!r}")
    _check_queries(tasks, actors)


def _state_counts(records: list, key: str) -> dict:
    """{the records' ``key``: {state: how many}}, as the summaries count."""
    counts: dict = {}
    for record in records:
        entry = counts.setdefault(getattr(record, key), {})
        entry[record.state] = entry.get(record.state, 0) + 1
    return counts


def _row(task) -> tuple:
    return (task.task_id, task.attempt_number, task.state)


def _check_queries(tasks: list, actors: list) -> None:
    """``state-queries-agree``: what a query with a limit, a filter, by id or
    summed up says is what the full listing says (Ray's promises: the newest
    ``limit`` rows, oldest first; a filter keeps exactly the matching rows;
    ``get_task`` is the latest attempt, ``get_actor`` the actor; the summaries count the rows). Judged
    only while the listing holds still (nothing else runs by now)."""
    import warnings

    from tray.util import state

    from .invariants import InvariantViolation

    wrong = []

    def differ(what: str, got, want) -> None:
        if got != want:
            wrong.append(f"{what}: got {got}, the full listing says {want}")

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # ("more rows match than the limit")
        rows = [_row(task) for task in tasks]
        for limit in sorted({1, len(rows) // 2, len(rows) - 1}):
            if 0 < limit < len(rows):
                differ(f"list_tasks(limit={limit})",
                       [_row(t) for t in state.list_tasks(limit=limit)], rows[-limit:])
        for key in ("state", "name", "type", "job_id"):
            for value in sorted({getattr(task, key) for task in tasks})[:2]:
                for predicate in ("=", "!="):
                    got = [_row(t) for t in state.list_tasks(
                        filters=[(key, predicate, value)], limit=10**6)]
                    want = [_row(t) for t in tasks
                            if (getattr(t, key) == value) == (predicate == "=")]
                    differ(f"list_tasks(filters=[({key!r}, {predicate!r}, {value!r})])",
                           got, want)
        latest: dict = {}
        for task in tasks:
            if task.attempt_number >= latest.get(task.task_id, (-1,))[0]:
                latest[task.task_id] = (task.attempt_number, task.state)
        for task_id in sorted(latest)[:5]:
            found = state.get_task(task_id)
            differ(f"get_task({task_id})",
                   None if found is None else (found.attempt_number, found.state),
                   latest[task_id])
        for what, summary, counts in (
                ("summarize_tasks()", state.summarize_tasks(),
                 _state_counts(tasks, "func_or_class_name")),
                ("summarize_actors()", state.summarize_actors(),
                 _state_counts(actors, "class_name"))):
            differ(f"{what} state counts", {name: dict(entry["state_counts"]) for name, entry
                                            in summary["cluster"]["summary"].items()}, counts)
        for actor in actors[:5]:
            found = state.get_actor(actor.actor_id)
            differ(f"get_actor({actor.actor_id})",
                   None if found is None else (found.actor_id, found.state),
                   (actor.actor_id, actor.state))
        for actor in actors[:3]:
            got = [(a.actor_id, a.state) for a in state.list_actors(
                filters=[("class_name", "=", actor.class_name)], limit=10**6)]
            differ(f"list_actors(filters=[('class_name', '=', {actor.class_name!r})])", got,
                   [(a.actor_id, a.state) for a in actors if a.class_name == actor.class_name])
        # Judged only if the listings held still meanwhile (a batch sent
        # before a GCS restart may still arrive): else nothing to compare with.
        if wrong and [_row(t) for t in state.list_tasks(limit=10**6)] == rows and \
                [(a.actor_id, a.state) for a in state.list_actors(limit=10**6)] == \
                [(a.actor_id, a.state) for a in actors]:
            raise InvariantViolation("state-queries-agree", wrong[0])


WORKLOADS = {"state": state_api}
