"""Stage 4's two-level candidate blocks, at DCP1 and on a DCP rank.

DeepSeek-V4.1's candidate source layer scores blocks of ``block_size`` request
positions by their maximum indexer logit (NaN propagates, the row's newest block
is pinned to +inf), publishes its top ``topk_blocks`` blocks (-1 where the score
is -inf), and later indexers keep only columns in those blocks before their
token top-k. Everything here is in the request frame: column = request position,
``ends`` = visible positions per row (0 for a padding row). Ties are canonical:
NaN first, then higher score, then the lower id (torch.topk on CUDA picks the
first tied index too). Under DCP a rank holds the columns it owns
(``owner_rank``), at ``local_index``; on a DCP rank the source exchanges partial
maxima over GLOBAL blocks.
"""

from __future__ import annotations

import math

import torch

from bakery.dcp.reference.groups import Group
from bakery.dcp.reference.shards import global_position, owner_rank


def shard_columns(
    logits: torch.Tensor, ends: torch.Tensor, rank: int, world_size: int, interleave: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """``rank``'s local logits (its columns, in local order) and local ends."""
    pos = torch.arange(logits.shape[1])
    mine = owner_rank(pos, world_size, interleave) == rank
    local_ends = ((pos[None, :] < ends[:, None]) & mine).sum(1)
    return logits[:, mine], local_ends.to(torch.int32)


def _canonical_order(scores: torch.Tensor) -> torch.Tensor:
    """Column order: NaN first, then descending score, ties by the lower column."""
    return torch.sort(scores, dim=-1, descending=True, stable=True).indices


def block_maxima(logits: torch.Tensor, ends: torch.Tensor, block_size: int, nblocks: int):
    """Per-row block maxima over visible columns (-inf for none; NaN propagates)."""
    rows, n = logits.shape
    wide = torch.full((rows, nblocks * block_size), -math.inf, dtype=torch.float32)
    visible = torch.arange(n)[None, :] < ends[:, None]
    wide[:, :n] = torch.where(visible, logits.float(), -math.inf)
    return wide.view(rows, nblocks, block_size).amax(-1)


def select_blocks(
    scores: torch.Tensor, ends: torch.Tensor, block_size: int, topk_blocks: int
) -> torch.Tensor:
    """Pin each row's newest block, then the canonical top ``topk_blocks`` (-1 tail)."""
    scores = scores.clone()
    rows = torch.nonzero(ends > 0).flatten()
    scores[rows, (ends[rows].long() - 1) // block_size] = math.inf
    order = _canonical_order(scores)[:, :topk_blocks]
    keep = scores.gather(1, order) != -math.inf  # NaN is kept, like the kernel
    out = torch.where(keep, order, -1).to(torch.int32)
    tail = topk_blocks - out.shape[1]
    return torch.nn.functional.pad(out, (0, tail), value=-1) if tail > 0 else out


def candidate_blocks_dcp1(
    logits: torch.Tensor, ends: torch.Tensor, topk_blocks: int, block_size: int
) -> torch.Tensor:
    """The candidate source at DCP1 over request-frame ``logits`` [rows, n]."""
    nblocks = -(-logits.shape[1] // block_size)
    return select_blocks(
        block_maxima(logits, ends, block_size, nblocks), ends, block_size, topk_blocks
    )


def candidate_blocks_dcp(
    group: Group,
    local_logits: torch.Tensor,
    local_ends: torch.Tensor,
    topk_blocks: int,
    block_size: int,
    interleave: int,
    width: int,
) -> torch.Tensor:
    """The candidate source on one DCP rank: the GLOBAL block ids DCP1 publishes.

    Partial maxima over global blocks from this rank's columns, exchanged by an
    all-gather and a NaN-propagating max; the global ends are the sum of the
    ranks' local ends (each position has one owner).
    """
    w, rank = group.world_size, group.rank_in_group
    rows = local_logits.shape[0]
    frame = torch.full((rows, width), -math.inf, dtype=torch.float32)
    local = torch.arange(local_logits.shape[1])
    pos = global_position(local, rank, w, interleave)
    seen = local[None, :] < local_ends[:, None]
    frame[:, pos] = torch.where(seen, local_logits.float(), -math.inf)
    nblocks = -(-width // block_size)
    partial = block_maxima(frame, torch.full((rows,), width), block_size, nblocks)
    scores = group.all_gather(partial[None], dim=0).amax(0)
    ends = group.all_gather(local_ends[None].long(), dim=0).sum(0)
    return select_blocks(scores, ends, block_size, topk_blocks)


def _block_kept(blocks: torch.Tensor, candidates: torch.Tensor) -> torch.Tensor:
    """[rows, n] bool: column block id is one of the row's candidates."""
    return (blocks[..., None] == candidates[:, None, :].long()).any(-1)


def mask_candidates_dcp1(
    logits: torch.Tensor, ends: torch.Tensor, candidates: torch.Tensor, block_size: int
) -> torch.Tensor:
    """A consumer layer at DCP1: -inf outside the visible candidate blocks."""
    cols = torch.arange(logits.shape[1])
    keep = (cols[None, :] < ends[:, None]) & _block_kept(
        (cols // block_size).expand(logits.shape[0], -1), candidates
    )
    return torch.where(keep, logits.float(), -math.inf)


def mask_candidates_dcp(
    local_logits: torch.Tensor,
    local_ends: torch.Tensor,
    candidates: torch.Tensor,
    block_size: int,
    rank: int,
    world_size: int,
    interleave: int,
) -> torch.Tensor:
    """A consumer layer on one DCP rank: local columns mapped to global blocks."""
    local = torch.arange(local_logits.shape[1])
    blocks = global_position(local, rank, world_size, interleave) // block_size
    keep = (local[None, :] < local_ends[:, None]) & _block_kept(
        blocks.expand(local_logits.shape[0], -1), candidates
    )
    return torch.where(keep, local_logits.float(), -math.inf)


def token_topk_dcp1(masked: torch.Tensor, topk: int) -> torch.Tensor:
    """Canonical token top-k of masked logits: column ids, -1 for -inf or absent."""
    order = _canonical_order(masked)[:, :topk]
    keep = masked.gather(1, order) != -math.inf
    out = torch.where(keep, order, -1).to(torch.int32)
    return torch.nn.functional.pad(out, (0, topk - out.shape[1]), value=-1)


def token_topk_dcp(
    group: Group, local_masked: torch.Tensor, topk: int, interleave: int
) -> torch.Tensor:
    """``_merge_dcp_topk_global`` in canonical form: local top-k as (score, global
    id), all-gathered, then the canonical top-k of the union by (score, id)."""
    w, rank = group.world_size, group.rank_in_group
    local = token_topk_dcp1(local_masked, topk)
    ids = torch.where(
        local >= 0, global_position(local.long().clamp_min(0), rank, w, interleave), -1
    )
    # one -inf column, so that a rank with no columns still has something to gather
    padded = torch.nn.functional.pad(local_masked, (0, 1), value=-math.inf)
    score = padded.gather(1, torch.where(local >= 0, local.long(), padded.shape[1] - 1))
    all_ids = group.all_gather(ids, dim=1)
    all_scores = group.all_gather(score, dim=1)
    # lower id first, then a stable sort by score: ties keep the lower global id
    by_id = torch.sort(torch.where(all_ids >= 0, all_ids, torch.iinfo(torch.int64).max)).indices
    all_ids, all_scores = all_ids.gather(1, by_id), all_scores.gather(1, by_id)
    order = _canonical_order(all_scores)[:, :topk]
    keep = all_scores.gather(1, order) != -math.inf
    return torch.where(keep, all_ids.gather(1, order), -1).to(torch.int32)
