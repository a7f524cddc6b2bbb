"""vLLM's fused inverse RoPE (``models/deepseek_v4/common/ops/fused_inv_rope_fp8_quant.py``,
not patched by the series), without the fp8 output, ported to torch: interpreted, it
was a fifth of a CPU prefill. The fp8 branch stays the original (interpreted) kernel;
tests/lab/emulate holds the port equal to the interpreted original.
"""

from __future__ import annotations

import torch


class InvRope:
    def __init__(self, original):
        self.original = original

    def __call__(
        self,
        o,
        positions,
        cos_sin_cache,
        out_buf,
        scale_buf,
        num_tokens,
        *,
        heads_per_group,
        quant_group_size,
        chunks_per_head,
        nope_dim,
        half_rope,
        tma_aligned_scales,
        quantize,
        fp8_max,
        launch_pdl,
        grid,
    ):
        if quantize:
            return self.original(
                o,
                positions,
                cos_sin_cache,
                out_buf,
                scale_buf,
                num_tokens,
                heads_per_group=heads_per_group,
                quant_group_size=quant_group_size,
                chunks_per_head=chunks_per_head,
                nope_dim=nope_dim,
                half_rope=half_rope,
                tma_aligned_scales=tma_aligned_scales,
                quantize=quantize,
                fp8_max=fp8_max,
                launch_pdl=launch_pdl,
                grid=grid,
            )
        n_groups = out_buf.shape[0]
        x = o[:num_tokens].float()  # [T, H, D]
        cs = cos_sin_cache.index_select(0, positions[:num_tokens].long())
        idx = torch.arange(half_rope * 2)
        cos = cs[:, idx >> 1][:, None, :]
        sin = cs[:, half_rope + (idx >> 1)][:, None, :]
        rope = x[..., nope_dim:]
        partner = rope[..., idx ^ 1]
        even = (idx & 1) == 0
        rotated = torch.where(even, rope * cos + partner * sin, rope * cos - partner * sin)
        x = torch.cat([x[..., :nope_dim], rotated], dim=-1)
        grouped = x.reshape(num_tokens, n_groups, -1).transpose(0, 1)
        out_buf.copy_(grouped.to(out_buf.dtype))
