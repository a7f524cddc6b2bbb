"""The 0.32.0 series forced onto vllm 0.34.0 (issue 34): three run-time breaks no hunk
applier sees, each named by `bakery rebase` with file and line; the series on its own pin
reports none through the same path. Slow: it fetches vllm 0.34.0 and the flashinfer it
reads (the pinned 0.7.3 is not on PyPI: the next release stands in, with a warning).

The same kinds, planted on synthetic trees: tests/check/test_linkcheck_drift.py.
"""

from __future__ import annotations

import json

import pytest

from bakery.maintain.matrix import matrix
from tests.conftest import run_cli

pytestmark = pytest.mark.slow

SPARSE = "models/deepseek_v41/nvidia/flashinfer_sparse.py"


def test_the_032_series_forced_onto_034_names_the_three_breaks(tmp_path):
    out = tmp_path / "rebase"
    proc = run_cli("rebase", "--to", "vllm==0.34.0", "--out", str(out))
    assert proc.returncode == 1, proc.stderr
    # what a hunk applier sees (13 fuzz since the third review split patch 06's index-K code)
    assert "6 failed, 13 fuzz" in proc.stdout
    findings = [ln.removeprefix("linkcheck: ") for ln in proc.stdout.splitlines()]

    def one(start: str, *words: str) -> str:
        hits = [f for f in findings if f.startswith(start) and all(w in f for w in words)]
        assert len(hits) == 1, (start, words, proc.stdout)
        return hits[0]

    # 1. flashinfer's private SM120 kernel gained a required lse_scale; patch 09 omits it.
    one(f"{SPARSE}:125: ", "_trtllm_batch_decode_sparse_mla_sm120", "'lse_scale'")
    # 2. VllmConfig.use_v2_model_runner is gone with the V1 runner; patch 02 reads it.
    one("models/deepseek_v41/attention.py:265: ", "VllmConfig has no attribute", "use_v2_model")
    # 3. The head set moved to models/deepseek_v4 (pad_to_supported_q_heads): patch 09's
    #    lines and stages.toml's heads_source name the old names.
    one(f"{SPARSE}:729: ", "name '_SPARSE_MLA_SUPPORTED_Q_HEADS' is not defined")
    one(f"{SPARSE}:732: ", "name '_pad_to_supported_q_heads' is not defined")
    one("patches/dcp2/stages.toml:22: ", "heads_source names '_SPARSE_MLA_SUPPORTED_Q_HEADS'")
    report = json.loads((out / "rebase.json").read_text())
    assert any(f.startswith("02-models_deepseek_v41_attention") for f in report["linkcheck_forced"])
    # The names patch 09's import hunk binds (it does not place) are tied to it.
    tied = [f for f in findings if "[bound by a hunk of 09-" in f]
    assert {f.split("'")[1] for f in tied} == {"os", "init_logger", "get_dcp_group",
                                              "dsv41_dcp_combine"}  # fmt: skip


def test_the_series_on_its_own_pin_has_no_findings_through_the_same_path(series):
    row = matrix(series, ["0.32.0"]).releases["0.32.0"]
    assert row.linkcheck == [], row.linkcheck
    assert set(row.patches.values()) == {"clean"}
