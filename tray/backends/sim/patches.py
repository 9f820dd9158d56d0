"""Process-wide state of the simulator: which simulated cluster runs now
(``_active``), and the patches of ``time``, ``os`` and ``trio.sleep`` that
make simulated user code follow that cluster's virtual clock while it runs
(installed by ``SimCluster.start``, removed by its shutdown)."""

from __future__ import annotations

import math
import os
import threading
import time

import greenback
import trio

from ...core.context import current_worker
from ...core.interfaces import ProcessExit
from ...runtime_env.worker_environ import WorkerEnviron

# Virtual wall-clock time starts here (2026-01-01 UTC) in simulated user code.
SIM_EPOCH_S = 1_767_225_600.0

# The cluster running now, and the last one started (for tray.simtest).
_active: dict = {"cluster": None, "last": None}


class SimulatedProcessExit(ProcessExit):
    """Raised by ``os._exit`` in simulated user code: ends that simulated
    process, not the real one."""


def _in_trio() -> bool:
    """Whether the caller runs in a task of a trio run (simulation code),
    not in the driver's thread between steps."""
    try:
        trio.lowlevel.current_task()
    except RuntimeError:
        return False
    return True


# ============================================== time and exit in user code
# Simulated user code sees virtual time: time.sleep and time.time follow
# the cluster's clock inside simulated tasks and actors, os._exit ends
# the simulated worker, and os.environ is the worker's own
# (tray.runtime_env.worker_environ). Outside simulated code (the real process's other
# threads, the test runner) they behave as usual; the driver's own
# time.sleep advances the simulation.

_real = {"sleep": time.sleep, "time": time.time, "_exit": os._exit, "environ": os.environ,
         "trio_sleep": trio.sleep}


async def _sim_trio_sleep(seconds: float) -> None:
    """trio.sleep while a simulated cluster runs: a positive, finite sleep
    in its run parks in the cluster's timers (``_Timers``); anything else
    is trio's own."""
    cluster = _active["cluster"]
    if cluster is not None and 0 < seconds < math.inf and _in_trio() and \
            trio.lowlevel.current_clock() is cluster.clock:
        await cluster._timers.sleep_until(cluster.clock.current_time() + seconds)
        return
    await _real["trio_sleep"](seconds)


_environ_cache: dict = {"raw": None, "decoded": None}


def _environ_snapshot():
    """The real os.environ as a plain dict, for a new simulated worker to
    copy. Decoding every entry of os.environ cost ~100 us per worker (~1.6%
    of a chaos seed, which starts dozens); the decoded copy is reused while
    the raw table is what it was (a dict comparison of bytes, in C), so a
    change the driver makes is seen by the workers started after it."""
    real = _real["environ"]
    raw = getattr(real, "_data", None)
    if not isinstance(raw, dict):
        return real
    if _environ_cache["raw"] != raw:
        _environ_cache["raw"] = dict(raw)
        _environ_cache["decoded"] = dict(real)
    return _environ_cache["decoded"]


def _environ_view() -> dict | None:
    """The os.environ of the simulated worker running now (None: the real one)."""
    cluster = _active["cluster"]
    worker = current_worker.get(None)
    if cluster is None or worker is None:
        return None
    environ = cluster.worker_environs.get(worker.address)
    return None if environ is None else environ.environ


def _sim_sleep(seconds: float) -> None:
    cluster = _active["cluster"]
    if cluster is not None:
        if current_worker.get(None) is not None:
            greenback.await_(trio.sleep(seconds))
            return
        if threading.current_thread() is threading.main_thread():
            cluster.run(trio.sleep, seconds)
            return
    _real["sleep"](seconds)


def _sim_time() -> float:
    cluster = _active["cluster"]
    if cluster is not None and current_worker.get(None) is not None:
        return SIM_EPOCH_S + cluster.clock.current_time()
    return _real["time"]()


def _sim_exit(code: int) -> None:
    if _active["cluster"] is not None and current_worker.get(None) is not None:
        raise SimulatedProcessExit(code)
    _real["_exit"](code)


def _install_patches() -> None:
    time.sleep = _sim_sleep
    time.time = _sim_time
    trio.sleep = _sim_trio_sleep
    os._exit = _sim_exit
    os.environ = WorkerEnviron(_real["environ"], _environ_view)  # noqa: B003 - a view, by design


def _remove_patches() -> None:
    time.sleep = _real["sleep"]
    time.time = _real["time"]
    trio.sleep = _real["trio_sleep"]
    os._exit = _real["_exit"]
    os.environ = _real["environ"]  # noqa: B003 - the real one back
