"""Environments by name, class or creator, as RLlib takes them.

``config.environment(env=...)`` accepts:

* a name given to :func:`register_env` (a creator ``env_config -> env``);
* a gymnasium id (``"CartPole-v1"``), made with ``gymnasium.make(id, **env_config)``;
* a ``gymnasium.Env`` or ``MultiAgentEnv`` subclass, constructed as
  ``cls(env_config)`` (RLlib's convention for custom envs);
* any other callable, called as ``creator(env_config)``.

``env_config`` reaches the env as an :class:`EnvContext`: the user's dict,
plus ``worker_index`` (0 for the driver, 1..N for env runners),
``num_workers`` and ``vector_index`` (which of the runner's envs this is),
so a creator can give every copy its own seed or file.

The registry is per process, like RLlib's before Tune: a name registered in
the driver travels to the env runners inside the config (the creator is
pickled with it), so runners on other processes and nodes see it too."""

from __future__ import annotations

import inspect

_REGISTRY: dict[str, object] = {}


def register_env(name: str, creator) -> None:
    """Make ``config.environment(env=name)`` build envs with ``creator(env_config)``."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"register_env() needs a non-empty name, got {name!r}")
    if not callable(creator):
        raise TypeError(f"register_env({name!r}, ...) needs a callable creator "
                        f"(env_config -> env), got {type(creator).__name__}")
    _REGISTRY[name] = creator


def registered_creator(name: str):
    return _REGISTRY.get(name)


class EnvContext(dict):
    """The env's config dict, with where this copy of the env runs."""

    def __init__(self, env_config: dict | None, worker_index: int = 0, num_workers: int = 0,
                 vector_index: int = 0) -> None:
        super().__init__(env_config or {})
        self.worker_index = worker_index
        self.num_workers = num_workers
        self.vector_index = vector_index


def resolve_creator(env):
    """A callable ``env_context -> env`` for what ``config.environment(env=...)`` got."""
    if env is None:
        raise ValueError("no environment: call config.environment(env=...) with a gymnasium id, "
                         "a registered name, an env class or a creator")
    if isinstance(env, str):
        creator = _REGISTRY.get(env)
        if creator is not None:
            return creator

        def make(context: EnvContext):
            import gymnasium

            try:
                return gymnasium.make(env, **dict(context))
            except gymnasium.error.Error as error:
                raise ValueError(f"unknown environment {env!r}: not registered with "
                                 f"tray.rllib.register_env() and gymnasium says: {error}"
                                 ) from error
        return make
    if inspect.isclass(env) or callable(env):
        return env
    raise TypeError(f"config.environment(env=...) takes a name, an env class or a creator, "
                    f"got {type(env).__name__}")


def make_env(env, env_config: dict | None, *, worker_index: int = 0, num_workers: int = 0,
             vector_index: int = 0):
    context = EnvContext(env_config, worker_index, num_workers, vector_index)
    return resolve_creator(env)(context)
