"""DCP W == DCP1 for patch 09's attention math, on the pure-torch reference.

Tolerances are vLLM's own DCP combine tests': fp32 atol/rtol 1e-5 (LSE 1e-4),
bf16 3e-2. Ranks run in-process (``run_spmd``); tests/lab/dcp/test_dcp_gloo.py runs the
same code over real gloo process groups.
"""

from __future__ import annotations

import math
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lab.dcp import reference as ref
from lab.dcp.reference import attention  # where planted bugs go: the caller's module

TOL = {torch.float32: 1e-5, torch.bfloat16: 3e-2}
LSE_TOL = 1e-4
PROPS = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def run_dcp(step, layout, combine, dtype, seed=0, caches=None):
    gen = torch.Generator().manual_seed(seed)
    caches = caches or ref.build_caches(step.states, layout, gen)
    return ref.run_spmd(
        layout.world_size,
        lambda g: ref.dcp_attention(g, step, caches[g.rank_in_group], layout, combine, dtype),
    )


def run_dcp1(step, page_size, dtype, seed=1):
    gen = torch.Generator().manual_seed(seed)
    cache = ref.build_caches(step.states, ref.ShardLayout(1, 1, page_size), gen)[0]
    return ref.dcp1_attention(step, cache, dtype)


def assert_parity(step, layout, combine, dtype, caches=None):
    """Every rank's own heads, output and LSE, match DCP1's slice of them."""
    dcp1 = run_dcp1(step, layout.page_size, dtype)
    outs = run_dcp(step, layout, combine, dtype, caches=caches)
    assert_heads_match(dcp1, outs, dtype)
    return dcp1, outs


def assert_heads_match(dcp1, outs, dtype):
    """Rank ``r`` of ``outs`` (its own heads after the combine) equals DCP1's slice."""
    h = dcp1.lse.shape[1] // len(outs)
    tol = TOL[dtype]
    for rank, got in enumerate(outs):
        heads = slice(rank * h, (rank + 1) * h)
        torch.testing.assert_close(got.out.float(), dcp1.out[:, heads].float(), atol=tol, rtol=tol)
        torch.testing.assert_close(got.lse, dcp1.lse[:, heads], atol=LSE_TOL, rtol=LSE_TOL)


def partials(step, layout, dtype=torch.float32):
    """Each rank's pre-combine partial (output, LSE) for all gathered heads."""
    caches = ref.build_caches(step.states, layout, torch.Generator().manual_seed(0))
    return ref.run_spmd(
        layout.world_size,
        lambda g: ref.rank_attention(g, step, caches[g.rank_in_group], layout, dtype),
    )


@st.composite
def cases(draw, dtype=None):
    w = draw(st.sampled_from([1, 2, 4, 8]))
    k = draw(st.sampled_from([1, 2, 4, 8]))
    bs = k * draw(st.sampled_from([1, 2, 4]))
    n_req = draw(st.integers(1, 3))
    span = bs * w
    n_states = [draw(st.integers(0, 3 * span + 3)) for _ in range(n_req)]
    # decode rows (1 token) and prefill chunks (several)
    tokens = [draw(st.sampled_from([1, 1, 2, 5])) for _ in range(n_req)]
    step = ref.random_step(
        torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1))),
        n_states,
        tokens,
        heads=w * draw(st.sampled_from([1, 2])),
        topk=draw(st.sampled_from([4, 8, 16])),
        dtype=dtype or draw(st.sampled_from([torch.float32, torch.bfloat16])),
        logit_scale=draw(st.sampled_from([0.3, 1.0, 3.0])),
        padding_rows=draw(st.integers(0, 2)),
    )
    return step, ref.ShardLayout(w, k, bs)


# ---- formulas ---------------------------------------------------------------


@pytest.mark.property
@PROPS
@given(
    w=st.sampled_from([1, 2, 4, 8]),
    k=st.sampled_from([1, 2, 4, 8]),
    m=st.sampled_from([1, 2, 4]),
)
def test_lookup_matches_vllm_placement(w, k, m):
    """The kernel's owner/local formula lands where vLLM's slot mapping wrote."""
    bs = k * m
    ids = torch.arange(5 * bs * w)
    rank, page, off = ref.placement(ids, w, k, bs)
    local = ref.local_index(ids, w, k)
    assert torch.equal(ref.owner_rank(ids, w, k), rank)
    assert torch.equal(local // bs, page)
    assert torch.equal(local % bs, off)
    # ownership is a partition: each rank's locals are 0..n-1 with no gap
    for r in range(w):
        mine = local[rank == r]
        assert torch.equal(mine.sort().values, torch.arange(mine.numel()))


def brute_force_slots(ids, rows, cache, layout, rank):
    """Oracle: walk every id through ``placement`` and this rank's table."""
    out = []
    for i, req in zip(ids.tolist(), rows.tolist(), strict=True):
        if i < 0:
            continue
        owner, page, off = (int(x) for x in ref.placement(torch.tensor(i), *layout_args(layout)))
        if owner == rank:
            out.append(int(cache.block_table[req, page]) * layout.page_size + off)
    return out


def layout_args(layout):
    return layout.world_size, layout.interleave, layout.page_size


@pytest.mark.property
@PROPS
@given(case=cases(dtype=torch.float32))
def test_filter_and_convert_compacts_owned_slots(case):
    step, layout = case
    caches = ref.build_caches(step.states, layout, torch.Generator().manual_seed(0))
    counts = torch.zeros(step.topk_ids.shape[0], dtype=torch.int32)
    for rank, cache in enumerate(caches):
        slots, lens = ref.filter_and_convert(
            step.topk_ids, step.token_to_req, cache.block_table, layout, rank
        )
        counts += lens
        for row in range(slots.shape[0]):
            n = int(lens[row])
            want = brute_force_slots(
                step.topk_ids[row],
                step.token_to_req[row].expand(slots.shape[1]),
                cache,
                layout,
                rank,
            )
            assert slots[row, :n].tolist() == want  # stable prefix, kernel order
            assert (slots[row, n:] == -1).all()
    # every valid id is owned by exactly one rank
    assert torch.equal(counts, (step.topk_ids >= 0).sum(-1, dtype=torch.int32))


# ---- DCP W == DCP1 ----------------------------------------------------------


@pytest.mark.property
@PROPS
@given(case=cases(), combine=st.sampled_from(["ag_rs", "a2a"]))
def test_dcp_matches_dcp1(case, combine):
    step, layout = case
    assert_parity(step, layout, combine, step.q.dtype)


@pytest.mark.property
@PROPS
@given(case=cases())
def test_flavours_agree(case):
    """ag_rs and a2a hand each rank the same heads (LSE bit-identical)."""
    step, layout = case
    dtype = step.q.dtype
    a = run_dcp(step, layout, "ag_rs", dtype)
    b = run_dcp(step, layout, "a2a", dtype)
    for x, y in zip(a, b, strict=True):
        torch.testing.assert_close(x.out.float(), y.out.float(), atol=TOL[dtype], rtol=TOL[dtype])
        torch.testing.assert_close(x.lse, y.lse, atol=LSE_TOL, rtol=LSE_TOL)


# ---- listed edges -----------------------------------------------------------

COMBINES = pytest.mark.parametrize("combine", ["ag_rs", "a2a"])
DTYPES = pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])


@COMBINES
@DTYPES
def test_context_shorter_than_w(combine, dtype):
    layout = ref.ShardLayout(4, 1, 4)
    step = ref.random_step(torch.Generator().manual_seed(3), [2], [3], heads=8, dtype=dtype)
    step = replace(step, topk_ids=torch.tensor([[0, 1, -1, -1]] * 3, dtype=torch.int32))
    assert_parity(step, layout, combine, dtype)
    parts = partials(step, layout, dtype)
    # ranks 2 and 3 own nothing: their whole partial is the empty row
    for rank in (2, 3):
        assert (parts[rank].lse == ref.EMPTY_LSE).all()
        assert (parts[rank].out == 0).all()


@COMBINES
@DTYPES
def test_all_candidates_on_one_rank(combine, dtype):
    layout = ref.ShardLayout(4, 2, 4)
    gen = torch.Generator().manual_seed(4)
    step = ref.random_step(gen, [64, 40], [1, 3], heads=8, dtype=dtype, topk=8)
    ids = torch.arange(64)
    on_rank1 = ids[ref.owner_rank(ids, 4, 2) == 1]
    rows = [on_rank1[torch.randperm(len(on_rank1), generator=gen)[:8]] for _ in range(4)]
    rows = [r[r < n] for r, n in zip(rows, [64, 40, 40, 40], strict=True)]
    topk = torch.full((4, 8), -1, dtype=torch.int32)
    for i, r in enumerate(rows):
        topk[i, : len(r)] = r
    step = replace(step, topk_ids=topk)
    assert_parity(step, layout, combine, dtype)
    parts = partials(step, layout, dtype)
    assert (parts[2].lse == ref.EMPTY_LSE).all() and (parts[3].lse == ref.EMPTY_LSE).all()
    assert (parts[1].lse > ref.EMPTY_LSE).all()


@COMBINES
@DTYPES
def test_all_minus_one_rows(combine, dtype):
    layout = ref.ShardLayout(2, 2, 4)
    step = ref.random_step(torch.Generator().manual_seed(5), [30], [4], heads=4, dtype=dtype)
    topk = step.topk_ids.clone()
    topk[1:3] = -1  # rows 1-2: no compressed candidate (row SWA may remain)
    step = replace(step, topk_ids=topk)
    assert_parity(step, layout, combine, dtype)


@COMBINES
@DTYPES
def test_sink_only_rows(combine, dtype):
    layout = ref.ShardLayout(4, 1, 2)
    step = ref.random_step(torch.Generator().manual_seed(6), [9], [3], heads=8, dtype=dtype)
    step = replace(
        step,
        topk_ids=torch.full_like(step.topk_ids, -1),
        swa_lens=torch.zeros_like(step.swa_lens),
    )
    dcp1, outs = assert_parity(step, layout, combine, dtype)
    want = (step.sink * ref.LOG2E).expand_as(dcp1.lse)
    torch.testing.assert_close(dcp1.lse, want)
    assert (dcp1.out == 0).all()
    for rank, got in enumerate(outs):
        torch.testing.assert_close(got.lse, want[:, rank * 2 : rank * 2 + 2])
        assert (got.out == 0).all()


@COMBINES
@pytest.mark.parametrize("w,k,bs", [(2, 1, 4), (2, 2, 4), (4, 2, 8), (8, 4, 8), (4, 8, 8)])
def test_ids_at_page_interleave_rank_boundaries(combine, w, k, bs):
    span = bs * w
    edges = {k - 1, k, k * w - 1, k * w, bs - 1, bs, span - 1, span, 2 * span - 1}
    n = 2 * span + 1
    ids = sorted(i for i in edges | {n - 1} if 0 <= i < n)
    layout = ref.ShardLayout(w, k, bs)
    step = ref.random_step(torch.Generator().manual_seed(7), [n], [2], heads=2 * w, topk=len(ids))
    topk = torch.tensor([ids, ids[::-1]], dtype=torch.int32)
    step = replace(step, topk_ids=topk)
    assert_parity(step, layout, combine, torch.float32)


def one_hot_partials(lses, w, h, d, gen):
    """Per-rank partials with given LSEs; empty ranks (-1e30) get output 0."""
    out = []
    for lse in lses:
        o = torch.randn(1, w * h, d, generator=gen)
        o = torch.where(lse[..., None] <= ref.EMPTY_LSE, 0.0, o)
        out.append(ref.AttnOut(o, lse))
    return out


@COMBINES
def test_empty_lse_is_the_merge_identity(combine):
    """-1e30 rows drop out of the combine exactly, with no masking step."""
    w, h, d = 4, 2, 8
    gen = torch.Generator().manual_seed(8)
    lse = torch.randn(w, 1, w * h, generator=gen) * 10
    empty = torch.tensor([False, True, False, True])
    lse[empty] = ref.EMPTY_LSE
    parts = one_hot_partials(lse, w, h, d, gen)
    got = ref.run_spmd(w, lambda g: ref.COMBINES[combine](g, parts[g.rank_in_group]))
    live = [p for p, e in zip(parts, empty.tolist(), strict=True) if not e]
    total = torch.logsumexp(torch.stack([p.lse for p in live]) * math.log(2), 0) / math.log(2)
    want = sum(torch.exp2(p.lse - total)[..., None] * p.out for p in live)
    for rank, g in enumerate(got):
        heads = slice(rank * h, (rank + 1) * h)
        torch.testing.assert_close(g.lse, total[:, heads], atol=LSE_TOL, rtol=LSE_TOL)
        torch.testing.assert_close(g.out, want[:, heads], atol=1e-5, rtol=1e-5)
    # all ranks empty: LSE stays -1e30 (not NaN, not -inf) and the output 0
    parts = one_hot_partials(torch.full((w, 1, w * h), ref.EMPTY_LSE), w, h, d, gen)
    got = ref.run_spmd(w, lambda g: ref.COMBINES[combine](g, parts[g.rank_in_group]))
    for g in got:
        assert (g.lse == ref.EMPTY_LSE).all() and (g.out == 0).all()


# ---- stage 9 prefill gather -------------------------------------------------


@pytest.mark.property
@PROPS
@given(
    case=cases(dtype=torch.float32), ratio=st.sampled_from([1, 4]), num_decodes=st.integers(0, 1)
)
def test_prefill_gather_maps_ids_to_their_states(case, ratio, num_decodes):
    """Every valid id's slot in the gathered buffer holds that global state,
    and the stage-9 attention over it equals DCP1."""
    step, layout = case
    decodes = [ref.random_step(torch.Generator().manual_seed(0), [5], [1], 1).states[0]]
    states = tuple(decodes[:num_decodes]) + step.states
    caches = ref.build_caches(states, layout, torch.Generator().manual_seed(9))
    seq_lens = [s.shape[0] * ratio + ratio - 1 for s in step.states]
    # prefill rows index the prefill requests after the decodes in the table
    rows = step.token_to_req + num_decodes
    got = ref.run_spmd(
        layout.world_size,
        lambda g: ref.prefill_gather(
            g,
            caches[g.rank_in_group],
            layout,
            seq_lens,
            ratio,
            num_decodes,
            step.topk_ids,
            rows,
            step.is_valid,
        ),
    )
    flat = got[0].kv.reshape(-1, got[0].kv.shape[-1])
    for g in got[1:]:  # every rank builds the same buffer
        assert torch.equal(g.kv.nan_to_num(7.0), got[0].kv.nan_to_num(7.0))
        assert torch.equal(g.slots, got[0].slots) and torch.equal(g.lens, got[0].lens)
    for row in range(step.topk_ids.shape[0]):
        for i, slot in zip(step.topk_ids[row].tolist(), got[0].slots[row].tolist(), strict=True):
            assert (i < 0) == (slot < 0)
            if i >= 0:
                assert torch.equal(flat[slot], step.states[int(step.token_to_req[row])][i])
    dcp1 = run_dcp1(step, layout.page_size, torch.float32)
    stage9 = ref.prefill_attention(step, got[0], torch.float32)
    torch.testing.assert_close(stage9.out, dcp1.out, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(stage9.lse, dcp1.lse, atol=LSE_TOL, rtol=LSE_TOL)


def test_neutral_swa_and_sink_helpers():
    idx, lens = ref.neutral_swa(3, 5)
    assert idx.shape == (3, 1, 5) and (idx == -1).all() and idx.dtype == torch.int32
    assert (lens == 0).all() and lens.dtype == torch.int32
    sinks = [torch.full((2,), float(r)) for r in range(4)]
    got = ref.run_spmd(4, lambda g: ref.gathered_sink(g, sinks[g.rank_in_group]))
    for g in got:
        assert g.tolist() == [0.0, 0.0, 1.0, 1.0, 2.0, 2.0, 3.0, 3.0]


def test_shard_layout_rejects_interleave_straddling_a_page():
    with pytest.raises(ValueError):
        ref.ShardLayout(2, 4, 6)


# ---- the checks can fail --------------------------------------------------------


def sensitive_case():
    layout = ref.ShardLayout(2, 2, 4)
    step = ref.random_step(torch.Generator().manual_seed(10), [37, 20], [2, 1], heads=4)
    return step, layout


@pytest.mark.parametrize(
    "name,bug",
    [
        ("owner_rank", lambda ids, w, k: ids % w),  # forgets the interleave
        ("owner_rank", lambda ids, w, k: (ids // k + 1) % w),  # off by one rank
        ("local_index", lambda ids, w, k: ids // w),  # round-robin local index
    ],
)
def test_parity_catches_a_planted_lookup_bug(monkeypatch, name, bug):
    step, layout = sensitive_case()
    assert_parity(step, layout, "ag_rs", torch.float32)  # sane before the plant
    monkeypatch.setattr(attention, name, bug)
    with pytest.raises(AssertionError):
        assert_parity(step, layout, "ag_rs", torch.float32)


@COMBINES
def test_parity_catches_sink_on_every_rank(monkeypatch, combine):
    """Folding the sink on all ranks (not only rank 0) must break parity."""
    step, layout = sensitive_case()
    real = ref.sparse_attention
    monkeypatch.setattr(
        attention,
        "sparse_attention",
        lambda q, src, sc, vd, sink, dt: real(q, src, sc, vd, step.sink, dt),
    )
    with pytest.raises(AssertionError):
        assert_parity(step, layout, combine, torch.float32)


def test_prefill_check_catches_a_planted_remap_bug(monkeypatch):
    step, layout = sensitive_case()
    caches = ref.build_caches(step.states, layout, torch.Generator().manual_seed(0))

    def gathered():
        return ref.run_spmd(
            2,
            lambda g: ref.prefill_gather(
                g,
                caches[g.rank_in_group],
                layout,
                [37, 20],
                1,
                0,
                step.topk_ids,
                step.token_to_req,
                step.is_valid,
            ),
        )[0]

    def check(g):
        stage9 = ref.prefill_attention(step, g, torch.float32)
        dcp1 = run_dcp1(step, layout.page_size, torch.float32)
        torch.testing.assert_close(stage9.out, dcp1.out, atol=1e-5, rtol=1e-5)

    check(gathered())

    def page_major(ids, base, pages, w, k, bs):
        # the plausible slip: vblock*W + owner instead of owner*pages + vblock
        st = ids.long().clamp_min(0)
        vblock, off = st // (bs * w), st % (bs * w)
        loff = (off // (k * w)) * k + off % k
        slot = (base + vblock * w + (off // k) % w) * bs + loff
        return torch.where(ids >= 0, slot, -1)

    monkeypatch.setattr(attention, "prefill_remap", page_major)
    with pytest.raises(AssertionError):
        check(gathered())


# ---- the lab's dcp needs torch only --------------------------------------------------

# lab/gpu (through its doors, tools/gpu_*.py) runs on a host with torch and Triton and nothing
# else (no click, no vLLM): it, and everything under lab/dcp/, may add only the stdlib to what
# torch imports.
GPU_TOOLS = (
    *(f"lab.gpu.{run}" for run in ("dcp_bench", "triton_kernels", "candidate_blocks")),
    *("gpu_dcp_bench", "gpu_triton_kernels", "gpu_candidate_blocks"),  # their doors
)
_ROOT = Path(__file__).resolve().parents[3]
DCP_MODULES = tuple(  # every module of the room, found on disk (a new one is covered)
    ".".join(path.relative_to(_ROOT).with_suffix("").parts).removesuffix(".__init__")
    for path in sorted((_ROOT / "lab" / "dcp").rglob("*.py"))
)
_NON_STDLIB_AFTER_TORCH = """
import importlib, os, sys
import torch, torch.distributed
before = set(sys.modules)
sys.path.insert(0, "tools")
for name in sys.argv[1:]:
    importlib.import_module(name)
new = {m.split(".")[0] for m in set(sys.modules) - before}
ours = {"bakery", "lab"} | {m for m in new if os.path.exists(f"tools/{m}.py")}
print(" ".join(sorted(new - set(sys.stdlib_module_names) - ours)))
"""


def non_stdlib_imports(*modules: str) -> set[str]:
    """Top-level packages beyond the stdlib that importing ``modules`` adds to torch's own."""
    run = subprocess.run(
        [sys.executable, "-c", _NON_STDLIB_AFTER_TORCH, *modules],
        cwd=Path(__file__).resolve().parents[3],
        capture_output=True,
        text=True,
    )
    assert run.returncode == 0, run.stderr
    return set(run.stdout.split())


def test_the_dcp_room_and_the_gpu_tools_import_nothing_but_torch():
    assert {"lab.dcp", "lab.dcp.ranks", "lab.dcp.reference.shards"} <= set(DCP_MODULES)
    assert non_stdlib_imports(*DCP_MODULES, *GPU_TOOLS) <= {"triton"}
    # the check sees a planted dependency (click: the CLI's, absent on the GPU host)
    assert "click" in non_stdlib_imports(*DCP_MODULES, "click")
