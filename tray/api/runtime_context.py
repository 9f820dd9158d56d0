"""``get_runtime_context()``: ids of what is running here."""

from __future__ import annotations

from ..core.context import current_task, get_worker
from ..core.ids import JobID
from .session import current_namespace


class RuntimeContext:
    """Ids of what is running here, as hex strings (``None`` where absent)."""

    def __init__(self, worker) -> None:
        self._worker = worker
        self._task = current_task.get(None)

    def get_job_id(self) -> str:
        return JobID.from_int(self._worker.current_job()).hex()

    def get_node_id(self) -> str:
        return self._worker.node_id

    def get_task_id(self) -> str | None:
        return self._task.task_id.hex() if self._task is not None else None

    def get_actor_id(self) -> str | None:
        if self._task is not None and self._task.actor_id is not None:
            return self._task.actor_id.hex()
        return None

    def get_worker_id(self) -> str:
        return self._worker.worker_id or self._worker.address

    def is_canceled(self) -> bool:
        """Whether ``tray.cancel`` reached the task or actor call running
        this code (Ray's): a running synchronous actor method is not
        interrupted by a cancel, and may poll this to stop early."""
        if self._task is None:
            raise RuntimeError("is_canceled() can only be called inside a task or an actor's "
                               "method")
        return self._worker.receiver.is_cancel_requested(self._task.task_id.binary())

    @property
    def namespace(self) -> str:
        return current_namespace()

    @property
    def runtime_env(self) -> dict:
        """The runtime_env the running code is in, resolved (Ray's
        ``RuntimeContext.runtime_env``): local paths are package URIs."""
        from ..runtime_env import current

        return current()

    def get_runtime_env_string(self) -> str:
        import json

        return json.dumps(self.runtime_env, sort_keys=True)

    job_id = property(get_job_id)
    node_id = property(get_node_id)
    task_id = property(get_task_id)
    actor_id = property(get_actor_id)


def get_runtime_context() -> RuntimeContext:
    return RuntimeContext(get_worker())


