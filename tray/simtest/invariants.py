"""What a broken invariant is, and which errors only a fault may cause.

Every check of a seed raises ``InvariantViolation(invariant, message)``: the
name of the invariant that broke (what a failing seed reports and what the
planted-bug tests look for) and what the check saw. The libraries' workloads
(``workloads_*.py``) raise it too, for their own reference models, and ask
``_is_fault_error`` whether an error is one that an injected fault explains.
This module imports nothing of the harness, so any of it may import this."""

from __future__ import annotations

from tray import exceptions

# Errors that a fault may cause, and only a fault.
FAULT_ERRORS = (exceptions.WorkerCrashedError, exceptions.ActorDiedError,
                exceptions.ActorUnavailableError, exceptions.ObjectLostError,
                exceptions.NodeDiedError)
# What a runtime that stopped retrying or restarting would raise: never the
# outcome of a call retried and restarted without limit. (Losing an object is
# another matter: a put's only copy, or an actor call's result, can go with
# its node whatever the retry budget.)
GIVING_UP_ERRORS = (exceptions.WorkerCrashedError, exceptions.ActorDiedError,
                    exceptions.ActorUnavailableError)
# This message means a live reference was freed: never a legitimate outcome.
FREED_WHILE_REFERENCED = "no reference to it remained"


class InvariantViolation(Exception):
    def __init__(self, invariant: str, message: str) -> None:
        super().__init__(f"[{invariant}] {message}")
        self.invariant = invariant
        self.message = message


def _cause(error: BaseException) -> BaseException:
    cause = getattr(error, "cause", None)
    return cause if isinstance(cause, BaseException) else error


def _is_fault_error(error: BaseException) -> bool:
    return isinstance(error, FAULT_ERRORS) or isinstance(_cause(error), FAULT_ERRORS)
