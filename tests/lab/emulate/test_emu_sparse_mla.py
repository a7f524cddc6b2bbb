"""sparse_mla: ``dequantize_slots`` == the baked tree's Triton ``dequantize_and_gather_k_cache``
(interpreted), and ``attention_with_lse`` == ``sm120_attention_with_lse`` of
tests/lab/dcp/_dcp_forward_driver.py (row by row, itself checked against lab.dcp.reference in
test_dcp_forward.py) on fp8_ds_mla caches written by ``quantize_insert``: sinks, -1
indices, lengths, empty rows (LSE -1e30 and output 0), several row chunks.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
from _emu import baked, caught, passed, planted, stand_in

pytestmark = pytest.mark.needs("triton")

CACHE_UTILS = "vllm/models/deepseek_v41/common/ops/cache_utils.py"
PS, D, H = 16, 512, 4


def _fp8_cache(pages: int, seed: int) -> torch.Tensor:
    """[pages, PS, 584] uint8 written by the stand-in's quantize_insert, every slot."""
    gen = torch.Generator().manual_seed(seed)
    k = torch.randn(pages * PS, D, generator=gen) * torch.logspace(-2, 2, pages * PS)[:, None]
    cache = torch.zeros(pages, PS, 584, dtype=torch.uint8)
    slots = torch.randperm(pages * PS, generator=gen)
    stand_in("cache_insert").quantize_insert(k.to(torch.bfloat16), cache.view(pages, -1), slots, PS)
    return cache


def _triton_dense(tree, cache: torch.Tensor) -> torch.Tensor:
    """bf16 [pages, PS, 512]: the tree's Triton gather of every slot, in slot order."""
    provided = {
        "current_platform": SimpleNamespace(is_rocm=lambda: False),
        "has_cutedsl": lambda: False,
        "cdiv": lambda a, b: -(-a // b),
    }
    gather = baked(tree, CACHE_UTILS, ["dequantize_and_gather_k_cache"], provided)[
        "dequantize_and_gather_k_cache"
    ]
    n = cache.shape[0] * PS
    out = torch.full((1, n, D), math.nan, dtype=torch.bfloat16)
    table = torch.arange(cache.shape[0], dtype=torch.int32)[None]
    gather(out, cache, torch.tensor([n], dtype=torch.int32), None, table, PS, 0)
    return out[0].view(cache.shape[0], PS, D)


def _dequantize(tree, fn=None) -> None:
    sm = stand_in("sparse_mla")
    cache = _fp8_cache(3, 1)
    want = _triton_dense(tree, cache).reshape(-1, D)
    assert want.isfinite().all()
    slots = torch.randperm(want.shape[0], generator=torch.Generator().manual_seed(2))
    got = (fn or sm.dequantize_slots)(cache, slots)
    assert got.dtype == torch.float32
    assert torch.equal(got.to(torch.bfloat16), want[slots]), "rows differ from Triton's"
    assert torch.equal(got, want[slots].float()), "not exact in bf16"


def dequantize(tree) -> None:
    _dequantize(tree)


def plant_scale_stride(tree) -> None:
    # 7 scale bytes a token instead of 8: every token past a page's first reads wrong scales
    sm = stand_in("sparse_mla")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(sm, "SCALE_BYTES", 7)
        _dequantize(tree, sm.dequantize_slots)


def _case(with_sink: bool):
    gen = torch.Generator().manual_seed(7 + with_sink)
    t = 7
    q = (torch.randn(t, H, D, generator=gen) * 0.5).to(torch.bfloat16)
    swa_idx = torch.randint(0, 2 * PS, (t, 1, 8), generator=gen, dtype=torch.int32)
    swa_idx[1, 0, 2] = -1  # a hole inside the counted prefix
    swa_idx[4, 0, 5:] = -1
    swa_lens = torch.tensor([8, 8, 0, 3, 8, 0, 6], dtype=torch.int32)
    idx = torch.randint(0, 3 * PS, (t, 12), generator=gen, dtype=torch.int32)
    idx[0, 7:] = -1
    idx[6] = -1  # no compressed candidate, SWA only
    lens = torch.tensor([12, 12, 0, 12, 4, 0, 12], dtype=torch.int32)
    sinks = torch.randn(H + 2, generator=gen) if with_sink else None  # padded like the layer
    return q, swa_idx, swa_lens, idx, lens, sinks, D**-0.5


def _attention(tree, with_sink: bool, fn=None) -> None:
    from _dcp_forward_driver import sm120_attention_with_lse

    sm = stand_in("sparse_mla")
    swa, comp = _fp8_cache(2, 3), _fp8_cache(3, 4)
    dense_swa, dense_comp = _triton_dense(tree, swa), _triton_dense(tree, comp)
    q, swa_idx, swa_lens, idx, lens, sinks, scale = _case(with_sink)
    t = q.shape[0]
    want_out = torch.full((t, H, D), math.nan, dtype=torch.bfloat16)
    want_lse = torch.full((t, H), math.nan)
    sm120_attention_with_lse(
        q,
        dense_swa,
        None,
        swa_idx,
        swa_lens,
        dense_comp,
        idx,
        lens,
        want_out,
        scale,
        sinks,
        want_lse,
    )
    out, lse = torch.full_like(want_out, math.nan), torch.full_like(want_lse, math.nan)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(sm, "ROWS_PER_CHUNK", 3)  # rows in several chunks
        (fn or sm.attention_with_lse)(
            q, swa, None, swa_idx, swa_lens, comp, idx, lens, out, scale, sinks, lse
        )
    torch.testing.assert_close(out, want_out, atol=1e-2, rtol=1e-2)
    torch.testing.assert_close(lse, want_lse, atol=1e-4, rtol=1e-5)
    if fn is None:  # the DCP1 entry point: the same attention, query [T, 1, H, D], no LSE
        dcp1 = torch.full_like(want_out, math.nan)
        sm.trtllm_batch_decode_sparse_mla_dsv4(
            query=q[:, None],
            swa_kv_cache=swa,
            workspace_buffer=None,
            sparse_indices=swa_idx,
            compressed_kv_cache=comp,
            out=dcp1,
            bmm1_scale=scale,
            sinks=sinks,
            kv_layout="NHD",
            swa_topk_lens=swa_lens,
            extra_sparse_indices=idx,
            extra_sparse_topk_lens=lens,
            bmm2_scale=1.0,
        )
        torch.testing.assert_close(dcp1, want_out, atol=1e-2, rtol=1e-2)
    empty = torch.tensor([2, 5])
    if sinks is None:
        assert (lse[empty] == -1e30).all() and (out[empty] == 0).all()
    else:  # the sink alone: its LSE in base 2, output 0
        assert (out[empty] == 0).all()
        torch.testing.assert_close(lse[empty], (sinks[:H] / math.log(2)).expand(2, H))


def attention_with_sink(tree) -> None:
    _attention(tree, True)


def attention_without_sink(tree) -> None:
    _attention(tree, False)


def plant_natural_log_lse(tree) -> None:
    sm = stand_in("sparse_mla")
    _attention(tree, True, planted(sm.attention_with_lse, "lse_e / math.log(2.0)", "lse_e"))


def plant_sink_dropped(tree) -> None:
    sm = stand_in("sparse_mla")
    _attention(tree, True, planted(sm.attention_with_lse, "if sinks is not None:", "if False:"))


CHECKS = [
    "dequantize",
    "plant_scale_stride",
    "attention_with_sink",
    "attention_without_sink",
    "plant_natural_log_lse",
    "plant_sink_dropped",
]


@pytest.fixture(scope="module")
def results(child_results):
    return child_results[__name__]


def test_dequantize_slots_matches_triton_gather(results):
    passed(results, "dequantize")


def test_dequantize_check_catches_a_wrong_scale_stride(results):
    caught(results, "plant_scale_stride")


@pytest.mark.parametrize("check", ["attention_with_sink", "attention_without_sink"])
def test_attention_with_lse_matches_row_reference(results, check):
    passed(results, check)


@pytest.mark.parametrize("plant", ["plant_natural_log_lse", "plant_sink_dropped"])
def test_attention_check_catches(results, plant):
    caught(results, plant)
