"""The whole DeepSeek-V4.1 at DCP 2 through run.sh start: what the run found stays found.

Serving it, the indexer, the candidate exchange and parity against DCP 1 are
tests/parity/test_matrix_v41.py (`make verify MATRIX=launcher/dcp2/matrix-cpu-v41.toml`, whose
summary counts what each entry exercised). Here the series as it was before the first run
(patch 09 converting ids in tiles of 128) must not get past the start's completion probe.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from _launch_support import REPO, free_port, run_sh
from _planting import plant

from bakery.bake.bake import bake
from bakery.series.series import load_series
from lab import tiny_v41

pytestmark = pytest.mark.slow

P09 = "09-models_deepseek_v41_nvidia_flashinfer_sparse.py.diff"


def _start(build: Path, art: Path, port: int, *more: str):
    model = tiny_v41.ensure(REPO / tiny_v41.DEFAULT_DIRS["fast"], tree=build / "baked-cpu")
    return run_sh(
        "start",
        "--profile",
        "cpu-v41-dcp2",
        "--build",
        str(build),
        "--model",
        str(model),
        "--port",
        str(port),
        "--grace",
        "15",
        "--artifacts",
        str(art),
        *more,
        timeout=1200,
    )


def test_the_series_before_the_run_found_its_tile_bug_does_not_serve(cache, tmp_path):
    """The run's first finding: patch 09 converted ids in tiles of 128, which asserts on
    the model's index_topk of 64 under DCP. Planted back, the server never gets ready."""
    series = tmp_path / "dcp2"
    shutil.copytree(REPO / "patches" / "dcp2", series)
    plant(
        series,
        P09,
        "BLOCK_N=min(128, topk_indices.shape[1] & -topk_indices.shape[1]),",
        "BLOCK_N=128,",
    )
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
