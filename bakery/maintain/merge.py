"""Three-way merges of one file (``git merge-file``), and the series forced onto a release.

``merge_file`` is the rebase loop's merge: the old pristine file is the base, the
release's file and the old patched file the two sides; conflicts get zdiff3 markers,
or, with ``union``, both sides' lines and no markers. ``force`` places the series on a
release's files as far as it goes (each patch with fuzz; where a hunk does not place,
the union merge, or the hunks that place), so that linkcheck can read code no patch
applier produces: what the series would run on the release, run-time breaks included.
"""

from __future__ import annotations

import ast
import re
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from bakery import git
from bakery.errors import BakeryError, HunkFailed
from bakery.series.engine import apply_file_patch, place_what_places
from bakery.series.series import Series

__all__ = ["Forced", "merge_file", "force"]

# zdiff3: each conflict also shows the old pristine lines (the base) between the sides.
_STYLE = ("--zdiff3", "--diff3")  # the second for git before 2.35


def merge_file(
    current: bytes, base: bytes, other: bytes, labels: tuple[str, str, str], *, union=False
) -> tuple[bytes, int]:
    """``git merge-file -p``: (merged bytes, number of conflicts; 0 with ``union``)."""
    styles: tuple[str, ...] = ("--union",) if union else _STYLE
    with tempfile.TemporaryDirectory(prefix="bakery-merge-") as tmp:
        paths = []
        for name, data in zip(("current", "base", "other"), (current, base, other), strict=True):
            path = Path(tmp) / name
            path.write_bytes(data)
            paths.append(str(path))
        args = [arg for label in labels for arg in ("-L", label)]
        for style in styles:
            try:
                proc = git.run(["merge-file", "-p", style, *args, *paths])
            except FileNotFoundError:
                raise BakeryError(
                    "git is needed for 3-way merges and is not installed",
                    hint="install git, or use `bakery rebase --to ...` (report only)",
                ) from None
            if proc.returncode != 129:  # 129: git does not know the option
                break
    if proc.returncode < 0 or proc.returncode > 127:
        raise BakeryError(f"git merge-file failed: {proc.stderr.decode(errors='replace')}")
    return proc.stdout, proc.returncode


@dataclass(frozen=True)
class Forced:
    """A patch file that did not place, as ``force`` put it on the release: ``how`` is
    "merged" (union merge) or "partly placed" (its hunks ``skipped`` left out)."""

    patch: str
    path: str
    how: str
    skipped: tuple[int, ...] = ()
    unbound: frozenset[str] = frozenset()  # names only the skipped hunks' lines bind


def force(
    series: Series,
    old: Mapping[str, bytes | None],
    new: Mapping[str, bytes | None],
    release: str,
    max_fuzz: int,
) -> tuple[dict[str, bytes | None], list[Forced]]:
    """The series forced onto the release's files ``new`` (``old``: the files of the
    series' own base, the merge base), and how each file that did not place got there.

    Such a file is union-merged (the release's lines and the patched lines where they
    clash); a Python file the union leaves unparseable gets GNU patch's result instead,
    the hunks that place applied and the others skipped."""
    old_state, state = dict(old), dict(new)
    forced: list[Forced] = []
    for patch in series.patches:
        for fp in patch.files:
            before_old, before = old_state.get(fp.path), state.get(fp.path)
            old_state[fp.path] = apply_file_patch(patch.name, fp, before_old, series.max_fuzz).after
            try:
                state[fp.path] = apply_file_patch(patch.name, fp, before, max_fuzz).after
                continue
            except HunkFailed:
                pass
            labels = (release, f"{fp.path} before {patch.name}", patch.name)
            merged, _ = merge_file(
                before or b"", before_old or b"", old_state[fp.path] or b"", labels, union=True
            )
            if not fp.path.endswith(".py") or _parses(merged):
                state[fp.path] = merged
                forced.append(Forced(patch.name, fp.path, "merged"))
                continue
            state[fp.path], failures = place_what_places(patch.name, fp, before or b"", max_fuzz)
            skipped = tuple(sorted({f.hunk for f in failures if f.hunk is not None}))
            names = _bound_names(h for h in fp.hunks if h.number in skipped)
            forced.append(Forced(patch.name, fp.path, "partly placed", skipped, names))
    return state, forced


# What an added line binds: an import's names, a def or class, an assignment's target.
_BINDS = re.compile(
    r"^\s*(?:from\s+\S+\s+)?import\s+\(?(?P<names>[\w\s,.]+)|"
    r"^\s*(?:async\s+)?(?:def|class)\s+(?P<def>\w+)|^\s*(?P<target>\w+)\s*(?::[^=]*)?=[^=]"
)


def _bound_names(hunks) -> frozenset[str]:
    names: set[str] = set()
    for hunk in hunks:
        for line in hunk.lines:
            match = _BINDS.match(line.text.decode("utf-8", "replace")) if line.kind == "+" else None
            if match is None:
                continue
            if match["names"]:
                parts = (n.split(" as ")[-1].strip() for n in match["names"].split(","))
                names.update(n.split(".")[0] for n in parts if n)
            else:
                names.add(match["def"] or match["target"])
    return frozenset(names)


def _parses(data: bytes) -> bool:
    try:
        ast.parse(data)
    except (SyntaxError, ValueError):
        return False
    return True
