"""`make verify MATRIX=launcher/dcp2/matrix-cpu-v41.toml`: the whole DeepSeek-V4.1 on CPU.

The matrix boots the tiny random V4.1 (lab.tiny_v41) through run.sh at TP 2:
DCP 1 as the baseline, DCP 2 as served by default (stage 4, ag_rs), and DCP 2 with a2a,
stage 9's prefill gather and 512-token prefill chunks (index K).
It must pass, each DCP 2 entry must have run the indexer and removed candidate blocks (the
emulation's counts, in the summary), or the pass proves nothing, and each must hold the KV
tokens its config predicts over DCP 1 (the server's own figures, in the summary).

Then each bug the issue names is planted in a copy of the series, baked, and served as the
one candidate of the same matrix against the baseline bundle captured above, on the one
case that crosses the shard edge, the indexer's threshold and the candidate pool
(``--case ctx_0257``, where the weakest plant shows): each must fail it and the summary
must name its first divergence. The index-K exchange's own plants (keys in the ranks'
order, a wrong owner, local row bounds) fail tests/lab/dcp/test_dcp_candidate_patched.py,
which runs the same exchange on gloo ranks in seconds rather than a server start.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest
import tomlkit
from _launch_support import REPO, run_sh
from _planting import plant
from test_serving_v41 import check_measured

from bakery.bake.bake import bake
from bakery.series.series import load_series
from bakery.verify.bundle import record_name
from bakery.verify.suite import load_suite
from lab import tiny_v41

pytestmark = pytest.mark.slow

MATRIX = REPO / "launcher" / "dcp2" / "matrix-cpu-v41.toml"
P01 = "01-model_executor_kernels_attention_dsa_candidate_blocks.py.diff"
P06 = "06-model_executor_layers_sparse_attn_indexer.py.diff"
P09 = "09-models_deepseek_v41_nvidia_flashinfer_sparse.py.diff"
# name -> (patch, the '+' line, what it becomes): the three planted bugs.
PLANTS = {
    "owner": (
        P09,
        "dcp_rank=self.dcp_rank,",
        "dcp_rank=(self.dcp_rank + 1) % self.dcp_world_size,",
    ),
    "local-block-id": (P01, "block = pos // BLOCK_SIZE", "block = (cols - start) // BLOCK_SIZE"),
    "exchange-skipped": (
        P06,
        "dist.all_reduce(x, op=dist.ReduceOp.MAX, group=get_dcp_group().device_group)",
        "return None",
    ),
}
PLANT_CASE = "ctx_0257"
# The matrix's entry whose prefill takes patch 06's index-K exchange (with a2a and stage 9's
# gather; ctx_0300 prefilled in one chunk).
INDEX_K = "v41-dcp2-a2a-s9-index-k"
# The exchange's gathers keep this rank's copy only, as if it were every rank's, and the
# index-K row bounds stay this rank's: with the wire-byte rule the tiny model's prefill
# chunks take index K, so skipping the exchange skips those collectives too.
SKIPPED_GATHERS = (
    (
        "dist.all_gather_into_tensor(out, x.contiguous(), group=group)",
        "out.copy_(torch.cat([x.contiguous()] * world))",
    ),
    (
        "dist.all_gather_into_tensor(out, send, group=group)",
        "out.copy_(torch.cat([send] * dcp_world_size))",
    ),
    ("dist.all_reduce(bounds, group=get_dcp_group().device_group)", "bounds.mul_(1)"),
)


def _matrix(matrix: Path, build: Path, out: Path, art: Path, *more: str, spec: str = "fast"):
    model = tiny_v41.ensure(
        REPO / tiny_v41.DEFAULT_DIRS[spec], tiny_v41.SPECS[spec], tree=build / "baked-cpu"
    )
    return run_sh(
        "matrix", "--matrix", str(matrix), "--build", str(build), "--model", str(model),
        "--out", str(out), "--artifacts", str(art), "--grace", "15", *more, timeout=3600,
    )  # fmt: skip


@pytest.fixture(scope="module")
def v41_run(cpu_bake, module_tmp):
    tmp = module_tmp("v41-matrix")
    proc = _matrix(MATRIX, cpu_bake.tree.parent, tmp / "out", tmp / "artifacts")
    print(proc.stdout[-3000:])
    return proc, tmp / "out"


def _only_candidate(entry: str, out: Path, matrix: Path = MATRIX) -> None:
    """``matrix`` at ``out`` with ``entry`` (renamed "planted") as its one candidate."""
    doc = tomlkit.parse(matrix.read_text())
    (kept,) = [c for c in doc["candidates"] if c["name"] == entry]
    kept["name"] = "planted"
    doc["candidates"] = tomlkit.aot()
    doc["candidates"].append(kept)
    out.write_text(tomlkit.dumps(doc))


def _summary(out: Path) -> dict:
    return json.loads((out / "summary.json").read_text())


def test_the_v41_matrix_passes_and_each_dcp2_entry_ran_the_indexer_and_filtering(v41_run):
    proc, out = v41_run
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = _summary(out)
    rows = {row["name"]: row for row in summary["candidates"]}
    assert set(rows) == {"v41-dcp2-ag_rs", INDEX_K}
    for name, row in rows.items():
        assert row["passed"] is True, (name, row)
        counts = row["exercised"]
        assert counts["indexer_calls"] > 0, (name, counts)
        assert counts["candidate_masked_positions"] > 0, (name, counts)
    assert rows[INDEX_K]["exercised"]["index_k_publishes"] > 0, rows[INDEX_K]
    # DCP 2 holds the KV tokens the config predicts over DCP 1 (issue 25; test_serving_v41),
    # at the profiles' own 256-token chunks (512 in flight reserve more sliding-window pages).
    serving = summary["serving"]
    assert set(serving) == {"v41-dcp1", *rows}
    for name in rows.keys() - {INDEX_K}:
        check_measured(serving["v41-dcp1"], serving[name])
    # The gates held against the teacher-forced scores of every case, not only the trajectory.
    report = json.loads((out / "reports" / "v41-dcp2-ag_rs.json").read_text())
    assert report["settings"]["teacher_forced"] is True
    assert all(case["tf_positions"] > 0 for case in report["cases"].values())


@pytest.mark.parametrize("name", sorted(PLANTS))
def test_a_planted_bug_fails_the_v41_matrix_and_names_the_first_divergence(
    name, v41_run, cache, tmp_path
):
    _, out = v41_run
    series = tmp_path / "dcp2"
    shutil.copytree(REPO / "patches" / "dcp2", series)
    patch, old, new = PLANTS[name]
    plant(series, patch, old, new)
    if name == "exchange-skipped":  # the all-gathers of the same exchanges go too
        for skipped in SKIPPED_GATHERS:
            plant(series, patch, *skipped)
    tree = bake(load_series(series), "cpu", build=tmp_path / "build", cache=cache).tree
    one = tmp_path / "matrix.toml"
    _only_candidate("v41-dcp2-ag_rs", one)
    baseline = out / "bundles" / "v41-dcp1"
    proc = _matrix(
        one, tree.parent, tmp_path / "out", tmp_path / "artifacts",
        "--baseline", str(baseline), "--series", str(series), "--case", PLANT_CASE,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "error: parity failed for 1 candidate(s): ['planted']" in proc.stderr
    summary = _summary(tmp_path / "out")
    assert (
        summary["baseline"]["reused"] is True
        and "FAIL" in (tmp_path / "out" / "summary.md").read_text()
    )
    (row,) = summary["candidates"]
    assert summary["cases"] == [PLANT_CASE]
    assert row["passed"] is False and row["failing_cases"] == [record_name(PLANT_CASE)], row
    assert row["first_divergence"], row


# ---- batches (issue 33) -------------------------------------------------------------
BATCH_MATRIX = REPO / "launcher" / "dcp2" / "matrix-cpu-v41-batch.toml"
BATCH = "v41-batch-dcp2"
KEYLESS_CASE = "batch_short"  # a long prompt, then 28 short ones: rank 1 holds no key of theirs
# issue 33's crash planted back: the keys of a rank that holds none reshaped to [0, -1]
KEYLESS_RESHAPE = (
    P06,
    "local = x[:local_rows].flatten(1).view(torch.uint8)  # 0 rows: [0, bytes]",
    "local = x[:local_rows].reshape(local_rows, -1).view(torch.uint8)",
)


@pytest.fixture(scope="module")
def batch_run(cpu_bake, module_tmp):
    tmp = module_tmp("v41-batch")
    build = cpu_bake.tree.parent
    proc = _matrix(BATCH_MATRIX, build, tmp / "out", tmp / "artifacts", spec="batch")
    print(proc.stdout[-3000:])
    return proc, tmp / "out"


# Which prompts share the server's first step depends on when they reach it, at DCP 1 as at
# DCP 2, and the step's shape moves logprobs by rounding-sized amounts (up to 0.125 measured).
# A fork at step 0 leaves the trajectory gates no common step, so a first token that is a near
# tie would make the verdict the schedules' (it did, with a 0.031 margin). The suite's lengths
# keep every greedy token clear of ties at DCP 1 (top-1 margin >= 0.28 measured 2026-12-06 over
# three schedules); the baseline bundle is checked against the matrix's own low-margin line.
def _first_token_margins(bundle: Path) -> dict[str, float]:
    """Each prompt's top-1 minus top-2 logprob at step 0, read from the raw capture."""
    margins = {}
    for path in sorted(bundle.glob("completion_*.json")):
        (choice,) = json.loads(path.read_text())["response"]["choices"]
        first = sorted(choice["logprobs"]["top_logprobs"][0].values(), reverse=True)
        margins[path.stem] = first[0] - first[1]
    return margins


def test_the_batched_matrix_passes_prompt_by_prompt(batch_run):
    proc, out = batch_run
    # first: a near tie in the suite would fail the verdict below for the schedules' reason
    low_margin = tomlkit.parse(BATCH_MATRIX.read_text())["low_margin"]
    margins = _first_token_margins(out / "bundles" / "v41-batch-dcp1")
    assert len(margins) == 1 + 28 + 4, sorted(margins)
    near_ties = {name: m for name, m in margins.items() if not m >= low_margin}
    assert not near_ties, f"first tokens within {low_margin} of a tie at DCP 1: {near_ties}"
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (row,) = _summary(out)["candidates"]
    assert row["passed"] is True, row


def test_the_batched_matrix_batches_and_leaves_a_rank_keyless(batch_run):
    """Every prompt answered and compared, none errored, steps of several requests, and a
    rank that joined the index-K gather holding no key."""
    proc, out = batch_run
    assert proc.returncode in (0, 1), proc.stdout[-3000:] + proc.stderr[-3000:]
    (row,) = _summary(out)["candidates"]
    assert not row.get("error"), row
    counts = row["exercised"]
    # the prompts were scheduled together, and a rank joined the index-K gather keyless
    assert counts["multi_request_steps"] > 0, counts
    assert counts["index_k_keyless_gathers"] > 0, counts
    report = json.loads((out / "reports" / f"{BATCH}.json").read_text())
    members = [m for case in load_suite("v41batch").cases for m in case.members]
    assert sorted(report["cases"]) == sorted(record_name(m) for m in members)
    assert len(members) == 1 + 28 + 4


def test_the_keyless_crash_planted_back_fails_the_batched_matrix_within_its_bound(
    batch_run, cache, tmp_path
):
    """A rank that raises while the others wait in the all-gather: the entry fails (its
    requests end at the matrix's request bound at the latest) and the matrix stops the
    server and finishes; it never hangs."""
    _, out = batch_run
    series = tmp_path / "dcp2"
    shutil.copytree(REPO / "patches" / "dcp2", series)
    plant(series, *KEYLESS_RESHAPE)
    tree = bake(load_series(series), "cpu", build=tmp_path / "build", cache=cache).tree
    doc = tomlkit.parse(BATCH_MATRIX.read_text())
    doc["candidates"][0]["name"] = "planted"
    # The crash is in the first prefill step, seconds into the request; the bound only ends
    # the other ranks' wait (the log check below says it failed for the crash).
    doc["request_timeout_s"] = bound = 30
    one = tmp_path / "matrix.toml"
    one.write_text(tomlkit.dumps(doc))
    started = time.monotonic()
    proc = _matrix(
        one, tree.parent, tmp_path / "out", tmp_path / "artifacts",
        "--baseline", str(out / "bundles" / "v41-batch-dcp1"), "--series", str(series),
        "--case", KEYLESS_CASE, spec="batch",
    )  # fmt: skip
    took = time.monotonic() - started
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    (row,) = _summary(tmp_path / "out")["candidates"]
    assert row["passed"] is not True, row
    # booting, the one failed request's bound and the stop, not a hang
    assert took < bound + 900, took
    # and it failed where the plant is: the rank holding no key raised in the exchange
    (log,) = (tmp_path / "artifacts").glob("cpu-v41-dcp2/*/serve.log")
    assert "cannot reshape tensor of 0 elements" in log.read_text(errors="replace")
