"""A replica: the actor that runs one copy of a deployment's code.

Every replica is an async tray actor (its methods run on the worker's
asyncio loop) named ``SERVE_REPLICA::<app>#<deployment>#<tag>`` in the
``serve`` namespace, detached, so it outlives the driver that deployed it
and a restart of the controller that created it. Requests arrive as actor
calls from routers (``handle_request``, ``handle_request_streaming``,
``handle_http``); the controller's calls (``initialize``, ``check_health``,
``get_metrics``, ``reconfigure``, ``prepare_for_shutdown``) run in a
concurrency group of their own, so a replica full of requests still answers
its health checks.

**Ongoing requests.** At most ``max_ongoing_requests`` requests run at once
(``_Limiter``); more wait in the replica, in arrival order. A request counts
as ongoing from its arrival (waiting or running) to its end — for a stream,
to the stream's end; that count is what routers balance on and what the
autoscaler reads.

**Streams.** A streamed response (a generator method called with
``stream=True``, or an HTTP response) is produced by a task of its own into
a bounded buffer (``STREAM_BUFFER_ITEMS``; the producer waits when it is
full); the caller pulls what is ready with ``next_chunks``. A stream nobody
pulls from for ``STREAM_IDLE_TIMEOUT_S`` is closed, so a caller that went
away holds no slot for long.

**Orphans.** Every ``ORPHAN_CHECK_PERIOD_S`` a replica asks
the controller whether it still knows it (``knows_replica``). A replica the
controller does not know — made by an incarnation whose checkpoint was lost
(the GCS lost its storage, or the keys were deleted) — or
whose controller is gone for good (``serve.shutdown``) stops itself, so
no detached replica outlives what manages it. An unreachable controller
(a partition, a restart in progress) is asked again later.

**Draining.** ``prepare_for_shutdown`` waits until no request has been
ongoing for a whole ``graceful_shutdown_wait_loop_s`` (requests that were
already on their way when routers dropped this replica still arrive and are
served), at most ``graceful_shutdown_timeout_s``. A replica that drained
ends itself (``exit_gracefully``: its last replies go out before its
process ends); one that did not is killed."""

from __future__ import annotations

import asyncio
import inspect
import itertools
import logging
from collections import deque
from dataclasses import dataclass

import cloudpickle

import tray
import tray.actor

from . import _context
from ._common import SERVE_NAMESPACE, StreamBatch, kill_actor, lookup_actor, replica_actor_name
from ._http import HTTPRequestData, bind_ingress_app, plain_asgi_app, run_asgi
from .exceptions import ReplicaDrainedError

logger = logging.getLogger("tray.serve")

CONTROL_CONCURRENCY = 64  # controller calls at once (health, metrics, reconfigure, drain)
REQUEST_CONCURRENCY = 1_000_000  # tray's slots; the _Limiter enforces max_ongoing_requests
STREAM_BUFFER_ITEMS = 256  # items a stream produces ahead of its caller
STREAM_BATCH_ITEMS = 256  # items one next_chunks call returns at most
STREAM_IDLE_TIMEOUT_S = 60.0
ORPHAN_CHECK_PERIOD_S = 5.0  # how often a replica asks whether its controller knows it


class _Limiter:
    """``max_ongoing_requests``: a semaphore whose size can change (a
    reconfigured deployment), waking waiters in arrival order."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.running = 0
        self.waiters: deque = deque()

    @property
    def ongoing(self) -> int:
        return self.running + len(self.waiters)

    async def acquire(self) -> None:
        if self.running < self.limit and not self.waiters:
            self.running += 1
            return
        waiter = asyncio.get_running_loop().create_future()
        self.waiters.append(waiter)
        try:
            await waiter
        except BaseException:
            if waiter in self.waiters:
                self.waiters.remove(waiter)
            elif waiter.done() and not waiter.cancelled():
                self.release()  # granted and cancelled at once: pass the slot on
            raise

    def release(self) -> None:
        self.running -= 1
        self._wake()

    def set_limit(self, limit: int) -> None:
        self.limit = limit
        self._wake()

    def _wake(self) -> None:
        while self.waiters and self.running < self.limit:
            waiter = self.waiters.popleft()
            if not waiter.done():
                self.running += 1
                waiter.set_result(None)


class _Stream:
    """One streamed response being produced (see the module's header)."""

    def __init__(self, stream_id: str, source, on_done, first_batch_policy: str) -> None:
        self.stream_id = stream_id
        self.items: deque = deque()
        self.done = False
        self.error: BaseException | None = None
        self.policy = first_batch_policy  # "item": any item; "http": the app finished or streams
        self.changed = asyncio.Event()
        self.space = asyncio.Event()
        self.space.set()
        self.last_pull_s = asyncio.get_running_loop().time()
        self._on_done = on_done
        self.task = asyncio.get_running_loop().create_task(self._produce(source))

    async def put(self, item) -> None:
        while len(self.items) >= STREAM_BUFFER_ITEMS:
            self.space.clear()
            await self.space.wait()
        self.items.append(item)
        self.changed.set()

    async def _produce(self, source) -> None:
        try:
            await source(self.put)
        except asyncio.CancelledError:
            self.error = tray.exceptions.TaskCancelledError("the stream was cancelled")
        except BaseException as error:  # noqa: BLE001 - the caller gets it
            self.error = error
        finally:
            self.done = True
            self.changed.set()
            self._on_done()

    def _ready(self, first: bool) -> bool:
        if self.done:
            return True
        if not self.items:
            return False
        if first and self.policy == "http":
            last = self.items[-1]
            return last.get("type") == "http.response.body" and last.get("more_body", False)
        return True

    async def next_batch(self, first: bool = False) -> StreamBatch:
        self.last_pull_s = asyncio.get_running_loop().time()
        while not self._ready(first):
            self.changed.clear()
            await self.changed.wait()
        count = min(len(self.items), STREAM_BATCH_ITEMS)
        items = [self.items.popleft() for _ in range(count)]
        self.space.set()
        done = self.done and not self.items
        self.last_pull_s = asyncio.get_running_loop().time()
        return StreamBatch(items=items, done=done, stream_id=self.stream_id,
                           error=self.error if done else None)


@dataclass(frozen=True)
class ReplicaStatistics:
    replica_id: str
    ongoing_requests: int
    running_requests: int
    max_ongoing_requests: int
    streams: int
    draining: bool
    requests_total: int


async def _maybe_await(value):
    if inspect.isawaitable(value):
        return await value
    return value


class ServeReplica:
    """The replica actor (see the module's header)."""

    def __init__(self, replica_id: str, app_name: str, deployment: str, callable_blob: bytes,
                 is_function: bool, is_asgi: bool, max_ongoing_requests: int,
                 controller) -> None:
        self.replica_id = replica_id
        self.app_name = app_name
        self.deployment = deployment
        self._blob = callable_blob
        self._is_function = is_function
        self._is_asgi = is_asgi
        self._limiter = _Limiter(max_ongoing_requests)
        self._callable = None
        self._asgi_app = None
        self._streams: dict[str, _Stream] = {}
        self._stream_ids = itertools.count()
        self._draining = False
        self._closed = False  # drained: a request arriving now is refused, not run
        self._requests_total = 0
        self._user_config_applied = False
        self._init_lock: asyncio.Lock | None = None
        self._reaper: asyncio.Task | None = None
        self._controller = controller
        self._orphan_watch: asyncio.Task | None = None
        _context.reset()  # a worker's earlier life (a simulated worker id reused)
        _context.set_controller(controller)

    # ------------------------------------------------------ control calls

    @tray.method(concurrency_group="control")
    async def initialize(self, user_config=None, has_user_config: bool = False) -> dict:
        """Run the user's constructor (once; a repeated call, from a
        restarted controller, only reports: where it runs, and whether it
        drains)."""
        if self._init_lock is None:
            self._init_lock = asyncio.Lock()
        async with self._init_lock:
            if self._callable is None:
                target, args, kwargs = cloudpickle.loads(self._blob)
                _context.set_replica_context(_context.ReplicaContext(
                    self.app_name, self.deployment, self.replica_id))
                if self._is_function:
                    self._callable = target
                else:
                    instance = target(*args, **kwargs)
                    self._callable = instance
                _context.set_replica_context(_context.ReplicaContext(
                    self.app_name, self.deployment, self.replica_id, self._callable))
                if self._is_asgi:
                    self._asgi_app = bind_ingress_app(target._serve_asgi_app, target,
                                                      self._callable)
                else:
                    # (__call__ looked up per HTTP request, as Ray's: a
                    # deployment called only through handles needs none)
                    self._asgi_app = plain_asgi_app(
                        lambda request: self._user_method("__call__")(request))
            if has_user_config and not self._user_config_applied:
                await self._reconfigure(user_config)
        await self.watch_controller()
        # "draining": an earlier controller began to stop this replica (a
        # restarted one whose checkpoint missed that re-attaches it then
        # stops it again, rather than route to a replica that refuses).
        return {"node_id": tray.get_runtime_context().get_node_id(),
                "draining": self._draining}

    @tray.method(concurrency_group="control")
    async def watch_controller(self) -> None:
        """Start the orphan watch (idempotent): sent by the task that created
        this replica, so that it runs even if no controller ever calls it."""
        if self._orphan_watch is None:
            self._orphan_watch = asyncio.get_running_loop().create_task(self._watch_controller())

    async def _watch_controller(self) -> None:
        """Stop this replica once its controller no longer knows it (see the
        module's header)."""
        while True:
            await asyncio.sleep(ORPHAN_CHECK_PERIOD_S)
            try:
                known = await self._controller.knows_replica.remote(
                    self.app_name, self.deployment, self.replica_id)
            except tray.exceptions.ActorDiedError:
                known = False  # killed for good: serve.shutdown()
            except Exception:  # noqa: BLE001 - unreachable for now: ask again later
                continue
            if known:
                continue
            logger.warning("serve replica %s: the controller does not know it (its state was "
                           "lost, or Serve shut down): stopping", self.replica_id)
            try:
                handle = await lookup_actor.remote(replica_actor_name(self.replica_id),
                                                   SERVE_NAMESPACE)
                if handle is not None:
                    await kill_actor.remote(handle)
            except Exception as error:  # noqa: BLE001 - try again next period
                logger.warning("serve replica %s: could not stop itself: %s",
                               self.replica_id, error)
                continue
            return

    async def _reconfigure(self, user_config) -> None:
        method = getattr(self._callable, "reconfigure", None)
        if method is None:
            raise TypeError(f"deployment {self.deployment!r} has a user_config but no "
                            f"reconfigure(self, config) method to take it")
        await _maybe_await(method(user_config))
        self._user_config_applied = True

    @tray.method(concurrency_group="control")
    async def reconfigure(self, user_config, has_user_config: bool,
                          max_ongoing_requests: int) -> None:
        self._limiter.set_limit(max_ongoing_requests)
        if has_user_config:
            await self._reconfigure(user_config)

    @tray.method(concurrency_group="control")
    async def check_health(self) -> int:
        """Runs the deployment's ``check_health`` if it has one (raising
        means unhealthy); returns the ongoing requests."""
        method = getattr(self._callable, "check_health", None)
        if method is not None:
            await _maybe_await(method())
        return self._limiter.ongoing

    @tray.method(concurrency_group="control")
    async def get_metrics(self) -> int:
        return self._limiter.ongoing

    @tray.method(concurrency_group="control")
    async def statistics(self) -> ReplicaStatistics:
        return ReplicaStatistics(
            replica_id=self.replica_id, ongoing_requests=self._limiter.ongoing,
            running_requests=self._limiter.running,
            max_ongoing_requests=self._limiter.limit, streams=len(self._streams),
            draining=self._draining, requests_total=self._requests_total)

    @tray.method(concurrency_group="control")
    async def prepare_for_shutdown(self, wait_loop_s: float, timeout_s: float) -> int:
        """Drain (see the module's header); returns the requests still
        ongoing when it gave up (0 when it drained)."""
        self._draining = True
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while True:
            await asyncio.sleep(min(wait_loop_s, max(0.0, deadline - loop.time())))
            if self._limiter.ongoing == 0 or loop.time() >= deadline:
                break
        left = self._limiter.ongoing
        if left == 0:
            # In the same step as the check: nothing can start in between, so
            # every request this replica accepted has finished, and every
            # later one is refused (ReplicaDrainedError) or finds it dead —
            # either way not run, so the router may send it elsewhere.
            self._closed = True
        destructor = getattr(type(self._callable), "__del__", None) \
            if self._callable is not None and not self._is_function else None
        if destructor is not None:
            try:
                await _maybe_await(destructor(self._callable))
            except Exception as error:  # noqa: BLE001 - logged; the replica goes anyway
                logger.warning("replica %s: __del__ raised %s: %s", self.replica_id,
                               type(error).__name__, error)
        return left

    @tray.method(concurrency_group="control")
    async def exit_gracefully(self) -> None:
        """End this replica (the controller calls it once it drained): its
        caller hears ``ActorDiedError``, and the process ends once the
        replies of the calls that finished are out (see the controller's
        ``_exit_replica``)."""
        tray.actor.exit_actor()

    # ----------------------------------------------------------- requests

    def _user_method(self, name: str):
        if self._callable is None:
            raise RuntimeError(f"replica {self.replica_id} is not initialized")
        if self._is_function:
            if name != "__call__":
                raise AttributeError(f"deployment {self.deployment!r} is a function: it has "
                                     f"no method {name!r}")
            return self._callable
        method = getattr(self._callable, name, None)
        if method is None or name.startswith("_") and name != "__call__":
            raise AttributeError(f"deployment {self.deployment!r} has no method {name!r}")
        return method

    def _admit(self) -> None:
        if self._closed:
            raise ReplicaDrainedError(f"replica {self.replica_id} has drained and is stopping; "
                                      f"the request did not run")

    async def handle_request(self, meta, /, *args, **kwargs):
        self._admit()
        await self._limiter.acquire()
        self._requests_total += 1
        try:
            result = self._user_method(meta.method_name)(*args, **kwargs)
            if inspect.isgenerator(result) or inspect.isasyncgen(result):
                raise TypeError(f"method {meta.method_name!r} of deployment "
                                f"{self.deployment!r} returned a generator: call it with "
                                f"handle.options(stream=True)")
            result = await _maybe_await(result)
            from ._handle import DeploymentResponse

            if isinstance(result, DeploymentResponse):
                result = await result  # a composed call's result, passed through
            return result
        finally:
            self._limiter.release()

    async def handle_request_streaming(self, meta, /, *args, **kwargs) -> StreamBatch:
        self._admit()
        await self._limiter.acquire()
        self._requests_total += 1
        try:
            result = self._user_method(meta.method_name)(*args, **kwargs)
            if inspect.isawaitable(result):
                result = await result
            if not (inspect.isgenerator(result) or inspect.isasyncgen(result)):
                raise TypeError(f"method {meta.method_name!r} of deployment "
                                f"{self.deployment!r} is called with stream=True but returned "
                                f"a {type(result).__name__}, not a generator")
        except BaseException:
            self._limiter.release()
            raise

        async def source(put):
            if inspect.isasyncgen(result):
                async for item in result:
                    await put(item)
            else:
                for item in result:
                    await put(item)
                    await asyncio.sleep(0)
        return await self._start_stream(source, "item")

    async def handle_http(self, meta, request: HTTPRequestData, /) -> StreamBatch:
        self._admit()
        await self._limiter.acquire()
        self._requests_total += 1

        async def source(put):
            await run_asgi(self._asgi_app, request, put)
        return await self._start_stream(source, "http")

    async def _start_stream(self, source, policy: str) -> StreamBatch:
        stream_id = f"{self.replica_id}:{next(self._stream_ids)}"

        def on_done():
            self._limiter.release()
        stream = _Stream(stream_id, source, on_done, policy)
        self._streams[stream_id] = stream
        self._ensure_reaper()
        batch = await stream.next_batch(first=True)
        if batch.done:
            self._streams.pop(stream_id, None)
        return batch

    async def next_chunks(self, stream_id: str) -> StreamBatch:
        stream = self._streams.get(stream_id)
        if stream is None:
            raise tray.exceptions.TrayError(
                f"replica {self.replica_id} has no stream {stream_id!r}: it ended, or was "
                f"closed after {STREAM_IDLE_TIMEOUT_S:.0f} s without a pull")
        batch = await stream.next_batch()
        if batch.done:
            self._streams.pop(stream_id, None)
        return batch

    async def cancel_stream(self, stream_id: str) -> None:
        stream = self._streams.pop(stream_id, None)
        if stream is not None and not stream.done:
            stream.task.cancel()

    def _ensure_reaper(self) -> None:
        if self._reaper is None or self._reaper.done():
            self._reaper = asyncio.get_running_loop().create_task(self._reap_idle_streams())

    async def _reap_idle_streams(self) -> None:
        loop = asyncio.get_running_loop()
        while self._streams:
            await asyncio.sleep(STREAM_IDLE_TIMEOUT_S / 4)
            now = loop.time()
            for stream_id, stream in list(self._streams.items()):
                if now - stream.last_pull_s > STREAM_IDLE_TIMEOUT_S:
                    await self.cancel_stream(stream_id)


ReplicaActor = tray.remote(concurrency_groups={"control": CONTROL_CONCURRENCY},
                           max_concurrency=REQUEST_CONCURRENCY)(ServeReplica)
