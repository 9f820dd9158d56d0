"""``@tray.remote``: a function becomes a ``RemoteFunction``, a class an
``ActorClass``."""

from __future__ import annotations

import inspect

from . import options as opts
from .actor import ActorClass
from .remote_function import RemoteFunction


class RemoteDecoratorError(TypeError, AssertionError):
    """``@tray.remote`` used with positional arguments or empty parentheses.
    Ray raises AssertionError with this advice; tray's error is also a
    TypeError (what a misused decorator raises in Python) so both catch it."""


_REMOTE_ADVICE = (
    "The @tray.remote decorator must be applied either with no arguments and no parentheses, "
    "for example '@tray.remote', or it must be applied using some of the arguments in the "
    "list {options}, for example '@tray.remote(num_returns=2, "
    "resources={{\"CustomResource\": 1}})'.")


def remote(*args, **options):
    """``@tray.remote`` or ``@tray.remote(num_cpus=..., ...)`` on a function
    or class."""
    def decorate(target):
        if inspect.isclass(target):
            return ActorClass(target, options)
        if callable(target):
            return RemoteFunction(target, options)
        raise TypeError(f"@tray.remote applies to functions and classes, not {target!r}")

    if len(args) == 1 and not options and callable(args[0]):
        return decorate(args[0])
    if args or not options:
        raise RemoteDecoratorError(_REMOTE_ADVICE.format(
            options=sorted(opts.TASK_OPTIONS | opts.ACTOR_OPTIONS)))
    return decorate

