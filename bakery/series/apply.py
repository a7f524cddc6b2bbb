"""Apply an ordered list of patches to a tree: plan in memory, then write.

``plan`` reads each touched file once, runs every hunk of every patch against
an in-memory overlay and raises on the first hunk that cannot be placed, so a
failing series writes nothing. ``write`` then stages every new file beside its
target, swaps them in, and on any fault puts every file back: all or nothing.
A patch whose reverse applies cleanly is reported as already applied instead
of as a conflict.
"""

from __future__ import annotations

import os
import shutil
import stat
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from bakery.errors import HunkFailed, UnreadableInput, UnsafePathError, WriteFailed
from bakery.series.diff import Patch
from bakery.series.engine import FileResult, apply_file_patch
from bakery.tree import inside, stage_beside

__all__ = ["ApplyStatus", "PatchOutcome", "ApplyPlan", "plan", "write"]


class ApplyStatus(StrEnum):
    """What became of one patch (the words `bakery apply --json` and BAKED.json print)."""

    APPLIED = "applied"
    ALREADY_APPLIED = "already-applied"  # its reverse applies cleanly: skipped


@dataclass(frozen=True)
class PatchOutcome:
    patch: Patch
    status: ApplyStatus
    files: tuple[FileResult, ...]  # empty when already applied


@dataclass(frozen=True)
class ApplyPlan:
    tree: Path
    outcomes: tuple[PatchOutcome, ...]
    before: dict[str, bytes | None]  # each touched file as found
    after: dict[str, bytes | None]  # each touched file once the series is applied
    modes: dict[str, int]

    @property
    def changed(self) -> list[str]:
        return sorted(p for p in self.after if self.after[p] != self.before[p])


def read_target(tree: Path, path: str) -> bytes | None:
    """A file a patch names: None when absent; a symlink or a non-regular file
    (FIFO, device) is refused as GNU patch refuses it, never followed or replaced."""
    target = inside(tree, path)
    try:
        info = os.lstat(target)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise UnreadableInput(f"cannot read target ({exc.strerror}): {path!r}") from None
    if stat.S_ISLNK(info.st_mode):
        raise UnsafePathError(f"target is a symlink; refusing to patch it: {path!r}")
    if stat.S_ISDIR(info.st_mode):
        raise UnsafePathError(f"path is a directory, not a file: {path!r}")
    if not stat.S_ISREG(info.st_mode):
        raise UnsafePathError(f"target is not a regular file; refusing to patch it: {path!r}")
    try:
        return target.read_bytes()
    except OSError as exc:
        raise UnreadableInput(f"cannot read target ({exc.strerror}): {path!r}") from None


def _run(patch: Patch, overlay: dict[str, bytes | None], read, max_fuzz: int):
    results = []
    staged = dict(overlay)
    for file_patch in patch.files:
        path = file_patch.path
        if path not in staged:
            staged[path] = read(path)
        result = apply_file_patch(patch.name, file_patch, staged[path], max_fuzz)
        staged[path] = result.after
        results.append(result)
    return tuple(results), staged


def plan(
    tree: Path,
    patches: Sequence[Patch],
    *,
    max_fuzz: int = 0,
    reverse: bool = False,
    files: Mapping[str, bytes | None] | None = None,
) -> ApplyPlan:
    """Place every hunk of ``patches`` (in order) against ``tree``; write nothing.

    ``files`` (path -> bytes) stands in for reading the tree, e.g. members read
    straight from a wheel."""
    tree = Path(tree)
    for patch in patches:
        for path in patch.paths:
            inside(tree, path)  # refuse unsafe targets before reading anything

    def read(path: str) -> bytes | None:
        return files.get(path) if files is not None else read_target(tree, path)

    ordered = [p.reversed() for p in reversed(patches)] if reverse else list(patches)
    overlay: dict[str, bytes | None] = {}
    before: dict[str, bytes | None] = {}
    outcomes = []
    modes: dict[str, int] = {}
    for patch in ordered:
        for path in patch.paths:
            if path not in before:
                before[path] = overlay[path] = read(path)
        try:
            results, overlay = _run(patch, overlay, read, max_fuzz)
        except HunkFailed as failure:
            try:
                _run(patch.reversed(), overlay, read, max_fuzz)
            except HunkFailed:
                raise failure from None
            outcomes.append(PatchOutcome(patch, ApplyStatus.ALREADY_APPLIED, ()))
            continue
        modes.update({r.path: r.mode for r in results if r.mode is not None})
        outcomes.append(PatchOutcome(patch, ApplyStatus.APPLIED, results))
    return ApplyPlan(tree, tuple(outcomes), before, dict(overlay), modes)


def _keep_aside(target: Path) -> Path:
    """A second name for the old file (same inode), so a rename restores it exactly."""
    kept = target.with_name(f".{target.name}.{uuid.uuid4().hex[:12]}.old")
    try:
        os.link(target, kept)
    except OSError:  # a filesystem without hard links
        shutil.copy2(target, kept)
    return kept


def _make_parents(folder: Path, root: Path) -> list[Path]:
    """Create ``folder`` and its missing parents; returns those created, outermost first."""
    missing = []
    while not folder.exists() and folder != root:
        missing.append(folder)
        folder = folder.parent
    for made in reversed(missing):
        made.mkdir()
    return missing[::-1]


def write(result: ApplyPlan) -> list[str]:
    """Commit a plan to its tree, all or nothing; returns the paths that changed.

    Every new file is staged beside its target and every old one kept under a
    second name before the first rename, so a fault at any step (a read-only
    folder, a full disk, an interrupt) renames each file back as it was."""
    changed = result.changed
    targets = {path: inside(result.tree, path) for path in changed}
    staged: dict[str, Path] = {}
    kept: dict[str, Path] = {}
    made: list[Path] = []
    swapped: list[str] = []
    try:
        for path, target in targets.items():
            if result.before[path] is not None:
                kept[path] = _keep_aside(target)
            content = result.after[path]
            if content is not None:
                made += _make_parents(target.parent, Path(result.tree))
                staged[path] = stage_beside(target, content, result.modes.get(path), ".new")
        for path, target in targets.items():
            if path in staged:
                os.replace(staged[path], target)
                del staged[path]
            else:
                os.unlink(target)
            swapped.append(path)
    except BaseException as exc:
        for path in reversed(swapped):
            if path in kept:
                os.replace(kept[path], targets[path])
                del kept[path]
            else:
                os.unlink(targets[path])
        for leftover in [*staged.values(), *kept.values()]:
            leftover.unlink(missing_ok=True)
        for folder in reversed(made):
            folder.rmdir()
        if isinstance(exc, OSError):
            raise WriteFailed(
                f"cannot write the patched tree ({exc.strerror or exc}); "
                f"every file was put back: {str(exc.filename or result.tree)!r}",
                hint="fix the permissions or free disk space, then run it again",
            ) from None
        raise
    for old in kept.values():
        old.unlink()
    return changed
