"""tray.train.torch: PyTorch on tray.train (``pip install 'tray[train]'``):
``TorchTrainer``, ``TorchConfig``, and, inside the training function,
``prepare_model`` (DDP), ``prepare_data_loader`` (DistributedSampler) and
``get_device``."""

try:
    import torch as _torch  # noqa: F401
except ImportError as _error:  # pragma: no cover - depends on the environment
    raise ImportError("tray.train.torch needs PyTorch: pip install 'tray[train]'") from _error

from .config import TorchConfig as TorchConfig
from .torch_trainer import TorchTrainer as TorchTrainer
from .train_loop_utils import get_device as get_device
from .train_loop_utils import prepare_data_loader as prepare_data_loader
from .train_loop_utils import prepare_model as prepare_model

__all__ = ["TorchTrainer", "TorchConfig", "prepare_model", "prepare_data_loader",
           "get_device"]
