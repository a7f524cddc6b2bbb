"""The DCP merge math, one copy: the W ranks' partial attention outputs weighted by their LSE.

``L = log(sum_r exp(L_r))`` (max-subtracted, summed in rank order like the combine
kernels), ``o = sum_r exp(L_r - L) o_r``. Its two users: the pure-torch reference
(``lab.dcp.reference.combine``) and the emulation's ports of vLLM's combine kernels
(``lab/emulate/bakery_emulate/dcp_combine.py``). ``exp`` and ``log`` are passed in: base 2
or e, torch's or numpy's (the Triton interpreter evaluates ``tl.exp2``/``tl.log2`` with
numpy, whose float32 results differ from torch's in the last bit, and a port must give the
interpreted kernel's bytes). Callers reach these through the module (``merge.merge_lse``),
so a bug planted here fails both users' tests (tests/lab/dcp/test_dcp_merge.py).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

Fn = Callable[[torch.Tensor], torch.Tensor]


def clean(lse: torch.Tensor) -> torch.Tensor:
    """NaN and +inf LSEs (an empty shard) count as -inf: no weight."""
    return torch.where(torch.isnan(lse) | (lse == math.inf), -math.inf, lse)


def merge_lse(lses: torch.Tensor, exp: Fn = torch.exp2, log: Fn = torch.log2) -> torch.Tensor:
    """``log(sum_r exp(L_r))`` over dim 0 (the ranks), fp32, max-subtracted, in rank order."""
    lses = clean(lses.float())
    top = lses.amax(dim=0)
    top = torch.where(top == -math.inf, torch.zeros_like(top), top)
    total = torch.zeros_like(top)
    for rank in range(lses.shape[0]):
        total = total + exp(lses[rank] - top)
    return log(total) + top


def weight(lse: torch.Tensor, total: torch.Tensor, exp: Fn = torch.exp2) -> torch.Tensor:
    """A rank's share ``exp(L_r - L)`` (0 where that is NaN)."""
    w = exp(lse.float() - total)
    return torch.where(torch.isnan(w), torch.zeros_like(w), w)


def weighted(partial: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``w * o_r`` in fp32 (``w`` per row and head: [..., 1]); 0 where the weight is 0, even
    where the partial is not finite."""
    return torch.where(w == 0, 0.0, partial.float() * w)
