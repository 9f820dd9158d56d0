"""Inside a TorchTrainer's training function: ``get_device``,
``prepare_model`` (DDP) and ``prepare_data_loader`` (DistributedSampler),
as Ray Train's ``ray.train.torch`` utilities.

They read the worker's place from the session, so the same function runs
unchanged with one worker or many: at world size 1 the model is not
wrapped and the loader keeps its sampler. Outside a training function they
act as on a single worker.
"""

from __future__ import annotations

import collections.abc
import os

import torch
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, IterableDataset, SequentialSampler

import tray

from .._session import current_session


def _world() -> tuple[int, int, int]:
    """(world rank, world size, local rank) of this worker; (0, 1, 0) outside one."""
    session = current_session()
    if session is None:
        return 0, 1, 0
    worker = session.worker
    return worker.world_rank, worker.world_size, worker.local_rank


def get_device() -> torch.device:
    """The device this worker trains on: its GPU when it reserved one, else the CPU."""
    if not torch.cuda.is_available():
        return torch.device("cpu")
    try:
        gpu_ids = tray.get_gpu_ids()
    except Exception:  # noqa: BLE001 - outside tray: the first GPU
        gpu_ids = []
    if not gpu_ids:
        return torch.device("cuda:0") if current_session() is None else torch.device("cpu")
    if os.environ.get("CUDA_VISIBLE_DEVICES"):
        return torch.device("cuda:0")  # the reserved GPU is the first one visible
    return torch.device(f"cuda:{int(gpu_ids[0])}")


def prepare_model(model: torch.nn.Module, move_to_device: bool = True,
                  parallel_strategy: str | None = "ddp",
                  parallel_strategy_kwargs: dict | None = None) -> torch.nn.Module:
    """Move ``model`` to this worker's device and, with more than one
    worker, wrap it in ``DistributedDataParallel`` (gradients averaged over
    the workers at every backward pass)."""
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"prepare_model takes a torch.nn.Module, got {type(model).__name__}")
    if parallel_strategy not in ("ddp", None):
        raise ValueError(f"prepare_model: parallel_strategy must be 'ddp' or None (tray.train "
                         f"has no FSDP support yet), got {parallel_strategy!r}")
    _, world_size, _ = _world()
    device = get_device()
    if move_to_device:
        model = model.to(device)
    if parallel_strategy == "ddp" and world_size > 1:
        import torch.distributed as dist

        if not dist.is_initialized():
            raise RuntimeError("prepare_model: there is no torch process group; use a "
                               "TorchTrainer (a DataParallelTrainer sets none up)")
        kwargs = dict(parallel_strategy_kwargs or {})
        if device.type == "cuda":
            kwargs.setdefault("device_ids", [device.index])
            kwargs.setdefault("output_device", device.index)
        model = DistributedDataParallel(model, **kwargs)
    return model


class _DeviceDataLoader(DataLoader):
    """A DataLoader whose batches arrive on the worker's device. It shares
    the wrapped loader's attributes (``sampler``, ``dataset``,
    ``batch_size``), so ``loader.sampler.set_epoch(epoch)`` works."""

    def __init__(self, base: DataLoader, device: torch.device) -> None:
        # DataLoader forbids setting some attributes after its __init__; take
        # the base loader's state wholesale instead, as Ray's wrapper does.
        self.__dict__.update(getattr(base, "__dict__", {}))
        self._base_loader = base
        self._device = device

    def _move(self, item):
        if isinstance(item, torch.Tensor):
            return item.to(self._device, non_blocking=self._device.type == "cuda")
        if isinstance(item, collections.abc.Mapping):
            return {key: self._move(value) for key, value in item.items()}
        if isinstance(item, tuple) and hasattr(item, "_fields"):
            return type(item)(*(self._move(value) for value in item))
        if isinstance(item, (list, tuple)):
            return type(item)(self._move(value) for value in item)
        return item

    def __iter__(self):
        for batch in self._base_loader:
            yield self._move(batch)

    def __len__(self) -> int:
        return len(self._base_loader)


def prepare_data_loader(data_loader: DataLoader, add_dist_sampler: bool = True,
                        move_to_device: bool = True,
                        auto_transfer: bool = False) -> DataLoader:
    """With more than one worker, give ``data_loader`` a
    ``DistributedSampler`` (each worker reads its own 1/world_size of the
    dataset; shuffled when the loader shuffled — call
    ``loader.sampler.set_epoch(epoch)`` each epoch, as with torch); with
    ``move_to_device``, batches arrive on ``get_device()``."""
    if not isinstance(data_loader, DataLoader):
        raise TypeError(f"prepare_data_loader takes a torch DataLoader, got "
                        f"{type(data_loader).__name__}")
    rank, world_size, _ = _world()
    if world_size > 1 and add_dist_sampler and \
            not isinstance(data_loader.sampler, DistributedSampler) and \
            not isinstance(data_loader.dataset, IterableDataset):
        shuffle = not isinstance(data_loader.sampler, SequentialSampler)
        kwargs = {
            "batch_size": data_loader.batch_size, "shuffle": False,
            "sampler": DistributedSampler(data_loader.dataset, num_replicas=world_size,
                                          rank=rank, shuffle=shuffle),
            "num_workers": data_loader.num_workers, "collate_fn": data_loader.collate_fn,
            "pin_memory": data_loader.pin_memory, "drop_last": data_loader.drop_last,
            "timeout": data_loader.timeout, "worker_init_fn": data_loader.worker_init_fn,
            "generator": data_loader.generator,
        }
        if data_loader.num_workers > 0:
            kwargs["persistent_workers"] = data_loader.persistent_workers
            kwargs["prefetch_factor"] = data_loader.prefetch_factor
        data_loader = DataLoader(data_loader.dataset, **kwargs)
    if move_to_device:
        data_loader = _DeviceDataLoader(data_loader, get_device())
    return data_loader


for _obj in (get_device, prepare_model, prepare_data_loader):
    _obj.__module__ = "tray.train.torch"
del _obj
