"""Refresh: turn edits made in a baked tree back into the series' per-file patches.

Every file of the package that differs from the pristine base gets the
canonical diff (``render_file_diff``). A file the series already patches keeps
its patch's number and name; a new file gets the next free number (or
``--at NN``); a patch whose file no longer differs is removed. Stray files
(``*.orig``, ``*.rej``, editor swap and backup files) never become patches, and
a tree baked from another series than the one on disk is refused, so a hand
edit of a patch is never overwritten. ``patches_out_of_date`` is the "patches
are up to date" lint: every patch must apply cleanly in order and be
byte-identical to what refresh would write. ``record`` is ``refresh --no-bake``'s
BAKED.json: the tree is then a bake of the written series, proven and recorded
without re-baking.
"""

from __future__ import annotations

import filecmp
import fnmatch
import os
import re
import stat
import subprocess
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

import tomlkit

from bakery.bake import manifest
from bakery.bake.bake import patched_version, restamp
from bakery.bake.fetch import cache_dir, fetch
from bakery.bake.pristine import own_pristine, pristine
from bakery.bake.wheel import patched_wheel_name, read_wheel
from bakery.errors import BakeryError, HunkFailed, SeriesError, UnsafePathError
from bakery.series import apply
from bakery.series.diff import render_file_diff
from bakery.series.series import HEADER, Series
from bakery.tree import read_bounded, read_file, replace_files

__all__ = [
    "ChangeAction",
    "PatchChange",
    "is_stray",
    "differing_files",
    "series_changes_since_bake",
    "remembered_entries",
    "plan_refresh",
    "write_refresh",
    "record",
    "patches_out_of_date",
]

# Left behind by GNU patch (.orig, .rej), vim (.swp...), emacs (~, #x#, .#x) and
# by hand (.bak): never part of the series, whatever the tree they sit in.
_STRAY = ("*.orig", "*.rej", "*~", "*.bak", ".*.sw?", "#*#", ".#*")


def is_stray(rel: str) -> bool:
    name = rel.rsplit("/", 1)[-1]
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in _STRAY)


class ChangeAction(StrEnum):
    """What refresh does to one patch file."""

    ADD = "add"  # a newly edited file gets a new patch
    UPDATE = "update"  # the patch's bytes change
    REMOVE = "remove"  # its files no longer differ from the base


@dataclass(frozen=True)
class PatchChange:
    file: str  # patch file name
    paths: tuple[str, ...]  # tree-relative files it covers
    action: ChangeAction
    data: bytes | None  # the new patch bytes (None for remove)


def _files(root: Path) -> dict[str, Path]:
    """Every entry that is not a folder, by relative path (a symlink to a folder too: it
    is listed, never walked into)."""
    found = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        links = [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]
        for name in filenames + links:
            full = Path(dirpath) / name
            found[full.relative_to(root).as_posix()] = full
    return found


# A name a patch file and series.toml can carry: no control characters, no backslash.
_UNSAFE_NAME = re.compile(r"[\x00-\x1f\x7f\\]")


def _folders(files: dict[str, Path]) -> set[str]:
    """Every folder above a listed file (a set: a scan of all files per file is 11 M
    string tests on vLLM's 3,300 files)."""
    out: set[str] = set()
    for rel in files:
        parts = rel.split("/")[:-1]
        out.update("/".join(parts[: i + 1]) for i in range(len(parts)))
    return out


def _unpatchable(rel: str, path: Path, left_folders: set[str]) -> str | None:
    """Why the baked tree's entry at ``rel`` cannot become a patch (None if it can)."""
    if _UNSAFE_NAME.search(rel):
        return f"{rel!r}: a name with a control character or a backslash"
    if rel in left_folders:
        return f"{rel!r}: a folder of the base is a file here"
    mode = os.lstat(path).st_mode
    if stat.S_ISLNK(mode):
        return f"{rel!r}: a symlink (refresh never reads through one)"
    if not stat.S_ISREG(mode):
        return f"{rel!r}: not a regular file"
    return None


def _binary_head(path: Path) -> bool:
    """A NUL byte in the first 8000 bytes, as git and GNU diff tell binary files: a
    compiled module is refused at once, never split into lines and diffed."""
    with open(path, "rb") as handle:
        return b"\0" in handle.read(8000)


def differing_files(
    pristine: Path, baked: Path, strays: list[str] | None = None
) -> dict[str, tuple[bytes | None, bytes | None]]:
    """Package-relative path -> (pristine bytes, baked bytes) for every file that differs.

    New stray files are left out (and listed in ``strays`` when given)."""
    left, right = _files(pristine), _files(baked)
    left_folders, right_folders = _folders(left), _folders(right)
    # filecmp caches verdicts by path, size and mtime: without this, a same-size edit
    # within one mtime tick of an earlier call (status, then refresh) would be missed.
    filecmp.clear_cache()
    out = {}
    refused = []
    for rel in sorted(set(left) | set(right)):
        if "__pycache__" in rel.split("/"):
            continue  # bytecode written by imports of the baked tree
        if rel not in left and is_stray(rel):
            if strays is not None:
                strays.append(rel)
            continue
        a, b = left.get(rel), right.get(rel)
        if b is None and rel in right_folders:
            refused.append(f"{rel!r}: a file of the base is a folder here")
            continue
        why = _unpatchable(rel, b, left_folders) if b is not None else None
        if why:
            refused.append(why)
            continue
        if a and b:
            sa, sb = a.stat(), b.stat()
            # Hard links from the pristine cache are the same inode: unchanged by construction.
            if (sa.st_ino, sa.st_dev) == (sb.st_ino, sb.st_dev):
                continue
            if filecmp.cmp(a, b, shallow=False):
                continue
        if any(_binary_head(side) for side in (a, b) if side):
            refused.append(f"{rel!r}: a binary file (a NUL byte), which no text diff carries")
            continue
        old, new = (a.read_bytes() if a else None, read_bounded(b) if b else None)
        if b"\0" in (old or b"") or b"\0" in (new or b""):
            refused.append(f"{rel!r}: a binary file (a NUL byte), which no text diff carries")
            continue
        out[rel] = (old, new)
    if refused:
        raise UnsafePathError(
            f"{baked}: {len(refused)} entr{'y' if len(refused) == 1 else 'ies'} no patch can "
            "carry: " + "; ".join(refused[:8]) + ("; ..." if len(refused) > 8 else ""),
            hint="put the base's regular text file back in each place (a binary file is "
            "the base's or a new build's, never a patch's), or remove the entry, then refresh "
            "again",
        )
    return out


def series_changes_since_bake(series: Series, baked: dict) -> list[str]:
    """Why the series on disk is not the one ``baked`` (a BAKED.json) was made from."""
    if baked["series"]["sha256"] == series.sha256:
        return []
    then = {p["file"]: p["sha256"] for p in baked.get("patches", [])}
    now = {p.name: p.sha256 for p in series.patches}
    changed = [f"changed: {f}" for f in sorted(set(then) & set(now)) if then[f] != now[f]]
    changed += [f"added: {f}" for f in sorted(set(now) - set(then))]
    changed += [f"removed: {f}" for f in sorted(set(then) - set(now))]
    return changed or ["changed: the series' apply settings (renames, strip, fuzz)"]


def remembered_entries(series: Series) -> dict[str, dict]:
    """Patch file -> its series.toml table as last committed (git HEAD), so a patch
    re-created under the same name gets its stage and summary back; {} outside git
    (or where git is not installed: a tarball checkout, a slim image)."""
    try:
        proc = subprocess.run(
            ["git", "-C", str(series.root), "show", "HEAD:./series.toml"],
            capture_output=True,
            text=True,
        )
    except OSError:
        return {}
    if proc.returncode != 0:
        return {}
    try:
        tables = tomlkit.parse(proc.stdout).get("patches", [])
    except tomlkit.exceptions.ParseError:
        return {}
    return {str(t["file"]): dict(t) for t in tables if "file" in t}


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
            changes.append(PatchChange(file, paths, ChangeAction.REMOVE, None))
        elif data != (series.root / file).read_bytes():
            changes.append(PatchChange(file, paths, ChangeAction.UPDATE, data))
    numbers = {e.number for e in series.entries}
    next_number = at if at is not None else max(numbers, default=0) + 1
    for path in sorted(p for p in differing if p not in owner):
        if next_number in numbers:
            raise SeriesError(f"patch number already taken (choose another --at): {next_number}")
        name = _patch_name(next_number, path)
        changes.append(PatchChange(name, (path,), ChangeAction.ADD, _render((path,), differing)))
        numbers.add(next_number)
        next_number += 1
    return changes


def write_refresh(
    series: Series,
    changes: list[PatchChange],
    stage: int | None = None,
    summary: str | None = None,
    remembered: dict[str, dict] | None = None,
) -> None:
    """Write patch files and series.toml (comments kept) for ``changes``.

    A new patch gets ``stage``/``summary`` when given, else those ``remembered``
    for its file name, else stage 1 and a summary naming its file."""
    toml_path = series.root / "series.toml"
    doc = tomlkit.parse(toml_path.read_text())
    patches = doc.setdefault("patches", tomlkit.aot())
    writes: dict[str, bytes | None] = {}
    for change in changes:
        writes[change.file] = change.data
        if change.action is ChangeAction.REMOVE:
            index = next(i for i, t in enumerate(patches) if t["file"] == change.file)
            del patches[index]
        elif change.action is ChangeAction.ADD:
            old = (remembered or {}).get(change.file, {})
            default_summary = f"refreshed from the baked tree: {change.paths[0]}"
            table = tomlkit.table()
            table.update(
                {
                    "file": change.file,
                    "stage": stage if stage is not None else int(old.get("stage", 1)),
                    "summary": summary or str(old.get("summary") or default_summary),
                    # The header comes back with the name (quilt keeps it with the patch).
                    **{k: str(old[k]) for k in HEADER if old.get(k)},
                }
            )
            patches.append(table)
    writes["series.toml"] = _spaced(tomlkit.dumps(doc)).encode()
    replace_files(series.root, writes)  # all or nothing: a fault or a kill leaves the old


def _spaced(text: str) -> str:
    """A blank line before each ``[[patches]]`` that follows a value line (tomlkit
    appends tables flush against the one before)."""
    lines = text.split("\n")
    out: list[str] = []
    for line in lines:
        if (
            line.strip() == "[[patches]]"
            and out
            and out[-1].strip()
            and not out[-1].startswith("#")
        ):
            out.append("")
        out.append(line)
    return "\n".join(out)


def record(series: Series, base_key: str, tree: Path, cache: Path | None = None) -> None:
    """Rewrite ``tree``'s BAKED.json as a bake of ``series`` writes it, without re-baking.

    After ``write_refresh`` the tree is the series applied to the pristine base, by
    construction (the patches were made from it): this proves it (the series is applied
    to the pristine in memory, and every file it touches must be the tree's, byte for
    byte) before recording it, so the next refresh sees a bake of the series on disk.
    The patched wheel is not built; `bakery bake` builds it."""
    pin = series.base(base_key)
    cache = cache or cache_dir()
    base = read_wheel(fetch(pin, cache=cache))
    package = own_pristine(pristine(base, pin.sha256, cache), tree.parent) / series.package
    result = apply.plan(package, series.patches, max_fuzz=series.max_fuzz)
    edited = differing_files(package, tree / series.package)
    unlike = sorted(
        {p for p in edited if p not in result.after}
        | {p for p, data in result.after.items() if read_file(tree / series.package, p) != data}
    )
    if unlike:
        raise BakeryError(f"the written series does not reproduce the tree (a bug): {unlike!r}")
    wheel_name = patched_wheel_name(base, patched_version(series, pin.version))
    manifest.write(tree / manifest.MANIFEST, manifest.build(series, pin, result, wheel_name))
    restamp(tree)  # the tree as recorded: later edits (or appends through links) show


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


def patches_out_of_date(series: Series, pristine_package: Path) -> list[str]:
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
        if outcome.status is apply.ApplyStatus.ALREADY_APPLIED:
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
