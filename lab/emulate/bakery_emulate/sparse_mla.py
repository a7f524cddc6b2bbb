"""FlashInfer's SM120 sparse MLA (DeepSeek-V4 fp8_ds_mla pages), in torch.

Contract (flashinfer 0.7.0.post1 ``trtllm_batch_decode_sparse_mla_dsv4``, SM120 branch, as
patch 09's ``_sm120_sparse_attention_with_lse`` documents it): each query row attends the
cache rows its index lists name (slot = page * page_size + offset; -1 and entries past the
row's length skipped), over the SWA cache and optionally a second (compressed) cache. The
latent is key and value. ``lse`` gets log2 of the sum of exp(sm_scale * q.k) plus
exp(sink); a row with neither gets -1e30 and output 0.

The page is the V4 record: per page, ``page_size`` tokens of 576 data bytes (448 e4m3 in 7
blocks of 64, then 64 bf16 RoPE dims), then ``page_size`` x 8 UE8M0 scale bytes
(scale = 2^(byte - 127)).
"""

from __future__ import annotations

import math

import torch

DATA_BYTES, SCALE_BYTES, FP8_DIM, QUANT_BLOCK = 576, 8, 448, 64
EMPTY_LSE = -1e30
ROWS_PER_CHUNK = 32  # bounds the [rows, keys, 512] gather


def dequantize_slots(cache: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """fp32 [n, 512] rows of a paged V4 fp8_ds_mla cache, for slots >= 0."""
    if cache.dtype != torch.uint8:
        cache = cache.view(torch.uint8)
    pages, page_size = cache.shape[0], cache.shape[1]
    flat = cache.reshape(pages, -1)
    page, offset = slots // page_size, slots % page_size
    # Views of each page's data and scale records: a row gather, not a byte gather.
    records = flat[:, : page_size * DATA_BYTES].unflatten(1, (page_size, DATA_BYTES))
    scales = flat[:, page_size * DATA_BYTES :][:, : page_size * SCALE_BYTES]
    data = records[page, offset]
    exponent = scales.unflatten(1, (page_size, SCALE_BYTES))[page, offset, :7].float() - 127.0
    nope = data[:, :FP8_DIM].contiguous().view(torch.float8_e4m3fn).float()
    nope = nope.view(-1, 7, QUANT_BLOCK) * torch.exp2(exponent)[..., None]
    rope = data[:, FP8_DIM:].contiguous().view(torch.bfloat16).float()
    return torch.cat([nope.reshape(-1, FP8_DIM), rope], dim=1)


def _keys(cache, indices, lens, rows: slice):
    idx = indices.reshape(indices.shape[0], -1)[rows].long()
    valid = idx >= 0
    if lens is not None:
        valid &= torch.arange(idx.shape[1])[None, :] < lens[rows].long()[:, None]
    safe = torch.where(valid, idx, torch.zeros_like(idx))
    # Rows of a prefill share most slots (the SWA window): each slot is dequantized once.
    slots, at = torch.unique(safe, return_inverse=True)
    return dequantize_slots(cache, slots)[at], valid


def attention_with_lse(
    query,
    swa_kv_cache,
    workspace,
    swa_indices,
    swa_lens,
    compressed_kv_cache,
    extra_indices,
    extra_lens,
    out,
    sm_scale,
    sinks,
    lse,
) -> None:
    t, h = query.shape[0], query.shape[1]
    for start in range(0, t, ROWS_PER_CHUNK):
        rows = slice(start, min(t, start + ROWS_PER_CHUNK))
        keys, valid = _keys(swa_kv_cache, swa_indices, swa_lens, rows)
        if extra_indices is not None:
            k2, v2 = _keys(compressed_kv_cache, extra_indices, extra_lens, rows)
            keys, valid = torch.cat([keys, k2], 1), torch.cat([valid, v2], 1)
        logits = torch.einsum("thd,tkd->thk", query[rows].float(), keys) * sm_scale
        logits = logits.masked_fill(~valid[:, None, :], -math.inf)
        cols = logits
        if sinks is not None:
            sink = sinks[:h].float()[None, :, None].expand(logits.shape[0], h, 1)
            cols = torch.cat([logits, sink], -1)
        lse_e = torch.logsumexp(cols, dim=-1)  # -inf: no candidate, no sink
        empty = torch.isneginf(lse_e)
        weights = torch.exp(logits - torch.where(empty, 0.0, lse_e)[..., None])
        value = torch.einsum("thk,tkd->thd", weights, keys[..., : out.shape[-1]])
        out[rows] = torch.where(empty[..., None], 0.0, value).to(out.dtype)
        lse[rows] = torch.where(empty, EMPTY_LSE, lse_e / math.log(2.0))


def trtllm_batch_decode_sparse_mla_dsv4(
    *,
    query,
    swa_kv_cache,
    workspace_buffer,
    sparse_indices,
    compressed_kv_cache,
    out,
    bmm1_scale,
    sinks,
    kv_layout,
    swa_topk_lens,
    extra_sparse_indices,
    extra_sparse_topk_lens,
    **unused,
) -> None:
    """The DCP1 entry point: the same attention, no LSE out."""
    if kv_layout != "NHD" or unused.get("bmm2_scale", 1.0) not in (None, 1.0):
        raise NotImplementedError(f"bakery_emulate: unsupported sparse MLA call {unused}")
    q = query.reshape(query.shape[0], -1, query.shape[-1])
    o = out.view(q.shape[0], q.shape[1], -1)
    lse = torch.empty(q.shape[:2], dtype=torch.float32)
    attention_with_lse(
        q,
        swa_kv_cache,
        workspace_buffer,
        sparse_indices,
        swa_topk_lens,
        compressed_kv_cache,
        extra_sparse_indices,
        extra_sparse_topk_lens,
        o,
        bmm1_scale,
        sinks,
        lse,
    )
