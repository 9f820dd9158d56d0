"""How a transform's function runs: as tasks or on a pool of actors
(``compute=``, ``concurrency=``), and the remote options its tasks or
actors get (``num_cpus``, ``num_gpus``, ``memory``, ``**ray_remote_args``),
checked at the call that asks for them.
"""

from __future__ import annotations

import inspect

import tray

from ._context import DataContext


def fn_name(fn) -> str:
    return getattr(fn, "__name__", None) or type(fn).__name__


def remote_args(num_cpus, num_gpus, memory, ray_remote_args: dict, *, actor: bool) -> dict:
    args = dict(ray_remote_args)
    if num_cpus is not None:
        args["num_cpus"] = num_cpus
    if num_gpus is not None:
        args["num_gpus"] = num_gpus
    if memory is not None:
        args["memory"] = memory
    if not actor:
        args.setdefault("max_retries", DataContext.get_current().task_max_retries)
    # Unknown options and bad values fail here, at the call, naming them
    # (tray's own check of remote options).
    if args:
        tray.remote(**args)(_ProbeActor if actor else _probe)
    return args


def _probe():  # what options are validated against
    return None


class _ProbeActor:
    pass


class ActorPoolStrategy:
    """``compute=ActorPoolStrategy(size=N)``: run a callable class on N actors."""

    def __init__(self, size: int | None = None, min_size: int | None = None,
                 max_size: int | None = None) -> None:
        chosen = size or max_size or min_size
        if chosen is None or not isinstance(chosen, int) or chosen < 1:
            raise ValueError(f"ActorPoolStrategy needs a positive size, got size={size!r}, "
                             f"min_size={min_size!r}, max_size={max_size!r}")
        self.size = chosen


class TaskPoolStrategy:
    def __init__(self, size: int | None = None) -> None:
        self.size = size


def pool_and_concurrency(fn, compute, concurrency, what: str):
    """(actor pool size or None, task concurrency or None) for ``fn``."""
    is_class = inspect.isclass(fn)
    if not is_class and not callable(fn):
        raise TypeError(f"{what}: fn must be a function or a callable class, got {fn!r}")
    if isinstance(compute, ActorPoolStrategy):
        if not is_class:
            raise ValueError(f"{what}: an ActorPoolStrategy needs a callable class as fn, "
                             f"got the function {fn_name(fn)!r}")
        return compute.size, None
    if concurrency is not None:
        if isinstance(concurrency, tuple):
            if len(concurrency) != 2 or not all(isinstance(c, int) and c > 0
                                                for c in concurrency):
                raise ValueError(f"{what}: concurrency must be a positive int or a (min, max) "
                                 f"tuple, got {concurrency!r}")
            concurrency = concurrency[1]
        if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
            raise ValueError(f"{what}: concurrency must be a positive integer, "
                             f"got {concurrency!r}")
    if is_class:
        if concurrency is None:
            raise ValueError(f"{what}: fn is the callable class {fn.__name__!r}, which runs on "
                             "a pool of actors: say how many with concurrency=N")
        if not any("__call__" in vars(k) for k in fn.__mro__[:-1]):
            raise TypeError(f"{what}: the class {fn.__name__!r} has no __call__ method")
        return concurrency, None
    if isinstance(compute, TaskPoolStrategy) and compute.size:
        concurrency = compute.size
    return None, concurrency
