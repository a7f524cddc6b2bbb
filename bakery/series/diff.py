"""Unified diffs in and out: the one module that knows the format.

Parsing goes through unidiff and is converted, at this border, into bakery's
own frozen types (``Patch`` -> ``FilePatch`` -> ``Hunk`` -> ``HunkLine``); the
rest of bakery never sees unidiff. ``render_file_diff`` writes the canonical
form the series stores (``--- baked-ours/P`` / ``+++ baked/P``, 3 lines of
context, no timestamps, final newline).
"""

from __future__ import annotations

import difflib
import hashlib
import os
import posixpath
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from unidiff import PatchSet
from unidiff.errors import UnidiffParseError

from bakery.errors import PatchParseError, UnsafePathError

__all__ = [
    "HunkLine",
    "Hunk",
    "FilePatch",
    "Patch",
    "parse_patch",
    "parse_renames",
    "read_patch",
    "render_file_diff",
    "split_lines",
    "OLD_PREFIX",
    "NEW_PREFIX",
]

DEV_NULL = "/dev/null"
# Header prefixes of the series' own diffs (the seed's convention): the first
# path component is thrown away on apply, so these only need to be stable.
OLD_PREFIX = "baked-ours/"
NEW_PREFIX = "baked/"
CONTEXT_LINES = 3
# Lossless bytes <-> str for unidiff, which only parses text.
_CODEC = ("utf-8", "surrogateescape")
# A bound on what is read as a diff (``/dev/zero`` never ends); the largest
# file vLLM ships is well under 1 MiB, so a real series never comes near it.
MAX_PATCH_BYTES = 64 << 20
# GNU patch refuses line numbers that do not fit its LINENUM ("is too large").
MAX_LINE_NUMBER = 2**63 - 1
# GNU patch strips every line's trailing CR once a file's ``---``/``+++``
# header lines both end in CRLF ("Stripping trailing CRs from patch").
_ADDED, _REMOVED, _MARKER = b"+-\\"
_KINDS = {_ADDED: "+", _REMOVED: "-"}
# unidiff's RE_HUNK_HEADER, over bytes.
_HUNK_HEADER = re.compile(rb"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@", re.MULTILINE)
_HEADERS = re.compile(rb"^--- [^\n]*\n\+\+\+ [^\n]*\n", re.MULTILINE)


def split_lines(data: bytes) -> list[bytes]:
    """Split on LF only, keeping the line endings (a lone CR is not a break)."""
    if b"\r" not in data:
        return data.splitlines(keepends=True)  # same result without a CR, at C speed
    lines = data.split(b"\n")
    last = lines.pop()
    out = [line + b"\n" for line in lines]
    if last:
        out.append(last)
    return out


@dataclass(frozen=True, slots=True)  # millions of them for a large diff
class HunkLine:
    kind: str  # " " context, "-" removed, "+" added
    text: bytes  # without the line ending
    eol: bytes  # b"\n", b"\r\n", or b"" ("\ No newline at end of file")

    @property
    def raw(self) -> bytes:
        return self.text + self.eol


@dataclass(frozen=True)
class Hunk:
    number: int  # 1-based within its file
    old_start: int
    old_len: int
    new_start: int
    new_len: int
    lines: tuple[HunkLine, ...]

    @property
    def old_lines(self) -> tuple[HunkLine, ...]:
        return tuple(line for line in self.lines if line.kind != "+")

    @property
    def new_lines(self) -> tuple[HunkLine, ...]:
        return tuple(line for line in self.lines if line.kind != "-")

    @property
    def first(self) -> int:
        """GNU patch's ``pch_first``: an empty old side means "insert after"."""
        return self.old_start + 1 if self.old_len == 0 else self.old_start

    @property
    def prefix_context(self) -> int:
        count = 0
        for line in self.lines:
            if line.kind != " ":
                break
            count += 1
        return count

    @property
    def suffix_context(self) -> int:
        count = 0
        for line in reversed(self.lines):
            if line.kind != " ":
                break
            count += 1
        return count

    def reversed(self) -> Hunk:
        swap = {"+": "-", "-": "+", " ": " "}
        return replace(
            self,
            old_start=self.new_start,
            old_len=self.new_len,
            new_start=self.old_start,
            new_len=self.old_len,
            lines=tuple(replace(line, kind=swap[line.kind]) for line in self.lines),
        )


@dataclass(frozen=True)
class FilePatch:
    old_path: str | None  # tree-relative; None for /dev/null
    new_path: str | None
    hunks: tuple[Hunk, ...]
    new_mode: int | None = None  # from a git extended header

    @property
    def path(self) -> str:
        return self.new_path if self.new_path is not None else self.old_path  # type: ignore[return-value]

    @property
    def creates(self) -> bool:
        return self.old_path is None

    @property
    def deletes(self) -> bool:
        return self.new_path is None

    def reversed(self) -> FilePatch:
        return replace(
            self,
            old_path=self.new_path,
            new_path=self.old_path,
            hunks=tuple(h.reversed() for h in self.hunks),
        )


@dataclass(frozen=True)
class Patch:
    name: str  # the patch file's name, for messages
    files: tuple[FilePatch, ...]
    sha256: str  # of the bytes as given
    missing_final_newline: bool = False

    @property
    def paths(self) -> tuple[str, ...]:
        return tuple(f.path for f in self.files)

    def reversed(self) -> Patch:
        return replace(self, files=tuple(f.reversed() for f in reversed(self.files)))


def parse_renames(specs: Iterable[str]) -> tuple[tuple[str, str], ...]:
    """``["OLD=NEW", ...]`` -> prefix renames applied to tree-relative paths."""
    out = []
    for spec in specs:
        old, sep, new = spec.partition("=")
        if not sep or not old or not new:
            raise PatchParseError(f"rename is not OLD=NEW (for example a/=b/): {spec!r}")
        out.append((old, new))
    return tuple(out)


def read_patch(path: Path) -> bytes:
    """A diff file's bytes, read up to ``MAX_PATCH_BYTES`` (a device or pipe may never end)."""
    try:
        # Opened non-blocking so a FIFO nobody writes to reads as empty instead of
        # hanging in open(); reads then block as usual (a pipe from `<(git diff)`).
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        os.set_blocking(fd, True)
        with open(fd, "rb") as handle:
            data = handle.read(MAX_PATCH_BYTES + 1)
    except OSError as exc:
        raise PatchParseError(f"cannot read patch ({exc.strerror}): {str(path)!r}") from None
    if len(data) > MAX_PATCH_BYTES:
        raise PatchParseError(
            f"patch is larger than {MAX_PATCH_BYTES >> 20} MiB (refused): {str(path)!r}",
            hint="is it a diff? split a series into one diff per file",
        )
    return data


def _tree_path(raw: str, strip: int, renames: Sequence[tuple[str, str]], patch: str) -> str | None:
    """Header path -> safe tree-relative path (None for /dev/null)."""
    raw = raw.removesuffix("\r")  # GNU ends a name at whitespace; a CRLF header leaves a CR
    if raw == DEV_NULL:
        return None
    name = raw[1:-1] if len(raw) > 1 and raw.startswith('"') and raw.endswith('"') else raw
    if "\0" in name:
        raise PatchParseError(f"{patch}: NUL byte in diff header path (refused): {name!r}")
    if name.startswith("/"):
        raise UnsafePathError(f"{patch}: absolute path in diff header (refused): {name!r}")
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise UnsafePathError(f"{patch}: '..' in diff header path (refused): {name!r}")
    if len(parts) <= strip:
        raise PatchParseError(f"{patch}: path has no component left after -p{strip}: {name!r}")
    path = "/".join(parts[strip:])
    for old, new in renames:
        if path.startswith(old):
            path = new + path[len(old) :]
            break
    normalized = posixpath.normpath(path)
    if normalized.startswith(("/", "../")) or normalized == "..":
        raise UnsafePathError(f"{patch}: rename leads outside the tree (refused): {path!r}")
    return normalized


def _read_hunk(number: int, hunk, header: re.Match[bytes] | None, data: bytes, patch: str) -> Hunk:
    """unidiff's ``hunk``, its body read from ``data`` after the ``@@`` line ``header``.

    unidiff has already checked the body against the header's counts (metadata
    only: its per-line objects cost ~400 bytes a line); this walks the same lines
    by the same rules and keeps them as bakery's own lossless bytes."""
    numbers = (hunk.source_start, hunk.source_length, hunk.target_start, hunk.target_length)
    if header is None or numbers != tuple(1 if v is None else int(v) for v in header.groups()):
        raise PatchParseError(f"{patch}: hunk #{number}: cannot find its @@ line (a bug)")
    old_start, old_len, new_start, new_len = numbers
    for value in (old_start, old_len, new_start, new_len):
        if value > MAX_LINE_NUMBER:
            raise PatchParseError(f"{patch}: hunk #{number}: line number is too large: {value}")
    lines: list[HunkLine] = []
    pos = data.index(b"\n", header.end()) + 1  # past any section text on the @@ line
    old = new = 0
    # Per-line work is what a large diff costs: bytes compared as ints, EOL split inline.
    while old < old_len or new < new_len or data.startswith(b"\\", pos):
        end = data.find(b"\n", pos) + 1 or len(data)
        if end <= pos:
            raise PatchParseError(f"{patch}: hunk #{number} is shorter than its header says")
        first = data[pos]
        if first == _MARKER:  # "\ No newline at end of file": the line before has no EOL
            if not lines:
                raise PatchParseError(f"{patch}: hunk #{number}: stray 'No newline' marker")
            lines[-1] = replace(lines[-1], eol=b"")
            pos = end
            continue
        if first == _ADDED:
            new += 1
        elif first == _REMOVED:
            old += 1
        else:  # " ", or an empty line (a context line whose space was stripped): text b""
            old, new = old + 1, new + 1
        if data[end - 2 : end] == b"\r\n":
            text, eol = data[pos + 1 : end - 2], b"\r\n"
        elif data[end - 1 : end] == b"\n":
            text, eol = data[pos + 1 : end - 1], b"\n"
        else:
            text, eol = data[pos + 1 : end], b""
        lines.append(HunkLine(_KINDS.get(first, " "), text, eol))
        pos = end
    return Hunk(
        number=number,
        old_start=old_start,
        old_len=old_len,
        new_start=new_start,
        new_len=new_len,
        lines=tuple(lines),
    )


def _text_lines(data: bytes) -> Iterator[str]:
    """``data``'s lines as text, one at a time: unidiff's own ``from_string`` holds the whole
    diff as text twice over (a 50 MB diff cost 250 MB more)."""
    pos, size = 0, len(data)
    while pos < size:
        end = data.find(b"\n", pos) + 1 or size
        yield data[pos:end].decode(*_CODEC)
        pos = end


def parse_patch(
    data: bytes,
    name: str,
    *,
    renames: Sequence[tuple[str, str]] = (),
    strip: int = 1,
) -> Patch:
    """Parse one diff file (one or more files inside) into a frozen ``Patch``."""
    missing_newline = bool(data) and not data.endswith(b"\n")
    # A diff whose own final newline was lost (the seed) means the same diff
    # with it restored; GNU patch only accepts it that way.
    body = data + b"\n" if missing_newline else data
    headers = _HEADERS.search(body)
    if headers and headers[0].count(b"\r\n") == 2:
        body = body.replace(b"\r\n", b"\n")
    try:
        patch_set = PatchSet(_text_lines(body), metadata_only=True)
    except UnidiffParseError as exc:
        raise PatchParseError(f"{name}: not a unified diff ({exc})") from None
    if b"GIT binary patch" in data or any(f.is_binary_file for f in patch_set):
        raise PatchParseError(f"{name}: binary patches are not supported (refused)")
    files = []
    # unidiff takes every line like this outside a hunk body as a hunk header, and
    # none inside one, so the matches pair with its hunks in order.
    hunk_headers = _HUNK_HEADER.finditer(body)
    for patched in patch_set:
        old = _tree_path(patched.source_file, strip, renames, name)
        new = _tree_path(patched.target_file, strip, renames, name)
        if old is None and new is None:
            raise PatchParseError(f"{name}: both sides are /dev/null")
        if old is not None and new is not None and old != new:
            raise PatchParseError(
                f"{name}: renames inside a diff are not supported (old {old!r}, new {new!r})"
            )
        if not patched:
            raise PatchParseError(f"{name}: no hunks for {new or old!r}")
        mode = patched.target_mode
        files.append(
            FilePatch(
                old_path=old,
                new_path=new,
                hunks=tuple(
                    _read_hunk(i, hunk, next(hunk_headers, None), body, name)
                    for i, hunk in enumerate(patched, 1)
                ),
                new_mode=int(mode[-3:], 8) if mode and new is not None else None,
            )
        )
    if not files:
        raise PatchParseError(f"{name}: no file diffs found (is this a unified diff?)")
    return Patch(
        name=name,
        files=tuple(files),
        sha256=hashlib.sha256(data).hexdigest(),
        missing_final_newline=missing_newline,
    )


def _range(start: int, length: int) -> str:
    # GNU diff's convention: an empty range names the line before it.
    first = start + 1
    if length == 1:
        return f"{first}"
    if length == 0:
        first -= 1
    return f"{first},{length}"


def _emit(prefix: bytes, raw: bytes) -> bytes:
    if raw.endswith(b"\n"):
        return prefix + raw
    return prefix + raw + b"\n\\ No newline at end of file\n"


def render_file_diff(path: str, old: bytes | None, new: bytes | None) -> bytes:
    """The canonical series diff of one file (b"" when nothing differs)."""
    a = split_lines(old or b"")
    b = split_lines(new or b"")
    if a == b and (old is None) == (new is None):
        return b""
    header = b"--- " + (OLD_PREFIX + path if old is not None else DEV_NULL).encode(*_CODEC)
    header += b"\n+++ " + (NEW_PREFIX + path if new is not None else DEV_NULL).encode(*_CODEC)
    out = [header + b"\n"]
    # autojunk off: minimal, stable hunks even for files with many blank lines.
    matcher = difflib.SequenceMatcher(None, a, b, autojunk=False)
    for group in matcher.get_grouped_opcodes(CONTEXT_LINES):
        i1, i2, j1, j2 = group[0][1], group[-1][2], group[0][3], group[-1][4]
        out.append(f"@@ -{_range(i1, i2 - i1)} +{_range(j1, j2 - j1)} @@\n".encode())
        for tag, x1, x2, y1, y2 in group:
            if tag == "equal":
                out.extend(_emit(b" ", raw) for raw in a[x1:x2])
                continue
            out.extend(_emit(b"-", raw) for raw in a[x1:x2])
            out.extend(_emit(b"+", raw) for raw in b[y1:y2])
    return b"".join(out)
