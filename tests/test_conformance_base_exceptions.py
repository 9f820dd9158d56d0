"""A task or actor method raising a ``BaseException`` that is not an
``Exception`` follows Ray's rules (Ray's test_failure*.py, and
``_raylet.pyx``'s task execution): a user's subclass is an application
error, raised at once by ``get`` as a ``TaskError`` that is also an instance
of the user's class; ``KeyboardInterrupt`` cancels the task
(``TaskCancelledError``); ``SystemExit`` ends the worker process, so the
task is retried as after a worker crash (``WorkerCrashedError`` when no
retry is left). An exception group arrives whole."""

from __future__ import annotations

import time

import pytest

import tray
import tray.exceptions as tex


@tray.remote
def sleeper(seconds, value="slept"):
    time.sleep(seconds)
    return value


@tray.remote
class Attempts:
    """Counts the attempts of tasks, by key."""

    def __init__(self):
        self.counts = {}

    def add(self, key):
        self.counts[key] = self.counts.get(key, 0) + 1
        return self.counts[key]

    def count(self, key):
        return self.counts.get(key, 0)


class StopEverything(BaseException):
    """A user's BaseException that is not an Exception."""


@tray.remote(max_retries=2)
def raise_base(counter, key):
    tray.get(counter.add.remote(key))
    raise StopEverything("stop everything")


@tray.remote(max_retries=2)
def raise_keyboard_interrupt(counter, key):
    tray.get(counter.add.remote(key))
    raise KeyboardInterrupt


@tray.remote(max_retries=2)
def raise_system_exit(counter, key):
    tray.get(counter.add.remote(key))
    raise SystemExit(3)


def test_a_base_exception_is_an_application_error_not_retried(one_node):
    counter = Attempts.remote()
    with pytest.raises(StopEverything) as caught:
        tray.get(raise_base.remote(counter, "base"), timeout=60 * one_node.tick_s)
    error = caught.value
    assert isinstance(error, tex.TaskError)
    assert isinstance(error.cause, StopEverything)
    assert "stop everything" in str(error) and "raise_base" in str(error)
    assert tray.get(counter.count.remote("base")) == 1  # at once: no retry


def test_keyboard_interrupt_cancels_the_task(one_node):
    counter = Attempts.remote()
    with pytest.raises(tex.TaskCancelledError, match="KeyboardInterrupt"):
        tray.get(raise_keyboard_interrupt.remote(counter, "kbi"), timeout=60 * one_node.tick_s)
    assert tray.get(counter.count.remote("kbi")) == 1
    assert tray.get(sleeper.remote(0, "still works")) == "still works"


def test_system_exit_ends_the_worker_and_the_task_is_retried(one_node):
    counter = Attempts.remote()
    with pytest.raises(tex.WorkerCrashedError):
        tray.get(raise_system_exit.remote(counter, "exit"), timeout=120 * one_node.tick_s)
    assert tray.get(counter.count.remote("exit")) == 3  # max_retries=2: three attempts
    assert tray.get(sleeper.remote(0, "still works")) == "still works"


@tray.remote
class Stoppable:
    def stop(self):
        raise StopEverything("actor stops")

    def interrupt(self):
        raise KeyboardInterrupt

    def ping(self):
        return "pong"


def test_base_exceptions_in_an_actor_method_leave_the_actor_alive(one_node):
    actor = Stoppable.remote()
    with pytest.raises(StopEverything, match="actor stops"):
        tray.get(actor.stop.remote())
    with pytest.raises(tex.TaskCancelledError):
        tray.get(actor.interrupt.remote())
    assert tray.get(actor.ping.remote()) == "pong"


@tray.remote
def raise_group():
    raise ExceptionGroup("several", [ValueError("one"), KeyError("two")])


def test_an_exception_group_arrives_as_one():
    tray.init(backend="sim")
    with pytest.raises(ExceptionGroup) as caught:
        tray.get(raise_group.remote())
    assert isinstance(caught.value, tex.TaskError)
    try:
        tray.get(raise_group.remote())
    except* ValueError as values:
        assert [str(e) for e in values.exceptions] == ["one"]
    except* KeyError as keys:
        assert len(keys.exceptions) == 1
