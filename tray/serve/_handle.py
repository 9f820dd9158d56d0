"""Deployment handles and the router behind them.

A ``DeploymentHandle`` names a deployment; calling it (``.remote()``) picks a
replica and sends it the request as an actor call, returning a
``DeploymentResponse`` (a ``DeploymentResponseGenerator`` for
``.options(stream=True)``).

**The router.** Each process keeps one router per deployment it calls,
shared by every handle to that deployment there. It knows the deployment's
running replicas from the controller through a *long poll*: a call to the
controller that returns when the replica set changes (or after
``LONG_POLL_TIMEOUT_S``), after which the router sends the next one. It
picks a replica by **power of two choices**: two replicas drawn at random
(a seeded ``random.Random``, so the simulator replays), the one with fewer
requests this router has in flight wins. A request goes straight to a
replica: when both candidates are at ``max_ongoing_requests`` the router
sends it to the least loaded replica anyway, where it waits for a slot
(the replica enforces the limit); those waiting requests are the
deployment's queue, and past ``max_queued_requests`` of them a call
raises ``BackPressureError`` (HTTP 503). Ray queues such requests in the
router instead; sending at once keeps the path one actor call long and the
router free of a background loop in synchronous callers.

**Two kinds of callers.** Synchronous code (a driver script, a task, a
threaded method) has no event loop to run a router's background work in.
There the router does its work inside ``.remote()``: it checks whether the
long poll answered (``tray.wait`` with no timeout) and sends the next one,
and learns which of its in-flight requests ended by checking the oldest ones
of a candidate that looks full (replicas serve their queue in order, so the
oldest finish first), or when the caller fetches a result. An answer found
waiting may have waited there for as long as the caller made no call (it
says only that the replicas changed since the router last looked): unless
the next poll confirms it at once, the router reads the current target
(``routing_target``, answered at once) before it routes, since a replica
stopped meanwhile (drained and gone) would fail the request, and a
synchronous caller's request is sent again only when it fetches the result. Asynchronous
code (a replica's methods, the HTTP proxy) runs on an asyncio loop: there
``.remote()`` starts an asyncio task that assigns the request, a background
task keeps the long poll going, and each request's result is fetched once by
a task that also counts it finished."""

from __future__ import annotations

import asyncio
import itertools
import random
from collections import deque
from dataclasses import dataclass

import tray

from . import _context
from ._common import LONG_POLL_TIMEOUT_S, ReplicaInfo, RequestMetadata, RoutingTarget
from .exceptions import (
    BackPressureError,
    DeploymentUnavailableError,
    RayServeException,
    ReplicaDrainedError,
)

_UNSET = object()

# How many of a replica's oldest in-flight requests a synchronous router
# checks for completion at a time.
REAP_BATCH_MAX = 16
# How long a request waits for its deployment to have a replica at all
# (it is starting, or scaling up from zero) before it fails.
ASSIGN_TIMEOUT_S = 120.0
# How often a request is sent again after it found its replica drained
# (stopped by the controller after all its requests finished: the request
# did not run there).
MAX_REQUEST_RETRIES = 3
# After a long poll answered, how long a synchronous router waits for the
# answer to the next one (a change that followed at once), and how many
# times in a row.
CONFIRM_WAIT_S = 0.02
CONFIRM_ROUNDS = 3
# How long a synchronous router then waits for the controller's current
# target, when the answer it took had been waiting (the controller answers
# at once; past this, it restarts or is cut off, and the answer the router
# has stands).
CURRENT_TARGET_TIMEOUT_S = 1.0


def _trio_asyncio_loop() -> bool:
    """True inside tray's own asyncio loops (replicas, proxies, async
    actors), where an ObjectRef can be awaited."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return False
    return type(loop).__module__.startswith("trio_asyncio")


@dataclass(frozen=True)
class RouterStatistics:
    deployment: str
    app_name: str
    replicas: tuple  # replica ids the router sends to
    in_flight: dict  # replica id -> requests this router has in flight there
    queued: int  # in-flight requests beyond the replicas' max_ongoing_requests
    target_version: int


class Router:
    """One deployment's router in this process (see the module's header)."""

    def __init__(self, controller, app_name: str, deployment: str, seed: str) -> None:
        self.controller = controller
        self.app_name = app_name
        self.deployment = deployment
        self.rng = random.Random(f"serve-router:{app_name}#{deployment}:{seed}")
        self.target: RoutingTarget | None = None
        self.replicas: list[ReplicaInfo] = []
        self.in_flight: dict[str, deque] = {}  # sync: refs in send order
        self.counts: dict[str, int] = {}  # async: exact counts
        self._poll_ref = None
        self._poll_task: asyncio.Task | None = None
        self._changed: asyncio.Event | None = None
        self._waiting = 0  # requests waiting for any replica (scale from zero)
        self._ids = itertools.count()
        self._seed = seed

    # ------------------------------------------------------------ state

    def next_request_id(self) -> str:
        return f"{self._seed}:{next(self._ids)}"

    def _stale(self, target: RoutingTarget) -> bool:
        """Whether ``target`` is older than the one the router has: an older
        answer (a re-sent poll, or one a dead controller gave) never undoes
        a newer one. Versions are ``(controller incarnation, n)``; "does not
        exist" is ``(incarnation, -1)``, so it is stale only when an older
        incarnation said it (a deployment deleted since is told in the
        same one)."""
        current = self.target
        if current is None or not isinstance(current.version, tuple) or \
                not isinstance(target.version, tuple):
            return False
        if target.exists:
            return target.version < current.version
        return target.version[0] < current.version[0]

    def _apply(self, target: RoutingTarget) -> None:
        if self._stale(target):
            return
        self.target = target
        self.replicas = sorted(target.replicas, key=lambda r: r.replica_id)
        live = {r.replica_id for r in self.replicas}
        for replica_id in list(self.in_flight):
            if replica_id not in live and not self.in_flight[replica_id]:
                del self.in_flight[replica_id]
        for replica in self.replicas:
            self.in_flight.setdefault(replica.replica_id, deque())
            self.counts.setdefault(replica.replica_id, 0)
        if self._changed is not None:
            self._changed.set()

    def apply_target(self, target: RoutingTarget) -> None:
        """Take a routing target fetched outside the long poll (``serve.run``
        hands over the one it saw when the application ran)."""
        self._apply(target)

    def _known_version(self):
        return -1 if self.target is None else self.target.version

    def _fresh_target_sync(self, timeout_s: float | None = None) -> None:
        """Ask the controller for the deployment's target now (before telling
        a caller that it does not exist: the long poll's answer may be old,
        from a controller that restarted without its state since; and after
        taking an answer that waited for the caller)."""
        try:
            self._apply(tray.get(self.controller.routing_target.remote(
                self.app_name, self.deployment), timeout=timeout_s))
        except tray.exceptions.ActorDiedError as error:
            raise RayServeException("the Serve controller is gone (serve.shutdown() ran, "
                                    f"or it died for good): {error}") from error
        except (tray.exceptions.ActorUnavailableError, tray.exceptions.GetTimeoutError):
            pass  # the old answer stands

    def _unavailable(self) -> Exception | None:
        target = self.target
        if target is None:
            return None
        if not target.exists:
            return RayServeException(f"Deployment {self.deployment!r} does not exist in "
                                     f"application {self.app_name!r}")
        if target.unavailable_reason and not target.replicas:
            return DeploymentUnavailableError(
                f"Deployment {self.deployment!r} of application {self.app_name!r} has no "
                f"replica to take the request: {target.unavailable_reason}")
        return None

    def statistics(self) -> RouterStatistics:
        in_flight = {r.replica_id: self._load(r) for r in self.replicas}
        return RouterStatistics(
            deployment=self.deployment, app_name=self.app_name,
            replicas=tuple(r.replica_id for r in self.replicas), in_flight=in_flight,
            queued=self._queued(), target_version=self._known_version())

    def _load(self, replica: ReplicaInfo) -> int:
        return max(len(self.in_flight.get(replica.replica_id, ())),
                   self.counts.get(replica.replica_id, 0))

    def _queued(self) -> int:
        return sum(max(0, self._load(r) - r.max_ongoing_requests) for r in self.replicas)

    # ------------------------------------------------- choosing a replica

    def _candidates(self) -> list[ReplicaInfo]:
        """Two replicas drawn at random, in random order: ``min`` keeps the
        first of equal loads, so with two replicas the order is the draw
        too (before, the first of the list won every tie, and a caller
        that waits for each reply sent all its requests to one replica:
        issue 41)."""
        picks = self.rng.sample(range(len(self.replicas)), min(2, len(self.replicas)))
        return [self.replicas[i] for i in picks]

    def _choose(self, reap) -> ReplicaInfo:
        """Power of two choices; ``reap(replica)`` refreshes a synchronous
        router's count of a replica that looks full (None: counts are exact)."""
        candidates = self._candidates()
        if reap is not None:
            for replica in candidates:
                if self._load(replica) >= replica.max_ongoing_requests:
                    reap(replica)
        best = min(candidates, key=self._load)
        if self._load(best) < best.max_ongoing_requests:
            return best
        # Both candidates are full: maybe every replica is. Then the request
        # waits at the least loaded one, unless the queue is at its limit.
        if reap is not None:
            for replica in self.replicas:
                if replica not in candidates:
                    reap(replica)
        best = min(self.replicas, key=self._load)
        if self._load(best) >= best.max_ongoing_requests:
            limit = self.target.max_queued_requests if self.target is not None else -1
            queued = self._queued()
            if limit != -1 and queued >= limit:
                raise BackPressureError(num_queued_requests=queued, max_queued_requests=limit,
                                        deployment=self.deployment)
        return best

    # ------------------------------------------------ synchronous callers

    def _poll_sync(self, block: bool, pending: int = 0) -> None:
        """Take the long poll's answer if it came (wait for it if ``block``),
        and keep one poll outstanding. An answer says the replicas changed;
        changes come in runs (a rolling update, a scale-up), so the router
        asks once more at once, waiting up to ``CONFIRM_WAIT_S``, whether
        that answer is still the latest. An answer found waiting (``block``
        false) came at any time since the caller's last call, and a busy
        controller may answer that check later than ``CONFIRM_WAIT_S``: the
        replicas may have changed again since (a downscale drained and
        stopped one: chaos seed 205), so then the router reads the current
        target before it routes, rather than send requests to replicas that
        are gone."""
        if self._poll_ref is None:
            self._send_poll(pending)
        if block:
            ready = [self._poll_ref]
        else:
            ready, _ = tray.wait([self._poll_ref], timeout=0, fetch_local=False)
        took = False
        for _ in range(CONFIRM_ROUNDS):
            if not ready:
                break
            ref, self._poll_ref = self._poll_ref, None
            try:
                self._apply(tray.get(ref))
                took = True
            except tray.exceptions.ActorDiedError as error:
                raise RayServeException("the Serve controller is gone (serve.shutdown() ran, "
                                        f"or it died for good): {error}") from error
            except tray.exceptions.ActorUnavailableError:
                pass  # it restarts: the next poll goes to the new one
            self._send_poll(0)
            ready, _ = tray.wait([self._poll_ref], timeout=CONFIRM_WAIT_S, fetch_local=False)
        if took and not block and not ready:
            self._fresh_target_sync(CURRENT_TARGET_TIMEOUT_S)

    def _send_poll(self, pending: int) -> None:
        self._poll_ref = self.controller.listen_for_change.remote(
            ("deployment", self.app_name, self.deployment), self._known_version(), pending)

    def _reap(self, replica: ReplicaInfo) -> None:
        refs = self.in_flight.get(replica.replica_id)
        if not refs:
            return
        oldest = list(itertools.islice(refs, 0, max(REAP_BATCH_MAX,
                                                    replica.max_ongoing_requests)))
        ready, _ = tray.wait(oldest, num_returns=len(oldest), timeout=0, fetch_local=False)
        if ready:
            # A dict, not a set: the last holder of a ref the caller dropped
            # may be this, and a set would let them go (their objects
            # freed) in the order of their hashes, which follows
            # PYTHONHASHSEED (as rllib's fetch_ready did, seed 184).
            finished = dict.fromkeys(ready)
            kept = [ref for ref in refs if ref not in finished]
            refs.clear()
            refs.extend(kept)

    def assign_sync(self, meta: RequestMetadata, method: str, args: tuple, kwargs: dict):
        """Send one request from synchronous code: (ref, replica)."""
        self._poll_sync(block=self.target is None)
        waited = 0
        confirmed = False
        while not self.replicas:
            error = self._unavailable()
            if error is not None and not confirmed and not self.target.exists:
                confirmed = True
                self._fresh_target_sync()
                continue
            if error is not None:
                raise error
            waited += 1
            if waited * LONG_POLL_TIMEOUT_S > ASSIGN_TIMEOUT_S:
                raise DeploymentUnavailableError(
                    f"Deployment {self.deployment!r} of application {self.app_name!r} had no "
                    f"running replica for {ASSIGN_TIMEOUT_S:.0f} s")
            self._poll_sync(block=True, pending=1)
        replica = self._choose(self._reap)
        ref = getattr(replica.actor, method).remote(meta, *args, **kwargs)
        self.in_flight.setdefault(replica.replica_id, deque()).append(ref)
        return ref, replica

    def finished_sync(self, replica_id: str, ref) -> None:
        refs = self.in_flight.get(replica_id)
        if refs:
            try:
                refs.remove(ref)
            except ValueError:
                pass

    def _retry_verdict(self, replica_id: str, error: BaseException):
        """True/False, or None when only the controller can tell."""
        if isinstance(error, ReplicaDrainedError):
            self.forget_replica(replica_id)
            return True
        if isinstance(error, tray.exceptions.ActorDiedError):
            self.forget_replica(replica_id)
            return None
        return False

    def retryable_sync(self, replica_id: str, error: BaseException) -> bool:
        verdict = self._retry_verdict(replica_id, error)
        if verdict is not None:
            return verdict
        try:
            drained = tray.get(self.controller.was_drained.remote(
                self.app_name, self.deployment, replica_id))
        except Exception:  # noqa: BLE001 - cannot tell: the error stands
            return False
        if not drained:
            self.controller.report_dead_replica.remote(replica_id)
        return drained

    async def retryable_async(self, replica_id: str, error: BaseException) -> bool:
        verdict = self._retry_verdict(replica_id, error)
        if verdict is not None:
            return verdict
        try:
            drained = await self.controller.was_drained.remote(
                self.app_name, self.deployment, replica_id)
        except Exception:  # noqa: BLE001 - cannot tell: the error stands
            return False
        if not drained:
            self.controller.report_dead_replica.remote(replica_id)
        return drained

    def forget_replica(self, replica_id: str) -> None:
        """A request found the replica dead: stop sending there until the
        controller's next answer."""
        self.replicas = [r for r in self.replicas if r.replica_id != replica_id]

    # ----------------------------------------------- asynchronous callers

    def _ensure_poll_task(self) -> None:
        if self._changed is None:
            self._changed = asyncio.Event()
        if self._poll_task is None or self._poll_task.done():
            self._poll_task = asyncio.get_running_loop().create_task(self._poll_loop())

    async def _poll_loop(self) -> None:
        failures = 0
        while True:
            try:
                target = await self.controller.listen_for_change.remote(
                    ("deployment", self.app_name, self.deployment), self._known_version(),
                    self._waiting)
            except tray.exceptions.ActorDiedError:
                known = self._known_version()
                self.target = RoutingTarget(
                    version=(known[0], known[1] + 1) if isinstance(known, tuple) else ("", 0),
                    exists=False)
                if self._changed is not None:
                    self._changed.set()
                return
            except Exception:  # noqa: BLE001 - the controller restarts; poll again
                failures += 1
                await asyncio.sleep(min(0.05 * 2 ** min(failures, 6), 2.0))
                continue
            failures = 0
            self._apply(target)

    async def assign_async(self, meta: RequestMetadata, method: str, args: tuple,
                           kwargs: dict):
        """Send one request from asyncio code: (ref, replica)."""
        self._ensure_poll_task()
        args = tuple([await _resolve(a) for a in args])
        kwargs = {k: await _resolve(v) for k, v in kwargs.items()}
        loop = asyncio.get_running_loop()
        deadline = loop.time() + ASSIGN_TIMEOUT_S
        confirmed = False
        while not self.replicas:
            error = self._unavailable()
            if error is not None and not confirmed and not self.target.exists:
                confirmed = True  # the poll's answer may be old: ask now
                try:
                    self._apply(await self.controller.routing_target.remote(
                        self.app_name, self.deployment))
                except tray.exceptions.ActorDiedError as died:
                    raise RayServeException("the Serve controller is gone (serve.shutdown() "
                                            f"ran, or it died for good): {died}") from died
                except Exception:  # noqa: BLE001 - unreachable now: the old answer stands
                    pass
                continue
            if error is not None:
                raise error
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise DeploymentUnavailableError(
                    f"Deployment {self.deployment!r} of application {self.app_name!r} had no "
                    f"running replica for {ASSIGN_TIMEOUT_S:.0f} s")
            self._changed.clear()
            self._waiting += 1
            try:
                await asyncio.wait_for(self._changed.wait(), timeout=min(remaining, 1.0))
            except TimeoutError:
                pass
            finally:
                self._waiting -= 1
        replica = self._choose(None)
        ref = getattr(replica.actor, method).remote(meta, *args, **kwargs)
        self.counts[replica.replica_id] = self.counts.get(replica.replica_id, 0) + 1
        return ref, replica

    def finished_async(self, replica_id: str) -> None:
        if self.counts.get(replica_id, 0) > 0:
            self.counts[replica_id] -= 1


async def _resolve(value):
    """A DeploymentResponse argument becomes its ObjectRef (tray passes the
    value to the replica without it coming here)."""
    if isinstance(value, DeploymentResponse):
        return await value._to_object_ref()
    if isinstance(value, DeploymentResponseGenerator):
        raise TypeError("a streaming response (DeploymentResponseGenerator) cannot be passed "
                        "to another handle call; iterate it instead")
    return value


def _resolve_sync(value):
    if isinstance(value, DeploymentResponse):
        return value._to_object_ref_sync()
    if isinstance(value, DeploymentResponseGenerator):
        raise TypeError("a streaming response (DeploymentResponseGenerator) cannot be passed "
                        "to another handle call; iterate it instead")
    return value


# ================================================================ responses


async def _await_ref(ref):
    if _trio_asyncio_loop():
        return await ref
    # A plain asyncio loop (a driver's asyncio.run): poll without blocking it.
    delay_s = 0.0005
    while True:
        ready, _ = tray.wait([ref], timeout=0, fetch_local=False)
        if ready:
            return tray.get(ref)
        await asyncio.sleep(delay_s)
        delay_s = min(delay_s * 2, 0.05)


def _retrieve(task: asyncio.Task) -> None:
    """Mark a background task's error as seen: whoever awaits the response
    gets it; nobody else should be warned about it."""
    if not task.cancelled():
        task.exception()


class DeploymentResponse:
    """The future result of a handle call (Ray Serve's): ``result()`` in
    synchronous code, ``await`` in asynchronous code; pass it to another
    handle call to hand its result over without fetching it here."""

    def __init__(self, router: Router, request: tuple, *, ref=None,
                 replica: ReplicaInfo | None = None, assign: asyncio.Task | None = None) -> None:
        self._router = router
        self._request = request  # (meta, method, args, kwargs): to send it again
        self._ref = ref
        self._replica = replica
        self._assign = assign  # asyncio callers: the task assigning the request
        self._fetch: asyncio.Task | None = None

    def result(self, *, timeout_s: float | None = None, _skip_asyncio_check: bool = False):
        """The call's result; raises its error, or ``TimeoutError`` after
        ``timeout_s`` seconds."""
        if not _skip_asyncio_check and _trio_asyncio_loop():
            raise RuntimeError("Sync methods should not be called from within an asyncio "
                               "event loop. Use `await response` instead.")
        if self._assign is not None:
            raise RuntimeError("this response was made in asyncio code: await it there")
        router = self._router
        for attempt in range(MAX_REQUEST_RETRIES + 1):
            try:
                value = tray.get(self._ref, timeout=timeout_s)
            except tray.exceptions.GetTimeoutError:
                raise
            except BaseException as error:
                router.finished_sync(self._replica.replica_id, self._ref)
                if attempt < MAX_REQUEST_RETRIES and isinstance(error, Exception) and \
                        router.retryable_sync(self._replica.replica_id, error):
                    self._ref, self._replica = router.assign_sync(*self._request)
                    continue
                raise
            router.finished_sync(self._replica.replica_id, self._ref)
            return value
        raise AssertionError("unreachable")

    async def _to_object_ref(self):
        """The ObjectRef of the call (Ray's private name, used by libraries)."""
        if self._assign is not None:
            self._ref, self._replica = await asyncio.shield(self._assign)
        return self._ref

    def _to_object_ref_sync(self):
        if self._assign is not None:
            raise RuntimeError("this response was made in asyncio code: await it there")
        return self._ref

    def _start_fetch(self) -> None:
        """asyncio callers: fetch the result once, as soon as it comes, so the
        router counts the request finished even if nobody awaits it."""
        self._fetch = asyncio.ensure_future(self._fetch_once())
        self._fetch.add_done_callback(_retrieve)

    async def _result_async(self):
        if self._fetch is None:
            self._fetch = asyncio.ensure_future(self._fetch_once())
        return await asyncio.shield(self._fetch)

    async def _fetch_once(self):
        ref = await self._to_object_ref()
        router = self._router
        for attempt in range(MAX_REQUEST_RETRIES + 1):
            try:
                value = await _await_ref(ref)
            except BaseException as error:
                self._finished(ref)
                if attempt < MAX_REQUEST_RETRIES and isinstance(error, Exception) and \
                        await router.retryable_async(self._replica.replica_id, error):
                    if self._assign is not None:
                        ref, self._replica = await router.assign_async(*self._request)
                    else:
                        ref, self._replica = router.assign_sync(*self._request)
                    self._ref = ref
                    continue
                raise
            self._finished(ref)
            return value
        raise AssertionError("unreachable")

    def _finished(self, ref) -> None:
        if self._assign is not None:
            self._router.finished_async(self._replica.replica_id)
        else:
            self._router.finished_sync(self._replica.replica_id, ref)

    def __await__(self):
        return self._result_async().__await__()

    def cancel(self) -> None:
        """Ask for the request to be cancelled (best effort, as Ray's)."""
        if self._ref is not None:
            try:
                tray.cancel(self._ref)
            except Exception:  # noqa: BLE001 - it finished already
                pass

    def __reduce__(self):
        raise TypeError("a DeploymentResponse cannot be pickled: pass it as a top-level "
                        "argument of another handle call, or fetch its result")

    def __repr__(self) -> str:
        where = self._replica.replica_id if self._replica is not None else "unassigned"
        return f"DeploymentResponse({self._router.deployment}, {where})"


class DeploymentResponseGenerator:
    """A streamed response (``handle.options(stream=True)``): iterate it
    (``for`` in synchronous code, ``async for`` in asynchronous code) to get
    the items the replica's generator yields, as they come."""

    def __init__(self, response: DeploymentResponse) -> None:
        self._response = response
        self._items: deque = deque()
        self._stream_id = ""
        self._done = False
        self._started = False

    def _take(self, batch) -> None:
        self._started = True
        self._items.extend(batch.items)
        self._stream_id = batch.stream_id or self._stream_id
        if batch.done:
            self._done = True
            self._error = batch.error

    def __iter__(self):
        return self

    def __next__(self):
        while not self._items:
            if self._done:
                self._finish()
            if not self._started:
                self._take(self._response.result())
            else:
                actor = self._response._replica.actor
                self._take(tray.get(actor.next_chunks.remote(self._stream_id)))
        return self._items.popleft()

    def __aiter__(self):
        return self

    async def __anext__(self):
        while not self._items:
            if self._done:
                try:
                    self._finish()
                except StopIteration:
                    raise StopAsyncIteration from None
            if not self._started:
                self._take(await self._response)
            else:
                actor = self._response._replica.actor
                self._take(await _await_ref(actor.next_chunks.remote(self._stream_id)))
        return self._items.popleft()

    def _finish(self):
        error = getattr(self, "_error", None)
        if error is not None:
            self._error = None
            raise error
        raise StopIteration

    def cancel(self) -> None:
        """Stop the stream: the replica closes the generator."""
        if self._started and not self._done and self._response._replica is not None:
            self._done = True
            self._response._replica.actor.cancel_stream.remote(self._stream_id)

    def __reduce__(self):
        raise TypeError("a DeploymentResponseGenerator cannot be pickled")


# ================================================================== handles


class DeploymentHandle:
    """A handle to a deployment (Ray Serve's ``DeploymentHandle``):
    ``handle.remote(...)`` calls ``__call__``, ``handle.method.remote(...)``
    another method; ``.options(method_name=..., stream=True)`` sets either."""

    def __init__(self, deployment_name: str, app_name: str, *,
                 method_name: str = "__call__", stream: bool = False) -> None:
        self.deployment_name = deployment_name
        self.app_name = app_name
        self._method_name = method_name
        self._stream = stream
        self._router: Router | None = None

    def options(self, *, method_name=_UNSET, stream=_UNSET, multiplexed_model_id=_UNSET,
                use_new_handle_api=_UNSET, _prefer_local_routing=_UNSET) -> DeploymentHandle:
        if multiplexed_model_id not in (_UNSET, "", None):
            raise NotImplementedError("model multiplexing (multiplexed_model_id) is not "
                                      "supported yet")
        if method_name is not _UNSET and (not isinstance(method_name, str) or not method_name):
            raise TypeError(f"method_name must be a non-empty string, got {method_name!r}")
        if stream is not _UNSET and not isinstance(stream, bool):
            raise TypeError(f"stream must be a bool, got {stream!r}")
        clone = DeploymentHandle(
            self.deployment_name, self.app_name,
            method_name=self._method_name if method_name is _UNSET else method_name,
            stream=self._stream if stream is _UNSET else stream)
        clone._router = self._router
        return clone

    def __getattr__(self, name: str) -> DeploymentHandle:
        if name.startswith("_"):
            raise AttributeError(name)
        return self.options(method_name=name)

    def _get_router(self) -> Router:
        if self._router is None:
            self._router = router_for(self.app_name, self.deployment_name)
        return self._router

    def remote(self, *args, **kwargs):
        """Send the request; returns a DeploymentResponse at once (a
        DeploymentResponseGenerator with ``stream=True``)."""
        router = self._get_router()
        meta = RequestMetadata(request_id=router.next_request_id(),
                               method_name=self._method_name, is_streaming=self._stream)
        method = "handle_request_streaming" if self._stream else "handle_request"
        if _trio_asyncio_loop():
            request = (meta, method, args, kwargs)
            assign = asyncio.ensure_future(router.assign_async(*request))
            assign.add_done_callback(_retrieve)
            response = DeploymentResponse(router, request, assign=assign)
            response._start_fetch()
        else:
            args = tuple(_resolve_sync(a) for a in args)
            kwargs = {k: _resolve_sync(v) for k, v in kwargs.items()}
            request = (meta, method, args, kwargs)
            ref, replica = router.assign_sync(*request)
            response = DeploymentResponse(router, request, ref=ref, replica=replica)
        return DeploymentResponseGenerator(response) if self._stream else response

    def __reduce__(self):
        return (_rebuild_handle, (self.deployment_name, self.app_name, self._method_name,
                                  self._stream))

    def __repr__(self) -> str:
        return (f"DeploymentHandle(deployment='{self.deployment_name}', "
                f"app='{self.app_name}')")


def _rebuild_handle(deployment_name, app_name, method_name, stream) -> DeploymentHandle:
    return DeploymentHandle(deployment_name, app_name, method_name=method_name, stream=stream)


def router_for(app_name: str, deployment: str) -> Router:
    """This process's router of the deployment, made at its first use (one
    per process, shared by every handle to the deployment there)."""
    key = (app_name, deployment)
    routers = _context.router_registry()
    router = routers.get(key)
    if router is None:
        seed = tray.get_runtime_context().get_worker_id()
        router = Router(_context.controller_handle(), app_name, deployment, seed)
        routers[key] = router
    return router
