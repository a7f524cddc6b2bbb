"""Speculative decoding under DCP: the verification step, its KV writes and the rollback.

A verification step (MTP) gives request ``b`` ``q_len = 1 + k`` query tokens at positions
``c_b .. c_b + k``, ``c_b`` its committed tokens (``step_positions``). With compress ratio
``r`` (1 or 2), state ``s`` covers positions ``[s*r, (s+1)*r)`` and is complete once its
last one is written, so the token at position ``p`` sees the states below
``(p + 1) // r`` (``visible_states``), its own included at ``r == 1``: each token has its
own causal bound, for its sparse top-k ids and, as candidate-block ``ends``, for stage 4.

Under DCP the step first writes the states it completes (``step_state_ids``) into the
sharded caches, each on its owner rank only (``write_step``), then attends as a decode
step does (``attention.dcp_attention``): every rank a partial for all query tokens, the
combine per token. After the target's verdict ``commit`` keeps each request's first
``accepted + 1`` tokens. Nothing is erased: a rejected state completes at or past the
next step's first position, so that step either completes it again (an overwrite) or no
token of it can see it.

DSpark (``models/deepseek_v41/nvidia/dspark.py``) drafts a block non-causally: every
token of a request's draft block attends the same SWA rows, positions
``[max(c - window, 0), c + q_len)`` (the context's trailing window plus the whole block,
future tokens included; vLLM's ``ComputeDSparkNoncausalSWAIndicesKernel``, whose row
width vLLM pads to a multiple of 64). These are SWA entries, not compressed ids (the
draft's KV-cache layers are its SWA caches, ``get_draft_kv_cache_layer_names``); the SWA
cache is replicated on every rank, so under DCP rank 0 reads them as it reads any SWA row
(``swa_rows(..., dspark=True)``). ``block_ids`` is the variant with compressed ids: the
step's own new states in every token's top-k, which live on their owner ranks.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from lab.dcp.reference.attention import Step, dcp_attention
from lab.dcp.reference.combine import AttnOut, Combine
from lab.dcp.reference.groups import Group
from lab.dcp.reference.shards import PagedCache, ShardLayout, build_caches, write_states


@dataclass
class RankKV:
    """One rank's sharded compressed cache of a batch and the tokens it has committed
    per request (its own copy, as each rank builds its own metadata)."""

    rank: int
    cache: PagedCache
    committed: list[int]


def step_positions(committed: Sequence[int], q_lens: Sequence[int]) -> torch.Tensor:
    """int64 [T]: the position of each query token, request by request."""
    return torch.cat([c + torch.arange(q) for c, q in zip(committed, q_lens, strict=True)])


def visible_states(positions: torch.Tensor, ratio: int) -> torch.Tensor:
    """How many compressed states the token at ``positions`` sees (ids below it)."""
    return (positions + 1) // ratio


def token_ends(committed: Sequence[int], q_lens: Sequence[int], ratio: int) -> torch.Tensor:
    """int32 [T]: each query token's visible states, its candidate-block ``ends``."""
    return visible_states(step_positions(committed, q_lens), ratio).to(torch.int32)


def step_state_ids(committed: int, q_len: int, ratio: int) -> torch.Tensor:
    """The states a request's step completes: ``[c // r, (c + q_len) // r)``."""
    return torch.arange(committed // ratio, (committed + q_len) // ratio)


def open_batch(
    states: Sequence[torch.Tensor],
    committed: Sequence[int],
    capacity: int,
    ratio: int,
    layout: ShardLayout,
    gen: torch.Generator,
) -> list[RankKV]:
    """The W ranks' caches after prefill: request ``b``'s first ``committed[b] // r``
    states written, room for ``capacity`` states each, every other slot NaN."""
    padded = []
    for s, c in zip(states, committed, strict=True):
        rows = torch.full((capacity, s.shape[-1]), torch.nan, dtype=s.dtype)
        rows[: c // ratio] = s[: c // ratio]
        padded.append(rows)
    caches = build_caches(padded, layout, gen)
    return [RankKV(rank, cache, list(committed)) for rank, cache in enumerate(caches)]


def write_step(
    kv: RankKV,
    layout: ShardLayout,
    states: Sequence[torch.Tensor],
    q_lens: Sequence[int],
    ratio: int,
) -> None:
    """Write the states this step completes, the last rows of each request's branch
    ``states[b]``, at the ids this rank's ``committed`` gives: the owner only."""
    for req, (c, q) in enumerate(zip(kv.committed, q_lens, strict=True)):
        ids = step_state_ids(c, q, ratio)
        write_states(
            kv.cache, layout, kv.rank, req, ids, states[req][len(states[req]) - len(ids) :]
        )


def commit(kv: RankKV, q_lens: Sequence[int], accepted: Sequence[int]) -> None:
    """The rollback after verification: keep each request's first ``accepted + 1`` tokens
    (the target's token and the accepted drafts), so the next step starts at
    ``c + accepted + 1``."""
    for req, (q, a) in enumerate(zip(q_lens, accepted, strict=True)):
        if not 0 <= a < q:
            raise ValueError(f"request {req}: accepted {a} of {q - 1} draft tokens")
        kv.committed[req] += a + 1


def speculate(
    group: Group,
    kv: RankKV,
    rounds: Sequence[tuple[Step, Sequence[int], Sequence[int]]],
    layout: ShardLayout,
    ratio: int,
    combine: Combine,
    out_dtype: torch.dtype,
) -> list[AttnOut]:
    """Verification steps in a row on one rank, each ``(step, q_lens, accepted)``: write
    the step's states, attend (this rank's heads, merged), then ``commit``."""
    outs = []
    for step, q_lens, accepted in rounds:
        write_step(kv, layout, step.states, q_lens, ratio)
        outs.append(dcp_attention(group, step, kv.cache, layout, combine, out_dtype))
        commit(kv, q_lens, accepted)
    return outs


def swa_rows(
    committed: Sequence[int],
    q_lens: Sequence[int],
    window: int,
    base: Sequence[int],
    width: int,
    dspark: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """SWA slots ``[T, 1, width]`` (-1 tail) and lengths of a step's tokens; request
    ``b``'s position ``p`` sits at slot ``base[b] + p`` of the replicated SWA cache.

    Causal (vLLM's decode rows): the token at ``p`` reads ``[max(p - window + 1, 0), p]``.
    ``dspark``: every token of the block reads ``[max(c - window, 0), c + q_len)``.
    """
    rows = []
    for c, q, b in zip(committed, q_lens, base, strict=True):
        for p in range(c, c + q):
            lo, hi = (max(c - window, 0), c + q) if dspark else (max(p - window + 1, 0), p + 1)
            rows.append(b + torch.arange(lo, hi))
    idx = torch.full((len(rows), 1, width), -1, dtype=torch.int32)
    for t, r in enumerate(rows):
        idx[t, 0, : len(r)] = r.to(torch.int32)
    return idx, torch.tensor([len(r) for r in rows], dtype=torch.int32).reshape(-1)


def block_ids(committed: Sequence[int], q_lens: Sequence[int], ratio: int, width: int):
    """int32 [T, width]: every token's row holds all the states its request's step
    completes (future tokens' included, DSpark's non-causal block as compressed ids),
    -1 tail."""
    rows = []
    for c, q in zip(committed, q_lens, strict=True):
        ids = step_state_ids(c, q, ratio).to(torch.int32)
        row = torch.nn.functional.pad(ids, (0, width - ids.numel()), value=-1)
        rows += [row] * q
    return torch.stack(rows) if rows else torch.empty((0, width), dtype=torch.int32)
