"""The V2 runner's slot-mapping kernel, in torch.

Triton's interpreter refuses the kernel's CP branch (``~sharded`` on a loaded bool makes
a store mask of an unsupported dtype), so ``BlockTables.compute_slot_mappings`` runs this
line-for-line port of ``_compute_slot_mappings_kernel`` instead.
"""

from __future__ import annotations

import torch


def compute_slot_mappings(
    self, idx_mapping, query_start_loc, positions, num_tokens_padded, out=None
):
    slot_mappings = self.slot_mappings if out is None else out
    if self.num_kv_cache_groups == 0:
        return slot_mappings[:, :num_tokens_padded]
    from vllm.v1.worker.gpu.block_table import PAD_SLOT_ID

    num_reqs = idx_mapping.shape[0]
    qsl = query_start_loc[: num_reqs + 1].tolist()
    for g in range(self.num_kv_cache_groups):
        row = slot_mappings[g]
        row[qsl[num_reqs] :] = PAD_SLOT_ID
        block_table = self.block_tables[g].gpu
        kv_block_size = self.block_sizes[g]
        enabled = bool(self.slot_mapping_enabled[g])
        sharded = bool(self.dcp_sharded[g])
        for b in range(num_reqs):
            start, end = qsl[b], qsl[b + 1]
            if end <= start:
                continue
            pos = positions[start:end].long()
            req = int(idx_mapping[b])
            if self.cp_size == 1 or not sharded:
                local, is_local = pos, torch.ones_like(pos, dtype=torch.bool)
            else:
                virtual = kv_block_size * self.cp_size
                offsets = pos % virtual
                is_local = offsets // self.cp_interleave % self.cp_size == self.cp_rank
                rounds = offsets // (self.cp_interleave * self.cp_size)
                local_offsets = rounds * self.cp_interleave + offsets % self.cp_interleave
                local = pos // virtual * kv_block_size + local_offsets
            if req < 0 or not enabled:
                row[start:end] = PAD_SLOT_ID
                continue
            blocks = block_table[req, (local // kv_block_size).clamp(max=block_table.shape[1] - 1)]
            slots = blocks.long() * kv_block_size + local % kv_block_size
            row[start:end] = torch.where(is_local, slots, PAD_SLOT_ID)
    return slot_mappings[:, :num_tokens_padded]
