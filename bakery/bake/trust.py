"""Trust records: a large file trusted by its stat once its bytes were vouched for.

Hashing a 330 MB wheel costs about half a second, and writing one about as much. A record
keeps what vouched for a file (``sha256``: the file's own sha256 for a fetched wheel, the
sha256 of everything its bytes follow from for the wheel a bake wrote) and the file's
device, inode, size, mtime and ctime at that moment. While all five still match, the file
is trusted without reading it, as git's index trusts an unchanged file. A touch, a rewrite
(also one whose mtime is put back with utime: that moves the ctime, which no call can set)
or another file put in its place (``cp -p`` keeps size and mtime, not the inode) breaks it;
a missing, damaged or hostile record (a symlink, a FIFO, a folder, a huge file, wrong
types, one of older bakery without ctime) is no trust, never an error. A record is only
ever written below its ``root``.

A rewrite in the same timestamp tick as the stat keeps the mtime (git's "racily clean"
files; a tick is 2 s on FAT), so a record is only of a file whose mtime is older than
``RACY_NS`` before its stat: a file bakery did not write is recorded only then; one it
wrote itself gets its mtime set that far back first (``settle``).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import msgspec

from bakery.errors import UnsafePathError
from bakery.schema import Document, encode_json
from bakery.tree import own_path, read_bounded, stage_beside

__all__ = ["Record", "RACY_NS", "seen", "trusted", "remember", "settle"]

RACY_NS = 2_000_000_000


class Record(Document, frozen=True):
    """A file as it was when its bytes were vouched for as ``sha256``."""

    sha256: str
    st_dev: int
    st_ino: int
    st_size: int
    st_mtime_ns: int
    st_ctime_ns: int  # required: a record without it (older bakery's) vouches for nothing


def seen(path: Path, sha256: str) -> Record:
    st = os.stat(path)  # through a symlink: the file that is read
    return Record(sha256, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def trusted(record: Path, path: Path, sha256: str) -> bool:
    """Whether ``record`` vouches for ``path`` as ``sha256``: the same sha256, device,
    inode, size, mtime and ctime (anything unreadable or odd: no)."""
    try:
        if record.is_symlink():
            return False
        kept = msgspec.json.decode(read_bounded(record, 4096), type=Record, strict=True)
        return kept == seen(path, sha256)
    except (OSError, msgspec.DecodeError):
        return False


def remember(record: Path, what: Record, root: Path, started_ns: int) -> None:
    """Write ``record`` (atomically, below ``root`` and through no symlinked folder) for a
    file stat'ed as ``what`` at ``started_ns``, unless its mtime is too recent to tell a
    same-tick rewrite apart. A read-only or full disk writes nothing: the file is only
    read (or written) again next time."""
    if what.st_mtime_ns > started_ns - RACY_NS:
        return
    try:
        folder = own_path(root, os.path.relpath(record.parent, root), "trust record folder")
        data = encode_json(what, one_line=True)  # compact ones of older bakery read alike
        tmp = stage_beside(folder / record.name, data, 0o644, f".tmp-{os.getpid()}")
    except (OSError, UnsafePathError):
        return
    try:
        os.replace(tmp, folder / record.name)  # replaces a symlink there, never its target
    except OSError:  # a folder in its place
        tmp.unlink(missing_ok=True)


def settle(path: Path) -> int:
    """Set the mtime of a file bakery just wrote past the racy window, so that its record
    holds at once and any later write moves it; the time to pass to ``remember``."""
    now = time.time_ns()
    os.utime(path, ns=(now - RACY_NS - 1_000_000_000,) * 2)
    return now
