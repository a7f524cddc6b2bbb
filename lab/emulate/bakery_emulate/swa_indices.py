"""vLLM's SWA window indices (``_compute_swa_indices_and_lens_kernel`` in
``v1/attention/backends/mla/sparse_swa.py``; the series only adds ``dcp_sharded=False``
to that file, not to this kernel), ported to torch: interpreted it was a quarter of a
CPU prefill. tests/lab/emulate holds it equal to the interpreted original.
"""

from __future__ import annotations

import torch


class SWAIndicesAndLens:
    def __call__(
        self,
        swa_indices,
        swa_lens,
        window_size,
        index_width,
        left_visible,
        right_visible,
        query_start_loc,
        seq_lens,
        token_to_req_indices,
        is_valid_token,
        block_table,
        block_size,
        replay_start,
        *,
        num_tokens,
        token_offset,
        has_image=False,
    ):
        tokens = torch.arange(num_tokens) + token_offset
        valid = is_valid_token[tokens].bool()
        req = token_to_req_indices[tokens].long()
        query_start = query_start_loc[req].long()
        query_len = query_start_loc[req + 1].long() - query_start
        pos = seq_lens[req].long() - query_len + tokens - query_start
        if has_image:
            left, right = left_visible[tokens].long(), right_visible[tokens].long()
        else:
            left = right = torch.zeros_like(pos)
        left_add = (left - (window_size - 1)).clamp(min=0)
        start = (pos - (window_size - 1) - left_add).clamp(min=0)
        start = torch.maximum(start, replay_start[req].long())
        end = pos + right + 1
        length = end - start
        offsets = torch.arange(index_width)[None, :]
        at = start[:, None] + offsets
        inside = at < end[:, None]
        blocks = block_table[req[:, None], (at // block_size).clamp(0, block_table.shape[1] - 1)]
        slots = torch.where(inside, blocks.long() * block_size + at % block_size, 0)
        slots = torch.where(offsets < length[:, None], slots, -1)
        rows = swa_indices.view(swa_indices.shape[0], -1)  # [T, W] or [T, 1, W]: the row stride
        rows[:num_tokens, :index_width] = torch.where(valid[:, None], slots, -1).to(rows.dtype)
        swa_lens[:num_tokens] = torch.where(valid, length, 0).to(swa_lens.dtype)
