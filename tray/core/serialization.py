"""Serialization: cloudpickle with pickle-5 out-of-band buffers.

NumPy arrays and Arrow buffers are handed to ``buffer_callback`` rather than
copied into the pickle stream; the store keeps them as separate buffers and
``get`` rebuilds the value on read-only views of them (zero-copy where the
store is shared memory).

While a value is pickled, every ObjectRef (and actor handle) inside it
reports itself to the active ``SerializationContext``; the owner keeps those
*contained* refs alive as long as the outer object lives, and a process that
unpickles them becomes a borrower (see ``worker/reference_counter``)."""

from __future__ import annotations

import contextvars
import dataclasses
import io
import operator
import pickle
import types
from collections import ChainMap
from dataclasses import dataclass

import cloudpickle
from cloudpickle import cloudpickle as _cloudpickle_internals


def pickled_by_fields(cls: type) -> type:
    """Class decorator (above ``@dataclass(frozen=True, slots=True)``) for a
    message type: it pickles as ``cls(*fields)``. A slotted dataclass's own
    pickle support is Python code that calls ``fields()`` on every instance
    each way; this is one attrgetter out and the class's ``__init__`` in.
    A TaskReply's round trip went from ~21 to ~14 us. The simulated
    transport copies such a class field by field, as any plain dataclass
    (``transports/sim.copy_message``)."""
    fields = dataclasses.fields(cls)
    if not all(field.init for field in fields):
        raise TypeError(f"{cls.__name__}: every field must be an __init__ argument")
    names = tuple(field.name for field in fields)
    if not names:
        def __reduce__(self):
            return cls, ()
    elif len(names) == 1:
        read = operator.attrgetter(names[0])

        def __reduce__(self):
            return cls, (read(self),)
    else:
        read = operator.attrgetter(*names)

        def __reduce__(self):
            return cls, read(self)
    __reduce__.pickled_by_fields = True
    cls.__reduce__ = __reduce__
    return cls


_serialization_context: contextvars.ContextVar = contextvars.ContextVar("tray_serialization")

KIND_VALUE = 0
KIND_ERROR = 1


@dataclass(slots=True)
class SerializedObject:
    data: bytes
    # Out-of-band buffers; () when none (most values): the shared empty
    # tuple is not tracked by the cyclic GC, as an empty list would be.
    buffers: list | tuple = ()
    # (object id bytes, owner address) of every ref inside the value.
    contained: list | tuple = ()
    kind: int = KIND_VALUE

    def size_bytes(self) -> int:
        return len(self.data) + sum(memoryview(b).nbytes for b in self.buffers)

    def __reduce_ex__(self, protocol):
        # Crossing a process boundary: the buffers go as pickle-5 buffers, so
        # a transport with a buffer_callback sends them out of band without
        # a copy (and one without copies them in band).
        return (
            SerializedObject,
            (self.data, tuple(pickle.PickleBuffer(memoryview(b).cast("B")) for b in self.buffers),
             self.contained, self.kind),
        )


_DYNAMIC_CODE = "<dynamic-code>"


def _code_reduce_keeping_filename(code: types.CodeType):
    """cloudpickle's reducer for code objects, but keeping the file name:
    cloudpickle 3.1.3 and newer write ``<dynamic-code>`` instead (a payload
    independent of where the code lives), and a remote traceback should name
    the user's file, as Ray's does."""
    constructor, args = _cloudpickle_internals._code_reduce(code)
    return constructor, tuple(code.co_filename if isinstance(arg, str) and arg == _DYNAMIC_CODE
                              else arg for arg in args)


class _Pickler(cloudpickle.Pickler):
    dispatch_table = ChainMap({types.CodeType: _code_reduce_keeping_filename},
                              cloudpickle.Pickler.dispatch_table)


def dumps(value, protocol: int = 5, buffer_callback=None) -> bytes:
    """``cloudpickle.dumps`` whose code objects keep their file names."""
    with io.BytesIO() as file:
        _Pickler(file, protocol=protocol, buffer_callback=buffer_callback).dump(value)
        return file.getvalue()


class SerializationContext:
    def __init__(self) -> None:
        self.contained: list[tuple[bytes, str]] = []


# Values that plain pickle writes byte for byte as cloudpickle does, that
# hold no refs and have no out-of-band buffers: most results and arguments
# of small tasks. They skip the context and cloudpickle's Pickler (measured:
# 7.5 -> 1.8 us per value).
_PLAIN_TYPES = frozenset({bytes, str, int, float, bool, type(None)})


def serialize(value) -> SerializedObject:
    """Pickle ``value``; raises TypeError naming what could not be pickled."""
    if type(value) in _PLAIN_TYPES:
        return SerializedObject(pickle.dumps(value, protocol=5))
    context = SerializationContext()
    token = _serialization_context.set(context)
    buffers: list = []
    try:
        data = dumps(value, protocol=5, buffer_callback=buffers.append)
    except Exception as error:
        raise TypeError(
            f"Could not serialize {_describe(value)}: {type(error).__name__}: {error}. "
            "Values passed to and returned from tasks must be picklable."
        ) from error
    finally:
        _serialization_context.reset(token)
    return SerializedObject(
        data=data,
        buffers=[b.raw() if isinstance(b, pickle.PickleBuffer) else b for b in buffers] or (),
        contained=context.contained or (),
    )


def _describe(value) -> str:
    return f"{short_repr(value, 200)} (of type {type(value).__qualname__})"


def short_repr(value, limit: int) -> str:
    """``repr(value)``, cut to about ``limit`` characters, for an error
    message; never raises (a value too deeply nested to show is named by
    its type: its repr raised RecursionError, not the clear error)."""
    try:
        text = repr(value)
    except Exception:  # noqa: BLE001 - whatever repr raises
        return f"<{type(value).__qualname__} object>"
    return text if len(text) <= limit else text[:limit - 3] + "..."


def report_contained_ref(object_id: bytes, owner_address: str) -> None:
    context = _serialization_context.get(None)
    if context is not None:
        context.contained.append((object_id, owner_address))


def deserialize(serialized: SerializedObject):
    return pickle.loads(serialized.data, buffers=serialized.buffers)


def serialize_error(error: BaseException) -> SerializedObject:
    """Serialize an exception to be raised by ``get``; never fails."""
    try:
        serialized = serialize(error)
    except TypeError:
        from ..exceptions import TaskError

        substitute = TaskError(
            getattr(error, "function_name", ""),
            f"{type(error).__name__}: {error} (the exception itself could not be pickled)",
            None,
        )
        serialized = serialize(substitute)
    serialized.kind = KIND_ERROR
    return serialized
