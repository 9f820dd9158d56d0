"""Objects: put/get of NumPy arrays (zero-copy, read-only) and arbitrary
Python values, ordering of get on lists, transfer between nodes."""

from __future__ import annotations

import collections
import dataclasses
import fractions

import numpy as np
import pytest

import tray
from tray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

LARGE_BYTES = 1024 * 1024  # well above Ray's 100 KiB inline threshold


@tray.remote
def identity(x):
    return x


# ---------------------------------------------------------------------------
# NumPy
# ---------------------------------------------------------------------------


def test_put_get_small_numpy(cluster):
    arr = np.arange(10, dtype=np.int64)
    got = tray.get(tray.put(arr))
    assert isinstance(got, np.ndarray)
    assert got.dtype == np.int64
    assert np.array_equal(got, arr)


@pytest.mark.parametrize("dtype", [np.float64, np.int32, np.uint8, np.complex128, np.bool_])
def test_put_get_numpy_dtypes(one_node, dtype):
    arr = (np.arange(1000) % 7).astype(dtype)
    got = tray.get(tray.put(arr))
    assert got.dtype == arr.dtype
    assert np.array_equal(got, arr)


def test_put_get_large_numpy_is_equal_and_read_only(cluster):
    arr = np.random.default_rng(0).standard_normal(LARGE_BYTES // 8)
    got = tray.get(tray.put(arr))
    assert got.shape == arr.shape
    assert np.array_equal(got, arr)
    assert not got.flags.writeable
    with pytest.raises(ValueError):
        got[0] = 1.0


def test_large_array_threshold_100kb_is_read_only(cluster):
    arr = np.ones(100 * 1024, dtype=np.uint8)  # exactly 100 KiB
    got = tray.get(tray.put(arr))
    assert np.array_equal(got, arr)
    assert not got.flags.writeable


def test_put_copies_value_at_put_time(cluster):
    arr = np.zeros(LARGE_BYTES // 8)
    ref = tray.put(arr)
    arr[:] = 5.0  # mutating the original after put must not change the object
    assert tray.get(ref).sum() == 0.0


def test_multidimensional_and_non_contiguous_arrays(cluster):
    base = np.arange(200 * 300, dtype=np.float32).reshape(200, 300)
    transposed = base.T
    sliced = base[::3, 1::2]
    got_t, got_s, got_b = tray.get([tray.put(transposed), tray.put(sliced), tray.put(base)])
    assert np.array_equal(got_t, transposed)
    assert np.array_equal(got_s, sliced)
    assert np.array_equal(got_b, base)
    assert got_b.shape == (200, 300)


def test_large_array_as_task_argument_is_read_only_in_task(cluster):
    @tray.remote
    def inspect(a):
        return a.sum(), a.flags.writeable, a.shape

    arr = np.ones(LARGE_BYTES // 8)
    total, writeable, shape = tray.get(inspect.remote(tray.put(arr)))
    assert total == arr.size
    assert shape == arr.shape
    assert writeable is False


def test_large_array_passed_by_value_to_task(cluster):
    @tray.remote
    def total(a):
        return float(a.sum())

    arr = np.full(LARGE_BYTES // 8, 2.0)
    assert tray.get(total.remote(arr)) == 2.0 * arr.size


def test_large_array_returned_from_task(cluster):
    @tray.remote
    def make(n):
        return np.arange(n, dtype=np.int64)

    n = LARGE_BYTES // 8
    got = tray.get(make.remote(n))
    assert np.array_equal(got, np.arange(n, dtype=np.int64))
    assert not got.flags.writeable


def test_same_object_gotten_twice_is_equal(cluster):
    arr = np.arange(LARGE_BYTES // 8)
    ref = tray.put(arr)
    a = tray.get(ref)
    b = tray.get(ref)
    assert np.array_equal(a, b)


def test_array_inside_container(cluster):
    big = np.arange(LARGE_BYTES // 8, dtype=np.float64)
    value = {"big": big, "small": np.ones(3), "meta": ("x", 1)}
    got = tray.get(tray.put(value))
    assert set(got) == {"big", "small", "meta"}
    assert np.array_equal(got["big"], big)
    assert np.array_equal(got["small"], np.ones(3))
    assert got["meta"] == ("x", 1)


def test_large_object_transferred_between_nodes(three_nodes):
    nodes = [n["NodeID"] for n in tray.nodes()]

    @tray.remote
    def produce(n):
        return np.arange(n, dtype=np.int64)

    @tray.remote
    def consume(a):
        return int(a.sum()), tray.get_runtime_context().get_node_id()

    n = 2 * LARGE_BYTES // 8
    ref = produce.options(
        scheduling_strategy=NodeAffinitySchedulingStrategy(nodes[0], soft=False)
    ).remote(n)
    results = tray.get(
        [
            consume.options(
                scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False)
            ).remote(ref)
            for node in nodes
        ]
    )
    expected = n * (n - 1) // 2
    assert [total for total, _ in results] == [expected] * 3
    assert [node for _, node in results] == nodes


def test_put_on_one_node_read_on_all(three_nodes):
    @tray.remote
    def length(a):
        return len(a)

    ref = tray.put(np.zeros(LARGE_BYTES, dtype=np.uint8))
    refs = [
        length.options(
            scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)
        ).remote(ref)
        for n in tray.nodes()
    ]
    assert tray.get(refs) == [LARGE_BYTES] * 3


# ---------------------------------------------------------------------------
# Arbitrary Python values
# ---------------------------------------------------------------------------


@dataclasses.dataclass
class Point:
    x: int
    y: int


@pytest.mark.parametrize(
    "value",
    [
        None,
        0,
        -(2**70),
        3.5,
        float("inf"),
        "text",
        "ünïcødé ✓",
        b"\x00\x01bytes",
        bytearray(b"mutable"),
        (1, "two", 3.0),
        [1, [2, [3, []]]],
        {"a": 1, "b": {"c": [1, 2]}},
        {1, 2, 3},
        frozenset({"x"}),
        complex(1, 2),
        fractions.Fraction(1, 3),
        collections.OrderedDict([("z", 1), ("a", 2)]),
        range(5),
        b"x" * LARGE_BYTES,
    ],
    ids=lambda v: type(v).__name__,
)
def test_put_get_python_values(one_node, value):
    got = tray.get(tray.put(value))
    assert got == value
    if not isinstance(value, bytearray):  # Ray itself hands a bytearray back as bytes
        assert type(got) is type(value)


def test_put_get_dataclass_and_lambda(cluster):
    got = tray.get(tray.put(Point(1, 2)))
    assert got == Point(1, 2)

    fn = tray.get(tray.put(lambda z: z * 3))
    assert fn(4) == 12


def test_put_get_locally_defined_class(cluster):
    class Local:
        def __init__(self, v):
            self.v = v

        def double(self):
            return self.v * 2

    got = tray.get(tray.put(Local(21)))
    assert got.double() == 42


def test_values_round_trip_through_task(cluster):
    values = [None, {"k": [1, 2]}, (1, 2), "s", b"b", 1.5, {3, 4}]
    assert tray.get([identity.remote(v) for v in values]) == values


def test_objects_are_immutable_copies(cluster):
    original = {"list": [1, 2, 3]}
    ref = tray.put(original)
    original["list"].append(4)
    first = tray.get(ref)
    assert first == {"list": [1, 2, 3]}
    first["list"].append(99)  # mutating a gotten copy does not affect the object
    assert tray.get(ref) == {"list": [1, 2, 3]}


def test_put_of_object_ref_is_type_error(cluster):
    ref = tray.put(1)
    with pytest.raises(TypeError):
        tray.put(ref)


# ---------------------------------------------------------------------------
# get on lists
# ---------------------------------------------------------------------------


def test_get_list_preserves_order(cluster):
    refs = [tray.put(i) for i in range(50)]
    assert tray.get(refs) == list(range(50))
    assert tray.get(list(reversed(refs))) == list(reversed(range(50)))


def test_get_list_preserves_order_when_finishing_out_of_order(cluster):
    import time

    @tray.remote
    def slow(duration_s, value):
        time.sleep(duration_s)
        return value

    tick = cluster.tick_s
    durations = [3, 1, 2, 0]
    refs = [slow.remote(d * tick, i) for i, d in enumerate(durations)]
    assert tray.get(refs) == [0, 1, 2, 3]


def test_get_list_with_repeated_ref(cluster):
    ref = tray.put("same")
    other = tray.put("other")
    assert tray.get([ref, other, ref]) == ["same", "other", "same"]


def test_object_refs_are_hashable_and_comparable(cluster):
    a = tray.put(1)
    b = tray.put(1)
    assert a != b
    assert a == a
    assert len({a, b, a}) == 2
    [same] = tray.wait([a])[0]
    assert same == a
    assert hash(same) == hash(a)
