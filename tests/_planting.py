"""Planted-bug copies of the series: one '+' line of one patch rewritten, then baked.

A DCP test proves it can fail by running its checks on such a bake of the real series
(tests/test_dcp_sensitivity.py, test_dcp_forward.py, test_dcp_candidate_patched.py).
"""

from __future__ import annotations

import shutil
from pathlib import Path

from bakery.bake.bake import bake
from bakery.series.series import load_series

REPO = Path(__file__).resolve().parents[1]


def plant(series_dir: Path, patch: str, old: str, new: str) -> None:
    """Rewrite the one '+' line of ``patch`` that reads ``old`` (it must be unique)."""
    diff = series_dir / patch
    lines = diff.read_text().splitlines(keepends=True)
    hits = [i for i, ln in enumerate(lines) if ln.startswith("+") and ln.strip("+ \n") == old]
    assert len(hits) == 1, f"{old!r} is on {len(hits)} '+' lines of {patch}"
    lines[hits[0]] = lines[hits[0]].replace(old, new)
    diff.write_text("".join(lines))


def bake_planted(tmp: Path, cache: Path, patch: str, old: str | None, new: str | None) -> Path:
    """The cpu bake of a copy of the series (with ``old`` planted as ``new``, if given)."""
    series_dir = tmp / "dcp2"
    shutil.copytree(REPO / "patches" / "dcp2", series_dir)
    if old is not None and new is not None:
        plant(series_dir, patch, old, new)
    return bake(load_series(series_dir), "cpu", build=tmp / "build", cache=cache).tree
