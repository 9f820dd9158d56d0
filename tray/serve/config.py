"""Serve's configuration records, with Ray Serve's names and defaults.

Every option is checked where the user gives it (``@serve.deployment``,
``.options``, ``serve.start``, a config file): a wrong name or value raises
``ValueError`` (``TypeError`` for a wrong type) naming the option, never later
inside the controller."""

from __future__ import annotations

import dataclasses
import enum
import math
import numbers
from dataclasses import dataclass, field

# Ray Serve's defaults (ray.serve._private.constants) unless said otherwise.
DEFAULT_MAX_ONGOING_REQUESTS = 5
DEFAULT_HEALTH_CHECK_PERIOD_S = 10.0
DEFAULT_HEALTH_CHECK_TIMEOUT_S = 30.0
DEFAULT_GRACEFUL_SHUTDOWN_WAIT_LOOP_S = 2.0
DEFAULT_GRACEFUL_SHUTDOWN_TIMEOUT_S = 20.0
DEFAULT_HTTP_HOST = "127.0.0.1"
DEFAULT_HTTP_PORT = 8000


def _number(name: str, value, *, minimum: float = 0.0, strict: bool = False,
            allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or \
            (not math.isfinite(value)):
        raise TypeError(f"{name} must be a number, got {value!r}")
    if value < minimum or (strict and value == minimum):
        relation = ">" if strict else ">="
        raise ValueError(f"{name} must be {relation} {minimum}, got {value!r}")


def _integer(name: str, value, *, minimum: int, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an integer, got {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value!r}")


# ============================================================ autoscaling


@dataclass(frozen=True)
class AutoscalingConfig:
    """How a deployment scales on its ongoing requests (Ray's default policy:
    ``desired = ongoing / target_ongoing_requests``, smoothed, bounded, and
    applied only after the decision held for ``upscale_delay_s`` /
    ``downscale_delay_s``)."""

    min_replicas: int = 1
    max_replicas: int = 1
    initial_replicas: int | None = None
    target_ongoing_requests: float = 2.0
    metrics_interval_s: float = 10.0
    look_back_period_s: float = 30.0
    upscale_delay_s: float = 30.0
    downscale_delay_s: float = 600.0
    downscale_to_zero_delay_s: float | None = None
    upscaling_factor: float | None = None
    downscaling_factor: float | None = None

    def __post_init__(self) -> None:
        _integer("autoscaling_config.min_replicas", self.min_replicas, minimum=0)
        _integer("autoscaling_config.max_replicas", self.max_replicas, minimum=1)
        _integer("autoscaling_config.initial_replicas", self.initial_replicas, minimum=0,
                 allow_none=True)
        if self.min_replicas > self.max_replicas:
            raise ValueError(f"autoscaling_config: min_replicas ({self.min_replicas}) must be "
                             f"<= max_replicas ({self.max_replicas})")
        if self.initial_replicas is not None and \
                not self.min_replicas <= self.initial_replicas <= self.max_replicas:
            raise ValueError(f"autoscaling_config: initial_replicas ({self.initial_replicas}) "
                             f"must be between min_replicas and max_replicas")
        _number("autoscaling_config.target_ongoing_requests", self.target_ongoing_requests,
                strict=True)
        _number("autoscaling_config.metrics_interval_s", self.metrics_interval_s, strict=True)
        _number("autoscaling_config.look_back_period_s", self.look_back_period_s, strict=True)
        _number("autoscaling_config.upscale_delay_s", self.upscale_delay_s)
        _number("autoscaling_config.downscale_delay_s", self.downscale_delay_s)
        _number("autoscaling_config.downscale_to_zero_delay_s", self.downscale_to_zero_delay_s,
                allow_none=True)
        _number("autoscaling_config.upscaling_factor", self.upscaling_factor, strict=True,
                allow_none=True)
        _number("autoscaling_config.downscaling_factor", self.downscaling_factor, strict=True,
                allow_none=True)

    @classmethod
    def from_value(cls, value) -> AutoscalingConfig:
        if isinstance(value, AutoscalingConfig):
            return value
        if not isinstance(value, dict):
            raise TypeError(f"autoscaling_config must be a dict or an AutoscalingConfig, got "
                            f"{value!r}")
        known = {f.name for f in dataclasses.fields(cls)}
        # Ray's older name for target_ongoing_requests.
        value = dict(value)
        if "target_num_ongoing_requests_per_replica" in value:
            value.setdefault("target_ongoing_requests",
                             value.pop("target_num_ongoing_requests_per_replica"))
        unknown = sorted(set(value) - known)
        if unknown:
            raise ValueError(f"unknown autoscaling_config option(s) {unknown}; valid options "
                             f"are {sorted(known)}")
        return cls(**value)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


# ============================================================ deployments


@dataclass(frozen=True)
class DeploymentConfig:
    """What the controller needs to run a deployment's replicas, besides its
    code: counts, limits, health checks, shutdown timing, user config."""

    num_replicas: int = 1
    max_ongoing_requests: int = DEFAULT_MAX_ONGOING_REQUESTS
    max_queued_requests: int = -1
    user_config: object = None
    autoscaling_config: AutoscalingConfig | None = None
    health_check_period_s: float = DEFAULT_HEALTH_CHECK_PERIOD_S
    health_check_timeout_s: float = DEFAULT_HEALTH_CHECK_TIMEOUT_S
    graceful_shutdown_wait_loop_s: float = DEFAULT_GRACEFUL_SHUTDOWN_WAIT_LOOP_S
    graceful_shutdown_timeout_s: float = DEFAULT_GRACEFUL_SHUTDOWN_TIMEOUT_S

    def __post_init__(self) -> None:
        _integer("num_replicas", self.num_replicas, minimum=0)
        _integer("max_ongoing_requests", self.max_ongoing_requests, minimum=1)
        _integer("max_queued_requests", self.max_queued_requests, minimum=-1)
        if self.max_queued_requests == 0:
            raise ValueError("max_queued_requests must be -1 (no limit) or >= 1, got 0")
        _number("health_check_period_s", self.health_check_period_s, strict=True)
        _number("health_check_timeout_s", self.health_check_timeout_s, strict=True)
        _number("graceful_shutdown_wait_loop_s", self.graceful_shutdown_wait_loop_s)
        _number("graceful_shutdown_timeout_s", self.graceful_shutdown_timeout_s)

    def initial_target(self) -> int:
        scaling = self.autoscaling_config
        if scaling is None:
            return self.num_replicas
        if scaling.initial_replicas is not None:
            return scaling.initial_replicas
        return scaling.min_replicas


# The options of @serve.deployment (besides name, version, ray_actor_options),
# mapped to DeploymentConfig fields; num_replicas="auto" means autoscaling.
CONFIG_OPTIONS = ("num_replicas", "max_ongoing_requests", "max_queued_requests", "user_config",
                  "autoscaling_config", "health_check_period_s", "health_check_timeout_s",
                  "graceful_shutdown_wait_loop_s", "graceful_shutdown_timeout_s")
# ray_actor_options a replica may take (Ray's list, less object_store_memory,
# which tray does not have).
ACTOR_OPTIONS = ("num_cpus", "num_gpus", "memory", "resources", "accelerator_type",
                 "runtime_env")


def validate_actor_options(options) -> dict:
    if options is None:
        return {}
    if not isinstance(options, dict):
        raise TypeError(f"ray_actor_options must be a dict, got {options!r}")
    for name in options:
        if name not in ACTOR_OPTIONS:
            raise ValueError(f"invalid ray_actor_options key {name!r}; valid keys are "
                             f"{', '.join(ACTOR_OPTIONS)}")
    for name in ("num_cpus", "num_gpus", "memory"):
        if name in options:
            _number(f"ray_actor_options[{name!r}]", options[name])
    if options.get("runtime_env"):
        from .. import runtime_env

        runtime_env.validate(options["runtime_env"])
    if "resources" in options and not isinstance(options["resources"], dict):
        raise TypeError(f"ray_actor_options['resources'] must be a dict, got "
                        f"{options['resources']!r}")
    return dict(options)


def make_deployment_config(options: dict, base: DeploymentConfig | None = None
                           ) -> DeploymentConfig:
    """``base`` with ``options`` (a subset of CONFIG_OPTIONS) applied."""
    base = base or DeploymentConfig()
    values = {f.name: getattr(base, f.name) for f in dataclasses.fields(base)}
    for name, value in options.items():
        if name not in CONFIG_OPTIONS:
            raise ValueError(f"unknown deployment option {name!r}")
        values[name] = value
    num_replicas = values["num_replicas"]
    scaling = values["autoscaling_config"]
    if options.get("num_replicas") is not None and "autoscaling_config" not in options:
        scaling = None  # a fixed count given now replaces the autoscaling given before
    if num_replicas == "auto":
        # Ray's "auto": autoscaling with its recommended settings, unless given.
        scaling = AutoscalingConfig.from_value(scaling or {"min_replicas": 1,
                                                           "max_replicas": 100})
        num_replicas = 1
    elif scaling is not None:
        scaling = AutoscalingConfig.from_value(scaling)
        if options.get("num_replicas") is not None and "autoscaling_config" in options:
            raise ValueError("a deployment takes num_replicas or autoscaling_config, not both "
                             "(use num_replicas='auto' for autoscaling with defaults)")
    if num_replicas is None:
        num_replicas = 1
    values["num_replicas"] = num_replicas
    values["autoscaling_config"] = scaling
    return DeploymentConfig(**values)


# ==================================================================== HTTP


class ProxyLocation(enum.StrEnum):
    """Where HTTP proxies run. tray's default is ``HeadOnly`` (Ray's is
    ``EveryNode``): several tray nodes often share one machine, where proxies
    on every node would fight over one port."""

    Disabled = "Disabled"
    HeadOnly = "HeadOnly"
    EveryNode = "EveryNode"

    @classmethod
    def from_value(cls, value) -> ProxyLocation:
        if isinstance(value, ProxyLocation):
            return value
        for member in cls:
            if value == member.value or (isinstance(value, str) and
                                         value.lower() == member.value.lower()):
                return member
        if value == "NoServer":  # Ray 1.x's name
            return cls.Disabled
        raise ValueError(f"proxy_location must be one of {[m.value for m in cls]}, got "
                         f"{value!r}")


@dataclass(frozen=True)
class HTTPOptions:
    """The HTTP proxies' settings. ``host`` defaults to loopback (127.0.0.1),
    as Ray's; bind to 0.0.0.0 only on purpose."""

    host: str = DEFAULT_HTTP_HOST
    port: int = DEFAULT_HTTP_PORT
    root_path: str = ""
    request_timeout_s: float | None = None
    keep_alive_timeout_s: float = 5.0
    # The most HTTP requests a proxy serves at once; more are answered 503 by
    # uvicorn (its limit_concurrency). A bound on the proxy's memory under load.
    max_concurrent_requests: int = 10_000
    # The largest request body a proxy reads; larger ones are answered 413.
    max_request_body_bytes: int = 100 * 2**20
    extra: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.host, str) or not self.host:
            raise TypeError(f"http_options host must be a non-empty string, got {self.host!r}")
        _integer("http_options port", self.port, minimum=0)
        if self.port > 65535:
            raise ValueError(f"http_options port must be <= 65535, got {self.port}")
        _number("http_options request_timeout_s", self.request_timeout_s, strict=True,
                allow_none=True)
        _number("http_options keep_alive_timeout_s", self.keep_alive_timeout_s)
        _integer("http_options max_concurrent_requests", self.max_concurrent_requests,
                 minimum=1)
        _integer("http_options max_request_body_bytes", self.max_request_body_bytes,
                 minimum=0)

    @classmethod
    def from_value(cls, value) -> HTTPOptions:
        if value is None:
            return cls()
        if isinstance(value, HTTPOptions):
            return value
        if not isinstance(value, dict):
            raise TypeError(f"http_options must be a dict or an HTTPOptions, got {value!r}")
        known = {f.name for f in dataclasses.fields(cls)} - {"extra"}
        # Ray's options tray accepts and has no use for.
        ignored = {"location", "middlewares", "ssl_keyfile", "ssl_certfile"}
        unknown = sorted(set(value) - known - ignored)
        if unknown:
            raise ValueError(f"unknown http_options {unknown}; valid options are "
                             f"{sorted(known)}")
        for name in ("ssl_keyfile", "ssl_certfile", "middlewares"):
            if value.get(name):
                raise NotImplementedError(f"http_options {name} is not supported yet")
        return cls(**{k: v for k, v in value.items() if k in known})


__all__ = ["AutoscalingConfig", "DeploymentConfig", "HTTPOptions", "ProxyLocation"]
