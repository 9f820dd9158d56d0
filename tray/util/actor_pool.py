"""``ActorPool``: spread calls over a fixed set of actors, as Ray's
``ray.util.ActorPool`` does.

The pool is a plain object in the caller's process, a bookkeeper over refs:
``submit(fn, value)`` hands ``value`` to an idle actor through the caller's
``fn(actor, value)`` (which returns the call's ref), or parks it until an
actor is free; ``get_next`` / ``get_next_unordered`` wait on those refs with
``tray.wait`` and give the actor back. No thread and no actor of its own:
everything happens inside the caller's calls, so a pool behaves the same on
both backends and replays in the simulator.

Where tray differs from Ray on purpose (README, "Utilities"):

* A call given up by ``get_next(timeout=..., ignore_if_timedout=True)``
  keeps its actor busy until the call really ends (Ray returns the actor at
  once, so the next value queues behind the stuck call — the TODO in Ray's
  source). The pool notices the end at its next call.
* ``get_next`` returns the oldest result not yet returned, even after
  ``get_next_unordered`` took some (Ray raises ``ValueError`` then).
* ``map`` drops earlier submissions as Ray's does, but values still
  waiting for an actor are not run at all (Ray runs them, then drops them).
* Submitting to a pool with no actor at all raises ``ValueError`` (Ray
  parks the value and ``map`` silently yields nothing). When every actor has
  died, ``has_next()`` stays true while values wait and ``get_next`` raises
  ``RuntimeError`` naming how many can never run, instead of dropping them.

Limits: values wait in the pool only when every actor is busy; they are the
caller's own objects, already in its memory, so the pool bounds nothing the
caller did not hold anyway. In-flight calls are at most one per actor.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Callable, Iterable
from typing import Any

from .. import exceptions
from ..api import ActorHandle, ObjectRef, get, wait

__all__ = ["ActorPool", "ActorPoolStatistics"]


@dataclasses.dataclass(frozen=True)
class ActorPoolStatistics:
    """What the pool holds, for tests, logs and dashboards."""
    idle_actors: int
    busy_actors: int       # running a call whose result is not returned yet
    draining_actors: int   # running a call given up by ignore_if_timedout
    values_waiting: int    # submitted, waiting for a free actor
    results_pending: int   # submitted, result not returned yet (busy + waiting)


@dataclasses.dataclass
class _Call:
    index: int             # submission order, for get_next
    actor: Any             # the ActorHandle running it
    future: Any            # what fn returned: an ObjectRef or a list of them

    @property
    def marker(self):
        """The ref that says the call ended: every return of one call is
        stored together, so the first one stands for all."""
        return self.future[0] if isinstance(self.future, list) else self.future


class ActorPool:
    """Operate on a fixed pool of actors.

    ``actors`` is a list of actor handles. ``fn`` in ``map``/``submit`` takes
    ``(actor, value)`` and returns the ref of a call on that actor; the actor
    counts as busy until that call's result is returned.

        pool = ActorPool([Doubler.remote(), Doubler.remote()])
        list(pool.map(lambda actor, v: actor.double.remote(v), [1, 2, 3]))  # [2, 4, 6]
    """

    def __init__(self, actors: Iterable) -> None:
        if isinstance(actors, ActorHandle) or not isinstance(actors, Iterable):
            raise TypeError(f"ActorPool expects a list of actor handles, got "
                            f"{type(actors).__name__}")
        self._idle: list = []
        for actor in actors:
            self._check_actor(actor)
            if actor in self._idle:
                raise ValueError(f"actor {actor!r} is listed twice; each actor joins a pool once")
            self._idle.append(actor)
        self._calls: dict[int, _Call] = {}   # index -> call, in submission order
        self._draining: list[_Call] = []     # given up, still running
        self._waiting: collections.deque = collections.deque()  # (fn, value)
        self._next_index = 0

    @staticmethod
    def _check_actor(actor) -> None:
        if not isinstance(actor, ActorHandle):
            raise TypeError(f"ActorPool takes actor handles (from ActorClass.remote()), got "
                            f"{type(actor).__name__}: {actor!r}")

    # ---------------------------------------------------------------- map

    def map(self, fn: Callable, values: Iterable):
        """Apply ``fn(actor, value)`` over ``values`` on the pool; returns an
        iterator of the results in the order of ``values``.

        Every value is submitted now (not as the iterator is consumed).
        Results of earlier submissions not yet returned are dropped first,
        as in Ray."""
        self._check_fn(fn)
        values = self._check_values(values)
        self._drop_unreturned()
        for value in values:
            self.submit(fn, value)

        def results():
            while self.has_next():
                yield self.get_next()
        return results()

    def map_unordered(self, fn: Callable, values: Iterable):
        """Like ``map``, but results come in the order they finish."""
        self._check_fn(fn)
        values = self._check_values(values)
        self._drop_unreturned()
        for value in values:
            self.submit(fn, value)

        def results():
            while self.has_next():
                yield self.get_next_unordered()
        return results()

    def _drop_unreturned(self) -> None:
        """Discard every result not yet returned, as Ray's ``map`` does:
        values still waiting are never run; calls still running are given up
        (their actors come back when they end)."""
        self._waiting.clear()
        for call in list(self._calls.values()):
            del self._calls[call.index]
            self._draining.append(call)
        self._reclaim_drained()

    @staticmethod
    def _check_fn(fn) -> None:
        if not callable(fn):
            raise TypeError(f"fn must be a callable taking (actor, value) and returning the ref "
                            f"of a call on the actor, got {type(fn).__name__}")

    @staticmethod
    def _check_values(values) -> Iterable:
        if isinstance(values, (str, bytes)) or not isinstance(values, Iterable):
            raise TypeError(f"values must be an iterable of values, got {type(values).__name__}")
        return values

    # ------------------------------------------------------------- submit

    def submit(self, fn: Callable, value) -> None:
        """Run ``fn(actor, value)`` on an idle actor now, or as soon as one
        is free. Its result comes from ``get_next`` / ``get_next_unordered``."""
        self._check_fn(fn)
        self._reclaim_drained()
        if not self._idle and not self._calls and not self._draining:
            raise ValueError("this ActorPool has no actors: create it with a list of actor "
                             "handles, or push() one before submitting")
        if self._idle:
            self._start(fn, value, self._idle.pop())
        else:
            self._waiting.append((fn, value))

    def _start(self, fn, value, actor) -> None:
        future = fn(actor, value)
        if isinstance(future, tuple):
            future = list(future)
        refs = future if isinstance(future, list) else [future]
        if not refs or not all(isinstance(ref, ObjectRef) for ref in refs):
            self._idle.append(actor)
            raise TypeError(f"fn must return the ObjectRef of a call on the actor it is "
                            f"given (e.g. lambda actor, v: actor.method.remote(v)), "
                            f"got {future!r}")
        call = _Call(self._next_index, actor, future)
        self._calls[call.index] = call
        self._next_index += 1

    # ------------------------------------------------------------ results

    def has_next(self) -> bool:
        """Whether a submitted value's result is still to be returned."""
        return bool(self._calls) or bool(self._waiting)

    def get_next(self, timeout: float | None = None, ignore_if_timedout: bool = False):
        """The next result in submission order, waiting up to ``timeout``
        seconds (``None``: no limit).

        On timeout raises ``TimeoutError``; with ``ignore_if_timedout=True``
        the late call is given up first (its result will never be returned,
        its actor rejoins the pool when the call ends). Raises
        ``StopIteration`` when nothing is pending."""
        _check_timeout(timeout)
        call = self._next_call(timeout)
        if call is None or not self._wait([call], timeout):
            return self._timed_out(self._oldest_call(), ignore_if_timedout)
        return self._result_of(call)

    def get_next_unordered(self, timeout: float | None = None,
                           ignore_if_timedout: bool = False):
        """Any next result, whichever finishes first, waiting up to
        ``timeout`` seconds. Same errors as ``get_next``."""
        _check_timeout(timeout)
        call = self._next_call(timeout)
        if call is None:
            return self._timed_out(self._oldest_call(), ignore_if_timedout)
        calls = list(self._calls.values())
        ready = self._wait(calls, timeout)
        if not ready:
            return self._timed_out(self._oldest_call(), ignore_if_timedout)
        return self._result_of(ready[0])

    def _next_call(self, timeout) -> _Call | None:
        """The oldest call in flight, once there is one: values still
        waiting need an actor, which a draining call may give back."""
        self._reclaim_drained()
        if not self.has_next():
            raise StopIteration("No more results to get")
        if not self._calls:
            if not self._draining:
                raise RuntimeError(
                    f"{len(self._waiting)} submitted values can never run: every actor of "
                    f"this ActorPool died or was removed; push() a live actor")
            ready = self._wait(self._draining, timeout)
            if not ready:
                return None
            self._reclaim_drained()
        return self._oldest_call()

    def _oldest_call(self) -> _Call | None:
        return next(iter(self._calls.values()), None)

    @staticmethod
    def _wait(calls: list, timeout) -> list:
        """The first of ``calls`` to end within ``timeout`` (or none)."""
        markers = [call.marker for call in calls]
        ready, _ = wait(markers, num_returns=1, timeout=timeout)
        ready = set(ready)
        return [call for call in calls if call.marker in ready]

    def _timed_out(self, call: _Call | None, ignore_if_timedout: bool):
        message = "Timed out waiting for result"
        if ignore_if_timedout and call is not None:
            del self._calls[call.index]
            self._draining.append(call)
            raise TimeoutError(f"{message}; the call {call.marker!r} on {call.actor!r} has been "
                               "ignored (its actor rejoins the pool when the call ends)")
        raise TimeoutError(message)

    def _result_of(self, call: _Call):
        del self._calls[call.index]
        alive = True
        try:
            return get(call.future)
        except exceptions.ActorDiedError:
            alive = False  # a dead actor must not be picked again
            raise
        finally:
            self._return_actor(call.actor, alive)

    def _return_actor(self, actor, alive: bool = True) -> None:
        if alive:
            self._idle.append(actor)
        while self._waiting and self._idle:
            fn, value = self._waiting.popleft()
            self._start(fn, value, self._idle.pop())

    def _reclaim_drained(self) -> None:
        """Give back the actors whose given-up calls have ended."""
        if not self._draining:
            return
        for call in self._wait_all_ready(self._draining):
            self._draining.remove(call)
            alive = True
            try:
                get(call.future)
            except exceptions.ActorDiedError:
                alive = False
            except Exception:  # noqa: BLE001 - the given-up call's own result is dropped
                pass
            self._return_actor(call.actor, alive)

    @staticmethod
    def _wait_all_ready(calls: list) -> list:
        markers = [call.marker for call in calls]
        ready, _ = wait(markers, num_returns=len(markers), timeout=0)
        ready = set(ready)
        return [call for call in calls if call.marker in ready]

    # -------------------------------------------------------------- actors

    def has_free(self) -> bool:
        """Whether an actor is idle and no value waits for one."""
        self._reclaim_drained()
        return bool(self._idle) and not self._waiting

    def pop_idle(self):
        """Remove an idle actor from the pool and return it; ``None`` if no
        actor is free."""
        if self.has_free():
            return self._idle.pop()
        return None

    def push(self, actor) -> None:
        """Add ``actor`` to the pool (it takes a waiting value at once, if
        any). Raises ``ValueError`` if it is in the pool already."""
        self._check_actor(actor)
        members = self._idle + [call.actor for call in self._calls.values()] + \
            [call.actor for call in self._draining]
        if actor in members:
            raise ValueError("Actor already belongs to current ActorPool")
        self._return_actor(actor)

    def statistics(self) -> ActorPoolStatistics:
        return ActorPoolStatistics(
            idle_actors=len(self._idle), busy_actors=len(self._calls),
            draining_actors=len(self._draining), values_waiting=len(self._waiting),
            results_pending=len(self._calls) + len(self._waiting))

    def __repr__(self) -> str:
        stats = self.statistics()
        return (f"ActorPool(idle={stats.idle_actors}, busy={stats.busy_actors}, "
                f"draining={stats.draining_actors}, waiting={stats.values_waiting})")


def _check_timeout(timeout) -> None:
    if timeout is not None and (isinstance(timeout, bool) or
                                not isinstance(timeout, (int, float)) or timeout < 0):
        raise ValueError(f"timeout must be None or a non-negative number of seconds, "
                         f"got {timeout!r}")
