"""What a trial runs: a function ``train(config)`` that calls ``tune.report``,
or a ``tune.Trainable`` subclass; ``with_parameters`` and ``with_resources``
wrap either.

``with_parameters`` puts each large argument into the object store once, in
the driver, and the wrapper carries only the refs: every runner fetches
them once (and keeps them across the trials it runs), instead of each trial
pickling the data again. ``with_resources`` sets what every trial's runner
actor reserves; the request is turned into actor options in one place
(``actor_options``) so that it can move to placement groups later.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import tray


class Trainable:
    """A class trainable (Ray's ``tune.Trainable``): override ``setup``,
    ``step`` (one iteration; returns a dict of metrics, ``done: True`` to
    finish), ``save_checkpoint(checkpoint_dir)`` (write files there, or
    return a dict), ``load_checkpoint(checkpoint)`` (the dict, or the
    directory's path), and optionally ``reset_config`` and ``cleanup``."""

    def __init__(self, config: dict | None = None, **parameters: Any) -> None:
        self.config = dict(config or {})
        self._iteration = 0
        self._time_total_s = 0.0
        self._trial_id = "default"
        self._trial_name = "default"
        self._logdir = ""
        self.setup(dict(self.config), **parameters)

    # -- what users override
    def setup(self, config: dict, **parameters: Any) -> None:
        pass

    def step(self) -> dict:
        raise NotImplementedError(f"{type(self).__name__} must implement step()")

    def save_checkpoint(self, checkpoint_dir: str) -> dict | None:
        raise NotImplementedError(f"{type(self).__name__} must implement save_checkpoint() "
                                  f"to be checkpointed")

    def load_checkpoint(self, checkpoint: dict | str) -> None:
        raise NotImplementedError(f"{type(self).__name__} must implement load_checkpoint() "
                                  f"to be restored")

    def reset_config(self, new_config: dict) -> bool:
        """Take a new config in place (reuse_actors, PBT); False: build anew."""
        return False

    def cleanup(self) -> None:
        pass

    @classmethod
    def default_resource_request(cls, config: dict) -> dict | None:
        return None

    # -- what Tune sets and users read
    @property
    def iteration(self) -> int:
        return self._iteration

    @property
    def training_iteration(self) -> int:
        return self._iteration

    @property
    def trial_id(self) -> str:
        return self._trial_id

    @property
    def trial_name(self) -> str:
        return self._trial_name

    @property
    def logdir(self) -> str:
        return self._logdir

    # -- direct use, outside an experiment (unit tests of a trainable)
    def train(self) -> dict:
        result = dict(self.step())
        self._iteration += 1
        result.setdefault("done", False)
        result["training_iteration"] = self._iteration
        return result

    def save(self, checkpoint_dir: str) -> str:
        import os
        import pickle

        os.makedirs(checkpoint_dir, exist_ok=True)
        state = self.save_checkpoint(checkpoint_dir)
        if state is not None:
            with open(os.path.join(checkpoint_dir, DICT_CHECKPOINT_FILE), "wb") as file:
                pickle.dump(state, file)
        return checkpoint_dir

    def restore(self, checkpoint_dir: str) -> None:
        self.load_checkpoint(load_state(checkpoint_dir))

    def stop(self) -> None:
        self.cleanup()


Trainable.__module__ = "tray.tune"

DICT_CHECKPOINT_FILE = "_dict_checkpoint.pkl"


def load_state(checkpoint_dir: str) -> dict | str:
    """What ``load_checkpoint`` receives: the dict ``save_checkpoint``
    returned, or the directory it wrote into."""
    import os
    import pickle

    path = os.path.join(checkpoint_dir, DICT_CHECKPOINT_FILE)
    if os.path.exists(path):
        with open(path, "rb") as file:
            return pickle.load(file)
    return checkpoint_dir


# ============================================================ wrappers

_RESOURCE_KEYS = {"cpu": "num_cpus", "gpu": "num_gpus", "memory": "memory"}


def actor_options(request: dict) -> dict:
    """Resources as ``with_resources`` takes them (``{"cpu": 2, "gpu": 0.5,
    "custom": 1}``) -> the runner actor's options. The one place a trial's
    resource request becomes actor options (placement groups later)."""
    if not isinstance(request, dict):
        raise ValueError(f"trial resources must be a dict such as {{'cpu': 1, 'gpu': 0}}, "
                         f"got {request!r}")
    options: dict[str, Any] = {"num_cpus": 1}
    custom: dict[str, float] = {}
    for key, amount in request.items():
        if isinstance(amount, bool) or not isinstance(amount, (int, float)) or amount < 0:
            raise ValueError(f"trial resource {key!r} must be a number >= 0, got {amount!r}")
        name = _RESOURCE_KEYS.get(str(key).lower())
        if name is not None:
            options[name] = amount
        elif key in ("num_cpus", "num_gpus"):
            options[key] = amount
        else:
            custom[key] = amount
    if custom:
        options["resources"] = custom
    return options


def shape_key(options: dict) -> str:
    """A stable name for a resource shape (runners are pooled per shape)."""
    parts = [f"{k}={options[k]:g}" for k in sorted(options) if k != "resources"]
    parts += [f"{k}={v:g}" for k, v in sorted(options.get("resources", {}).items())]
    return ",".join(parts)


class TrainableSpec:
    """A trainable with its parameters (object refs) and resource request."""

    def __init__(self, trainable: Any, parameters: dict | None = None,
                 resources: dict | Callable | None = None) -> None:
        self.trainable = trainable
        self.parameters = dict(parameters or {})  # name -> ObjectRef
        self.resources = resources
        self.__name__ = getattr(trainable, "__name__", type(trainable).__name__)

    @property
    def is_class(self) -> bool:
        return isinstance(self.trainable, type)

    def resources_for(self, config: dict) -> dict:
        request = self.resources
        if callable(request):
            request = request(config)
        if request is None and self.is_class:
            request = self.trainable.default_resource_request(config)
        if request is None:
            request = {"cpu": 1}
        return actor_options(request)

    def __call__(self, config: dict):  # so the wrapper still looks like the function
        if self.is_class:
            raise TypeError("call a class trainable through a tune.Tuner")
        return self.trainable(config, **{k: tray.get(v) for k, v in self.parameters.items()})




def as_spec(trainable: Any) -> TrainableSpec:
    """Check a trainable and wrap it (what Tuner, with_parameters and
    with_resources all start with)."""
    if isinstance(trainable, TrainableSpec):
        return trainable
    if isinstance(trainable, type):
        if not issubclass(trainable, Trainable):
            raise TypeError(f"a class trainable must subclass tune.Trainable, got {trainable!r}")
        return TrainableSpec(trainable)
    if isinstance(trainable, str):
        raise TypeError(f"trainables are functions or tune.Trainable classes; tray.tune has "
                        f"no registry of named trainables ({trainable!r})")
    if not callable(trainable):
        raise TypeError(f"a trainable is a function train(config) or a tune.Trainable "
                        f"subclass, got {trainable!r}")
    try:
        parameters = inspect.signature(trainable).parameters
    except (TypeError, ValueError):
        parameters = {}
    if parameters and not any(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD,
                                         p.VAR_POSITIONAL) for p in parameters.values()):
        raise TypeError(f"a function trainable takes the config as its first argument: "
                        f"{trainable.__name__}{inspect.signature(trainable)}")
    return TrainableSpec(trainable)


def with_parameters(trainable: Any, **kwargs: Any) -> TrainableSpec:
    """The trainable, called with ``kwargs`` as extra keyword arguments
    (``train(config, data=...)``; ``setup(config, data=...)`` for classes).
    Each value is put into the object store once, now."""
    spec = as_spec(trainable)
    refs = {name: tray.put(value) for name, value in kwargs.items()}
    return TrainableSpec(spec.trainable, {**spec.parameters, **refs}, spec.resources)


def with_resources(trainable: Any, resources: dict | Callable) -> TrainableSpec:
    """What each trial reserves: ``{"cpu": 2, "gpu": 0.5, "<custom>": 1}``, or
    a function ``config -> dict``."""
    spec = as_spec(trainable)
    if not callable(resources):
        actor_options(resources)  # validate now
    return TrainableSpec(spec.trainable, spec.parameters, resources)


with_parameters.__module__ = "tray.tune"
with_resources.__module__ = "tray.tune"
