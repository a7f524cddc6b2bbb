"""Apply an ordered list of patches to a tree: plan in memory, then write.

``plan`` reads each touched file once, runs every hunk of every patch against
an in-memory overlay and raises on the first hunk that cannot be placed, so a
failing series writes nothing. ``write`` then commits the overlay file by file
(each file atomically). A patch whose reverse applies cleanly is reported as
already applied instead of as a conflict.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from .diff import Patch
from .engine import FileResult, apply_file_patch
from .errors import HunkFailed
from .tree import inside, read_file, write_atomic

__all__ = ["PatchOutcome", "Plan", "plan", "write", "APPLIED", "ALREADY_APPLIED"]

APPLIED = "applied"
ALREADY_APPLIED = "already-applied"


@dataclass(frozen=True)
class PatchOutcome:
    patch: Patch
    status: str  # APPLIED or ALREADY_APPLIED
    files: tuple[FileResult, ...]


@dataclass(frozen=True)
class Plan:
    tree: Path
    outcomes: tuple[PatchOutcome, ...]
    before: dict[str, bytes | None]  # each touched file as found
    after: dict[str, bytes | None]  # each touched file once the series is applied
    modes: dict[str, int]

    @property
    def changed(self) -> list[str]:
        return sorted(p for p in self.after if self.after[p] != self.before[p])


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
) -> Plan:
    """Place every hunk of ``patches`` (in order) against ``tree``; write nothing.

    ``files`` (path -> bytes) stands in for reading the tree, e.g. members read
    straight from a wheel."""
    tree = Path(tree)
    for patch in patches:
        for path in patch.paths:
            inside(tree, path)  # refuse unsafe targets before reading anything

    def read(path: str) -> bytes | None:
        return files.get(path) if files is not None else read_file(tree, path)

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
            outcomes.append(PatchOutcome(patch, ALREADY_APPLIED, ()))
            continue
        modes.update({r.path: r.mode for r in results if r.mode is not None})
        outcomes.append(PatchOutcome(patch, APPLIED, results))
    return Plan(tree, tuple(outcomes), before, dict(overlay), modes)


def write(result: Plan) -> list[str]:
    """Commit a plan to its tree; returns the paths that changed."""
    changed = result.changed
    for path in changed:
        target = inside(result.tree, path)
        content = result.after[path]
        if content is None:
            target.unlink()
        else:
            write_atomic(target, content, result.modes.get(path))
    return changed
