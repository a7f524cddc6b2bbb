"""vLLM's KV block zeroing (``_zero_kv_blocks_kernel`` in ``v1/worker/utils.py``; the
series does not touch it), in ctypes: interpreted, it cleared each new block's pages 4
bytes at a time in Python, a twelfth of a served V4.1's time. tests/lab/emulate holds it equal
to the interpreted original.

Contract: for each segment (an absolute byte address, a block stride and a page size,
both in 4-byte words) and each block id, zero ``page_size`` words at
``address + block_id * block_stride`` words.
"""

from __future__ import annotations

import ctypes

WORD = 4


class ZeroKVBlocks:
    def __getitem__(self, grid):
        return self._run

    @staticmethod
    def _run(seg_addrs, seg_block_strides, seg_page_sizes, block_ids, BLOCK_SIZE):  # noqa: N803
        blocks = block_ids.tolist()
        addresses, strides = seg_addrs.tolist(), seg_block_strides.tolist()
        segments = zip(addresses, strides, seg_page_sizes.tolist(), strict=True)
        for address, stride, size in segments:
            for block in blocks:
                ctypes.memset(address + block * stride * WORD, 0, size * WORD)
