"""The sparse indexer's CUDA-only kernels (DeepGEMM, vLLM's _C top-k and cache ops, the
CuteDSL DCP merge), in torch, each as the contract its call site in
``model_executor/layers/sparse_attn_indexer.py`` relies on.

Order of equal scores: every top-k here ranks by the order-preserving key of the fp32
score (so -0.0 sorts below +0.0, NaN above everything, as CUDA's radix kernels do) and
then by the smaller position, the tie rule of vLLM's CuteDSL DCP merge
(``stable_key``: score bits, then ~token_id). Using one rule on both sides keeps DCP1
and DCP>1 comparable when scores tie.
"""

from __future__ import annotations

import torch

INDEX_HEAD_DIM = 128
SCALE_BYTES = 4  # fp32 scale per token, after the page's values


def score_key(score: torch.Tensor) -> torch.Tensor:
    """int64 keys ordered as the fp32 scores' IEEE bit patterns (-0.0 < +0.0)."""
    bits = score.float().contiguous().view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    negative = (bits & 0x80000000) != 0
    return torch.where(negative, bits ^ 0xFFFFFFFF, bits ^ 0x80000000)


def ranked(scores: torch.Tensor, valid: torch.Tensor, k: int) -> torch.Tensor:
    """Column ids of each row's top ``k`` valid scores (key desc, column asc); -1 pads."""
    key = torch.where(valid, score_key(scores), torch.full_like(scores, -1, dtype=torch.int64))
    # Stable descending sort keeps the smaller column first among equal keys.
    order = torch.sort(key, dim=-1, descending=True, stable=True).indices[..., :k]
    taken = torch.gather(valid, -1, order)
    out = torch.where(taken, order, torch.full_like(order, -1))
    if out.shape[-1] < k:
        out = torch.nn.functional.pad(out, (0, k - out.shape[-1]), value=-1)
    return out


def _dequant_rows(cache: torch.Tensor, pages: torch.Tensor, offsets: torch.Tensor):
    """fp32 [n, 128] index keys from a paged fp8 cache: values, then fp32 scales."""
    flat = cache.view(torch.uint8).reshape(cache.shape[0], -1)
    page_size = cache.shape[1]
    at = (offsets * INDEX_HEAD_DIM)[:, None] + torch.arange(INDEX_HEAD_DIM)
    values = flat[pages[:, None], at].contiguous().view(torch.float8_e4m3fn).float()
    sat = (page_size * INDEX_HEAD_DIM + offsets * SCALE_BYTES)[:, None] + torch.arange(4)
    scale = flat[pages[:, None], sat].contiguous().view(torch.float32)
    return values, scale.reshape(-1)


def cp_gather_indexer_k_quant_cache(kv_cache, dst_k, dst_scale, block_table, cu_seq_lens):
    """Copy each request's first seq_len cached keys (fp8 + scale bytes), in order."""
    flat = kv_cache.view(torch.uint8).reshape(kv_cache.shape[0], -1)
    page_size = kv_cache.shape[1]
    cu = cu_seq_lens.tolist()
    for b in range(len(cu) - 1):
        n = cu[b + 1] - cu[b]
        if n <= 0:
            continue
        pos = torch.arange(n)
        pages = block_table[b, pos // page_size].long()
        off = pos % page_size
        at = (off * INDEX_HEAD_DIM)[:, None] + torch.arange(INDEX_HEAD_DIM)
        dst_k[cu[b] : cu[b + 1]] = flat[pages[:, None], at].view(dst_k.dtype)
        sat = (page_size * INDEX_HEAD_DIM + off * SCALE_BYTES)[:, None] + torch.arange(4)
        dst_scale[cu[b] : cu[b + 1]] = flat[pages[:, None], sat].view(dst_scale.dtype)


def _relu_weighted(q: torch.Tensor, k: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    # DeepGEMM's MQA logits: sum over heads of weight * relu(q . k).
    return torch.einsum("mhd,mnd->mhn", q, k).relu().mul(weights[..., None]).sum(1)


def fp8_fp4_mqa_logits(q, kv, weights, cu_seqlen_ks, cu_seqlen_ke, clean_logits=False):
    """[M, N] logits of M query rows over N gathered keys; -inf outside [ks, ke)."""
    (q_values, q_scale), (k_values, k_scale) = q, kv
    if q_scale is not None:
        raise NotImplementedError("bakery_emulate: the MXFP4 indexer has no stand-in")
    k = k_values.float() * k_scale.float()[:, None]
    scores = torch.einsum("mhd,nd->mhn", q_values.float(), k)
    logits = scores.relu().mul(weights.float()[..., None]).sum(1)
    cols = torch.arange(k.shape[0])[None, :]
    inside = (cols >= cu_seqlen_ks[:, None]) & (cols < cu_seqlen_ke[:, None])
    return logits.masked_fill(~inside, float("-inf"))


def fp8_fp4_paged_mqa_logits(
    q,
    kv_cache,
    weights,
    context_lens,
    block_table,
    schedule_metadata,
    max_model_len,
    clean_logits=False,
    indices=None,
):
    """[B * next_n, max_model_len] logits over each request's paged keys; the query at
    step j of next_n sees positions < context_len - next_n + 1 + j."""
    q_values, q_scale = q
    if q_scale is not None or indices is not None:
        raise NotImplementedError("bakery_emulate: only the FP8, padded decode layout")
    batch, next_n = q_values.shape[0], q_values.shape[1]
    page_size = kv_cache.shape[1]
    pos = torch.arange(max_model_len)
    pages = block_table[:, (pos // page_size).clamp(max=block_table.shape[1] - 1)].long()
    values, scale = _dequant_rows(kv_cache, pages.reshape(-1), (pos % page_size).repeat(batch))
    k = (values * scale[:, None]).view(batch, max_model_len, INDEX_HEAD_DIM)
    lens = context_lens.reshape(batch, -1).long()
    if lens.shape[1] == 1:
        last = lens - next_n + 1 + torch.arange(next_n)[None, :]
    else:
        last = lens
    qf = q_values.float().reshape(batch, next_n, -1, INDEX_HEAD_DIM)
    w = weights.float().view(batch, next_n, -1)
    logits = torch.einsum("bjhd,bnd->bjhn", qf, k).relu().mul(w[..., None]).sum(2)
    logits = logits.masked_fill(pos[None, None, :] >= last[..., None], float("-inf"))
    return logits.reshape(batch * next_n, max_model_len)


def top_k_per_row_prefill(logits, row_starts, row_ends, out, num_rows, s0, s1, topk):
    """Top ``topk`` columns of logits[r, starts[r]:ends[r]], relative to starts[r]."""
    rows = logits[:num_rows]
    cols = torch.arange(rows.shape[1])[None, :]
    valid = (cols >= row_starts[:num_rows, None]) & (cols < row_ends[:num_rows, None])
    best = ranked(rows, valid, topk)
    rel = best - row_starts[:num_rows, None].to(best.dtype)
    out[:num_rows, :topk] = torch.where(best >= 0, rel, best).to(out.dtype)


class IndexerTopk:
    """``get_indexer_topk(backend)``: decode rows' top-k over their visible columns."""

    def __call__(self, logits, seq_lens, next_n, out, topk, max_seq_len):
        rows = out.shape[0]
        lens = seq_lens.reshape(-1).long()
        if lens.numel() != rows:
            lens = (lens[:, None] - next_n + 1 + torch.arange(next_n)[None, :]).reshape(-1)
        cols = torch.arange(logits.shape[1])[None, :]
        best = ranked(logits[:rows], cols < lens[:rows, None], topk)
        out[:, :topk] = best.to(out.dtype)


def stable_topk_from_gathered(gathered, topk, out=None):
    """The CuteDSL merge's contract: per row, the top ``topk`` (score, token id) pairs
    by score then smaller id; token id < 0 never selected; -1 pads; ids out."""
    score, ids = gathered[..., 0], gathered[..., 1].to(torch.int64)
    valid = ids >= 0
    key = torch.where(valid, score_key(score), torch.full_like(ids, -1))
    by_id = torch.sort(ids, dim=-1, stable=True).indices
    key, ids, valid = (torch.gather(t, -1, by_id) for t in (key, ids, valid))
    order = torch.sort(key, dim=-1, descending=True, stable=True).indices[..., :topk]
    chosen = torch.where(torch.gather(valid, -1, order), torch.gather(ids, -1, order), -1)
    if out is None:
        out = torch.empty(gathered.shape[0], topk, dtype=torch.int32)
    out.fill_(-1)
    out[:, : chosen.shape[-1]] = chosen.to(out.dtype)
    return out


def make_merge_dcp_topk_global(get_dcp_group):
    """``_merge_dcp_topk_global`` with the CuteDSL pieces in torch: pack each local
    candidate as (score, global id) as its Triton pack kernel does, all-gather over the
    DCP group, then the stable top-k."""

    def merge(
        logits, topk_indices, topk_tokens, dcp_rank, dcp_world_size, cp_interleave, row_starts=None
    ):
        if dcp_world_size <= 1:
            return
        local = topk_indices.long()
        valid = local >= 0
        safe = local.clamp(min=0)
        col = safe if row_starts is None else safe + row_starts[: local.shape[0], None].long()
        col = col.clamp(max=max(logits.shape[1] - 1, 0))
        rows = logits[: local.shape[0]].float()
        if rows.shape[1]:
            score = torch.gather(rows, 1, col).masked_fill(~valid, float("-inf"))
        else:  # a rank holding no key of the chunk: the pack kernel's loads are all masked
            score = torch.full(col.shape, float("-inf"))
        global_id = (
            (safe // cp_interleave) * (dcp_world_size * cp_interleave)
            + dcp_rank * cp_interleave
            + safe % cp_interleave
        )
        global_id = torch.where(valid, global_id, -1)
        packed = torch.stack([score, global_id.float()], dim=-1)
        gathered = get_dcp_group().all_gather(packed.contiguous(), dim=1)
        stable_topk_from_gathered(gathered, topk_tokens, out=topk_indices)

    return merge
