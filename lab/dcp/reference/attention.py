"""Sparse MLA attention at DCP1 and on one DCP rank, and stage 9's prefill gather.

- lookup: ``filter_and_convert`` has the semantics of vLLM's
  ``triton_filter_and_convert_dcp_index(..., return_valid_counts=True)``;
- per-rank attention over the gathered heads, base-2 LSE of the
  ``sm_scale``-scaled logits, SWA window and sink on rank 0 only, empty rows
  LSE ``-1e30`` and output 0, then the combine (``combine``);
- stage 9's prefill gather (rank-major paged buffer plus remapped slots).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, fields

import torch

from lab.dcp.reference.combine import COMBINES, AttnOut, Combine
from lab.dcp.reference.groups import Group
from lab.dcp.reference.shards import (
    PagedCache,
    ShardLayout,
    local_index,
    owner_rank,
    prefill_remap,
)

LOG2E = math.log2(math.e)
# The SM120 sparse-MLA kernel's LSE for a row with no candidate and no sink.
EMPTY_LSE = -1e30


# ---- inputs ---------------------------------------------------------------


@dataclass(frozen=True)
class Step:
    """One attention step, identical on every rank (before sharding)."""

    q: torch.Tensor  # [T, H*W, D], gathered heads in TP order
    states: tuple[torch.Tensor, ...]  # per request [n_states, D], global ids
    topk_ids: torch.Tensor  # int32 [T, topk] global compressed ids, -1 tail
    token_to_req: torch.Tensor  # int32 [T]
    is_valid: torch.Tensor  # bool [T]; False rows attend nothing (graph padding)
    swa_cache: torch.Tensor  # [S, D], replicated on every rank
    swa_indices: torch.Tensor  # int32 [T, 1, width]
    swa_lens: torch.Tensor  # int32 [T]
    sink: torch.Tensor  # fp32 [H*W]
    sm_scale: float
    v_dim: int  # value = state[..., :v_dim] (MLA latent)

    @property
    def heads(self) -> int:
        return self.q.shape[1]

    def to(self, device: torch.device | str) -> Step:
        def move(v):
            return v.to(device) if isinstance(v, torch.Tensor) else v

        moved = {f.name: move(getattr(self, f.name)) for f in fields(self)}
        moved["states"] = tuple(move(s) for s in self.states)
        return Step(**moved)


@dataclass(frozen=True)
class Source:
    """One candidate segment: slots into ``flat`` (-1 skipped), first ``lens`` read."""

    flat: torch.Tensor  # [N, D]
    slots: torch.Tensor  # int [T, n]
    lens: torch.Tensor | None  # int [T]


@dataclass(frozen=True)
class PrefillGather:
    """Stage 9 result: what ``_dcp_prefill_gather`` returns."""

    kv: torch.Tensor  # [W * P_total, page_size, ...], rank-major per request
    slots: torch.Tensor  # int32 [T, topk]
    lens: torch.Tensor  # int32 [T]


# ---- attention --------------------------------------------------------------


def _gather(src: Source) -> tuple[torch.Tensor, torch.Tensor]:
    """Keys [T, n, D] (fp32, zero where unused) and the use mask [T, n]."""
    n = src.slots.shape[-1]
    use = src.slots >= 0
    if src.lens is not None:
        use &= torch.arange(n, device=src.slots.device) < src.lens[:, None]
    keys = src.flat[src.slots.long().clamp_min(0)].float()
    # where, not multiply: unused slots may hold NaN poison.
    return torch.where(use[..., None], keys, torch.zeros_like(keys)), use


def sparse_attention(
    q: torch.Tensor,
    sources: Sequence[Source],
    sm_scale: float,
    v_dim: int,
    sink: torch.Tensor | None,
    out_dtype: torch.dtype,
) -> AttnOut:
    """Sparse MLA over the union of ``sources``, fp32 math like the kernel.

    LSE is base 2 of the ``sm_scale``-scaled logits with the sink folded in as
    ``log2(2^lse + 2^(sink*log2 e))``; a row with no candidate and no sink gets
    LSE ``EMPTY_LSE`` and output 0.
    """
    t, h, _ = q.shape
    gathered = [_gather(s) for s in sources]
    keys = torch.cat([k for k, _ in gathered], dim=1)
    use = torch.cat([u for _, u in gathered], dim=1)
    logits = torch.einsum("thd,tnd->thn", q.float(), keys) * sm_scale
    logits = logits.masked_fill(~use[:, None, :], -math.inf)
    if sink is not None:
        sink_col = sink.float()[None, :, None].expand(t, h, 1)
        logits = torch.cat([logits, sink_col], dim=-1)
    m = logits.amax(dim=-1, keepdim=True)
    m = torch.where(torch.isinf(m), torch.zeros_like(m), m)
    p = torch.exp(logits - m)
    z = p.sum(dim=-1)
    num = torch.einsum("thn,tnd->thd", p[..., : keys.shape[1]], keys[..., :v_dim])
    has_mass = z > 0
    out = torch.where(has_mass[..., None], num / z.clamp_min(1e-38)[..., None], 0.0)
    lse = torch.where(has_mass, (torch.log(z) + m[..., 0]) * LOG2E, EMPTY_LSE)
    return AttnOut(out.to(out_dtype), lse.float())


def convert_dcp1(
    ids: torch.Tensor, token_to_req: torch.Tensor, cache: PagedCache, is_valid: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """DCP1 ``compute_global_topk_indices_and_lens``: slots in place, valid count."""
    bs = cache.pool.shape[1]
    valid = ids >= 0
    st = ids.long().clamp_min(0)
    page = cache.block_table[token_to_req.long()[:, None], st // bs].long()
    slots = torch.where(valid, page * bs + st % bs, -1).to(torch.int32)
    lens = valid.sum(dim=-1, dtype=torch.int32).masked_fill(~is_valid, 0)
    return slots, lens


def dcp1_attention(step: Step, cache: PagedCache, out_dtype: torch.dtype) -> AttnOut:
    """The single-rank reference: every candidate, the SWA window and the sink."""
    slots, lens = convert_dcp1(step.topk_ids, step.token_to_req, cache, step.is_valid)
    t = step.q.shape[0]
    sources = [
        Source(step.swa_cache, step.swa_indices.reshape(t, -1), step.swa_lens),
        Source(cache.flat, slots, lens),
    ]
    return sparse_attention(step.q, sources, step.sm_scale, step.v_dim, step.sink, out_dtype)


# ---- DCP W ------------------------------------------------------------------


def filter_and_convert(
    ids: torch.Tensor,
    token_to_req: torch.Tensor,
    block_table: torch.Tensor,
    layout: ShardLayout,
    rank: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``triton_filter_and_convert_dcp_index(..., return_valid_counts=True)``.

    Keep the ids this rank owns, map them through its block table and compact
    them to a prefix (stable order, -1 tail); also return the per-row count.
    Ids whose local page is past the table width are dropped, like the kernel.
    """
    bs = layout.page_size
    st = ids.long().clamp_min(0)
    local = local_index(st, layout.world_size, layout.interleave)
    page_id = local // bs
    in_table = page_id < block_table.shape[1]
    mine = owner_rank(st, layout.world_size, layout.interleave) == rank
    keep = (ids >= 0) & mine & in_table
    rows = token_to_req.long()[:, None].expand_as(st)
    page = block_table[rows, page_id.clamp_max(block_table.shape[1] - 1)].long()
    slot = torch.where(keep, page * bs + local % bs, -1)
    order = torch.argsort((~keep).to(torch.int8), dim=-1, stable=True)
    return slot.gather(-1, order).to(torch.int32), keep.sum(dim=-1, dtype=torch.int32)


def neutral_swa(num_tokens: int, width: int, device: torch.device | str = "cpu"):
    """``_dcp_neutral_swa``: all -1 SWA rows ``[T, 1, width]`` and zero lengths."""
    return (
        torch.full((num_tokens, 1, width), -1, dtype=torch.int32, device=device),
        torch.zeros(num_tokens, dtype=torch.int32, device=device),
    )


def gathered_sink(group: Group, local_sink: torch.Tensor) -> torch.Tensor:
    """``_dcp_attn_sink``: every rank's local sinks in TP head order."""
    return group.all_gather(local_sink.contiguous(), dim=0)


def rank_attention(
    group: Group, step: Step, cache: PagedCache, layout: ShardLayout, out_dtype: torch.dtype
) -> AttnOut:
    """One rank's partial attention over its shard for all gathered heads."""
    rank, w = group.rank_in_group, group.world_size
    h = step.heads // w
    heads = slice(rank * h, (rank + 1) * h)
    sink = gathered_sink(group, step.sink[heads])
    q = group.all_gather(step.q[:, heads].contiguous(), dim=1)
    slots, lens = filter_and_convert(
        step.topk_ids, step.token_to_req, cache.block_table, layout, rank
    )
    lens = lens.masked_fill(~step.is_valid, 0)  # graph padding rows: patch 09 does this
    t = q.shape[0]
    swa_idx, swa_lens = step.swa_indices, step.swa_lens
    if rank != 0:
        swa_idx, swa_lens = neutral_swa(t, swa_idx.shape[-1], q.device)
    sources = [
        Source(step.swa_cache, swa_idx.reshape(t, -1), swa_lens),
        Source(cache.flat, slots, lens),
    ]
    return sparse_attention(
        q, sources, step.sm_scale, step.v_dim, sink if rank == 0 else None, out_dtype
    )


def dcp_attention(
    group: Group,
    step: Step,
    cache: PagedCache,
    layout: ShardLayout,
    combine: Combine,
    out_dtype: torch.dtype,
) -> AttnOut:
    """``_run_sm120_dcp`` on one rank: partial attention, then the combine.

    Returns this rank's own heads ``[T, H, v_dim]`` and their merged LSE.
    """
    part = rank_attention(group, step, cache, layout, out_dtype)
    return COMBINES[combine](group, part)


# ---- stage 9: prefill gather ------------------------------------------------


def prefill_geometry(
    seq_lens: Sequence[int], compress_ratio: int, page_size: int, world_size: int
) -> tuple[list[int], list[int]]:
    """Pages per rank of each prefill request (at least 1) and its first page."""
    span = page_size * world_size
    pages = [max(1, -(-(int(sl) // compress_ratio) // span)) for sl in seq_lens]
    base = [0]
    for p in pages[:-1]:
        base.append(base[-1] + world_size * p)
    return pages, base


def prefill_gather(
    group: Group,
    cache: PagedCache,
    layout: ShardLayout,
    seq_lens: Sequence[int],
    compress_ratio: int,
    num_decodes: int,
    topk_ids: torch.Tensor,
    token_to_req: torch.Tensor,
    is_valid: torch.Tensor,
) -> PrefillGather:
    """``_dcp_prefill_gather`` on one rank (``seq_lens`` of the prefills only)."""
    w, bs = layout.world_size, layout.page_size
    pages, base = prefill_geometry(seq_lens, compress_ratio, bs, w)
    parts = []
    for i, p in enumerate(pages):
        page_ids = cache.block_table[num_decodes + i, :p].long()
        parts.append(group.all_gather(cache.pool.index_select(0, page_ids), dim=0))
    kv = torch.cat(parts, dim=0)
    req = (token_to_req.long() - num_decodes).clamp(0, max(len(pages) - 1, 0))
    dev = topk_ids.device
    base_t = torch.tensor(base, dtype=torch.int64, device=dev)[req][:, None]
    pages_t = torch.tensor(pages, dtype=torch.int64, device=dev)[req][:, None]
    slots = prefill_remap(topk_ids, base_t, pages_t, w, layout.interleave, bs)
    lens = (topk_ids >= 0).sum(dim=-1, dtype=torch.int32).masked_fill(~is_valid, 0)
    return PrefillGather(kv, slots.to(torch.int32), lens)


def prefill_attention(step: Step, gathered: PrefillGather, out_dtype: torch.dtype) -> AttnOut:
    """Stage 9 attention: the DCP1 kernel call over the gathered buffer, all heads."""
    t = step.q.shape[0]
    flat = gathered.kv.reshape(-1, gathered.kv.shape[-1])
    sources = [
        Source(step.swa_cache, step.swa_indices.reshape(t, -1), step.swa_lens),
        Source(flat, gathered.slots, gathered.lens),
    ]
    return sparse_attention(step.q, sources, step.sm_scale, step.v_dim, step.sink, out_dtype)
