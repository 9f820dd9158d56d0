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


def test_message_types_pickle_as_their_fields_and_the_simulator_still_shares_them(monkeypatch):
    import dataclasses
    import pickle

    from tray.core.messages import Infeasible, InlineResult, LeaseRequest, StoredResult, TaskReply
    from tray.core.scheduling import DefaultStrategy
    from tray.core.task_spec import ArgByRef
    from tray.transports.sim import copy_message

    reply = TaskReply([InlineResult(serialize(b"ok")), StoredResult([("n", "n1/raylet")])],
                      application_error=True)
    messages = [reply, Infeasible("no GPU"), ArgByRef(b"\x01" * 20, "n0/driver"),
                LeaseRequest({"CPU": 1.0}, DefaultStrategy(), "n0/driver", hops=2, depth=3)]
    wire = [pickle.dumps(message, protocol=5) for message in messages]
    # Unpickled without dataclasses' per-instance fields() calls.
    monkeypatch.setattr(dataclasses, "fields", None)
    for message, data in zip(messages, wire, strict=True):
        assert type(message).__reduce__.pickled_by_fields
        assert pickle.loads(data) == message
    monkeypatch.undo()
    # The simulated transport still copies them field by field: a frozen
    # message made only of immutable values is shared, not pickled anew.
    assert copy_message(messages[2]) is messages[2]
    copied = copy_message(reply)
    assert copied == reply and copied is not reply and copied.results is not reply.results


def test_pickled_by_fields_needs_every_field_in_init():
    import dataclasses

    @dataclasses.dataclass(frozen=True, slots=True)
    class Derived:
        base: int
        double: int = dataclasses.field(init=False, default=0)

    with pytest.raises(TypeError, match="every field must be an __init__ argument"):
        serialization.pickled_by_fields(Derived)
