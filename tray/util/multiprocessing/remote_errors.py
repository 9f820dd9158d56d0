"""Exceptions raised by user code on a worker, carried back as values.

``multiprocessing.Pool`` and joblib re-raise a worker's exception in the
caller as *the original exception*, with the remote traceback attached as
its ``__cause__`` (the standard library's ``RemoteTraceback``). tray's own
``TaskError`` is a different contract (an instance of both ``TaskError`` and
the user's class); to give these APIs their own, the worker catches the
exception itself and returns it as a ``RemoteError`` value, which the
caller turns back into a raise.

An exception that does not survive a pickle round trip (a constructor with
other arguments than its ``args``, an unpicklable attribute) would fail far
from its cause, at unpickling in the caller; the worker checks the round
trip and sends a ``RuntimeError`` naming the original instead.
"""

from __future__ import annotations

import dataclasses
import pickle
import traceback

import cloudpickle


class RemoteTraceback(Exception):
    """The worker's traceback, as the ``__cause__`` of a re-raised error
    (the same role as ``multiprocessing.pool.RemoteTraceback``)."""

    def __init__(self, traceback_text: str) -> None:
        super().__init__(traceback_text)
        self.traceback_text = traceback_text

    def __str__(self) -> str:
        return self.traceback_text


@dataclasses.dataclass
class RemoteError:
    """An exception raised by user code on a worker, with its traceback."""
    error: BaseException
    traceback_text: str

    def exception(self) -> BaseException:
        """The original exception, its remote traceback as the cause."""
        self.error.__cause__ = RemoteTraceback(self.traceback_text)
        return self.error


def capture(error: BaseException) -> RemoteError:
    """Wrap ``error`` (being handled on the worker) to travel as a value."""
    text = '\n"""\n' + "".join(traceback.format_exception(error)) + '"""'
    try:
        pickle.loads(cloudpickle.dumps(error))
    except Exception as pickling_error:  # noqa: BLE001 - any failure means: send a stand-in
        error = RuntimeError(
            f"{type(error).__module__}.{type(error).__qualname__}: {error} (raised on a "
            f"worker; the exception itself could not be sent back: {pickling_error!r})")
    error.__traceback__ = None
    return RemoteError(error, text)
