"""indexer: the DeepGEMM logits, vLLM's top-k ops, the K gather and the CuteDSL DCP merge,
each against an explicit loop (torch only, so in this process; the stand-in module is
loaded off ``lab/emulate/`` without staying on the path).

Logits: DeepGEMM's reference formula, sum_h w[h] * relu(q_h . k * k_scale), -inf outside
the visible range. Top-k: sets from ``torch.topk`` on distinct scores; on ties and signed
zeros the documented rule (fp32 bit order, so -0.0 < +0.0, then the smaller column).
"""

from __future__ import annotations

import math

import pytest
import torch
from _emu import planted, stand_in
from hypothesis import given, settings
from hypothesis import strategies as st

IX = stand_in("indexer")
FP8 = torch.float8_e4m3fn
HD = 128
NEG = float("-inf")


def _fp8(shape, gen, scale=1.0):
    return (torch.randn(*shape, generator=gen) * scale).clamp(-448, 448).to(FP8)


# ---- fp8_fp4_mqa_logits ------------------------------------------------------


def _mqa_case():
    gen = torch.Generator().manual_seed(1)
    m, h, n = 5, 3, 11
    q = _fp8((m, h, HD), gen)
    k = _fp8((n, HD), gen)
    k_scale = torch.rand(n, generator=gen) * 0.02
    w = torch.randn(m, h, generator=gen)
    ks = torch.tensor([0, 0, 3, 5, 11], dtype=torch.int32)
    ke = torch.tensor([4, 11, 3, 9, 11], dtype=torch.int32)  # rows 2 and 4: empty
    return q, k, k_scale, w, ks, ke


def _mqa_reference(q, k, k_scale, w, ks, ke):
    out = torch.full((q.shape[0], k.shape[0]), NEG, dtype=torch.float64)
    for i in range(q.shape[0]):
        for j in range(int(ks[i]), int(ke[i])):
            dots = [
                float(q[i, h].double() @ k[j].double()) * float(k_scale[j])
                for h in range(q.shape[1])
            ]
            out[i, j] = sum(float(w[i, h]) * max(d, 0.0) for h, d in enumerate(dots))
    return out


def _check_mqa(fn):
    q, k, k_scale, w, ks, ke = _mqa_case()
    got = fn((q, None), (k, k_scale), w, ks, ke)
    want = _mqa_reference(q, k, k_scale, w, ks, ke)
    assert torch.equal(got.isinf(), want.isinf())
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-4)


def test_mqa_logits_match_loop():
    _check_mqa(IX.fp8_fp4_mqa_logits)


def test_mqa_logits_check_catches_an_off_by_one_range():
    bad = planted(
        IX.fp8_fp4_mqa_logits, "cols < cu_seqlen_ke[:, None]", "cols <= cu_seqlen_ke[:, None]"
    )
    with pytest.raises(AssertionError):
        _check_mqa(bad)


# ---- fp8_fp4_paged_mqa_logits ------------------------------------------------


def _paged_cache(keys: torch.Tensor):
    """``kv_cache_cast_to_fp8``'s layout: [blocks, ps, 1, 132] uint8, per page every fp8
    value (ps * 128 bytes), then every fp32 scale (ps * 4 bytes). Also the fp8 values and
    scales themselves, for the reference."""
    blocks, ps, _ = keys.shape
    scale = keys.abs().amax(-1).clamp(min=1e-4) / 448.0
    values = (keys / scale[..., None]).to(FP8)
    page = torch.cat(
        [
            values.view(torch.uint8).reshape(blocks, -1),
            scale.contiguous().view(torch.uint8).reshape(blocks, -1),
        ],
        dim=1,
    )
    return page.view(blocks, ps, 1, HD + 4), values, scale


def _paged_case():
    gen = torch.Generator().manual_seed(2)
    b, next_n, h, ps, blocks, max_len = 3, 2, 4, 8, 7, 24
    keys = torch.randn(blocks, ps, HD, generator=gen)
    cache, values, scale = _paged_cache(keys)
    table = torch.tensor([[3, 0, 5], [6, 1, 2], [4, 4, 4]], dtype=torch.int32)
    ctx = torch.tensor([19, 2, 24], dtype=torch.int32)  # row 1: step 0 sees 1 position
    q = _fp8((b, next_n, h, HD), gen)
    w = torch.randn(b * next_n, h, generator=gen)
    return q, cache, values, scale, table, ctx, w, max_len


def _paged_reference(q, values, scale, table, ctx, w, max_len):
    b, next_n, h, _ = q.shape
    ps = values.shape[1]
    out = torch.full((b * next_n, max_len), NEG, dtype=torch.float64)
    for i in range(b):
        for j in range(next_n):
            for p in range(int(ctx[i]) - next_n + 1 + j):  # visible: p <= ctx - next_n + j
                page, off = int(table[i, p // ps]), p % ps
                k = values[page, off].double()
                s = sum(
                    float(w[i * next_n + j, hh])
                    * max(float(q[i, j, hh].double() @ k) * float(scale[page, off]), 0.0)
                    for hh in range(h)
                )
                out[i * next_n + j, p] = s
    return out


def _check_paged(fn, two_d_lens=False):
    q, cache, values, scale, table, ctx, w, max_len = _paged_case()
    lens = ctx
    if two_d_lens:  # per-step lengths: step j sees ctx - next_n + 1 + j
        lens = ctx[:, None] - q.shape[1] + 1 + torch.arange(q.shape[1])[None]
    got = fn((q, None), cache, w, lens, table, None, max_len)
    want = _paged_reference(q, values, scale, table, ctx, w, max_len)
    assert torch.equal(got.isinf(), want.isinf())
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("two_d_lens", [False, True])
def test_paged_mqa_logits_match_loop(two_d_lens):
    _check_paged(IX.fp8_fp4_paged_mqa_logits, two_d_lens)


def test_paged_mqa_logits_check_catches_a_wrong_visible_range():
    bad = planted(
        IX.fp8_fp4_paged_mqa_logits,
        "last = lens - next_n + 1 + torch.arange",
        "last = lens - next_n + torch.arange",
    )
    with pytest.raises(AssertionError):
        _check_paged(bad)


def test_paged_mqa_logits_check_catches_a_wrong_scale_offset(monkeypatch):
    monkeypatch.setattr(IX, "SCALE_BYTES", 3)
    with pytest.raises(AssertionError):
        _check_paged(IX.fp8_fp4_paged_mqa_logits)


# ---- cp_gather_indexer_k_quant_cache ----------------------------------------


def _check_gather(fn):
    gen = torch.Generator().manual_seed(3)
    blocks, ps = 6, 4
    cache, _, _ = _paged_cache(torch.randn(blocks, ps, HD, generator=gen))
    table = torch.tensor([[2, 5, 0], [1, 3, 4], [0, 0, 0]], dtype=torch.int32)
    cu = torch.tensor([0, 9, 9, 13], dtype=torch.int32)  # request 1 has no token
    tables = table[[0, 2, 1]]  # rows in request order: 0, (empty), 2
    dst_k = torch.zeros(14, HD, dtype=FP8)
    dst_scale = torch.full((14, 4), 7, dtype=torch.uint8)
    fn(cache, dst_k, dst_scale, tables, cu)
    flat = cache.view(blocks, -1)
    want_k = torch.zeros(14, HD, dtype=torch.uint8)
    want_s = torch.full((14, 4), 7, dtype=torch.uint8)
    for r in range(3):
        for i in range(int(cu[r + 1] - cu[r])):
            page, off = int(tables[r, i // ps]), i % ps
            want_k[cu[r] + i] = flat[page, off * HD : (off + 1) * HD]
            at = ps * HD + off * 4
            want_s[cu[r] + i] = flat[page, at : at + 4]
    assert torch.equal(dst_k.view(torch.uint8), want_k)
    assert torch.equal(dst_scale, want_s)


def test_cp_gather_matches_loop():
    _check_gather(IX.cp_gather_indexer_k_quant_cache)


def test_cp_gather_check_catches_a_wrong_page(monkeypatch):
    bad = planted(
        IX.cp_gather_indexer_k_quant_cache,
        "pages = block_table[b, pos // page_size]",
        "pages = block_table[b, pos // page_size - (pos >= page_size).long()]",
    )
    with pytest.raises(AssertionError):
        _check_gather(bad)


# ---- the top-k ops -----------------------------------------------------------


def _rule_order(row: list[float], cols: range) -> list[int]:
    """The documented order: larger score first (+0.0 above -0.0), then smaller column."""
    return sorted(cols, key=lambda c: (-row[c], math.copysign(1.0, row[c]) < 0, c))


def _distinct(rows, cols, gen):
    return torch.randperm(rows * cols, generator=gen).float().view(rows, cols) - 20.0


def _tied(rows, cols, gen):
    x = torch.randint(-2, 3, (rows, cols), generator=gen).float()
    zero = x == 0
    sign = torch.randint(0, 2, (rows, cols), generator=gen).bool()
    x = torch.where(zero & sign, torch.tensor(-0.0), x)  # signed zeros among the ties
    x[0] = torch.tensor([-0.0, 0.0] * cols)[:cols]  # zeros of both signs across the cut
    x[0, 5:7] = 1.0
    return x


def _check_prefill(fn, make, seed):
    gen = torch.Generator().manual_seed(seed)
    rows, cols, k = 6, 30, 8
    logits = make(rows, cols, gen)
    starts = torch.tensor([0, 3, 10, 5, 0, 29], dtype=torch.int32)
    ends = torch.tensor([30, 9, 10, 30, 4, 30], dtype=torch.int32)  # 4 fewer than k, 2 none
    out = torch.full((rows, k), 99, dtype=torch.int32)
    fn(logits, starts, ends, out, rows, logits.stride(0), logits.stride(1), k)
    for r in range(rows):
        s, e = int(starts[r]), int(ends[r])
        n = min(k, e - s)
        if make is _distinct:
            want = set(torch.topk(logits[r, s:e], n).indices.tolist()) if n else set()
            assert set(out[r, :n].tolist()) == want, r
        else:
            want = [c - s for c in _rule_order(logits[r].tolist(), range(s, e))[:n]]
            assert out[r, :n].tolist() == want, (r, logits[r].tolist())
        assert (out[r, n:] == -1).all()


def _check_decode(make, seed, topk_cls=None):
    gen = torch.Generator().manual_seed(seed)
    b, next_n, cols, k = 3, 2, 25, 6
    logits = make(b * next_n, cols, gen)
    seq = torch.tensor([25, 4, 1], dtype=torch.int32)  # step j sees seq - next_n + 1 + j
    out = torch.full((b * next_n, k), 99, dtype=torch.int32)
    (topk_cls or IX.IndexerTopk)()(logits, seq, next_n, out, k, cols)
    for r in range(b * next_n):
        visible = int(seq[r // next_n]) - next_n + 1 + r % next_n
        n = min(k, visible)
        if make is _distinct:
            want = set(torch.topk(logits[r, :visible], n).indices.tolist()) if n else set()
            assert set(out[r, :n].tolist()) == want, r
        else:
            assert out[r, :n].tolist() == _rule_order(logits[r].tolist(), range(visible))[:n]
        assert (out[r, n:] == -1).all()


@pytest.mark.parametrize("make", [_distinct, _tied], ids=["distinct", "ties"])
def test_top_k_per_row_prefill_matches_topk(make):
    for seed in range(3):
        _check_prefill(IX.top_k_per_row_prefill, make, seed)


@pytest.mark.parametrize("make", [_distinct, _tied], ids=["distinct", "ties"])
def test_indexer_topk_matches_topk(make):
    for seed in range(3):
        _check_decode(make, seed)


def _zero_blind_key(score):  # a kernel comparing floats, not bits: -0.0 == +0.0
    return _REAL_KEY(torch.where(score == 0, torch.zeros_like(score), score))


_REAL_KEY = IX.score_key
_LARGER_COLUMN_FIRST = (
    "order = torch.sort(key, dim=-1, descending=True, stable=True).indices[..., :k]",
    "order = (key.shape[-1] - 1 - torch.sort(key.flip(-1), dim=-1, descending=True, "
    "stable=True).indices)[..., :k]",
)


def test_topk_checks_catch_a_sign_blind_key(monkeypatch):
    monkeypatch.setattr(IX, "score_key", _zero_blind_key)
    with pytest.raises(AssertionError):
        _check_prefill(IX.top_k_per_row_prefill, _tied, 0)
    with pytest.raises(AssertionError):
        _check_decode(_tied, 0)


def test_topk_checks_catch_larger_column_first(monkeypatch):
    monkeypatch.setattr(IX, "ranked", planted(IX.ranked, *_LARGER_COLUMN_FIRST))
    with pytest.raises(AssertionError):
        _check_prefill(IX.top_k_per_row_prefill, _tied, 0)
    with pytest.raises(AssertionError):
        _check_decode(_tied, 0)
    _check_prefill(IX.top_k_per_row_prefill, _distinct, 0)  # ties only: a subtle plant


# ---- the DCP merge -----------------------------------------------------------


class _Gather:
    """A fake DCP group: all_gather concatenates the ranks' packed tensors along dim."""

    def __init__(self, packed: list[torch.Tensor] | None = None):
        self.packed, self.seen = packed, []

    def all_gather(self, tensor, dim):
        self.seen.append(tensor.clone())
        return tensor if self.packed is None else torch.cat(self.packed, dim=dim)


def _owned(n: int, w: int, interleave: int, rank: int) -> list[int]:
    """Global ids rank ``rank`` holds, by local id: (l // I) * (W * I) + rank * I + l % I."""
    ids, local = [], 0
    while True:
        g = (local // interleave) * (w * interleave) + rank * interleave + local % interleave
        if g >= n:
            return ids
        ids.append(g)
        local += 1


def _dcp_topk(scores: torch.Tensor, w: int, interleave: int, k: int, make=None, at=False):
    """Each rank's local top-k of its shard, merged: every rank's result, rank order.
    ``at``: as prefill does, each row's shard starts at its own column (row_starts) of a
    wider logits tensor, and the local top-k is ``top_k_per_row_prefill``'s (relative)."""
    make = make or IX.make_merge_dcp_topk_global
    rows, n = scores.shape
    owned = [_owned(n, w, interleave, r) for r in range(w)]
    starts = (torch.arange(rows) * 3 + 1 if at else torch.zeros(rows, dtype=torch.long)).int()
    width = int(starts.max()) + max(1, max(map(len, owned))) + 2
    local, topk = [], []
    for r in range(w):
        shard = torch.full((rows, width), 1e30)  # outside the row's range: never visible
        for i in range(rows):
            shard[i, int(starts[i]) : int(starts[i]) + len(owned[r])] = scores[i, owned[r]]
        out = torch.full((rows, k), 99, dtype=torch.int32)
        ends = starts + len(owned[r])
        if at:
            IX.top_k_per_row_prefill(shard, starts, ends, out, rows, width, 1, k)
        else:
            IX.IndexerTopk()(shard, ends, 1, out, k, width)
        local.append(shard)
        topk.append(out)
    row_starts = starts if at else None
    first = _Gather()
    for r in range(w):  # pass 1: what each rank packs
        make(lambda: first)(local[r], topk[r].clone(), k, r, w, interleave, row_starts)
    merged = []
    for r in range(w):
        mine = topk[r].clone()
        make(lambda: _Gather(first.seen))(local[r], mine, k, r, w, interleave, row_starts)
        merged.append(mine)
    return merged


def _check_merge(scores, w, interleave, k, make=None, at=False):
    for got in _dcp_topk(scores, w, interleave, k, make, at):
        for r in range(scores.shape[0]):
            row = scores[r].tolist()
            want = _rule_order(row, range(len(row)))[:k]
            want += [-1] * (k - len(want))
            assert got[r].tolist() == want, (got[r].tolist(), want)


_SCORES = st.one_of(
    st.sampled_from([-1.0, -0.0, 0.0, 0.5, 2.0]),  # ties and signed zeros
    st.floats(-1e6, 1e6, allow_nan=False, width=32),
)


@settings(max_examples=60, deadline=None, derandomize=True)
@given(
    w=st.sampled_from([2, 4, 8]),
    interleave=st.sampled_from([1, 2]),
    k=st.integers(1, 10),
    at=st.booleans(),
    rows=st.integers(1, 40).flatmap(  # 1 to 3 rows of one length
        lambda n: st.lists(st.lists(_SCORES, min_size=n, max_size=n), min_size=1, max_size=3)
    ),
)
def test_dcp_merge_equals_the_dcp1_topk(w, interleave, k, at, rows):
    _check_merge(torch.tensor(rows, dtype=torch.float32), w, interleave, k, at=at)


def test_dcp_merge_covers_every_world_and_interleave():
    # The derandomized property above may not pair each W with each I: do so explicitly,
    # with ties and signed zeros straddling the cut.
    gen = torch.Generator().manual_seed(9)
    for w in (2, 4, 8):
        for interleave in (1, 2):
            scores = torch.cat([_distinct(1, 37, gen), _tied(2, 37, gen)])
            _check_merge(scores, w, interleave, 9)
            _check_merge(scores, w, interleave, 9, at=True)


def test_dcp_merge_check_catches_a_wrong_global_id():
    bad = planted(IX.make_merge_dcp_topk_global, "+ dcp_rank * cp_interleave", "+ dcp_rank")
    scores = _distinct(2, 37, torch.Generator().manual_seed(10))
    _check_merge(scores, 2, 1, 9, bad)  # at interleave 1 the two formulas agree
    with pytest.raises(AssertionError):
        _check_merge(scores, 2, 2, 9, bad)


def test_dcp_merge_check_catches_ids_from_the_absolute_column():
    # the global id taken from the column in the wider logits, not the row-local index
    bad = planted(
        IX.make_merge_dcp_topk_global,
        "(safe // cp_interleave) * (dcp_world_size",
        "(col // cp_interleave) * (dcp_world_size",
    )
    scores = _distinct(2, 37, torch.Generator().manual_seed(11))
    _check_merge(scores, 4, 2, 9, bad)  # row_starts None: col == safe
    with pytest.raises(AssertionError):
        _check_merge(scores, 4, 2, 9, bad, at=True)


def test_dcp_merge_on_a_rank_that_holds_no_key():
    """A prefill chunk whose requests all end before rank 1's first position (issue 33)
    leaves rank 1 logits of width 0 and no local candidate: it packs nothing but -1 (the
    pack kernel masks every load), joins the gather, and every rank gets DCP1's top-k.
    The stand-in once gathered column 0 of the empty logits and raised."""
    scores = _distinct(3, 3, torch.Generator().manual_seed(12))  # interleave 4: rank 0 owns all
    w, interleave, k = 2, 4, 2
    local = [scores.clone(), torch.empty(3, 0)]
    topk = [torch.full((3, k), 99, dtype=torch.int32) for _ in range(w)]
    IX.IndexerTopk()(local[0], torch.full((3,), 3), 1, topk[0], k, 3)
    topk[1].fill_(-1)
    first = _Gather()
    for r in range(w):
        IX.make_merge_dcp_topk_global(lambda: first)(local[r], topk[r].clone(), k, r, w, interleave)
    for r in range(w):
        mine = topk[r].clone()
        IX.make_merge_dcp_topk_global(lambda: _Gather(first.seen))(
            local[r], mine, k, r, w, interleave
        )
        for i in range(3):
            assert mine[i].tolist() == _rule_order(scores[i].tolist(), range(3))[:k]
