"""Stage 4's two-level candidate blocks, at DCP1 and on a DCP rank.

DeepSeek-V4.1's candidate source layer scores blocks of ``block_size`` request
positions by their maximum indexer logit (NaN propagates, the row's newest block
is pinned to +inf), publishes its top ``topk_blocks`` blocks (-1 where the score
is -inf), and later indexers keep only columns in those blocks before their
token top-k. Everything here is in the request frame: column = request position,
``ends`` = visible positions per row (0 for a padding row). Scores are ordered
as on CUDA (``order_keys``): NaN first, then higher score, -0.0 below +0.0 (CUDA
torch.topk and DCP1's Triton block max; CPU torch treats them as equal), ties to
the lower id (torch.topk on CUDA picks the first tied index too). Under DCP a
rank holds the columns it owns (``owner_rank``), at ``local_index``; on a DCP
rank the source exchanges partial maxima over GLOBAL blocks, densely
(``candidate_blocks_dcp``) or as local top-k and a merge (``..._sparse``), or on
prefill gathers the keys and selects as DCP1 does (``..._index_k``).
"""

from __future__ import annotations

import math

import torch

from lab.dcp.reference.groups import Group
from lab.dcp.reference.shards import global_position, owner_rank


def shard_columns(
    logits: torch.Tensor, ends: torch.Tensor, rank: int, world_size: int, interleave: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """``rank``'s local logits (its columns, in local order) and local ends."""
    pos = torch.arange(logits.shape[1])
    mine = owner_rank(pos, world_size, interleave) == rank
    local_ends = ((pos[None, :] < ends[:, None]) & mine).sum(1)
    return logits[:, mine], local_ends.to(torch.int32)


_LOW32 = (1 << 32) - 1


def order_keys(scores: torch.Tensor) -> torch.Tensor:
    """int64 keys whose order is CUDA's order of fp32 scores (NaN top, -0.0 < +0.0)."""
    bits = scores.float().contiguous().view(torch.int32).long()
    keys = torch.where(bits < 0, bits ^ 0x7FFFFFFF, bits)
    return torch.where(scores.isnan(), 0x7FFFFFFF, keys)


def key_values(keys: torch.Tensor) -> torch.Tensor:
    """``order_keys`` back to fp32 (NaN for the NaN key)."""
    bits = torch.where(keys < 0, keys ^ 0x7FFFFFFF, keys).to(torch.int32)
    return bits.view(torch.float32)


def _packed(scores: torch.Tensor) -> torch.Tensor:
    """(key, lower id first) as one int64 per column: distinct, so one order."""
    ids = torch.arange(scores.shape[-1], dtype=torch.int64)
    return (order_keys(scores) << 32) | (_LOW32 - ids)


def _canonical_order(scores: torch.Tensor) -> torch.Tensor:
    """Column order: NaN first, then descending score (-0.0 below +0.0), ties by the
    lower column."""
    return torch.sort(_packed(scores), dim=-1, descending=True).indices


def block_maxima(logits: torch.Tensor, ends: torch.Tensor, block_size: int, nblocks: int):
    """Per-row block maxima over visible columns (-inf for none; NaN propagates; a
    block holding both zeros is +0.0), in ``order_keys``' order."""
    rows, n = logits.shape
    wide = torch.full((rows, nblocks * block_size), -math.inf, dtype=torch.float32)
    visible = torch.arange(n)[None, :] < ends[:, None]
    wide[:, :n] = torch.where(visible, logits.float(), -math.inf)
    return key_values(order_keys(wide).view(rows, nblocks, block_size).amax(-1))


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


def _partial_maxima(
    group: Group,
    local_logits: torch.Tensor,
    local_ends: torch.Tensor,
    block_size: int,
    interleave: int,
    width: int,
) -> tuple[torch.Tensor, int]:
    """This rank's maxima over GLOBAL blocks (its columns placed at their global
    positions, -inf elsewhere), and the number of blocks; both exchanges start here."""
    w, rank = group.world_size, group.rank_in_group
    rows = local_logits.shape[0]
    frame = torch.full((rows, width), -math.inf, dtype=torch.float32)
    local = torch.arange(local_logits.shape[1])
    pos = global_position(local, rank, w, interleave)
    seen = local[None, :] < local_ends[:, None]
    frame[:, pos] = torch.where(seen, local_logits.float(), -math.inf)
    nblocks = -(-width // block_size)
    return block_maxima(frame, torch.full((rows,), width), block_size, nblocks), nblocks


def global_ends(group: Group, local_ends: torch.Tensor) -> torch.Tensor:
    """DCP1's row ends: the sum of the ranks' local ends (each position has one owner)."""
    return group.all_gather(local_ends[None].long(), dim=0).sum(0)


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
    all-gather and a max over their ``order_keys`` (NaN on top, -0.0 below +0.0,
    as the kernel's all-reduce of int32 keys); the global ends are the sum of the
    ranks' local ends (each position has one owner).
    """
    partial, nblocks = _partial_maxima(
        group, local_logits, local_ends, block_size, interleave, width
    )
    # max over the ranks on the keys: a float max (CPU) may keep one rank's -0.0 over +0.0
    keys = group.all_gather(order_keys(partial)[None], dim=0).amax(0)
    scores = key_values(keys)
    ends = global_ends(group, local_ends)
    return select_blocks(scores, ends, block_size, topk_blocks)


def local_budget(topk_blocks: int) -> int:
    """Entries each rank sends: one more than the budget, as the pin can displace one."""
    return topk_blocks + 1


def candidate_blocks_dcp_sparse(
    group: Group,
    local_logits: torch.Tensor,
    local_ends: torch.Tensor,
    topk_blocks: int,
    block_size: int,
    interleave: int,
    width: int,
) -> torch.Tensor:
    """The candidate source on one DCP rank by the sparse merge: each rank sends its
    top ``topk_blocks + 1`` UNPINNED partial block maxima as (score, block) and its
    newest visible global position; every rank merges the union: the newest block
    pinned to +inf, each block's highest copy, the top ``topk_blocks`` by the
    canonical order. (The kernel's docstring, ``_merge_candidates``, has the
    argument; the chain test checks it against DCP1.)"""
    w, rank = group.world_size, group.rank_in_group
    partial, nblocks = _partial_maxima(
        group, local_logits, local_ends, block_size, interleave, width
    )
    mine = _packed(partial).topk(min(local_budget(topk_blocks), nblocks), dim=-1).values
    newest = torch.where(
        local_ends > 0,
        global_position(local_ends.long().clamp_min(1) - 1, rank, w, interleave),
        -1,
    )
    sent = group.all_gather(torch.cat([mine, newest[:, None]], 1)[None], dim=0)
    return merge_sparse(sent, topk_blocks, block_size, nblocks)


def merge_sparse(sent: torch.Tensor, topk_blocks: int, block_size: int, nblocks: int):
    """The merge of ``candidate_blocks_dcp_sparse``: ``sent`` [W, rows, m + 1]."""
    newest = sent[:, :, -1].amax(0)
    cand = sent[:, :, :-1].permute(1, 0, 2).reshape(sent.shape[1], -1)
    keys, blocks = cand >> 32, _LOW32 - (cand & _LOW32)
    pinned = torch.where(newest >= 0, newest // block_size, -1)
    inf_key = int(order_keys(torch.tensor(math.inf)))
    keys = torch.where(blocks == pinned[:, None], inf_key, keys)
    out = torch.full((sent.shape[1], topk_blocks), -1, dtype=torch.int32)
    for row in range(sent.shape[1]):
        best: dict[int, int] = {}
        for key, block in zip(keys[row].tolist(), blocks[row].tolist(), strict=True):
            best[block] = max(key, best.get(block, key))
        if pinned[row] >= 0:
            best[int(pinned[row])] = inf_key
        ranked = sorted(best.items(), key=lambda kb: (-kb[1], kb[0]))[: min(topk_blocks, nblocks)]
        for j, (block, key) in enumerate(ranked):
            if key_values(torch.tensor(key)).item() != -math.inf:
                out[row, j] = block
    return out


def candidate_blocks_dcp_index_k(
    group: Group,
    local_logits: torch.Tensor,
    local_ends: torch.Tensor,
    topk_blocks: int,
    block_size: int,
    interleave: int,
    width: int,
) -> torch.Tensor:
    """The candidate source on one DCP rank by the index-K exchange (prefill): every
    rank all-gathers the ranks' local columns (here the columns stand for their index
    keys, as a logit is a function of one key and its row), puts each back at its
    global position, sums the ranks' local ends into DCP1's (each position has one
    owner) and runs DCP1's own selection on the whole row."""
    w = group.world_size
    rows = local_logits.shape[0]
    padded = torch.full((rows, width), -math.inf, dtype=torch.float32)
    padded[:, : local_logits.shape[1]] = local_logits.float()
    sent = group.all_gather(padded[None], dim=0)
    frame = torch.full((rows, width), -math.inf, dtype=torch.float32)
    for rank in range(w):
        n = int((owner_rank(torch.arange(width), w, interleave) == rank).sum())
        pos = global_position(torch.arange(n), rank, w, interleave)
        frame[:, pos] = sent[rank][:, :n]
    ends = global_ends(group, local_ends)
    return candidate_blocks_dcp1(frame, ends, topk_blocks, block_size)


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
