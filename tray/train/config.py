"""A training run's settings: ``ScalingConfig``, ``RunConfig``,
``CheckpointConfig`` and ``FailureConfig`` (Ray Train's names, arguments and
defaults).

Each validates itself when it is built, so a wrong value fails where it was
written, naming the field, rather than in a worker minutes later. What only
the cluster can answer (does any node have a GPU? can the cluster ever hold
``num_workers`` bundles?) is checked by ``fit()``, before a worker starts.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass
from typing import Any

from ..tune.config import check_int

PLACEMENT_STRATEGIES = ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD")

# Resource names as tray.util.placement_group takes them; ScalingConfig's
# resources_per_worker uses Ray's spelling ("CPU", "GPU", "memory", custom).
_ACTOR_OPTION_OF = {"CPU": "num_cpus", "GPU": "num_gpus", "memory": "memory"}


@dataclass
class ScalingConfig:
    """How many workers train, and what each reserves.

    ``num_workers`` workers (actors), each holding ``resources_per_worker``
    (default ``{"CPU": 1}``, plus ``{"GPU": 1}`` with ``use_gpu=True``),
    placed together as one placement group with ``placement_strategy``
    (``"PACK"`` by default): all of them start, or none does.
    """
    num_workers: int = 1
    use_gpu: bool = False
    resources_per_worker: dict | None = None
    placement_strategy: str = "PACK"

    def __post_init__(self) -> None:
        check_int("ScalingConfig.num_workers", self.num_workers, 1)
        if not isinstance(self.use_gpu, bool):
            raise ValueError(f"ScalingConfig.use_gpu must be True or False, got "
                             f"{self.use_gpu!r}")
        if self.placement_strategy not in PLACEMENT_STRATEGIES:
            raise ValueError(f"ScalingConfig.placement_strategy must be one of "
                             f"{', '.join(PLACEMENT_STRATEGIES)}, got "
                             f"{self.placement_strategy!r}")
        if self.resources_per_worker is not None:
            if not isinstance(self.resources_per_worker, dict):
                raise ValueError(f"ScalingConfig.resources_per_worker must be a dict such as "
                                 f"{{'CPU': 2, 'GPU': 1}}, got {self.resources_per_worker!r}")
            for name, amount in self.resources_per_worker.items():
                if not isinstance(name, str) or not name:
                    raise ValueError(f"ScalingConfig.resources_per_worker: resource names are "
                                     f"strings ('CPU', 'GPU', 'memory' or custom), got "
                                     f"{name!r}")
                if name.lower() in ("cpu", "gpu") and name not in ("CPU", "GPU"):
                    raise ValueError(f"ScalingConfig.resources_per_worker: write "
                                     f"{name.upper()!r}, not {name!r} (resource names are "
                                     f"case-sensitive)")
                if isinstance(amount, bool) or not isinstance(amount, numbers.Real) \
                        or amount < 0:
                    raise ValueError(f"ScalingConfig.resources_per_worker[{name!r}] must be a "
                                     f"number >= 0, got {amount!r}")
            if self.use_gpu and self.resources_per_worker.get("GPU", None) == 0:
                raise ValueError("ScalingConfig: use_gpu=True but resources_per_worker sets "
                                 "'GPU' to 0; drop one of the two")
        if not self.worker_resources():
            raise ValueError("ScalingConfig.resources_per_worker reserves nothing: each "
                             "worker needs some resource (for example {'CPU': 1})")

    def worker_resources(self) -> dict[str, float]:
        """One worker's bundle, as the placement group reserves it."""
        if self.resources_per_worker is None:
            resources = {"CPU": 1.0}
            if self.use_gpu:
                resources["GPU"] = 1.0
            return resources
        resources = {name: float(amount) for name, amount in self.resources_per_worker.items()
                     if amount}
        if self.use_gpu:
            resources.setdefault("GPU", 1.0)
        return resources

    @property
    def uses_gpu(self) -> bool:
        return self.worker_resources().get("GPU", 0) > 0

    def actor_options(self) -> dict:
        """One worker actor's resource options (it fills its bundle exactly)."""
        options: dict[str, Any] = {"num_cpus": 0}
        custom = {}
        for name, amount in self.worker_resources().items():
            option = _ACTOR_OPTION_OF.get(name)
            if option is not None:
                options[option] = amount
            else:
                custom[name] = amount
        if custom:
            options["resources"] = custom
        return options


@dataclass
class CheckpointConfig:
    """Which checkpoints stay on storage: with ``num_to_keep``, that many —
    the best by ``checkpoint_score_attribute`` (``checkpoint_score_order``
    ``"max"`` or ``"min"``), or the most recent without one. The latest
    checkpoint always stays as well: it is what a restart resumes from.
    ``None`` keeps every checkpoint."""
    num_to_keep: int | None = None
    checkpoint_score_attribute: str | None = None
    checkpoint_score_order: str = "max"

    def __post_init__(self) -> None:
        check_int("CheckpointConfig.num_to_keep", self.num_to_keep, 1, allow_none=True)
        if self.checkpoint_score_attribute is not None and \
                not isinstance(self.checkpoint_score_attribute, str):
            raise ValueError(f"CheckpointConfig.checkpoint_score_attribute must be a metric "
                             f"name, got {self.checkpoint_score_attribute!r}")
        if self.checkpoint_score_order not in ("min", "max"):
            raise ValueError(f"CheckpointConfig.checkpoint_score_order must be 'min' or "
                             f"'max', got {self.checkpoint_score_order!r}")


@dataclass
class FailureConfig:
    """``max_failures``: how many times the worker group is torn down and
    started again (from the latest checkpoint) after a failure — a worker
    that died or raised; ``-1`` without limit, ``0`` (the default) never.
    ``controller_failure_limit`` (Ray Train's): how many times a group that
    did not start in time (the cluster lacked the resources) is scheduled
    again; ``-1`` (the default) without limit: a run waits for resources."""
    max_failures: int = 0
    controller_failure_limit: int = -1

    def __post_init__(self) -> None:
        check_int("FailureConfig.max_failures", self.max_failures, -1)
        check_int("FailureConfig.controller_failure_limit", self.controller_failure_limit, -1)


@dataclass
class RunConfig:
    """Where the run's results and checkpoints go (``storage_path/name/``;
    ``storage_path`` defaults to ``~/tray_results``, ``name`` to
    ``tray_train_<date>``), which checkpoints stay, how failures are
    handled, and ``verbose`` (0: silent; 1, the default: a table row per
    report and a line per restart)."""
    name: str | None = None
    storage_path: str | None = None
    checkpoint_config: CheckpointConfig | None = None
    failure_config: FailureConfig | None = None
    verbose: int = 1

    def __post_init__(self) -> None:
        if self.name is not None and (not isinstance(self.name, str) or not self.name
                                      or "/" in self.name or self.name in (".", "..")):
            raise ValueError(f"RunConfig.name must be a plain directory name, got "
                             f"{self.name!r}")
        if self.storage_path is not None and not isinstance(self.storage_path, str):
            raise ValueError(f"RunConfig.storage_path must be a directory path (a string), "
                             f"got {self.storage_path!r}")
        if self.checkpoint_config is None:
            self.checkpoint_config = CheckpointConfig()
        if self.failure_config is None:
            self.failure_config = FailureConfig()
        if not isinstance(self.checkpoint_config, CheckpointConfig):
            raise ValueError(f"RunConfig.checkpoint_config must be a tray.train."
                             f"CheckpointConfig, got {type(self.checkpoint_config).__name__}")
        if not isinstance(self.failure_config, FailureConfig):
            raise ValueError(f"RunConfig.failure_config must be a tray.train.FailureConfig, "
                             f"got {type(self.failure_config).__name__}")
        if self.verbose not in (0, 1):
            raise ValueError(f"RunConfig.verbose must be 0 or 1, got {self.verbose!r}")


for _cls in (ScalingConfig, CheckpointConfig, FailureConfig, RunConfig):
    _cls.__module__ = "tray.train"
del _cls
