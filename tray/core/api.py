"""The public API, implemented against whatever runtime ``init`` started.

Calls from the user's own thread (the driver script) block through the
runtime (which runs the cluster's event loop until the answer is there);
calls from inside a task or actor — already on a trio task — block through
greenback, never a thread. On the local backend, where the driver's loop
has a thread of its own, the driver script's ``.remote()`` and small
``put`` do not wait for the loop at all (they queue their work for it:
``worker/thread_inbox``), and ``get`` of an object already in the driver's
memory reads it without entering the loop."""

from __future__ import annotations

import contextlib
import functools
import importlib
import inspect
import json
import logging
import numbers
import os
import sys
from collections.abc import Mapping

import greenback
import sniffio
import trio
import trio._core._run as _trio_run

from . import options as opts
from .context import _global_state, current_task, current_worker, get_worker
from .ids import JobID
from .object_ref import ObjectRef
from .scheduling import Strategy
from .serialization import dumps as _dumps
from .worker.function_table import function_id_of

logger = logging.getLogger("tray")

# name -> "module:function" starting that backend; filled in by tray.backends.
_backends: dict[str, str] = {}


def register_backend(name: str, target: str) -> None:
    _backends[name] = target


def _in_loop(worker, fn, *args):
    """Run the synchronous ``fn`` where the worker's loop runs (the local
    backend's driver loop has a thread of its own, and a threaded actor's
    methods run in threads)."""
    if worker.bridge.in_worker_thread():
        return trio.from_thread.run_sync(fn, *args, trio_token=worker.bridge.trio_token)
    if worker.in_user_thread():
        with _outside_users_trio_run(worker):
            return _global_state["runtime"].run_sync(fn, *args)
    return fn(*args)


def _block(worker, async_fn, *args):
    if worker.bridge.in_worker_thread():
        return trio.from_thread.run(async_fn, *args, trio_token=worker.bridge.trio_token)
    if worker.in_user_thread():
        with _outside_users_trio_run(worker):
            return _global_state["runtime"].run(async_fn, *args)
    loop = worker.actor_host.asyncio_loop
    if loop is not None and _in_asyncio_task():
        # An async actor's method (an asyncio task on trio-asyncio, with a
        # portal of its own: actor_host): the trio call runs as trio code
        # through the loop, and this method waits for it while the actor's
        # other asyncio tasks go on (Ray blocks the whole event loop instead).
        return greenback.await_(loop.trio_as_future(async_fn, *args))
    return greenback.await_(async_fn(*args))


def _in_asyncio_task() -> bool:
    try:
        return sniffio.current_async_library() == "asyncio"
    except sniffio.AsyncLibraryNotFoundError:
        return False


@contextlib.contextmanager
def _outside_users_trio_run(worker):
    """The driver's code may run inside a trio run of its own: ``asyncio.run``
    does once trio-asyncio is imported (it makes its SyncTrioEventLoop
    asyncio's default, and async actors import it), and so does a user's
    ``trio.run``. A blocking call from there must not look like code on a
    trio loop: the local backend's ``trio.from_thread`` would refuse it, and
    the simulator's steps, which run in this thread, would clobber that
    run's state. So the thread's trio run state (``GLOBAL_RUN_CONTEXT``, a
    private name of trio's, as the simulator uses others) is set aside for
    the call and put back after. In its place goes the runtime's own
    (``run_context``): the simulator's guest run, whose state trio-asyncio
    set aside in turn when it switched to its loop's greenlet."""
    if not trio.lowlevel.in_trio_run() or \
            trio.lowlevel.current_root_task() is _root_task(worker.bridge.nursery):
        yield  # no run, or the simulator's own (its loop runs in this thread)
        return
    state = _trio_run.GLOBAL_RUN_CONTEXT
    saved = dict(vars(state))
    for name in saved:
        delattr(state, name)
    for name, value in _global_state["runtime"].run_context.items():
        setattr(state, name, value)
    try:
        yield
    finally:
        for name in list(vars(state)):
            delattr(state, name)
        for name, value in saved.items():
            setattr(state, name, value)


def _root_task(nursery):
    task = nursery.parent_task
    while task.parent_nursery is not None:
        task = task.parent_nursery.parent_task
    return task


# ============================================================ init/shutdown

class TrayContext(Mapping):
    """What ``tray.init()`` returns, as Ray's ``RayContext``: the cluster's
    ``address_info`` (``ctx["address"]`` reads it too), its
    ``dashboard_url`` (host:port of the dashboard, ``webui_url``; ``None``
    without one: the simulator, ``include_dashboard=False``), and a context
    manager that shuts the cluster down on exit::

        with tray.init(backend="sim") as ctx:
            ...

    The keys of ``address_info`` are Ray's where tray has the thing
    (``address``, ``gcs_address``, ``node_id``, ``session_dir``,
    ``webui_url``) plus tray's own (``backend``; ``seed`` and ``num_nodes``
    in the simulator)."""

    def __init__(self, address_info: dict) -> None:
        self.address_info = address_info
        self.dashboard_url = address_info.get("webui_url")
        self.python_version = "{}.{}.{}".format(*sys.version_info[:3])
        from .. import __version__
        self.tray_version = __version__

    def __getitem__(self, key):
        return self.address_info[key]

    def __iter__(self):
        return iter(self.address_info)

    def __len__(self) -> int:
        return len(self.address_info)

    def __enter__(self) -> TrayContext:
        return self

    def __exit__(self, *exc) -> None:
        shutdown()

    def disconnect(self) -> None:
        shutdown()

    def __repr__(self) -> str:
        return f"TrayContext({self.address_info!r})"


def _context_of(runtime) -> TrayContext:
    gcs_address = runtime.driver.env.gcs_address
    info = {"address": gcs_address, "gcs_address": gcs_address,
            "node_id": runtime.driver.node_id, "session_dir": None, "webui_url": None,
            **runtime.info}
    return TrayContext(info)


def init(address: str | None = None, *, backend: str | None = None, num_cpus=None,
         num_gpus=None, resources: dict | None = None, namespace: str | None = None,
         ignore_reinit_error: bool = False, job_config=None, runtime_env: dict | None = None,
         **backend_options):
    """Start (or connect to) a cluster and make this process its driver;
    returns a ``TrayContext``.

    ``backend="local"`` (the default) runs real processes on this machine;
    ``backend="sim"`` runs a simulated cluster in this process on virtual
    time (options: ``seed``, ``num_nodes``, fault settings). ``job_config``
    is a ``tray.job_config.JobConfig``; ``namespace`` overrides its
    ``ray_namespace``, as in Ray. ``runtime_env`` is the job's runtime
    environment (``tray.runtime_env``), inherited by its tasks and actors; it
    replaces ``job_config``'s, as in Ray."""
    if _global_state["runtime"] is not None:
        if ignore_reinit_error:
            return _context_of(_global_state["runtime"])
        raise RuntimeError("tray.init() was already called; call tray.shutdown() first "
                           "or pass ignore_reinit_error=True")
    backend = backend or "local"
    if backend not in _backends:
        raise ValueError(f"unknown backend {backend!r}; known backends: "
                         f"{', '.join(sorted(_backends))}")
    if num_cpus is not None:
        opts._non_negative_number("num_cpus", num_cpus)
    if num_gpus is not None:
        opts._non_negative_number("num_gpus", num_gpus)
    if resources is not None:
        opts.validate({"resources": resources}, {"resources"}, "init()")
    if namespace is not None:
        opts._string("namespace", namespace)
    if job_config is not None:
        from ..job_config import JobConfig

        if not isinstance(job_config, JobConfig):
            raise TypeError(f"job_config must be a tray.job_config.JobConfig, got "
                            f"{type(job_config).__name__}")
        job_config.check_supported()
        if namespace is None:
            namespace = job_config.ray_namespace
        if runtime_env is None:
            runtime_env = job_config.runtime_env or None
    from .. import runtime_env as runtime_envs

    joined = address is None and backend == "local" and _address_from_environment()
    if joined:
        # As Ray's drivers join RAY_ADDRESS: a submitted job's driver joins
        # its cluster, in its job's runtime_env (the script's keys win).
        address = joined
        job_env = os.environ.get("TRAY_JOB_RUNTIME_ENV")
        if job_env:
            runtime_env = runtime_envs.merge(json.loads(job_env), runtime_env) or None
    runtime_envs.validate(runtime_env)
    module_name, _, function_name = _backends[backend].partition(":")
    start = getattr(importlib.import_module(module_name), function_name)
    runtime = start(address=address, num_cpus=num_cpus, num_gpus=num_gpus,
                    resources=resources or {}, **backend_options)
    runtime.namespace = namespace or f"_anonymous_{runtime.driver.job_id.hex()}"
    runtime.driver.driver_context.namespace = runtime.namespace
    _global_state["runtime"] = runtime
    _global_state["driver"] = runtime.driver
    try:
        _set_job_runtime_env(runtime, runtime_env)
    except BaseException:
        shutdown()
        raise
    if joined and os.environ.get("TRAY_JOB_SUBMISSION_ID"):
        from ..job_submission._common import link_driver

        link_driver(lambda *args: _block(runtime.driver, runtime.driver.gcs_call, *args),
                    os.environ["TRAY_JOB_SUBMISSION_ID"], runtime.driver.job_id.hex())
    return _context_of(runtime)


def _address_from_environment() -> str | None:
    """The cluster ``TRAY_ADDRESS`` names (host:port of its GCS), which
    ``init()`` with no address joins; an http(s) URL there is the job API's
    (``tray job``), not a cluster's."""
    address = os.environ.get("TRAY_ADDRESS", "").strip()
    if not address or address.startswith(("http://", "https://")):
        return None
    return address


def _set_job_runtime_env(runtime, runtime_env: dict | None) -> None:
    """Pack and store the job's runtime_env now (a missing working_dir
    fails ``init``), and make it what this driver's tasks inherit."""
    from ..runtime_env import context, forget_uploads

    forget_uploads()
    resolved = _resolve_runtime_env(runtime.driver, runtime_env) if runtime_env else {}
    context.set_process_env(resolved)


def _resolve_runtime_env(worker, runtime_env: dict) -> dict:
    """A runtime_env as tasks carry it (``tray.runtime_env.resolve``), its
    packages stored in this cluster's GCS. The simulator refuses pip."""
    from ..runtime_env import resolve, store_env

    def upload(key: str, data: bytes) -> None:
        _block(worker, worker.gcs_call, "kv_put", key, data, False)

    resolved = resolve(runtime_env, upload)
    runtime = _global_state["runtime"]
    if resolved.get("pip") and runtime is not None and runtime.info.get("backend") == "sim":
        raise ValueError("runtime_env['pip'] is not supported in the simulator "
                         "(backend='sim'): it cannot install packages into simulated "
                         "workers; test pip environments on the local backend")
    store_env(resolved, upload)  # nodes start its workers with its env_vars
    return resolved


def _task_runtime_env(worker, options: dict) -> dict | None:
    """The runtime_env a task or actor created here runs in: what the
    submitting code runs in (the job's, or its task's), with the option's
    keys over it (Ray's merge rule)."""
    from ..runtime_env import current, merge

    parent = current()
    child = options.get("runtime_env")
    if not child:
        return parent or None
    return _resolve_runtime_env(worker, merge(parent, child)) or None


# Ray starts a local cluster on the first call that needs one; so does tray,
# unless TRAY_AUTO_INIT=0 (then such a call raises NotInitializedError).


def _auto_init_enabled() -> bool:
    return os.environ.get("TRAY_AUTO_INIT", "1") != "0"


def _in_cluster_process() -> bool:
    """Is this process one of a cluster's own (a worker, a node)? Code there
    outside a task (a thread of its own) must not start a second cluster."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    return spec is not None and spec.name.startswith("tray.backends.")


def _worker():
    """This process's core worker; the first call that needs a cluster
    starts the default local one (as Ray does) and logs one line saying so."""
    worker = get_worker(required=False)
    if worker is not None:
        return worker
    if not _auto_init_enabled():
        from ..exceptions import NotInitializedError

        raise NotInitializedError(
            "tray is not initialized and TRAY_AUTO_INIT=0: call tray.init() first "
            "(for example tray.init(backend='sim') for a simulated cluster)")
    if _in_cluster_process():
        return get_worker()  # raises NotInitializedError
    from .. import _bridges

    with _bridges.AUTO_INIT_LOCK:
        if _global_state["runtime"] is None:
            init()
            joined = _address_from_environment()
            where = f"joined the cluster at {joined} (TRAY_ADDRESS)" if joined else \
                "started a local cluster on this machine"
            logger.warning("tray.init() had not been called: %s, as Ray does (set "
                           "TRAY_AUTO_INIT=0 to make such calls raise NotInitializedError "
                           "instead)", where)
    return get_worker()


def shutdown() -> None:
    runtime = _global_state["runtime"]
    if runtime is None:
        return
    from ..runtime_env import context

    context.set_process_env({})
    try:
        runtime.shutdown()
    finally:
        _global_state["runtime"] = None
        _global_state["driver"] = None


def is_initialized() -> bool:
    """True in a driver after ``init``, and inside tasks and actors (as Ray)."""
    return _global_state["runtime"] is not None or current_worker.get(None) is not None


def _namespace() -> str:
    """The job's namespace: tasks and actors carry their job's along."""
    worker = get_worker()  # raises NotInitializedError
    return worker.current_context().namespace


# ==================================================================== tasks

# Ray's limits on a pickled function or class (ray_constants'
# FUNCTION_SIZE_WARN_THRESHOLD / FUNCTION_SIZE_ERROR_THRESHOLD): past the
# first a warning, past the second (about 95 MiB) the export fails.
FUNCTION_SIZE_WARN_BYTES = 10**7
FUNCTION_SIZE_ERROR_BYTES = 10**8


class _Export:
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
        self._signature = _signature_of(function)
        max_calls = self._options.get("max_calls") or 0
        self._export = _Export(_LimitedCalls(function, max_calls) if max_calls else function)
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
        worker = _worker()
        function_id, blob = self._export.get()
        options = self._options
        num_returns = options.get("num_returns", 1)
        max_retries = options.get("max_retries")

        runtime_env = _task_runtime_env(worker, options)
        if self._placement is None:
            self._placement = (opts.resources_of(options, 1.0),
                               opts.to_strategy(options.get("scheduling_strategy")))
        resources, strategy = self._placement
        refs = _submit(
            worker, export=(function_id, blob), runtime_env=runtime_env,
            name=options.get("name") or getattr(self._function, "__qualname__", "task"),
            function_id=function_id, args=args, kwargs=kwargs,
            num_returns=num_returns, resources=resources, strategy=strategy,
            max_retries=3 if max_retries is None else max_retries,
            retry_exceptions=options.get("retry_exceptions") or False)
        return _returns(refs, num_returns)

    def _remote(self, args=None, kwargs=None, **options):
        """Ray's lower-level submission: ``f._remote(args=[...], kwargs={...},
        **options)`` is ``f.options(**options).remote(*args, **kwargs)``."""
        target = self.options(**options) if options else self
        return target.remote(*(args or ()), **(kwargs or {}))

    def __reduce__(self):
        return (RemoteFunction, (self._function, self._options))


def _submit(worker, **task) -> list:
    """Submit a task or actor call; its refs. From the driver's script on
    the local backend the caller's side builds it and queues the rest for
    the loop without waiting (``CoreWorker.submit_task``); elsewhere it all
    runs where the loop runs (in the simulator, that is this thread)."""
    if worker.queues_from_thread():
        return worker.submit_task(**task, run_on_loop=functools.partial(_in_loop, worker))
    return _in_loop(worker, functools.partial(worker.submit_task, **task))


def _returns(refs: list, num_returns: int):
    if num_returns == 1:
        return refs[0]
    if num_returns == 0:
        return None
    return refs


def _signature_of(function):
    try:
        return inspect.signature(function)
    except (TypeError, ValueError):
        return None


# =================================================================== actors

def method(*, num_returns: int = 1, **other):
    """Options for one actor method: ``@tray.method(num_returns=2)``."""
    options = opts.validate(dict(other, num_returns=num_returns), opts.METHOD_OPTIONS,
                            "an actor method")

    def decorate(function):
        function.__tray_method_options__ = options
        return function
    return decorate


def _method_meta(cls) -> dict:
    meta = {}
    for name, member in inspect.getmembers(cls, inspect.isfunction):
        options = getattr(member, "__tray_method_options__", {})
        signature = _signature_of(member)
        if signature is not None and signature.parameters and \
                not isinstance(inspect.getattr_static(cls, name, None), staticmethod):
            # What a call passes: the parameters after self.
            signature = signature.replace(parameters=list(signature.parameters.values())[1:])
        meta[name] = {"num_returns": options.get("num_returns", 1),
                      "concurrency_group": options.get("concurrency_group", ""),
                      "signature": signature}
    return meta


def _portable_params(signature) -> tuple | None:
    """A method's signature as plain data — (name, kind, has a default) per
    parameter — that travels with the actor's metadata, so that a handle
    anywhere (passed into a task, or from get_actor) checks the arguments
    of a call at ``.remote()`` as the creator's handle does."""
    if signature is None:
        return None
    return tuple((p.name, int(p.kind), p.default is not inspect.Parameter.empty)
                 for p in signature.parameters.values())


@functools.lru_cache(maxsize=1024)
def _signature_from(params: tuple) -> inspect.Signature:
    return inspect.Signature([
        inspect.Parameter(name, inspect._ParameterKind(kind),
                          default=None if has_default else inspect.Parameter.empty)
        for name, kind, has_default in params])


class ActorClass:
    """What ``@tray.remote`` makes of a class."""

    def __init__(self, cls, options: dict) -> None:
        self._cls = cls
        self._options = opts.validate(dict(options), opts.ACTOR_OPTIONS, "an actor class")
        self._export = _Export(cls, "actor")
        self.__name__ = cls.__name__
        self.__qualname__ = cls.__qualname__
        self.__doc__ = cls.__doc__

    def __call__(self, *args, **kwargs):
        raise TypeError(f"Actors cannot be instantiated directly. Instead of "
                        f"'{self._cls.__name__}()', use '{self._cls.__name__}.remote()'.")

    def __getattr__(self, name: str):
        """The user's class's attributes (class attributes, static and class
        methods) through the actor class, as Ray's ActorClass (which derives
        from the user's class) has them: inside an actor's method the class's
        name is this object, and ``MyActor.LIMIT`` must work there."""
        cls = self.__dict__.get("_cls")
        if cls is None or name.startswith("__"):
            raise AttributeError(name)
        value = getattr(cls, name)
        if inspect.isfunction(value):
            # A forwarder, never the function itself: cloudpickle pickles a
            # function by reference when ``module.<qualname>`` leads back to
            # it, and ``Counter.add`` through this object would, so workers
            # that cannot import the class's module (a test file, a script
            # run against `tray start`) failed to load the class.
            function = value

            @functools.wraps(function)
            def value(*args, **kwargs):
                return function(*args, **kwargs)
        return value

    def __dir__(self):
        return sorted(set(super().__dir__()) | set(dir(self._cls)))

    def options(self, **options) -> ActorClass:
        merged = dict(self._options)
        merged.update(opts.validate(options, opts.ACTOR_OPTIONS, "an actor class"))
        clone = ActorClass(self._cls, merged)
        clone._export = self._export
        return clone

    def remote(self, *args, **kwargs) -> ActorHandle:
        init_signature = _signature_of(self._cls)
        if init_signature is not None:
            try:
                init_signature.bind(*args, **kwargs)
            except TypeError as error:
                raise TypeError(f"{self._cls.__name__}.remote(): {error}") from None
        worker = _worker()
        function_id, blob = self._export.get()
        options = self._options
        namespace = options.get("namespace") or _namespace()
        meta = {name: {"num_returns": m["num_returns"],
                       "concurrency_group": m["concurrency_group"],
                       "params": _portable_params(m["signature"])}
                for name, m in _method_meta(self._cls).items()}
        groups = options.get("concurrency_groups") or {}
        for name, m in meta.items():
            if m["concurrency_group"] and m["concurrency_group"] not in groups:
                raise ValueError(f"method {self._cls.__name__}.{name} names the concurrency "
                                 f"group {m['concurrency_group']!r}, which the actor does not "
                                 f"declare (concurrency_groups={groups})")
        is_async = any(inspect.iscoroutinefunction(member) for _, member in
                       inspect.getmembers(self._cls, inspect.isfunction))
        runtime_env = _task_runtime_env(worker, options)

        def prepare():
            worker.export_function(function_id, blob)
            return worker.prepare_actor(
                runtime_env=runtime_env,
                class_name=self._cls.__name__, function_id=function_id, args=args,
                kwargs=kwargs, resources=opts.resources_of(options, 0.0),
                strategy=opts.to_strategy(options.get("scheduling_strategy")),
                options=options, namespace=namespace, method_meta=meta, is_async=is_async)
        actor, holds = _in_loop(worker, prepare)
        existing = _block(worker, worker.register_actor, actor, holds)
        if existing is None:
            info, owner, detached = actor, worker.address, actor.detached
        else:  # get_if_exists found a live actor of that name: borrow its handle
            info = existing
            owner, detached = _gcs_call("actor_owner", existing.actor_id) or ("", True)
        return ActorHandle(info.actor_id, info.class_name, info.method_meta,
                           info.max_task_retries, _signatures(self._cls),
                           info.max_pending_calls,
                           _handle_ref(worker, info.actor_id, owner, detached))

    def _remote(self, args=None, kwargs=None, **options) -> ActorHandle:
        """Ray's lower-level creation: ``A._remote(args=[...], kwargs={...},
        **options)`` is ``A.options(**options).remote(*args, **kwargs)``."""
        target = self.options(**options) if options else self
        return target.remote(*(args or ()), **(kwargs or {}))

    def __reduce__(self):
        return (ActorClass, (self._cls, self._options))


def _signatures(cls) -> dict:
    return {name: m["signature"] for name, m in _method_meta(cls).items()}


_DEFAULT_STRATEGY = Strategy()  # an actor call's (it runs where its actor is)


class ActorMethod:
    def __init__(self, handle: ActorHandle, name: str, num_returns: int,
                 max_task_retries: int | None = None, display_name: str | None = None,
                 concurrency_group: str = "") -> None:
        self._handle = handle
        self._name = name
        self._num_returns = num_returns
        self._max_task_retries = max_task_retries
        self._display_name = display_name  # the call's name in errors and traces
        self._concurrency_group = concurrency_group

    def __call__(self, *args, **kwargs):
        raise TypeError(f"Actor methods cannot be called directly. Instead of running "
                        f"'{self._name}()', try '{self._name}.remote()'.")

    def options(self, **options) -> ActorMethod:
        options = opts.validate(options, opts.METHOD_OPTIONS, "an actor method")
        return ActorMethod(self._handle, self._name,
                           options.get("num_returns", self._num_returns),
                           options.get("max_task_retries", self._max_task_retries),
                           options.get("name", self._display_name),
                           options.get("concurrency_group", self._concurrency_group))

    def _remote(self, args=None, kwargs=None, **options):
        """``m._remote(args=[...], kwargs={...}, **options)``, as Ray's."""
        target = self.options(**options) if options else self
        return target.remote(*(args or ()), **(kwargs or {}))

    def remote(self, *args, **kwargs):
        worker = get_worker()
        handle = self._handle
        signature = handle._signature_of(self._name)
        if signature is not None:
            try:
                signature.bind(*args, **kwargs)
            except TypeError as error:
                raise TypeError(f"{self._name}.remote(): {error}") from None
        retries = self._max_task_retries
        refs = _submit(
            worker, name=self._display_name or f"{handle._class_name}.{self._name}",
            function_id="", args=args,
            kwargs=kwargs, num_returns=self._num_returns, resources={},
            strategy=_DEFAULT_STRATEGY, max_retries=0, retry_exceptions=False,
            actor_id=handle._actor_id, method=self._name,
            max_task_retries=handle._max_task_retries if retries is None else retries,
            max_pending_calls=handle._max_pending_calls,
            concurrency_group=self._concurrency_group, actor_ref=handle._ref)
        return _returns(refs, self._num_returns)


def _handle_ref(worker, actor_id: str, owner: str, detached: bool) -> ObjectRef | None:
    """The ref a new handle holds to its actor's handle reference (None for
    a detached actor: handles do not keep it). A process that gets a handle
    from the GCS (get_actor, get_if_exists) registers as a borrower before
    the handle exists, so the actor cannot end while it is held."""
    if detached or not owner:
        return None

    async def make():
        ref, is_new = worker.actor_handle_ref(actor_id, owner)
        if is_new:
            await worker.register_borrows([ref])
        return ref
    return _block(worker, make)


class ActorHandle:
    """A reference to an actor; pass it to tasks and call its methods.

    A handle of a non-detached actor holds ``_ref``, a ref to the actor's
    handle reference (see ``worker/actor_task_submitter``): while any handle
    (or a call made through one) exists anywhere, the actor lives."""

    # Methods every actor has, as Ray's: __ray_ready__ answers True once the
    # actor is up; __ray_terminate__ ends it after the calls queued before it.
    _BUILTIN_METHODS = ("__ray_ready__", "__ray_terminate__")

    def __init__(self, actor_id: str, class_name: str, method_meta: dict,
                 max_task_retries: int, signatures: dict | None = None,
                 max_pending_calls: int = -1, ref: ObjectRef | None = None) -> None:
        self._ref = ref
        self._actor_id = actor_id
        self._class_name = class_name
        self._method_meta = method_meta
        self._max_task_retries = max_task_retries
        self._signatures = signatures
        self._max_pending_calls = max_pending_calls

    def __getattr__(self, name: str) -> ActorMethod:
        if name in ActorHandle._BUILTIN_METHODS:
            return ActorMethod(self, name, 1)
        if name.startswith("__") or name not in self.__dict__.get("_method_meta", {}):
            raise AttributeError(f"actor {self.__dict__.get('_class_name', '?')} has no "
                                 f"method {name!r}")
        meta = self._method_meta[name]
        return ActorMethod(self, name, meta["num_returns"],
                           concurrency_group=meta.get("concurrency_group", ""))

    def _signature_of(self, method: str):
        """The method's signature: the class's own where this handle was made
        from it, else rebuilt from the actor's metadata (a handle passed into
        a task, or from get_actor); None when unknown."""
        if self._signatures is not None and method in self._signatures:
            return self._signatures[method]
        params = self._method_meta.get(method, {}).get("params")
        return _signature_from(params) if params is not None else None

    def __dir__(self):
        return sorted(name for name in self._method_meta if not name.startswith("__"))

    def __reduce__(self):
        # The ref inside makes whoever unpickles this handle a borrower.
        return (ActorHandle, (self._actor_id, self._class_name, self._method_meta,
                              self._max_task_retries, None, self._max_pending_calls,
                              self._ref))

    def __repr__(self) -> str:
        return f"Actor({self._class_name}, {self._actor_id})"

    def __eq__(self, other) -> bool:
        return isinstance(other, ActorHandle) and other._actor_id == self._actor_id

    def __hash__(self) -> int:
        return hash(self._actor_id)


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


# ========================================================== get/put/wait

def _check_timeout(timeout) -> None:
    if timeout is not None and (isinstance(timeout, bool) or
                                not isinstance(timeout, numbers.Real) or timeout < 0):
        raise ValueError(f"timeout must be None or a non-negative number of seconds, "
                         f"got {timeout!r}")


def get(object_refs, *, timeout: float | None = None):
    """The value(s) of one ref or a list of refs; raises the task's error."""
    worker = _worker()
    _check_timeout(timeout)
    fast = worker.queues_from_thread()
    if isinstance(object_refs, ObjectRef):
        if fast:
            ready = worker.get_ready([object_refs])
            if ready is None:
                ready = worker.get_from_thread([object_refs], timeout)
            if ready is not None:
                return ready[0]
        return _block(worker, worker.get_async, [object_refs], timeout, True)
    if not isinstance(object_refs, (list, tuple)):
        raise TypeError(f"get() expects an ObjectRef or a list of ObjectRefs, "
                        f"got {type(object_refs).__name__}")
    for ref in object_refs:
        if not isinstance(ref, ObjectRef):
            raise TypeError(f"get() expects a list of ObjectRefs, but it contains "
                            f"a {type(ref).__name__}: {ref!r}")
    if not object_refs:
        return []
    if fast:
        # Objects this driver owns, already in its memory: read here, not
        # on the loop (no thread crossing; measured in the H1 report).
        ready = worker.get_ready(object_refs)
        if ready is None:
            # Owned here but not ready: wait on a condition of this thread's
            # own, which the loop notifies (CoreWorker.get_from_thread).
            ready = worker.get_from_thread(list(object_refs), timeout)
        if ready is not None:
            return ready
    return _block(worker, worker.get_async, list(object_refs), timeout)


def put(value) -> ObjectRef:
    """Store ``value`` in the object store; returns its ref."""
    worker = _worker()
    if worker.queues_from_thread():
        # The driver's script (local backend): serialized here, stored by
        # the loop later without waiting when small (see CoreWorker.queue_put).
        serialized = worker.serialize_put(value)
        ref = worker.queue_put(serialized)
        return ref if ref is not None else _in_loop(worker, worker.put_serialized, serialized)
    return _in_loop(worker, worker.put, value)


def wait(object_refs, *, num_returns: int = 1, timeout: float | None = None,
         fetch_local: bool = True):
    """(ready, not_ready): the first ``num_returns`` refs to be ready, in
    the input order, within ``timeout`` seconds."""
    worker = _worker()
    if isinstance(object_refs, ObjectRef):
        raise TypeError("wait() expects a list of ObjectRefs, got a single ObjectRef; "
                        "wrap it in a list")
    if not isinstance(object_refs, (list, tuple)):
        raise TypeError(f"wait() expects a list of ObjectRefs, got {type(object_refs).__name__}")
    for ref in object_refs:
        if not isinstance(ref, ObjectRef):
            raise TypeError(f"wait() expects a list of ObjectRefs, but it contains a "
                            f"{type(ref).__name__}: {ref!r}")
    if not object_refs:
        return [], []
    if len({ref._id._binary for ref in object_refs}) != len(object_refs):  # (bytes hash in C)
        raise ValueError("wait() requires a list of unique ObjectRefs")
    if isinstance(num_returns, bool) or not isinstance(num_returns, int) or num_returns <= 0:
        raise ValueError(f"num_returns must be a positive integer, got {num_returns!r}")
    if num_returns > len(object_refs):
        raise ValueError(f"num_returns ({num_returns}) cannot exceed the number of refs "
                         f"({len(object_refs)})")
    _check_timeout(timeout)
    if worker.queues_from_thread():
        # Objects this driver owns: answered in this thread, waiting (when
        # needed) on a condition the loop notifies (CoreWorker.wait_from_thread).
        answer = worker.wait_from_thread(object_refs, num_returns, timeout, bool(fetch_local))
        if answer is not None:
            return answer
    return _block(worker, worker.wait_async, list(object_refs), num_returns, timeout,
                  bool(fetch_local))


def cancel(object_ref: ObjectRef, *, force: bool = False, recursive: bool = True) -> None:
    """Cancel the task that creates ``object_ref``; ``get`` then raises
    TaskCancelledError. ``force=True`` kills the worker running it."""
    worker = _worker()
    if not isinstance(object_ref, ObjectRef):
        raise TypeError(f"cancel() expects an ObjectRef, got {type(object_ref).__name__}")
    _block(worker, worker.cancel_async, object_ref, force, recursive)


# ================================================================== actors

def _gcs_call(method_name: str, *args):
    worker = get_worker()

    async def call():
        return await worker.gcs_call(method_name, *args)
    return _block(worker, call)


def kill(actor: ActorHandle, *, no_restart: bool = True) -> None:
    """Kill an actor; with ``no_restart=False`` it restarts (within its
    ``max_restarts``)."""
    if not isinstance(actor, ActorHandle):
        raise TypeError(f"kill() expects an actor handle, got {type(actor).__name__}")
    worker = _worker()
    _block(worker, worker.kill_actor, actor._actor_id, no_restart)


def exit_actor() -> None:
    """End the current actor from inside one of its methods, as Ray's
    ``ray.actor.exit_actor``: the method's caller sees ``ActorDiedError``
    instead of a value, calls not started yet fail with ``ActorDiedError``,
    calls already running (a concurrent actor's) finish, ``atexit`` handlers
    run (on real processes), and the actor is not restarted. Raises
    ``TypeError`` outside an actor."""
    from .worker.actor_host import ActorExit, AsyncioActorExit

    worker = get_worker(required=False)
    context = current_task.get(None)
    if worker is None or context is None or context.actor_id is None or \
            getattr(worker, "actor_host", None) is None:
        raise TypeError("exit_actor() can only be called inside an actor's method; use "
                        "tray.kill(handle) to end an actor from outside")
    worker.actor_host.request_exit("exit_actor() was called")
    import sniffio

    try:
        on_asyncio = sniffio.current_async_library() == "asyncio"
    except sniffio.AsyncLibraryNotFoundError:  # a method's thread
        on_asyncio = False
    if on_asyncio:  # an async method: a SystemExit must not cross the asyncio loop
        raise AsyncioActorExit("exit_actor() was called")
    raise ActorExit(0)


def get_actor(name: str, namespace: str | None = None) -> ActorHandle:
    """The handle of the live actor called ``name``; ValueError if none."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"get_actor() needs a non-empty name, got {name!r}")
    _worker()  # starts a cluster if none runs, as Ray does
    namespace = namespace if namespace is not None else _namespace()
    found = _gcs_call("get_named_actor_handle", name, namespace)
    if found is None:
        raise ValueError(f"Failed to look up actor with name {name!r} in namespace "
                         f"{namespace!r}: no live actor has that name")
    info, owner, detached = found
    worker = get_worker()
    return ActorHandle(info.actor_id, info.class_name, info.method_meta,
                       info.max_task_retries, max_pending_calls=info.max_pending_calls,
                       ref=_handle_ref(worker, info.actor_id, owner, detached))


# ================================================================= cluster

def nodes() -> list[dict]:
    """Every node the cluster has known, alive or dead, as in ``ray.nodes()``:
    its resources include ``object_store_memory`` (the store's capacity in
    bytes), as Ray's do."""
    return [{"NodeID": node.node_id, "Alive": node.alive, "alive": node.alive,
             "NodeManagerAddress": node.address,
             "Resources": {**node.resources,
                           "object_store_memory": float(node.object_store_bytes)}}
            for node in _gcs_call("get_all_nodes")]


def cluster_resources() -> dict:
    total: dict[str, float] = {}
    for node in nodes():
        if node["Alive"]:
            for name, amount in node["Resources"].items():
                total[name] = total.get(name, 0.0) + amount
    return total


def available_resources() -> dict:
    """Free resources summed over live nodes, asked of each node directly."""
    worker = get_worker()
    alive = [node for node in nodes() if node["Alive"]]

    async def gather():
        stats = []
        for node in alive:
            stats.append(await worker.endpoint.call(node["NodeManagerAddress"],
                                                    "get_node_stats"))
        return stats

    total: dict[str, float] = {}
    for node, stats in zip(alive, _block(worker, gather), strict=True):
        free_store = node["Resources"]["object_store_memory"] - stats["store_used_bytes"]
        total["object_store_memory"] = total.get("object_store_memory", 0.0) + free_store
        for name, amount in stats["available"].items():
            if amount > 0:
                total[name] = total.get(name, 0.0) + amount
    return total


def get_gpu_ids() -> list[int]:
    """The GPU device ids reserved for the running task or actor."""
    worker = _worker()
    context = current_task.get(None)
    if context is None:
        return list(worker.actor_gpu_ids)
    return list(context.gpu_ids)


class RuntimeContext:
    """Ids of what is running here, as hex strings (``None`` where absent)."""

    def __init__(self, worker) -> None:
        self._worker = worker
        self._task = current_task.get(None)

    def get_job_id(self) -> str:
        return JobID.from_int(self._worker.current_job()).hex()

    def get_node_id(self) -> str:
        return self._worker.node_id

    def get_task_id(self) -> str | None:
        return self._task.task_id.hex() if self._task is not None else None

    def get_actor_id(self) -> str | None:
        if self._task is not None and self._task.actor_id is not None:
            return self._task.actor_id.hex()
        return None

    def get_worker_id(self) -> str:
        return self._worker.worker_id or self._worker.address

    def is_canceled(self) -> bool:
        """Whether ``tray.cancel`` reached the task or actor call running
        this code (Ray's): a running synchronous actor method is not
        interrupted by a cancel, and may poll this to stop early."""
        if self._task is None:
            raise RuntimeError("is_canceled() can only be called inside a task or an actor's "
                               "method")
        return self._worker.receiver.is_cancel_requested(self._task.task_id.binary())

    @property
    def namespace(self) -> str:
        return _namespace()

    @property
    def runtime_env(self) -> dict:
        """The runtime_env the running code is in, resolved (Ray's
        ``RuntimeContext.runtime_env``): local paths are package URIs."""
        from ..runtime_env import current

        return current()

    def get_runtime_env_string(self) -> str:
        import json

        return json.dumps(self.runtime_env, sort_keys=True)

    job_id = property(get_job_id)
    node_id = property(get_node_id)
    task_id = property(get_task_id)
    actor_id = property(get_actor_id)


def get_runtime_context() -> RuntimeContext:
    return RuntimeContext(get_worker())


__all__ = ["init", "shutdown", "is_initialized", "remote", "method", "get", "put", "wait",
           "cancel", "kill", "get_actor", "nodes", "cluster_resources", "available_resources",
           "get_gpu_ids", "get_runtime_context", "ObjectRef", "ActorHandle", "register_backend"]
