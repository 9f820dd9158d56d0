"""Which core worker the running code belongs to.

In a real process there is one core worker; in the simulator every simulated
driver and worker shares the OS process, so the current one is a contextvar
set at the root of each simulated process's trio tasks. The driver's core
worker is the fallback for code running outside trio (the user's script).
Within a worker, ``current_task`` says which task the running code is."""

from __future__ import annotations

import contextvars
from dataclasses import dataclass, field

from .ids import ActorID, ObjectID, TaskID

current_worker: contextvars.ContextVar = contextvars.ContextVar("tray_current_worker")

# The driver's core worker in this process: set by the API layer's init,
# cleared by its shutdown.
_driver = None


def set_driver(worker) -> None:
    global _driver
    _driver = worker


def driver():
    """This process's driver core worker, or None."""
    return _driver


def get_worker(required: bool = True):
    worker = current_worker.get(None)
    if worker is None:
        worker = _driver
    if worker is None and required:
        from ..exceptions import NotInitializedError

        raise NotInitializedError(
            "tray is not initialized: call tray.init() first "
            "(for example tray.init(backend='sim') for a simulated cluster)"
        )
    return worker


# ============================================================ task context


@dataclass
class TaskContext:
    """What the code running now belongs to: a task, an actor call, or the
    driver's script. Ids of children and ``put`` objects count from here, so
    they are a pure function of where in the program they were made, and of
    which execution (``attempt``: 0 for the first, then one more for each
    retry or actor restart) made them."""
    task_id: TaskID
    actor_id: ActorID | None = None
    gpu_ids: list = field(default_factory=list)
    name: str = ""
    job_id: int = 0
    namespace: str = ""
    children: int = 0
    puts: int = 0
    # The placement group it runs in (a scheduling.PlacementGroupStrategy), if any.
    placement_group: object = None
    attempt: int = 0
    depth: int = 0  # its spec's depth (0: the driver's script)

    def __post_init__(self) -> None:
        self._ids_from = TaskID.for_attempt(self.task_id, self.attempt)

    def next_child_id(self) -> TaskID:
        self.children += 1
        return TaskID.for_child(self._ids_from, self.children)

    def next_put_id(self) -> ObjectID:
        self.puts += 1
        return ObjectID.for_put(self._ids_from, self.puts)


# The task (or actor call) this trio task runs, in a worker; unset in the
# driver's script, whose context is the core worker's ``driver_context``.
current_task: contextvars.ContextVar = contextvars.ContextVar("tray_current_task")
