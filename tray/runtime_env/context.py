"""Which runtime_env the running code is in, so that what it submits inherits it.

A driver is in its job's env (``tray.init(runtime_env=...)``). A worker is in
the env of the task or actor it runs: its node set the worker up for that
env alone (one env per worker process), and the worker records it before
user code runs. In the simulator every worker shares one process, so the
env is also kept per trio task (a context variable set where the task
starts), which is what a simulated task's submissions read."""

from __future__ import annotations

import contextvars

_process_env: dict = {}
_task_env: contextvars.ContextVar = contextvars.ContextVar("tray_runtime_env", default=None)


def set_process_env(env: dict) -> None:
    global _process_env
    _process_env = dict(env or {})


def set_task_env(env: dict) -> None:
    _task_env.set(dict(env or {}))


def current() -> dict:
    env = _task_env.get()
    return dict(_process_env if env is None else env)
