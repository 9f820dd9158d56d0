"""Which core worker the running code belongs to.

In a real process there is one core worker; in the simulator every simulated
driver and worker shares the OS process, so the current one is a contextvar
set at the root of each simulated process's trio tasks. The driver's core
worker is the fallback for code running outside trio (the user's script)."""

from __future__ import annotations

import contextvars

current_worker: contextvars.ContextVar = contextvars.ContextVar("tray_current_worker")

_global_state: dict = {"driver": None, "runtime": None}


def get_worker(required: bool = True):
    worker = current_worker.get(None)
    if worker is None:
        worker = _global_state["driver"]
    if worker is None and required:
        from ..exceptions import NotInitializedError

        raise NotInitializedError(
            "tray is not initialized: call tray.init() first "
            "(for example tray.init(backend='sim') for a simulated cluster)"
        )
    return worker
