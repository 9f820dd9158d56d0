"""Identifiers: compact bytes with readable hex reprs.

IDs are derived, never drawn from uuid4, the OS entropy pool or wall time, so that
a simulated run produces the same IDs from the same seed:

* ``JobID`` (4 bytes) is a counter kept by the GCS.
* ``TaskID`` (16 bytes) hashes the parent task's ID with the parent's
  submission counter, as Ray does: a task's ID is a pure function of where in
  the program it was submitted.
* ``ObjectID`` (20 bytes) is the creating task's ID plus a 4-byte index
  (returns count from 1, ``put`` objects from 2**31).
* ``ActorID`` (16 bytes) is the creating task's ID hashed again, and so is a
  ``PlacementGroupID`` (a child id of the task that created the group).
* ``NodeID`` and ``WorkerID`` (16 bytes) come from the component's injected
  random generator (seeded in the simulator, OS-seeded in real processes).
"""

from __future__ import annotations

import hashlib
import random


class BaseID:
    __slots__ = ("_binary", "_hash")
    size_bytes = 16

    def __init__(self, binary: bytes) -> None:
        if type(binary) is not bytes:
            raise TypeError(f"{type(self).__name__} needs bytes, got {type(binary).__name__}")
        if len(binary) != self.size_bytes:
            raise ValueError(
                f"{type(self).__name__} needs {self.size_bytes} bytes, got {len(binary)}"
            )
        self._binary = binary
        self._hash = hash(binary)

    @classmethod
    def from_hex(cls, hex_id: str):
        return cls(bytes.fromhex(hex_id))

    @classmethod
    def from_random(cls, rng: random.Random):
        return cls(rng.getrandbits(8 * cls.size_bytes).to_bytes(cls.size_bytes, "big"))

    @classmethod
    def nil(cls):
        return cls(b"\xff" * cls.size_bytes)

    def is_nil(self) -> bool:
        return self._binary == b"\xff" * self.size_bytes

    def binary(self) -> bytes:
        return self._binary

    def hex(self) -> str:
        return self._binary.hex()

    def __eq__(self, other) -> bool:
        return type(other) is type(self) and other._binary == self._binary

    def __lt__(self, other) -> bool:
        return self._binary < other._binary

    def __hash__(self) -> int:
        return self._hash

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.hex()})"

    def __reduce__(self):
        return (type(self), (self._binary,))


def _digest(*parts: bytes, size: int) -> bytes:
    h = hashlib.blake2b(digest_size=size)
    for part in parts:
        h.update(part)
    return h.digest()


class JobID(BaseID):
    __slots__ = ()
    size_bytes = 4

    @classmethod
    def from_int(cls, value: int) -> JobID:
        return cls(value.to_bytes(4, "big"))


class NodeID(BaseID):
    __slots__ = ()


class WorkerID(BaseID):
    __slots__ = ()


class TaskID(BaseID):
    __slots__ = ()

    @classmethod
    def for_driver(cls, job_id: JobID) -> TaskID:
        return cls(_digest(b"driver", job_id.binary(), size=16))

    @classmethod
    def for_child(cls, parent: TaskID, counter: int) -> TaskID:
        return cls(_digest(parent.binary(), counter.to_bytes(8, "big"), size=16))

    @classmethod
    def for_attempt(cls, task_id: TaskID, attempt: int) -> TaskID:
        """The id that seeds the children and ``put`` objects of one execution
        of ``task_id``: the task's own id for the first, a distinct one for
        each retry (as Ray's ``TaskID::ForExecutionAttempt``). A retry that
        reused the first run's ids could meet that run's objects, still in
        some store under the dead (or cut-off) worker's ownership."""
        if attempt == 0:
            return task_id
        return cls(_digest(b"attempt", task_id.binary(), attempt.to_bytes(8, "big"), size=16))


class ActorID(BaseID):
    __slots__ = ()

    @classmethod
    def of_creation_task(cls, task_id: TaskID) -> ActorID:
        return cls(_digest(b"actor", task_id.binary(), size=16))


class PlacementGroupID(BaseID):
    __slots__ = ()

    @classmethod
    def of_creation(cls, task_id: TaskID) -> PlacementGroupID:
        """The id of a group created where ``task_id`` would have been submitted."""
        return cls(_digest(b"placement group", task_id.binary(), size=16))


PUT_INDEX_BASE = 2**31


class ObjectID(BaseID):
    __slots__ = ()
    size_bytes = 20

    @classmethod
    def for_return(cls, task_id: TaskID, index: int) -> ObjectID:
        assert 1 <= index < PUT_INDEX_BASE
        return cls(task_id.binary() + index.to_bytes(4, "big"))

    @classmethod
    def for_put(cls, task_id: TaskID, put_index: int) -> ObjectID:
        return cls(task_id.binary() + (PUT_INDEX_BASE + put_index).to_bytes(4, "big"))

    def task_id(self) -> TaskID:
        return TaskID(self._binary[:16])

    def index(self) -> int:
        return int.from_bytes(self._binary[16:], "big")

    def is_put(self) -> bool:
        return self.index() >= PUT_INDEX_BASE
