"""The bake: pinned wheel -> verified -> pristine -> patched tree, manifest, wheel.

``bake()`` is the whole pipeline and only moves data between the steps, each of
which lives in its own module. The cached pristine tree is never written; the
baked tree is built beside the old one and swapped in whole, so a bake killed
at any moment leaves the previous tree intact.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from packaging.utils import InvalidWheelFilename, parse_wheel_filename
from packaging.version import Version

from bakery import project
from bakery.bake import manifest
from bakery.bake.fetch import cache_dir, fetch
from bakery.bake.record import record_hash
from bakery.bake.wheel import (
    WheelInfo,
    extract,
    patched_wheel_name,
    read_wheel,
    record_errata,
    write_patched_wheel,
)
from bakery.errors import BakeryError, PreimageMismatch, UnreadableInput, UsageError
from bakery.progress import interactive, step, warn
from bakery.schema import read_json
from bakery.series import apply
from bakery.series.series import Pin, Series
from bakery.tree import (
    clone_tree,
    empty_trash,
    inside,
    open_own,
    own_folder,
    remove_tree,
    stage_beside,
    stamp,
    swap_into_place,
    sweep_dead,
    write_atomic,
)

__all__ = [
    "BakeResult",
    "bake",
    "up_to",
    "tree_dir",
    "pristine",
    "unpacked",
    "patched_version",
    "staleness",
    "pristine_edits",
    "build_lock",
    "superseded_wheels",
    "baked_wheel",
]


@dataclass(frozen=True)
class BakeResult:
    tree: Path
    manifest: Path
    wheel: Path
    plan: apply.ApplyPlan
    superseded: tuple[str, ...] = ()  # older wheels of this base and series, removed


def baked_wheel(build: Path, baked: dict) -> Path | None:
    """The wheel a BAKED.json names, in ``build``/dist (None if it names no wheel file:
    a name from a file is never followed out of dist/)."""
    name = baked.get("wheel")
    if not isinstance(name, str) or Path(name).name != name or "\\" in name:
        return None
    try:
        parse_wheel_filename(name)
    except InvalidWheelFilename:
        return None
    return build / "dist" / name


def superseded_wheels(dist: Path, current: str, series_name: str) -> list[Path]:
    """Earlier bakes' wheels of the same project and series in ``dist`` (another series'
    or another project's wheels stay): with two, `pip install dist/*.whl` and the
    Dockerfile's COPY would see a double requirement."""
    name, _, _, _ = parse_wheel_filename(current)
    label = str(Version(f"0+{series_name}.0").local).rpartition(".")[0]  # as PEP 440 has it
    out = []
    for path in sorted(dist.glob("*.whl")) if dist.is_dir() else []:
        try:
            other, version, _, _ = parse_wheel_filename(path.name)
        except InvalidWheelFilename:
            continue
        ours = (version.local or "").rpartition(".")[0] == label
        if other == name and ours and path.name != current and path.is_file():
            out.append(path)
    return out


def tree_dir(build: Path, base_key: str) -> Path:
    return build / ("baked" if base_key == "default" else f"baked-{base_key}")


def patched_version(series: Series, base_version: str) -> Version:
    return Version(f"{base_version}+{series.name}.{series.sha256[:8]}")


def _stamp_path(root: Path) -> Path:
    return root.with_name(f"{root.name}.stamp.json")


def _errata_path(root: Path) -> Path:
    return root.with_name(f"{root.name}.record.json")


def _write_errata(root: Path, errata: dict[str, str]) -> None:
    write_atomic(_errata_path(root), json.dumps(errata, sort_keys=True).encode())


def record_errata_of(wheel: WheelInfo, root: Path) -> dict[str, str]:
    """The real hash of each member whose RECORD hash is wrong ({} for a sound wheel),
    found once per wheel: by the extraction that made ``root``, else (a tree extracted
    by an older bakery) by reading the wheel, then kept beside the tree. It depends on
    the wheel's bytes alone, which its sha256 (the folder's name) pins."""
    try:
        kept = read_json(_errata_path(root), "RECORD errata", UnreadableInput)
    except UnreadableInput:
        kept = None
    if (
        isinstance(kept, dict)
        and all(isinstance(v, str) for v in kept.values())
        and set(kept) <= set(wheel.record)
    ):
        return kept
    with step(f"checking {wheel.path.name}'s RECORD"):
        errata = record_errata(wheel)
    _write_errata(root, errata)
    return errata


def _moved_since_extraction(root: Path) -> list[str] | None:
    """Files of a cached pristine tree whose size or mtime differ from its stamp, taken at
    extraction ([] if none); None if the tree or its stamp is missing (never trusted)."""
    stamp_path = _stamp_path(root)
    if not (root.is_dir() and stamp_path.is_file()):
        return None
    try:
        then = read_json(stamp_path, "pristine stamp", UnreadableInput)
    except UnreadableInput:
        return None  # a damaged stamp is no stamp: the tree is extracted again
    if not isinstance(then, dict):
        return None
    now = stamp(root)
    return sorted(rel for rel in set(then) | set(now) if then.get(rel) != now.get(rel))


def pristine(wheel: WheelInfo, sha256: str, cache: Path) -> Path:
    """The wheel extracted once per sha256, shared by every bake through hard links.

    Its stamp (size + mtime of every file) is checked on each use; a pristine
    tree that was written through a link from a baked tree is re-extracted."""
    root = cache / "pristine" / sha256
    stamp_path = _stamp_path(root)
    moved = _moved_since_extraction(root)
    if moved == []:
        return root
    if moved:
        warn(f"pristine cache {root} was modified (an edit through a hard link?); re-extracting")
    remove_tree(root)
    stamp_path.unlink(missing_ok=True)
    tmp = root.with_name(f".{sha256[:16]}.tmp-{os.getpid()}")
    remove_tree(tmp)
    sweep_dead(root.parent)  # a failed or killed extraction's leftovers, before the retry
    try:
        with step(f"extracting {wheel.path.name}"):
            errata = extract(wheel, tmp)
        _write_errata(root, errata)
    except BaseException:
        remove_tree(tmp)  # a full disk must not leave a partial tree for every retry
        raise
    # staged as ".<name>.<random>.tmp-<pid>", which sweep_dead clears after a kill
    stamp_tmp = stage_beside(
        stamp_path, json.dumps(stamp(tmp), sort_keys=True).encode(), suffix=f".tmp-{os.getpid()}"
    )
    try:
        os.rename(tmp, root)
    except OSError:  # a concurrent bake extracted the same bytes first: use its tree
        remove_tree(tmp)
        stamp_tmp.unlink()
        return root
    os.replace(stamp_tmp, stamp_path)  # last: a tree without its stamp is never trusted
    return root


def pristine_edits(sha256: str, cache: Path | None = None) -> list[str]:
    """One line per file of the cached pristine tree modified since extraction: an append
    (``>>``) to an untouched file of a baked tree lands there, through the hard link, and
    changes every tree linked to it, unseen by per-file hashes of the tree ([] if none,
    or nothing cached)."""
    moved = _moved_since_extraction((cache or cache_dir()) / "pristine" / sha256)
    return [f"modified through a hard link into the pristine cache: {rel}" for rel in moved or []]


def unpacked(pin: Pin, cache: Path | None = None, wheel: Path | None = None) -> Path:
    """Fetch (hash-pinned) and extract a pinned wheel; the read-only pristine root."""
    cache = cache or cache_dir()
    with step(f"fetching {pin.wheel}"):
        path = fetch(pin, wheel=wheel, cache=cache, verbose=interactive())
    return pristine(read_wheel(path), pin.sha256, cache)


def _check_preimage(root: Path, wheel: WheelInfo, series: Series) -> None:
    """Every touched file must be what the wheel's RECORD says, before patching."""
    bad = []
    for path in series.touched:
        member = f"{series.package}/{path}"
        expected = wheel.record.get(member)
        target = inside(root, member)
        if expected is None:
            if target.exists():
                bad.append(f"{member} (not in RECORD)")
            continue
        if not target.is_file():
            bad.append(f"{member} (missing)")
        elif record_hash(target.read_bytes()) != expected:
            bad.append(f"{member} (hash differs from RECORD)")
    if bad:
        raise PreimageMismatch(
            f"base is not what the series expects ({len(bad)} file(s)): " + ", ".join(bad),
            hint="the pristine cache may be damaged: delete it under $BAKERY_CACHE/pristine",
        )


def _tree_stamp_path(tree: Path) -> Path:
    """Beside the tree: size and mtime of each of its files as the bake wrote them."""
    return tree.with_name(f".{tree.name}.stamp.json")


def restamp(tree: Path) -> None:
    """Stamp ``tree`` as it is now (``refresh --no-bake`` records its edits as the bake)."""
    write_atomic(_tree_stamp_path(tree), json.dumps(stamp(tree), sort_keys=True).encode())


def _moved_in_tree(tree: Path) -> list[str]:
    """Files of the tree whose size or mtime moved since the bake: an append through a
    hard link from another checkout lands in this tree too, and once the pristine cache
    is extracted again nothing else sees it ([] if none, or no stamp: an older bake)."""
    try:
        then = read_json(_tree_stamp_path(tree), "tree stamp", UnreadableInput)
    except UnreadableInput:
        return []
    if not isinstance(then, dict):
        return []
    now = stamp(tree)
    moved = {rel for rel in then if then[rel] != now.get(rel)}  # a new file is refresh's
    return sorted(r for r in moved if "__pycache__" not in r.split("/"))


def staleness(series: Series, base_key: str, build: Path = project.BUILD) -> list[str]:
    """Why the baked tree cannot be trusted as this series' bake ([] if it can)."""
    tree = tree_dir(build, base_key)
    path = tree / manifest.MANIFEST
    if not path.is_file():
        return [f"no baked tree at {tree}"]
    data = manifest.load(path)
    problems = []
    if data["series"]["sha256"] != series.sha256:
        problems.append(
            f"{tree} was baked from series {data['series']['sha256'][:8]}, "
            f"the repo has {series.sha256[:8]}"
        )
    if data["base"]["sha256"] != series.base(base_key).sha256:
        problems.append(f"{tree} was baked from another {base_key} wheel")
    drift = manifest.drift(tree, data)
    problems += [
        f"{kind}: {rel}"
        for kind, rels in (
            ("modified", drift.modified),
            ("missing", drift.missing),
            ("extra", drift.extra),
        )
        for rel in rels
    ]
    seen = {line.split(": ", 1)[1] for line in problems if ": " in line}
    problems += [
        f"modified since the bake (an edit through a hard link?): {rel}"
        for rel in _moved_in_tree(tree)
        if rel not in seen and rel != manifest.MANIFEST
    ]
    return problems


def _write_wheel(
    base: WheelInfo,
    dist: Path,
    name: str,
    version: Version,
    changed: dict[str, bytes | None],
    data: dict,
    trash: Path,
    errata: dict[str, str],
) -> Path:
    dist.mkdir(exist_ok=True)
    out = dist / name
    tmp = dist / f".{name}.tmp-{os.getpid()}"
    with step(f"building {name}"):
        try:
            write_patched_wheel(
                base, tmp, version, changed, {manifest.MANIFEST: manifest.dumps(data)}, errata
            )
            swap_into_place(tmp, out, trash)  # freeing a 300 MB file is slow: trash it
        finally:
            tmp.unlink(missing_ok=True)
    return out


_HELD: set[Path] = set()  # build folders whose lock this process holds


@contextlib.contextmanager
def build_lock(build: Path) -> Iterator[None]:
    """One bake (or rebase step) at a time per build folder: they share dist/, .trash
    and the staging names, so a second bake would sweep the first one's staging from
    under it. Re-entrant in one process: ``rebase --continue`` bakes under its lock."""
    key = build.resolve()
    if key in _HELD:
        yield
        return
    build.mkdir(parents=True, exist_ok=True)
    with open(open_own(build / ".bake.lock"), "r+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "unknown"
            raise BakeryError(
                f"another bake is running in this build folder (pid {holder}): {str(build)!r}",
                hint="wait for it to finish, or bake into another folder with "
                "`bakery bake --build DIR`",
            ) from None
        handle.truncate(0)
        handle.write(f"{os.getpid()}\n")
        handle.flush()
        _HELD.add(key)
        try:
            yield  # the lock goes with the file's close, also when the process is killed
        finally:
            _HELD.discard(key)


def up_to(series: Series, last: str) -> Series:
    """The series' first patches, through ``last`` (a patch number or file name; "0":
    none): quilt's ``push N``, for narrowing a bad bake down."""
    numbers = [e.number for e in series.entries]
    files = [e.file for e in series.entries]
    if last.isdigit() and (int(last) == 0 or int(last) in numbers):
        count = 0 if int(last) == 0 else numbers.index(int(last)) + 1
    elif Path(last).name in files:
        count = files.index(Path(last).name) + 1
    else:
        raise UsageError(
            f"not a patch of series {series.name} (a number or file name; 0 for none): {last!r}",
            hint="`bakery status` lists the patches",
        )
    return dataclasses.replace(series, entries=series.entries[:count])


def bake(
    series: Series,
    base_key: str = "default",
    *,
    build: Path = project.BUILD,
    wheel: Path | None = None,
    cache: Path | None = None,
    write_wheel: bool = True,
) -> BakeResult:
    """``write_wheel`` False: the tree and its BAKED.json only (a bisect step's partial
    series, whose wheel would replace the real one in dist/)."""
    pin = series.base(base_key)
    cache = cache or cache_dir()
    with step(f"fetching {pin.wheel}"):
        wheel_path = fetch(pin, wheel=wheel, cache=cache, verbose=interactive())
    base = read_wheel(wheel_path)
    root = pristine(base, pin.sha256, cache)
    _check_preimage(root, base, series)
    errata = record_errata_of(base, root) if write_wheel else {}
    if errata:
        first = next(iter(errata))
        warn(
            f"{base.path.name}: its RECORD has a wrong hash for {len(errata)} member(s) "
            f"(first {first!r}); the patched wheel records their real hashes"
        )
    with step(f"applying {len(series.entries)} patch(es) of {series.name}"):
        plan = apply.plan(inside(root, series.package), series.patches, max_fuzz=series.max_fuzz)
    version = patched_version(series, pin.version)
    wheel_name = patched_wheel_name(base, version)
    data = manifest.build(series, pin, plan, wheel_name)

    tree = tree_dir(build, base_key)
    changed = {f"{series.package}/{p}": plan.after[p] for p in plan.changed}
    modes = {f"{series.package}/{p}": mode for p, mode in plan.modes.items()}
    with build_lock(build):
        # Partial trees and wheels of killed bakes (only those whose process is gone);
        # the cache may sit on another filesystem than the trash.
        trash = own_folder(build / ".trash")  # before anything moves into it
        for folder in (build, build / "dist"):
            sweep_dead(folder, trash)
        sweep_dead(cache / "pristine")
        staging = build / f".{tree.name}.new-{os.getpid()}"
        try:
            with step(f"writing {tree}"):
                clone_tree(root, staging, skip=frozenset(changed))
                for member, content in changed.items():
                    if content is not None:
                        write_atomic(inside(staging, member), content, modes.get(member))
                manifest.write(staging / manifest.MANIFEST, data)
            tree_stamp = json.dumps(stamp(staging), sort_keys=True).encode()
            out = build / "dist" / wheel_name
            if write_wheel:
                out = _write_wheel(
                    base, build / "dist", wheel_name, version, changed, data, trash, errata
                )
            swap_into_place(staging, tree, trash)
            write_atomic(_tree_stamp_path(tree), tree_stamp)
            old = superseded_wheels(build / "dist", wheel_name, series.name) if write_wheel else []
            for path in old:
                os.rename(path, trash / f"{path.name}-{os.getpid()}")
        except BaseException:
            remove_tree(staging)
            raise
        empty_trash(trash)
    return BakeResult(tree, tree / manifest.MANIFEST, out, plan, tuple(p.name for p in old))
