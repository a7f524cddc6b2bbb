"""Planted-bug copies of the series: one '+' line of one patch rewritten, then baked.

A DCP test proves it can fail by running its checks on such a bake of the real series
(tests/dcp/test_dcp_sensitivity.py, test_dcp_forward.py, test_dcp_candidate_patched.py).
"""

from __future__ import annotations

import shutil
from pathlib import Path

from bakery.bake.bake import bake
from bakery.series.series import load_series

REPO = Path(__file__).resolve().parents[1]


def plant(series_dir: Path, patch: str, old: str, new: str, after: str | None = None) -> None:
    """Rewrite the one '+' line of ``patch`` that reads ``old`` (it must be unique, or
    unique among the lines after the first '+' line holding ``after``)."""
    diff = series_dir / patch
    lines = diff.read_text().splitlines(keepends=True)
    first = 0
    if after is not None:
        first = next(i for i, ln in enumerate(lines) if ln.startswith("+") and after in ln)
    hits = [
        i
        for i, ln in enumerate(lines)
        if i >= first and ln.startswith("+") and ln.strip("+ \n") == old
    ]
    hits = hits[:1] if after is not None else hits
    assert len(hits) == 1, f"{old!r} is on {len(hits)} '+' lines of {patch}"
    lines[hits[0]] = lines[hits[0]].replace(old, new)
    diff.write_text("".join(lines))


def bake_planted(
    tmp: Path,
    cache: Path,
    patch: str,
    old: str | None,
    new: str | None,
    after: str | None = None,
) -> Path:
    """The cpu bake of a copy of the series (with ``old`` planted as ``new``, if given:
    the first such '+' line after ``after``, when given)."""
    series_dir = tmp / "dcp2"
    shutil.copytree(REPO / "patches" / "dcp2", series_dir)
    if old is not None and new is not None:
        plant(series_dir, patch, old, new, after)
    return bake(load_series(series_dir), "cpu", build=tmp / "build", cache=cache).tree
