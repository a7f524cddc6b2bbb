"""The fused DeepSeek-V4 RoPE + fp8 cache-insert CUDA ops, in torch.

Contract (vLLM's csrc op, as its XPU Triton port in models/deepseek_v4/xpu spells it):
GPT-J interleaved RoPE on the last 64 of 512 dims, pairs (2i, 2i+1), cos_sin_cache rows
[cos(32) | sin(32)]; the KV row is written as the V4 fp8_ds_mla record by
``quantize_insert``, a vectorised port of the tree's Triton ``quantize_and_insert_k_kernel``
(interpreted, that kernel was over half of a CPU prefill; tests hold the two equal).
"""

from __future__ import annotations

import torch

from bakery_emulate import counts

HEAD_DIM, ROPE_DIM = 512, 64


def gptj_rope(x: torch.Tensor, positions: torch.Tensor, cos_sin_cache: torch.Tensor):
    """x [..., T, ..., 512] with T leading; returns a float32 copy, RoPE on the tail."""
    half = ROPE_DIM // 2
    cs = cos_sin_cache.index_select(0, positions.long()).float()
    cos, sin = cs[:, :half], cs[:, half:]
    shape = (x.shape[0],) + (1,) * (x.dim() - 2) + (half,)
    cos, sin = cos.view(shape), sin.view(shape)
    out = x.float().clone()
    even = out[..., HEAD_DIM - ROPE_DIM :: 2].clone()
    odd = out[..., HEAD_DIM - ROPE_DIM + 1 :: 2].clone()
    out[..., HEAD_DIM - ROPE_DIM :: 2] = even * cos - odd * sin
    out[..., HEAD_DIM - ROPE_DIM + 1 :: 2] = even * sin + odd * cos
    return out


FP8_DIM, DATA_BYTES, SCALE_BYTES, QUANT_BLOCK = 448, 576, 8, 64
FP8_MAX = 448.0


def quantize_insert(
    k: torch.Tensor, cache_2d: torch.Tensor, slot_mapping: torch.Tensor, block_size: int
) -> int:
    """``quantize_and_insert_k_cache`` for the V4 record: per 64-dim block of the first
    448 dims a UE8M0 scale 2^ceil(log2(max(amax, 1e-4) / 448)) stored as exponent + 127,
    e4m3 values; the last 64 dims as bf16; scale byte 7 is 0; slot -1 is skipped.
    Returns a digest of the rows written (``record_digest``)."""
    n = slot_mapping.shape[0]
    keep = slot_mapping >= 0
    slots, rows = slot_mapping[keep].long(), k[:n][keep]
    if slots.numel() == 0:
        return 0
    blocks = rows[:, :FP8_DIM].view(-1, 7, QUANT_BLOCK)
    amax = blocks.abs().amax(-1).float().clamp(min=1e-4)
    exponent = torch.ceil(torch.log2(amax / FP8_MAX))
    values = (blocks.float() / torch.exp2(exponent)[..., None]).clamp(-FP8_MAX, FP8_MAX)
    fp8 = values.to(torch.float8_e4m3fn).view(torch.uint8).reshape(-1, FP8_DIM)
    tail = rows[:, FP8_DIM:].contiguous().view(torch.uint8)
    scales = torch.zeros(rows.shape[0], SCALE_BYTES, dtype=torch.uint8)
    scales[:, :7] = (exponent + 127).clamp(0, 255).to(torch.uint8)
    flat = cache_2d.view(torch.uint8)
    page, at = slots // block_size, slots % block_size
    data_at = (at * DATA_BYTES)[:, None] + torch.arange(DATA_BYTES)
    flat[page[:, None], data_at] = torch.cat([fp8, tail], dim=1)
    scale_at = (block_size * DATA_BYTES + at * SCALE_BYTES)[:, None] + torch.arange(SCALE_BYTES)
    flat[page[:, None], scale_at] = scales
    return record_digest(slots, torch.cat([fp8, tail, scales], dim=1))


def record_digest(slots: torch.Tensor, records: torch.Tensor) -> int:
    """Each written record's bytes weighted by position and its slot, summed: equal for
    two ranks that wrote the same bytes at the same slots (in any order)."""
    weights = torch.arange(1, records.shape[1] + 1, dtype=torch.int64)
    per_row = (records.long() * weights).sum(1) % counts.DIGEST_MOD
    return int(((per_row * (slots + 1)) % counts.DIGEST_MOD).sum()) % counts.DIGEST_MOD


def _insert(kv, cache, slot_mapping, positions, cos_sin_cache, block_size, kv_mxfp8):
    if kv_mxfp8:
        raise NotImplementedError("bakery_emulate: the MXFP8 record (SM100) has no stand-in")
    n = slot_mapping.shape[0]
    roped = gptj_rope(kv[:n], positions[:n], cos_sin_cache).to(torch.bfloat16)
    digest = quantize_insert(roped, cache.view(cache.shape[0], -1), slot_mapping, block_size)
    counts.bump(swa_kv_digest=digest)


def qnorm_rope_kv_rope_quant_insert(
    q,
    kv,
    cache_2d,
    slot_mapping,
    positions,
    cos_sin_cache,
    pad_to,
    eps,
    block_size,
    apply_q_norm,
    kv_mxfp8,
    apply_q_rope,
    is_q_interleaved,
):
    if is_q_interleaved:
        raise NotImplementedError("bakery_emulate: the interleaved Q layout has no stand-in")
    t = q.shape[0]
    qf = q.float()
    if apply_q_norm:
        qf = qf * torch.rsqrt(qf.square().mean(-1, keepdim=True) + eps)
    if apply_q_rope:
        qf = gptj_rope(qf, positions[:t], cos_sin_cache)
    q.copy_(qf.to(q.dtype))
    _insert(kv, cache_2d, slot_mapping, positions, cos_sin_cache, block_size, kv_mxfp8)
    if pad_to == 0:
        return q
    out = q.new_zeros(t, pad_to, q.shape[2])
    out[:, : q.shape[1]] = q
    return out


def kv_rope_insert(
    kv, cache, slot_mapping, positions, cos_sin_cache, block_size, fp8_scale, kv_mxfp8
):
    if fp8_scale is not None:
        raise NotImplementedError("bakery_emulate: the per-tensor fp8 cache has no stand-in")
    _insert(kv, cache, slot_mapping, positions, cos_sin_cache, block_size, kv_mxfp8)
