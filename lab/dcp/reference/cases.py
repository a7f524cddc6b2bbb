"""Random steps for the property tests: requests, top-k ids, SWA rows, padding rows, and
speculative decoding's verification steps."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import torch

from lab.dcp.reference.attention import Step
from lab.dcp.reference.spec import block_ids, step_positions, swa_rows, visible_states


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


def spec_step(
    gen: torch.Generator,
    committed: Sequence[int],
    q_lens: Sequence[int],
    heads: int,
    ratio: int = 1,
    window: int = 4,
    topk: int = 8,
    dspark: bool = False,
    prefix: Sequence[torch.Tensor] | None = None,
    dtype: torch.dtype = torch.float32,
    logit_scale: float = 1.0,
    padding_rows: int = 0,
) -> Step:
    """A random verification step (``spec``): request ``b``'s ``q_lens[b]`` tokens at
    positions ``committed[b]..``, its states up to its last token's, each token with up to
    ``topk`` random ids among the states it sees and its causal SWA window. ``dspark``:
    the ids among the committed states, then ``block_ids``, and the block's SWA rows.
    ``prefix[b]`` replaces request ``b``'s committed states (the branch a rollback keeps).
    """
    block = max(q_lens)  # a step completes at most q_len states
    swa_width = window + block
    step = random_step(
        gen,
        [(c + q) // ratio for c, q in zip(committed, q_lens, strict=True)],
        q_lens,
        heads,
        topk=topk + block * dspark,
        swa_width=swa_width,
        dtype=dtype,
        logit_scale=logit_scale,
        padding_rows=padding_rows,
    )
    states = step.states
    if prefix is not None:
        states = tuple(
            torch.cat([p[: c // ratio], s[c // ratio :]])
            for p, s, c in zip(prefix, states, committed, strict=True)
        )
    pos = step_positions(committed, q_lens)
    # dspark: among the committed states (the whole block follows), else the causal bound
    req = step.token_to_req[: len(pos)].long()
    seen = torch.tensor(committed)[req] // ratio if dspark else visible_states(pos, ratio)
    count = torch.randint(0, topk + 1, (len(pos),), generator=gen)
    ids = torch.stack(
        [random_topk(gen, int(n), int(m), topk) for n, m in zip(seen, count, strict=True)]
    )
    if dspark:
        ids = torch.cat([ids, block_ids(committed, q_lens, ratio, block)], dim=1)
        # a -1 tail, as the indexer hands ids on (DCP1 reads the first ``lens`` slots)
        ids = ids.gather(1, torch.argsort((ids < 0).to(torch.int8), dim=1, stable=True))
    base = torch.tensor([0, *(c + q for c, q in zip(committed, q_lens, strict=True))]).cumsum(0)
    idx, lens = swa_rows(committed, q_lens, window, base[:-1].tolist(), swa_width, dspark)
    pad_idx = torch.full((padding_rows, 1, swa_width), -1, dtype=torch.int32)
    return replace(
        step,
        states=states,
        topk_ids=torch.cat([ids, step.topk_ids[len(pos) :]]),
        swa_cache=torch.randn(int(base[-1]), step.q.shape[-1], generator=gen).to(dtype),
        swa_indices=torch.cat([idx, pad_idx]),
        swa_lens=torch.cat([lens, torch.zeros(padding_rows, dtype=torch.int32)]),
    )
