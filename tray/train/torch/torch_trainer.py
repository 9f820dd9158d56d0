"""``TorchTrainer``: a DataParallelTrainer whose workers share a torch
process group (see ``config.py`` for how it is set up, and what the
simulator allows)."""

from __future__ import annotations

from collections.abc import Callable

import tray

from ..checkpoint import Checkpoint
from ..config import RunConfig, ScalingConfig
from ..trainer import DataParallelTrainer
from . import config as torch_backend
from .config import TorchConfig


class TorchTrainer(DataParallelTrainer):
    """Runs ``train_loop_per_worker`` on ``num_workers`` workers joined in
    one ``torch.distributed`` process group (gloo on CPUs, nccl on GPUs);
    ``tray.train.torch.prepare_model`` wraps the model in DDP."""

    def __init__(self, train_loop_per_worker: Callable, *, train_loop_config: dict | None = None,
                 torch_config: TorchConfig | None = None,
                 scaling_config: ScalingConfig | None = None,
                 run_config: RunConfig | None = None, datasets: dict | None = None,
                 resume_from_checkpoint: Checkpoint | None = None) -> None:
        super().__init__(train_loop_per_worker, train_loop_config=train_loop_config,
                         scaling_config=scaling_config, run_config=run_config,
                         datasets=datasets, resume_from_checkpoint=resume_from_checkpoint)
        torch_config = torch_config if torch_config is not None else TorchConfig()
        if not isinstance(torch_config, TorchConfig):
            raise TypeError(f"torch_config must be a tray.train.torch.TorchConfig, got "
                            f"{type(torch_config).__name__}")
        self.torch_config = torch_config

    def _check_backend(self, on_simulator: bool) -> None:
        n = self.scaling_config.num_workers
        if on_simulator and n > 1:
            raise RuntimeError(
                f"TorchTrainer(num_workers={n}) cannot run on the simulated backend: every "
                f"simulated worker lives in this one OS process, torch allows one process "
                f"group per process, and its rendezvous blocks on real sockets outside "
                f"virtual time. Run it on real processes (tray.init()), or use num_workers=1 "
                f"(no process group), or a DataParallelTrainer to test the training loop's "
                f"control flow in the simulator.")

    def _setup_backend(self, group, timeout_s: float, on_simulator: bool) -> None:
        if on_simulator:
            return  # one worker, no process group (see config.py)
        address, port = tray.get(group.workers[0].execute.remote(
            torch_backend.rendezvous_address), timeout=timeout_s)
        n = len(group.workers)
        refs = group.execute(torch_backend.init_process_group, [self.torch_config.backend] * n,
                             [address] * n, [port] * n, group.infos,
                             [self.torch_config.timeout_s] * n)
        tray.get(refs, timeout=timeout_s)

    def _teardown_backend(self, group) -> None:
        if group.workers:
            refs = group.execute(torch_backend.destroy_process_group)
            tray.wait(refs, num_returns=len(refs), timeout=10)


TorchTrainer.__module__ = "tray.train.torch"
