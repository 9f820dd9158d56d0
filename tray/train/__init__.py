"""tray.train: data-parallel training on tray, with Ray Train's API.

``from tray import train``; define ``train_loop_per_worker(config)``,
which calls ``train.report(metrics, checkpoint=...)``; then
``train.torch.TorchTrainer(train_loop_per_worker, scaling_config=
train.ScalingConfig(num_workers=2), run_config=train.RunConfig(...)).fit()``.
The workers are placed together with a placement group (all or none); a
worker that dies or raises brings the whole group down and up again from
the latest checkpoint, up to ``FailureConfig.max_failures`` times.
``tray.train.torch`` (PyTorch: ``pip install 'tray[train]'``) is imported
on first use.
"""

from ._session import TrainContext as TrainContext
from ._session import get_checkpoint as get_checkpoint
from ._session import get_context as get_context
from ._session import get_dataset_shard as get_dataset_shard
from ._session import report as report
from .checkpoint import Checkpoint as Checkpoint
from .config import CheckpointConfig as CheckpointConfig
from .config import FailureConfig as FailureConfig
from .config import RunConfig as RunConfig
from .config import ScalingConfig as ScalingConfig
from .error import TrainingFailedError as TrainingFailedError
from .result import Result as Result
from .trainer import DataParallelTrainer as DataParallelTrainer


def __getattr__(name: str):
    # tray.train.torch imports torch: only when asked for.
    if name == "torch":
        import importlib

        return importlib.import_module(".torch", __name__)
    raise AttributeError(f"module 'tray.train' has no attribute {name!r}")


__all__ = [
    "DataParallelTrainer", "ScalingConfig", "RunConfig", "CheckpointConfig", "FailureConfig",
    "Result", "Checkpoint", "TrainingFailedError", "TrainContext", "report", "get_context",
    "get_checkpoint", "get_dataset_shard",
]
