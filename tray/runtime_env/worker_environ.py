"""``os.environ`` per simulated worker.

In the simulator every node and worker shares one process, and so one
``os.environ``: one actor's writes were seen by every other, and no worker
had a ``CUDA_VISIBLE_DEVICES`` of its own. While a simulated cluster runs,
``os.environ`` is a ``WorkerEnviron``: inside a simulated worker's code
(its tasks, its actor's methods, the hooks that run before them) it reads
and writes that worker's own copy, taken from the real environment when the
worker started; anywhere else (the driver, the test runner, other threads)
it is the real environment. This is the same move as virtual ``time.sleep``
in simulated code. Child processes (``subprocess``) still inherit the real
environment of the process, as the simulator runs no real workers.

``SimWorkerEnv`` is what a simulated worker does before user code runs, as
a real worker does (``tray.backends.local.worker``): its runtime_env's
``env_vars`` (once, its first task or its actor's creation), and
``CUDA_VISIBLE_DEVICES`` / ``OMP_NUM_THREADS`` from the task's resources."""

from __future__ import annotations

import math
from collections.abc import MutableMapping

from . import context


class WorkerEnviron(MutableMapping):
    """``os.environ`` that is ``view()``'s dict when it returns one, else ``real``."""

    def __init__(self, real, view) -> None:
        self._real = real
        self._view = view

    def _target(self):
        target = self._view()
        return self._real if target is None else target

    def __getitem__(self, key):
        return self._target()[key]

    def __setitem__(self, key, value) -> None:
        for item in (key, value):
            if not isinstance(item, str):
                raise TypeError(f"str expected, not {type(item).__name__}")
        self._target()[key] = value

    def __delitem__(self, key) -> None:
        del self._target()[key]

    def __iter__(self):
        return iter(list(self._target()))

    def __len__(self) -> int:
        return len(self._target())

    def copy(self) -> dict:
        return dict(self._target())

    def __repr__(self) -> str:
        return f"environ({dict(self._target())!r})"


class SimWorkerEnv:
    """One simulated worker's environment: its ``os.environ`` view, and the
    runtime_env it was set up for."""

    def __init__(self, real, node_gpus: float) -> None:
        self.environ = dict(real)
        self.node_gpus = node_gpus
        self._started_with = {name: real.get(name) for name in ("OMP_NUM_THREADS",
                                                                "CUDA_VISIBLE_DEVICES")}
        self.runtime_env: dict | None = None

    async def before_task(self, gpu_ids: list, spec) -> None:
        """As a real worker's hook: set up for the task's runtime_env (its
        first), record it as what the task's submissions inherit, and set
        ``CUDA_VISIBLE_DEVICES``/``OMP_NUM_THREADS`` from its resources.
        (working_dir/py_modules were packed and stored by the submitter;
        the simulated worker runs the driver's code, as it shares its
        process.)"""
        if spec.method is None and self.runtime_env is None:
            self.runtime_env = dict(spec.runtime_env or {})
            env_vars = self.runtime_env.get("env_vars") or {}
            self.environ.update(env_vars)
            for name in self._started_with:
                if name in env_vars:
                    self._started_with[name] = env_vars[name]
        context.set_task_env(self.runtime_env or {})
        environ = self.environ
        if gpu_ids:
            environ["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in gpu_ids)
        elif self.node_gpus > 0:
            environ["CUDA_VISIBLE_DEVICES"] = ""
        elif self._started_with["CUDA_VISIBLE_DEVICES"] is None:
            environ.pop("CUDA_VISIBLE_DEVICES", None)
        else:
            environ["CUDA_VISIBLE_DEVICES"] = self._started_with["CUDA_VISIBLE_DEVICES"]
        if self._started_with["OMP_NUM_THREADS"] is None and spec.method is None:
            cpus = spec.resources.get("CPU", 0.0)
            environ["OMP_NUM_THREADS"] = str(max(int(math.floor(cpus)), 1))
