"""Directory trees on disk: safe paths, atomic writes (bytes, text, JSON), clones and swaps.

Nothing here knows about diffs or wheels. Every path a patch names goes
through ``inside`` before it is read or written, so a ``..``, an absolute path
or a symlink pointing out of the tree is refused before any byte moves.
"""

from __future__ import annotations

import ctypes
import errno
import hashlib
import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

from bakery.errors import InputTooLarge, UnsafePathError

__all__ = [
    "sha256_file",
    "relative",
    "inside",
    "read_file",
    "own_path",
    "own_folder",
    "open_own",
    "read_bounded",
    "stage_beside",
    "write_atomic",
    "write_text_atomic",
    "clone_tree",
    "swap_into_place",
    "replace_files",
    "empty_trash",
    "remove_tree",
    "sweep_dead",
    "stamp",
]


def relative(rel: str) -> str:
    """``rel`` itself, if it is a relative path that cannot leave whatever root it joins."""
    if not rel or os.path.isabs(rel) or ".." in rel.split("/") or "\0" in rel:
        raise UnsafePathError(f"path leaves the tree (refused): {rel!r}")
    return rel


def inside(root: Path, rel: str) -> Path:
    """``root/rel``, refusing anything whose real path leaves ``root``."""
    relative(rel)
    real_root = os.path.realpath(root)
    target = os.path.realpath(os.path.join(real_root, rel))
    if os.path.commonpath([real_root, target]) != real_root:
        raise UnsafePathError(
            f"path resolves outside the tree through a symlink (refused): {rel!r}"
        )
    return Path(root) / rel


def own_path(root: Path, rel: str, what: str = "path") -> Path:
    """``root/rel`` for a name read back from our own files (state, stamps, records, matrix
    names): relative, no ``..``, and no symlink anywhere below ``root`` (followed or not),
    so nothing moved, written or deleted through it can land outside ``root``. Checked
    before the caller moves anything."""
    if not isinstance(rel, str) or any(c in rel for c in "\n\r\t\\") or rel != rel.strip():
        raise UnsafePathError(f"{what} is not a plain name (refused): {rel!r}")
    try:
        relative(rel)
    except UnsafePathError:
        raise UnsafePathError(f"{what} leaves {root} (refused): {rel!r}") from None
    path = Path(root)
    for part in Path(rel).parts:
        path = path / part
        if path.is_symlink():
            raise UnsafePathError(f"{what} is reached through a symlink (refused): {str(path)!r}")
    return path


def own_folder(path: Path) -> Path:
    """``path`` as a real folder of ours (made if missing); a symlink or a file there is
    refused, so what we move into it (old trees, wheels) stays where we put it."""
    if not path.is_symlink():
        path.mkdir(parents=True, exist_ok=True)
    if path.is_symlink() or not path.is_dir():
        raise UnsafePathError(
            f"{str(path)!r} is a symlink or not a folder (refused)",
            hint=f"remove {path}: bakery makes it again",
        )
    return path


def open_own(path: Path) -> int:
    """A read-write fd on our own small file (a lock), made if missing; a symlink, a FIFO
    or a device there is refused, never followed or truncated."""
    flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(path, flags, 0o644)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENXIO, errno.EISDIR):
            raise UnsafePathError(
                f"{str(path)!r} is a symlink or not a regular file (refused)",
                hint=f"remove {path}: bakery makes it again",
            ) from None
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise UnsafePathError(
            f"{str(path)!r} is not a regular file (refused)",
            hint=f"remove {path}: bakery makes it again",
        )
    return fd


MAX_READ = 64 << 20  # no file bakery reads as a document is near this


def read_bounded(path: Path, limit: int = MAX_READ) -> bytes:
    """The bytes of the regular file at ``path``, opened non-blocking (a FIFO never
    hangs the reader) and read to at most ``limit`` bytes (a symlink to /dev/zero never
    fills memory). A folder raises ``IsADirectoryError``, a FIFO or a device
    ``OSError(EINVAL)`` ("not a regular file"), a larger file ``InputTooLarge(EFBIG)``."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(path))
        if not stat.S_ISREG(mode):
            raise OSError(errno.EINVAL, "not a regular file", str(path))
        chunks, size = [], 0
        while size <= limit:
            chunk = os.read(fd, min(1 << 20, limit + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if size > limit:
            raise InputTooLarge(errno.EFBIG, f"larger than {limit} bytes", str(path))
        return b"".join(chunks)
    finally:
        os.close(fd)


def read_file(root: Path, rel: str) -> bytes | None:
    """The file's bytes, or None when it does not exist."""
    path = inside(root, rel)
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return None
    except IsADirectoryError:
        raise UnsafePathError(f"path is a directory, not a file: {rel!r}") from None


def stage_beside(path: Path, data: bytes, mode: int | None = None, suffix: str = "") -> Path:
    """A temp file beside ``path`` holding ``data``, ready to be renamed over it (the
    caller renames or removes it). ``mode`` defaults to ``path``'s own, else 0644; the
    temp file is removed if anything fails."""
    if mode is None:
        try:
            mode = path.stat().st_mode & 0o777
        except FileNotFoundError:
            mode = 0o644
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=suffix, dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.chmod(tmp, mode)
    except BaseException:
        os.unlink(tmp)
        raise
    return Path(tmp)


def sha256_file(path: Path) -> str:
    with open(path, "rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def write_atomic(path: Path, data: bytes, mode: int | None = None) -> None:
    """Write via a temp file in the same folder and rename: always a new inode,
    so a hard link to the old content (the pristine cache) is never written through.
    A failure leaves the old file as it was and no temp file behind; a kill leaves one
    named for its pid, which ``sweep_dead`` clears."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = stage_beside(path, data, mode, f".tmp-{os.getpid()}")  # a killed run's: swept
    try:
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_text_atomic(path: Path, text: str) -> None:
    """``text`` as UTF-8 through ``write_atomic``: ``path`` is either old or complete."""
    write_atomic(path, text.encode("utf-8"))


def clone_tree(src: Path, dst: Path, *, skip: frozenset[str] = frozenset()) -> None:
    """Recreate ``src`` at ``dst`` with hard links (a copy where linking fails).

    ``skip`` lists relative paths the caller writes itself (patched files).
    Creating thousands of files costs seconds here; linking them costs a tenth."""
    top, out = os.fspath(src), os.fspath(dst)
    os.makedirs(out, exist_ok=True)
    for dirpath, dirnames, filenames in os.walk(top):  # str paths: a warm rebake links
        dirnames.sort()  # 5000 files, and Path objects cost as much as the links
        rel_dir = dirpath[len(top) + 1 :]
        out_dir = os.path.join(out, rel_dir) if rel_dir else out
        if rel_dir:
            os.makedirs(out_dir, exist_ok=True)
        for name in sorted(filenames):
            if skip and (f"{rel_dir}/{name}" if rel_dir else name) in skip:
                continue
            source, target = f"{dirpath}/{name}", f"{out_dir}/{name}"
            try:
                os.link(source, target)
            except OSError:  # another filesystem
                shutil.copy2(source, target)


def stamp(root: Path) -> dict[str, tuple[int, int]]:
    """path -> (size, mtime_ns) of every file: a write through a hard link into
    the pristine cache changes the shared inode's mtime, so this detects it."""
    out: dict[str, tuple[int, int]] = {}
    pending = [("", os.fspath(root))]
    while pending:
        prefix, folder = pending.pop()
        with os.scandir(folder) as entries:
            for entry in entries:
                if entry.is_dir(follow_symlinks=False):
                    pending.append((f"{prefix}{entry.name}/", entry.path))
                else:
                    st = entry.stat(follow_symlinks=False)
                    out[prefix + entry.name] = (st.st_size, st.st_mtime_ns)
    return out


_RENAME_EXCHANGE = 2


def _exchange(a: Path, b: Path) -> bool:
    """Atomically swap two paths (Linux renameat2); False if unsupported."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd = -100
    rc = renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), _RENAME_EXCHANGE)
    if rc == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP):
        return False
    raise OSError(err, os.strerror(err), str(b))


def swap_into_place(new: Path, final: Path, trash: Path) -> None:
    """Make ``new`` appear at ``final`` in one step; the old one goes to ``trash``.

    With RENAME_EXCHANGE there is no instant at which ``final`` is missing or
    half-written: a kill leaves either the old or the new tree (or file)."""
    own_folder(trash)
    old = trash / f"{final.name}-{uuid.uuid4().hex[:12]}"
    if final.exists() and _exchange(new, final):
        os.rename(new, old)  # ``new`` now holds the old one
    elif final.exists():
        os.rename(final, old)
        os.rename(new, final)
    else:
        os.rename(new, final)


def replace_files(folder: Path, changes: dict[str, bytes | None]) -> None:
    """Write (bytes) and delete (None) several files of ``folder`` all or nothing: the
    changes go into a hard-linked clone beside it, which is exchanged with ``folder`` in
    one rename; a fault or a kill before it leaves ``folder`` as it was, after it as
    asked (a killed run's clone, ``.<name>.new-<pid>``, is swept by ``sweep_dead``)."""
    names = {own_path(folder, name, "file name"): data for name, data in changes.items()}
    sweep_dead(folder.parent)
    staging = folder.with_name(f".{folder.name}.new-{os.getpid()}")
    remove_tree(staging)
    try:
        shutil.copytree(folder, staging, symlinks=True, copy_function=os.link)
        for path, data in names.items():
            target = staging / path.relative_to(folder)
            if data is None:
                target.unlink(missing_ok=True)
            else:
                write_atomic(target, data)
        if _exchange(staging, folder):
            return  # ``staging`` holds the old files now: removed below
        for path, data in names.items():  # no renameat2: file by file, writes first
            if data is not None:
                write_atomic(path, data)
        for path, data in names.items():
            if data is None:
                path.unlink(missing_ok=True)
    finally:
        remove_tree(staging)


def empty_trash(trash: Path) -> None:
    """Delete ``trash`` in a detached child: the old tree is garbage once swapped
    out, and unlinking thousands of entries would double a rebake's time. It is
    renamed first, so the next bake never shares a folder with that child."""
    if not trash.is_symlink() and trash.is_dir() and any(trash.iterdir()):
        doomed = trash.with_name(f"{trash.name}-{uuid.uuid4().hex[:12]}.tmp-{os.getpid()}")
        os.rename(trash, doomed)
        trash = doomed
        subprocess.Popen(
            [
                sys.executable,
                "-c",
                "import shutil, sys; shutil.rmtree(sys.argv[1], True)",
                str(trash),
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )


def remove_tree(path: Path) -> None:
    if path.exists():
        shutil.rmtree(path)


# What a process writes before its rename: ".<name>.tmp-<pid>" or ".<name>.new-<pid>".
_PARTIAL = re.compile(r"^\..+\.(?:tmp|new)-(?P<pid>\d+)$")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, OverflowError):  # gone, or never a pid at all
        return False
    except PermissionError:  # someone else's live process
        return True
    return True


def sweep_dead(folder: Path, trash: Path | None = None) -> list[Path]:
    """Clear the partial files and trees in ``folder`` left by killed processes: moved
    into ``trash`` when given (for ``empty_trash``), else removed here.

    Only entries whose writer's pid is dead go: a live writer (another bake, another
    checkout sharing the cache) keeps its work in progress."""
    swept = []
    for entry in sorted(folder.glob(".*")) if folder.is_dir() else []:
        match = _PARTIAL.match(entry.name)
        if not match or int(match["pid"]) == os.getpid() or _alive(int(match["pid"])):
            continue
        if trash is not None:
            own_folder(trash)
            os.rename(entry, trash / f"{entry.name}-{uuid.uuid4().hex[:12]}")
        elif entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)
        swept.append(entry)
    return swept
