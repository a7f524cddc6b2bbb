"""Where DCP keeps each compressed state: the ownership formulas and the sharded caches.

Compressed state ``s`` lives on rank ``(s // K) % W`` at local index
``(s // (K*W)) * K + s % K``. Lookup (``owner_rank``, ``local_index``, and its
inverse ``global_position``) and placement (``placement``, vLLM's slot-mapping
form with virtual blocks of ``page_size * W`` states) are written as two
independent formulas on purpose: the tests prove they agree.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class ShardLayout:
    """How DCP shards the compressed cache: ``world_size`` ranks, interleave ``K``,
    states per page."""

    world_size: int
    interleave: int
    page_size: int

    def __post_init__(self) -> None:
        # vLLM asserts this too: an interleave group never straddles a page.
        if self.page_size % self.interleave:
            raise ValueError(f"page_size {self.page_size} % interleave {self.interleave} != 0")


# ---- index formulas ---------------------------------------------------------


def owner_rank(ids: torch.Tensor, world_size: int, interleave: int) -> torch.Tensor:
    """Rank owning global compressed id ``ids`` (lookup side, Triton kernel form)."""
    return (ids // interleave) % world_size


def local_index(ids: torch.Tensor, world_size: int, interleave: int) -> torch.Tensor:
    """Index of global id ``ids`` inside its owner's local sequence (lookup side)."""
    return (ids // (interleave * world_size)) * interleave + ids % interleave


def global_position(
    local: torch.Tensor, rank: int, world_size: int, interleave: int
) -> torch.Tensor:
    """Global position of ``rank``'s local column ``local`` (inverse of ``local_index``)."""
    per = interleave * world_size
    return (local // interleave) * per + rank * interleave + local % interleave


def placement(
    ids: torch.Tensor, world_size: int, interleave: int, page_size: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Where vLLM's slot mapping writes state ``ids``: (rank, local page, offset).

    Mirrors the DCP branch of ``vllm/v1/worker/block_table.py`` (virtual blocks
    of ``page_size * world_size`` states), deliberately not ``owner_rank``.
    """
    span = page_size * world_size
    vblock, voff = ids // span, ids % span
    rank = (voff // interleave) % world_size
    offset = (voff // (world_size * interleave)) * interleave + voff % interleave
    return rank, vblock, offset


def prefill_remap(
    ids: torch.Tensor,
    base: torch.Tensor,
    pages: torch.Tensor,
    world_size: int,
    interleave: int,
    page_size: int,
) -> torch.Tensor:
    """Stage 9: global id -> slot in the rank-major gathered buffer (-1 kept).

    ``base``/``pages`` are per row ([T, 1]): the request's first gathered page and
    its page count per rank. ``slot = (base + owner*pages + vblock)*bs + loff``.
    """
    st = ids.long().clamp_min(0)
    span = page_size * world_size
    vblock, off = st // span, st % span
    owner = (off // interleave) % world_size
    loff = (off // (interleave * world_size)) * interleave + off % interleave
    slot = (base + owner * pages + vblock) * page_size + loff
    return torch.where(ids >= 0, slot, torch.full_like(slot, -1))


# ---- sharded paged caches ---------------------------------------------------


@dataclass(frozen=True)
class PagedCache:
    """One rank's compressed cache: ``pool [pages, page_size, D]`` + block table."""

    pool: torch.Tensor
    block_table: torch.Tensor  # int32 [requests, width]; padding points at page 0

    @property
    def flat(self) -> torch.Tensor:
        return self.pool.reshape(-1, self.pool.shape[-1])

    def to(self, device: torch.device | str) -> PagedCache:
        return PagedCache(self.pool.to(device), self.block_table.to(device))


def build_caches(
    states: Sequence[torch.Tensor], layout: ShardLayout, gen: torch.Generator, spare_pages: int = 1
) -> list[PagedCache]:
    """Write the per-request global states into W paged caches (vLLM placement).

    Physical pages are a random permutation; page 0 is a NaN null page that the
    block-table padding points at, and every unwritten slot is NaN, so a wrong
    slot poisons the result instead of passing by luck.
    """
    w, bs = layout.world_size, layout.page_size
    d = states[0].shape[-1]
    vblocks = [max(1, -(-s.shape[0] // (bs * w))) for s in states]
    width = max(vblocks) + 1  # one spare column of padding
    caches = []
    for rank in range(w):
        n_pages = 1 + sum(vblocks) + spare_pages
        pool = torch.full((n_pages, bs, d), math.nan, dtype=states[0].dtype)
        table = torch.zeros((len(states), width), dtype=torch.int32)
        free = (torch.randperm(n_pages - 1, generator=gen) + 1).tolist()
        cache = PagedCache(pool, table)
        for req, s in enumerate(states):
            for vb in range(vblocks[req]):
                table[req, vb] = free.pop()
            write_states(cache, layout, rank, req, torch.arange(s.shape[0]), s)
        caches.append(cache)
    return caches


def write_states(
    cache: PagedCache,
    layout: ShardLayout,
    rank: int,
    req: int,
    ids: torch.Tensor,
    values: torch.Tensor,
) -> None:
    """Write request ``req``'s states ``ids`` (``values``, one row each) into ``rank``'s
    cache in place: only the ids this rank owns, at vLLM's placement (``placement``)."""
    owner, page, off = placement(ids, layout.world_size, layout.interleave, layout.page_size)
    mine = owner == rank
    cache.pool[cache.block_table[req, page[mine]].long(), off[mine]] = values[mine]
