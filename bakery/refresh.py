"""Refresh: turn edits made in a baked tree back into the series' per-file patches.

Every file of the package that differs from the pristine base gets the
canonical diff (``render_file_diff``). A file the series already patches keeps
its patch's number and name; a new file gets the next free number (or
``--at NN``); a patch whose file no longer differs is removed. ``check`` is
the "patches are up to date" lint: every patch must apply cleanly in order
and be byte-identical to what refresh would write.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import tomlkit

from . import apply
from .diff import render_file_diff
from .errors import HunkFailed, SeriesError
from .series import Series
from .tree import write_atomic

__all__ = ["PatchChange", "differing_files", "plan_refresh", "write_refresh", "check"]


@dataclass(frozen=True)
class PatchChange:
    file: str  # patch file name
    paths: tuple[str, ...]  # tree-relative files it covers
    action: str  # "add", "update", "remove"
    data: bytes | None  # the new patch bytes (None for remove)


def _files(root: Path) -> dict[str, Path]:
    found = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in filenames:
            full = Path(dirpath) / name
            found[full.relative_to(root).as_posix()] = full
    return found


def differing_files(pristine: Path, baked: Path) -> dict[str, tuple[bytes | None, bytes | None]]:
    """Package-relative path -> (pristine bytes, baked bytes) for every file that differs."""
    left, right = _files(pristine), _files(baked)
    out = {}
    for rel in sorted(set(left) | set(right)):
        if "__pycache__" in rel.split("/"):
            continue  # bytecode written by imports of the baked tree
        a, b = left.get(rel), right.get(rel)
        if a and b:
            sa, sb = a.stat(), b.stat()
            # Hard links from the pristine cache are the same inode: unchanged by construction.
            if (sa.st_ino, sa.st_dev) == (sb.st_ino, sb.st_dev):
                continue
            if sa.st_size == sb.st_size and a.read_bytes() == b.read_bytes():
                continue
        out[rel] = (a.read_bytes() if a else None, b.read_bytes() if b else None)
    return out


def _patch_name(number: int, path: str) -> str:
    return f"{number:02d}-{path.replace('/', '_')}.diff"


def _render(
    paths: tuple[str, ...], contents: dict[str, tuple[bytes | None, bytes | None]]
) -> bytes:
    return b"".join(render_file_diff(p, *contents[p]) for p in paths if p in contents)


def plan_refresh(
    series: Series,
    differing: dict[str, tuple[bytes | None, bytes | None]],
    at: int | None = None,
) -> list[PatchChange]:
    """What refresh would write; changes whose bytes are already on disk are left out."""
    owner: dict[str, str] = {}
    covers: dict[str, tuple[str, ...]] = {}
    for entry, patch in zip(series.entries, series.patches, strict=True):
        covers[entry.file] = patch.paths
        for path in patch.paths:
            owner.setdefault(path, entry.file)
    changes = []
    for file, paths in covers.items():
        data = _render(paths, differing)
        if not data:
            changes.append(PatchChange(file, paths, "remove", None))
        elif data != (series.root / file).read_bytes():
            changes.append(PatchChange(file, paths, "update", data))
    numbers = {e.number for e in series.entries}
    next_number = at if at is not None else max(numbers, default=0) + 1
    for path in sorted(p for p in differing if p not in owner):
        if next_number in numbers:
            raise SeriesError(f"patch number already taken (choose another --at): {next_number}")
        changes.append(
            PatchChange(_patch_name(next_number, path), (path,), "add", _render((path,), differing))
        )
        numbers.add(next_number)
        next_number += 1
    return changes


def write_refresh(series: Series, changes: list[PatchChange], stage: int, summary: str) -> None:
    """Write patch files and series.toml (comments kept) for ``changes``."""
    toml_path = series.root / "series.toml"
    doc = tomlkit.parse(toml_path.read_text())
    patches = doc.setdefault("patches", tomlkit.aot())
    for change in changes:
        target = series.root / change.file
        if change.action == "remove":
            target.unlink()
            index = next(i for i, t in enumerate(patches) if t["file"] == change.file)
            del patches[index]
            continue
        write_atomic(target, change.data)
        if change.action == "add":
            table = tomlkit.table()
            table.update(
                {
                    "file": change.file,
                    "stage": stage,
                    "summary": summary or f"refreshed from the baked tree: {change.paths[0]}",
                }
            )
            patches.append(table)
    write_atomic(toml_path, tomlkit.dumps(doc).encode())


def _placement_problems(outcome: apply.PatchOutcome) -> list[str]:
    problems = []
    for result in outcome.files:
        for p in result.placements:
            if p.offset or p.fuzz:
                problems.append(
                    f"{outcome.patch.name}: not clean: hunk #{p.hunk} of {result.path} needs "
                    f"offset {p.offset:+d}, fuzz {p.fuzz}"
                )
    return problems


# Enough fuzz to tell "needs fuzz" apart from "does not apply" in reports.
_REPORT_FUZZ = 3


def _applies(package: Path, patches: list, max_fuzz: int) -> bool:
    try:
        apply.plan(package, patches, max_fuzz=max_fuzz)
    except HunkFailed:
        return False
    return True


def check(series: Series, pristine_package: Path) -> list[str]:
    """Problems that make the series' patches out of date ([] when up to date)."""
    patches = list(series.patches)
    problems: list[str] = []
    for i, patch in enumerate(patches):
        if _applies(pristine_package, patches[: i + 1], 0):
            continue
        if _applies(pristine_package, patches[:i] + patches[i + 1 :] + [patch], 0):
            return [f"{patch.name}: out of order: it applies only after a later patch"]
        if not _applies(pristine_package, patches[: i + 1], _REPORT_FUZZ):
            return [f"{patch.name}: does not apply, even with fuzz {_REPORT_FUZZ}"]
    result = apply.plan(pristine_package, patches, max_fuzz=_REPORT_FUZZ)
    for outcome in result.outcomes:
        if outcome.status == apply.ALREADY_APPLIED:
            problems.append(f"{outcome.patch.name}: already in the base (upstream); remove it")
        problems += _placement_problems(outcome)
    seen: dict[str, str] = {}
    for patch in patches:
        for path in patch.paths:
            if path in seen:
                problems.append(f"{patch.name}: touches {path}, which {seen[path]} touches too")
            seen[path] = patch.name
    contents = {p: (result.before[p], result.after[p]) for p in result.after}
    for entry, patch in zip(series.entries, patches, strict=True):
        if _render(patch.paths, contents) != series.patch_bytes(entry):
            problems.append(f"{entry.file}: stale: not byte-identical to what refresh writes")
    return problems
