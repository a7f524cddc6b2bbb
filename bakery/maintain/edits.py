"""A baked tree's edits: which files differ from the pristine base, and whether a tree
reads as a series makes it (the proof that the series reproduces the tree, one place for
refresh, its ``--no-bake`` record and the rebase loop's ``--continue``).

Stray files (``*.orig``, ``*.rej``, editor swap and backup files) never count as edits;
an entry no text patch can carry (a symlink, a binary file, a folder where the base has a
file) is refused with every such entry named.
"""

from __future__ import annotations

import filecmp
import fnmatch
import os
import re
import stat
from collections.abc import Mapping
from pathlib import Path

from bakery.errors import BakeryError, UnsafePathError
from bakery.tree import read_bounded, read_file

__all__ = ["is_stray", "differing_files", "check_reproduced"]

# Left behind by GNU patch (.orig, .rej), vim (.swp...), emacs (~, #x#, .#x) and
# by hand (.bak): never part of the series, whatever the tree they sit in.
_STRAY = ("*.orig", "*.rej", "*~", "*.bak", ".*.sw?", "#*#", ".#*")


def is_stray(rel: str) -> bool:
    name = rel.rsplit("/", 1)[-1]
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in _STRAY)


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


def check_reproduced(expected: Mapping[str, bytes | None], package: Path, failure: str) -> None:
    """Raise ``failure`` (a bug) with the files of ``package`` that do not read as
    ``expected`` says (None: absent): the proof that a series reproduces a tree, made
    after a re-bake against the edits, and by ``refresh --no-bake`` before recording."""
    lost = sorted(p for p, data in expected.items() if read_file(package, p) != data)
    if lost:
        raise BakeryError(f"{failure} (a bug): {lost!r}")
