"""The exceptions tray raises, with Ray's names as aliases.

Every exception pickles cleanly (it crosses process boundaries) and carries
structured fields — the ids and the cause — besides its message.

``TaskError`` is special: ``get`` raises it as an instance of a class derived
from *both* ``TaskError`` and the user's exception class, so that
``except ValueError`` in the caller catches a ``ValueError`` raised remotely,
while the message still shows the remote traceback.
"""

from __future__ import annotations


class TrayError(Exception):
    """Base class of every error tray raises."""


class TaskError(TrayError):
    """A task (or actor method) raised an exception.

    ``cause`` is the exception the user's code raised; ``traceback_str`` the
    remote traceback; ``function_name`` the task's function.
    """

    def __init__(self, function_name: str = "", traceback_str: str = "", cause=None):
        self.function_name = function_name
        self.traceback_str = traceback_str
        self.cause = cause
        # Not super(): in the dual class the next __init__ is the user's.
        BaseException.__init__(self, function_name, traceback_str)

    def __str__(self) -> str:
        return (
            f"{type(self.cause).__name__ if self.cause is not None else 'Error'} "
            f"in task {self.function_name}:\n{self.traceback_str}"
        )

    def __reduce__(self):
        return (_rebuild_task_error,
                (self.function_name, self.traceback_str, _portable_cause(self.cause)))

    def as_instanceof_cause(self) -> TaskError:
        """This error as an instance of both TaskError and the cause's class."""
        cause_cls = type(self.cause)
        if self.cause is None or isinstance(self, cause_cls):
            return self
        if not _can_subclass(cause_cls):
            return self
        try:
            cls = _dual_classes[cause_cls]
        except KeyError:
            cls = type(
                f"TaskError({cause_cls.__name__})",
                (TaskError, cause_cls),
                {"__module__": "tray.exceptions", "__init__": TaskError.__init__,
                 "__str__": TaskError.__str__, "__reduce__": TaskError.__reduce__},
            )
            _dual_classes[cause_cls] = cls
        # A group's constructor needs its message and exceptions.
        error = cls.__new__(cls, *self.cause.args) \
            if isinstance(self.cause, BaseExceptionGroup) else cls.__new__(cls)
        TaskError.__init__(error, self.function_name, self.traceback_str, self.cause)
        error.__cause__ = self.cause
        return error


_dual_classes: dict[type, type] = {}


# Raised by user code, these mean "stop" rather than "failed": tasks turn
# them into a cancellation or a worker exit, never a TaskError of their class.
_NOT_WRAPPED = (KeyboardInterrupt, SystemExit, GeneratorExit)


def _can_subclass(cls: type) -> bool:
    """Can ``get`` raise the error as an instance of ``cls`` too? Any
    exception class, a user's ``BaseException`` subclass included (as Ray
    does), unless it means "stop" or its layout forbids a subclass."""
    if issubclass(cls, _NOT_WRAPPED):
        return False
    try:
        type("_probe", (TaskError, cls), {})
    except TypeError:
        return False
    return True


def _rebuild_task_error(function_name, traceback_str, cause):
    if isinstance(cause, tuple):
        cause = _rebuild_cause(*cause)
    return TaskError(function_name, traceback_str, cause).as_instanceof_cause()


def _portable_cause(cause):
    """The user's exception in a form that unpickles even when its class's
    constructor does not take its ``args`` back (a common pattern)."""
    if cause is None:
        return None
    state = dict(getattr(cause, "__dict__", {}))
    state.pop("__traceback__", None)
    return (type(cause), tuple(cause.args), state)


def _rebuild_cause(cls, args, state):
    cause = cls.__new__(cls, *args)
    cause.args = args
    cause.__dict__.update(state)
    return cause


class _MessageError(TrayError):
    """An error described by a message; pickles by its message."""

    def __init__(self, message: str = ""):
        self.message = message
        super().__init__(message)

    def __reduce__(self):
        return (type(self), (self.message,))


class ActorError(_MessageError):
    """An actor could not run a call."""

    def __init__(self, message: str = "", actor_id: str | None = None, cause=None):
        super().__init__(message)
        self.actor_id = actor_id
        self.cause = cause
        if cause is not None:
            self.__cause__ = cause

    def __reduce__(self):
        return (type(self), (self.message, self.actor_id, self.cause))


class ActorDiedError(ActorError):
    """The actor is dead: its constructor failed, it was killed, or it crashed
    more often than ``max_restarts`` allows."""


class ActorUnavailableError(ActorError):
    """The actor is restarting; the call may be retried later."""


class TaskPlacementGroupRemoved(_MessageError):
    """The placement group the task was to run in was removed."""


class ActorPlacementGroupRemoved(ActorDiedError):
    """The placement group the actor was placed in was removed."""


class PendingCallsLimitExceeded(_MessageError):
    """An actor handle has ``max_pending_calls`` calls pending already; the
    new call was not submitted (raised by ``.remote()``, as in Ray)."""


class GetTimeoutError(TrayError, TimeoutError):
    """``get`` did not finish within its ``timeout``."""

    def __reduce__(self):
        return (type(self), tuple(self.args))


class TaskCancelledError(_MessageError):
    """The task was cancelled by ``tray.cancel``."""


class WorkerCrashedError(_MessageError):
    """The worker running the task died, and retries are exhausted."""


class NodeDiedError(_MessageError):
    """The node the work was on died."""


class ObjectLostError(_MessageError):
    """Every copy of the object was lost and it cannot be recovered."""


class OwnerDiedError(ObjectLostError):
    """The process that owned the object died."""


class ObjectReconstructionFailedError(ObjectLostError):
    """The object was lost and re-running its task failed or is not allowed."""


class ObjectStoreFullError(_MessageError):
    """The object store is full and nothing can be evicted or spilled."""


class OutOfMemoryError(_MessageError):
    """The node ran out of memory running the task."""


class NotInitializedError(TrayError, RuntimeError):
    """The API was used before ``tray.init()``."""

    def __reduce__(self):
        return (type(self), tuple(self.args))


# Ray's names, so code written for Ray runs unchanged.
RayError = TrayError
RayTaskError = TaskError
RayActorError = ActorError
ActorUnschedulableError = ActorDiedError

__all__ = [
    "TrayError", "TaskError", "ActorError", "ActorDiedError", "ActorUnavailableError",
    "GetTimeoutError", "TaskCancelledError", "WorkerCrashedError", "NodeDiedError",
    "ObjectLostError", "OwnerDiedError", "ObjectReconstructionFailedError",
    "ObjectStoreFullError", "OutOfMemoryError", "NotInitializedError",
    "PendingCallsLimitExceeded", "TaskPlacementGroupRemoved", "ActorPlacementGroupRemoved",
    "RayError", "RayTaskError", "RayActorError",
]


class RuntimeEnvSetupError(TrayError):
    """A task's or actor's runtime_env could not be set up on its node (a
    package missing from the cluster, a failed pip install, a setup over
    ``setup_timeout_seconds``); the message carries the cause (pip's error)."""

    def __init__(self, message: str = "") -> None:
        super().__init__(message)
        self.message = message

    def __reduce__(self):
        return (RuntimeEnvSetupError, (self.message,))


__all__.append("RuntimeEnvSetupError")
