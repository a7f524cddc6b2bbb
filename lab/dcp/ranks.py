"""W real ranks on one host for the GPU tools: NCCL on GPUs, gloo on CPU (a dry run).

One copy of what every tool needs to start them: the environment that keeps NVLink
multicast off, a free rendezvous port, and the process group of each rank.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

__all__ = ["SAFE_ENV", "spawn", "join"]

# NVLink multicast off in NCCL, PyTorch and NVSHMEM: the GPU hosts we borrow are shared,
# and a program that uses multicast there can take every GPU of the host out of service.
SAFE_ENV = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}


def spawn(worker: Callable[..., None], world_size: int, *args: Any) -> None:
    """``worker(rank, world_size, port, *args)`` in ``world_size`` processes; joins them."""
    os.environ.update(SAFE_ENV)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(worker, args=(world_size, port, *args), nprocs=world_size, join=True)


def join(rank: int, world_size: int, port: int, cuda: bool) -> torch.device:
    """This rank's process group (NCCL bound to GPU ``rank``, else gloo) and device."""
    os.environ.update(SAFE_ENV, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    device = torch.device("cuda", rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    dist.init_process_group(
        "nccl" if cuda else "gloo",
        rank=rank,
        world_size=world_size,
        device_id=device if cuda else None,
    )
    return device
