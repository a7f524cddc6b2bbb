"""The interpreter's fp8 cast, with the emulation's fix, equals torch's (round to nearest
even, carry into the exponent); without the fix (the plant) it does not.

Reference: torch's ``.to(torch.float8_e4m3fn)`` (CUDA rounds the same way).
"""

from __future__ import annotations

import pytest
import torch
import triton.language as tl
from _emu import fp8_fixed, jit

pytestmark = pytest.mark.needs("triton")

# (input, what the unfixed Triton 3.9 interpreter gives, what torch and CUDA give)
KNOWN = [(31.25, 16.0, 32.0), (17.0, 18.0, 16.0), (100.0, 104.0, 96.0)]


def _cast(x_ptr, y_ptr, N: tl.constexpr):
    offs = tl.arange(0, N)
    x = tl.load(x_ptr + offs)
    tl.store(y_ptr + offs, x.to(tl.float8e4nv).to(tl.uint8, bitcast=True))


def _values() -> torch.Tensor:
    """The known cases, every e4m3 value, the midpoints between neighbours (ties), and
    random values in range, both signs, subnormals included; a power-of-two length."""
    grid = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
    grid = grid[grid.isfinite()].unique()
    mids = (grid[:-1] + grid[1:]) / 2
    rand = (torch.rand(2048, generator=torch.Generator().manual_seed(0)) * 2 - 1) * 448
    known = torch.tensor([k[0] for k in KNOWN])
    x = torch.cat([known, -known, grid, mids, rand, rand / 2**12])
    return torch.cat([x, torch.zeros(8192 - x.numel())])


def _interpreted(x: torch.Tensor) -> torch.Tensor:
    y = torch.empty(x.numel(), dtype=torch.uint8)
    jit(_cast)[(1,)](x, y, N=x.numel())
    return y


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fixed_interpreter_casts_as_torch(monkeypatch, dtype):
    fp8_fixed(monkeypatch)
    x = _values().to(dtype)
    want = x.float().to(torch.float8_e4m3fn).view(torch.uint8)
    got = _interpreted(x)
    assert torch.equal(got, want), f"{(got != want).sum()} of {x.numel()} bytes differ"
    for value, _, right in KNOWN:
        one = torch.tensor([value, 0.0], dtype=dtype)
        assert _interpreted(one).view(torch.float8_e4m3fn)[0].item() == right


def test_unfixed_interpreter_is_the_plant():
    # The plant is Triton's own interpreter: the comparison above must fail without the fix.
    x = _values()
    want = x.to(torch.float8_e4m3fn).view(torch.uint8)
    assert not torch.equal(_interpreted(x), want)
    for value, wrong, _ in KNOWN:
        got = _interpreted(torch.tensor([value, 0.0])).view(torch.float8_e4m3fn)[0].item()
        assert got == wrong, (value, got)
