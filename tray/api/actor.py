"""Actors: what ``@tray.remote`` makes of a class, method options,
handles and their calls, and the operations on actors (``kill``,
``get_actor``, ``exit_actor``)."""

from __future__ import annotations

import functools
import inspect

from ..core.context import current_task, get_worker
from ..core.object_ref import ObjectRef
from ..core.scheduling import DefaultStrategy
from . import options as opts
from .blocking import block, gcs_call, in_loop
from .remote_function import Export, returns, signature_of, submit
from .session import current_namespace, ensure_worker, task_runtime_env

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
        signature = signature_of(member)
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
        self._export = Export(cls, "actor")
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
        init_signature = signature_of(self._cls)
        if init_signature is not None:
            try:
                init_signature.bind(*args, **kwargs)
            except TypeError as error:
                raise TypeError(f"{self._cls.__name__}.remote(): {error}") from None
        worker = ensure_worker()
        function_id, blob = self._export.get()
        options = self._options
        namespace = options.get("namespace") or current_namespace()
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
        runtime_env = task_runtime_env(worker, options)

        def prepare():
            worker.export_function(function_id, blob)
            return worker.prepare_actor(
                runtime_env=runtime_env,
                class_name=self._cls.__name__, function_id=function_id, args=args,
                kwargs=kwargs, resources=opts.resources_of(options, 0.0),
                strategy=opts.to_strategy(options.get("scheduling_strategy")),
                options=options, namespace=namespace, method_meta=meta, is_async=is_async)
        actor, holds = in_loop(worker, prepare)
        existing = block(worker, worker.register_actor, actor, holds)
        if existing is None:
            info, owner, detached = actor, worker.address, actor.detached
        else:  # get_if_exists found a live actor of that name: borrow its handle
            info = existing
            owner, detached = gcs_call("actor_owner", existing.actor_id) or ("", True)
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


_DEFAULT_STRATEGY = DefaultStrategy()  # an actor call's (it runs where its actor is)


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
        signature = handle.signature_of(self._name)
        if signature is not None:
            try:
                signature.bind(*args, **kwargs)
            except TypeError as error:
                raise TypeError(f"{self._name}.remote(): {error}") from None
        retries = self._max_task_retries
        refs = submit(
            worker, name=self._display_name or f"{handle._class_name}.{self._name}",
            function_id="", args=args,
            kwargs=kwargs, num_returns=self._num_returns, resources={},
            strategy=_DEFAULT_STRATEGY, max_retries=0, retry_exceptions=False,
            actor_id=handle._actor_id, method=self._name,
            max_task_retries=handle._max_task_retries if retries is None else retries,
            max_pending_calls=handle._max_pending_calls,
            concurrency_group=self._concurrency_group, actor_ref=handle._ref)
        return returns(refs, self._num_returns)


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
    return block(worker, make)


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

    def signature_of(self, method: str):
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




def kill(actor: ActorHandle, *, no_restart: bool = True) -> None:
    """Kill an actor; with ``no_restart=False`` it restarts (within its
    ``max_restarts``)."""
    if not isinstance(actor, ActorHandle):
        raise TypeError(f"kill() expects an actor handle, got {type(actor).__name__}")
    worker = ensure_worker()
    block(worker, worker.kill_actor, actor._actor_id, no_restart)


def exit_actor() -> None:
    """End the current actor from inside one of its methods, as Ray's
    ``ray.actor.exit_actor``: the method's caller sees ``ActorDiedError``
    instead of a value, calls not started yet fail with ``ActorDiedError``,
    calls already running (a concurrent actor's) finish, ``atexit`` handlers
    run (on real processes), and the actor is not restarted. Raises
    ``TypeError`` outside an actor."""
    from ..core.worker.actor_host import ActorExit, AsyncioActorExit

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
    ensure_worker()  # starts a cluster if none runs, as Ray does
    namespace = namespace if namespace is not None else current_namespace()
    found = gcs_call("get_named_actor_handle", name, namespace)
    if found is None:
        raise ValueError(f"Failed to look up actor with name {name!r} in namespace "
                         f"{namespace!r}: no live actor has that name")
    info, owner, detached = found
    worker = get_worker()
    return ActorHandle(info.actor_id, info.class_name, info.method_meta,
                       info.max_task_retries, max_pending_calls=info.max_pending_calls,
                       ref=_handle_ref(worker, info.actor_id, owner, detached))

