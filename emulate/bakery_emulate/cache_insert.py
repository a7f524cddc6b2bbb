"""The fused DeepSeek-V4 RoPE + fp8 cache-insert CUDA ops, in torch.

Contract (vLLM's csrc op, as its XPU Triton port in models/deepseek_v4/xpu spells it):
GPT-J interleaved RoPE on the last 64 of 512 dims, pairs (2i, 2i+1), cos_sin_cache rows
[cos(32) | sin(32)]; the KV row goes through the tree's own Triton
``quantize_and_insert_k_cache`` (UE8M0 fp8 record, or V4.1's MXFP8 one).
"""

from __future__ import annotations

import torch

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


def _insert(kv, cache, slot_mapping, positions, cos_sin_cache, block_size, kv_mxfp8):
    from vllm.models.deepseek_v41.common.ops.cache_utils import (
        V4_BYTES_PER_TOKEN,
        V41_BYTES_PER_TOKEN,
        quantize_and_insert_k_cache,
    )

    n = slot_mapping.shape[0]
    roped = gptj_rope(kv[:n], positions[:n], cos_sin_cache).to(torch.bfloat16)
    quantize_and_insert_k_cache(
        roped.contiguous(),
        cache.view(cache.shape[0], -1),
        slot_mapping,
        block_size=block_size,
        bytes_per_token=V41_BYTES_PER_TOKEN if kv_mxfp8 else V4_BYTES_PER_TOKEN,
    )


def qnorm_rope_kv_rope_quant_insert(
    q, kv, cache_2d, slot_mapping, positions, cos_sin_cache, pad_to, eps, block_size,
    apply_q_norm, kv_mxfp8, apply_q_rope, is_q_interleaved,
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


def kv_rope_insert(kv, cache, slot_mapping, positions, cos_sin_cache, block_size, fp8_scale,
                   kv_mxfp8):
    if fp8_scale is not None:
        raise NotImplementedError("bakery_emulate: the per-tensor fp8 cache has no stand-in")
    _insert(kv, cache, slot_mapping, positions, cos_sin_cache, block_size, kv_mxfp8)
