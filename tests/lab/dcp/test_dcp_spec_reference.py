"""Speculative decoding on the reference: the verification step under DCP W == DCP1.

Each request's step has 1 + k query tokens, each with its own causal bound. The W ranks
keep their caches across steps (``ref.open_batch``): a step writes the states it
completes on their owner ranks, attends, then commits the accepted tokens; DCP1 is
built from scratch from the step's branch (the accepted tokens only). Stage 4's
candidate chain runs per token with ``ends`` from each token's position and equals
DCP1 and, row by row, single-token decodes. Ranks run in-process (``run_spmd``).
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from lab.dcp import reference as ref
from lab.dcp.reference import spec  # where the planted bugs go
from tests.lab.dcp.test_dcp_candidate_reference import (
    PALETTE,
    assert_chain_matches,
    dcp1_chain,
    dcp_chain,
)
from tests.lab.dcp.test_dcp_reference import PROPS, assert_heads_match, run_dcp, run_dcp1

Round = tuple[ref.Step, list[int], list[int]]  # (step, q_lens, accepted)


def run_rounds(rounds: list[Round], committed, layout, ratio, combine="ag_rs"):
    """The W ranks through ``rounds`` from a batch with ``committed`` tokens: per round,
    every rank's merged heads."""
    first = rounds[0][0]
    capacity = max(s.shape[0] for step, _, _ in rounds for s in step.states) + 1
    gen = torch.Generator().manual_seed(0)
    ranks = ref.open_batch(first.states, committed, capacity, ratio, layout, gen)
    dtype = first.q.dtype
    per_rank = ref.run_spmd(
        layout.world_size,
        lambda g: ref.speculate(g, ranks[g.rank_in_group], rounds, layout, ratio, combine, dtype),
    )
    return [list(outs) for outs in zip(*per_rank, strict=True)], ranks


def assert_rounds_match_dcp1(rounds, committed, layout, ratio, combine="ag_rs"):
    """Every round at DCP W equals DCP1 run from scratch on that round's branch."""
    got, ranks = run_rounds(rounds, committed, layout, ratio, combine)
    for (step, _, _), outs in zip(rounds, got, strict=True):
        assert_heads_match(run_dcp1(step, layout.page_size, step.q.dtype), outs, step.q.dtype)
    return got, ranks


def two_rounds(gen, committed, q1, accepted, q2, heads, dspark=False, **kw) -> list[Round]:
    """A verification step, the rollback to ``accepted``, the next step on that branch."""
    s1 = ref.spec_step(gen, committed, q1, heads, dspark=dspark, **kw)
    c2 = [c + a + 1 for c, a in zip(committed, accepted, strict=True)]
    s2 = ref.spec_step(gen, c2, q2, heads, dspark=dspark, prefix=s1.states, **kw)
    return [(s1, list(q1), list(accepted)), (s2, list(q2), [q - 1 for q in q2])]


def all_visible(step, committed, q_lens, ratio):
    """``step`` with each token's ids = every state it sees (so every one is read)."""
    ends = ref.token_ends(committed, q_lens, ratio)
    width = max(1, int(ends.max()))
    ids = torch.full((len(ends), width), -1, dtype=torch.int32)
    for t, n in enumerate(ends.tolist()):
        ids[t, :n] = torch.arange(n)
    return replace(step, topk_ids=ids)


# ---- the verification step and the rollback: DCP W == DCP1 ---------------------


@st.composite
def spec_cases(draw, dspark=False):
    w = draw(st.sampled_from([1, 2, 4, 8]))
    k = draw(st.sampled_from([1, 2, 4]))
    layout = ref.ShardLayout(w, k, k * draw(st.sampled_from([1, 2])))
    ratio = draw(st.sampled_from([1, 2]))
    n_req = draw(st.integers(1, 3))
    span = layout.page_size * w * ratio
    committed = [draw(st.integers(0, 2 * span + 2)) for _ in range(n_req)]
    q1 = [1 + draw(st.integers(0, 4)) for _ in range(n_req)]  # k = 0 mixed in
    accepted = [draw(st.integers(0, q - 1)) for q in q1]
    q2 = [1 + draw(st.integers(0, 4)) for _ in range(n_req)]
    rounds = two_rounds(
        torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1))),
        committed,
        q1,
        accepted,
        q2,
        heads=w * draw(st.sampled_from([1, 2])),
        dspark=dspark,
        ratio=ratio,
        window=draw(st.integers(1, 4)),
        topk=draw(st.sampled_from([4, 8, 16])),
        dtype=draw(st.sampled_from([torch.float32, torch.bfloat16])),
        logit_scale=draw(st.sampled_from([0.3, 1.0, 3.0])),
        padding_rows=draw(st.integers(0, 1)),
    )
    return rounds, committed, layout, ratio


@PROPS
@given(case=spec_cases(), combine=st.sampled_from(["ag_rs", "a2a"]))
def test_verification_and_rollback_match_dcp1(case, combine):
    """Both steps, the second after a rollback, equal DCP1 on the accepted branch."""
    rounds, committed, layout, ratio = case
    first = rounds[0][0]
    ends = ref.token_ends(committed, rounds[0][1], ratio)
    real = first.topk_ids[: len(ends)]
    assert ((real < ends[:, None]) | (real < 0)).all()  # causal: no id past its token
    assert_rounds_match_dcp1(rounds, committed, layout, ratio, combine)


@pytest.mark.parametrize("w", [1, 2, 4, 8])
def test_mixed_batch_with_rollback(w):
    """k = 0 beside k = 3, then a rollback that leaves a rejected state unwritten."""
    layout = ref.ShardLayout(w, 1, 2)
    committed, q1, accepted, q2 = [5, 6], [1, 4], [0, 1], [1, 1]
    rounds = two_rounds(torch.Generator().manual_seed(w), committed, q1, accepted, q2, 2 * w)
    rounds = [
        (all_visible(s, c, q, 1), q, a)
        for (s, q, a), c in zip(rounds, [committed, [6, 8]], strict=True)
    ]
    _, ranks = assert_rounds_match_dcp1(rounds, committed, layout, 1)
    # the rejected state 9 of request 1 is still in its owner's cache: nothing was erased
    owner = int(ref.owner_rank(torch.tensor(9), w, 1))
    cache = ranks[owner].cache
    local = int(ref.local_index(torch.tensor(9), w, 1))
    slot = int(cache.block_table[1, local // 2]) * 2 + local % 2
    assert torch.equal(cache.flat[slot], rounds[0][0].states[1][9])
    assert ranks[owner].committed == [7, 9]  # both rounds committed


@pytest.mark.parametrize("w", [2, 4, 8])
def test_k0_is_todays_single_token_decode(w):
    """q_len 1 everywhere: bit for bit the decode path with caches built from scratch."""
    layout = ref.ShardLayout(w, 2, 4)
    committed, q_lens = [5, 17, 0], [1, 1, 1]
    step = ref.spec_step(torch.Generator().manual_seed(3), committed, q_lens, 2 * w)
    (got,), _ = run_rounds([(step, q_lens, [0, 0, 0])], committed, layout, 1)
    today = run_dcp(step, layout, "ag_rs", torch.float32)
    for a, b in zip(got, today, strict=True):
        assert torch.equal(a.out, b.out) and torch.equal(a.lse, b.lse)


@pytest.mark.parametrize("w", [1, 2, 4, 8])
def test_each_token_is_its_own_single_token_decode(w):
    """Row j of a k = 3 step equals the decode of that token alone at its position."""
    layout = ref.ShardLayout(w, 1, 2)
    committed, q_lens = [2 * w - 2], [4]
    step = ref.spec_step(torch.Generator().manual_seed(4), committed, q_lens, 2 * w)
    (got,), _ = run_rounds([(step, q_lens, [3])], committed, layout, 1)
    for j in range(4):
        alone = replace(
            step,
            q=step.q[j : j + 1],
            states=(step.states[0][: committed[0] + j + 1],),
            topk_ids=step.topk_ids[j : j + 1],
            token_to_req=step.token_to_req[j : j + 1],
            is_valid=step.is_valid[j : j + 1],
            swa_indices=step.swa_indices[j : j + 1],
            swa_lens=step.swa_lens[j : j + 1],
        )
        for a, b in zip(got, run_dcp(alone, layout, "ag_rs", torch.float32), strict=True):
            torch.testing.assert_close(a.out[j : j + 1], b.out, atol=1e-6, rtol=1e-6)
            torch.testing.assert_close(a.lse[j : j + 1], b.lse, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("ratio", [1, 2])
@pytest.mark.parametrize("w,k", [(2, 1), (2, 2), (4, 1), (8, 2)])
def test_draft_tokens_straddle_a_shard_boundary(w, k, ratio):
    """Positions cross K*W (and the page span): the new states land on two owners."""
    layout = ref.ShardLayout(w, k, k)
    edge = k * w * ratio
    committed, q_lens = [edge - 2, 2 * edge - 1], [4, 3]
    ids = ref.step_state_ids(committed[0], q_lens[0], ratio)
    assert len(set(ref.owner_rank(ids, w, k).tolist())) > 1
    rounds = two_rounds(
        torch.Generator().manual_seed(w + k), committed, q_lens, [1, 2], [3, 2], 2 * w, ratio=ratio
    )
    rounds = [
        (all_visible(s, c, q, ratio), q, a)
        for (s, q, a), c in zip(rounds, [committed, [edge, 2 * edge + 2]], strict=True)
    ]
    assert_rounds_match_dcp1(rounds, committed, layout, ratio)


@pytest.mark.parametrize("combine", ["ag_rs", "a2a"])
def test_a_rank_with_an_empty_share_for_some_tokens(combine):
    """W 4, K 1: the tokens at 1 and 2 see states 0..1 and 0..2, so rank 3 (state 3) has
    nothing for them: partial LSE -1e30 and output 0, and the merge stays finite."""
    w, committed, q_lens = 4, [1], [3]
    layout = ref.ShardLayout(w, 1, 1)
    step = all_visible(
        ref.spec_step(torch.Generator().manual_seed(5), committed, q_lens, w), committed, q_lens, 1
    )
    ranks = ref.open_batch(step.states, committed, 8, 1, layout, torch.Generator())

    def partial(g):
        ref.write_step(ranks[g.rank_in_group], layout, step.states, q_lens, 1)
        return ref.rank_attention(g, step, ranks[g.rank_in_group].cache, layout, torch.float32)

    parts = ref.run_spmd(w, partial)
    empty = {(3, 0), (3, 1), (2, 0)}  # (rank, token)
    for rank, part in enumerate(parts):
        for t in range(3):
            assert ((part.lse[t] == ref.EMPTY_LSE).all()) == ((rank, t) in empty)
            assert (part.out[t] == 0).all() or (rank, t) not in empty
    ranks = ref.open_batch(step.states, committed, 8, 1, layout, torch.Generator())
    got = ref.run_spmd(
        w,
        lambda g: ref.speculate(
            g, ranks[g.rank_in_group], [(step, q_lens, [2])], layout, 1, combine, torch.float32
        )[0],
    )
    assert all(torch.isfinite(g.out).all() and torch.isfinite(g.lse).all() for g in got)
    assert_heads_match(run_dcp1(step, 1, torch.float32), got, torch.float32)


def test_commit_refuses_more_than_the_drafts():
    (kv,) = ref.open_batch(
        [torch.zeros(2, 4)], [2], 4, 1, ref.ShardLayout(1, 1, 1), torch.Generator()
    )
    with pytest.raises(ValueError):
        ref.commit(kv, [3], [3])
    ref.commit(kv, [3], [2])
    assert kv.committed == [5]


# ---- DSpark's non-causal draft block -------------------------------------------


def test_dspark_rows_are_the_block_anchored_window_plus_the_whole_block():
    """``ComputeDSparkNoncausalSWAIndicesKernel``: [max(c - window, 0), c + q_len) for every
    token of the block; vLLM's causal decode rows: [max(p - window + 1, 0), p]."""
    idx, lens = ref.swa_rows([5, 1], [3, 2], 3, [0, 100], 6, dspark=True)
    rows = [r[0, : int(n)].tolist() for r, n in zip(idx, lens, strict=True)]
    assert rows == [[2, 3, 4, 5, 6, 7]] * 3 + [[100, 101, 102]] * 2
    idx, lens = ref.swa_rows([5], [3], 3, [0], 6)
    assert [r[0, : int(n)].tolist() for r, n in zip(idx, lens, strict=True)] == [
        [3, 4, 5],
        [4, 5, 6],
        [5, 6, 7],
    ]
    # the compressed-id variant: every token's top-k ends in the whole block's states
    assert ref.block_ids([5], [3], 1, 4).tolist() == [[5, 6, 7, -1]] * 3
    assert ref.block_ids([5], [3], 2, 4).tolist() == [[2, 3, -1, -1]] * 3  # 2 = positions 4, 5


@PROPS
@given(case=spec_cases(dspark=True))
def test_dspark_block_matches_dcp1(case):
    """Future tokens in every token's SWA rows and top-k ids, DCP W == DCP1."""
    rounds, committed, layout, ratio = case
    assert_rounds_match_dcp1(rounds, committed, layout, ratio)


@pytest.mark.parametrize("w", [1, 2, 4, 8])
def test_dspark_reads_future_states_on_their_owners(w):
    """The first token of a block reads the block's last state, owned by another rank."""
    layout = ref.ShardLayout(w, 1, 1)
    committed, q_lens = [3 * w - 1], [w + 1]
    step = ref.spec_step(
        torch.Generator().manual_seed(6), committed, q_lens, 2 * w, dspark=True, topk=4
    )
    last = committed[0] + q_lens[0] - 1
    assert last in step.topk_ids[0].tolist() and last > committed[0]
    assert_rounds_match_dcp1([(step, q_lens, [0])], committed, layout, 1)


# ---- stage 4: candidate blocks per query token ---------------------------------


@st.composite
def verify_candidate_cases(draw):
    w = draw(st.sampled_from((1, 2, 4, 8)))
    k = draw(st.sampled_from((1, 2, 4)))
    bs = draw(st.sampled_from((1, 3, 4, 5, 8)))
    ratio = draw(st.sampled_from((1, 2)))
    n_req = draw(st.integers(1, 3))
    committed = [draw(st.integers(0, 60)) for _ in range(n_req)]
    q_lens = [1 + draw(st.integers(0, 4)) for _ in range(n_req)]
    ends = ref.token_ends(committed, q_lens, ratio)
    n = max(1, int(ends.max())) + draw(st.integers(0, 3))  # the logits are wider than any end
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
    if draw(st.booleans()):
        logits = torch.randn(len(ends), n, generator=gen)
    else:  # ties, -inf and NaN
        logits = torch.tensor(PALETTE)[
            torch.randint(0, len(PALETTE), (len(ends), n), generator=gen)
        ]
    return dict(
        w=w,
        k=k,
        bs=bs,
        topk_blocks=draw(st.integers(1, 8)),
        topk=draw(st.integers(1, 12)),
        logits=logits,
        ends=ends,
        committed=committed,
        q_lens=q_lens,
        ratio=ratio,
    )


def assert_per_token(c, exchange="dense"):
    """DCP W's chain for the step equals, row by row, DCP1's chain of each token decoded
    alone (one row, its ``ends`` from its own position); no id is past its token."""
    per_rank = dcp_chain(c, exchange)
    t = 0
    for cb, q in zip(c["committed"], c["q_lens"], strict=True):
        for j in range(q):
            alone = dict(
                c, logits=c["logits"][t : t + 1], ends=ref.token_ends([cb + j], [1], c["ratio"])
            )
            cands1, masked1, topk1 = dcp1_chain(alone)
            assert ((topk1 < alone["ends"][:, None]) | (topk1 < 0)).all()
            for r, (cands, masked, topk) in enumerate(per_rank):
                assert torch.equal(cands[t : t + 1], cands1), f"rank {r} token {t}"
                want, _ = ref.shard_columns(masked1, alone["ends"], r, c["w"], c["k"])
                torch.testing.assert_close(masked[t : t + 1], want, rtol=0, atol=0, equal_nan=True)
                assert torch.equal(topk[t : t + 1], topk1), f"rank {r} token {t}"
            t += 1


@PROPS
@given(c=verify_candidate_cases(), exchange=st.sampled_from(["dense", "sparse", "index_k"]))
def test_verification_candidates_match_dcp1_per_token(c, exchange):
    assert_chain_matches(c, exchange)
    assert_per_token(c, exchange)


@pytest.mark.parametrize("ratio", [1, 2])
@pytest.mark.parametrize("w,k,bs", [(2, 1, 3), (4, 2, 5), (8, 1, 4)])
def test_candidate_ids_into_the_verification_attention(w, k, bs, ratio):
    """The chain's merged ids as the step's top-k: attention DCP W == DCP1."""
    gen = torch.Generator().manual_seed(w + k + bs + ratio)
    committed, q_lens, topk = [40, 7], [4, 2], 8
    step = ref.spec_step(gen, committed, q_lens, 2 * w, ratio=ratio, topk=topk)
    ends = ref.token_ends(committed, q_lens, ratio)
    c = dict(
        w=w,
        k=k,
        bs=bs,
        topk_blocks=3,
        topk=topk,
        ends=ends,
        logits=torch.randn(len(ends), int(ends.max()), generator=gen),
    )
    per_rank = [topk_ids for _, _, topk_ids in dcp_chain(c)]
    assert all(torch.equal(ids, per_rank[0]) for ids in per_rank)
    step = replace(step, topk_ids=per_rank[0])
    layout = ref.ShardLayout(w, k, k)
    assert_rounds_match_dcp1([(step, q_lens, [1, 0])], committed, layout, ratio)
    # the request-0 rows read a chain-picked state on more than one rank
    assert (
        len(set(ref.owner_rank(per_rank[0][:4].flatten().clamp_min(0).long(), w, k).tolist())) > 1
    )


# ---- the checks can fail ------------------------------------------------------------


def test_plant_draft_kv_written_on_the_wrong_rank(monkeypatch):
    w, committed, q_lens = 2, [5], [4]
    layout = ref.ShardLayout(w, 1, 2)
    step = all_visible(
        ref.spec_step(torch.Generator().manual_seed(7), committed, q_lens, 2 * w),
        committed,
        q_lens,
        1,
    )
    rounds = [(step, q_lens, [3])]
    assert_rounds_match_dcp1(rounds, committed, layout, 1)
    real = spec.write_states

    def next_rank(cache, lay, rank, req, ids, values):  # rank r writes rank r+1's states
        real(cache, lay, (rank + 1) % lay.world_size, req, ids, values)

    monkeypatch.setattr(spec, "write_states", next_rank)
    with pytest.raises(AssertionError):
        assert_rounds_match_dcp1(rounds, committed, layout, 1)


def test_plant_rollback_skipped_on_one_rank(monkeypatch):
    """The owner of the first rejected state (8) keeps all 4 tokens: it writes the next
    token's state at 10 and id 8 still holds the rejected draft's KV there."""
    w, committed, q1, accepted, q2 = 2, [6], [4], [1], [1]
    layout = ref.ShardLayout(w, 1, 2)
    rounds = two_rounds(torch.Generator().manual_seed(8), committed, q1, accepted, q2, 2 * w)
    rounds = [
        (all_visible(s, c, q, 1), q, a) for (s, q, a), c in zip(rounds, [[6], [8]], strict=True)
    ]
    assert_rounds_match_dcp1(rounds, committed, layout, 1)
    bad = int(ref.owner_rank(torch.tensor(8), w, 1))
    real = spec.commit

    def skipped(kv, q_lens, acc):
        real(kv, q_lens, [q - 1 for q in q_lens] if kv.rank == bad else acc)

    monkeypatch.setattr(spec, "commit", skipped)
    with pytest.raises(AssertionError):
        assert_rounds_match_dcp1(rounds, committed, layout, 1)


def test_plant_candidates_from_the_first_tokens_position(monkeypatch):
    """Every token's ``ends`` from the block's first position: the pinned newest block
    and the visible columns of the later tokens go wrong."""
    c = dict(
        w=2,
        k=1,
        bs=2,
        topk_blocks=2,
        topk=3,
        logits=torch.randn(4, 12, generator=torch.Generator().manual_seed(9)),
        committed=[7],
        q_lens=[4],
        ratio=1,
    )
    c["ends"] = ref.token_ends(c["committed"], c["q_lens"], 1)
    assert_chain_matches(c)
    assert_per_token(c)

    def first_position(committed, q_lens):
        return torch.cat([torch.full((q,), cb) for cb, q in zip(committed, q_lens, strict=True)])

    monkeypatch.setattr(spec, "step_positions", first_position)
    c["ends"] = ref.token_ends(c["committed"], c["q_lens"], 1)
    assert_chain_matches(c)  # DCP W == DCP1 on the same wrong ends: parity alone misses it
    with pytest.raises(AssertionError):
        assert_per_token(c)
