"""tray.core.serialization: the plain-pickle fast path writes what the full
(cloudpickle) path writes, and only values it can."""

from __future__ import annotations

import enum

import pytest

from tray.core import serialization
from tray.core.serialization import deserialize, dumps, serialize


class Level(enum.IntEnum):  # an int subclass: not a plain value
    HIGH = 2


@pytest.mark.parametrize("value", [b"x", b"y" * 200_000, "text", 7, -(2 ** 70), 2.5, True, None])
def test_plain_values_pickle_as_cloudpickle_would(value):
    serialized = serialize(value)
    assert serialized.data == dumps(value, protocol=5)
    assert not serialized.buffers and not serialized.contained
    assert deserialize(serialized) == value and type(deserialize(serialized)) is type(value)


def test_other_values_take_the_full_path(monkeypatch):
    calls = []
    full = serialization.dumps

    def counting(value, *args, **kwargs):
        calls.append(value)
        return full(value, *args, **kwargs)

    monkeypatch.setattr(serialization, "dumps", counting)
    for value in (Level.HIGH, (1, 2), [b"x"], lambda: 1):
        serialize(value)
    assert len(calls) == 4
    serialize(3)
    assert len(calls) == 4
    assert deserialize(serialize(Level.HIGH)) is Level.HIGH
