"""The emulation's torch ports of upstream kernels equal the baked tree's Triton originals.

emulate/ replaces a few of vLLM's own kernels (ones the series does not patch) that
dominate an interpreted CPU prefill. Each must give the interpreted original's bytes on
the same inputs, and each planted copy (a wrong rank, a dropped mask, an off-by-one)
must not; ``_ports_driver.py`` runs both in a child over a real cpu bake.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from _dcp_child import REPO, run_child

pytestmark = pytest.mark.needs("triton")


@pytest.fixture(scope="module")
def results(cpu_bake) -> dict:
    return run_child(
        str(Path(__file__).with_name("_ports_driver.py")),
        cpu_bake.tree,
        env={"TRITON_INTERPRET": "1", "PYTHONPATH": f"{REPO / 'lab' / 'emulate'}:{cpu_bake.tree}"},
        timeout=600,
    )


PORTS = (
    "quantize_insert",
    "rope_quant_insert[ratio1]",
    "rope_quant_insert[ratio2]",
    "save_compress_norm[ratio1]",
    "save_compress_norm[ratio2]",
    "correct_attn_out[rank0]",
    "correct_attn_out[rank1]",
    "a2a_pack[bfloat16]",
    "a2a_unpack[bfloat16]",
    "a2a_unpack_kernel[bfloat16]",
    "a2a_pack[float32]",
    "a2a_unpack[float32]",
    "a2a_unpack_kernel[float32]",
    "inverse_rope",
    "index_remap[w1r0i1]",
    "index_remap[w2r0i2]",
    "index_remap[w2r1i2]",
    "index_remap[w4r3i1]",
    "qkv_rmsnorm",
    "swa_indices[image=False,offset=0]",
    "swa_indices[image=False,offset=2]",
    "swa_indices[image=True,offset=0]",
    "swa_indices[image=True,offset=2]",
    "zero_kv_blocks",
    "folded_reduce",
    "listed_builtins",
    # V4.1's indexer K store and mHC head reduce
    "numpy_sum[128]",
    "fp8_exponent[bf16]",
    "indexer_k_store[ratio=1]",
    "indexer_k_store[ratio=2]",
    "indexer_k_store[padding]",
    "hc_collapse",
    "hc_head_reduce",
)


@pytest.mark.parametrize("name", PORTS)
def test_port_equals_the_interpreted_kernel_and_a_planted_copy_does_not(results, name):
    assert results[name]["equal"], f"{name}: the port differs from the baked kernel"
    assert not results[name]["planted_equal"], f"{name}: a planted copy still agrees"
