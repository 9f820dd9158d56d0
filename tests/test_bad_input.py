"""Every misuse of the public API gets a clear error at the call site.

Ray is the reference for which exception type is raised; the message must
name what was wrong (the option, the offending type, ``.remote``, ...).
"""

from __future__ import annotations

import re
import threading

import pytest

import tray
import tray.exceptions as tex

# ---------------------------------------------------------------------------
# Remote functions and classes used below (decorated before init, as Ray allows)
# ---------------------------------------------------------------------------


@tray.remote
def add(a, b):
    return a + b


@tray.remote
def with_defaults(a, b=2, *, c=3):
    return a + b + c


@tray.remote
def variadic(*args, **kwargs):
    return len(args), sorted(kwargs)


@tray.remote
class Counter:
    def __init__(self, start=0):
        self.value = start

    def increment(self, by=1):
        self.value += by
        return self.value


# ---------------------------------------------------------------------------
# Calling remote things directly
# ---------------------------------------------------------------------------


def test_calling_remote_function_directly(one_node):
    with pytest.raises(TypeError, match=r"\.remote"):
        add(1, 2)
    with pytest.raises(TypeError, match=r"\.remote"):
        add()


def test_calling_actor_class_directly(one_node):
    with pytest.raises(TypeError, match=r"\.remote"):
        Counter()
    with pytest.raises(TypeError, match=r"\.remote"):
        Counter(5)


def test_calling_actor_method_directly(one_node):
    counter = Counter.remote()
    with pytest.raises(TypeError, match=r"\.remote"):
        counter.increment()
    # The actor is unaffected by the misuse.
    assert tray.get(counter.increment.remote()) == 1


def test_unknown_actor_method(one_node):
    counter = Counter.remote()
    with pytest.raises(AttributeError, match="no_such_method"):
        counter.no_such_method.remote()


def test_remote_on_non_function_or_class():
    for bad in (1, "add", None, [add]):
        with pytest.raises(TypeError):
            tray.remote(bad)


# ---------------------------------------------------------------------------
# Signature checks at .remote()
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args,kwargs",
    [
        ((1, 2, 3), {}),  # too many positional
        ((1,), {}),  # missing argument
        ((), {}),  # missing both
        ((1, 2), {"d": 4}),  # unknown keyword
        ((1,), {"a": 1, "b": 2}),  # a given twice
    ],
    ids=["too-many", "missing-one", "missing-all", "unknown-kwarg", "duplicate"],
)
def test_wrong_arguments_for_function(cluster, args, kwargs):
    with pytest.raises(TypeError):
        add.remote(*args, **kwargs)


def test_wrong_arguments_respect_defaults_and_keyword_only(one_node):
    # Not over-strict: what Python accepts, .remote accepts.
    assert tray.get(with_defaults.remote(1)) == 6
    assert tray.get(with_defaults.remote(1, 10, c=100)) == 111
    assert tray.get(variadic.remote(1, 2, 3, x=1, y=2)) == (3, ["x", "y"])
    # c is keyword-only.
    with pytest.raises(TypeError):
        with_defaults.remote(1, 2, 3)
    with pytest.raises(TypeError):
        with_defaults.remote(1, e=5)


def test_wrong_arguments_for_actor_constructor(one_node):
    with pytest.raises(TypeError):
        Counter.remote(1, 2)
    with pytest.raises(TypeError):
        Counter.remote(begin=1)


def test_wrong_arguments_for_actor_method(one_node):
    counter = Counter.remote()
    with pytest.raises(TypeError):
        counter.increment.remote(1, 2)
    with pytest.raises(TypeError):
        counter.increment.remote(step=1)
    # A rejected call never reaches the actor.
    assert tray.get(counter.increment.remote()) == 1


def test_wrong_arguments_with_options(one_node):
    with pytest.raises(TypeError):
        add.options(num_cpus=1).remote(1)


# ---------------------------------------------------------------------------
# Options: unknown names and invalid values
# ---------------------------------------------------------------------------


def _f(x):
    return x


class _A:
    def m(self):
        return 1


def test_unknown_option_in_decorator():
    with pytest.raises(ValueError, match="bogus_option"):
        tray.remote(bogus_option=1)(_f)
    with pytest.raises(ValueError, match="bogus_option"):
        tray.remote(bogus_option=1)(_A)


def test_unknown_option_in_options(one_node):
    with pytest.raises(ValueError, match="bogus_option"):
        add.options(bogus_option=1)
    with pytest.raises(ValueError, match="bogus_option"):
        Counter.options(bogus_option=1)


def test_misspelled_option_is_named(one_node):
    with pytest.raises(ValueError, match="num_cpu\\b"):
        add.options(num_cpu=1)


def test_actor_only_option_on_function():
    # Ray: max_restarts/lifetime/max_concurrency are actor options.
    for key, value in (("max_restarts", 1), ("lifetime", "detached"), ("max_concurrency", 2)):
        with pytest.raises(ValueError, match=key):
            tray.remote(**{key: value})(_f)


def test_task_only_option_on_actor():
    # Ray: num_returns/max_retries/retry_exceptions are task options.
    for key, value in (("num_returns", 2), ("max_retries", 1), ("retry_exceptions", True)):
        with pytest.raises(ValueError, match=key):
            tray.remote(**{key: value})(_A)


INVALID_FUNCTION_OPTIONS = [
    ("num_cpus", -1),
    ("num_gpus", -1),
    ("memory", -1),
    ("num_returns", -1),
    ("max_retries", -2),
    ("scheduling_strategy", "BOGUS"),
    ("resources", {"CPU": 1}),  # Ray: use num_cpus, not resources={"CPU": ...}
    ("resources", {"widget": -1}),
    # Ray refuses nan; inf and an empty resource name used to pend for good.
    ("num_cpus", float("nan")),
    ("num_cpus", float("inf")),
    ("resources", {"widget": float("nan")}),
    ("resources", {"": 1}),
]

INVALID_ACTOR_OPTIONS = [
    ("num_cpus", -1),
    ("max_restarts", -2),
    ("max_task_retries", -2),
    ("max_concurrency", 0),
    ("lifetime", "forever"),
    ("scheduling_strategy", "BOGUS"),
    ("name", ""),
]


def _ids(pairs):
    return [f"{k}={v!r}" for k, v in pairs]


@pytest.mark.parametrize("key,value", INVALID_FUNCTION_OPTIONS, ids=_ids(INVALID_FUNCTION_OPTIONS))
def test_invalid_function_option_value_in_decorator(key, value):
    with pytest.raises(ValueError, match=key):
        tray.remote(**{key: value})(_f)


@pytest.mark.parametrize("key,value", INVALID_FUNCTION_OPTIONS, ids=_ids(INVALID_FUNCTION_OPTIONS))
def test_invalid_function_option_value_in_options(one_node, key, value):
    with pytest.raises(ValueError, match=key):
        add.options(**{key: value})


@pytest.mark.parametrize("key,value", INVALID_ACTOR_OPTIONS, ids=_ids(INVALID_ACTOR_OPTIONS))
def test_invalid_actor_option_value(one_node, key, value):
    with pytest.raises(ValueError, match=key):
        tray.remote(**{key: value})(_A)
    with pytest.raises(ValueError, match=key):
        Counter.options(**{key: value})


def test_option_of_wrong_type(one_node):
    # Ray raises TypeError for a wrongly typed option (ValueError for a bad value).
    with pytest.raises(TypeError, match="num_cpus"):
        add.options(num_cpus="two")
    with pytest.raises(TypeError, match="num_returns"):
        add.options(num_returns=1.5)


def test_valid_options_still_work(one_node):
    # The validation must not reject what Ray accepts.
    assert tray.get(add.options(num_cpus=0.5, num_returns=1, max_retries=-1).remote(1, 2)) == 3
    assert tray.get(add.options(scheduling_strategy="SPREAD").remote(1, 2)) == 3
    assert tray.get(add.options(scheduling_strategy="DEFAULT").remote(1, 2)) == 3
    counter = Counter.options(max_restarts=-1, max_task_retries=-1, max_concurrency=1).remote()
    assert tray.get(counter.increment.remote()) == 1


def test_method_decorator_bad_num_returns():
    with pytest.raises(ValueError, match="num_returns"):
        tray.method(num_returns=-1)
    with pytest.raises((TypeError, ValueError)):
        tray.method(bogus_option=1)


# ---------------------------------------------------------------------------
# get / wait on bad input
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("bad", [1, "ref", None, [1], [None], {"a": 1}], ids=repr)
def test_get_on_non_refs(one_node, bad):
    with pytest.raises(TypeError):
        tray.get(bad)


def test_get_on_list_with_one_non_ref(one_node):
    ref = add.remote(1, 2)
    with pytest.raises(TypeError):
        tray.get([ref, 3])
    assert tray.get([ref]) == [3]


def test_get_on_empty_list(one_node):
    assert tray.get([]) == []


def test_get_negative_timeout(one_node):
    ref = add.remote(1, 2)
    with pytest.raises(ValueError, match="timeout"):
        tray.get(ref, timeout=-1)


@pytest.mark.parametrize("bad", [[1], [None], ["ref"], 1, None], ids=repr)
def test_wait_on_non_refs(one_node, bad):
    with pytest.raises(TypeError):
        tray.wait(bad)


def test_wait_on_a_single_ref_not_in_a_list(one_node):
    # Ray: "wait() expected a list of ray.ObjectRef, got a single ray.ObjectRef".
    with pytest.raises(TypeError):
        tray.wait(add.remote(1, 2))


def test_wait_on_list_with_one_non_ref(one_node):
    with pytest.raises(TypeError):
        tray.wait([add.remote(1, 2), 5])


def test_wait_duplicate_refs(one_node):
    ref = add.remote(1, 2)
    with pytest.raises(ValueError):
        tray.wait([ref, ref])
    with pytest.raises(ValueError):
        tray.wait([ref, add.remote(2, 3), ref], num_returns=1)


def test_wait_num_returns_greater_than_len(one_node):
    refs = [add.remote(i, i) for i in range(2)]
    with pytest.raises(ValueError, match="num_returns"):
        tray.wait(refs, num_returns=3)


@pytest.mark.parametrize("num_returns", [0, -1])
def test_wait_num_returns_not_positive(one_node, num_returns):
    refs = [add.remote(i, i) for i in range(2)]
    with pytest.raises(ValueError):
        tray.wait(refs, num_returns=num_returns)


def test_wait_negative_timeout(one_node):
    refs = [add.remote(1, 2)]
    with pytest.raises(ValueError, match="timeout"):
        tray.wait(refs, timeout=-1)


def test_wait_on_empty_list(one_node):
    # Ray returns ([], []) for an empty list before checking num_returns
    # (python/ray/_private/worker.py, wait()).
    assert tray.wait([]) == ([], [])


def test_wait_valid_call_still_works(one_node):
    refs = [add.remote(i, i) for i in range(3)]
    ready, not_ready = tray.wait(refs, num_returns=3, timeout=None)
    assert sorted(tray.get(ready)) == [0, 2, 4]
    assert not_ready == []


# ---------------------------------------------------------------------------
# Arguments that cannot be serialized
# ---------------------------------------------------------------------------


def _numbers():
    yield 1


UNPICKLABLE = [
    (threading.Lock, "lock"),
    (_numbers, "generator"),
]


def _expect_serialization_error(info, type_word):
    # Ray raises TypeError for an argument that cannot be serialized; a
    # failure inside a task (an unpicklable return value) arrives as a
    # TaskError that is also a TypeError.
    error = info.value
    assert isinstance(error, TypeError), type(error)
    text = str(error).lower()
    assert type_word in text, f"{type_word!r} not named in: {error}"
    # ... and says why: it could not be pickled / serialized.
    assert "pickle" in text or "serializ" in text, str(error)


@pytest.mark.parametrize("make,type_word", UNPICKLABLE, ids=[w for _, w in UNPICKLABLE])
def test_unpicklable_argument(cluster, make, type_word):
    with pytest.raises(TypeError) as info:
        add.remote(make(), 1)
    _expect_serialization_error(info, type_word)


def test_too_deeply_nested_argument_is_a_clear_error(cluster):
    # Issue 43: a deeply nested argument raised a raw RecursionError (from
    # the repr() that was to name it in the error).
    nested: list = []
    for _ in range(100_000):
        nested = [nested]
    with pytest.raises(TypeError, match=r"Could not serialize the argument #0 \(<list "
                                        r"object>\).*recursion"):
        add.remote(nested, 1)
    with pytest.raises(TypeError, match="Could not serialize <list object>.*recursion"):
        tray.put(nested)
    assert tray.get(add.remote(1, 1)) == 2  # nothing else is hurt


@pytest.mark.parametrize("make,type_word", UNPICKLABLE, ids=[w for _, w in UNPICKLABLE])
def test_unpicklable_argument_nested_in_container(one_node, make, type_word):
    with pytest.raises(TypeError) as info:
        add.remote({"inner": [make()]}, 1)
    _expect_serialization_error(info, type_word)


def test_unpicklable_keyword_argument(one_node):
    with pytest.raises(TypeError) as info:
        variadic.remote(guard=threading.Lock())
    _expect_serialization_error(info, "lock")


def test_unpicklable_actor_argument(one_node):
    counter = Counter.remote()
    with pytest.raises(TypeError) as info:
        counter.increment.remote(threading.Lock())
    _expect_serialization_error(info, "lock")
    with pytest.raises(TypeError) as info:
        Counter.remote(threading.Lock())
    _expect_serialization_error(info, "lock")
    # The runtime is still usable after a rejected argument.
    assert tray.get(counter.increment.remote()) == 1


def test_unpicklable_put(one_node):
    with pytest.raises(TypeError) as info:
        tray.put(threading.Lock())
    _expect_serialization_error(info, "lock")
    assert tray.get(tray.put(5)) == 5


def test_unpicklable_return_value(one_node):
    @tray.remote
    def returns_lock():
        return threading.Lock()

    with pytest.raises(TypeError) as info:
        tray.get(returns_lock.remote())
    _expect_serialization_error(info, "lock")
    assert isinstance(info.value, tex.TaskError)
    assert "returns_lock" in str(info.value)


def test_function_closing_over_unpicklable_object(one_node):
    lock = threading.Lock()

    def uses_lock():
        with lock:
            return 1

    # Ray fails when the function is exported (first .remote()); failing at
    # decoration is also acceptable.  Either way, the lock is named.
    with pytest.raises(TypeError) as info:
        tray.get(tray.remote(uses_lock).remote())
    _expect_serialization_error(info, "lock")


# ---------------------------------------------------------------------------
# num_returns that does not match what the function returns
# ---------------------------------------------------------------------------


def _expect_num_returns_error(ref):
    with pytest.raises((tex.TaskError, ValueError)) as info:
        tray.get(ref)
    assert "num_returns" in str(info.value), str(info.value)


def test_num_returns_too_many_values(cluster):
    @tray.remote(num_returns=2)
    def three():
        return 1, 2, 3

    a, b = three.remote()
    _expect_num_returns_error(a)
    _expect_num_returns_error(b)


def test_num_returns_too_few_values(one_node):
    @tray.remote(num_returns=3)
    def two():
        return 1, 2

    refs = two.remote()
    assert len(refs) == 3
    for ref in refs:
        _expect_num_returns_error(ref)


def test_num_returns_non_iterable(cluster):
    @tray.remote(num_returns=2)
    def scalar():
        return 5

    a, b = scalar.remote()
    _expect_num_returns_error(a)
    _expect_num_returns_error(b)


def test_num_returns_via_options_mismatch(one_node):
    a, b = add.options(num_returns=2).remote(1, 2)
    _expect_num_returns_error(a)
    _expect_num_returns_error(b)


def test_num_returns_mismatch_on_actor_method(one_node):
    @tray.remote
    class Pair:
        @tray.method(num_returns=2)
        def three(self):
            return 1, 2, 3

        @tray.method(num_returns=2)
        def good(self):
            return "x", "y"

    pair = Pair.remote()
    a, b = pair.three.remote()
    _expect_num_returns_error(a)
    _expect_num_returns_error(b)
    # The actor survives and the correct method still works.
    assert tray.get(list(pair.good.remote())) == ["x", "y"]


def test_num_returns_matching_is_fine(one_node):
    @tray.remote(num_returns=2)
    def two():
        return [1, 2]  # any iterable of the right length, as in Ray

    a, b = two.remote()
    assert tray.get([a, b]) == [1, 2]


# ---------------------------------------------------------------------------
# Named actors
# ---------------------------------------------------------------------------


def test_get_actor_unknown_name(cluster):
    with pytest.raises(ValueError, match="no_such_actor"):
        tray.get_actor("no_such_actor")


def test_get_actor_unknown_namespace(one_node):
    counter = Counter.options(name="known_counter", namespace="ns1").remote()  # noqa: F841 - a
    # handle keeps it alive (as Ray, a named actor ends with its last handle)
    assert tray.get(tray.get_actor("known_counter", namespace="ns1").increment.remote()) == 1
    with pytest.raises(ValueError, match="known_counter"):
        tray.get_actor("known_counter", namespace="ns2")


def test_get_actor_empty_name(one_node):
    with pytest.raises(ValueError):
        tray.get_actor("")


def test_duplicate_actor_name(one_node):
    first = Counter.options(name="dup").remote()  # noqa: F841 - alive while held
    with pytest.raises(ValueError, match="dup"):
        Counter.options(name="dup").remote()


# ---------------------------------------------------------------------------
# Other API functions on bad input
# ---------------------------------------------------------------------------


def test_cancel_non_ref(one_node):
    with pytest.raises((TypeError, ValueError)):
        tray.cancel(5)


def test_kill_non_actor(one_node):
    with pytest.raises((TypeError, ValueError)):
        tray.kill(5)
    with pytest.raises((TypeError, ValueError)):
        tray.kill(add.remote(1, 2))


# ---------------------------------------------------------------------------
# Lifecycle: before init, init twice, bad init arguments
# ---------------------------------------------------------------------------


@pytest.fixture
def not_initialized(monkeypatch):
    """No cluster, and no auto-init (TRAY_AUTO_INIT=0): the explicit mode,
    where a call that needs a cluster raises (tests/test_conformance_auto_init.py
    covers the default, Ray's auto-init)."""
    monkeypatch.setenv("TRAY_AUTO_INIT", "0")
    if tray.is_initialized():
        tray.shutdown()
    assert not tray.is_initialized()
    yield
    if tray.is_initialized():
        tray.shutdown()


def _assert_names_init(error):
    assert isinstance(error, tex.TrayError), type(error)
    assert "init" in str(error), str(error)


@pytest.mark.parametrize(
    "call",
    [
        lambda: tray.put(1),
        lambda: add.remote(1, 2),
        lambda: Counter.remote(),
        lambda: tray.get_actor("anything"),
        lambda: tray.nodes(),
        lambda: tray.cluster_resources(),
        lambda: tray.available_resources(),
    ],
    ids=["put", "task", "actor", "get_actor", "nodes", "cluster_resources", "available_resources"],
)
def test_api_before_init(not_initialized, call):
    with pytest.raises(tex.TrayError) as info:
        call()
    _assert_names_init(info.value)
    # TRAY_AUTO_INIT=0: the failed call must not have started a cluster.
    assert not tray.is_initialized()


def test_api_after_shutdown(not_initialized, backend):
    tray.init(backend=backend, num_nodes=1, num_cpus=1)
    ref = tray.put(1)
    assert tray.get(ref) == 1
    tray.shutdown()
    assert not tray.is_initialized()
    with pytest.raises(tex.TrayError) as info:
        tray.put(2)
    _assert_names_init(info.value)
    with pytest.raises(tex.TrayError):
        tray.get(ref)


def test_shutdown_without_init_is_a_no_op(not_initialized):
    tray.shutdown()
    tray.shutdown()
    assert not tray.is_initialized()


def test_init_twice(one_node, backend):
    ref = tray.put("still here")
    with pytest.raises((RuntimeError, tex.TrayError)) as info:
        tray.init(backend=backend)
    assert "init" in str(info.value)
    # The first cluster is untouched.
    assert tray.is_initialized()
    assert tray.get(ref) == "still here"


def test_init_twice_with_ignore_reinit_error(one_node, backend):
    ref = tray.put("still here")
    tray.init(backend=backend, ignore_reinit_error=True)
    assert tray.is_initialized()
    assert tray.get(ref) == "still here"


def test_unknown_backend(not_initialized):
    with pytest.raises(ValueError) as info:
        tray.init(backend="no_such_backend")
    text = str(info.value)
    assert "no_such_backend" in text
    assert "sim" in text, f"known backends not listed: {text}"
    assert not tray.is_initialized()


@pytest.mark.parametrize(
    "kwargs",
    [{"num_nodes": 0}, {"num_nodes": -1}, {"num_cpus": -1}, {"num_gpus": -1}],
    ids=lambda kw: ",".join(f"{k}={v}" for k, v in kw.items()),
)
def test_invalid_init_arguments(not_initialized, backend, kwargs):
    with pytest.raises(ValueError, match=re.escape(next(iter(kwargs)))):
        tray.init(backend=backend, **kwargs)
    assert not tray.is_initialized()
    # A failed init leaves the process able to init properly.
    tray.init(backend=backend, num_nodes=1, num_cpus=1)
    assert tray.get(add.remote(1, 2)) == 3


# ============================== options are honoured, or refused with why


def test_options_tray_does_not_support_yet_are_refused_not_ignored():
    # (runtime_env is supported now: tests/test_runtime_env.py; Ray's keys
    # tray lacks are refused with the reason.)
    with pytest.raises(NotImplementedError, match="conda"):
        add.options(runtime_env={"conda": "env"})
    with pytest.raises(NotImplementedError, match="conda"):
        tray.remote(runtime_env={"conda": "env"})(_A)
    with pytest.raises(NotImplementedError, match="_metadata"):
        add.options(_metadata={"k": "v"})
    add.options(runtime_env={})  # empty: nothing asked, nothing refused


def test_actor_method_retry_exceptions_is_refused():
    tray.init(backend="sim")

    @tray.remote
    class Counter:
        def bump(self):
            return 1

    counter = Counter.remote()
    with pytest.raises(NotImplementedError, match="retrying application errors of actor"):
        counter.bump.options(retry_exceptions=True)


def test_accelerator_type_is_a_resource_constraint():
    tray.init(backend="sim", resources={"accelerator_type:V100": 1})

    @tray.remote(accelerator_type="V100")
    def on_v100():
        return "v100"

    @tray.remote(accelerator_type="A100")
    def on_a100():
        return "a100"

    assert tray.get(on_v100.remote()) == "v100"
    ready, _ = tray.wait([on_a100.remote()], timeout=5.0)
    assert ready == []  # no node has one: it waits, as in Ray
    with pytest.raises(ValueError, match="accelerator_type"):
        on_v100.options(accelerator_type="")


def test_name_option_names_the_task_in_its_error(backend):
    tray.init(backend=backend, num_cpus=1)

    @tray.remote
    def fails():
        raise ValueError("bad")

    with pytest.raises(ValueError, match="in task custom-name"):
        tray.get(fails.options(name="custom-name").remote())


def test_a_call_from_another_thread_of_a_simulated_driver_is_refused_clearly():
    """The simulator has no threads: a driver's other thread gets a clear
    error (it had "must be called from async context" from deep in trio),
    and the cluster goes on serving the thread that started it."""
    tray.init(backend="sim")

    @tray.remote
    def one():
        return 1

    ref = one.remote()
    errors: list = []

    def from_a_thread():
        for call in (lambda: tray.get(ref), lambda: one.remote()):
            try:
                call()
            except tray.exceptions.TrayError as error:
                errors.append(str(error))

    thread = threading.Thread(target=from_a_thread, name="helper")
    thread.start()
    thread.join(timeout=60)
    assert len(errors) == 2
    assert all("thread 'helper'" in e and "runs in the thread that started it" in e
               for e in errors)
    assert tray.get([ref, one.remote()]) == [1, 1]
