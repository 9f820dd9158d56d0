"""``@serve.batch``: calls that arrive together run as one call on a list.

The decorated async function (or method) takes one item per call and is
written to take a list: calls queue, and a batch is handed to the function
when ``max_batch_size`` items are waiting or ``batch_wait_timeout_s`` passed
since the first of them, whichever comes first. The function returns a list
of results, one per item, in order; each caller gets its own. An exception
fails every call of the batch. At most ``max_concurrent_batches`` batches
run at once.

The queue and its loop live on the asyncio loop that runs the calls (a
replica's), one per decorated function and instance, made on first use. In
the simulator the wait is on virtual time, so batches form the same way on
every replay."""

from __future__ import annotations

import asyncio
import functools
import inspect
import numbers
from collections import deque
from dataclasses import dataclass


@dataclass(frozen=True)
class BatchQueueStatistics:
    queued: int
    batches_run: int
    running_batches: int
    max_batch_size: int
    batch_wait_timeout_s: float


def _check(max_batch_size, batch_wait_timeout_s, max_concurrent_batches) -> None:
    if isinstance(max_batch_size, bool) or not isinstance(max_batch_size, int) or \
            max_batch_size < 1:
        raise ValueError(f"max_batch_size must be an integer >= 1, got {max_batch_size!r}")
    if isinstance(batch_wait_timeout_s, bool) or \
            not isinstance(batch_wait_timeout_s, numbers.Real) or batch_wait_timeout_s < 0:
        raise ValueError(f"batch_wait_timeout_s must be a number >= 0, got "
                         f"{batch_wait_timeout_s!r}")
    if isinstance(max_concurrent_batches, bool) or \
            not isinstance(max_concurrent_batches, int) or max_concurrent_batches < 1:
        raise ValueError(f"max_concurrent_batches must be an integer >= 1, got "
                         f"{max_concurrent_batches!r}")


class _BatchQueue:
    def __init__(self, function, settings: dict, max_concurrent_batches: int) -> None:
        self.function = function  # takes lists (one per argument position)
        self.settings = settings
        self.slots = asyncio.Semaphore(max_concurrent_batches)
        self.items: deque = deque()  # (args, kwargs, future)
        self.arrived = asyncio.Event()
        self.batches_run = 0
        self.running = 0
        self.loop_task = asyncio.get_running_loop().create_task(self._loop())

    @property
    def max_batch_size(self) -> int:
        return self.settings["max_batch_size"]

    @property
    def batch_wait_timeout_s(self) -> float:
        return self.settings["batch_wait_timeout_s"]

    def statistics(self) -> BatchQueueStatistics:
        return BatchQueueStatistics(queued=len(self.items), batches_run=self.batches_run,
                                    running_batches=self.running,
                                    max_batch_size=self.max_batch_size,
                                    batch_wait_timeout_s=self.batch_wait_timeout_s)

    async def submit(self, args: tuple, kwargs: dict):
        future = asyncio.get_running_loop().create_future()
        self.items.append((args, kwargs, future))
        self.arrived.set()
        return await future

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            while not self.items:
                self.arrived.clear()
                await self.arrived.wait()
            deadline = loop.time() + self.batch_wait_timeout_s
            while len(self.items) < self.max_batch_size:
                remaining = deadline - loop.time()
                if remaining <= 0:
                    break
                self.arrived.clear()
                try:
                    await asyncio.wait_for(self.arrived.wait(), timeout=remaining)
                except TimeoutError:
                    break
            batch = []
            while self.items and len(batch) < self.max_batch_size:
                item = self.items.popleft()
                if not item[2].done():  # a caller that gave up is left out
                    batch.append(item)
            if not batch:
                continue
            await self.slots.acquire()
            self.running += 1
            loop.create_task(self._run(batch))

    async def _run(self, batch: list) -> None:
        try:
            first_args, first_kwargs, _ = batch[0]
            columns = [[args[i] for args, _, _ in batch] for i in range(len(first_args))]
            keyword_columns = {key: [kwargs[key] for _, kwargs, _ in batch]
                               for key in first_kwargs}
            try:
                results = await self.function(*columns, **keyword_columns)
                if inspect.isgenerator(results) or inspect.isasyncgen(results):
                    raise TypeError("a @serve.batch function that yields is not supported "
                                    "yet: return a list")
                if not isinstance(results, (list, tuple)) or len(results) != len(batch):
                    raise TypeError(
                        f"a @serve.batch function must return a list with one result per "
                        f"item: it got {len(batch)} items and returned "
                        f"{len(results) if isinstance(results, (list, tuple)) else results!r}")
            except Exception as error:  # noqa: BLE001 - every caller of the batch gets it
                for _, _, future in batch:
                    if not future.done():
                        future.set_exception(error)
                return
            for (_, _, future), result in zip(batch, results, strict=True):
                if not future.done():
                    future.set_result(result)
        finally:
            self.batches_run += 1
            self.running -= 1
            self.slots.release()


def batch(_function=None, *, max_batch_size: int = 10, batch_wait_timeout_s: float = 0.01,
          max_concurrent_batches: int = 1):
    """``@serve.batch`` or ``@serve.batch(max_batch_size=..., batch_wait_timeout_s=...)``
    on an ``async def`` function or method (Ray Serve's defaults)."""
    _check(max_batch_size, batch_wait_timeout_s, max_concurrent_batches)

    def decorate(function):
        if not inspect.iscoroutinefunction(function):
            raise TypeError(f"@serve.batch needs an async function; {function.__name__} is "
                            f"not 'async def'")
        parameters = list(inspect.signature(function).parameters)
        is_method = bool(parameters) and parameters[0] == "self"
        # Read by the queues at every batch, so the setters below take effect
        # at once. Only picklable things live in this closure: the class is
        # pickled with it when it is deployed; the queues are made where it runs.
        settings = {"max_batch_size": max_batch_size,
                    "batch_wait_timeout_s": batch_wait_timeout_s}
        key = f"{function.__module__}.{function.__qualname__}"

        def queue_for(owner):
            holder = owner.__dict__.setdefault("_serve_batch_queues", {}) if is_method \
                else wrapper.__dict__.setdefault("_serve_batch_queues", {})
            queue = holder.get(key)
            if queue is None:
                target = functools.partial(function, owner) if is_method else function
                queue = holder[key] = _BatchQueue(target, settings, max_concurrent_batches)
            return queue

        if is_method:
            @functools.wraps(function)
            async def wrapper(self, *args, **kwargs):
                return await queue_for(self).submit(args, kwargs)
        else:
            @functools.wraps(function)
            async def wrapper(*args, **kwargs):
                return await queue_for(None).submit(args, kwargs)

        def set_max_batch_size(size: int) -> None:
            _check(size, settings["batch_wait_timeout_s"], max_concurrent_batches)
            settings["max_batch_size"] = size

        def set_batch_wait_timeout_s(timeout_s: float) -> None:
            _check(settings["max_batch_size"], timeout_s, max_concurrent_batches)
            settings["batch_wait_timeout_s"] = timeout_s

        def statistics(owner=None):
            holder = (owner.__dict__ if is_method else wrapper.__dict__).get(
                "_serve_batch_queues", {})
            queue = holder.get(key)
            return None if queue is None else queue.statistics()

        wrapper.set_max_batch_size = set_max_batch_size
        wrapper.set_batch_wait_timeout_s = set_batch_wait_timeout_s
        wrapper.statistics = statistics
        return wrapper

    if _function is not None:
        return decorate(_function)
    return decorate
