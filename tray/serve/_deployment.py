"""Deployments and applications: ``@serve.deployment``, ``.options``, ``.bind``.

A ``Deployment`` is a class or function with its serving options; ``bind``
gives an ``Application``: the deployment with its constructor arguments,
some of which may be other applications (composition). Building an
application walks that graph once, gives every deployment a unique name in
the application, and replaces each bound child with a ``DeploymentHandle``
to it, so a parent's constructor receives handles, as in Ray Serve.

The result is a list of ``DeploymentSpec``s: what the controller needs to
run each deployment, with the code and its arguments pickled once in the
client. A spec's *version* is a digest of what needs new replicas when it
changes (the code, the constructor arguments, the actor options, a
user-given ``version``); the rest of the config (replica counts,
``user_config``, limits) is applied to running replicas in place, as Ray
does."""

from __future__ import annotations

import hashlib
import inspect
from dataclasses import dataclass

import cloudpickle

from . import config as config_module
from .config import DeploymentConfig

_UNSET = object()


@dataclass(frozen=True)
class DeploymentSpec:
    app_name: str
    name: str
    callable_blob: bytes  # cloudpickle of (func_or_class, init_args, init_kwargs)
    actor_options: dict
    config: DeploymentConfig
    version: str
    is_function: bool
    is_asgi: bool  # an @serve.ingress class: it serves HTTP through its ASGI app
    route_prefix: str | None = None  # set on the ingress only


class Deployment:
    """A class or function with its serving options (Ray Serve's
    ``Deployment``); ``.bind(*args)`` makes an application of it,
    ``.options(...)`` a copy with other options."""

    def __init__(self, func_or_class, name: str, config: DeploymentConfig,
                 actor_options: dict, version: str | None = None,
                 given: frozenset = frozenset()) -> None:
        self.func_or_class = func_or_class
        self._name = name
        self._config = config
        self._actor_options = actor_options
        self._version = version
        self._given = given  # the config options the user set (a config file overrides others)

    @property
    def name(self) -> str:
        return self._name

    @property
    def version(self) -> str | None:
        return self._version

    @property
    def num_replicas(self) -> int:
        return self._config.num_replicas

    @property
    def max_ongoing_requests(self) -> int:
        return self._config.max_ongoing_requests

    @property
    def user_config(self):
        return self._config.user_config

    @property
    def autoscaling_config(self):
        return self._config.autoscaling_config

    @property
    def ray_actor_options(self) -> dict:
        return dict(self._actor_options)

    def __call__(self, *args, **kwargs):
        raise RuntimeError(f"Deployment {self._name!r} cannot be called directly: bind it "
                           f"into an application (.bind()) and call it through the handle "
                           f"that serve.run returns")

    def options(self, *, name=_UNSET, version=_UNSET, ray_actor_options=_UNSET,
                **config_options) -> Deployment:
        """A copy with other options (Ray's ``Deployment.options``)."""
        unknown = sorted(set(config_options) - set(config_module.CONFIG_OPTIONS) -
                         set(_IGNORED_OPTIONS))
        if unknown:
            raise ValueError(f"unknown deployment option(s) {unknown}; valid options are "
                             f"name, version, ray_actor_options, "
                             f"{', '.join(config_module.CONFIG_OPTIONS)}")
        _reject_unsupported(config_options)
        config_options = {k: v for k, v in config_options.items() if k not in _IGNORED_OPTIONS}
        if "autoscaling_config" in config_options and "num_replicas" not in config_options \
                and config_options["autoscaling_config"] is not None:
            config_options["num_replicas"] = None  # autoscaling replaces a fixed count
        new_name = self._name if name is _UNSET else _check_name(name)
        config = config_module.make_deployment_config(config_options, self._config)
        actor_options = self._actor_options if ray_actor_options is _UNSET else \
            config_module.validate_actor_options(ray_actor_options)
        new_version = self._version if version is _UNSET else _check_version(version)
        return Deployment(self.func_or_class, new_name, config, actor_options, new_version,
                          self._given | frozenset(config_options))

    def bind(self, *args, **kwargs) -> Application:
        """This deployment with its constructor's arguments: an application,
        which ``serve.run`` deploys, or which another deployment's ``bind``
        takes as an argument (it then receives a ``DeploymentHandle``)."""
        if inspect.isclass(self.func_or_class):
            try:
                inspect.signature(self.func_or_class).bind(*args, **kwargs)
            except TypeError as error:
                raise TypeError(f"{self._name}.bind(): {error}") from None
        elif args or kwargs:
            raise TypeError(f"{self._name}.bind(): a function deployment takes no "
                            f"constructor arguments")
        return Application(self, args, kwargs)

    def __repr__(self) -> str:
        return f"Deployment(name={self._name})"


# Ray's options tray accepts and does nothing with (they only affect Ray's
# own logging and routing plumbing).
_IGNORED_OPTIONS = ("logging_config", "route_prefix", "is_driver_deployment",
                    "request_router_config")


def _reject_unsupported(options: dict) -> None:
    for name in ("placement_group_bundles", "placement_group_strategy",
                 "max_replicas_per_node"):
        if options.get(name) is not None:
            raise NotImplementedError(f"deployment option {name} is not supported yet")


def _check_name(name) -> str:
    if not isinstance(name, str) or not name:
        raise TypeError(f"a deployment name must be a non-empty string, got {name!r}")
    if "#" in name:
        raise ValueError(f"a deployment name may not contain '#': {name!r}")
    return name


def _check_version(version):
    if version is not None and not isinstance(version, str):
        raise TypeError(f"version must be a string, got {version!r}")
    return version


class Application:
    """A bound deployment (``Deployment.bind``): what ``serve.run`` takes,
    and what a parent deployment's ``bind`` takes to receive a handle."""

    def __init__(self, deployment: Deployment, args: tuple, kwargs: dict) -> None:
        self._deployment = deployment
        self._args = args
        self._kwargs = kwargs

    @property
    def deployment(self) -> Deployment:
        return self._deployment

    def __reduce__(self):
        raise TypeError("an Application cannot be pickled: pass it to serve.run or to "
                        "another deployment's .bind(), which turn it into a DeploymentHandle")

    def __repr__(self) -> str:
        return f"Application({self._deployment.name})"


def deployment(_func_or_class=None, *, name=None, version=None, num_replicas=_UNSET,
               ray_actor_options=None, max_ongoing_requests=_UNSET,
               max_queued_requests=_UNSET, user_config=_UNSET, autoscaling_config=_UNSET,
               health_check_period_s=_UNSET, health_check_timeout_s=_UNSET,
               graceful_shutdown_wait_loop_s=_UNSET, graceful_shutdown_timeout_s=_UNSET,
               **other):
    """``@serve.deployment`` or ``@serve.deployment(**options)`` on a class
    or function (Ray Serve's options and defaults)."""
    unknown = sorted(set(other) - set(_IGNORED_OPTIONS) - {
        "placement_group_bundles", "placement_group_strategy", "max_replicas_per_node",
        "max_concurrent_queries"})
    if unknown:
        raise TypeError(f"@serve.deployment got unknown option(s) {unknown}")
    _reject_unsupported(other)
    given = {key: value for key, value in {
        "num_replicas": num_replicas, "max_ongoing_requests": max_ongoing_requests,
        "max_queued_requests": max_queued_requests, "user_config": user_config,
        "autoscaling_config": autoscaling_config, "health_check_period_s": health_check_period_s,
        "health_check_timeout_s": health_check_timeout_s,
        "graceful_shutdown_wait_loop_s": graceful_shutdown_wait_loop_s,
        "graceful_shutdown_timeout_s": graceful_shutdown_timeout_s}.items() if value is not _UNSET}
    if "max_concurrent_queries" in other and "max_ongoing_requests" not in given:
        given["max_ongoing_requests"] = other["max_concurrent_queries"]  # Ray's old name
    config = config_module.make_deployment_config(given)
    actor_options = config_module.validate_actor_options(ray_actor_options)

    def decorate(target):
        if not (inspect.isclass(target) or inspect.isfunction(target) or
                inspect.ismethod(target) or callable(target)):
            raise TypeError(f"@serve.deployment applies to a class or function, not "
                            f"{target!r}")
        if isinstance(target, Deployment):
            raise TypeError("@serve.deployment applied twice")
        deployment_name = _check_name(name) if name is not None else target.__name__
        return Deployment(target, deployment_name, config, actor_options,
                          _check_version(version), frozenset(given))

    if _func_or_class is not None:
        return decorate(_func_or_class)
    return decorate


# ================================================================ building


def _code_identity(target) -> bytes:
    """What identifies a deployment's code: its name and source text.
    (Not its pickle: cloudpickle's bytes for one class vary with which
    equal strings happen to be the same object.)"""
    name = f"{getattr(target, '__module__', '')}.{getattr(target, '__qualname__', '')}"
    try:
        source = inspect.getsource(target)
    except (OSError, TypeError):
        return name.encode() + cloudpickle.dumps(target)
    return (name + "\n" + source).encode()


def _digest(*parts: bytes) -> str:
    hasher = hashlib.sha256()
    for part in parts:
        hasher.update(len(part).to_bytes(8, "little"))
        hasher.update(part)
    return hasher.hexdigest()[:16]


def build(app: Application, app_name: str, route_prefix: str | None,
          overrides: dict | None = None) -> tuple[str, list[DeploymentSpec]]:
    """(the ingress deployment's name, the specs of every deployment of the
    application, children first). ``overrides`` maps deployment names to
    options (from a config file) applied on top of the code's."""
    from ._handle import DeploymentHandle

    if not isinstance(app, Application):
        if isinstance(app, Deployment):
            raise TypeError(f"serve.run() takes an application: call {app.name}.bind() "
                            f"(with its constructor's arguments) first")
        raise TypeError(f"serve.run() takes an application (Deployment.bind()), got {app!r}")
    overrides = dict(overrides or {})
    specs: list[DeploymentSpec] = []
    names: dict[int, str] = {}  # id(Application) -> its name in this app
    taken: set[str] = set()

    def replace(value):
        if isinstance(value, Application):
            return DeploymentHandle(visit(value), app_name)
        if isinstance(value, Deployment):
            raise TypeError(f"deployment {value.name!r} is passed to bind() unbound: pass "
                            f"{value.name}.bind() instead")
        if isinstance(value, list):
            return [replace(v) for v in value]
        if isinstance(value, tuple):
            return tuple(replace(v) for v in value)
        if isinstance(value, dict):
            return {k: replace(v) for k, v in value.items()}
        return value

    def visit(node: Application) -> str:
        if id(node) in names:
            return names[id(node)]
        deployment_ = node.deployment
        name = deployment_.name
        suffix = 1
        while name in taken:  # the same deployment bound twice: Ray's name_1, name_2
            name = f"{deployment_.name}_{suffix}"
            suffix += 1
        taken.add(name)
        names[id(node)] = name
        args = replace(node._args)
        kwargs = replace(node._kwargs)
        if name in overrides:
            deployment_ = apply_overrides(deployment_, overrides.pop(name))
        target = deployment_.func_or_class
        try:
            blob = cloudpickle.dumps((target, args, kwargs))
        except Exception as error:
            raise TypeError(f"deployment {name!r}: its code or constructor arguments cannot "
                            f"be pickled: {type(error).__name__}: {error}") from error
        options_blob = cloudpickle.dumps(sorted(deployment_._actor_options.items()))
        try:
            arguments_blob = cloudpickle.dumps((args, kwargs))
        except Exception:  # noqa: BLE001 - pickled above with the code, so not reached
            arguments_blob = blob
        version = deployment_.version or _digest(_code_identity(target), arguments_blob,
                                                  options_blob)
        specs.append(DeploymentSpec(
            app_name=app_name, name=name, callable_blob=blob,
            actor_options=dict(deployment_._actor_options), config=deployment_._config,
            version=version, is_function=not inspect.isclass(target),
            is_asgi=getattr(target, "_serve_asgi_app", None) is not None))
        return name

    ingress = visit(app)
    if overrides:
        raise ValueError(f"the config names deployment(s) {sorted(overrides)} that application "
                         f"{app_name!r} does not have (it has {sorted(taken)})")
    specs = [s if s.name != ingress else _with_route(s, route_prefix) for s in specs]
    return ingress, specs


def _with_route(spec: DeploymentSpec, route_prefix: str | None) -> DeploymentSpec:
    import dataclasses

    return dataclasses.replace(spec, route_prefix=route_prefix)


def apply_overrides(deployment_: Deployment, options: dict) -> Deployment:
    """A deployment with a config file's options for it (Ray's semantics:
    what the file sets wins over the code)."""
    if not isinstance(options, dict):
        raise TypeError(f"deployment options must be a mapping, got {options!r}")
    options = {k: v for k, v in options.items() if k != "name"}
    return deployment_.options(**options)


def validate_route_prefix(route_prefix) -> str | None:
    if route_prefix is None:
        return None
    if not isinstance(route_prefix, str):
        raise TypeError(f"route_prefix must be a string or None, got {route_prefix!r}")
    if not route_prefix.startswith("/"):
        raise ValueError(f"route_prefix must start with '/', got {route_prefix!r}")
    if route_prefix != "/" and route_prefix.endswith("/"):
        raise ValueError(f"route_prefix may not end with '/' unless it is '/', got "
                         f"{route_prefix!r}")
    if "{" in route_prefix or "}" in route_prefix:
        raise ValueError(f"route_prefix may not contain wildcards ('{{' or '}}'), got "
                         f"{route_prefix!r}")
    return route_prefix
