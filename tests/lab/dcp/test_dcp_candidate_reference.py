"""Stage 4 on the reference: DeepSeek-V4.1 candidate blocks under DCP W == DCP1.

The chain the issue asks for, per hypothesis example: every rank publishes the
same GLOBAL candidate blocks as DCP1, the consumer masks (local columns through
the local->global map) equal DCP1's mask on those columns, the merged token top-k
equals DCP1's, and the sparse attention over those ids equals DCP1's. Inputs mix
ties, -inf and NaN, padding rows, prefill rows with growing ends, short contexts
(fewer blocks than the budget) and one partial block; block sizes need not be
multiples of interleave x W. Ranks run in-process (``run_spmd``).
"""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lab.dcp import reference as ref
from lab.dcp.reference import candidates  # where the planted map bug goes

PROPS = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
# value palette: few distinct values so ties are common
PALETTE = (-2.0, -1.0, 0.0, -0.0, 0.5, 1.0, 3.0, -math.inf, math.nan)


@st.composite
def candidate_cases(draw):
    w = draw(st.sampled_from((1, 2, 4, 8)))
    k = draw(st.sampled_from((1, 2, 4)))
    bs = draw(st.sampled_from((1, 3, 4, 5, 8, 16)))
    n = draw(st.integers(1, 70))
    topk_blocks = draw(st.integers(1, 12))
    topk = draw(st.integers(1, 16))
    kinds = draw(
        st.lists(st.sampled_from(("decode", "prefill", "pad", "short")), min_size=1, max_size=5)
    )
    ends = []
    for kind in kinds:
        if kind == "decode":
            ends.append(n)
        elif kind == "pad":
            ends.append(0)
        elif kind == "short":  # one partial block, or fewer blocks than the budget
            ends.append(draw(st.integers(1, min(n, bs))))
        else:
            first = draw(st.integers(1, n))
            ends.extend(range(first, min(n, first + 3) + 1))
    seed = draw(st.integers(0, 2**16))
    special = draw(st.sampled_from(("none", "ninf_rows", "nan", "ties")))
    gen = torch.Generator().manual_seed(seed)
    pick = torch.randint(0, len(PALETTE) - 2, (len(ends), n), generator=gen)
    logits = torch.tensor(PALETTE)[pick]
    if special == "none":
        logits = torch.randn(len(ends), n, generator=gen)
    elif special == "ninf_rows":
        logits[::2] = -math.inf
    elif special == "nan":
        logits[torch.rand(logits.shape, generator=gen) < 0.05] = math.nan
    return dict(
        w=w,
        k=k,
        bs=bs,
        topk_blocks=topk_blocks,
        topk=topk,
        logits=logits,
        ends=torch.tensor(ends, dtype=torch.int32),
    )


EXCHANGES = {
    "dense": ref.candidate_blocks_dcp,
    "sparse": ref.candidate_blocks_dcp_sparse,
    "index_k": ref.candidate_blocks_dcp_index_k,
}


def dcp_chain(c, exchange="dense"):
    """Per rank: (candidate blocks, local masked logits, merged token top-k)."""
    w, k = c["w"], c["k"]
    source = EXCHANGES[exchange]

    def rank(g):
        local, local_ends = ref.shard_columns(c["logits"], c["ends"], g.rank_in_group, w, k)
        cands = source(g, local, local_ends, c["topk_blocks"], c["bs"], k, c["logits"].shape[1])
        masked = ref.mask_candidates_dcp(local, local_ends, cands, c["bs"], g.rank_in_group, w, k)
        return cands, masked, ref.token_topk_dcp(g, masked, c["topk"], k)

    return ref.run_spmd(w, rank)


def dcp1_chain(c):
    cands = ref.candidate_blocks_dcp1(c["logits"], c["ends"], c["topk_blocks"], c["bs"])
    masked = ref.mask_candidates_dcp1(c["logits"], c["ends"], cands, c["bs"])
    return cands, masked, ref.token_topk_dcp1(masked, c["topk"])


def assert_chain_matches(c, exchange="dense"):
    cands1, masked1, topk1 = dcp1_chain(c)
    for r, (cands, masked, topk) in enumerate(dcp_chain(c, exchange)):
        assert torch.equal(cands, cands1), f"rank {r} candidates {cands} != DCP1 {cands1}"
        want, _ = ref.shard_columns(masked1, c["ends"], r, c["w"], c["k"])
        torch.testing.assert_close(masked, want, rtol=0, atol=0, equal_nan=True)
        assert torch.equal(topk, topk1), f"rank {r} token top-k {topk} != DCP1 {topk1}"


@PROPS
@given(candidate_cases())
def test_candidate_chain_dcp_matches_dcp1(c):
    assert_chain_matches(c)


@PROPS
@given(candidate_cases())
def test_candidate_chain_index_k_matches_dcp1(c):
    """The index-K exchange (prefill) runs DCP1's own selection on the gathered columns."""
    assert_chain_matches(c, "index_k")


@PROPS
@given(candidate_cases())
def test_candidate_chain_sparse_merge_matches_dcp1(c):
    """The sparse merge publishes DCP1's blocks in DCP1's (canonical) order."""
    assert_chain_matches(c, "sparse")


def test_signed_zero_as_cuda_ranks_it():
    """The issue's reproducer: logits [-0.0, +0.0, -1.0], bs 1, k 2 (W 2, K 1). CUDA's
    DCP1 picks [2, 1]: the pinned newest block, then +0.0 above -0.0."""
    c = dict(
        w=2,
        k=1,
        bs=1,
        topk_blocks=2,
        topk=2,
        logits=torch.tensor([[-0.0, 0.0, -1.0]]),
        ends=torch.tensor([3], dtype=torch.int32),
    )
    assert dcp1_chain(c)[0].tolist() == [[2, 1]]
    for exchange in EXCHANGES:
        assert_chain_matches(c, exchange)
    both = torch.tensor([[-0.0, 0.0, -0.0, -0.0, 5.0]])  # a block of both signs is +0.0
    assert ref.block_maxima(both, torch.tensor([5]), 2, 3).tolist() == [[0.0, -0.0, 5.0]]
    assert str(ref.block_maxima(both, torch.tensor([5]), 2, 3)[0, 1].item()) == "-0.0"


def test_dense_exchange_keeps_the_positive_zero_of_another_rank():
    """Hypothesis' falsifying row (visible columns only): block 5 = [+0.0, -0.0, -1.0]
    scores +0.0 and beats block 2's -0.0, but +0.0 is on rank 1 and -0.0 on rank 0,
    and a float max over the ranks (CPU torch: zeros equal, first wins) gave -0.0."""
    c = dict(
        w=2,
        k=1,
        bs=3,
        topk_blocks=5,
        topk=1,
        logits=torch.tensor(
            [
                [-1.0, -2.0, -2.0, 1.0, 0.5, -0.0, -2.0, -0.0, -1.0, 0.5]
                + [-0.0, -1.0, 3.0, 0.5, 3.0, 0.0, -0.0, -1.0, -1.0]
            ]
        ),
        ends=torch.tensor([19], dtype=torch.int32),
    )
    assert dcp1_chain(c)[0].tolist() == [[6, 4, 1, 3, 5]]
    for exchange in EXCHANGES:
        assert_chain_matches(c, exchange)


def test_sparse_merge_needs_one_more_than_the_budget():
    """The pin can push one winner out of its rank's local top k: rank 0 holds block 0
    (+inf) and the newest block 2 (NaN, above +inf until DCP1 pins it down to +inf,
    where block 0 wins the tie). With k local entries rank 0 sends only block 2."""
    c = NEEDS_K_PLUS_ONE
    assert dcp1_chain(c)[0].tolist() == [[0]]
    assert_chain_matches(c, "sparse")


NEEDS_K_PLUS_ONE = dict(
    w=2,
    k=1,
    bs=1,
    topk_blocks=1,
    topk=2,
    logits=torch.tensor([[math.inf, 1.0, math.nan]]),
    ends=torch.tensor([3], dtype=torch.int32),
)


def test_candidate_selection_semantics():
    """DCP1 itself, by hand: NaN first, newest pinned, ties to the lower id, -1 tail."""
    nan, ninf = math.nan, -math.inf
    logits = torch.tensor(
        [
            [1.0, 5.0, 2.0, 2.0, ninf, ninf, 2.0, 0.0, 9.0],  # end 8: block 4 unseen
            [ninf, ninf, ninf, ninf, ninf, ninf, ninf, ninf, ninf],
            [0.0, nan, 1.0, 1.0, 3.0, 3.0, 1.0, 1.0, 1.0],
            [7.0, 7.0, 7.0, 7.0, 7.0, 7.0, 7.0, 7.0, 7.0],
            [7.0, 7.0, 7.0, 7.0, 7.0, 7.0, 7.0, 7.0, 7.0],
        ]
    )
    ends = torch.tensor([8, 5, 9, 9, 0], dtype=torch.int32)
    got = ref.candidate_blocks_dcp1(logits, ends, 3, 2)
    assert got.tolist() == [
        [3, 0, 1],  # newest block 3 pinned, then 5.0, then 2.0
        [2, -1, -1],  # an all -inf row keeps only its newest block
        [0, 4, 2],  # NaN sorts above the pinned +inf (torch.topk), then 3.0
        [4, 0, 1],  # all tied: the pinned newest, then the lower ids
        [-1, -1, -1],  # a padding row publishes nothing
    ]


@pytest.mark.parametrize("w,k,bs", [(2, 1, 3), (4, 2, 5), (8, 1, 16), (2, 4, 8)])
def test_candidate_attention_output_matches_dcp1(w, k, bs):
    """The last link: sparse attention over the merged ids == DCP1's, every rank."""
    gen = torch.Generator().manual_seed(w * 100 + k * 10 + bs)
    n, topk = 57, 8
    step = ref.random_step(gen, (n,), (5,), heads=2 * w, topk=topk, padding_rows=1)
    ends = torch.tensor([n, n - 3, n - 2, 1, bs, 0], dtype=torch.int32)
    c = dict(
        w=w,
        k=k,
        bs=bs,
        topk_blocks=3,
        topk=topk,
        ends=ends,
        logits=torch.randn(len(ends), n, generator=gen),
    )
    _, _, topk1 = dcp1_chain(c)
    per_rank = dcp_chain(c)
    layout = ref.ShardLayout(w, k, 2 * k)
    caches = ref.build_caches(step.states, layout, gen)
    cache1 = ref.build_caches(step.states, ref.ShardLayout(1, 1, 2 * k), gen)[0]
    dcp1 = ref.dcp1_attention(replace(step, topk_ids=topk1), cache1, torch.float32)

    def rank(g):
        ids = per_rank[g.rank_in_group][2]
        s = replace(step, topk_ids=ids)
        return ref.dcp_attention(g, s, caches[g.rank_in_group], layout, "ag_rs", torch.float32)

    h = step.heads // w
    for r, got in enumerate(ref.run_spmd(w, rank)):
        heads = slice(r * h, (r + 1) * h)
        torch.testing.assert_close(got.out, dcp1.out[:, heads], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(got.lse, dcp1.lse[:, heads], atol=1e-4, rtol=1e-4)


BUGS = {
    # a rank's local column taken as the global position
    "local_as_global": lambda local, rank, w, k: local,
    # the rank offset dropped from the map
    "no_rank_offset": lambda local, rank, w, k: (local // k) * k * w + local % k,
}


@pytest.mark.parametrize("bug", ["lowest_copy", "no_pin_entry", "local_budget_k"])
def test_sparse_merge_catches_a_planted_bug(monkeypatch, bug):
    cases = [
        NEEDS_K_PLUS_ONE,
        dict(
            w=2,
            k=1,
            bs=4,
            topk_blocks=2,
            topk=4,
            logits=torch.randn(3, 40, generator=torch.Generator().manual_seed(7)) - 5,
            ends=torch.tensor([40, 33, 9], dtype=torch.int32),
        ),
    ]
    for c in cases:
        assert_chain_matches(c, "sparse")
    if bug == "lowest_copy":
        monkeypatch.setattr(candidates, "max", min, raising=False)
    elif bug == "no_pin_entry":
        real = candidates.merge_sparse

        def no_pin(sent, *args):
            sent = sent.clone()
            sent[:, :, -1] = -1  # the newest position dropped from the message
            return real(sent, *args)

        monkeypatch.setattr(candidates, "merge_sparse", no_pin)
    else:
        monkeypatch.setattr(candidates, "local_budget", lambda topk_blocks: topk_blocks)
    with pytest.raises(AssertionError):
        for c in cases:
            assert_chain_matches(c, "sparse")


@pytest.mark.parametrize("exchange", ["dense", "index_k"])
@pytest.mark.parametrize("bug", [*BUGS, "ends_max"])
def test_candidate_chain_catches_a_planted_map_bug(monkeypatch, bug, exchange):
    gen = torch.Generator().manual_seed(7)
    c = dict(
        w=2,
        k=1,
        bs=4,
        topk_blocks=2,
        topk=4,
        logits=torch.randn(3, 40, generator=gen),
        ends=torch.tensor([40, 33, 9], dtype=torch.int32),
    )
    assert_chain_matches(c, exchange)
    if bug == "ends_max":  # DCP1's row ends as the largest rank's, not the sum
        monkeypatch.setattr(
            candidates, "global_ends", lambda g, e: g.all_gather(e[None].long(), dim=0).amax(0)
        )
    else:
        monkeypatch.setattr(candidates, "global_position", BUGS[bug])
    with pytest.raises(AssertionError):
        assert_chain_matches(c, exchange)
