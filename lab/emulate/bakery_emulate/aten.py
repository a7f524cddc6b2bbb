"""CPU kernels for aten ops that torch ships for CUDA only."""

from __future__ import annotations

import torch

_LIB: torch.library.Library | None = None


def _mm_dtype(a: torch.Tensor, b: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    # CUDA's kernel: low-precision inputs, fp32 accumulation, then out_dtype.
    return torch.mm(a.float(), b.float()).to(out_dtype)


def register() -> None:
    global _LIB
    if _LIB is None:
        _LIB = torch.library.Library("aten", "IMPL")
        _LIB.impl("mm.dtype", _mm_dtype, "CPU")
