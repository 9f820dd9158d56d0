"""The code the ``paths`` piece's tasks and actors run (``pieces_paths``).
Every body counts itself in ``remote_code.LEDGER`` under its key, as the
other pieces' code does."""

from __future__ import annotations

import asyncio
import sys
import time

import tray

from .remote_code import _ran


class PathError(Exception):
    """Raised on purpose by ``fails``."""


@tray.remote
def fails(key: str) -> None:
    _ran(key)
    raise PathError(key)


@tray.remote
def slow_end(key: str, sleep_s: float, *args) -> str:
    """Sleeps ``sleep_s``, then counts ``<key>:end``: a caller can tell
    whether a run got to its end yet."""
    _ran(key)
    time.sleep(sleep_s)
    _ran(f"{key}:end")
    return key


class _Adder:
    def __init__(self, key: str) -> None:
        self.key = key
        self.sum = 0

    def add(self, x: int) -> int:
        self.sum += x
        return self.sum


@tray.remote
class Tally(_Adder):
    """Adds what it is given; ``total`` says the sum so far."""

    def total(self) -> int:
        return self.sum

    def echo(self, x: int) -> int:
        return x


@tray.remote
def open_box(key: str, box: dict) -> int:
    """A box holds refs and an actor handle (contained in the argument):
    the sum of the refs' values and of what the actor echoes back."""
    _ran(key)
    values = tray.get(box["refs"])
    return sum(values) + tray.get(box["actor"].echo.remote(box["echo"]))


@tray.remote
class Quitter(_Adder):
    """Adds what it is given; ``quit`` ends it from inside (``exit_actor()``
    or ``sys.exit()``); ``poll`` runs until a cancel reaches it."""

    def quit(self, how: str) -> None:
        if how == "exit_actor":
            from tray.actor import exit_actor

            exit_actor()
        sys.exit(0)

    def poll(self, key: str, steps: int, step_s: float) -> str:
        """Ray's cancel of a running synchronous method interrupts nothing:
        the method sees it through ``is_canceled()``."""
        _ran(key)
        context = tray.get_runtime_context()
        for _ in range(steps):
            if context.is_canceled():
                return "saw the cancel"
            time.sleep(step_s)
        return "never saw the cancel"


# actor key -> [(group, start, end)]: the virtual-time span of each run of a
# concurrent actor's method (``concurrency``); the piece resets it.
SPANS: dict = {}


def _now() -> float:
    from . import cluster

    return cluster().clock.current_time()


def _span(key: str, group: str, start: float) -> None:
    SPANS.setdefault(key, []).append((group, start, _now()))


@tray.remote(concurrency_groups={"io": 2, "compute": 1})
class Grouped:
    """An async actor with two concurrency groups besides the default one;
    every run logs its span under the group its caller says it runs in."""

    def __init__(self, key: str) -> None:
        self.key = key

    async def _work(self, group: str, x: int, sleep_s: float) -> int:
        start = _now()
        await asyncio.sleep(sleep_s)
        _span(self.key, group, start)
        return x

    @tray.method(concurrency_group="io")
    async def io(self, x: int, sleep_s: float, group: str) -> int:
        return await self._work(group, x, sleep_s)

    @tray.method(concurrency_group="compute")
    async def compute(self, x: int, sleep_s: float, group: str) -> int:
        return await self._work(group, x, sleep_s)

    async def plain(self, x: int, sleep_s: float, group: str) -> int:
        return await self._work(group, x, sleep_s)


@tray.remote
class Threaded:
    """Synchronous methods of a threaded actor (``max_concurrency`` > 1)."""

    def __init__(self, key: str) -> None:
        self.key = key

    def plain(self, x: int, sleep_s: float, group: str) -> int:
        start = _now()
        time.sleep(sleep_s)
        _span(self.key, group, start)
        return x


def _true_node() -> str | None:
    """The id of the node whose simulated process runs this code, as the
    simulator knows it (that node's node manager's id), not as the worker
    says it: what ``get_node_id()`` must answer."""
    from ..backends.sim.validation import _current_process
    from . import cluster

    process = _current_process.get()
    if process is None:  # the driver's script: the driver's process
        process = next((process for process in cluster().processes.values()
                        if process.name == "driver" and process.alive), None)
    if process is None or process.node_index is None:
        return None
    raylet = cluster().processes.get(f"n{process.node_index}/raylet")
    if raylet is None or not raylet.alive or raylet.component is None:
        return None
    return raylet.component.node_id


def _context() -> dict:
    """What the runtime context says here (``get_runtime_context()`` and
    ``get_current_placement_group()``), and the node it truly runs on."""
    from tray.util import get_current_placement_group

    context = tray.get_runtime_context()
    group = get_current_placement_group()
    return {"job": context.get_job_id(), "task": context.get_task_id(),
            "actor": context.get_actor_id(), "node": context.get_node_id(),
            "namespace": context.namespace, "true_node": _true_node(),
            "group": group.id.hex() if group is not None else None}


@tray.remote
def probe(key: str, child_cpus: float | None = None) -> dict:
    """Its runtime context; with ``child_cpus``, its child's too (a task
    with no strategy of its own: ``child``), and the child's ref's task id."""
    _ran(key)
    here = _context()
    if child_cpus is not None:
        child = probe.options(num_cpus=child_cpus, max_retries=-1).remote(f"{key}:child")
        here["child"] = tray.get(child)
        here["child_ref_task"] = child.task_id().hex()
    return here


@tray.remote
class Prober:
    """Its methods' runtime context, and methods of two returns (one by
    ``@tray.method(num_returns=2)``, one plain for ``.options``)."""

    def __init__(self, key: str) -> None:
        self.key = key

    def context(self) -> dict:
        return _context()

    def pair(self, x: int) -> tuple:
        return x, x + 1

    @tray.method(num_returns=2)
    def split(self, x: int) -> tuple:
        return x * 2, x * 3
