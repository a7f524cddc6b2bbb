"""Housekeeping: what `bakery clean` removes from a build folder and from the cache.

A build folder keeps, by default, each baked tree and the wheel its BAKED.json names;
superseded wheels of the series, the reports of `rebase` and `rebase-matrix`, the trash
of earlier swaps and the partial files of killed runs go. ``everything`` takes the baked
trees, their records and the series' wheels too. The cache keeps the wheels, pristine
trees and linkcheck sources whose sha256 is still wanted (the series' pins, the bakes in
the build folder, a rebase in progress); the rest goes. Only entries named as bakery
names them are touched (a sha256 folder, a wheel of the series, a report file): the
rerere records, tiny models and anything else stay. A symlink is never followed or
removed, and a folder that holds no ``.bake.lock`` is not a build folder (refused).
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from packaging.utils import InvalidWheelFilename, parse_wheel_filename
from packaging.version import Version

from bakery.bake import manifest
from bakery.bake.bake import baked_wheel, build_lock, superseded_wheels
from bakery.errors import BakeryError, UsageError
from bakery.series.series import Pin
from bakery.tree import sweep_dead

__all__ = [
    "Removal",
    "Plan",
    "check_build_folder",
    "build_garbage",
    "cache_garbage",
    "wanted_hashes",
    "remove",
]

_SHA = re.compile(r"^[0-9a-f]{64}(\.stamp\.json|\.record\.json|\.asked)?$")
_TREE = re.compile(r"^baked(-[A-Za-z0-9_.-]+)?$")  # bake.tree_dir
_TREE_RECORD = re.compile(r"^\.baked(-[A-Za-z0-9_.-]+)?\.(stamp|wheel)\.json$")  # beside it
_REBASE_REPORT = "rebase.json"  # in each `rebase --out` folder: the mark that it is ours
_MATRIX_FILES = ("matrix.json", "matrix.md")  # what `rebase-matrix --out` writes
_LOCK = ".bake.lock"  # every bake, rebase step and clean takes it: the build folder's mark


@dataclass(frozen=True)
class Removal:
    path: Path
    size: int  # bytes freed: files with no other hard link (a baked tree shares its copy's)
    why: str


@dataclass
class Plan:
    """What clean removes, and the symlinks it found where bakery writes a folder or
    file (left alone: removing through one would delete another folder's files)."""

    removals: list[Removal] = field(default_factory=list)
    links: list[Path] = field(default_factory=list)

    def add(self, path: Path, why: str) -> None:
        if path.is_symlink():
            self.links.append(path)
        elif path.exists():
            self.removals.append(Removal(path, _freed(path), why))

    def folder(self, path: Path) -> bool:
        """Whether ``path`` is a real folder to look into (a symlink is noted, not followed)."""
        if path.is_symlink():
            self.links.append(path)
            return False
        return path.is_dir()


def _freed(path: Path) -> int:
    if path.is_file():
        info = path.stat()
        return info.st_size if info.st_nlink == 1 else 0
    total = 0
    for dirpath, _, names in os.walk(path):
        for name in names:
            info = os.lstat(os.path.join(dirpath, name))
            total += info.st_size if info.st_nlink == 1 else 0
    return total


def check_build_folder(build: Path, default: bool) -> None:
    """Refuse a folder bakery did not make a build folder (``default``: the project's
    own build/ is one): clean must never empty a checkout named by mistake."""
    lock = build / _LOCK
    if default or not build.exists() or (lock.is_file() and not lock.is_symlink()):
        return
    raise UsageError(
        f"not a bakery build folder (it holds no {_LOCK}): {str(build)!r}",
        hint="name a folder `bakery bake --build DIR` baked into, or clean the default build/",
    )


def _baked_manifests(build: Path) -> list[manifest.BakedManifest]:
    out = []
    for path in sorted(build.iterdir()):
        if _TREE.match(path.name) and not path.is_symlink() and path.is_dir():
            try:
                out.append(manifest.load(path / manifest.MANIFEST))
            except BakeryError:
                continue  # a damaged tree: its wheel is not named, its tree stays
    return out


def _series_wheel(name: str, label: str) -> bool:
    try:
        _, version, _, _ = parse_wheel_filename(name)
    except InvalidWheelFilename:
        return False
    return (version.local or "").rpartition(".")[0] == label


def build_garbage(
    build: Path,
    series_name: str,
    everything: bool = False,
    *,
    series_files: tuple[str, ...] = (),
    saved: Path | None = None,
    keep_bases: frozenset[str] = frozenset(),
) -> Plan:
    """What `bakery clean` (``everything``: `--all`) removes from ``build``.

    A bisect bake's tree (its patches a strict prefix of ``series_files``) names a wheel
    no bake writes: the wheel of its base the last whole bake wrote is kept for it. A
    rebase in progress keeps the tree it set aside (``saved``: its wheel and pristine copy,
    which ``--abort`` puts back) and the pristine copies of ``keep_bases`` (the release
    its checkout links to)."""
    plan = Plan()
    if not plan.folder(build):
        return plan
    bakes = _baked_manifests(build)
    if saved is not None and not saved.is_symlink() and saved.is_dir():
        try:
            bakes.append(manifest.load(saved / manifest.MANIFEST))
        except BakeryError:
            pass  # no saved bake to keep a wheel for (its tree itself is never touched)
    current = set() if everything else {baked_wheel(build, data) for data in bakes}
    for data in [] if everything else bakes:
        files = tuple(p.file for p in data.patches)
        named = baked_wheel(build, data)
        if named and len(files) < len(series_files) and series_files[: len(files)] == files:
            current |= set(superseded_wheels(build / "dist", named.name, series_name))
    label = str(Version(f"0+{series_name}.0").local).rpartition(".")[0]
    if plan.folder(build / "dist"):
        for path in sorted((build / "dist").glob("*.whl")):
            if path not in current and _series_wheel(path.name, label):
                plan.add(path, "a wheel of the series" if everything else "a superseded wheel")
    if plan.folder(build / "rebase"):
        for path in sorted((build / "rebase").iterdir()):
            if not path.is_symlink() and (path / _REBASE_REPORT).is_file():
                plan.add(path, "a `bakery rebase` report")
    if plan.folder(build / "matrix"):
        for name in _MATRIX_FILES:
            plan.add(build / "matrix" / name, "a `bakery rebase-matrix` report")
    bases = set() if everything else {data.base.sha256 for data in bakes} | keep_bases
    if plan.folder(build / ".pristine"):
        for path in sorted((build / ".pristine").iterdir()):
            if _SHA.match(path.name) and path.name[:64] not in bases:
                plan.add(path, "a pristine copy no baked tree links to")
    plan.add(build / ".trash", "trash of an earlier swap")
    if everything:
        for path in sorted(build.iterdir()):
            if _TREE_RECORD.match(path.name):
                plan.add(path, "a baked tree's record")
            elif _TREE.match(path.name) and (path / manifest.MANIFEST).is_file():
                plan.add(path, "a baked tree")  # a bake swaps a tree in with its BAKED.json
    return plan


def wanted_hashes(pins: list[Pin], build: Path, extra: list[str] | None = None) -> set[str]:
    """The sha256s the cache must keep: ``pins`` (the series'), the bases of the bakes in
    ``build``, and ``extra`` (a rebase's pins)."""
    keep = {pin.sha256 for pin in pins} | set(extra or [])
    if build.is_dir():
        keep |= {data.base.sha256 for data in _baked_manifests(build)}
    return keep


def cache_garbage(cache: Path, keep: set[str]) -> Plan:
    """The cache's wheels, pristine trees and sources whose sha256 is not in ``keep``."""
    plan = Plan()
    for kind in ("wheels", "pristine", "sources"):
        if not plan.folder(cache / kind):
            continue
        for path in sorted((cache / kind).iterdir()):
            if _SHA.match(path.name) and path.name[:64] not in keep:
                plan.add(path, f"{kind} of a sha256 no pin wants")
    return plan


def remove(removals: list[Removal], build: Path | None = None) -> Iterator[Removal]:
    """Remove each entry, yielding it once it is gone (under the build lock when ``build``
    is given: taken before the first removal, so a running bake refuses them all); then
    the partial files of killed runs in ``build`` and the folders left empty."""
    if build is None:
        yield from _remove_each(removals)
        return
    with build_lock(build):
        yield from _remove_each(removals)
        for folder in (build, build / "dist"):
            if not folder.is_symlink():
                sweep_dead(folder)
        for name in ("dist", "rebase", "matrix", ".pristine"):
            folder = build / name
            if not folder.is_symlink() and folder.is_dir() and not any(folder.iterdir()):
                folder.rmdir()


def _remove_each(removals: list[Removal]) -> Iterator[Removal]:
    for removal in removals:
        path = removal.path
        if path.is_symlink():
            continue  # put there since the plan: never followed
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink(missing_ok=True)
        yield removal
