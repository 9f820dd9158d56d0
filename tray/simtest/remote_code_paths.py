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
