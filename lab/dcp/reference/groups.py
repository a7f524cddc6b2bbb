"""The collectives DCP uses, over a real process group or W emulated ranks.

Everything in the reference model is per-rank SPMD code over a ``Group``
(``all_gather`` / ``reduce_scatter`` / ``all_to_all``, vLLM's ``GroupCoordinator``
signatures, so a ``Group`` can be set as ``dcp_group`` on the patched attention
class): ``TorchGroup`` wraps a real ``torch.distributed`` group (gloo on CPU, NCCL
on GPU); ``run_spmd`` runs W ranks as threads in one process for fast property tests.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Protocol, TypeVar

import torch
import torch.distributed as dist

R = TypeVar("R")


class Group(Protocol):
    """The per-rank collectives the DCP path uses (vLLM GroupCoordinator shape)."""

    world_size: int
    rank_in_group: int

    def all_gather(self, x: torch.Tensor, dim: int = 0) -> torch.Tensor: ...

    def reduce_scatter(self, x: torch.Tensor, dim: int = 0) -> torch.Tensor: ...

    def all_to_all(self, x: torch.Tensor) -> torch.Tensor: ...


class TorchGroup:
    """``Group`` over a real ``torch.distributed`` process group."""

    def __init__(self, pg: dist.ProcessGroup | None = None) -> None:
        self.pg = pg
        self.world_size = dist.get_world_size(pg)
        self.rank_in_group = dist.get_rank(pg)

    def all_gather(self, x: torch.Tensor, dim: int = 0) -> torch.Tensor:
        x = x.contiguous()
        parts = [torch.empty_like(x) for _ in range(self.world_size)]
        dist.all_gather(parts, x, group=self.pg)
        return torch.cat(parts, dim=dim)

    def reduce_scatter(self, x: torch.Tensor, dim: int = 0) -> torch.Tensor:
        chunks = [c.contiguous() for c in x.chunk(self.world_size, dim=dim)]
        out = torch.empty_like(chunks[0])
        dist.reduce_scatter(out, chunks, group=self.pg)
        return out

    def all_to_all(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        out = torch.empty_like(x)
        dist.all_to_all_single(out, x, group=self.pg)
        return out


class _Rendezvous:
    """Shared exchange point of the W emulated ranks (one per ``run_spmd``)."""

    def __init__(self, world_size: int, timeout: float) -> None:
        self.barrier = threading.Barrier(world_size, timeout=timeout)
        self.slots: list[torch.Tensor | None] = [None] * world_size

    def exchange(self, rank: int, x: torch.Tensor) -> list[torch.Tensor]:
        self.slots[rank] = x
        self.barrier.wait()
        parts = [p for p in self.slots if p is not None]
        # Second barrier: nobody overwrites a slot before everyone has read it.
        self.barrier.wait()
        return parts


class ThreadGroup:
    """One rank's handle on the in-process W-rank emulation."""

    def __init__(self, rendezvous: _Rendezvous, rank: int, world_size: int) -> None:
        self._rz = rendezvous
        self.rank_in_group = rank
        self.world_size = world_size

    def all_gather(self, x: torch.Tensor, dim: int = 0) -> torch.Tensor:
        return torch.cat(self._rz.exchange(self.rank_in_group, x.clone()), dim=dim)

    def reduce_scatter(self, x: torch.Tensor, dim: int = 0) -> torch.Tensor:
        parts = self._rz.exchange(self.rank_in_group, x.clone())
        total = parts[0].clone()
        for p in parts[1:]:
            total += p  # in the tensor's dtype, rank order, like a ring reduce
        return total.chunk(self.world_size, dim=dim)[self.rank_in_group].contiguous()

    def all_to_all(self, x: torch.Tensor) -> torch.Tensor:
        parts = self._rz.exchange(self.rank_in_group, x.clone())
        mine = [p.chunk(self.world_size, dim=0)[self.rank_in_group] for p in parts]
        return torch.cat(mine, dim=0)


def run_spmd(world_size: int, fn: Callable[[Group], R], timeout: float = 60.0) -> list[R]:
    """Run ``fn(group)`` on ``world_size`` emulated ranks (threads); results by rank."""
    rz = _Rendezvous(world_size, timeout)
    results: list[R | None] = [None] * world_size
    errors: list[BaseException] = []

    def body(rank: int) -> None:
        try:
            results[rank] = fn(ThreadGroup(rz, rank, world_size))
        except BaseException as exc:  # re-raised below in the caller
            errors.append(exc)
            rz.barrier.abort()  # wake the other ranks instead of hanging

    threads = [threading.Thread(target=body, args=(r,)) for r in range(world_size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        real = [e for e in errors if not isinstance(e, threading.BrokenBarrierError)]
        raise (real or errors)[0]
    return results  # type: ignore[return-value]
