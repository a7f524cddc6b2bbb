"""Housekeeping: what `bakery clean` removes from a build folder and from the cache.

A build folder keeps, by default, each baked tree and the wheel its BAKED.json names;
superseded wheels of the series, the reports of `rebase` and `rebase-matrix`, the trash
of earlier swaps and the partial files of killed runs go. ``everything`` takes the baked
trees and wheels too. The cache keeps the wheels, pristine trees and linkcheck sources
whose sha256 is still wanted (the series' pins, the bakes in the build folder, a rebase
in progress); the rest goes. Only entries named as bakery names them are touched (a
sha256 folder, a wheel of the series), a symlink is never followed or removed, and
nothing outside the folder being cleaned is read or written.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from packaging.utils import InvalidWheelFilename, parse_wheel_filename
from packaging.version import Version

from bakery.bake import manifest
from bakery.bake.bake import baked_wheel, build_lock
from bakery.errors import BakeryError
from bakery.series.series import Pin
from bakery.tree import sweep_dead

__all__ = ["Removal", "build_garbage", "cache_garbage", "wanted_hashes", "remove"]

_SHA = re.compile(r"^[0-9a-f]{64}(\.stamp\.json|\.record\.json|\.asked)?$")
_REPORTS = ("rebase", "matrix")  # `rebase --out` and `rebase-matrix --out` defaults
_LOCK = ".bake.lock"


@dataclass(frozen=True)
class Removal:
    path: Path
    size: int  # bytes freed: files with no other hard link (a baked tree shares its copy's)
    why: str


def _freed(path: Path) -> int:
    if path.is_symlink() or not path.exists():
        return 0
    if path.is_file():
        info = path.stat()
        return info.st_size if info.st_nlink == 1 else 0
    total = 0
    for dirpath, _, names in os.walk(path):
        for name in names:
            info = os.lstat(os.path.join(dirpath, name))
            total += info.st_size if info.st_nlink == 1 else 0
    return total


def _baked_manifests(build: Path) -> list[manifest.BakedManifest]:
    out = []
    for path in sorted(build.glob(f"baked*/{manifest.MANIFEST}")):
        try:
            out.append(manifest.load(path))
        except BakeryError:
            continue  # a damaged tree: its wheel is not named, its tree stays
    return out


def _series_wheel(name: str, label: str) -> bool:
    try:
        _, version, _, _ = parse_wheel_filename(name)
    except InvalidWheelFilename:
        return False
    return (version.local or "").rpartition(".")[0] == label


def build_garbage(build: Path, series_name: str, everything: bool = False) -> list[Removal]:
    """What `bakery clean` (``everything``: `--all`) removes from ``build``."""
    if not build.is_dir():
        return []
    if everything:
        entries = [p for p in sorted(build.iterdir()) if p.name != _LOCK]
        return [Removal(p, _freed(p), "build output") for p in entries if not p.is_symlink()]
    out = []
    current = {baked_wheel(build, data) for data in _baked_manifests(build)}
    label = str(Version(f"0+{series_name}.0").local).rpartition(".")[0]
    dist = build / "dist"
    for path in sorted(dist.glob("*.whl")) if dist.is_dir() else []:
        if path not in current and _series_wheel(path.name, label) and not path.is_symlink():
            out.append(Removal(path, _freed(path), "a wheel no baked tree names"))
    for name in _REPORTS:
        path = build / name
        if path.is_dir() and not path.is_symlink():
            out.append(Removal(path, _freed(path), f"`bakery {name}` reports"))
    bases = {data.base.sha256 for data in _baked_manifests(build)}
    for path in sorted((build / ".pristine").iterdir()) if (build / ".pristine").is_dir() else []:
        if _SHA.match(path.name) and path.name[:64] not in bases and not path.is_symlink():
            out.append(Removal(path, _freed(path), "a pristine copy no baked tree links to"))
    for path in sorted(build.glob(".trash*")):
        if not path.is_symlink():
            out.append(Removal(path, _freed(path), "trash of an earlier swap"))
    return out


def wanted_hashes(pins: list[Pin], build: Path, extra: list[str] | None = None) -> set[str]:
    """The sha256s the cache must keep: ``pins`` (the series'), the bases of the bakes in
    ``build``, and ``extra`` (a rebase's pins)."""
    keep = {pin.sha256 for pin in pins} | set(extra or [])
    keep |= {data.base.sha256 for data in _baked_manifests(build)}
    return keep


def cache_garbage(cache: Path, keep: set[str]) -> list[Removal]:
    """The cache's wheels, pristine trees and sources whose sha256 is not in ``keep``."""
    out = []
    for kind in ("wheels", "pristine", "sources"):
        folder = cache / kind
        if not folder.is_dir() or folder.is_symlink():
            continue
        for path in sorted(folder.iterdir()):
            if not _SHA.match(path.name) or path.is_symlink():
                continue
            if path.name[:64] not in keep:
                out.append(Removal(path, _freed(path), f"{kind} of a sha256 no pin wants"))
    return out


def remove(removals: list[Removal], build: Path | None = None) -> None:
    """Remove each entry (under the build lock when ``build`` is given); partial files
    of killed runs in ``build`` go too."""
    with build_lock(build) if build is not None else contextlib.nullcontext():
        for removal in removals:
            path = removal.path
            if path.is_symlink():
                continue
            if path.is_dir():
                shutil.rmtree(path)
            else:
                path.unlink(missing_ok=True)
        if build is not None:
            for folder in (build, build / "dist"):
                sweep_dead(folder)
