"""The code the ``paths`` piece's tasks and actors run (``pieces_paths``).
Every body counts itself in ``remote_code.LEDGER`` under its key, as the
other pieces' code does."""

from __future__ import annotations

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


@tray.remote
class Tally:
    """Adds what it is given; ``total`` says the sum so far."""

    def __init__(self, key: str) -> None:
        self.key = key
        self.sum = 0

    def add(self, x: int) -> int:
        self.sum += x
        return self.sum

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
class Quitter:
    """Adds what it is given; ``quit`` ends it from inside (``exit_actor()``
    or ``sys.exit()``); ``poll`` runs until a cancel reaches it."""

    def __init__(self, key: str) -> None:
        self.key = key
        self.sum = 0

    def add(self, x: int) -> int:
        self.sum += x
        return self.sum

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
