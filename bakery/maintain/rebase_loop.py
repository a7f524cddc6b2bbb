"""The rebase conflict loop: ``checkout`` -> fix the conflicts -> ``resume`` (or ``abort``).

``checkout`` writes the series onto another release into the baked tree: a file
whose patch places is patched, one whose patch is already upstream is left as
the release has it, and the rest are 3-way merged (``git merge-file``: the old
pristine file is the base, the release's file and the old patched file the two
sides), with conflict markers where they clash. The series folder and the old
tree are saved under ``build/.rebase``, which appears whole (state.json
included) before any tree moves, so ``abort`` restores both byte for byte from
any point. ``resume`` refreshes the series from the fixed tree, moves the pins,
re-bakes and runs linkcheck. Each step holds the bake's build lock.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from dataclasses import dataclass, replace
from pathlib import Path

import msgspec
import tomlkit

from bakery.bake.bake import bake, build_lock, staleness, tree_dir
from bakery.bake.pristine import unpacked
from bakery.check.linkcheck import format_finding, run_linkcheck
from bakery.errors import BakeryError, HunkFailed, UnreadableInput, UsageError
from bakery.maintain import refresh
from bakery.maintain.edits import check_reproduced, differing_files
from bakery.maintain.merge import merge_file
from bakery.maintain.rebase import (
    PatchVerdict,
    dependency_pins,
    other_base_pins,
    patch_status,
    pin_table,
    release_pin,
    survey,
)
from bakery.maintain.rebase_state import (
    RERERE,
    STATE,
    CheckedOutFile,
    CheckoutStatus,
    RebaseState,
    checked_out,
    discard_state,
    folder_changes,
    in_progress,
    is_ours,
    load_state,
    loop_tree,
    refuse_during_rebase,
    series_files,
    state_path,
    to_trash,
    write_state,
)
from bakery.series import apply
from bakery.series.engine import apply_file_patch
from bakery.series.series import Pin, Series, is_sha256, load_series
from bakery.tree import (
    clone_tree,
    empty_trash,
    own_folder,
    own_path,
    read_bounded,
    read_file,
    remove_tree,
    replace_files,
    sweep_dead,
    write_atomic,
)

__all__ = [
    "STATE",
    "CheckoutStatus",
    "in_progress",
    "refuse_during_rebase",
    "checkout",
    "resume",
    "abort",
    "stop_at_conflicts",
]

_MARKERS = (b"<<<<<<< ", b"||||||| ", b"=======", b">>>>>>> ")
NEXT_STEP = "fix them in the tree, then `bakery rebase --continue` (or `bakery rebase --abort`)"


def stop_at_conflicts(left: list) -> None:
    """As `git rebase` stops at a conflict: exit 1, after the checkout's report."""
    if left:
        raise BakeryError(f"{len(left)} file(s) with conflicts left", hint=NEXT_STEP)


def has_markers(data: bytes | None) -> bool:
    return any(line.startswith(_MARKERS) for line in (data or b"").splitlines())


def marker_lines(data: bytes | None) -> list[int]:
    """The 1-based line of each conflict's opening marker (or of a stray marker line)."""
    lines = (data or b"").splitlines()
    opening = [i + 1 for i, line in enumerate(lines) if line.startswith(_MARKERS[0])]
    return opening or [i + 1 for i, line in enumerate(lines) if line.startswith(_MARKERS)]


@dataclass(frozen=True)
class _Outcome:
    path: str
    patch: str
    status: CheckoutStatus
    data: bytes | None
    fuzz: int = 0  # the most fuzz a hunk of an applied patch needed
    conflict: str = ""  # sha256 of the conflict as merged (rerere's key)


def _place(series: Series, old_pkg: Path, new_pkg: Path, release: str, max_fuzz: int):
    """Each touched file on the new release, with how it got there."""
    new_files = {p: read_file(new_pkg, p) for p in series.touched}
    statuses = survey(series, new_files, max_fuzz)
    old = {p: read_file(old_pkg, p) for p in series.touched}
    new = dict(new_files)
    out: dict[str, _Outcome] = {}
    for patch in series.patches:
        upstream = patch_status(statuses, patch.name) is PatchVerdict.UPSTREAM
        for fp in patch.files:
            before_old = old[fp.path]
            old[fp.path] = apply_file_patch(patch.name, fp, before_old, series.max_fuzz).after
            fuzz = 0
            if upstream:
                status = CheckoutStatus.UPSTREAM
            else:
                try:
                    placed = apply_file_patch(patch.name, fp, new[fp.path], max_fuzz)
                    new[fp.path] = placed.after
                    fuzz = max((p.fuzz for p in placed.placements), default=0)
                    status = CheckoutStatus.APPLIED
                except HunkFailed:
                    labels = (release, f"{fp.path} before {patch.name}", patch.name)
                    new[fp.path], conflicts = merge_file(
                        new[fp.path] or b"", before_old or b"", old[fp.path] or b"", labels
                    )
                    status = CheckoutStatus.CONFLICT if conflicts else CheckoutStatus.MERGED
            out[fp.path] = _Outcome(fp.path, patch.name, status, new[fp.path], fuzz)
    return out


def checkout(
    series: Series, version: str, build: Path, *, base_key: str, max_fuzz: int, cache: Path
) -> RebaseState:
    """Write the series onto ``version`` into the baked tree, conflicts and all."""
    with build_lock(build):
        refuse_during_rebase(build)
        tree = tree_dir(build, base_key)
        old_pkg = unpacked(series.base(base_key), cache, build=build) / series.package
        if tree.exists():
            # The old tree is set aside and dropped by --continue: edits in it would be lost.
            problems = staleness(series, base_key, build)
            if not problems:
                edited = differing_files(old_pkg, tree / series.package)
                problems = [f"{c.action} {c.file}" for c in refresh.plan_refresh(series, edited)]
            if problems:
                raise UsageError(
                    f"{tree} is not a clean bake of the series: " + "; ".join(problems[:3]),
                    hint=f"save its edits with `bakery refresh --base {base_key}`, or re-bake "
                    f"with `bakery bake --base {base_key}`, then rebase",
                )
        pin = release_pin(series, base_key, version, cache)
        deps, dep_notes = dependency_pins(series, pin, cache)
        others, notes = other_base_pins(series, base_key, version, cache)
        notes = dep_notes + notes
        new_root = unpacked(pin, cache, build=build)  # its own copy: the tree links to it
        outcomes = _reuse(
            build,
            _place(series, old_pkg, new_root / series.package, str(pin.requirement), max_fuzz),
        )
        state = RebaseState(
            release=str(pin.requirement),
            base_key=base_key,
            series=str(series.root.resolve()),
            series_sha256=series.sha256,
            wrote={},
            had_tree=tree.exists(),
            pin=pin_table(pin),
            dependencies={dep.name: pin_table(dep) for dep in deps},
            other_bases={key: pin_table(p) for key, p in others.items()},
            notes=tuple(notes),
            files={
                p: CheckedOutFile(o.patch, o.status, o.fuzz, o.conflict)
                for p, o in sorted(outcomes.items())
            },
        )
        _swap_in(series, build, tree, new_root, outcomes, state)
    return state


def _reuse(build: Path, outcomes: dict[str, _Outcome]) -> dict[str, _Outcome]:
    """Each conflict keyed by its sha256; one fixed before gets that fix (rerere)."""
    out = {}
    for path, o in outcomes.items():
        if o.status is CheckoutStatus.CONFLICT and o.data is not None:
            key = hashlib.sha256(o.data).hexdigest()
            fixed = build / RERERE / key
            if fixed.is_file() and not fixed.is_symlink() and not (build / RERERE).is_symlink():
                o = replace(o, status=CheckoutStatus.RESOLVED, data=read_bounded(fixed))
            o = replace(o, conflict=key)
        out[path] = o
    return out


def _record(build: Path, state: RebaseState, package: Path) -> None:
    """Remember the fix of each conflict the tree no longer has markers for."""
    for path, info in state.files.items():
        if is_sha256(info.conflict):
            data = read_file(package, path)
            if data is not None and not has_markers(data):
                folder = own_folder(build / RERERE)
                write_atomic(folder / info.conflict, data)


def _swap_in(
    series: Series, build: Path, tree: Path, new_root: Path, outcomes: dict, state: RebaseState
) -> None:
    """Stage the new tree and the whole state folder, make the state appear with one
    rename, then move the trees: a failure or kill before that rename leaves nothing
    (the next bake or checkout sweeps a killed one's staging); after it, ``abort``
    undoes every step."""
    trash = build / ".trash"
    sweep_dead(build, trash)
    staging = build / f".{tree.name}.new-{os.getpid()}"  # tree.sweep_dead's pattern
    staged_state = build / f"{STATE}.new-{os.getpid()}"
    try:
        remove_tree(staging)
        remove_tree(staged_state)
        members = {f"{series.package}/{p}" for p in outcomes}
        clone_tree(new_root, staging, skip=frozenset(members))
        for outcome in outcomes.values():
            if outcome.data is not None:
                write_atomic(staging / series.package / outcome.path, outcome.data)
        shutil.copytree(series.root, staged_state / "series")
        write_state(staged_state / "state.json", state)
        os.rename(staged_state, build / STATE)
        if state.had_tree:
            os.rename(tree, build / STATE / "baked")
        os.rename(staging, tree)
    finally:
        remove_tree(staging)
        remove_tree(staged_state)
    empty_trash(trash)


def conflicts_left(state: RebaseState, build: Path, series: Series) -> list[str]:
    package = loop_tree(build, state) / series.package
    return [p for p in state.files if has_markers(read_file(package, p))]


@dataclass(frozen=True)
class Resumed:
    """What `rebase --continue` did: the release, each patch change, the stray files it
    ignored, notes, the re-baked tree and linkcheck's findings."""

    release: str
    changes: tuple[tuple[str, str], ...]  # (action, patch file)
    strays: tuple[str, ...]
    notes: tuple[str, ...]
    tree: str
    linkcheck: tuple[str, ...]


def resume(
    build: Path,
    cache: Path,
    series_root: Path | None = None,
    drop: tuple[str, ...] = (),
    keep: tuple[str, ...] = (),
) -> Resumed:
    """Refresh the series from the fixed tree onto the new pins, re-bake, linkcheck.

    Every other base must still bake the refreshed series; one that does not is refused
    (series untouched, rebase still in progress) unless ``drop`` removes it from the series
    or ``keep`` keeps its pin knowingly unbakeable. ``series_root`` is the series the
    command names (the CLI always passes it); None takes the one the state names."""
    with build_lock(build):
        return _resume(build, cache, series_root, drop, keep)


def _unbakeable(series: Series, skip: str, cache: Path) -> dict[str, str]:
    """Base key -> why the series does not apply to it (the bases other than ``skip``)."""
    out = {}
    for key, pin in sorted(series.bases.items()):
        if key == skip:
            continue
        try:
            apply.plan(
                unpacked(pin, cache) / series.package, series.patches, max_fuzz=series.max_fuzz
            )
        except HunkFailed as exc:
            first = str(exc).splitlines()[0]
            out[key] = f"[bases.{key}] ({pin.requirement}) would not bake: {first}"
    return out


def _resume(
    build: Path, cache: Path, series_root: Path | None, drop: tuple[str, ...], keep: tuple[str, ...]
) -> Resumed:
    state = load_state(build, series_root)
    if not checked_out(state, build):
        raise UsageError(
            f"the checkout onto {state.release} did not finish (or an abort did not)",
            hint="undo it with `bakery rebase --abort`, then check out again",
        )
    root = Path(state.series)
    if not is_ours(state, root):
        raise UsageError(
            f"{root} changed after this rebase was checked out (another rebase loop "
            "finished, or a hand edit): --continue would write over it",
            hint="`bakery rebase --abort` drops this loop and leaves the series as it is",
        )
    saved_root = own_path(build, f"{STATE}/series", "the saved series")
    saved = load_series(saved_root)
    _record(build, state, loop_tree(build, state) / saved.package)  # also with some left
    left = conflicts_left(state, build, saved)
    if left:
        package = loop_tree(build, state) / saved.package
        where = [
            f"{package / p}:{','.join(map(str, marker_lines(read_file(package, p))))}" for p in left
        ]
        raise BakeryError(
            f"{len(left)} file(s) still have conflict markers (file:lines): " + ", ".join(where),
            hint=NEXT_STEP,
        )
    base_key = state.base_key
    unknown = sorted({base_key, *state.other_bases} - set(saved.bases))
    if unknown:
        raise UnreadableInput(
            f"the rebase state names bases the series lacks: {unknown!r}",
            hint=f"`bakery rebase --abort`, then check out again (or delete {build / STATE})",
        )
    for key in (*drop, *keep):
        if key == base_key or key not in saved.bases:
            others = sorted(set(saved.bases) - {base_key})
            raise UsageError(
                f"--drop-base and --keep-base take another base of the series, not {key!r}",
                hint=f"the other bases: {', '.join(others) or 'none'}",
            )
    tree = loop_tree(build, state)
    pin = Pin.parse(base_key, state.pin, "rebase state")
    strays: list[str] = []
    edited = differing_files(
        unpacked(pin, cache, build=build) / saved.package, tree / saved.package, strays
    )
    # The new series is made in a copy of the saved one, then written all at once.
    work = own_path(build, f"{STATE}/next", "the series being written")
    remove_tree(work)
    shutil.copytree(saved_root, work)
    _repin(work, state, drop)
    repinned = load_series(work)
    changes = refresh.plan_refresh(repinned, edited)
    remembered = {e.file: e for e in saved.entries}
    refresh.write_refresh(repinned, changes, remembered=remembered)
    broken = _unbakeable(load_series(work), base_key, cache)
    refused = {k: why for k, why in broken.items() if k not in keep}
    if refused:  # refused before the series is written: nothing to put back
        names = " ".join(sorted(refused))
        raise BakeryError(
            f"the rebased series would leave {len(refused)} other base(s) unbakeable: "
            + "; ".join(refused.values()),
            hint=f"choose: `bakery rebase --continue --drop-base {names}` removes it from "
            f"series.toml, `--keep-base {names}` keeps its pin knowingly unbakeable, or "
            "`bakery rebase --abort`",
        )
    writes = folder_changes(work, root, saved_root)
    wrote = {  # a rerun after a failed bake keeps what the first run wrote
        name: None if data is None else hashlib.sha256(data).hexdigest()
        for name, data in writes.items()
    }
    state = msgspec.structs.replace(state, wrote=state.wrote | wrote)
    write_state(state_path(build), state)
    replace_files(root, writes)  # the series is the old one or the new one, never half
    remove_tree(work)
    rebased = load_series(root)
    result = bake(rebased, base_key, build=build, cache=cache)
    expected = {p: new for p, (_, new) in edited.items()}
    check_reproduced(
        expected, result.tree / rebased.package, "re-bake does not reproduce the fixed tree"
    )
    thirdparty = [unpacked(dep, cache) for dep in rebased.dependencies.values()]
    findings = run_linkcheck(rebased, unpacked(pin, cache), thirdparty)
    discard_state(build)
    return Resumed(
        release=state.release,
        changes=tuple((c.action, c.file) for c in changes),
        strays=tuple(strays),
        notes=(
            *state.notes,
            *(f"{why} (kept: --keep-base)" for why in broken.values()),
            *(f"[bases.{key}] removed from the series (--drop-base)" for key in drop),
        ),
        tree=str(result.tree),
        linkcheck=tuple(format_finding(f) for f in findings),
    )


def _repin(root: Path, state: RebaseState, drop: tuple[str, ...] = ()) -> None:
    path = root / "series.toml"
    doc = tomlkit.parse(path.read_text())
    doc["bases"][state.base_key].update(state.pin)
    for key, table in state.other_bases.items():
        doc["bases"][key].update(table)
    for key in drop:
        del doc["bases"][key]
    for name, table in state.dependencies.items():
        doc.setdefault("dependencies", tomlkit.table())[name] = table
    write_atomic(path, tomlkit.dumps(doc).encode())


def abort(build: Path, series_root: Path | None = None) -> tuple[str, list[str]]:
    """Put back the series files --continue wrote and the baked tree, as they were; from
    any point a checkout or an earlier abort stopped at, so a rerun always finishes.
    Nothing the loop did not write is deleted or overwritten: a file changed since
    --continue wrote it (by a hand, or by another loop) is left as it is. Returns the
    release and the series files so kept."""
    with build_lock(build):
        state = load_state(build, series_root)
        root = Path(state.series)
        tree = loop_tree(build, state)
        saved_tree = own_path(build, f"{STATE}/baked", "the saved tree")
        now = series_files(root)
        ours = {n: h for n, h in state.wrote.items() if now.get(n) == h}
        saved = own_path(build, f"{STATE}/series", "the saved series")
        if ours and not saved.is_dir():  # checked before anything moves
            raise UnreadableInput(
                f"the saved series {saved} is missing: cannot put back {sorted(ours)!r}",
                hint=f"restore {root} from git, then delete {build / STATE}",
            )
        back: dict[str, bytes | None] = {}
        for name in ours:
            copy = own_path(saved, name, "a saved series file")
            back[name] = read_bounded(copy) if copy.is_file() else None
        if tree.exists() and checked_out(state, build):
            try:  # a later checkout gets these fixes back; never in the way of an abort
                _record(build, state, tree / load_series(saved).package)
            except BakeryError:
                pass
        if back:
            replace_files(root, back)
        if tree.exists() and checked_out(state, build):
            to_trash(build, tree)
        if saved_tree.exists():
            os.rename(saved_tree, tree)
        discard_state(build)
    return state.release, sorted(set(state.wrote) - set(ours))
