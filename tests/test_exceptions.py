"""tray.exceptions: the hierarchy, Ray's aliases, and how task errors reach the caller.

Ray is the reference: an exception raised in a task comes back from ``get`` as
a ``TaskError`` (``RayTaskError``) that is *also* an instance of the user's
exception class, carries the remote traceback in its message and the original
exception as ``.cause``, and propagates through every task that depends on it.
"""

from __future__ import annotations

import inspect
import pickle

import pytest

import tray
import tray.exceptions as tex

# ---------------------------------------------------------------------------
# User exception classes (module level, so plain pickle can find them)
# ---------------------------------------------------------------------------


class MyError(Exception):
    pass


class MyValueError(ValueError):
    pass


class TwoArgError(Exception):
    """An exception whose constructor needs two arguments: a dual class
    TaskError+TwoArgError cannot be built by calling the user's __init__."""

    def __init__(self, code, detail):
        super().__init__(code, detail)
        self.code = code
        self.detail = detail


# ---------------------------------------------------------------------------
# Hierarchy and aliases
# ---------------------------------------------------------------------------

# (class name, expected direct-or-indirect bases)
HIERARCHY = [
    ("TrayError", [Exception]),
    ("TaskError", ["TrayError"]),
    ("ActorError", ["TrayError"]),
    ("ActorDiedError", ["ActorError", "TrayError"]),
    ("ActorUnavailableError", ["ActorError", "TrayError"]),
    ("GetTimeoutError", ["TrayError", TimeoutError]),
    ("TaskCancelledError", ["TrayError"]),
    ("WorkerCrashedError", ["TrayError"]),
    ("NodeDiedError", ["TrayError"]),
    ("ObjectLostError", ["TrayError"]),
    ("OwnerDiedError", ["ObjectLostError", "TrayError"]),
    ("ObjectReconstructionFailedError", ["ObjectLostError", "TrayError"]),
    ("ObjectStoreFullError", ["TrayError"]),
    ("OutOfMemoryError", ["TrayError"]),
]

ALL_NAMES = [name for name, _ in HIERARCHY]


def _cls(name_or_type):
    if isinstance(name_or_type, str):
        return getattr(tex, name_or_type)
    return name_or_type


@pytest.mark.parametrize("name,bases", HIERARCHY, ids=ALL_NAMES)
def test_hierarchy(name, bases):
    cls = getattr(tex, name, None)
    assert cls is not None, f"tray.exceptions.{name} is missing"
    assert inspect.isclass(cls) and issubclass(cls, Exception)
    for base in bases:
        assert issubclass(cls, _cls(base)), f"{name} should subclass {base}"


def test_siblings_are_not_related():
    # Catching one family must not catch another.
    assert not issubclass(tex.TaskError, tex.ActorError)
    assert not issubclass(tex.ActorError, tex.TaskError)
    assert not issubclass(tex.ObjectLostError, tex.ActorError)
    assert not issubclass(tex.GetTimeoutError, tex.TaskError)
    assert not issubclass(tex.ActorDiedError, tex.ActorUnavailableError)
    assert not issubclass(tex.OwnerDiedError, tex.ObjectReconstructionFailedError)


def test_ray_aliases():
    assert tex.RayError is tex.TrayError
    assert tex.RayTaskError is tex.TaskError
    assert tex.RayActorError is tex.ActorError


def test_get_timeout_error_is_a_builtin_timeout():
    assert issubclass(tex.GetTimeoutError, TimeoutError)
    with pytest.raises(TimeoutError):
        raise tex.GetTimeoutError("too slow")


@pytest.mark.parametrize("name", ALL_NAMES)
def test_public_module_name(name):
    cls = getattr(tex, name)
    assert cls.__module__ == "tray.exceptions", (name, cls.__module__)
    assert cls.__qualname__ == name


def test_exceptions_reachable_from_package():
    assert tray.exceptions is tex


def _make(cls, message="something went wrong: 42"):
    """An instance built the simplest way the class allows: with a message,
    or with no arguments."""
    try:
        return cls(message), message
    except TypeError:
        return cls(), None


@pytest.mark.parametrize("name", ALL_NAMES)
def test_pickle_round_trip(name):
    cls = getattr(tex, name)
    error, message = _make(cls)
    for protocol in (pickle.DEFAULT_PROTOCOL, pickle.HIGHEST_PROTOCOL):
        copy = pickle.loads(pickle.dumps(error, protocol=protocol))
        assert type(copy) is type(error)
        assert str(copy) == str(error)
        assert repr(copy) == repr(error)
        assert copy.args == error.args
        if message is not None and name != "TaskError":
            assert message in str(copy)


@pytest.mark.parametrize("name", ALL_NAMES)
def test_raise_and_catch_via_base(name):
    cls = getattr(tex, name)
    error, _ = _make(cls)
    with pytest.raises(tex.TrayError):
        raise error


# ---------------------------------------------------------------------------
# Task errors from a live cluster
# ---------------------------------------------------------------------------


@tray.remote
def fails_with_my_error(x):
    raise MyError(f"boom {x}")


@tray.remote
def fails_with_value_error():
    raise MyValueError("bad value 17")


@tray.remote
def fails_with_two_arg_error():
    raise TwoArgError(404, "not here")


@tray.remote
def plus_one(x):
    return x + 1


@tray.remote
def identity(x):
    return x


def test_task_error_is_instance_of_user_class(cluster):
    ref = fails_with_my_error.remote(3)
    with pytest.raises(MyError) as info:
        tray.get(ref)
    error = info.value
    assert isinstance(error, tex.TaskError)
    assert isinstance(error, tex.RayTaskError)
    assert isinstance(error, tex.TrayError)
    assert isinstance(error, MyError)


def test_task_error_cause_and_message(cluster):
    ref = fails_with_my_error.remote(5)
    with pytest.raises(tex.TaskError) as info:
        tray.get(ref)
    error = info.value
    assert type(error.cause) is MyError
    assert error.cause.args == ("boom 5",)
    text = str(error)
    assert "fails_with_my_error" in text
    assert "boom 5" in text
    assert "MyError" in text
    # The remote traceback: the frame of the user's function, in this file.
    assert "Traceback" in text or 'File "' in text, text
    assert "test_exceptions.py" in text, text
    assert 'raise MyError(f"boom {x}")' in text, text


def test_pickled_code_keeps_its_file_name():
    # cloudpickle 3.1.3 writes "<dynamic-code>" for every code object's file;
    # tray's pickler keeps the real one, so remote tracebacks name the user's
    # file (the test above failed on a fresh machine without it).
    from tray.core import serialization

    def local(x):
        return x + 1

    loaded = pickle.loads(serialization.dumps(local))
    assert loaded(1) == 2
    assert loaded.__code__.co_filename == __file__


def test_task_error_catchable_by_builtin_base(cluster):
    # `except ValueError` in the caller catches a ValueError subclass raised remotely.
    with pytest.raises(ValueError) as info:
        tray.get(fails_with_value_error.remote())
    assert isinstance(info.value, MyValueError)
    assert isinstance(info.value, tex.TaskError)
    assert "bad value 17" in str(info.value)


def test_task_error_for_exception_with_unusual_constructor(cluster):
    # Even when a dual class cannot be made by calling the user's __init__,
    # get raises a TaskError (never a crash of the runtime) with the cause kept.
    with pytest.raises(tex.TaskError) as info:
        tray.get(fails_with_two_arg_error.remote())
    error = info.value
    assert type(error.cause) is TwoArgError
    assert (error.cause.code, error.cause.detail) == (404, "not here")
    assert "not here" in str(error)
    assert "fails_with_two_arg_error" in str(error)


def test_task_error_pickle_round_trip(cluster):
    with pytest.raises(tex.TaskError) as info:
        tray.get(fails_with_my_error.remote(9))
    error = info.value
    copy = pickle.loads(pickle.dumps(error))
    assert isinstance(copy, tex.TaskError)
    assert isinstance(copy, MyError)
    assert type(copy.cause) is MyError
    assert copy.cause.args == error.cause.args
    assert str(copy) == str(error)


def test_error_propagates_through_dependent_task(cluster):
    a = fails_with_my_error.remote(1)
    b = plus_one.remote(a)
    c = identity.remote(b)
    for ref in (a, b, c):
        with pytest.raises(MyError) as info:
            tray.get(ref)
        assert isinstance(info.value, tex.TaskError)
        assert type(info.value.cause) is MyError
        # The original failure is still what the message describes.
        assert "boom 1" in str(info.value)
        assert "fails_with_my_error" in str(info.value)


def test_error_propagates_through_ref_in_list(cluster):
    # A failing ref passed inside a list is a borrowed ref, not a dependency:
    # the task runs, and its own get of the ref raises the original error.
    @tray.remote
    def get_first(refs):
        return tray.get(refs[0])

    with pytest.raises(MyError) as info:
        tray.get(get_first.remote([fails_with_my_error.remote(2)]))
    assert isinstance(info.value, tex.TaskError)
    assert "boom 2" in str(info.value)


def test_get_of_list_raises_first_error(cluster):
    good = plus_one.remote(1)
    bad = fails_with_my_error.remote(7)
    with pytest.raises(MyError):
        tray.get([good, bad])
    assert tray.get(good) == 2


def test_actor_method_error_keeps_actor_alive(cluster):
    @tray.remote
    class Account:
        def __init__(self):
            self.balance = 10

        def withdraw(self, amount):
            if amount > self.balance:
                raise MyValueError(f"insufficient funds for {amount}")
            self.balance -= amount
            return self.balance

    account = Account.remote()
    with pytest.raises(ValueError) as info:
        tray.get(account.withdraw.remote(100))
    assert isinstance(info.value, tex.TaskError)
    assert isinstance(info.value, MyValueError)
    assert "insufficient funds for 100" in str(info.value)
    assert "withdraw" in str(info.value)
    # The actor survives a method error (Ray semantics).
    assert tray.get(account.withdraw.remote(3)) == 7


def test_failing_actor_constructor_raises_actor_died(cluster):
    @tray.remote
    class Broken:
        def __init__(self):
            raise MyError("constructor exploded")

        def ping(self):
            return "pong"

    actor = Broken.remote()
    with pytest.raises(tex.ActorDiedError) as info:
        tray.get(actor.ping.remote())
    assert isinstance(info.value, tex.ActorError)
    assert isinstance(info.value, tex.RayActorError)
    assert "constructor exploded" in str(info.value)
    # Every later call fails the same way.
    with pytest.raises(tex.ActorDiedError):
        tray.get(actor.ping.remote())


def test_killed_actor_raises_actor_died(cluster):
    @tray.remote
    class Pinger:
        def ping(self):
            return "pong"

    actor = Pinger.remote()
    assert tray.get(actor.ping.remote()) == "pong"
    tray.kill(actor)
    with pytest.raises(tex.ActorDiedError):
        tray.get(actor.ping.remote())


def test_get_timeout_raises_get_timeout_error(cluster):
    # An infeasible task stays pending forever (Ray's behaviour), so get must time out.
    pending = identity.options(resources={"no_such_resource": 1}).remote(1)
    with pytest.raises(tex.GetTimeoutError) as info:
        tray.get(pending, timeout=0.5)
    assert isinstance(info.value, TimeoutError)
    assert isinstance(info.value, tex.TrayError)
    with pytest.raises(TimeoutError):
        tray.get([pending], timeout=0)


def test_cancelled_pending_task_raises_task_cancelled(cluster):
    pending = identity.options(resources={"no_such_resource": 1}).remote(1)
    tray.cancel(pending)
    with pytest.raises(tex.TaskCancelledError) as info:
        tray.get(pending, timeout=30)
    assert isinstance(info.value, tex.TrayError)
