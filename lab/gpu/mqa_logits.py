"""An fp8 MQA-logits kernel of DeepSeek-V4.1's indexer shape, for timing on a GPU.

A Triton stand-in of DeepGEMM's ``fp8_mqa_logits`` (relu, head weights and the sum
over heads fused): ``lab.gpu.candidate_blocks`` times it to price recomputing
logits (the prefill index-K exchange). Imported only there, on that path.
"""

import triton
import triton.language as tl


@triton.jit
def mqa_logits_kernel(
    q, k, w, out, N, H: tl.constexpr, D: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr
):
    """fp8 MQA logits of DeepSeek-V4.1's indexer shape: sum over heads of w * relu(q . k)."""
    rows = tl.program_id(0) * BM + tl.arange(0, BM)
    cols = tl.program_id(1) * BN + tl.arange(0, BN)
    d = tl.arange(0, D)
    kt = tl.load(k + cols[None, :] * D + d[:, None])
    acc = tl.zeros([BM, BN], tl.float32)
    for h in range(H):
        qh = tl.load(q + (rows[:, None] * H + h) * D + d[None, :])
        s = tl.dot(qh, kt)
        acc += tl.maximum(s, 0.0) * tl.load(w + rows * H + h)[:, None]
    tl.store(out + rows[:, None] * N + cols[None, :], acc)
