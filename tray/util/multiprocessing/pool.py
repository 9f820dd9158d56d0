"""``Pool``: the standard library's ``multiprocessing.Pool`` over tray actors,
as Ray's ``ray.util.multiprocessing.Pool``.

A pool of ``processes`` actors, each a worker process of its own that ran
the ``initializer`` once; the work of ``map``/``starmap``/``imap``/``apply``
is cut into chunks and each chunk is one actor call, handed to the actors in
turn. ``maxtasksperchild`` retires an actor after that many chunks (once
its calls are done) and starts a fresh one, as the standard library does
with its processes.

How it differs from the standard library, and why:

* **No threads.** The standard pool runs a result thread that fires
  callbacks as results arrive. Here every result is a ref, and the pool
  looks at refs only inside the caller's own calls, so the pool behaves the
  same on the local backend, inside a task, and in the simulator (where a
  second thread would break determinism). Callbacks therefore run in the
  caller's thread, when the result is first seen complete: by that
  result's ``get``/``wait``/``ready``/``successful``, by any later call on
  the pool, or at ``join()`` at the latest. Code that blocks on something
  only a callback provides (a ``queue.Queue`` the callback fills) must call
  one of those first.
* **Errors.** A function's exception is re-raised in the caller as the
  original exception, the remote traceback as its ``__cause__``, as in the
  standard library; ``imap`` raises it when iteration reaches that item and
  can go on after it (Ray's ``imap`` yields the exception object instead).
  A chunk that failed as a whole (its actor died past its retries) raises
  the tray error (``ActorDiedError``, ...) for each of its items.
* **Workers that die.** A worker process that crashes is restarted by tray
  and its chunk re-run, up to three times (``max_task_retries=3``, like a
  task's ``max_retries``): the function should tolerate running again.
  ``ray_remote_args`` overrides that, and any other actor option.
* **Placement.** Pool actors take no CPU (as in Ray) and are spread over
  the nodes (``scheduling_strategy="SPREAD"``), so a pool uses the cluster,
  not just the driver's node.

Limits: chunks in flight are at most ``2 * processes`` for ``imap``;
``map``/``starmap``/``apply`` submit everything at once (their results are
materialized in one list anyway). The refs the pool keeps for ``join`` are
pruned as they complete; retired actors are bounded by the chunks in flight.
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
import logging
import multiprocessing
import numbers
import os
from collections.abc import Callable, Iterable

import tray
from tray import exceptions

from .remote_errors import RemoteError, capture

logger = logging.getLogger("tray.util.multiprocessing")

__all__ = ["Pool", "AsyncResult", "IMapIterator", "PoolStatistics", "TimeoutError"]

# The standard library's: AsyncResult.get and IMapIterator.next raise it.
TimeoutError = multiprocessing.TimeoutError  # noqa: A001 - the stdlib's name, on purpose

# Default actor options of the pool's workers (``ray_remote_args`` overrides).
_WORKER_OPTIONS = {"num_cpus": 0, "scheduling_strategy": "SPREAD", "max_restarts": -1,
                   "max_task_retries": 3}

_RUN, _CLOSE, _TERMINATE = "RUN", "CLOSE", "TERMINATE"


@dataclasses.dataclass(frozen=True)
class PoolStatistics:
    processes: int
    state: str                  # RUN, CLOSE or TERMINATE
    chunks_submitted: int
    chunks_in_flight: int       # submitted, not known to be finished
    actors_retired: int         # replaced after maxtasksperchild chunks


# ================================================================ the worker


class _PoolWorker:
    """One pool process: runs the initializer once, then chunks. Plain
    class; the pool makes it a remote actor."""

    def __init__(self, initializer, initargs) -> None:
        if initializer is not None:
            initializer(*initargs)

    def ready(self) -> int:
        return os.getpid()

    def run_chunk(self, func, items: list, star: bool) -> list:
        """``func`` over ``items`` (each one argument, or an argument tuple
        if ``star``); an item that raised gives a ``RemoteError``."""
        out = []
        for item in items:
            try:
                out.append(func(*item) if star else func(item))
            except Exception as error:  # noqa: BLE001 - sent back to the caller as a value
                out.append(capture(error))
        return out

    def run_apply(self, func, args: tuple, kwds: dict) -> list:
        try:
            return [func(*args, **kwds)]
        except Exception as error:  # noqa: BLE001 - sent back to the caller as a value
            return [capture(error)]


_remote_worker = None


def _worker_class():
    global _remote_worker
    if _remote_worker is None:
        _remote_worker = tray.remote(_PoolWorker)
    return _remote_worker


# ================================================================ results


class _Outcome:
    """A finished item: its value, or the exception to raise for it."""
    __slots__ = ("value", "error")

    def __init__(self, value=None, error: BaseException | None = None) -> None:
        self.value = value
        self.error = error

    def unwrap(self):
        if self.error is not None:
            raise self.error
        return self.value


def _outcomes_of(ref, count: int) -> list[_Outcome]:
    """The ``count`` items of a finished chunk."""
    try:
        values = tray.get(ref)
    except Exception as error:  # noqa: BLE001 - the chunk failed as a whole
        return [_Outcome(error=error)] * count
    return [_Outcome(error=v.exception()) if isinstance(v, RemoteError) else _Outcome(v)
            for v in values]


class AsyncResult:
    """The result of ``apply_async``/``map_async``/``starmap_async``, as the
    standard library's (``ApplyResult``/``MapResult``)."""

    def __init__(self, chunks: list, single: bool, callback, error_callback):
        self._chunks = chunks          # [(ref, item count)]
        self._single = single
        self._callback = callback
        self._error_callback = error_callback
        self._outcomes: list[_Outcome] | None = None
        self._error: BaseException | None = None
        if not chunks:
            self._finish([])

    def ready(self) -> bool:
        """Whether the call has completed."""
        self._poll(0)
        return self._outcomes is not None

    def wait(self, timeout: float | None = None) -> None:
        """Wait until the result is available or ``timeout`` seconds pass."""
        self._poll(_check_timeout(timeout))

    def get(self, timeout: float | None = None):
        """The result when it arrives; raises ``multiprocessing.TimeoutError``
        after ``timeout`` seconds, or the first item's exception."""
        self._poll(_check_timeout(timeout))
        if self._outcomes is None:
            raise TimeoutError(f"the result was not ready within {timeout} s")
        if self._error is not None:
            raise self._error
        values = [outcome.value for outcome in self._outcomes]
        return values[0] if self._single else values

    def successful(self) -> bool:
        """Whether the call completed without raising; ``ValueError`` if it
        has not completed."""
        if not self.ready():
            raise ValueError(f"{self!r} not ready")
        return self._error is None

    def _poll(self, timeout: float | None) -> None:
        if self._outcomes is not None:
            return
        refs = [ref for ref, _ in self._chunks]
        ready, _ = tray.wait(refs, num_returns=len(refs), timeout=timeout)
        if len(ready) < len(refs):
            return
        self._finish([outcome for ref, count in self._chunks
                      for outcome in _outcomes_of(ref, count)])

    def _finish(self, outcomes: list) -> None:
        self._outcomes = outcomes
        self._chunks = []
        # The first error in input order (deterministic; the standard
        # library keeps the first to arrive).
        self._error = next((o.error for o in outcomes if o.error is not None), None)
        callback, error_callback = self._callback, self._error_callback
        self._callback = self._error_callback = None
        if self._error is None and callback is not None:
            value = outcomes[0].value if self._single else [o.value for o in outcomes]
            _run_callback(callback, value)
        elif self._error is not None and error_callback is not None:
            _run_callback(error_callback, self._error)

    @property
    def _has_callbacks(self) -> bool:
        return self._callback is not None or self._error_callback is not None

    def __repr__(self) -> str:
        state = "ready" if self._outcomes is not None else "pending"
        return f"<tray.util.multiprocessing.AsyncResult {state}>"


def _run_callback(callback, value) -> None:
    try:
        callback(value)
    except Exception:  # noqa: BLE001 - a callback's failure must not fail unrelated calls
        logger.exception("a Pool callback %r raised; ignored", callback)


class IMapIterator:
    """The iterator of ``imap``/``imap_unordered``: takes the input lazily,
    keeps at most ``2 * processes`` chunks in flight, and raises an item's
    exception when iteration reaches it. ``next(timeout)`` raises
    ``multiprocessing.TimeoutError``."""

    def __init__(self, pool: Pool, func, iterable, chunksize: int, ordered: bool):
        self._pool = pool
        self._func = tray.put(func)  # pickled once, not once per chunk
        self._items = iter(iterable)
        self._chunksize = chunksize
        self._ordered = ordered
        self._in_flight: collections.deque = collections.deque()  # (ref, count)
        self._buffer: collections.deque[_Outcome] = collections.deque()
        self._exhausted = False
        self._chunks_in_flight_max = 2 * pool._processes
        self._fill()

    def _fill(self) -> None:
        while not self._exhausted and len(self._in_flight) < self._chunks_in_flight_max:
            chunk = list(itertools.islice(self._items, self._chunksize))
            if not chunk:
                self._exhausted = True
                break
            self._in_flight.append((self._pool._submit(self._func, chunk, False), len(chunk)))
            if len(chunk) < self._chunksize:
                self._exhausted = True

    def __iter__(self):
        return self

    def __next__(self):
        return self.next()

    def next(self, timeout: float | None = None):
        timeout = _check_timeout(timeout)
        while not self._buffer:
            if not self._in_flight:
                self._fill()
                if not self._in_flight:
                    raise StopIteration
            if self._ordered:
                ref, count = self._in_flight[0]
                ready, _ = tray.wait([ref], timeout=timeout)
            else:
                ready, _ = tray.wait([ref for ref, _ in self._in_flight], num_returns=1,
                                     timeout=timeout)
            if not ready:
                raise TimeoutError(f"no result within {timeout} s")
            [done] = ready
            count = next(count for ref, count in self._in_flight if ref == done)
            self._in_flight = collections.deque(
                (ref, n) for ref, n in self._in_flight if ref != done)
            self._buffer.extend(_outcomes_of(done, count))
            self._fill()
        return self._buffer.popleft().unwrap()


# ================================================================ the pool


@dataclasses.dataclass
class _Slot:
    actor: object
    chunks_run: int = 0
    refs: list = dataclasses.field(default_factory=list)  # only with maxtasksperchild


class Pool:
    """A pool of worker actors with the standard library's
    ``multiprocessing.Pool`` API (and Ray's extra arguments).

    ``processes`` defaults to the cluster's CPUs. Without a running
    cluster, ``Pool`` starts a local one (``tray.init(num_cpus=processes)``),
    or connects to ``ray_address`` (or ``$RAY_ADDRESS``), as Ray's does.
    ``ray_remote_args`` are the workers' actor options.

        with Pool(4) as pool:
            squares = pool.map(lambda x: x * x, range(100))
    """

    def __init__(self, processes: int | None = None, initializer: Callable | None = None,
                 initargs: Iterable = (), maxtasksperchild: int | None = None,
                 context=None, ray_address: str | None = None,
                 ray_remote_args: dict | None = None) -> None:
        if processes is not None and (isinstance(processes, bool) or
                                      not isinstance(processes, int)):
            raise TypeError(f"processes must be an int or None, got {type(processes).__name__}")
        if processes is not None and processes < 1:
            raise ValueError("Number of processes must be at least 1")
        if initializer is not None and not callable(initializer):
            raise TypeError("initializer must be a callable")
        if maxtasksperchild is not None and (
                isinstance(maxtasksperchild, bool) or not isinstance(maxtasksperchild, int)
                or maxtasksperchild < 1):
            raise ValueError("maxtasksperchild must be a positive int or None")
        if ray_remote_args is not None and not isinstance(ray_remote_args, dict):
            raise TypeError(f"ray_remote_args must be a dict of actor options, got "
                            f"{type(ray_remote_args).__name__}")
        if context is not None:
            logger.warning("Pool(context=...) is ignored: tray starts its own worker "
                           "processes")
        self._initializer = initializer
        self._initargs = tuple(initargs)
        self._maxtasksperchild = maxtasksperchild
        self._worker_options = {**_WORKER_OPTIONS, **(ray_remote_args or {})}
        self._state = _RUN
        self._chunks_submitted = 0
        self._actors_retired = 0
        self._in_flight: list = []           # refs join() waits for; pruned
        self._in_flight_pruned_at = 0
        self._retiring: list[_Slot] = []     # actors to kill once their refs end
        self._watched: list[AsyncResult] = []  # results whose callbacks have not run
        self._next_slot = 0
        self._processes = self._connect(processes, ray_address)
        self._slots = [_Slot(self._new_actor()) for _ in range(self._processes)]
        self._wait_ready([slot.actor for slot in self._slots])

    # ------------------------------------------------------------- startup

    @staticmethod
    def _connect(processes: int | None, ray_address: str | None) -> int:
        if not _connected():
            if os.environ.get("TRAY_AUTO_INIT") == "0":
                raise exceptions.NotInitializedError(
                    "tray is not initialized and TRAY_AUTO_INIT=0: call tray.init() before "
                    "creating a Pool")
            address = ray_address or os.environ.get("RAY_ADDRESS")
            if address and address != "local":
                logger.info("Pool: connecting to the tray cluster at %s", address)
                tray.init(address=address)
            else:
                logger.info("Pool: starting a local tray cluster with %s CPUs",
                            processes or "all")
                tray.init(num_cpus=processes)
        cpus = int(tray.cluster_resources().get("CPU", 0))
        if processes is None:
            processes = cpus
        if processes < 1:
            raise ValueError(f"the cluster has {cpus} CPUs: a Pool needs at least one "
                             f"process (pass processes=N)")
        if cpus < processes:
            raise ValueError(f"Tried to start a pool with {processes} processes on a cluster "
                             f"with only {cpus} CPUs")
        return processes

    def _new_actor(self):
        return _worker_class().options(**self._worker_options).remote(
            self._initializer, self._initargs)

    def _wait_ready(self, actors: list) -> None:
        """Every worker ran its initializer; one that failed fails the pool."""
        try:
            tray.get([actor.ready.remote() for actor in actors])
        except exceptions.TrayError as error:
            for actor in actors:
                tray.kill(actor)
            self._state = _TERMINATE
            cause = getattr(error, "cause", None)
            if isinstance(cause, exceptions.TaskError) and cause.cause is not None:
                cause = cause.cause  # the initializer's own exception
            if cause is not None and self._initializer is not None:
                raise RuntimeError(f"the Pool's initializer {self._initializer!r} failed in a "
                                   f"worker: {type(cause).__name__}: {cause}") from cause
            raise

    # ---------------------------------------------------------- submission

    def _check_running(self) -> None:
        if self._state != _RUN:
            how = "closed" if self._state == _CLOSE else "terminated"
            raise ValueError(f"Pool not running: it was {how}; create a new Pool")

    def _submit(self, func, items: list, star: bool, kwds: dict | None = None):
        """One chunk to the next actor in turn; its ref."""
        index = self._next_slot
        slot = self._slots[index]
        self._next_slot = (index + 1) % len(self._slots)
        if kwds is not None:
            ref = slot.actor.run_apply.remote(func, items[0], kwds)
        else:
            ref = slot.actor.run_chunk.remote(func, items, star)
        self._chunks_submitted += 1
        self._track(ref)
        slot.chunks_run += 1
        if self._maxtasksperchild is not None:
            slot.refs.append(ref)
            if slot.chunks_run >= self._maxtasksperchild:
                self._retiring.append(slot)
                self._actors_retired += 1
                self._slots[index] = _Slot(self._new_actor())
        return ref

    def _track(self, ref) -> None:
        self._in_flight.append(ref)
        if len(self._in_flight) >= 2 * max(self._in_flight_pruned_at, 64):
            self._in_flight = _not_ready(self._in_flight)
            self._in_flight_pruned_at = len(self._in_flight)

    def _housekeeping(self) -> None:
        """At every call: run due callbacks, end retired actors that are done."""
        if self._watched:
            for result in self._watched:
                result._poll(0)
            self._watched = [r for r in self._watched if r._has_callbacks]
        if self._retiring:
            still = []
            for slot in self._retiring:
                slot.refs = _not_ready(slot.refs)
                if slot.refs:
                    still.append(slot)
                else:
                    tray.kill(slot.actor)
            self._retiring = still

    def _async_result(self, chunks, single, callback, error_callback) -> AsyncResult:
        for name, fn in (("callback", callback), ("error_callback", error_callback)):
            if fn is not None and not callable(fn):
                raise TypeError(f"{name} must be a callable or None")
        result = AsyncResult(chunks, single, callback, error_callback)
        if result._has_callbacks:
            self._watched.append(result)
        return result

    def _chunksize(self, count: int, chunksize) -> int:
        if chunksize is None:
            chunksize, extra = divmod(count, len(self._slots) * 4)
            return max(chunksize + bool(extra), 1)
        return _check_chunksize(chunksize)

    def _map_chunks(self, func, iterable, chunksize, star: bool) -> list:
        _check_func(func)
        items = _as_list(iterable)
        chunksize = self._chunksize(len(items), chunksize)
        if items:
            func = tray.put(func) if len(items) > chunksize else func  # pickled once per map
        return [(self._submit(func, items[i:i + chunksize], star), len(items[i:i + chunksize]))
                for i in range(0, len(items), chunksize)]

    # ------------------------------------------------------------ the API

    def apply(self, func: Callable, args: tuple = (), kwds: dict | None = None, *,
              kwargs: dict | None = None):
        """``func(*args, **kwds)`` on a worker; its result."""
        return self.apply_async(func, args, kwds, kwargs=kwargs).get()

    def apply_async(self, func: Callable, args: tuple = (), kwds: dict | None = None,
                    callback: Callable | None = None, error_callback: Callable | None = None,
                    *, kwargs: dict | None = None) -> AsyncResult:
        """``func(*args, **kwds)`` on a worker; an ``AsyncResult``. (``kwargs=``
        is Ray's name for ``kwds``.)"""
        self._check_running()
        self._housekeeping()
        _check_func(func)
        if kwds is not None and kwargs is not None:
            raise TypeError("pass keyword arguments as kwds or kwargs, not both")
        kwds = kwds if kwds is not None else (kwargs or {})
        if not isinstance(args, (tuple, list)):
            raise TypeError(f"args must be a tuple of arguments, got {type(args).__name__}")
        if not isinstance(kwds, dict):
            raise TypeError(f"kwds must be a dict of keyword arguments, got "
                            f"{type(kwds).__name__}")
        ref = self._submit(func, [tuple(args)], False, kwds=kwds)
        return self._async_result([(ref, 1)], True, callback, error_callback)

    def map(self, func: Callable, iterable: Iterable, chunksize: int | None = None) -> list:
        """``[func(x) for x in iterable]``, computed by the workers."""
        return self.map_async(func, iterable, chunksize).get()

    def map_async(self, func: Callable, iterable: Iterable, chunksize: int | None = None,
                  callback: Callable | None = None,
                  error_callback: Callable | None = None) -> AsyncResult:
        self._check_running()
        self._housekeeping()
        chunks = self._map_chunks(func, iterable, chunksize, star=False)
        return self._async_result(chunks, False, callback, error_callback)

    def starmap(self, func: Callable, iterable: Iterable, chunksize: int | None = None) -> list:
        """``[func(*args) for args in iterable]``, computed by the workers."""
        return self.starmap_async(func, iterable, chunksize).get()

    def starmap_async(self, func: Callable, iterable: Iterable, chunksize: int | None = None,
                      callback: Callable | None = None,
                      error_callback: Callable | None = None) -> AsyncResult:
        self._check_running()
        self._housekeeping()
        items = [tuple(args) for args in _as_list(iterable)]
        chunks = self._map_chunks(func, items, chunksize, star=True)
        return self._async_result(chunks, False, callback, error_callback)

    def imap(self, func: Callable, iterable: Iterable, chunksize: int = 1) -> IMapIterator:
        """Like ``map``, lazily: results in order, as an iterator."""
        return self._imap(func, iterable, chunksize, ordered=True)

    def imap_unordered(self, func: Callable, iterable: Iterable,
                       chunksize: int = 1) -> IMapIterator:
        """Like ``imap``, results in the order they finish."""
        return self._imap(func, iterable, chunksize, ordered=False)

    def _imap(self, func, iterable, chunksize, ordered: bool) -> IMapIterator:
        self._check_running()
        self._housekeeping()
        _check_func(func)
        if not isinstance(iterable, Iterable):
            raise TypeError(f"'{type(iterable).__name__}' object is not iterable")
        return IMapIterator(self, func, iterable, _check_chunksize(chunksize), ordered)

    # ------------------------------------------------------------ lifetime

    def close(self) -> None:
        """No more work; the workers end once what was submitted is done
        (``join`` waits for that)."""
        if self._state == _RUN:
            self._state = _CLOSE
        self._housekeeping()

    def terminate(self) -> None:
        """End the workers now; work in flight fails (``ActorDiedError``)."""
        if self._state == _TERMINATE:
            return
        self._state = _TERMINATE
        for slot in self._slots + self._retiring:
            tray.kill(slot.actor)
        self._retiring = []
        self._in_flight = []

    def join(self) -> None:
        """Wait for the workers of a closed pool to finish and end; runs the
        callbacks still due. Raises ``ValueError`` on a running pool."""
        if self._state == _RUN:
            raise ValueError("Pool is still running: call close() or terminate() first")
        if self._state == _CLOSE:
            if self._in_flight:
                tray.wait(self._in_flight, num_returns=len(self._in_flight))
            self._in_flight = []
            self._housekeeping()
            for slot in self._slots + self._retiring:
                tray.kill(slot.actor)
            self._retiring = []
            self._state = _TERMINATE
        for result in self._watched:
            result._poll(0)
        self._watched = [r for r in self._watched if r._has_callbacks]

    def __enter__(self) -> Pool:
        self._check_running()
        return self

    def __exit__(self, *exc_info) -> None:
        self.terminate()

    def __reduce__(self):
        raise NotImplementedError("pool objects cannot be passed between processes or pickled")

    def statistics(self) -> PoolStatistics:
        if self._in_flight:
            self._in_flight = _not_ready(self._in_flight)
        return PoolStatistics(processes=self._processes, state=self._state,
                              chunks_submitted=self._chunks_submitted,
                              chunks_in_flight=len(self._in_flight),
                              actors_retired=self._actors_retired)

    def __repr__(self) -> str:
        return f"<tray.util.multiprocessing.Pool state={self._state} pool_size={self._processes}>"


# ================================================================ helpers


def _connected() -> bool:
    """Whether this process can use the cluster. (``is_initialized()`` is
    False inside a worker of the local backend, though the API works.)"""
    if tray.is_initialized():
        return True
    try:
        tray.get_runtime_context()
    except exceptions.NotInitializedError:
        return False
    return True


def _not_ready(refs: list) -> list:
    if not refs:
        return refs
    ready, not_ready = tray.wait(refs, num_returns=len(refs), timeout=0)
    return not_ready


def _check_func(func) -> None:
    if not callable(func):
        raise TypeError(f"func must be a callable, got {type(func).__name__}")


def _check_chunksize(chunksize) -> int:
    if isinstance(chunksize, bool) or not isinstance(chunksize, int):
        raise TypeError(f"chunksize must be an int, got {type(chunksize).__name__}")
    if chunksize < 1:
        raise ValueError(f"Chunksize must be 1+, not {chunksize}")
    return chunksize


def _check_timeout(timeout) -> float | None:
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, numbers.Real) or timeout < 0:
        raise ValueError(f"timeout must be None or a non-negative number of seconds, "
                         f"got {timeout!r}")
    return float(timeout)


def _as_list(iterable) -> list:
    if not isinstance(iterable, Iterable):
        raise TypeError(f"'{type(iterable).__name__}' object is not iterable")
    return list(iterable)
