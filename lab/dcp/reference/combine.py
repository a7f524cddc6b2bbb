"""The DCP combine: merge the W ranks' partial attention outputs by their LSE.

``L = log2(sum_r 2^L_r)``, ``o = sum_r 2^(L_r - L) o_r``, in the ``ag_rs`` and
``a2a`` flavours of ``vllm/v1/attention/ops/dcp.py``. The math is ``lab.dcp.merge``'s (the
one copy, which the emulation's ports of the combine kernels share); this module is the
exchanges around it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch

from lab.dcp import merge
from lab.dcp.reference.groups import Group

Combine = Literal["ag_rs", "a2a"]


@dataclass(frozen=True)
class AttnOut:
    """Attention of one rank (partial, before the combine) or merged: output and LSE."""

    out: torch.Tensor  # [T, heads, v_dim]
    lse: torch.Tensor  # fp32 [T, heads], base 2


def merge_lse(lses: torch.Tensor) -> torch.Tensor:
    """``log2(sum_r 2^L_r)`` over dim 0, max-subtracted like the combine kernels."""
    return merge.merge_lse(lses, torch.exp2, torch.log2)


def combine_ag_rs(group: Group, part: AttnOut) -> AttnOut:
    """``cp_lse_ag_out_rs``: all-gather the LSE, correct locally, reduce-scatter heads."""
    w, rank = group.world_size, group.rank_in_group
    t, hw = part.lse.shape
    lses = group.all_gather(part.lse.contiguous(), dim=0).reshape(w, t, hw)
    total = merge_lse(lses)
    factor = merge.weight(part.lse, total, torch.exp2)[..., None]
    # The kernel writes the corrected partial back in the output dtype.
    corrected = merge.weighted(part.out, factor).to(part.out.dtype)
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
    weight = merge.weight(lses, total, torch.exp2)[..., None]
    out = merge.weighted(outs, weight).sum(dim=0)
    return AttnOut(out.to(dtype), total)


COMBINES: dict[str, Callable[[Group, AttnOut], AttnOut]] = {
    "ag_rs": combine_ag_rs,
    "a2a": combine_a2a,
}
