"""Remote functions: what ``@tray.remote`` makes of a function, its export
(pickled once, checked for size) and its submission."""

from __future__ import annotations

import functools
import inspect
import logging

from ..core.serialization import dumps as _dumps
from ..core.worker.function_table import function_id_of
from . import options as opts
from .blocking import in_loop
from .session import ensure_worker, task_runtime_env

logger = logging.getLogger("tray")

# Ray's limits on a pickled function or class (ray_constants'
# FUNCTION_SIZE_WARN_THRESHOLD / FUNCTION_SIZE_ERROR_THRESHOLD): past the
# first a warning, past the second (about 95 MiB) the export fails.
FUNCTION_SIZE_WARN_BYTES = 10**7
FUNCTION_SIZE_ERROR_BYTES = 10**8


class Export:
    """A function or class pickled once, at its first use, and shared by
    every ``.options()`` variant, so that all of them run the same code
    under one function id (whichever variant is used first)."""

    def __init__(self, target, kind: str = "remote function") -> None:
        self.target = target
        self.kind = kind
        self._blob: bytes | None = None
        self._function_id = ""

    def get(self) -> tuple[str, bytes]:
        if self._blob is None:
            blob = _dumps(self.target)
            _check_pickled_size(blob, self.kind, getattr(self.target, "__qualname__",
                                                         repr(self.target)))
            self._blob = blob
            self._function_id = function_id_of(blob)
        return self._function_id, self._blob


def _check_pickled_size(blob: bytes, kind: str, name: str) -> None:
    """Ray's check of an exported function's size, with Ray's advice: a
    definition that captures a large object should ``put`` it instead."""
    size_mib = len(blob) // (1024 * 1024)
    advice = ("Check that its definition is not implicitly capturing a large array or other "
              "object in scope. Tip: use tray.put() to put large objects in the object "
              "store, and pass the ref")
    if len(blob) >= FUNCTION_SIZE_ERROR_BYTES:
        raise ValueError(f"The {kind} {name} is too large ({size_mib} MiB > "
                         f"FUNCTION_SIZE_ERROR_THRESHOLD="
                         f"{FUNCTION_SIZE_ERROR_BYTES // (1024 * 1024)} MiB). {advice}.")
    if len(blob) > FUNCTION_SIZE_WARN_BYTES:
        logger.warning("The %s %s is very large (%d MiB). %s.", kind, name, size_mib, advice)


class _LimitedCalls:
    """What a ``max_calls`` function is exported as: the function, with the
    limit the executing worker reads (``__tray_max_calls__``) to exit after
    that many calls of it."""

    def __init__(self, function, max_calls: int) -> None:
        self.function = function
        self.__tray_max_calls__ = max_calls

    def __call__(self, *args, **kwargs):
        return self.function(*args, **kwargs)


class RemoteFunction:
    """What ``@tray.remote`` makes of a function."""

    def __init__(self, function, options: dict) -> None:
        if inspect.iscoroutinefunction(function):
            raise ValueError(
                f"'async def' should not be used for remote tasks ({function.__qualname__}): "
                "wrap the async function with `asyncio.run(f())`, or make it a method of an "
                "async actor")
        self._function = function
        self._options = opts.validate(dict(options), opts.TASK_OPTIONS, "a remote function")
        self._signature = signature_of(function)
        max_calls = self._options.get("max_calls") or 0
        self._export = Export(_LimitedCalls(function, max_calls) if max_calls else function)
        # What every .remote() of these options submits with, made at the
        # first (options never change; ~10% of a submission's own cost).
        self._placement = None  # (resources, strategy)
        functools.update_wrapper(self, function)

    def __call__(self, *args, **kwargs):
        raise TypeError(f"Remote functions cannot be called directly. Instead of running "
                        f"'{self._function.__name__}()', try '{self._function.__name__}.remote()'.")

    def options(self, **options) -> RemoteFunction:
        merged = dict(self._options)
        merged.update(opts.validate(options, opts.TASK_OPTIONS, "a remote function",
                                    in_options=True))
        clone = RemoteFunction(self._function, merged)
        clone._export = self._export
        return clone

    def remote(self, *args, **kwargs):
        if self._signature is not None:
            try:
                self._signature.bind(*args, **kwargs)
            except TypeError as error:
                raise TypeError(f"{self._function.__name__}.remote(): {error}") from None
        worker = ensure_worker()
        function_id, blob = self._export.get()
        options = self._options
        num_returns = options.get("num_returns", 1)
        max_retries = options.get("max_retries")

        runtime_env = task_runtime_env(worker, options)
        if self._placement is None:
            self._placement = (opts.resources_of(options, 1.0),
                               opts.to_strategy(options.get("scheduling_strategy")))
        resources, strategy = self._placement
        refs = submit(
            worker, export=(function_id, blob), runtime_env=runtime_env,
            name=options.get("name") or getattr(self._function, "__qualname__", "task"),
            function_id=function_id, args=args, kwargs=kwargs,
            num_returns=num_returns, resources=resources, strategy=strategy,
            max_retries=3 if max_retries is None else max_retries,
            retry_exceptions=options.get("retry_exceptions") or False)
        return returns(refs, num_returns)

    def _remote(self, args=None, kwargs=None, **options):
        """Ray's lower-level submission: ``f._remote(args=[...], kwargs={...},
        **options)`` is ``f.options(**options).remote(*args, **kwargs)``."""
        target = self.options(**options) if options else self
        return target.remote(*(args or ()), **(kwargs or {}))

    def __reduce__(self):
        return (RemoteFunction, (self._function, self._options))


def submit(worker, **task) -> list:
    """Submit a task or actor call; its refs. From the driver's script on
    the local backend the caller's side builds it and queues the rest for
    the loop without waiting (``CoreWorker.submit_task``); elsewhere it all
    runs where the loop runs (in the simulator, that is this thread)."""
    if worker.queues_from_thread():
        return worker.submit_task(**task, run_on_loop=functools.partial(in_loop, worker))
    return in_loop(worker, functools.partial(worker.submit_task, **task))


def returns(refs: list, num_returns: int):
    if num_returns == 1:
        return refs[0]
    if num_returns == 0:
        return None
    return refs


def signature_of(function):
    try:
        return inspect.signature(function)
    except (TypeError, ValueError):
        return None

