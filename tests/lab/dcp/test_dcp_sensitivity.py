"""Planting an index bug in patch 09 must make the patched-code parity check fail.

Each variant copies patches/dcp2, rewrites one '+' line of patch 09's
``_dcp_prefill_gather`` (the diff stays valid: only a line's content changes),
bakes the copy with the real bake API and runs tests/lab/dcp/_dcp_patched_driver.py on
that tree. The unplanted copy goes through the same steps and must pass.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from _dcp_patched_driver import INDEX_CHECKS, OTHER_CHECKS, SERIES_CHECKS, failed, run_driver
from _planting import bake_planted

pytestmark = pytest.mark.slow

PATCH = "09-models_deepseek_v41_nvidia_flashinfer_sparse.py.diff"
TARGET = "vllm/models/deepseek_v41/nvidia/flashinfer_sparse.py"
OWNER = "owner = (off // K) % W"
LOFF = "loff = (off // (K * W)) * K + off % K"
# variant -> (correct text, planted text); both bugs are right only at K == 1
BUGS = {
    "clean": None,
    "owner_ignores_interleave": (OWNER, "owner = off % W"),
    "loff_drops_times_k": (LOFF, "loff = (off // (K * W)) + off % K"),
}
# a wrong owner/loff moves slots; the gathered pages, counts and the rest stay right
MUST_FAIL = {"gather_slots", "gather_lookup", "gather_attention", "two_layer_slots"}
MUST_PASS = {"gather_kv", "gather_lens", *OTHER_CHECKS, *(set(SERIES_CHECKS) - set(INDEX_CHECKS))}


@pytest.fixture(scope="module")
def variants(module_tmp, cache) -> dict[str, tuple[Path, dict]]:
    trees = {}
    for name, bug in BUGS.items():
        old, new = bug or (None, None)
        trees[name] = bake_planted(module_tmp(name), cache, PATCH, old, new)
    # the three children are independent: overlap their 20 s vLLM imports
    with ThreadPoolExecutor(max_workers=min(len(trees), os.cpu_count() or 1)) as pool:
        results = dict(zip(trees, pool.map(run_driver, trees.values()), strict=True))
    return {name: (trees[name], results[name]) for name in trees}


@pytest.mark.parametrize("name", BUGS)
def test_planted_bug_fails_parity(variants, name):
    tree, result = variants[name]
    assert Path(result["vllm_file"]).is_relative_to(Path(tree).resolve())
    baked = (Path(tree) / TARGET).read_text()
    bug = BUGS[name]
    bad = failed(result)
    if bug is None:
        assert OWNER in baked and LOFF in baked
        assert bad == {}, f"unplanted series fails: {bad}"
        return
    assert bug[1] in baked and bug[0] not in baked, "the bug did not reach the baked tree"
    assert MUST_FAIL <= bad.keys(), f"planted {bug[1]!r} but only {bad} failed"
    assert not (MUST_PASS & bad.keys()), f"unrelated checks failed: {bad}"
    assert set(bad) <= set(INDEX_CHECKS), bad
