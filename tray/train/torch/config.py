"""The torch process group of a TorchTrainer's workers.

After the group is placed, rank 0's worker picks the rendezvous address and
a free port on its node, and the driver hands them to every worker, which
sets the variables torchrun sets (``MASTER_ADDR``, ``MASTER_PORT``,
``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``,
``GROUP_RANK``/``NODE_RANK``) and joins ``init_process_group`` with the
``env://`` method: gloo on CPUs, nccl when the workers have GPUs. After a
successful run every worker destroys its group; after a failure the
workers are killed, which ends theirs.

The rendezvous address is 127.0.0.1 when rank 0's node talks over Unix
sockets (one machine), its TCP address otherwise.

In the simulator every worker lives in the one OS process, and torch
allows one default process group per process (its rendezvous also blocks
on real sockets, outside virtual time). So a TorchTrainer there runs with
``num_workers=1`` only, and without a process group: ``prepare_model``
and ``prepare_data_loader`` need none at world size 1. More workers are
refused before anything starts.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import socket
import sys
from dataclasses import dataclass

import tray

LOOPBACK = "127.0.0.1"


@dataclass
class TorchConfig:
    """``backend``: "gloo" or "nccl" (None: nccl with GPUs, else gloo);
    ``init_method``: "env" (the rendezvous through MASTER_ADDR/PORT);
    ``timeout_s``: how long collectives wait for a missing peer."""
    backend: str | None = None
    init_method: str = "env"
    timeout_s: int = 1800

    def __post_init__(self) -> None:
        if self.backend not in (None, "gloo", "nccl"):
            raise ValueError(f"TorchConfig.backend must be 'gloo', 'nccl' or None, got "
                             f"{self.backend!r}")
        if self.init_method != "env":
            raise ValueError(f"TorchConfig.init_method: only 'env' is supported, got "
                             f"{self.init_method!r}")
        if isinstance(self.timeout_s, bool) or not isinstance(self.timeout_s, (int, float)) \
                or self.timeout_s <= 0:
            raise ValueError(f"TorchConfig.timeout_s must be a positive number, got "
                             f"{self.timeout_s!r}")


TorchConfig.__module__ = "tray.train.torch"


def _node_address() -> str:
    """The address peers reach this node at: loopback on one machine."""
    here = tray.get_runtime_context().get_node_id()
    for node in tray.nodes():
        if node.get("NodeID") != here:
            continue
        address = str(node.get("NodeManagerAddress", ""))
        if address.startswith("tcp:"):
            address = address[len("tcp:"):]
        host = address.rsplit(":", 1)[0] if ":" in address else ""
        try:
            ip = ipaddress.ip_address(host)
        except ValueError:
            return LOOPBACK
        return LOOPBACK if ip.is_unspecified else str(ip)
    return LOOPBACK


def rendezvous_address() -> tuple[str, int]:
    """Run on rank 0: the address and a free port for the process group."""
    address = _node_address()
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((address, 0))
        port = probe.getsockname()[1]
    return address, port


def init_process_group(backend: str | None, address: str, port: int, info,
                       timeout_s: float) -> str:
    """Run on every worker at once: join the process group (returns the backend)."""
    import torch
    import torch.distributed as dist

    if backend is None:
        backend = "nccl" if torch.cuda.is_available() and tray.get_gpu_ids() else "gloo"
    os.environ.update({
        "MASTER_ADDR": address, "MASTER_PORT": str(port),
        "RANK": str(info.world_rank), "WORLD_SIZE": str(info.world_size),
        "LOCAL_RANK": str(info.local_rank), "LOCAL_WORLD_SIZE": str(info.local_world_size),
        "GROUP_RANK": str(info.node_rank), "NODE_RANK": str(info.node_rank),
    })
    if address == LOOPBACK and sys.platform.startswith("linux"):
        # gloo would otherwise bind the interface its hostname resolves to.
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    if dist.is_initialized():
        dist.destroy_process_group()
    if backend == "nccl":
        torch.cuda.set_device(info.local_rank % max(1, torch.cuda.device_count()))
    dist.init_process_group(backend=backend, init_method="env://", rank=info.world_rank,
                            world_size=info.world_size,
                            timeout=datetime.timedelta(seconds=timeout_s))
    return backend


def destroy_process_group() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()
