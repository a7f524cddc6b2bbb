"""vLLM's V4.1 indexer K store (``_indexer_k_norm_rope_quant_store_kernel`` in
``models/deepseek_v41/common/ops/indexer_k_store.py``; the series does not touch it),
ported to torch: interpreted, it was a twelfth of a served V4.1's time. Only the
per-token FP8 row-major cache the CPU runs take; MXFP4 and ROCm's tiled layout stay the
original (interpreted) kernel. tests/lab/emulate holds the port's cache bytes equal to
the interpreted original's.

Contract, per token with slot >= 0 at a group's last position: k_norm in fp32, rounded
to bf16; GPT-J RoPE at the group's first position, each half rounded to bf16; one fp32
scale 2^ceil(log2(max(amax, 1e-4) / 448)); e4m3 values at ``page + offset * 128``, the
scale's 4 bytes at ``page + block_size * 128 + offset * 4``.
"""

from __future__ import annotations

import torch


def numpy_sum(x: torch.Tensor) -> torch.Tensor:
    """Sum over the last dim in numpy's float pairwise order (np.add.reduce, which the
    interpreter's tl.sum calls): +0.0 plus the pairwise sum. A torch .sum adds in another
    order: other last bits in about half of the rows of 128."""
    return torch.zeros_like(x[..., 0]) + _pairwise(x)


def _pairwise(x: torch.Tensor) -> torch.Tensor:
    """Below 8 in a row; up to 128 in 8 strided partial sums folded as
    ((0+1)+(2+3))+((4+5)+(6+7)), then the tail in a row; above, the two halves (the
    first a multiple of 8 long)."""
    n = x.shape[-1]
    if n < 8:
        acc = x[..., 0]
        for i in range(1, n):
            acc = acc + x[..., i]
        return acc
    if n <= 128:
        whole = n - n % 8
        r = x[..., 0:8]
        for i in range(8, whole, 8):
            r = r + x[..., i : i + 8]
        acc = ((r[..., 0] + r[..., 1]) + (r[..., 2] + r[..., 3])) + (
            (r[..., 4] + r[..., 5]) + (r[..., 6] + r[..., 7])
        )
        for i in range(whole, n):
            acc = acc + x[..., i]
        return acc
    half = n // 2
    half -= half % 8
    return _pairwise(x[..., :half]) + _pairwise(x[..., half:])


class IndexerKStore:
    """Launched as the kernel is: ``store[(num_tokens,)](*args, **constexprs)``."""

    def __init__(self, original):
        self.original = original  # MXFP4 and the tiled layout; tests compare with it

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            if kwargs["USE_FP4"] or kwargs["SHUFFLE"]:
                return self.original[grid](*args, **kwargs)
            return self.store(grid[0], *args, **kwargs)

        return launch

    @staticmethod
    def pairs(k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """GPT-J: (0, 1), (2, 3), ... (the last 32 pairs are the rope ones)."""
        return k[:, 0::2], k[:, 1::2]

    @staticmethod
    def unpair(even: torch.Tensor, odd: torch.Tensor) -> torch.Tensor:
        return torch.stack([even, odd], dim=-1).flatten(1)

    @staticmethod
    def group_positions(positions: torch.Tensor, ratio: int) -> torch.Tensor:
        """A latent stands for its group's first token."""
        return torch.div(positions, ratio, rounding_mode="trunc") * ratio

    def store(
        self,
        num_tokens,
        k_pre,
        k_pre_stride,
        positions,
        rms_norm_weight,
        rms_norm_eps,
        cos_sin_cache,
        cos_sin_stride,
        k_cache,
        kv_slot_mapping,
        kv_cache_block_size,
        *,
        HEAD_SIZE,  # noqa: N803 - the kernel's constexpr names
        ROPE_HEAD_DIM,  # noqa: N803
        COMPRESS_RATIO,  # noqa: N803
        TOKEN_STRIDE,  # noqa: N803
        SCALE_DIM,  # noqa: N803
        KV_BLOCK_STRIDE,  # noqa: N803
        FP8_MAX,  # noqa: N803
        **_,
    ):
        slots = kv_slot_mapping[:num_tokens].long()
        pos = positions[:num_tokens].long()
        keep = (slots >= 0) & (torch.fmod(pos + 1, COMPRESS_RATIO) == 0)
        tokens = keep.nonzero().flatten()
        if tokens.numel() == 0:
            return
        slots, pos = slots[tokens], pos[tokens]
        rows = torch.as_strided(
            k_pre, (k_pre.shape[0], HEAD_SIZE), (k_pre_stride, 1), k_pre.storage_offset()
        )
        k = rows[tokens].float()
        # k_norm: k * rsqrt(mean(k^2) + eps) * w, rsqrt as 1 / sqrt (the interpreter's).
        variance = numpy_sum(k * k) / HEAD_SIZE
        rrms = 1 / torch.sqrt(variance + rms_norm_eps)
        k = (k * rrms[:, None] * rms_norm_weight.float()).to(torch.bfloat16).float()

        # RoPE over every pair, nope pairs with cos 1 and sin 0 as the kernel's masked
        # loads: their subtraction of a signed zero can flip -0.0 to +0.0.
        pairs, half = HEAD_SIZE // 2, ROPE_HEAD_DIM // 2
        nope = pairs - half
        table = torch.as_strided(
            cos_sin_cache,
            (cos_sin_cache.shape[0], ROPE_HEAD_DIM),
            (cos_sin_stride, 1),
            cos_sin_cache.storage_offset(),
        )
        cs = table[self.group_positions(pos, COMPRESS_RATIO)].float()
        cos = torch.ones(len(tokens), pairs)
        sin = torch.zeros(len(tokens), pairs)
        cos[:, nope:], sin[:, nope:] = cs[:, :half], cs[:, half:]
        even, odd = self.pairs(k)
        new_even = (even * cos - odd * sin).to(torch.bfloat16).float()
        new_odd = (odd * cos + even * sin).to(torch.bfloat16).float()
        result = self.unpair(new_even, new_odd)

        # NaN as the interpreter takes it: tl.max skips it (nanmax), tl.maximum and tl.clamp
        # give the other operand (fmax, fmin); torch's amax and clamp would keep it.
        magnitude = result.abs()
        absmax = torch.where(magnitude.isnan(), 0.0, magnitude).amax(-1)
        absmax = torch.fmax(absmax, torch.tensor(1e-4))
        # torch.log2 and np.log2 differ in the last bit for a few inputs; the ceil is the
        # same for every bf16 amax and the floor (checked over all of them).
        exponent = torch.ceil(torch.log2(absmax * (1.0 / FP8_MAX)))
        scaled = result * torch.exp2(-exponent)[:, None]
        scaled = torch.fmin(torch.fmax(scaled, torch.tensor(-FP8_MAX)), torch.tensor(FP8_MAX))
        values = scaled.to(torch.float8_e4m3fn).view(torch.uint8)
        scale = torch.exp2(exponent).view(torch.uint8).view(-1, 4)

        width = kv_cache_block_size * (TOKEN_STRIDE + SCALE_DIM)
        flat = k_cache.view(torch.uint8)
        pages = torch.as_strided(
            flat, (flat.shape[0], width), (KV_BLOCK_STRIDE, 1), flat.storage_offset()
        )
        page, at = slots // kv_cache_block_size, slots % kv_cache_block_size
        value_at = (at * TOKEN_STRIDE)[:, None] + torch.arange(HEAD_SIZE)
        pages[page[:, None], value_at] = values
        scale_at = (kv_cache_block_size * TOKEN_STRIDE + at * SCALE_DIM)[:, None] + torch.arange(4)
        pages[page[:, None], scale_at] = scale
