"""Planted-bug copies of the series: one '+' line of one patch rewritten, then baked.

A DCP test proves it can fail by running its checks on such a bake of the real series
(tests/lab/dcp/test_dcp_sensitivity.py, test_dcp_forward.py, test_dcp_candidate_patched.py).
"""

from __future__ import annotations

import difflib
import os
import shutil
from pathlib import Path

import tomlkit

from bakery.bake import pristine
from bakery.bake.bake import bake
from bakery.series.series import Series, load_series

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


def plant_upstream(series_dir: Path, cache: Path, path: str, old: str, new: str) -> None:
    """Add to the series at ``series_dir`` one more patch, for ``path`` (relative to the
    vllm/ package, a file no patch touches): its one line holding ``old`` rewritten as
    ``new`` (several lines, each indented as that line). For bugs the matrix must see in
    upstream code the series serves through (a draft's KV write, the rollback)."""
    series = load_series(series_dir)
    assert all(path not in p.paths for p in series.patches), f"{path}: the series' own file"
    source = pristine.unpacked(series.base("cpu"), cache) / "vllm" / path
    lines = source.read_text().splitlines(keepends=True)
    hits = [i for i, ln in enumerate(lines) if old in ln]
    assert len(hits) == 1, f"{old!r} is on {len(hits)} lines of {path}"
    indent = lines[hits[0]][: len(lines[hits[0]]) - len(lines[hits[0]].lstrip())]
    planted = [indent + ln + "\n" for ln in new.splitlines()]
    edited = lines[: hits[0]] + planted + lines[hits[0] + 1 :]
    name = f"99-planted-{path.replace('/', '_')}.diff"
    diff = difflib.unified_diff(lines, edited, f"baked-ours/{path}", f"baked/{path}", n=3)
    (series_dir / name).write_text("".join(diff))
    doc = tomlkit.parse((series_dir / "series.toml").read_text())
    entry = tomlkit.table()
    entry.update({"file": name, "stage": 5, "summary": f"planted: {path}"})
    doc["patches"].append(entry)
    (series_dir / "series.toml").write_text(tomlkit.dumps(doc))


def bake_planted(
    tmp: Path,
    cache: Path,
    patch: str,
    old: str | None,
    new: str | None,
    after: str | None = None,
    upstream: tuple[str, str, str] | None = None,
) -> Path:
    """The cpu bake of a copy of the series (with ``old`` planted as ``new``, if given:
    the first such '+' line after ``after``, when given; ``upstream``: ``plant_upstream``'s
    path, old and new): the tree alone, no wheel."""
    series_dir = tmp / "dcp2"
    shutil.copytree(REPO / "patches" / "dcp2", series_dir)
    if old is not None and new is not None:
        plant(series_dir, patch, old, new, after)
    if upstream is not None:
        plant_upstream(series_dir, cache, *upstream)
    series = load_series(series_dir)
    _link_pristine(tmp / "build", series, cache)
    return bake(series, "cpu", build=tmp / "build", cache=cache, write_wheel=False).tree


def _link_pristine(build: Path, series: Series, cache: Path) -> None:
    """Give ``build`` its own pristine copy as hard links into the cache's, with its stamp:
    a module's dozen planted bakes then share one 0.6 GB tree instead of a copy each (a CI
    machine's disk filled with them). No planted bake or driver edits a pristine file."""
    pin = series.base("cpu")
    source = pristine.unpacked(pin, cache)
    own = pristine.own_copy(build, pin.sha256)
    own.parent.mkdir(parents=True)
    shutil.copytree(source, own, copy_function=_link_or_copy)
    for beside in (pristine._stamp_path, pristine._errata_path):
        if beside(source).is_file():
            shutil.copyfile(beside(source), beside(own))


def _link_or_copy(src: str, dst: str) -> None:
    """A hard link, or a copy where the cache lies on another filesystem."""
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)
