"""cache_insert: ``quantize_insert`` == the baked tree's Triton ``quantize_and_insert_k_cache``
byte for byte (interpreted, with the emulation's fp8 rounding fix), and ``gptj_rope`` ==
a complex-number rotation of each (2i, 2i+1) pair of the last 64 dims.
"""

from __future__ import annotations

import math

import pytest
import torch
from _emu import baked, caught, passed, planted, stand_in

pytestmark = pytest.mark.needs("triton")

CACHE_UTILS = "vllm/models/deepseek_v41/common/ops/cache_utils.py"
BLOCK, PAGES, PAD = 16, 3, 40  # PAD: bytes past the page's records, as a padded stride
PAGE_BYTES = BLOCK * 584


def _rows() -> tuple[torch.Tensor, torch.Tensor]:
    """bf16 K rows with edge blocks, and their slots (some -1)."""
    gen = torch.Generator().manual_seed(3)
    t = 24
    k = torch.randn(t, 512, generator=gen) * torch.logspace(-3, 3, t)[:, None]
    for r, block in enumerate(range(7)):
        lo = block * 64
        scale = 2.0 ** (r - 3)
        k[r, lo : lo + 64] = torch.randn(64, generator=gen) * 100 * scale
        k[r, lo + 5] = 450.0 * scale  # the bf16 just above 448 * 2^k: scale 2^(k+1)
        k[r + 7, lo + 9] = -448.0 * scale  # exactly 448 * 2^k: scale 2^k
        k[r + 14, lo : lo + 64] = 0.0  # an all-zero block: amax clamps to 1e-4
    k[21, :448] = 1e-6  # below the 1e-4 floor everywhere
    k = k.to(torch.bfloat16)
    slots = torch.randperm(PAGES * BLOCK, generator=gen)[:t]
    slots[[2, 11, 20]] = -1
    return k, slots


def _cache() -> torch.Tensor:
    # Garbage, so a byte written where it should not be (or not written) shows.
    gen = torch.Generator().manual_seed(4)
    return torch.randint(0, 256, (PAGES, PAGE_BYTES + PAD), generator=gen, dtype=torch.uint8)


def _compare(tree, insert=None, fixed=True) -> None:
    import triton.runtime.interpreter as interpreter

    # the engine's interpreter: sitecustomize's hook wrapped the fp8 cast
    assert ("_nearest_even" in interpreter._convert_float.__qualname__) == fixed
    triton_insert = baked(tree, CACHE_UTILS, ["quantize_and_insert_k_cache"])[
        "quantize_and_insert_k_cache"
    ]
    insert = insert or stand_in("cache_insert").quantize_insert
    k, slots = _rows()
    got, want = _cache(), _cache()
    insert(k, got, slots, BLOCK)
    triton_insert(k, want, slots, block_size=BLOCK)
    assert not torch.equal(want, _cache())  # the kernel wrote
    assert torch.equal(got, want), f"{(got != want).sum()} bytes differ"


def quantize_insert(tree) -> None:
    _compare(tree)


def plant_fp8_max(tree) -> None:
    # 450 instead of 448: only blocks whose max sits in (448 * 2^k, 450 * 2^k] change.
    ci = stand_in("cache_insert")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ci, "FP8_MAX", 450.0)
        _compare(tree, ci.quantize_insert)


def plant_pad_slot_written(tree) -> None:
    # slot -1 kept: it lands on the last page's last token
    ci = stand_in("cache_insert")
    _compare(
        tree, planted(ci.quantize_insert, "keep = slot_mapping >= 0", "keep = slot_mapping >= -1")
    )


def plant_unfixed_interpreter(tree) -> None:
    # Triton's own interpreter cast (the fix's wrapped original): its bytes differ
    import triton.runtime.interpreter as interpreter

    fixed = interpreter._convert_float
    cells = dict(zip(fixed.__code__.co_freevars, fixed.__closure__ or (), strict=True))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(interpreter, "_convert_float", cells["convert"].cell_contents)
        _compare(tree, fixed=False)


CHECKS = ["quantize_insert", "plant_fp8_max", "plant_pad_slot_written", "plant_unfixed_interpreter"]


@pytest.fixture(scope="module")
def results(child_results):
    return child_results[__name__]


def test_quantize_insert_matches_triton_bytes(results):
    passed(results, "quantize_insert")


def test_quantize_insert_check_catches_a_wrong_fp8_max(results):
    caught(results, "plant_fp8_max")


def test_quantize_insert_check_catches_a_written_pad_slot(results):
    caught(results, "plant_pad_slot_written")


def test_quantize_insert_check_fails_without_the_fp8_fix(results):
    caught(results, "plant_unfixed_interpreter")


# ---- gptj_rope ---------------------------------------------------------------


def _rope_case():
    gen = torch.Generator().manual_seed(6)
    t, h, max_pos = 5, 3, 40
    x = torch.randn(t, h, 512, generator=gen).to(torch.bfloat16)
    pos = torch.tensor([0, 7, 39, 1, 7])
    inv = 10000.0 ** (-torch.arange(32, dtype=torch.float64) / 32)
    theta = torch.arange(max_pos, dtype=torch.float64)[:, None] * inv[None, :]
    cos_sin = torch.cat([theta.cos(), theta.sin()], -1).float()
    return x, pos, cos_sin, theta


def _complex_rope(x, pos, theta):
    out = x.double().clone()
    tail = out[..., 448:].reshape(*out.shape[:-1], 32, 2)
    z = (
        torch.complex(tail[..., 0], tail[..., 1])
        * torch.polar(torch.ones_like(theta[pos]), theta[pos])[:, None, :]
    )
    out[..., 448:] = torch.stack([z.real, z.imag], -1).reshape(*out.shape[:-1], 64)
    return out


def _neox_rope(x, positions, cos_sin_cache):
    # The other RoPE layout (pairs i, i + 32): the plant.
    cs = cos_sin_cache[positions].float()[:, None]
    cos, sin = cs[..., :32], cs[..., 32:]
    out = x.float().clone()
    a, b = out[..., 448:480].clone(), out[..., 480:].clone()
    out[..., 448:480], out[..., 480:] = a * cos - b * sin, a * sin + b * cos
    return out


def _check_rope(rope):
    x, pos, cos_sin, theta = _rope_case()
    got = rope(x, pos, cos_sin)
    assert got.dtype == torch.float32
    want = _complex_rope(x, pos, theta)
    assert torch.equal(got[..., :448], x[..., :448].float())
    torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=1e-5)
    assert not math.isclose(float((want - x.double()).abs().max()), 0.0)  # it rotated


def test_gptj_rope_is_a_complex_rotation():
    _check_rope(stand_in("cache_insert").gptj_rope)


def test_gptj_rope_check_catches_the_neox_layout():
    with pytest.raises(AssertionError):
        _check_rope(_neox_rope)
