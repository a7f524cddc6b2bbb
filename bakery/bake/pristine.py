"""Pristine trees: each build folder's own copy of a pinned wheel's tree, which that
folder's baked trees hard-link to, and the shared cache's copy it is made from.

The cache (``$BAKERY_CACHE/pristine/<sha256>``) may be shared by other checkouts, so no
baked tree links to it: an edit written in place (``echo >>``, an editor that keeps the
inode) to an untouched file of ``build/baked`` would reach every other checkout. The link
goes to ``build/.pristine/<sha256>`` instead, made once per build folder; an edit that
reaches that copy is seen by its stamp and the file copied again from the cache. Every
tree carries a stamp (size and mtime of every file) taken as it is written.

The first build folder to ask extracts the wheel straight into its own copy and leaves a
note in the cache (``<sha256>.asked``): a first bake writes the tree once. The next one
to ask fills the cache, and from then on each new build folder copies from it, which is
faster than extracting. A repair or a command without a build folder fills it too.
"""

from __future__ import annotations

import fcntl
import os
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from bakery.bake.fetch import cache_dir, fetch
from bakery.bake.wheel import WheelInfo, extract, read_wheel, record_errata
from bakery.errors import UnreadableInput
from bakery.progress import interactive, step, warn
from bakery.schema import encode_json, read_json, try_decode
from bakery.series.series import Pin
from bakery.tree import (
    inside,
    own_folder,
    remove_tree,
    stage_beside,
    stamp,
    sweep_dead,
    write_atomic,
)

__all__ = [
    "TreeStamp",
    "RecordErrata",
    "stamp_bytes",
    "read_stamp",
    "pristine",
    "own_pristine",
    "own_copy",
    "compared_pristine",
    "pristine_edits",
    "record_errata_of",
    "unpacked",
]


# A tree's stamp (``<tree>.stamp.json``): path -> (size, mtime_ns) of every file, as
# ``tree.stamp`` takes it; one line, sorted, as machines alone read it.
TreeStamp = dict[str, tuple[int, int]]
# ``<pristine tree>.record.json``: member -> its real RECORD hash, where RECORD is wrong.
RecordErrata = dict[str, str]


def stamp_bytes(root: Path) -> bytes:
    return encode_json(stamp(root), sort_keys=True, one_line=True)


def read_stamp(path: Path) -> TreeStamp | None:
    """The stamp at ``path``; None if missing, damaged or mistyped (no stamp)."""
    try:
        data = read_json(path, "tree stamp", UnreadableInput)
    except UnreadableInput:
        return None
    return try_decode(data, TreeStamp)[0]


def _stamp_path(root: Path) -> Path:
    return root.with_name(f"{root.name}.stamp.json")


def _errata_path(root: Path) -> Path:
    return root.with_name(f"{root.name}.record.json")


def _asked_path(root: Path) -> Path:
    return root.with_name(f"{root.name}.asked")


def _write_errata(root: Path, errata: RecordErrata) -> None:
    write_atomic(_errata_path(root), encode_json(errata, sort_keys=True, one_line=True))


def record_errata_of(wheel: WheelInfo, root: Path) -> RecordErrata:
    """The real hash of each member whose RECORD hash is wrong ({} for a sound wheel),
    found once per wheel: by the extraction that made ``root``, else (a tree extracted
    by an older bakery) by reading the wheel, then kept beside the tree. It depends on
    the wheel's bytes alone, which its sha256 (the folder's name) pins."""
    try:
        kept = try_decode(
            read_json(_errata_path(root), "RECORD errata", UnreadableInput), RecordErrata
        )[0]
    except UnreadableInput:
        kept = None
    if kept is not None and set(kept) <= set(wheel.record):
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
    then = read_stamp(stamp_path)
    if then is None:
        return None  # a damaged stamp is no stamp: the tree is extracted again
    now = stamp(root)
    return sorted(rel for rel in set(then) | set(now) if then.get(rel) != now.get(rel))


def pristine(wheel: WheelInfo, sha256: str, cache: Path) -> Path:
    """The wheel extracted once per sha256 into the cache, which every checkout shares.

    Its stamp (size + mtime of every file) is checked on each use; a tree modified
    since (by hand, or through a link an older bakery made) is extracted again."""
    root = cache / "pristine" / sha256
    stamp_path = _stamp_path(root)
    moved = _moved_since_extraction(root)
    if moved == []:
        return root
    if moved:
        warn(f"pristine cache {root} was modified (by hand, or through a link); re-extracting")
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
    stamp_tmp = stage_beside(stamp_path, stamp_bytes(tmp), suffix=f".tmp-{os.getpid()}")
    try:
        os.rename(tmp, root)
    except OSError:  # a concurrent bake extracted the same bytes first: use its tree
        remove_tree(tmp)
        stamp_tmp.unlink()
        return root
    os.replace(stamp_tmp, stamp_path)  # last: a tree without its stamp is never trusted
    return root


def pristine_edits(sha256: str, cache: Path | None = None) -> list[str]:
    """One line per file of the cached pristine tree modified since extraction ([] if
    none, or nothing cached): baked trees no longer link to it, but an older bakery's
    trees may, and the next bake extracts it again."""
    moved = _moved_since_extraction((cache or cache_dir()) / "pristine" / sha256)
    return [f"modified through a hard link into the pristine cache: {rel}" for rel in moved or []]


def unpacked(
    pin: Pin, cache: Path | None = None, wheel: Path | None = None, build: Path | None = None
) -> Path:
    """Fetch (hash-pinned) and extract a pinned wheel; the read-only pristine root (with
    ``build``: that build folder's own copy, to compare with or link into its trees)."""
    cache = cache or cache_dir()
    with step(f"fetching {pin.wheel}"):
        path = fetch(pin, wheel=wheel, cache=cache, verbose=interactive())
    if build is None:
        return pristine(read_wheel(path), pin.sha256, cache)
    return own_pristine(read_wheel(path), pin.sha256, cache, build)


def _shared_source(wheel: WheelInfo, sha256: str, cache: Path) -> Path | None:
    """The cache's pristine tree to copy a build folder's own from; None the first time
    any build folder asks (it extracts straight from the wheel, and the note it leaves
    makes the next asker fill the cache)."""
    root = cache / "pristine" / sha256
    if _moved_since_extraction(root) == []:
        return root
    note = _asked_path(root)
    if not os.path.lexists(note):  # a folder or a link there counts as asked, never written
        write_atomic(note, b"")
        return None
    return pristine(wheel, sha256, cache)


def own_copy(build: Path, sha256: str) -> Path:
    """Where ``build`` keeps its own copy of the pristine tree of ``sha256``."""
    return build / ".pristine" / sha256


_COPY_THREADS = 8
_FICLONE = 0x40049409  # linux/fs.h: share the extents, copy on write (btrfs, xfs, ...)


def _clone_file(src: str, dst: Path, reflink: list[bool]) -> None:
    """``dst`` as a new inode holding ``src``'s bytes: a reflink where the filesystem has
    them (instant, no space), else a copy; ``reflink`` remembers which, per tree."""
    if reflink[0]:
        with open(src, "rb") as s, open(dst, "wb") as d:
            try:
                fcntl.ioctl(d.fileno(), _FICLONE, s.fileno())
                return
            except OSError:
                reflink[0] = False  # ext4, tmpfs, another filesystem: copy from now on
    shutil.copyfile(src, dst, follow_symlinks=False)


def _copy_tree(src: Path, dst: Path) -> None:
    """A real copy (new inodes), with each file's mode: what the baked trees link to.
    Files are copied by several threads, as the kernel copies them (``sendfile``) without
    the GIL: the 0.8 GB vLLM tree took 3.3-4.2 s one file at a time, 2.1-2.5 s so."""
    reflink = [True]
    files = []
    for dirpath, _, filenames in os.walk(src):
        rel = os.path.relpath(dirpath, src)
        out = dst / rel if rel != "." else dst
        out.mkdir(parents=True, exist_ok=True)
        files += [(os.path.join(dirpath, name), out / name) for name in filenames]

    def copy(pair: tuple[str, Path]) -> None:
        source, target = pair
        _clone_file(source, target, reflink)
        os.chmod(target, os.stat(source).st_mode & 0o777)

    with ThreadPoolExecutor(_COPY_THREADS) as pool:
        # The first failure is raised here, and map cancels the copies not yet started.
        for _ in pool.map(copy, files):
            pass


def _recopy(source: Path, root: Path, moved: list[str]) -> None:
    """Put the cache's bytes back for each moved file, as a new inode: the baked tree
    that shares the edited one keeps its edit (``refresh`` sees it as one)."""
    for rel in moved:
        target = inside(root, rel)
        if not (source / rel).is_file():
            target.unlink(missing_ok=True)
            continue
        tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}")
        _clone_file(str(source / rel), tmp, [True])
        os.chmod(tmp, (source / rel).stat().st_mode & 0o777)
        os.replace(tmp, target)
    write_atomic(_stamp_path(root), stamp_bytes(root))


def own_pristine(wheel: WheelInfo, sha256: str, cache: Path, build: Path) -> Path:
    """``build``'s own copy of the pristine tree of ``wheel`` (pinned by ``sha256``), made
    once: copied from the cache, or extracted straight from the wheel by the first build
    folder to ask (module docstring); never a link into the shared cache. Each file moved
    since its stamp is copied again from the cache first."""
    root = own_copy(build, sha256)
    moved = _moved_since_extraction(root)
    if moved == []:
        return root
    if moved:
        warn(
            f"{len(moved)} file(s) of {root} changed through a hard link from a baked tree "
            f"(first {moved[0]}); copied again from the cache, which the edit never reached"
        )
        _recopy(pristine(wheel, sha256, cache), root, moved)
        return root
    folder = own_folder(root.parent)
    sweep_dead(folder)  # a killed copy's leftovers
    remove_tree(root)
    _stamp_path(root).unlink(missing_ok=True)
    tmp = folder / f".{sha256[:16]}.tmp-{os.getpid()}"
    remove_tree(tmp)
    source = _shared_source(wheel, sha256, cache)
    try:
        if source is None:
            with step(f"extracting {wheel.path.name} into {folder}"):
                _write_errata(root, extract(wheel, tmp))
        else:
            with step(f"copying the pristine tree into {folder}"):
                _copy_tree(source, tmp)
            if _errata_path(source).is_file():  # else record_errata_of reads the wheel
                write_atomic(_errata_path(root), _errata_path(source).read_bytes())
        stamp_tmp = stage_beside(
            _stamp_path(root),
            stamp_bytes(tmp),
            suffix=f".tmp-{os.getpid()}",
        )
    except BaseException:
        remove_tree(tmp)
        raise
    try:
        os.rename(tmp, root)
    except OSError:  # another command of this build folder copied it first: use that
        remove_tree(tmp)
        stamp_tmp.unlink()
        return root
    os.replace(stamp_tmp, _stamp_path(root))  # last: a copy without its stamp is redone
    return root


def compared_pristine(sha256: str, cache: Path, build: Path) -> Path | None:
    """The pristine tree to compare ``build``'s trees with, offline and read-only: its own
    copy while the copy's stamp holds (its files are the trees' untouched files, so they
    compare by inode), else the cache's while its stamp holds; None if neither does (the
    next bake copies the own one again)."""
    for root in (own_copy(build, sha256), cache / "pristine" / sha256):
        if _moved_since_extraction(root) == []:
            return root
    return None
