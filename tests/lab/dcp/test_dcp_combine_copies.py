"""tools/gpu_combine_copies.py's checks on CPU (TRITON_INTERPRET=1): patch 09's combine
without its copies equals the old sequences bit for bit and the reference, and a planted
layout bug fails the same check.

The tool re-states patch 09's new sequences (``rank_major`` for ag_rs, the unpack into
``output`` for a2a); ``test_dcp_forward.py`` runs the baked layer's own code. Here the point
is that the GPU check itself can fail.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.needs("triton")]

REPO = Path(__file__).resolve().parents[3]


def run_check(tree: Path, plant: str = "") -> subprocess.CompletedProcess:
    script = textwrap.dedent(
        f"""
        import json, sys, torch
        sys.path.insert(0, {str(REPO)!r})
        from lab.gpu import combine_copies as t
        from pathlib import Path
        ns = t.gtk.load(Path({str(tree)!r})).dcp
        {plant}
        print(json.dumps(t.check(ns, torch.device("cpu"), 2, 3, seed=0)))
        """
    )
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    return subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=600
    )


def test_new_combine_equals_old_and_reference(cpu_bake):
    proc = run_check(cpu_bake.tree)
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = proc.stdout.strip().splitlines()[-1]
    assert '"ok": true' in res and '"a2a_eq_old": true' in res and '"ag_rs_eq_old": true' in res


def test_a_token_major_reduce_scatter_fails(cpu_bake):
    plant = "t.rank_major = lambda out, w: out.reshape(-1, out.shape[1] // w, out.shape[2])"
    proc = run_check(cpu_bake.tree, plant)
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = proc.stdout.strip().splitlines()[-1]
    assert '"ok": false' in res and '"ag_rs_eq_old": false' in res, res
