"""mhc: ``mhc_pre_delayed`` and ``mhc_fused_post_pre_delayed`` == vLLM's own torch reference
(``model_executor/kernels/mhc/torch.py`` of the bake) plus an explicit RMSNorm of the
collapsed layer input, and the aux stream mean of the fused call.
"""

from __future__ import annotations

import pytest
import torch
from _emu import caught, passed, planted, stand_in

T, HC, HID = 5, 4, 64
MIX = HC * (HC + 2)
EPS = dict(
    rms_eps=1e-6, hc_pre_eps=1e-2, hc_sinkhorn_eps=1e-6, hc_post_mult_value=2.0, sinkhorn_repeat=3
)


def _inputs(seed: int):
    gen = torch.Generator().manual_seed(seed)
    residual = torch.randn(T, HC, HID, generator=gen).to(torch.bfloat16)
    fn = torch.randn(MIX, HC * HID, generator=gen) * 0.05
    hc_scale = torch.rand(3, generator=gen) + 0.5
    hc_base = torch.randn(MIX, generator=gen) * 0.1
    pre_mix = torch.rand(T, HC, generator=gen)
    norm_weight = (torch.rand(HID, generator=gen) + 0.5).to(torch.bfloat16)
    return residual, fn, hc_scale, hc_base, pre_mix, norm_weight


def _mhc():
    """The stand-in module, reached the engine's way: vLLM's TileLang module is imported
    first and its hook swaps the stand-ins in (importing bakery_emulate.mhc before any of
    vLLM's mhc package would be a circular import)."""
    from vllm.model_executor.kernels.mhc import tilelang

    mhc = stand_in("mhc")
    assert tilelang.mhc_pre_delayed_tilelang is mhc.mhc_pre_delayed
    assert tilelang.mhc_fused_post_pre_delayed_tilelang is mhc.mhc_fused_post_pre_delayed
    return mhc


def _rmsnorm(h: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    h = h.double()
    rms = (h.pow(2).sum(-1, keepdim=True) / h.shape[-1] + eps).sqrt()
    return (h / rms * weight.double()).to(torch.bfloat16)


def _check_pre(pre_fn, with_norm: bool, with_pre_mix: bool) -> None:
    from vllm.model_executor.kernels.mhc.torch import mhc_pre_delayed_torch

    residual, fn, hc_scale, hc_base, pre_mix, weight = _inputs(1)
    pre_mix = pre_mix if with_pre_mix else None
    args = (residual, fn, hc_scale, hc_base, *EPS.values())
    post, comb, layer_input, next_pre = pre_fn(
        *args, pre_mix=pre_mix, norm_weight=weight if with_norm else None
    )
    r_post, r_comb, r_input, r_pre = mhc_pre_delayed_torch(*args, pre_mix=pre_mix)
    assert torch.equal(post, r_post) and torch.equal(comb, r_comb)
    assert next_pre.dtype == torch.float32 and torch.equal(next_pre, r_pre.float())
    want = _rmsnorm(r_input, weight) if with_norm else r_input
    assert layer_input.dtype == torch.bfloat16 and layer_input.is_contiguous()
    torch.testing.assert_close(layer_input, want, atol=0, rtol=8e-3)  # one bf16 ulp


def pre(tree) -> None:
    mhc = _mhc()
    for with_norm in (True, False):
        for with_pre_mix in (True, False):
            _check_pre(mhc.mhc_pre_delayed, with_norm, with_pre_mix)


def plant_norm_without_eps_mean(tree) -> None:
    # RMSNorm over the sum of squares instead of their mean
    mhc = _mhc()
    _check_pre(
        planted(
            mhc.mhc_pre_delayed,
            "h.square().mean(-1, keepdim=True)",
            "h.square().sum(-1, keepdim=True)",
        ),
        True,
        True,
    )


def _check_fused(fused_fn) -> None:
    from vllm.model_executor.kernels.mhc.torch import mhc_post_torch, mhc_pre_delayed_torch

    residual, fn, hc_scale, hc_base, pre_mix, weight = _inputs(2)
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(T, HID, generator=gen).to(torch.bfloat16)
    post_mix = torch.rand(T, HC, 1, generator=gen)
    comb_mix = torch.rand(T, HC, HC, generator=gen)
    rest = (fn, hc_scale, hc_base, *EPS.values())
    out = fused_fn(
        x,
        residual,
        post_mix,
        comb_mix,
        *rest,
        pre_mix=pre_mix,
        norm_weight=weight,
        capture_aux=True,
    )
    new_res = mhc_post_torch(x, residual, post_mix, comb_mix)
    r_post, r_comb, r_input, r_pre = mhc_pre_delayed_torch(new_res, *rest, pre_mix=pre_mix)
    assert torch.equal(out[0], new_res)
    assert torch.equal(out[1], r_post) and torch.equal(out[2], r_comb)
    torch.testing.assert_close(out[3], _rmsnorm(r_input, weight), atol=0, rtol=8e-3)
    assert torch.equal(out[4], r_pre.float())
    torch.testing.assert_close(
        out[5], new_res.double().mean(1).to(torch.bfloat16), atol=0, rtol=8e-3
    )
    plain = fused_fn(x, residual, post_mix, comb_mix, *rest, pre_mix=pre_mix)
    assert plain[5].shape == (0, HID)  # no aux unless asked


def fused(tree) -> None:
    _check_fused(_mhc().mhc_fused_post_pre_delayed)


def plant_fused_stale_residual(tree) -> None:
    # the next pre reads the residual from before the post
    mhc = _mhc()
    bad = planted(
        mhc.mhc_fused_post_pre_delayed,
        "residual = mhc_post(x, residual, post_layer_mix, comb_res_mix)",
        "new = mhc_post(x, residual, post_layer_mix, comb_res_mix)",
    )
    _check_fused(bad)


CHECKS = ["pre", "plant_norm_without_eps_mean", "fused", "plant_fused_stale_residual"]


@pytest.fixture(scope="module")
def results(child_results):
    return child_results[__name__]


def test_mhc_pre_delayed_matches_vllm_torch_reference(results):
    passed(results, "pre")


def test_mhc_fused_post_pre_matches_vllm_torch_reference(results):
    passed(results, "fused")


@pytest.mark.parametrize("plant", ["plant_norm_without_eps_mean", "plant_fused_stale_residual"])
def test_mhc_checks_catch(results, plant):
    caught(results, plant)
