"""Random steps for the property tests: requests, top-k ids, SWA rows, padding rows."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from lab.dcp.reference.attention import Step


def random_topk(gen: torch.Generator, n_states: int, count: int, topk: int) -> torch.Tensor:
    """``count`` distinct ids below ``n_states`` in random order, then a -1 tail."""
    count = min(count, n_states, topk)
    ids = torch.full((topk,), -1, dtype=torch.int32)
    ids[:count] = torch.randperm(n_states, generator=gen)[:count].to(torch.int32)
    return ids


def random_step(
    gen: torch.Generator,
    n_states: Sequence[int],
    tokens: Sequence[int],
    heads: int,
    dim: int = 16,
    v_dim: int = 8,
    topk: int = 8,
    swa_width: int = 4,
    dtype: torch.dtype = torch.float32,
    logit_scale: float = 1.0,
    padding_rows: int = 0,
) -> Step:
    """A random step: request ``b`` has ``n_states[b]`` states and ``tokens[b]`` rows.

    ``padding_rows`` invalid rows (CUDA-graph padding) follow the real ones.
    """

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen).to(dtype)

    states = tuple(randn(n, dim) for n in n_states)
    rows = [b for b, t in enumerate(tokens) for _ in range(t)] + [0] * padding_rows
    t = len(rows)
    ids = (
        torch.stack(
            [
                random_topk(
                    gen, n_states[b], int(torch.randint(0, topk + 1, (1,), generator=gen)), topk
                )
                for b in rows
            ]
        )
        if t
        else torch.empty((0, topk), dtype=torch.int32)
    )
    swa_slots = max(swa_width * 2, 1)
    swa_lens = torch.randint(0, swa_width + 1, (t,), generator=gen, dtype=torch.int32)
    swa_idx = torch.stack([random_topk(gen, swa_slots, int(n), swa_width) for n in swa_lens])
    is_valid = torch.arange(t) < t - padding_rows
    swa_lens = swa_lens.masked_fill(~is_valid, 0)
    return Step(
        q=randn(t, heads, dim) * logit_scale,
        states=states,
        topk_ids=ids,
        token_to_req=torch.tensor(rows, dtype=torch.int32),
        is_valid=is_valid,
        swa_cache=randn(swa_slots, dim),
        swa_indices=swa_idx.reshape(t, 1, swa_width),
        swa_lens=swa_lens,
        sink=torch.randn(heads, generator=gen),
        sm_scale=dim**-0.5,
        v_dim=v_dim,
    )
