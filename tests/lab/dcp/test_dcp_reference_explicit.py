"""The DCP reference against attention written out here: softmax(q k^T * scale) plus a sink.

Every parity test in tests/lab/dcp/test_dcp_reference.py runs ``sparse_attention`` on both sides,
so a bug inside it (a scale, a boundary of the used slots) cancels out there. Here the
expected values come from a float64 loop over the step's global state ids, which shares
nothing with the reference but the input. The planted bugs below are the subtle kinds:
off by one at a boundary, wrong on one rank only, wrong only when K > 1.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings

from lab.dcp import reference as ref
from lab.dcp.reference import attention  # where the planted bugs go
from tests.lab.dcp.test_dcp_reference import assert_parity, cases, run_dcp, run_dcp1

ATOL = 2e-5  # fp32 reference against a float64 loop


def explicit_attention(step: ref.Step) -> tuple[torch.Tensor, torch.Tensor]:
    """(out [T, H, v_dim], base-2 LSE [T, H]) in float64, one row and head at a time.

    Row t sees the SWA slots ``swa_indices[t, 0, :swa_lens[t]]`` (-1 skipped), then the
    states ``states[req][id]`` for its top-k ids (-1 skipped; none on a padding row),
    then the head's sink as one more logit with no value.
    """
    t_rows, heads, _ = step.q.shape
    out = torch.zeros(t_rows, heads, step.v_dim, dtype=torch.float64)
    lse = torch.zeros(t_rows, heads, dtype=torch.float64)
    for t in range(t_rows):
        keys = []
        for j in range(int(step.swa_lens[t])):
            slot = int(step.swa_indices[t, 0, j])
            if slot >= 0:
                keys.append(step.swa_cache[slot].double())
        if step.is_valid[t]:
            states = step.states[int(step.token_to_req[t])]
            keys += [states[int(i)].double() for i in step.topk_ids[t] if int(i) >= 0]
        for h in range(heads):
            q = step.q[t, h].double()
            logits = [float(q @ k) * step.sm_scale for k in keys] + [float(step.sink[h])]
            top = max(logits)
            weights = [math.exp(x - top) for x in logits]
            total = sum(weights)
            for w, k in zip(weights, keys, strict=False):  # the sink (last) has no value
                out[t, h] += (w / total) * k[: step.v_dim]
            lse[t, h] = (top + math.log(total)) / math.log(2)
    return out, lse


def assert_explicit(step: ref.Step, layout: ref.ShardLayout, combine: str = "ag_rs") -> None:
    """DCP1 and every rank of DCP W equal the explicit attention, head slice by slice."""
    want_out, want_lse = explicit_attention(step)
    dcp1 = run_dcp1(step, layout.page_size, torch.float32)
    torch.testing.assert_close(dcp1.out.double(), want_out, atol=ATOL, rtol=ATOL)
    torch.testing.assert_close(dcp1.lse.double(), want_lse, atol=1e-4, rtol=1e-5)
    h = step.heads // layout.world_size
    for rank, got in enumerate(run_dcp(step, layout, combine, torch.float32)):
        heads = slice(rank * h, (rank + 1) * h)
        torch.testing.assert_close(got.out.double(), want_out[:, heads], atol=ATOL, rtol=ATOL)
        torch.testing.assert_close(got.lse.double(), want_lse[:, heads], atol=1e-4, rtol=1e-5)


def case(w: int = 2, k: int = 2, page: int = 4, seed: int = 10, padding: int = 1):
    step = ref.random_step(
        torch.Generator().manual_seed(seed), [37, 20], [2, 1], heads=2 * w, padding_rows=padding
    )
    return step, ref.ShardLayout(w, k, page)


@pytest.mark.parametrize("combine", ["ag_rs", "a2a"])
@pytest.mark.parametrize("w,k,page", [(1, 1, 4), (2, 1, 4), (2, 2, 4), (4, 2, 2), (4, 4, 8)])
def test_reference_equals_explicit_softmax(w, k, page, combine):
    assert_explicit(*case(w, k, page), combine)


@pytest.mark.property
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases(dtype=torch.float32))
def test_reference_equals_explicit_softmax_on_random_cases(example):
    assert_explicit(*example)


# ---- planted bugs ---------------------------------------------------------------


def test_a_scale_bug_cancels_in_parity_but_not_against_the_explicit_softmax(monkeypatch):
    step, layout = case()
    real = ref.sparse_attention

    def scale_off(q, sources, scale, v_dim, sink, dtype):
        return real(q, sources, scale * 1.01, v_dim, sink, dtype)

    monkeypatch.setattr(attention, "sparse_attention", scale_off)
    assert_parity(step, layout, "ag_rs", torch.float32)  # both sides share the bug
    with pytest.raises(AssertionError):
        assert_explicit(step, layout)


def _gather_one_past_lens(src: ref.Source):
    """``_gather`` reading slot ``lens`` too (``<=`` for ``<``): off by one at the end."""
    n = src.slots.shape[-1]
    use = src.slots >= 0
    if src.lens is not None:
        use &= torch.arange(n) <= src.lens[:, None]
    keys = src.flat[src.slots.long().clamp_min(0)].float()
    return torch.where(use[..., None], keys, torch.zeros_like(keys)), use


def test_off_by_one_at_the_end_of_the_used_slots(monkeypatch):
    step, layout = case(padding=1)
    # The padding row keeps its ids but has lens 0: slot 0 is the one just past the end.
    assert not step.is_valid[-1] and (step.topk_ids[-1] >= 0).any()
    monkeypatch.setattr(attention, "_gather", _gather_one_past_lens)
    with pytest.raises(AssertionError):
        assert_explicit(step, layout)


def test_off_by_one_at_the_virtual_block_boundary(monkeypatch):
    step, layout = case(w=2, k=2, page=4)
    span = layout.interleave * layout.world_size
    assert ((step.topk_ids >= 0) & (step.topk_ids % span == span - 1)).any()
    real = ref.local_index

    def last_of_block_moves(ids, w, k):  # only ids at the end of a virtual block
        return real(ids, w, k) + (ids % (k * w) == k * w - 1).long()

    monkeypatch.setattr(attention, "local_index", last_of_block_moves)
    with pytest.raises(AssertionError):
        assert_explicit(step, layout)


def test_wrong_on_the_last_rank_only(monkeypatch):
    step, layout = case(w=4, k=1, page=4)
    real = ref.filter_and_convert

    def last_rank_drops_one(ids, token_to_req, block_table, lay, rank):
        slots, lens = real(ids, token_to_req, block_table, lay, rank)
        if rank == lay.world_size - 1:
            lens = (lens - 1).clamp_min(0)
        return slots, lens

    monkeypatch.setattr(attention, "filter_and_convert", last_rank_drops_one)
    with pytest.raises(AssertionError):
        assert_explicit(step, layout)
    with pytest.raises(AssertionError):
        assert_parity(step, layout, "a2a", torch.float32)


def test_wrong_only_when_k_above_1(monkeypatch):
    """patch 09's "loff drops * K" slip: right at K == 1, so K > 1 cases must exist."""
    monkeypatch.setattr(attention, "local_index", lambda ids, w, k: (ids // (k * w)) + ids % k)
    assert_explicit(*case(w=2, k=1, page=4))  # invisible at K == 1
    with pytest.raises(AssertionError):
        assert_explicit(*case(w=2, k=2, page=4))
