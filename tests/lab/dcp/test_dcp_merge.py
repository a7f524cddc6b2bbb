"""lab.dcp.merge, the one copy of the DCP merge math, through both of its users: the
reference's combines (``lab.dcp.reference``) and the emulation's port of vLLM's a2a
combine kernel (``lab/emulate/bakery_emulate/dcp_combine.py``), each against an
independent float64 softmax merge. A bug planted in the shared math fails both.
"""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import pytest
import torch

from lab.dcp import merge
from lab.dcp import reference as ref

REPO = Path(__file__).resolve().parents[3]
T, H, D = 5, 2, 8  # rows, heads per rank, head dim


def emulation():
    """bakery_emulate.dcp_combine, loaded from its file (no vLLM, no hooks installed)."""
    path = REPO / "lab" / "emulate" / "bakery_emulate" / "dcp_combine.py"
    spec = importlib.util.spec_from_file_location("_planted_dcp_combine", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def partials(w: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Each rank's partial output [W, T, W*H, D] and base-2 LSE [W, T, W*H]; rank 1 holds
    nothing for row 0 (LSE -inf), as an empty shard does."""
    gen = torch.Generator().manual_seed(seed)
    outs = torch.randn(w, T, w * H, D, generator=gen)
    lses = torch.randn(w, T, w * H, generator=gen) * 4
    lses[1, 0] = -math.inf
    return outs, lses


def oracle(outs: torch.Tensor, lses: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The merge in float64 by softmax over ranks: output [T, W*H, D], LSE [T, W*H]."""
    lse = lses.double()
    total = torch.logsumexp(lse * math.log(2), dim=0) / math.log(2)
    share = torch.softmax(lse * math.log(2), dim=0)[..., None]
    return (share * outs.double()).sum(0), total


def check_reference(w: int) -> None:
    outs, lses = partials(w)
    want_out, want_lse = oracle(outs, lses)
    for combine in ref.COMBINES.values():
        parts = [ref.AttnOut(outs[r], lses[r]) for r in range(w)]
        got = ref.run_spmd(w, lambda g, c=combine, p=parts: c(g, p[g.rank_in_group]))
        for rank, part in enumerate(got):
            heads = slice(rank * H, (rank + 1) * H)
            torch.testing.assert_close(part.out.double(), want_out[:, heads], atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(part.lse.double(), want_lse[:, heads], atol=1e-5, rtol=1e-5)


def check_emulation(w: int) -> None:
    """The a2a kernel's port on what rank 0 receives (its heads from every rank, fp32 LSE
    packed behind each output: ``lse_pack_dim`` 1)."""
    outs, lses = partials(w)
    want_out, want_lse = oracle(outs, lses)
    recv = torch.cat([outs[:, :, :H], lses[:, :, :H, None]], dim=-1)
    got_out, got_lse = emulation().unpack_combine(recv, D, 1, True, False)
    torch.testing.assert_close(got_out.double(), want_out[:, :H], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got_lse.double(), want_lse[:, :H], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("w", [2, 4])
def test_the_reference_merges_like_the_oracle(w):
    check_reference(w)


@pytest.mark.parametrize("w", [2, 4])
def test_the_emulation_merges_like_the_oracle(w):
    check_emulation(w)


def _last_rank_dropped(lses, exp=torch.exp2, log=torch.log2, real=merge.merge_lse):
    return real(lses[:-1], exp, log)


def _no_max_subtracted(lse, total, exp=torch.exp2, real=merge.weight):
    return real(lse, total * 0, exp)


@pytest.mark.parametrize(
    "name, planted",
    [("merge_lse", _last_rank_dropped), ("weight", _no_max_subtracted)],
)
def test_a_bug_planted_in_the_shared_math_fails_both_users(monkeypatch, name, planted):
    monkeypatch.setattr(merge, name, planted)
    with pytest.raises(AssertionError):
        check_reference(2)
    with pytest.raises(AssertionError):
        check_emulation(2)


def test_the_merge_math_exists_once():
    """Neither user computes ``exp(L_r - max)`` sums of its own: both call lab.dcp.merge."""
    for path in (
        REPO / "lab" / "dcp" / "reference" / "combine.py",
        REPO / "lab" / "emulate" / "bakery_emulate" / "dcp_combine.py",
    ):
        text = path.read_text()
        assert "merge.merge_lse(" in text and "merge.weight(" in text, path
        assert ".sum(0)) +" not in text and "total = total +" not in text, path
