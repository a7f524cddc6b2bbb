"""vLLM's fused q/kv RMSNorm (``models/common/ops/fused_qk_rmsnorm.py``, not patched by
the series), in torch: fp32 math as the kernel does, one store rounding to the row's
dtype. Interpreted it was a seventh of a CPU prefill; tests/lab/emulate compares it with
the interpreted original (equal but for the last bit of the fp32 sum's order).
"""

from __future__ import annotations

import torch


def _norm(x: torch.Tensor, weight: torch.Tensor, eps: float, out: torch.Tensor) -> None:
    xf = x.float()
    rrms = torch.rsqrt((xf * xf).sum(-1, keepdim=True) / x.shape[-1] + eps)
    out.copy_((xf * rrms * weight.float()).to(out.dtype))


class FusedQKVRMSNorm:
    def __call__(self, q, kv, q_out, kv_out, q_weight, kv_weight, eps):
        _norm(q, q_weight, eps, q_out)
        _norm(kv, kv_weight, eps, kv_out)
