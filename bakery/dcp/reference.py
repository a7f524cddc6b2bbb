"""Pure-torch reference model of patch 09's DCP attention math.

Job: state, in plain torch, what DeepSeek-V4.1 sparse MLA under decode context
parallelism (DCP, ``W`` ranks) must compute, so tests can prove that DCP ``W``
reproduces the single-rank (DCP1) softmax and can hold the patched helpers to it:

- placement: compressed state ``s`` lives on rank ``(s // K) % W`` at local index
  ``(s // (K*W)) * K + s % K`` (written here in vLLM's slot-mapping form, with
  virtual blocks of ``page_size * W`` states, so that lookup and placement are
  two independent formulas that must agree);
- lookup: ``filter_and_convert`` has the semantics of vLLM's
  ``triton_filter_and_convert_dcp_index(..., return_valid_counts=True)``;
- per-rank attention over the gathered heads, base-2 LSE of the
  ``sm_scale``-scaled logits, SWA window and sink on rank 0 only, empty rows
  LSE ``-1e30`` and output 0;
- the combine ``L = log2(sum_r 2^L_r)``, ``o = sum_r 2^(L_r - L) o_r`` in the
  ``ag_rs`` and ``a2a`` flavours of ``vllm/v1/attention/ops/dcp.py``;
- stage 9's prefill gather (rank-major paged buffer plus remapped slots);
- stage 4's two-level candidate blocks (block maxima, the pinned newest block,
  canonical top blocks, the consumer mask, the merged token top-k) at DCP1 and
  on a DCP rank, where the source exchanges partial maxima over GLOBAL blocks.

Boundary: no vLLM import and no kernels; everything is per-rank SPMD code over a
``Group`` (``all_gather`` / ``reduce_scatter`` / ``all_to_all``), which is either
a real ``torch.distributed`` group (``TorchGroup``: gloo on CPU, NCCL on GPU) or
the in-process W-rank emulation ``run_spmd`` (threads) used by fast property
tests. The ``Group`` methods match vLLM's ``GroupCoordinator`` signatures, so a
``Group`` can be set as ``dcp_group`` on the patched attention class.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from typing import Literal, Protocol, TypeVar

import torch
import torch.distributed as dist

LOG2E = math.log2(math.e)
# The SM120 sparse-MLA kernel's LSE for a row with no candidate and no sink.
EMPTY_LSE = -1e30

Combine = Literal["ag_rs", "a2a"]
R = TypeVar("R")

# ---- index formulas ---------------------------------------------------------


def owner_rank(ids: torch.Tensor, world_size: int, interleave: int) -> torch.Tensor:
    """Rank owning global compressed id ``ids`` (lookup side, Triton kernel form)."""
    return (ids // interleave) % world_size


def local_index(ids: torch.Tensor, world_size: int, interleave: int) -> torch.Tensor:
    """Index of global id ``ids`` inside its owner's local sequence (lookup side)."""
    return (ids // (interleave * world_size)) * interleave + ids % interleave


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


# ---- collectives ------------------------------------------------------------


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


# ---- inputs and results -----------------------------------------------------


@dataclass(frozen=True)
class Layout:
    """DCP geometry: ``world_size`` ranks, interleave ``K``, states per page."""

    world_size: int
    interleave: int
    page_size: int

    def __post_init__(self) -> None:
        # vLLM asserts this too: an interleave group never straddles a page.
        if self.page_size % self.interleave:
            raise ValueError(f"page_size {self.page_size} % interleave {self.interleave} != 0")


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
class AttnOut:
    out: torch.Tensor  # [T, heads, v_dim]
    lse: torch.Tensor  # fp32 [T, heads], base 2


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
    layout: Layout,
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
    group: Group, step: Step, cache: PagedCache, layout: Layout, out_dtype: torch.dtype
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


def merge_lse(lses: torch.Tensor) -> torch.Tensor:
    """``log2(sum_r 2^L_r)`` over dim 0, max-subtracted like the combine kernels."""
    lses = lses.float()
    lses = torch.where(torch.isnan(lses) | (lses == math.inf), -math.inf, lses)
    m = lses.amax(dim=0)
    m = torch.where(m == -math.inf, torch.zeros_like(m), m)
    return torch.log2(torch.exp2(lses - m).sum(dim=0)) + m


def _weight(lse: torch.Tensor, total: torch.Tensor) -> torch.Tensor:
    w = torch.exp2(lse.float() - total)
    return torch.where(torch.isnan(w), torch.zeros_like(w), w)


def combine_ag_rs(group: Group, part: AttnOut) -> AttnOut:
    """``cp_lse_ag_out_rs``: all-gather the LSE, correct locally, reduce-scatter heads."""
    w, rank = group.world_size, group.rank_in_group
    t, hw = part.lse.shape
    lses = group.all_gather(part.lse.contiguous(), dim=0).reshape(w, t, hw)
    total = merge_lse(lses)
    factor = _weight(part.lse, total)[..., None]
    # The kernel writes the corrected partial back in the output dtype.
    corrected = torch.where(factor == 0, 0.0, part.out.float() * factor).to(part.out.dtype)
    out = group.reduce_scatter(corrected, dim=1)
    h = hw // w
    return AttnOut(out, total[:, rank * h : (rank + 1) * h])


def _pack_lse(lse: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """fp32 LSE as 1 (fp32) or 2 bitcast lanes (16-bit) of ``dtype``, lo half first."""
    lse = lse.float().contiguous()[..., None]
    return lse if dtype == torch.float32 else lse.view(dtype)


def _unpack_lse(lanes: torch.Tensor) -> torch.Tensor:
    return lanes.contiguous().view(torch.float32)[..., 0]


def combine_a2a(group: Group, part: AttnOut) -> AttnOut:
    """``dcp_a2a_lse_reduce``: one all-to-all of packed output+LSE, combine in fp32."""
    w = group.world_size
    t, hw, d = part.out.shape
    h = hw // w
    dtype = part.out.dtype
    # send[r] = the heads rank r owns, with their LSE packed behind the output.
    out_r = part.out.reshape(t, w, h, d).transpose(0, 1)
    lse_r = _pack_lse(part.lse.reshape(t, w, h).transpose(0, 1), dtype)
    send = torch.cat([out_r, lse_r], dim=-1).contiguous()
    recv = group.all_to_all(send)  # recv[s] = rank s's partial for my heads
    outs, lses = recv[..., :d].float(), _unpack_lse(recv[..., d:])
    total = merge_lse(lses)
    weight = _weight(lses, total)[..., None]
    out = torch.where(weight == 0, 0.0, outs * weight).sum(dim=0)
    return AttnOut(out.to(dtype), total)


COMBINES: dict[str, Callable[[Group, AttnOut], AttnOut]] = {
    "ag_rs": combine_ag_rs,
    "a2a": combine_a2a,
}


def dcp_attention(
    group: Group,
    step: Step,
    cache: PagedCache,
    layout: Layout,
    combine: Combine,
    out_dtype: torch.dtype,
) -> AttnOut:
    """``_run_sm120_dcp`` on one rank: partial attention, then the combine.

    Returns this rank's own heads ``[T, H, v_dim]`` and their merged LSE.
    """
    part = rank_attention(group, step, cache, layout, out_dtype)
    return COMBINES[combine](group, part)


# ---- building sharded caches ------------------------------------------------


def build_caches(
    states: Sequence[torch.Tensor], layout: Layout, gen: torch.Generator, spare_pages: int = 1
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
        for req, s in enumerate(states):
            for vb in range(vblocks[req]):
                table[req, vb] = free.pop()
            ids = torch.arange(s.shape[0])
            owner, page, off = placement(ids, w, layout.interleave, bs)
            mine = owner == rank
            pool[table[req, page[mine]].long(), off[mine]] = s[mine]
        caches.append(PagedCache(pool, table))
    return caches


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
    layout: Layout,
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


# ---- random cases -----------------------------------------------------------


def random_topk(gen: torch.Generator, n_states: int, count: int, topk: int) -> torch.Tensor:
    """``count`` distinct ids below ``n_states`` in random order, then a -1 tail."""
    count = min(count, n_states, topk)
    ids = torch.full((topk,), -1, dtype=torch.int32)
    ids[:count] = torch.randperm(n_states, generator=gen)[:count].to(torch.int32)
    return ids


def random_step(
    gen: torch.Generator,
    n_states: Sequence[int],
    tokens: Sequence[int],
    heads: int,
    dim: int = 16,
    v_dim: int = 8,
    topk: int = 8,
    swa_width: int = 4,
    dtype: torch.dtype = torch.float32,
    logit_scale: float = 1.0,
    padding_rows: int = 0,
) -> Step:
    """A random step: request ``b`` has ``n_states[b]`` states and ``tokens[b]`` rows.

    ``padding_rows`` invalid rows (CUDA-graph padding) follow the real ones.
    """

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen).to(dtype)

    states = tuple(randn(n, dim) for n in n_states)
    rows = [b for b, t in enumerate(tokens) for _ in range(t)] + [0] * padding_rows
    t = len(rows)
    ids = (
        torch.stack(
            [
                random_topk(
                    gen, n_states[b], int(torch.randint(0, topk + 1, (1,), generator=gen)), topk
                )
                for b in rows
            ]
        )
        if t
        else torch.empty((0, topk), dtype=torch.int32)
    )
    swa_slots = max(swa_width * 2, 1)
    swa_lens = torch.randint(0, swa_width + 1, (t,), generator=gen, dtype=torch.int32)
    swa_idx = torch.stack([random_topk(gen, swa_slots, int(n), swa_width) for n in swa_lens])
    is_valid = torch.arange(t) < t - padding_rows
    swa_lens = swa_lens.masked_fill(~is_valid, 0)
    return Step(
        q=randn(t, heads, dim) * logit_scale,
        states=states,
        topk_ids=ids,
        token_to_req=torch.tensor(rows, dtype=torch.int32),
        is_valid=is_valid,
        swa_cache=randn(swa_slots, dim),
        swa_indices=swa_idx.reshape(t, 1, swa_width),
        swa_lens=swa_lens,
        sink=torch.randn(heads, generator=gen),
        sm_scale=dim**-0.5,
        v_dim=v_dim,
    )


# ---- stage 4: two-level candidate blocks -------------------------------------
# DeepSeek-V4.1's candidate source layer scores blocks of ``block_size`` request
# positions by their maximum indexer logit (NaN propagates, the row's newest block
# is pinned to +inf), publishes its top ``topk_blocks`` blocks (-1 where the score
# is -inf), and later indexers keep only columns in those blocks before their
# token top-k. Everything here is in the request frame: column = request position,
# ``ends`` = visible positions per row (0 for a padding row). Ties are canonical:
# NaN first, then higher score, then the lower id (torch.topk on CUDA picks the
# first tied index too). Under DCP a rank holds the columns it owns
# (``owner_rank``), at ``local_index``.


def global_position(local: torch.Tensor, rank: int, world_size: int, interleave: int):
    """Global position of ``rank``'s local column ``local`` (inverse of ``local_index``)."""
    per = interleave * world_size
    return (local // interleave) * per + rank * interleave + local % interleave


def shard_columns(
    logits: torch.Tensor, ends: torch.Tensor, rank: int, world_size: int, interleave: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """``rank``'s local logits (its columns, in local order) and local ends."""
    pos = torch.arange(logits.shape[1])
    mine = owner_rank(pos, world_size, interleave) == rank
    local_ends = ((pos[None, :] < ends[:, None]) & mine).sum(1)
    return logits[:, mine], local_ends.to(torch.int32)


def _canonical_order(scores: torch.Tensor) -> torch.Tensor:
    """Column order: NaN first, then descending score, ties by the lower column."""
    return torch.sort(scores, dim=-1, descending=True, stable=True).indices


def block_maxima(logits: torch.Tensor, ends: torch.Tensor, block_size: int, nblocks: int):
    """Per-row block maxima over visible columns (-inf for none; NaN propagates)."""
    rows, n = logits.shape
    wide = torch.full((rows, nblocks * block_size), -math.inf, dtype=torch.float32)
    visible = torch.arange(n)[None, :] < ends[:, None]
    wide[:, :n] = torch.where(visible, logits.float(), -math.inf)
    return wide.view(rows, nblocks, block_size).amax(-1)


def select_blocks(
    scores: torch.Tensor, ends: torch.Tensor, block_size: int, topk_blocks: int
) -> torch.Tensor:
    """Pin each row's newest block, then the canonical top ``topk_blocks`` (-1 tail)."""
    scores = scores.clone()
    rows = torch.nonzero(ends > 0).flatten()
    scores[rows, (ends[rows].long() - 1) // block_size] = math.inf
    order = _canonical_order(scores)[:, :topk_blocks]
    keep = scores.gather(1, order) != -math.inf  # NaN is kept, like the kernel
    out = torch.where(keep, order, -1).to(torch.int32)
    tail = topk_blocks - out.shape[1]
    return torch.nn.functional.pad(out, (0, tail), value=-1) if tail > 0 else out


def candidate_blocks_dcp1(
    logits: torch.Tensor, ends: torch.Tensor, topk_blocks: int, block_size: int
) -> torch.Tensor:
    """The candidate source at DCP1 over request-frame ``logits`` [rows, n]."""
    nblocks = -(-logits.shape[1] // block_size)
    return select_blocks(
        block_maxima(logits, ends, block_size, nblocks), ends, block_size, topk_blocks
    )


def candidate_blocks_dcp(
    group: Group,
    local_logits: torch.Tensor,
    local_ends: torch.Tensor,
    topk_blocks: int,
    block_size: int,
    interleave: int,
    width: int,
) -> torch.Tensor:
    """The candidate source on one DCP rank: the GLOBAL block ids DCP1 publishes.

    Partial maxima over global blocks from this rank's columns, exchanged by an
    all-gather and a NaN-propagating max; the global ends are the sum of the
    ranks' local ends (each position has one owner).
    """
    w, rank = group.world_size, group.rank_in_group
    rows = local_logits.shape[0]
    frame = torch.full((rows, width), -math.inf, dtype=torch.float32)
    local = torch.arange(local_logits.shape[1])
    pos = global_position(local, rank, w, interleave)
    seen = local[None, :] < local_ends[:, None]
    frame[:, pos] = torch.where(seen, local_logits.float(), -math.inf)
    nblocks = -(-width // block_size)
    partial = block_maxima(frame, torch.full((rows,), width), block_size, nblocks)
    scores = group.all_gather(partial[None], dim=0).amax(0)
    ends = group.all_gather(local_ends[None].long(), dim=0).sum(0)
    return select_blocks(scores, ends, block_size, topk_blocks)


def _block_kept(blocks: torch.Tensor, candidates: torch.Tensor) -> torch.Tensor:
    """[rows, n] bool: column block id is one of the row's candidates."""
    return (blocks[..., None] == candidates[:, None, :].long()).any(-1)


def mask_candidates_dcp1(
    logits: torch.Tensor, ends: torch.Tensor, candidates: torch.Tensor, block_size: int
) -> torch.Tensor:
    """A consumer layer at DCP1: -inf outside the visible candidate blocks."""
    cols = torch.arange(logits.shape[1])
    keep = (cols[None, :] < ends[:, None]) & _block_kept(
        (cols // block_size).expand(logits.shape[0], -1), candidates
    )
    return torch.where(keep, logits.float(), -math.inf)


def mask_candidates_dcp(
    local_logits: torch.Tensor,
    local_ends: torch.Tensor,
    candidates: torch.Tensor,
    block_size: int,
    rank: int,
    world_size: int,
    interleave: int,
) -> torch.Tensor:
    """A consumer layer on one DCP rank: local columns mapped to global blocks."""
    local = torch.arange(local_logits.shape[1])
    blocks = global_position(local, rank, world_size, interleave) // block_size
    keep = (local[None, :] < local_ends[:, None]) & _block_kept(
        blocks.expand(local_logits.shape[0], -1), candidates
    )
    return torch.where(keep, local_logits.float(), -math.inf)


def token_topk_dcp1(masked: torch.Tensor, topk: int) -> torch.Tensor:
    """Canonical token top-k of masked logits: column ids, -1 for -inf or absent."""
    order = _canonical_order(masked)[:, :topk]
    keep = masked.gather(1, order) != -math.inf
    out = torch.where(keep, order, -1).to(torch.int32)
    return torch.nn.functional.pad(out, (0, topk - out.shape[1]), value=-1)


def token_topk_dcp(
    group: Group, local_masked: torch.Tensor, topk: int, interleave: int
) -> torch.Tensor:
    """``_merge_dcp_topk_global`` in canonical form: local top-k as (score, global
    id), all-gathered, then the canonical top-k of the union by (score, id)."""
    w, rank = group.world_size, group.rank_in_group
    local = token_topk_dcp1(local_masked, topk)
    ids = torch.where(
        local >= 0, global_position(local.long().clamp_min(0), rank, w, interleave), -1
    )
    # one -inf column, so that a rank with no columns still has something to gather
    padded = torch.nn.functional.pad(local_masked, (0, 1), value=-math.inf)
    score = padded.gather(1, torch.where(local >= 0, local.long(), padded.shape[1] - 1))
    all_ids = group.all_gather(ids, dim=1)
    all_scores = group.all_gather(score, dim=1)
    # lower id first, then a stable sort by score: ties keep the lower global id
    by_id = torch.sort(torch.where(all_ids >= 0, all_ids, torch.iinfo(torch.int64).max)).indices
    all_ids, all_scores = all_ids.gather(1, by_id), all_scores.gather(1, by_id)
    order = _canonical_order(all_scores)[:, :topk]
    keep = all_scores.gather(1, order) != -math.inf
    return torch.where(keep, all_ids.gather(1, order), -1).to(torch.int32)
