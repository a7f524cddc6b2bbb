"""Refresh: turn edits made in a baked tree back into the series' per-file patches.

``run`` is `bakery refresh`'s whole flow. Every file of the package that differs
from the pristine base (``edits.differing_files``) gets the canonical diff
(``render_file_diff``). A file the series already patches keeps its patch's number
and name; a new file gets the next free number (or ``--at NN``); a patch whose file
no longer differs is removed. A tree baked from another series than the one on disk
is refused, so a hand edit of a patch is never overwritten. After writing, the tree
is re-baked, or with ``--no-bake`` recorded (``record``: the tree is then a bake of
the written series, proven without re-baking). ``check_bases`` is ``refresh --check``:
``patches_out_of_date`` is the "patches are up to date" lint, every patch must apply
cleanly in order and be byte-identical to what refresh would write.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Protocol

import tomlkit

from bakery import git, project
from bakery.bake import manifest
from bakery.bake.bake import bake, patched_version, restamp, tree_dir
from bakery.bake.fetch import cache_dir, fetch
from bakery.bake.pristine import own_pristine, unpacked
from bakery.bake.wheel import patched_wheel_name, read_wheel
from bakery.errors import BakeryError, HunkFailed, SeriesError
from bakery.maintain.edits import check_reproduced, differing_files
from bakery.maintain.rebase_state import refuse_during_rebase
from bakery.series import apply
from bakery.series.diff import NEW_PREFIX, OLD_PREFIX, render_file_diff
from bakery.series.series import HEADER, PatchEntry, Series, committed_headers, load_series
from bakery.tree import replace_files

__all__ = [
    "Say",
    "ChangeAction",
    "PatchChange",
    "run",
    "check_bases",
    "series_changes_since_bake",
    "remembered_entries",
    "plan_refresh",
    "write_refresh",
    "record",
    "patches_out_of_date",
]


class Say(Protocol):
    """Where the flow's lines go (the command line passes ``click.echo``)."""

    def __call__(self, message: str, *, err: bool = False, nl: bool = True) -> None: ...


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


def run(
    series: Series,
    base_key: str,
    build: Path,
    say: Say,
    *,
    at: int | None = None,
    stage: int | None = None,
    summary: str | None = None,
    ask_to_remove: Callable[[list[str]], None] | None = None,
    dry_run: bool = False,
    no_bake: bool = False,
) -> None:
    """`bakery refresh`: write the edits in ``build``'s tree of ``base_key`` as the series'
    patches, then re-bake (``no_bake``: record the tree as the bake) and prove that the
    series reproduces every edit. ``ask_to_remove`` gets the patches about to be removed
    before anything is written and raises to stop; None removes them (``--yes``)."""
    refuse_during_rebase(build)
    tree = tree_dir(build, base_key)
    if not (tree / manifest.MANIFEST).is_file():
        raise BakeryError(
            f"no baked tree to refresh from: {str(tree)!r}",
            hint=f"run `bakery bake --base {base_key}`",
        )
    _refuse_if_series_moved(series, base_key, tree, build, say)
    pristine_pkg = unpacked(series.base(base_key), build=build) / series.package
    strays: list[str] = []
    edited = differing_files(pristine_pkg, tree / series.package, strays)
    for rel in strays:
        say(f"ignored (stray file): {series.package}/{rel}")
    changes = plan_refresh(series, edited, at)
    if not changes:
        say(f"nothing to refresh: every patch matches {tree}")
        return
    if dry_run:
        _show(series, changes, say)
        return
    removed = [c.file for c in changes if c.action == ChangeAction.REMOVE]
    if removed and ask_to_remove is not None:
        ask_to_remove(removed)
    write_refresh(series, changes, stage, summary, remembered_entries(series))
    for change in changes:
        say(f"{change.action}: {change.file}")
    written = load_series(series.root)
    if no_bake:
        record(written, base_key, tree)
        say(f"recorded in {tree / manifest.MANIFEST}: the tree is a bake of the series")
        return
    result = bake(written, base_key, build=build)
    expected = {p: new for p, (_, new) in edited.items()}
    check_reproduced(expected, result.tree / series.package, "re-bake does not reproduce the edits")
    say(f"re-baked {result.tree}: the series reproduces every edit")


def _show(series: Series, changes: list[PatchChange], say: Say) -> None:
    """``--dry-run``: what refresh would write, a diff per patch file."""
    for change in changes:
        say(f"would {change.action}: {change.file}")
        old = (series.root / change.file).read_bytes() if change.action != "add" else None
        diff = _relabel(render_file_diff(change.file, old, change.data), series.root)
        say(diff.decode("utf-8", "replace"), nl=False)
    say("dry run: nothing written")


def _relabel(diff: bytes, root: Path) -> bytes:
    """A diff of a patch file, labelled as that file (committed / as refresh writes it),
    not with the series' own tree labels (baked-ours/, baked/)."""
    lines = diff.split(b"\n", 2)
    if len(lines) < 3:
        return diff
    for i, (side, prefix) in enumerate(((b"--- ", OLD_PREFIX), (b"+++ ", NEW_PREFIX))):
        label = lines[i][len(side) :]
        if label.startswith(prefix.encode()):
            name = label[len(prefix) :].decode("utf-8", "surrogateescape")
            lines[i] = side + str(root / name).encode("utf-8", "surrogateescape")
    return b"\n".join(lines)


def _refuse_if_series_moved(
    series: Series, base_key: str, tree: Path, build: Path, say: Say
) -> None:
    """Refresh rewrites patches from the tree: if the series changed after the bake,
    that would silently undo the change (a hand edit of a patch), so refuse."""
    baked = manifest.load(tree / manifest.MANIFEST)
    moved = series_changes_since_bake(series, baked)
    if baked.base.sha256 != series.base(base_key).sha256:
        moved.append(f"the {base_key} pin: baked from {baked.base.requirement}")
    if moved:
        for line in moved:
            say(line, err=True)
        # The way out names this series and build folder, wherever they are.
        where = "" if series.root == project.root() / project.SERIES else f" --series {series.root}"
        where += "" if build == project.root() / project.BUILD else f" --build {build}"
        raise BakeryError(
            f"the series changed after {tree} was baked: refresh would undo that change",
            hint=f"to keep the series as it is, re-bake (`bakery bake --base {base_key}{where}`, "
            f"which replaces edits in {tree}); to keep the tree's edits, restore the "
            f"series (e.g. `git checkout -- {series.root}`) and refresh again",
        )


def check_bases(series: Series, only: str | None, say: Say) -> None:
    """`refresh --check`: the patches are up to date on every base of the series (a
    rebase that moved one base must not leave another unbakeable), or on ``only``."""
    keys = [only] if only is not None else sorted(series.bases, key=lambda k: (k != "default", k))
    problems = []
    for key in keys:
        found = patches_out_of_date(series, unpacked(series.base(key)) / series.package)
        problems += [f"[bases.{key}] {p}" if len(keys) > 1 else p for p in found]
    for problem in problems:
        say(problem)
    if problems:
        raise BakeryError(
            f"{len(problems)} patch problem(s) on {len(keys)} base(s): the series needs a refresh",
            hint="bake, edit build/baked, then run `bakery refresh` (a base the series cannot "
            "serve any more: remove it from series.toml)",
        )
    say(
        f"ok: {len(series.entries)} patch(es) are clean and up to date on "
        + ", ".join(f"{k} ({series.base(k).requirement})" for k in keys)
    )


def series_changes_since_bake(series: Series, baked: manifest.BakedManifest) -> list[str]:
    """Why the series on disk is not the one ``baked`` (a BAKED.json) was made from."""
    if baked.series.sha256 == series.sha256:
        return []
    then = {p.file: p.sha256 for p in baked.patches}
    now = {p.name: p.sha256 for p in series.patches}
    changed = [f"changed: {f}" for f in sorted(set(then) & set(now)) if then[f] != now[f]]
    changed += [f"added: {f}" for f in sorted(set(now) - set(then))]
    changed += [f"removed: {f}" for f in sorted(set(then) - set(now))]
    return changed or ["changed: the series' apply settings (renames, strip, fuzz)"]


def remembered_entries(series: Series) -> dict[str, PatchEntry]:
    """Patch file -> its entry in series.toml as last committed (git HEAD), so a patch
    re-created under the same name gets its stage and summary back; {} outside git
    (or where git is not installed: a tarball checkout, a slim image). A committed
    header the series' schema refuses is refused here, before anything is written."""
    try:
        proc = git.run(["show", "HEAD:./series.toml"], repo=series.root)
    except OSError:
        return {}
    if proc.returncode != 0:
        return {}
    where = f"{series.root / 'series.toml'} at git HEAD"
    try:
        text = proc.stdout.decode()
    except UnicodeDecodeError as exc:
        raise SeriesError(
            f"{where}: not UTF-8 text (byte {exc.start})", hint="commit series.toml as UTF-8"
        ) from None
    return committed_headers(text, where)


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
    remembered: dict[str, PatchEntry] | None = None,
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
            old = (remembered or {}).get(change.file)
            default_summary = f"refreshed from the baked tree: {change.paths[0]}"
            table = tomlkit.table()
            table.update(
                {
                    "file": change.file,
                    "stage": stage if stage is not None else (old.stage if old else 1),
                    "summary": summary or (old.summary if old else "") or default_summary,
                    # The header comes back with the name (quilt keeps it with the patch).
                    **{k: str(v) for k in HEADER if (v := getattr(old, k, ""))},
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
    package = own_pristine(base, pin.sha256, cache, tree.parent) / series.package
    result = apply.plan(package, series.patches, max_fuzz=series.max_fuzz)
    edited = differing_files(package, tree / series.package)
    # An edited file the series leaves alone must read as the pristine: it does not.
    expected = {p: old for p, (old, _) in edited.items()} | result.after
    check_reproduced(
        expected, tree / series.package, "the written series does not reproduce the tree"
    )
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
