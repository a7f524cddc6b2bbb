"""vLLM's V4.1 compressor kernels (``models/deepseek_v41/common/ops/
fused_compress_quant_cache.py``, not patched by the series), ported to torch: interpreted,
``_rope_quant_insert_kernel`` and ``_fused_save_compress_norm_kernel`` were a sixth of a
served V4.1's time. Each port stands in for the ``kernel[grid](...)`` object, so the
launchers' Python stays vLLM's; tests/lab/emulate holds each equal to the interpreted
original.

Exactness: the kernels' fp32 operations in their order (torch and numpy round each one
the same); exp, log2, exp2 and the 512-wide sum go through numpy, as the interpreter
evaluates them (torch's exp and summation order may differ in the last bit). NaN handling
follows the builder ops: ``tl.max`` is nanmax, ``tl.maximum`` and ``tl.clamp`` are
fmax/fmin. Narrowing is torch's nearest even, as the emulation's interpreter does it.
"""

from __future__ import annotations

import numpy as np
import torch

DIM = 512
FP8_MAX = 448.0


def _np(fn, x: torch.Tensor) -> torch.Tensor:
    return torch.from_numpy(fn(x.numpy()))


def _f32(value: float) -> torch.Tensor:
    # A Python float operand of a Triton fp32 op becomes an fp32 constant first.
    return torch.tensor(value, dtype=torch.float32)


class RopeQuantInsert:
    """``_rope_quant_insert_kernel[(num_tokens,)](...)``: the V4 fp8_ds_mla record
    (584 B), 448 e4m3 NoPE dims with 7 UE8M0 scales of 64 dims and a zero pad byte, then
    64 GPT-J-rotated RoPE dims as bf16; only valid slots at group boundaries."""

    def __getitem__(self, grid):
        (num_tokens,) = grid
        return lambda *args, **kwargs: self._launch(num_tokens, *args, **kwargs)

    @staticmethod
    def _launch(
        num_tokens,
        latent,
        positions,
        cos_sin,
        cache,
        cache_slots,
        *,
        COS_STRIDE,  # noqa: N803 (the kernel's constexpr names)
        CACHE_STRIDE,  # noqa: N803
        CACHE_BLOCK,  # noqa: N803
        COMPRESS_RATIO,  # noqa: N803
        SANITIZE_CACHE_NANS,  # noqa: N803
        **_launch_options,
    ):
        slots = cache_slots[:num_tokens].long()
        t = torch.nonzero(slots >= 0).flatten()
        position = positions[t].long()
        closes = torch.fmod(position + 1, COMPRESS_RATIO) == 0  # Triton's % truncates
        t, position, slot = t[closes], position[closes], slots[t][closes]
        if t.numel() == 0:
            return
        normed = latent[t].float()

        quant = normed.view(-1, 8, 64)
        magnitude = quant.abs()
        amax = torch.where(magnitude.isnan(), -torch.inf, magnitude).amax(-1)  # nanmax
        amax = torch.fmax(amax, _f32(1e-4))
        exponent = torch.ceil(_np(np.log2, amax * _f32(1.0 / FP8_MAX)))
        scaled = quant * _np(np.exp2, -exponent)[..., None]
        scaled = torch.fmin(torch.fmax(scaled, _f32(-FP8_MAX)), _f32(FP8_MAX))
        fp8 = scaled.to(torch.float8_e4m3fn).view(torch.uint8).reshape(-1, DIM)
        max_encoded = 254.0 if SANITIZE_CACHE_NANS else 255.0
        encoded = torch.fmin(torch.fmax(exponent + 127.0, _f32(0.0)), _f32(max_encoded))
        scales = torch.zeros(t.numel(), 8, dtype=torch.uint8)
        scales[:, :7] = encoded[:, :7].to(torch.uint8)

        # Rows of [cos(32) | sin(32)] at the group's first position, as the kernel reads.
        rows = torch.div(position, COMPRESS_RATIO, rounding_mode="trunc") * COMPRESS_RATIO
        table = cos_sin.as_strided((cos_sin.shape[0], 64), (COS_STRIDE, 1))[rows].float()
        c, s = table[:, :32], table[:, 32:]
        even, odd = normed[:, 448::2], normed[:, 449::2]
        rotated = torch.stack((even * c - odd * s, odd * c + even * s), -1).view(-1, 64)
        if SANITIZE_CACHE_NANS:
            rotated = torch.where(rotated == rotated, rotated, _f32(0.0))
        rope = rotated.to(torch.bfloat16).view(torch.uint8)

        pages = cache.as_strided((cache.shape[0], CACHE_BLOCK * 584), (CACHE_STRIDE, 1))
        page, at = slot // CACHE_BLOCK, slot % CACHE_BLOCK
        values = (at * 576)[:, None] + torch.arange(576)
        pages[page[:, None], values] = torch.cat((fp8[:, :448], rope), 1)
        scale_at = (CACHE_BLOCK * 576 + at * 8)[:, None] + torch.arange(8)
        pages[page[:, None], scale_at] = scales


class SaveCompressNorm:
    """``_fused_save_compress_norm_kernel[(grid,)](...)``: pool each closed group (a
    softmax over 2 rows' scores for ratio 2, the row itself for ratio 1), RMS-normalize it
    into the bf16 latent, and for ratio 2 store each request's last rows to its ring."""

    def __getitem__(self, grid):
        return self._launch

    @staticmethod
    def _launch(
        raw,
        positions,
        state,
        state_slots,
        query_start_loc,
        req_ids,
        norm_weight,
        latent,
        num_tokens,
        num_reqs,
        *,
        RAW_STRIDE,  # noqa: N803 (the kernel's constexpr names)
        STATE_STRIDE,  # noqa: N803
        STATE_ROW_STRIDE,  # noqa: N803
        STATE_BLOCK,  # noqa: N803
        COMPRESS_RATIO,  # noqa: N803
        EPS,  # noqa: N803
        JOIN_ROW_PTRS,  # noqa: N803
        **_launch_options,
    ):
        slots = state_slots[:num_tokens].long()
        if COMPRESS_RATIO == 1:
            t = torch.nonzero(slots >= 0).flatten()
            _store_latent(raw[t, :DIM].float(), t, norm_weight, latent, EPS)
            return
        bounds = query_start_loc[: num_reqs + 1].long()
        first_t, first_pooled = _request_programs(raw, positions, state, slots, bounds, STATE_BLOCK)
        _store_latent(first_pooled, first_t, norm_weight, latent, EPS)
        t = _group_ends(positions, slots, bounds, req_ids)
        _store_latent(_pool(raw[t - 1], raw[t]), t, norm_weight, latent, EPS)


def _request_programs(raw, positions, state, slots, bounds, block):
    """The first ``num_reqs`` programs: pool the group a chunk's first token closes with
    the ring row before it, then store the chunk's last ``block`` rows to the ring. All
    ring rows are read before any is stored; the kernel interleaves the two per request,
    which is the same while each request owns its ring block (as vLLM allots them)."""
    n = slots.numel()
    start, end = bounds[:-1], bounds[1:]
    live = start < end
    first_slot = torch.where(live, slots[start.clamp(max=n - 1)], -1)
    live &= first_slot >= 0
    start, end, first_slot = start[live], end[live], first_slot[live]
    position = positions[start].long()
    closes = torch.fmod(position + 1, 2) == 0
    t = start[closes]
    prev = state[first_slot[closes] // block, torch.fmod(position[closes] - 1, block)]
    pooled = _pool(prev, raw[t])
    rows = (end - torch.minimum(end - start, torch.tensor(block))).tolist()
    tail = [torch.arange(r, e) for r, e in zip(rows, end.tolist(), strict=True)]
    if tail:
        tokens = torch.cat(tail)
        slot = slots[tokens]
        tokens, slot = tokens[slot >= 0], slot[slot >= 0]
        state[slot // block, slot % block] = raw[tokens, : 2 * DIM]
    return t, pooled


def _group_ends(positions, slots, bounds, req_ids):
    """The pair programs' tokens: the one of each packed pair that ends a group, if its
    slot is valid and it is not its chunk's first token (the request program's)."""
    n = slots.numel()
    t = torch.arange(0, n, 2)
    t = t + torch.fmod(positions[t].long() + 1, 2)
    inside = t < n
    slot = torch.where(inside, slots[t.clamp(max=n - 1)], -1)
    t = t[slot >= 0]
    return t[t != bounds[req_ids[t].long()]]


def _pool(first: torch.Tensor, second: torch.Tensor) -> torch.Tensor:
    """``tl.sum(kv * tl.softmax(score, 0), 0)`` over the rows [first, second]."""
    kv = torch.stack((first[:, :DIM], second[:, :DIM])).float()
    score = torch.stack((first[:, DIM : 2 * DIM], second[:, DIM : 2 * DIM])).float()
    peak = torch.fmax(score[0], score[1])  # tl.max is nanmax
    num = _np(np.exp, (score - peak).contiguous())
    weight = num / (num[0] + num[1])
    product = kv * weight
    return product[0] + product[1]


def _store_latent(pooled, t, norm_weight, latent, eps) -> None:
    """``_store_latent``: RMSNorm in fp32 (the square sum as numpy's, which the
    interpreter's ``tl.sum`` is), one bf16 rounding."""
    if t.numel() == 0:
        return
    pooled = pooled.contiguous()
    weight = norm_weight[:DIM].float()
    variance = torch.from_numpy(np.sum((pooled * pooled).numpy(), axis=1)) / _f32(DIM)
    rrms = 1.0 / torch.sqrt(variance + _f32(eps))
    normed = pooled * rrms[:, None] * weight
    latent.view(-1, DIM)[t] = normed.to(torch.bfloat16)
