"""Patch 09's DCP attention forward, run on CPU from the baked cpu tree: DCP 2/4 == DCP 1.

tests/lab/dcp/_dcp_forward_driver.py imports the patched SM120 attention class from the bake,
runs the baked Triton kernels under ``TRITON_INTERPRET=1`` and substitutes only the
FlashInfer kernels (a torch implementation of their contract, checked here against
``lab.dcp.reference`` first). Then each DCP 2 / DCP 4 rank's layer output over real
gloo groups must equal the DCP1 layer's, for decode, prefill and padding rows, both
combines, stage 9 on and off. Planting an index or combine bug in patch 09 (a re-baked
copy of the series) must make exactly the affected checks fail.
"""

from __future__ import annotations

import math
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
from _dcp_forward_driver import (
    COMBINES,
    EMPTY_LSE,
    QUICK_WORLDS,
    WORLDS,
    run_forward,
    sm120_attention_with_lse,
)
from _planting import bake_planted
from test_dcp_sensitivity import PATCH, TARGET

from lab.dcp import reference as ref

pytestmark = pytest.mark.needs("triton")  # fails under CI=true when missing

KERNELS = {
    "vllm/v1/attention/backends/mla/sparse_utils.py": {
        "ConvertReqIndexToGlobalIndexKernel.sparse_mla_index_remap_kernel"
    },
    "vllm/models/deepseek_v41/common/ops/cache_utils.py": {
        "_compute_global_topk_indices_and_lens_kernel"
    },
    "vllm/v1/attention/ops/dcp.py": {
        "CorrectAttnCPOutKernel.kernel",
        "_dcp_a2a_pack_send_kernel",
        "_dcp_a2a_unpack_combine_kernel",
    },
}


# ---- the FlashInfer stand-in against the reference --------------------------


def _stand_in(q, swa, swa_idx, swa_lens, comp, idx, lens, scale, sink, v_dim):
    t, h, _ = q.shape
    out = torch.full((t, h, v_dim), math.nan, dtype=torch.bfloat16)
    lse = torch.full((t, h), math.nan)
    sm120_attention_with_lse(
        q, swa, None, swa_idx, swa_lens, comp, idx, lens, out, scale, sink, lse
    )
    return out, lse


@pytest.mark.parametrize("with_sink", [True, False])
@pytest.mark.parametrize("with_extra", [True, False])
def test_forward_stand_in_matches_reference(with_sink, with_extra):
    check_stand_in(with_sink, with_extra)


def test_forward_stand_in_check_catches_a_natural_log_lse(monkeypatch):
    import _dcp_forward_driver

    monkeypatch.setattr(_dcp_forward_driver, "LOG2E", 1.0)  # LSE left in base e
    with pytest.raises(AssertionError):
        check_stand_in(True, True)


def check_stand_in(with_sink: bool, with_extra: bool) -> None:
    gen = torch.Generator().manual_seed(5 + 2 * with_sink + with_extra)
    t, h, d, n = 7, 4, 32, 40
    q = (torch.randn(t, h, d, generator=gen) * 3).to(torch.bfloat16)
    swa = torch.randn(n // 4, 4, d, generator=gen).to(torch.bfloat16)
    comp = torch.randn(n // 8, 8, 1, d, generator=gen).to(torch.bfloat16)  # 4-D, as the layer
    swa_idx = torch.stack([ref.random_topk(gen, n, c, 6) for c in (6, 3, 0, 6, 1, 0, 4)])
    idx = torch.stack([ref.random_topk(gen, n, c, 16) for c in (16, 5, 0, 0, 9, 2, 16)])
    idx[1, 1] = -1  # a hole inside the counted prefix is skipped
    swa_lens = torch.tensor([6, 3, 0, 4, 1, 0, 4], dtype=torch.int32)  # row 3: lens < filled
    lens = (idx >= 0).sum(-1, dtype=torch.int32)
    lens[4] = 3
    sink = torch.randn(h, generator=gen) if with_sink else None
    scale = d**-0.5
    sources = [ref.Source(swa.reshape(-1, d), swa_idx, swa_lens)]
    if with_extra:
        sources.append(ref.Source(comp.reshape(-1, d), idx, lens))
    want = ref.sparse_attention(q, sources, scale, d, sink, torch.bfloat16)
    got = _stand_in(
        q,
        swa,
        swa_idx[:, None],
        swa_lens,
        comp if with_extra else None,
        idx if with_extra else None,
        lens if with_extra else None,
        scale,
        sink,
        d,
    )
    # fp32 math on both sides, one bf16 rounding of the output
    torch.testing.assert_close(got[0], want.out, atol=1e-2, rtol=1e-2)
    torch.testing.assert_close(got[1], want.lse, atol=1e-4, rtol=1e-6)
    empty = torch.tensor([2]) if with_extra else torch.tensor([2, 5])  # rows with no candidate
    if sink is None:  # no candidate and no sink: -1e30 and 0
        assert (got[1][empty] == EMPTY_LSE).all() and (got[0][empty] == 0).all()
    else:  # the sink alone: LSE = sink in base 2, output 0
        torch.testing.assert_close(got[1][empty], (sink * ref.LOG2E).expand(len(empty), h))


def test_forward_stand_in_reads_no_swa_past_lens():
    # lens=None reads the whole row; lens=0 reads nothing, even with ids present.
    q = torch.ones(1, 1, 4, dtype=torch.bfloat16)
    swa = torch.arange(8.0).reshape(2, 4).to(torch.bfloat16)
    idx = torch.tensor([[[1, -1]]], dtype=torch.int32)
    whole = _stand_in(q, swa, idx, None, None, None, None, 1.0, None, 4)
    none = _stand_in(
        q, swa, idx, torch.tensor([0], dtype=torch.int32), None, None, None, 1.0, None, 4
    )
    assert torch.equal(whole[0][0, 0].float(), swa[1].float())
    assert (none[1] == EMPTY_LSE).all() and (none[0] == 0).all()


# ---- the forward from the baked tree ----------------------------------------


@pytest.fixture(scope="module")
def forward(cpu_bake) -> dict:
    return run_forward(cpu_bake.tree)


def _failed(result: dict) -> set[str]:
    """``name@W@combine@stage`` of every failing check (W, combine, stage: DCP>1 only)."""
    keys = set()
    for c in result["checks"]:
        if not c["ok"]:
            parts = c["case"].split(":")
            where = parts[:3] if c["case"].startswith("W") else []
            keys.add("@".join([c["name"], *where]))
    return keys


def test_forward_runs_the_baked_tree(forward, cpu_bake):
    tree = Path(cpu_bake.tree).resolve()
    assert Path(forward["vllm_file"]).is_relative_to(tree)
    assert forward["class"] == "DeepseekV4FlashInferSM120Attention"
    # every kernel Triton ran is the baked file's own text
    verbatim = {rel: r["kernels_verbatim"] for rel, r in forward["kernels"].items()}
    assert {rel: set(v) for rel, v in verbatim.items()} == KERNELS
    assert all(ok for v in verbatim.values() for ok in v.values())


def test_forward_dcp1_layer_matches_reference(forward):
    mine = [c for c in forward["checks"] if c["name"].startswith("dcp1_reference:")]
    assert {c["name"] for c in mine} == {
        f"dcp1_reference:{k}" for k in ("decode", "prefill", "padding")
    }
    bad = [c for c in mine if not c["ok"]]
    assert not bad, bad


def _params():
    for w in WORLDS:
        for combine in COMBINES:
            for stage9 in ("no_stage9", "stage9"):
                yield pytest.param(w, combine, stage9)


@pytest.mark.parametrize("w, combine, stage9", _params())
def test_forward_dcp_matches_dcp1(forward, w, combine, stage9):
    prefix = f"W{w}:{combine}:{stage9}:"
    mine = [c for c in forward["checks"] if c["case"].startswith(prefix)]
    kinds = {"decode", "prefill"} | ({"padding"} if stage9 == "no_stage9" else set())
    assert {c["name"] for c in mine} == kinds
    assert {c["case"].rsplit(":r", 1)[1] for c in mine} == {str(r) for r in range(w)}
    bad = [c for c in mine if not c["ok"]]
    assert not bad, f"{len(bad)}/{len(mine)} failed, first: {bad[:3]}"


# ---- planted bugs -----------------------------------------------------------

# variant -> (correct '+' line of patch 09, planted text, checks that must fail, must pass);
# checks are name@W@combine@stage as _failed() writes them; the quick run has W=2 only.
STAGES = ("no_stage9", "stage9")


def _keys(kinds, combines=COMBINES, stages=STAGES) -> set[str]:
    w = f"W{QUICK_WORLDS[0]}"
    return {f"{k}@{w}@{c}@{s}" for k in kinds for c in combines for s in stages}


REFERENCE = {f"dcp1_reference:{k}" for k in ("decode", "prefill", "padding")}
# Stage 9's prefill rows neither convert indices nor combine; padding rows attend nothing.
UNTOUCHED = REFERENCE | _keys(["prefill"], stages=["stage9"]) | _keys(["padding"])
# Rows that run _compressed_topk_to_slots and _run_sm120_dcp.
TOUCHED = _keys(["decode"]) | _keys(["prefill"], stages=["no_stage9"])
BUGS = {
    # index conversion: the interleave is dropped (right only at K == 1; the case has K=2)
    "index_interleave": (
        "cp_kv_cache_interleave_size=self.cp_kv_cache_interleave_size,",
        "cp_kv_cache_interleave_size=1,",
        TOUCHED,
        UNTOUCHED,
    ),
    # combine: the ag_rs flavour reads the base-2 LSE as base e
    "combine_lse_base": (
        "is_lse_base_on_e=False,",
        "is_lse_base_on_e=True,",
        {k for k in TOUCHED if "@ag_rs@" in k},
        UNTOUCHED | {k for k in TOUCHED if "@a2a@" in k},
    ),
    # combine: one CPTritonContext kept per layer (the bug patch 09 had): its cached
    # relaunch omits the constexpr arguments Triton's compiled launcher takes, so a layer's
    # second ag_rs combine raises (2x H200: 24 of 27 arguments); only the mixed step
    # without stage 9 combines twice in one layer
    "kept_cp_ctx": (
        "ctx=CPTritonContext(),",
        'ctx=self.__dict__.setdefault("_cp_ctx", CPTritonContext()),',
        {f"decode@W{QUICK_WORLDS[0]}@ag_rs@no_stage9"},
        {k for k in UNTOUCHED | TOUCHED if not k.endswith("@ag_rs@no_stage9")},
    ),
    # combine (ag_rs): the partials reduce-scattered in token-major, not rank-major, order
    # (rows are mixed across tokens, so padding rows of the same steps fail too)
    "ag_rs_not_rank_major": (
        "ranked = out_gathered.view(tokens, world, heads // world, dim).transpose(0, 1)",
        "ranked = out_gathered.view(tokens, world, heads // world, dim)",
        {k for k in TOUCHED if "@ag_rs@" in k},
        {k for k in UNTOUCHED | TOUCHED if "@ag_rs@" not in k},
    ),
    # combine (a2a): the unpack into the output combines one rank's partial only
    "a2a_unpack_one_rank": (
        "N=world,",
        "N=1,",
        {k for k in TOUCHED if "@a2a@" in k},
        {k for k in UNTOUCHED | TOUCHED if "@a2a@" not in k},
    ),
    # combine: the sink is folded in on every rank, not on rank 0 only
    "sink_every_rank": (
        "sink if self.dcp_rank == 0 else None,",
        "sink,",
        TOUCHED,
        UNTOUCHED,
    ),
}


@pytest.fixture(scope="module")
def planted(module_tmp, cache) -> dict[str, tuple[Path, dict]]:
    trees = {}
    for name, (old, new, _, _) in BUGS.items():
        trees[name] = bake_planted(module_tmp(name), cache, PATCH, old, new)
    with ThreadPoolExecutor(max_workers=min(len(trees), os.cpu_count() or 1)) as pool:
        runs = pool.map(lambda tree: run_forward(tree, quick=True), trees.values())
        results = dict(zip(trees, runs, strict=True))
    return {name: (trees[name], results[name]) for name in trees}


@pytest.mark.slow
@pytest.mark.parametrize("name", BUGS)
def test_forward_fails_on_planted_bug(planted, name):
    old, new, must_fail, must_pass = BUGS[name]
    tree, result = planted[name]
    assert Path(result["vllm_file"]).is_relative_to(Path(tree).resolve())
    baked = (Path(tree) / TARGET).read_text()
    assert new in baked and old not in baked, "the bug did not reach the baked tree"
    bad = _failed(result)
    assert must_fail <= bad, f"planted {new!r}; failing: {sorted(bad)}"
    assert not (must_pass & bad), f"unrelated checks failed: {sorted(must_pass & bad)}"
