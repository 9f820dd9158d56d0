"""Actor constructor arguments as one cloudpickled ``bytes``.

tray (as of this writing) cannot send an actor's constructor arguments when
they hold numpy arrays (gymnasium spaces and weights do): creating the actor
fails with ``PicklingError: PickleBuffer can only pickled with protocol >= 5``.
Method and task arguments are fine. Until the core fixes it, the env runner
and learner actors take their arguments packed in bytes."""

from __future__ import annotations

import cloudpickle


class Packed:
    __slots__ = ("payload",)

    def __init__(self, value) -> None:
        self.payload = cloudpickle.dumps(value)

    def unpack(self):
        return cloudpickle.loads(self.payload)

    def __reduce__(self):
        return (_rebuild, (self.payload,))


def _rebuild(payload: bytes) -> Packed:
    packed = Packed.__new__(Packed)
    packed.payload = payload
    return packed


def unpack(value):
    return value.unpack() if isinstance(value, Packed) else value
