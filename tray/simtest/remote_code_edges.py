"""The user code of the ``edges`` piece (pieces_edges.py): tasks that break
the rules on purpose (a wrong number of returns, KeyboardInterrupt,
SystemExit, exceptions that resist subclassing), an actor whose constructor
raises, a reader of its environment, and an owner actor that creates
actors, objects and placement groups of its own before its worker is
killed. Every body counts itself in ``remote_code.LEDGER`` under its
caller's key (``_ran``)."""

from __future__ import annotations

import os
import time

import tray

from .remote_code import _ran


class EdgeError(Exception):
    """Raised on purpose; ``retry_exceptions`` lists it."""


class OtherEdgeError(Exception):
    """Raised on purpose; never listed in ``retry_exceptions``."""


class TwoArgError(Exception):
    """An exception whose constructor needs two arguments (it still pickles)."""

    def __init__(self, what: str, code: int) -> None:
        super().__init__(what)
        self.code = code


class FinalError(Exception):
    """An exception class that refuses subclasses: the error a caller gets is
    a TaskError that is not also an instance of it."""

    def __init_subclass__(cls, **kwargs):
        raise TypeError("FinalError cannot be subclassed")


RAISE = {"edge": EdgeError, "other": OtherEdgeError}


@tray.remote
def wrong_returns(key: str, count: int):
    _ran(key)
    return tuple(range(count))


@tray.remote
def raiser(key: str, what: str):
    """Raises what it is told to: ``edge``/``other`` (application errors),
    ``two-arg``, ``final``, ``keyboard`` (KeyboardInterrupt), ``exit``
    (SystemExit)."""
    _ran(key)
    if what in RAISE:
        raise RAISE[what](key)
    if what == "two-arg":
        raise TwoArgError(key, 7)
    if what == "final":
        raise FinalError(key)
    if what == "keyboard":
        raise KeyboardInterrupt(key)
    if what == "exit":
        raise SystemExit(3)
    return what


@tray.remote
def echo(key: str, value):
    _ran(key)
    return value


@tray.remote
def read_env(key: str, name: str):
    _ran(key)
    return os.environ.get(name)


@tray.remote
def submit_sleeper(key: str, child_key: str, sleep_s: float) -> list:
    """Starts a long sleeper and hands its ref back (the caller borrows it)."""
    from .remote_code import long_sleeper

    _ran(key)
    return [long_sleeper.options(max_retries=0).remote(child_key, sleep_s)]


@tray.remote
class BrokenInit:
    def __init__(self, key: str) -> None:
        _ran(key)
        raise EdgeError(f"{key}: constructor failed on purpose")

    def ping(self) -> str:
        return "never"


@tray.remote
class EnvActor:
    def __init__(self, key: str) -> None:
        _ran(key)

    def read(self, name: str):
        return os.environ.get(name)

    def sleep(self, sleep_s: float) -> float:
        time.sleep(sleep_s)
        return sleep_s


@tray.remote
class Owner:
    """Creates things it owns: a child actor (not detached), a detached named
    actor, a put object, a task's result and placement groups (one detached)."""

    def __init__(self, key: str) -> None:
        _ran(key)
        self.key = key
        self.kept: list = []

    def make(self, detached_name: str, group_name: str, detached_group_name: str) -> list:
        from tray.util import placement_group

        from .remote_code import Squarer, leaf

        child = Squarer.options(num_cpus=0, max_restarts=0).remote(f"{self.key}:child")
        detached = Squarer.options(num_cpus=0, name=detached_name, lifetime="detached",
                                   max_restarts=-1, max_task_retries=-1).remote(
            f"{self.key}:detached")
        put = tray.put(f"{self.key}:put")
        result = leaf.options(max_retries=0).remote(f"{self.key}:leaf", 6)
        tray.get([child.square.remote(2, 0.0), detached.square.remote(3, 0.0), result])
        groups = [placement_group([{"memory": 1e6}], name=group_name),
                  placement_group([{"memory": 1e6}], name=detached_group_name,
                                  lifetime="detached")]
        tray.get([group.ready() for group in groups])
        self.kept = [child, detached, put, result, groups]
        return [child, put, result]
