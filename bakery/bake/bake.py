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
import hashlib
import json
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from packaging.utils import InvalidWheelFilename, parse_wheel_filename
from packaging.version import Version

from bakery import project
from bakery.bake import manifest, trust, zipwriter
from bakery.bake import record as record_mod
from bakery.bake import wheel as wheel_mod
from bakery.bake.fetch import cache_dir, fetch
from bakery.bake.pristine import own_pristine, read_stamp, record_errata_of, stamp_bytes
from bakery.bake.record import record_hash
from bakery.bake.wheel import (
    WheelInfo,
    patched_wheel_name,
    read_wheel,
    write_patched_wheel,
)
from bakery.errors import BakeryError, PreimageMismatch, UsageError
from bakery.progress import interactive, note, step, warn
from bakery.series import apply
from bakery.series.series import Series
from bakery.tree import (
    clone_tree,
    empty_trash,
    inside,
    open_own,
    own_folder,
    relative,
    remove_tree,
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
    "patched_version",
    "staleness",
    "build_lock",
    "superseded_wheels",
    "baked_wheel",
    "edits_since_bake",
    "refuse_lost_edits",
]


@dataclass(frozen=True)
class BakeResult:
    tree: Path
    manifest: Path
    wheel: Path
    plan: apply.ApplyPlan
    superseded: tuple[str, ...] = ()  # older wheels of this base and series, removed


def baked_wheel(build: Path, baked: manifest.BakedManifest) -> Path | None:
    """The wheel a BAKED.json names, in ``build``/dist (None if it names no wheel file:
    a name from a file is never followed out of dist/)."""
    name = baked.wheel
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
            hint=f"the pristine tree may be damaged: delete {str(root)!r} and the cache's copy, "
            f"$BAKERY_CACHE/pristine/{root.name}",
        )


def _tree_stamp_path(tree: Path) -> Path:
    """Beside the tree: size and mtime of each of its files as the bake wrote them."""
    return tree.with_name(f".{tree.name}.stamp.json")


def restamp(tree: Path) -> None:
    """Stamp ``tree`` as it is now (``refresh --no-bake`` records its edits as the bake)."""
    write_atomic(_tree_stamp_path(tree), stamp_bytes(tree))


def _moved_in_tree(tree: Path, *, new_files: bool = False) -> list[str]:
    """Files of the tree whose size or mtime moved since the bake: an append to an
    untouched file, which the per-file hashes of BAKED.json do not cover ([] if none, or
    no stamp: an older bake); with ``new_files``, files added since too."""
    then = read_stamp(_tree_stamp_path(tree))
    if then is None:
        return []
    now = stamp(tree)
    names = then.keys() | now.keys() if new_files else then.keys()  # else a new one is refresh's
    moved = {rel for rel in names if then.get(rel) != now.get(rel)}
    return sorted(r for r in moved if "__pycache__" not in r.split("/"))


def staleness(series: Series, base_key: str, build: Path = project.BUILD) -> list[str]:
    """Why the baked tree cannot be trusted as this series' bake ([] if it can)."""
    tree = tree_dir(build, base_key)
    path = tree / manifest.MANIFEST
    if not path.is_file():
        return [f"no baked tree at {tree}"]
    data = manifest.load(path)
    problems = []
    if data.series.sha256 != series.sha256:
        problems.append(
            f"{tree} was baked from series {data.series.sha256[:8]}, "
            f"the repo has {series.sha256[:8]}"
        )
    if data.base.sha256 != series.base(base_key).sha256:
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
        f"modified since the bake: {rel}"
        for rel in _moved_in_tree(tree)
        if rel not in seen and rel != manifest.MANIFEST
    ]
    return problems


def edits_since_bake(tree: Path) -> list[str]:
    """Files of ``tree`` that are not as its bake wrote them: what a bake replacing the
    tree would drop (``status``'s pending edits, also in a bisect bake's tree). The files
    BAKED.json covers by hash, every other one by the tree's stamp (size and mtime; a new
    file or a removed one too); bytecode never counts. [] for no bake at ``tree``."""
    path = tree / manifest.MANIFEST
    if not path.is_file() or path.is_symlink():
        return []
    data = manifest.load(path)
    drift = manifest.drift(tree, data)
    found = {*drift.modified, *drift.missing, *drift.extra}
    # the files BAKED.json hashes are judged by their hash alone
    found |= set(_moved_in_tree(tree, new_files=True)) - set(data.files)
    found.discard(manifest.MANIFEST)
    return sorted(r for r in found if "__pycache__" not in r.split("/"))


def refuse_lost_edits(build: Path, base_key: str, discard: bool) -> None:
    """A command about to replace the baked tree refuses while it holds edits since its
    bake (exit 2, as every refusal naming its way out), unless ``discard``."""
    tree = tree_dir(build, base_key)
    record = tree / manifest.MANIFEST
    if (
        not discard
        and tree.is_dir()
        and not tree.is_symlink()
        and (record.is_symlink() or not record.is_file())
        and any(tree.iterdir())
    ):
        # No BAKED.json (removed, or a symlink: never read): nothing tells its files
        # from the bake's, so every one of them may be an edit this would drop.
        raise UsageError(
            f"{tree} holds files but no {manifest.MANIFEST} of its bake (missing, or a "
            "symlink): this would drop them, and any edit among them",
            hint="copy out what you want to keep, or replace the tree with "
            "`bakery bake --discard-edits` (`bakery bisect --discard-edits` for a bisect)",
        )
    lost = [] if discard else edits_since_bake(tree)
    if lost:
        more = f" (+{len(lost) - 8} more)" if len(lost) > 8 else ""
        raise UsageError(
            f"{tree} holds {len(lost)} edit(s) since its bake that this would drop: "
            + ", ".join(lost[:8])
            + more,
            hint="turn them into patches first (`bakery refresh`), copy them out, or drop "
            "them with `bakery bake --discard-edits` (`bakery bisect --discard-edits` for "
            "a bisect)",
        )


def _wheel_record_path(tree: Path) -> Path:
    """Beside the tree: the trust record of the wheel its last bake wrote."""
    return tree.with_name(f".{tree.name}.wheel.json")


_WRITER = (wheel_mod, zipwriter, record_mod)  # the code the wheel's bytes also follow from


def _wheel_inputs(
    base_sha256: str,
    name: str,
    changed: dict[str, bytes | None],
    extra: dict[str, bytes],
    errata: dict[str, str],
) -> str:
    """sha256 of everything a patched wheel's bytes follow from: the base wheel, the new
    name (its version), the members replaced or deleted, the dist-info files added
    (BAKED.json), the RECORD errata and the writer's own source (an edited checkout)."""
    parts = [base_sha256.encode(), name.encode(), json.dumps(errata, sort_keys=True).encode()]
    parts += [Path(module.__file__ or "").read_bytes() for module in _WRITER]
    for member, content in sorted(changed.items()):
        parts += [member.encode(), b"-" if content is None else b"+" + content]
    for member, content in sorted(extra.items()):
        parts += [f"dist-info/{member}".encode(), content]
    h = hashlib.sha256()
    for part in parts:  # length-prefixed: no two lists of parts hash alike
        h.update(len(part).to_bytes(8, "big") + part)
    return h.hexdigest()


def _write_wheel(
    base: WheelInfo,
    base_sha256: str,
    build: Path,
    tree: Path,
    name: str,
    version: Version,
    changed: dict[str, bytes | None],
    data: manifest.BakedManifest,
    errata: dict[str, str],
    trash: Path,
    modes: dict[str, int],
) -> Path:
    """The patched wheel in ``build``/dist. Its bytes follow from its inputs alone, so a
    rebake of the same inputs keeps the wheel the last bake wrote while its trust record
    holds (same device, inode, size, mtime and ctime: ``trust``) instead of writing 330 MB
    again."""
    dist = build / "dist"
    out = dist / name
    extra = {manifest.MANIFEST: manifest.dumps(data)}
    inputs = _wheel_inputs(base_sha256, name, changed, extra, errata)
    record = _wheel_record_path(tree)
    if trust.trusted(record, out, inputs):
        note(f"{name}: kept (the same inputs as the bake that wrote it, and the same "
             "device, inode, size, mtime and ctime)")  # fmt: skip
        return out
    dist.mkdir(exist_ok=True)
    tmp = dist / f".{name}.tmp-{os.getpid()}"
    with step(f"building {name}"):
        try:
            write_patched_wheel(base, tmp, version, changed, extra, errata, modes)
            started = trust.settle(tmp)
            swap_into_place(tmp, out, trash)  # freeing a 300 MB file is slow: trash it
        finally:
            tmp.unlink(missing_ok=True)
    # stat'ed once in place: the rename moved its ctime
    trust.remember(record, trust.seen(out, inputs), build, started)
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
    # ASCII digits only, and few: str.isdigit() takes '²' (int() refuses it) and int()
    # refuses past 4300 digits.
    if re.fullmatch(r"[0-9]{1,18}", last) and (int(last) == 0 or int(last) in numbers):
        count = 0 if int(last) == 0 else numbers.index(int(last)) + 1
    elif Path(last).name in files:
        count = files.index(Path(last).name) + 1
    else:
        raise UsageError(
            f"not a patch of series {series.name} (a number or file name; 0 for none): "
            f"{last[:40]!r}{'...' if len(last) > 40 else ''}",
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
    tree = tree_dir(build, base_key)
    for touched in series.touched:  # a path leaving the tree is refused before any write
        relative(f"{series.package}/{touched}")
    with build_lock(build):
        # Partial trees and wheels of killed bakes (only those whose process is gone);
        # the cache may sit on another filesystem than the trash.
        trash = own_folder(build / ".trash")  # before anything moves into it
        own_folder(build / "dist")  # a symlink is refused: never written or swept through
        for folder in (build, build / "dist"):
            sweep_dead(folder, trash)
        sweep_dead(cache / "pristine")
        own = own_pristine(base, pin.sha256, cache, build)  # never the shared cache's
        _check_preimage(own, base, series)
        errata = record_errata_of(base, own) if write_wheel else {}
        if errata:
            first = next(iter(errata))
            warn(
                f"{base.path.name}: its RECORD has a wrong hash for {len(errata)} member(s) "
                f"(first {first!r}); the patched wheel records their real hashes"
            )
        with step(f"applying {len(series.entries)} patch(es) of {series.name}"):
            package = inside(own, series.package)
            plan = apply.plan(package, series.patches, max_fuzz=series.max_fuzz)
        version = patched_version(series, pin.version)
        wheel_name = patched_wheel_name(base, version)
        data = manifest.build(series, pin, plan, wheel_name)
        changed = {f"{series.package}/{p}": plan.after[p] for p in plan.changed}
        modes = {f"{series.package}/{p}": mode for p, mode in plan.modes.items()}
        staging = build / f".{tree.name}.new-{os.getpid()}"
        try:
            with step(f"writing {tree}"):
                clone_tree(own, staging, skip=frozenset(changed))
                for member, content in changed.items():
                    if content is not None:
                        write_atomic(inside(staging, member), content, modes.get(member))
                manifest.write(staging / manifest.MANIFEST, data)
            tree_stamp = stamp_bytes(staging)
            out = build / "dist" / wheel_name
            if write_wheel:
                out = _write_wheel(
                    base,
                    pin.sha256,
                    build,
                    tree,
                    wheel_name,
                    version,
                    changed,
                    data,
                    errata,
                    trash,
                    modes,
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
