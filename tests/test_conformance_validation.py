"""Misuse raises what Ray raises (Ray's ``ray/_private/ray_option_utils.py``
and its tests test_basic*.py / test_actor*.py):

* an option of the wrong type raises TypeError, a bad value ValueError, an
  unknown option ValueError;
* ``@tray.remote()`` with empty parentheses raises with Ray's advice (an
  AssertionError in Ray; tray's is also a TypeError), and ``@tray.remote``
  on an ``async def`` function raises ValueError;
* a function or class that pickles to more than Ray's limit (about 95 MiB)
  is refused with Ray's advice to ``put`` large objects;
* arguments that do not bind to the signature raise TypeError at
  ``.remote()``, in the driver and inside tasks, whatever the handle's
  origin."""

from __future__ import annotations

import logging

import pytest

import tray
import tray.api.remote_function as api
from tray.util.scheduling_strategies import NodeAffinitySchedulingStrategy


def plain(x):
    return x


class Plain:
    def method(self, a, b=1):
        return a + b


# =============================================================== options

WRONG_TYPE_TASK = [
    ("num_cpus", "two"), ("num_cpus", True), ("num_gpus", [1]), ("memory", "1GB"),
    ("num_returns", 1.5), ("max_retries", 1.5), ("max_retries", "3"),
    ("resources", ["GPU"]), ("resources", {"widget": "1"}), ("resources", {1: 1}),
    ("name", 5), ("scheduling_strategy", 5), ("retry_exceptions", "yes"),
    ("accelerator_type", 1), ("runtime_env", "env"),
]
BAD_VALUE_TASK = [
    ("num_cpus", -1), ("num_gpus", 1.5), ("memory", -5), ("num_returns", -1),
    ("max_retries", -2), ("resources", {"CPU": 1}), ("resources", {"widget": -1}),
    ("scheduling_strategy", "BOGUS"), ("retry_exceptions", [int]), ("accelerator_type", ""),
    ("name", ""),
]
WRONG_TYPE_ACTOR = [
    ("max_restarts", 1.5), ("max_task_retries", "1"), ("max_concurrency", "x"),
    ("lifetime", 1), ("name", 1), ("namespace", 1), ("get_if_exists", "yes"),
    ("max_pending_calls", 2.0), ("num_cpus", "1"),
]
BAD_VALUE_ACTOR = [
    ("max_restarts", -2), ("max_task_retries", -2), ("max_concurrency", 0),
    ("lifetime", "forever"), ("name", ""), ("max_pending_calls", 0),
    ("get_if_exists", True),  # Ray: get_if_exists needs a name
]


def _ids(pairs):
    return [f"{key}={value!r}" for key, value in pairs]


@pytest.mark.parametrize("key,value", WRONG_TYPE_TASK, ids=_ids(WRONG_TYPE_TASK))
def test_task_option_of_the_wrong_type_is_a_type_error(key, value):
    with pytest.raises(TypeError, match=key.split("[")[0]):
        tray.remote(**{key: value})(plain)
    with pytest.raises(TypeError, match=key.split("[")[0]):
        tray.remote(plain).options(**{key: value})


@pytest.mark.parametrize("key,value", BAD_VALUE_TASK, ids=_ids(BAD_VALUE_TASK))
def test_task_option_with_a_bad_value_is_a_value_error(key, value):
    with pytest.raises(ValueError, match=key):
        tray.remote(**{key: value})(plain)


@pytest.mark.parametrize("key,value", WRONG_TYPE_ACTOR, ids=_ids(WRONG_TYPE_ACTOR))
def test_actor_option_of_the_wrong_type_is_a_type_error(key, value):
    with pytest.raises(TypeError, match=key):
        tray.remote(**{key: value})(Plain)
    with pytest.raises(TypeError, match=key):
        tray.remote(Plain).options(**{key: value})


@pytest.mark.parametrize("key,value", BAD_VALUE_ACTOR, ids=_ids(BAD_VALUE_ACTOR))
def test_actor_option_with_a_bad_value_is_a_value_error(key, value):
    with pytest.raises(ValueError, match=key):
        tray.remote(**{key: value})(Plain)


def test_method_option_types():
    with pytest.raises(TypeError, match="num_returns"):
        tray.method(num_returns="2")
    with pytest.raises(ValueError, match="num_returns"):
        tray.method(num_returns=-1)


def test_unknown_options_stay_value_errors():
    with pytest.raises(ValueError, match="bogus"):
        tray.remote(bogus=1)(plain)
    with pytest.raises(ValueError, match="bogus"):
        tray.remote(Plain).options(bogus=1)


def test_generators_are_refused_as_not_supported():
    with pytest.raises(NotImplementedError, match="generator"):
        tray.remote(num_returns="streaming")(plain)


def test_valid_options_of_every_kind_are_accepted():
    tray.remote(num_cpus=0.5, num_gpus=0, memory=10**6, num_returns=0, max_retries=-1,
                resources={"widget": 1.5}, name="n", retry_exceptions=[ValueError],
                scheduling_strategy=NodeAffinitySchedulingStrategy("a" * 32, soft=True),
                accelerator_type="A100", runtime_env={})(plain)
    tray.remote(max_restarts=-1, max_task_retries=-1, max_concurrency=4, lifetime="detached",
                name="a", namespace="", get_if_exists=True, max_pending_calls=-1)(Plain)


def test_init_argument_types():
    with pytest.raises(TypeError, match="num_cpus"):
        tray.init(backend="sim", num_cpus="four")
    with pytest.raises(TypeError, match="namespace"):
        tray.init(backend="sim", namespace=5)
    assert not tray.is_initialized()


# ============================================================ the decorator


def test_remote_with_empty_parentheses_raises_with_rays_advice():
    for target in (plain, Plain):
        with pytest.raises(AssertionError, match="no arguments and no parentheses") as caught:
            tray.remote()(target)
        assert isinstance(caught.value, TypeError)
        assert "num_cpus" in str(caught.value)  # the valid options are listed


def test_remote_with_positional_arguments_raises():
    with pytest.raises(AssertionError):
        tray.remote(plain, num_cpus=1)
    with pytest.raises(TypeError):
        tray.remote(plain, plain)


def test_remote_on_async_def_raises_value_error():
    async def fetch():
        return 1

    with pytest.raises(ValueError, match="'async def' should not be used for remote tasks"):
        tray.remote(fetch)
    with pytest.raises(ValueError, match="asyncio.run"):
        tray.remote(num_cpus=1)(fetch)


def test_async_actor_classes_are_still_fine():
    @tray.remote
    class Async:
        async def ping(self):
            return "pong"

    assert isinstance(Async, tray.ActorClass)


# ========================================================= pickled size


def test_function_over_rays_size_limit_is_refused():
    tray.init(backend="sim")
    blob = b"x" * api.FUNCTION_SIZE_ERROR_BYTES

    @tray.remote
    def captures_big():
        return len(blob)

    with pytest.raises(ValueError, match="too large") as caught:
        captures_big.remote()
    assert "tray.put()" in str(caught.value) and "captures_big" in str(caught.value)


def test_class_over_the_limit_is_refused_and_large_functions_warn(monkeypatch, caplog):
    tray.init(backend="sim")
    monkeypatch.setattr(api, "FUNCTION_SIZE_WARN_BYTES", 10_000)
    monkeypatch.setattr(api, "FUNCTION_SIZE_ERROR_BYTES", 100_000)
    medium, large = b"m" * 50_000, b"l" * 200_000

    @tray.remote
    def captures_medium():
        return len(medium)

    @tray.remote
    class CapturesLarge:
        def size(self):
            return len(large)

    with caplog.at_level(logging.WARNING, logger="tray"):
        assert tray.get(captures_medium.remote()) == 50_000
    assert any("very large" in record.getMessage() for record in caplog.records)
    with pytest.raises(ValueError, match="CapturesLarge is too large"):
        CapturesLarge.remote()


# ============================================ argument checks at .remote()


@tray.remote
class Counter:
    def __init__(self, start=0):
        self.value = start

    def add(self, amount, *, twice=False):
        self.value += amount * (2 if twice else 1)
        return self.value

    @staticmethod
    def pure(a, b):
        return a - b


@tray.remote
def add_two(a, b):
    return a + b


@tray.remote
def misuse_inside(counter):
    errors = []
    for call in (lambda: counter.add.remote(1, 2),          # too many
                 lambda: counter.add.remote(amount=1, bogus=1),
                 lambda: counter.pure.remote(1),              # a static method's own signature
                 lambda: add_two.remote(1),
                 lambda: Counter.remote(1, 2)):
        try:
            call()
            errors.append(None)
        except TypeError:
            errors.append("TypeError")
    return errors, tray.get(counter.add.remote(1, twice=True))


def test_argument_checks_inside_tasks(one_node):
    counter = Counter.remote()
    errors, value = tray.get(misuse_inside.remote(counter))
    assert errors == ["TypeError"] * 5
    assert value == 2  # nothing misused reached the actor


def test_argument_checks_on_a_handle_from_get_actor(one_node):
    counter = Counter.options(name="checked").remote()  # noqa: F841 - alive while held
    found = tray.get_actor("checked")
    with pytest.raises(TypeError):
        found.add.remote()
    with pytest.raises(TypeError):
        found.pure.remote(1, 2, 3)
    assert tray.get(found.pure.remote(5, 3)) == 2
    assert tray.get(found.add.remote(amount=4)) == 4


def test_static_methods_bind_without_self(one_node):
    counter = Counter.remote()
    assert tray.get(counter.pure.remote(10, 4)) == 6
    with pytest.raises(TypeError):
        counter.pure.remote(10)
