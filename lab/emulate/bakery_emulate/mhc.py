"""mHC pre/post without TileLang: vLLM's own torch reference, plus the fused RMSNorm."""

from __future__ import annotations

import torch
from vllm.model_executor.kernels.mhc.torch import mhc_post_torch, mhc_pre_delayed_torch


def mhc_pre_delayed(
    residual,
    fn,
    hc_scale,
    hc_base,
    rms_eps,
    hc_pre_eps,
    hc_sinkhorn_eps,
    hc_post_mult_value,
    sinkhorn_repeat,
    pre_mix=None,
    x=None,
    norm_weight=None,
    norm_eps=1e-6,
):
    post, comb, layer_input, next_pre = mhc_pre_delayed_torch(
        residual,
        fn,
        hc_scale,
        hc_base,
        rms_eps,
        hc_pre_eps,
        hc_sinkhorn_eps,
        hc_post_mult_value,
        sinkhorn_repeat,
        pre_mix=pre_mix,
        x=x,
    )
    if norm_weight is not None:
        h = layer_input.float()
        h = h * torch.rsqrt(h.square().mean(-1, keepdim=True) + norm_eps)
        layer_input = (h * norm_weight.float()).to(torch.bfloat16)
    return post, comb, layer_input.contiguous(), next_pre.float().contiguous()


mhc_post = mhc_post_torch


def mhc_fused_post_pre_delayed(
    x,
    residual,
    post_layer_mix,
    comb_res_mix,
    fn,
    hc_scale,
    hc_base,
    rms_eps,
    hc_pre_eps,
    hc_sinkhorn_eps,
    hc_post_mult_value,
    sinkhorn_repeat,
    pre_mix=None,
    norm_weight=None,
    norm_eps=1e-6,
    capture_aux=False,
):
    """One mHC post, then the next delayed pre: the two references in a row."""
    residual = mhc_post(x, residual, post_layer_mix, comb_res_mix)
    post, comb, layer_input, next_pre = mhc_pre_delayed(
        residual,
        fn,
        hc_scale,
        hc_base,
        rms_eps,
        hc_pre_eps,
        hc_sinkhorn_eps,
        hc_post_mult_value,
        sinkhorn_repeat,
        pre_mix=pre_mix,
        norm_weight=norm_weight,
        norm_eps=norm_eps,
    )
    aux = (
        residual.float().mean(dim=1).to(torch.bfloat16)
        if capture_aux
        else residual.new_empty(0, residual.shape[-1])
    )
    return residual, post, comb, layer_input, next_pre, aux
