"""vLLM's mHC head reduce (``_hc_head_reduce_store_kernel`` in
``model_executor/kernels/mhc/triton.py``; the series does not touch it), ported to
torch: interpreted, it was an eleventh of a served V4.1's time. Both of its launchers
(``hc_collapse_triton``, ``hc_head_reduce_triton_kernel``) look the kernel up by name, so
they stay real. tests/lab/emulate holds the port's bytes equal to the interpreted
original's.

Contract, per token t and hidden column h: acc = 0.0, then acc += pre[t, m] * x[t, m, h]
for m = 0 .. hc_mult - 1 in fp32 (each product and sum rounded, no fma), stored in
``out``'s dtype (nearest even).
"""

from __future__ import annotations

import torch


class HcHeadReduce:
    """Launched as the kernel is: ``reduce[(num_tokens, blocks)](*args, **constexprs)``."""

    def __init__(self, original):
        self.original = original  # tests compare with it

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.reduce(grid[0], *args, **kwargs)

    @staticmethod
    def mix_order(hc_mult: int) -> range:
        return range(hc_mult)

    def reduce(
        self,
        num_tokens,
        pre,
        x,
        out,
        hidden_size,
        hc_mult,
        pre_stride_t,
        pre_stride_m,
        x_stride_t,
        x_stride_m,
        x_stride_h,
        out_stride_t,
        out_stride_h,
        **_,
    ):
        pre = torch.as_strided(
            pre, (num_tokens, hc_mult), (pre_stride_t, pre_stride_m), pre.storage_offset()
        ).float()
        x = torch.as_strided(
            x,
            (num_tokens, hc_mult, hidden_size),
            (x_stride_t, x_stride_m, x_stride_h),
            x.storage_offset(),
        )
        acc = torch.zeros(num_tokens, hidden_size)
        for m in self.mix_order(hc_mult):
            acc = acc + pre[:, m, None] * x[:, m].float()
        dest = torch.as_strided(
            out, (num_tokens, hidden_size), (out_stride_t, out_stride_h), out.storage_offset()
        )
        dest.copy_(acc)
