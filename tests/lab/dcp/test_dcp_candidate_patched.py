"""Stage 4's baked code over real gloo groups, and planted bugs that it must catch.

tests/lab/dcp/_dcp_candidate_driver.py runs patch 06's ``_candidate_step`` with patch 01's
Triton kernels (TRITON_INTERPRET=1, the real triton 3.9.0) and the real
``dist.all_reduce(MAX)`` / ``all_gather_into_tensor`` (dense and sparse exchange) on
W=2, 4 and 8 forked gloo ranks, against the baked DCP1
selection and ``lab.dcp.reference``. Each bug variant copies patches/dcp2,
rewrites one '+' line of patch 01 or 06, bakes the copy (cpu base) and runs the same
driver at W=2 (at every W where a check of its fails only there); the unplanted series goes
through the same steps at every W and must pass.
"""

from __future__ import annotations

from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from _dcp_candidate_driver import CHECKS, INDEX_K_CHECKS, REFUSALS, failed, run_driver
from _planting import bake_planted

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[3]
PATCH = "01-model_executor_kernels_attention_dsa_candidate_blocks.py.diff"
INDEXER = "06-model_executor_layers_sparse_attn_indexer.py.diff"
TARGET = "vllm/model_executor/kernels/attention/dsa/candidate_blocks.py"
INDEXER_TARGET = "vllm/model_executor/layers/sparse_attn_indexer.py"
GLOBAL_POS = "(local // INTERLEAVE) * (INTERLEAVE * WORLD) + rank * INTERLEAVE"
SOURCE_COLS = "cols = start + (pos // (INTERLEAVE * WORLD)) * INTERLEAVE + pos % INTERLEAVE"
CONSUMER_BLOCK = "block = pos // BLOCK_SIZE"
BY_BLOCK = "by_block = (block << 32) | ((1 << 31) - 1 - key)"
LOCAL_BUDGET = "m = min(topk_blocks + 1, nblocks)"
KEY_LOOP = "for tile in range(tl.program_id(1), tl.cdiv(nblocks + 1, TILE), step):"
MASK_LOOP = "for tile in range(tl.program_id(1), tl.cdiv(tl.maximum(end - start, 0), TILE), step):"
# variant -> (correct text, planted text, checks that must fail[, patch: 01 if absent])
BUGS = {
    "clean": None,
    # the source reads a global position's logit at the same local column
    "candidate_source_local_as_global": (
        SOURCE_COLS,
        "cols = start + pos",
        {"candidates_eq_dcp1_kernel", "candidates_eq_reference"},
    ),
    # every rank maps its columns with the next rank's offset
    "candidate_wrong_rank_offset": (
        GLOBAL_POS,
        "(local // INTERLEAVE) * (INTERLEAVE * WORLD) + ((rank + 1) % WORLD) * INTERLEAVE",
        {"mask_eq_reference"},
    ),
    # the consumer takes its local column for the global block
    "candidate_consumer_local_as_global": (
        CONSUMER_BLOCK,
        "block = (cols - start) // BLOCK_SIZE",
        {"mask_eq_reference"},
    ),
    # the sparse merge keeps each block's lowest copy (an under-estimated partial)
    "sparse_merge_lowest_copy": (
        BY_BLOCK,
        "by_block = (block << 32) | (key + (1 << 31))",
        {"sparse_eq_reference"},
    ),
    # the live-context bound skips a tile that still holds visible columns
    "keys_skip_live_tile": (
        "if tile * TILE * BLOCK_SIZE <= last:",
        "if tile * TILE * BLOCK_SIZE * WORLD <= last:",
        {"dense_eq_dcp1_kernel", "sparse_eq_reference"},
    ),
    # a key program strides past a tile: its keys are never written
    "keys_stride_skips_tile": (
        KEY_LOOP,
        KEY_LOOP.replace("step):", "step + 1):"),
        {"dense_eq_dcp1_kernel", "sparse_eq_reference"},
    ),
    # a mask program strides past a tile: its columns stay unmasked
    "mask_stride_skips_tile": (
        MASK_LOOP,
        MASK_LOOP.replace("step):", "step + 1):"),
        {"mask_eq_reference"},
    ),
    # index K: every position taken from the next rank's keys
    "index_k_wrong_owner": (
        "owner = (g // interleave) % world",
        "owner = (g // interleave + 1) % world",
        {"index_k_eq_dcp1_kernel"},
    ),
    # index K: the gathered keys left in the ranks' order, not DCP1's
    "index_k_rank_order": (
        "keys = gathered(k_quant)[order].view(k_quant.dtype)",
        "keys = gathered(k_quant)[order.sort().values].view(k_quant.dtype)",
        {"index_k_eq_dcp1_kernel"},
        INDEXER,
    ),
    # index K: DCP1's logits bounded by this rank's local row bounds (no sum over ranks)
    "index_k_local_bounds": (
        "dist.all_reduce(bounds, group=get_dcp_group().device_group)",
        "bounds.mul_(1)",
        {"index_k_eq_dcp1_kernel"},
        INDEXER,
    ),
    # index K: the size rule counts one rank's keys, not W of them
    "index_k_rule_one_rank": (
        "keys = _all_gather_wire(world * index_k_rows * index_k_row_bytes, world)",
        "keys = _all_gather_wire(index_k_rows * index_k_row_bytes, world)",
        {"index_k_rule", "byte_rule_counts_wire_bytes"},
    ),
    # the byte rule counts the all-reduce's buffer, not what the ring moves
    "byte_rule_dense_buffer": (
        '"dense": _all_reduce_wire(rows * (nblocks + 1) * 4, world),',
        '"dense": rows * (nblocks + 1) * 4,',
        {"byte_rule_counts_wire_bytes", "index_k_rule"},
    ),
    # index K: the keys of a rank that holds none reshaped to [0, -1] (issue 33's crash):
    # that rank raises, the others would wait in the all-gather; the run fails at once
    "index_k_keyless_reshape": (
        "local = x[:local_rows].flatten(1).view(torch.uint8)  # 0 rows: [0, bytes]",
        "local = x[:local_rows].reshape(local_rows, -1).view(torch.uint8)",
        {"gloo_run"},
        INDEXER,
    ),
    # index K: the keys gathered again for every sub-chunk of a scheduler chunk
    "index_k_gather_every_sub_chunk": (
        "if self.keys is None or not chunk.skip_kv_gather:",
        "if True:",
        {"index_k_one_gather_per_chunk"},
        INDEXER,
    ),
    # the mask writes -inf past the row's end (up to its last tile), as DCP1's fill does
    "mask_writes_past_row_end": (
        "valid = cols < end",
        "valid = cols < width",
        {"mask_outside_untouched"},
    ),
    # each rank sends its top k, not k + 1: the pin can push a winner out
    "sparse_local_budget_k": (
        LOCAL_BUDGET,
        "m = min(topk_blocks, nblocks)",
        {"sparse_eq_reference"},
    ),
}

# Plants with a named check that W 2's cases never fail (measured): they run every W.
EVERY_W = {"keys_stride_skips_tile", "byte_rule_dense_buffer"}


@pytest.fixture(scope="module")
def candidate_variants(module_tmp, cache) -> dict[str, tuple[Path, dict]]:
    trees = {}
    for name, bug in BUGS.items():
        old, new = bug[:2] if bug else (None, None)
        patch = bug[3] if bug and len(bug) > 3 else PATCH
        trees[name] = bake_planted(module_tmp(name), cache, patch, old, new)
    # The series runs every W, a plant W 2 only unless it is listed in EVERY_W.
    worlds = {name: (2,) if BUGS[name] and name not in EVERY_W else (2, 4, 8) for name in trees}
    with ThreadPoolExecutor(max_workers=2) as pool:
        runs = pool.map(lambda name: run_driver(trees[name], worlds[name]), trees)
        results = dict(zip(trees, runs, strict=True))
    return {name: (trees[name], results[name]) for name in trees}


@pytest.mark.parametrize("name", BUGS)
def test_candidate_baked_code_and_planted_bugs(candidate_variants, name):
    tree, result = candidate_variants[name]
    assert Path(result["vllm_file"]).is_relative_to(Path(tree).resolve())
    baked = (Path(tree) / TARGET).read_text()
    bad = failed(result)
    bug = BUGS[name]
    if bug is None:
        ran = Counter(c["name"] for c in result["checks"])
        # per W (2, 4, 8): 8, 4 and 2 cases x W ranks; index K: 3, 2 and 2 cases x W ranks
        # (the keyless ones, 1 a W, also check that the rule picked index K, then run it
        # in sub-chunks); the byte rule's 4 shapes a W; the gate cases
        per_rank, index_k_runs, keyless = 8 * 2 + 4 * 4 + 2 * 8, 3 * 2 + 2 * 4 + 2 * 8, 2 + 4 + 8
        assert ran == {
            **dict.fromkeys(CHECKS, per_rank),
            **dict.fromkeys(INDEX_K_CHECKS[:3], index_k_runs),
            "index_k_rule": index_k_runs + keyless,
            **dict.fromkeys(INDEX_K_CHECKS[3:], keyless),
            "byte_rule_counts_wire_bytes": 3 * 4,
            "refusal": len(REFUSALS),
        }, ran
        # both exchanges were picked by the size rule somewhere
        picked = {
            c["case"].rsplit(":", 1)[1]
            for c in result["checks"]
            if c["name"] == "candidates_eq_dcp1_kernel"
        }
        assert picked == {"dense", "sparse"}, picked
        assert bad == {}, (
            f"unplanted series fails: {[c for c in result['checks'] if not c['ok']][:3]}"
        )
        return
    old, new, must_fail = bug[:3]
    if len(bug) > 3:
        baked = (Path(tree) / INDEXER_TARGET).read_text()
    assert new in baked and old not in baked, "the bug did not reach the baked tree"
    assert must_fail <= bad.keys(), f"planted {new!r} but only {bad} failed"
    if "gloo_run" in must_fail:  # a crashed rank fails the run at once, by name: no hang
        details = [c["detail"] for c in result["checks"] if c["name"] == "gloo_run"]
        assert all("exited with" in d and "did not finish" not in d for d in details), details


def test_candidate_gpu_tool_dry_run(cpu_bake, tmp_path):
    """tools/gpu_candidate_blocks.py end to end on CPU (gloo, interpreter, fp32, W=2)."""
    import json
    import os
    import subprocess
    import sys

    env = {**os.environ, "TRITON_INTERPRET": "1", "OMP_NUM_THREADS": "1"}
    tool = REPO / "tools" / "gpu_candidate_blocks.py"
    args = [str(cpu_bake.tree), "--device", "cpu", "--quick", "--out", str(tmp_path)]
    proc = subprocess.run(
        [sys.executable, "-O", str(tool), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    res = json.loads((tmp_path / "gpu_candidate_blocks.json").read_text())
    assert res["ok"] and len(res["cases"]) == 2 * 3  # 3 fp32 cases on each of 2 ranks
    assert {c["mask_baseline"] for c in res["cases"]} == {"reference"}
    assert all(c["eq_dcp1_kernel"] and c["same_on_every_rank"] for c in res["cases"])
