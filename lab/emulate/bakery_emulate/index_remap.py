"""vLLM's sparse-MLA index remap (``v1/attention/backends/mla/sparse_utils.py``, not patched
by the series; behind ``triton_convert_req_index_to_global_index`` and
``triton_filter_and_convert_dcp_index``), ported to torch: interpreted, it was over
two fifths of a CPU prefill under DCP. The compaction keeps column order, one of the
orders the kernel allows ("prefix order is unspecified, only the set matters");
tests/lab/emulate holds the port equal to the interpreted original.
"""

from __future__ import annotations

import torch


class RemapIndex:
    def __call__(
        self,
        req_id,
        block_table,
        token_indices,
        out,
        valid_counts,
        prefill_request_ids,
        prefill_starts,
        *,
        workspace_rank_stride,
        max_num_blocks_per_req,
        BLOCK_SIZE,
        BLOCK_STRIDE_ROWS,
        BLOCK_N,
        NUM_TOPK_TOKENS,
        HAS_PREFILL_WORKSPACE,
        COUNT_VALID,
        COMPACT_TO_FRONT,
        DCP_SIZE,
        DCP_RANK,
        DCP_INTERLEAVE,
    ):
        rows = req_id.shape[0]
        tok = token_indices[:rows, :NUM_TOPK_TOKENS].long()
        invalid = tok < 0
        if HAS_PREFILL_WORKSPACE:
            prefill_id = prefill_request_ids[:rows].long()
        else:
            prefill_id = torch.full((rows,), -1, dtype=torch.long)
        is_prefill = (prefill_id >= 0)[:, None]
        owner = (tok // DCP_INTERLEAVE) % DCP_SIZE
        remote = owner != DCP_RANK
        local = tok // (DCP_SIZE * DCP_INTERLEAVE) * DCP_INTERLEAVE + tok % DCP_INTERLEAVE
        block, offset = local // BLOCK_SIZE, local % BLOCK_SIZE
        valid_block = (block < max_num_blocks_per_req) & (block >= 0)
        invalid |= ~valid_block | (remote & ~is_prefill)
        reads = valid_block & ~is_prefill & ~remote
        req = req_id[:rows].long()[:, None].expand_as(block)
        base = torch.where(reads, block_table[req, block.clamp(0, block_table.shape[1] - 1)], 0)
        value = base.long() * BLOCK_STRIDE_ROWS + offset
        if HAS_PREFILL_WORKSPACE:
            start = prefill_starts[prefill_id.clamp(min=0)].long()[:, None]
            prefill_value = owner * workspace_rank_stride + start + local
            value = torch.where(is_prefill, prefill_value, value)
        value = torch.where(invalid, -1, value)
        valid = ~invalid
        if COMPACT_TO_FRONT:
            order = torch.sort((~valid).to(torch.int8), dim=1, stable=True).indices
            value = torch.gather(value, 1, order)
        out[:rows, :NUM_TOPK_TOKENS] = value.to(out.dtype)
        if COUNT_VALID:
            valid_counts[:rows] = valid.sum(1).to(valid_counts.dtype)
