"""A diff header's fields, for ``bakery.series.diff`` (the one reader of the format): a
header name made a safe tree path (``-p`` strip, renames, no escape), and a git header's
modes checked (octal, a regular file's). Names are read as GNU patch reads them: a
C-quoted name unquoted, an unquoted one ending at whitespace unless a tab follows it.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Sequence

from bakery.errors import PatchParseError, UnsafePathError

__all__ = ["DEV_NULL", "header_name", "tree_path", "check_modes"]

DEV_NULL = "/dev/null"
_OCTAL = re.compile(rb"^[0-7]+\Z")  # the mode lines take any digits, as unidiff's do


_QUOTED = re.compile(rb'"(?:[^"\\\n]|\\.)*"')
_ESCAPE = re.compile(rb"\\([0-7]{1,3}|.)", re.DOTALL)
_ESCAPES = {b"a": 7, b"b": 8, b"f": 12, b"n": 10, b"r": 13, b"t": 9, b"v": 11, b"\\": 92, b'"': 34}


def header_name(name: bytes, line: bytes) -> bytes:
    """The name a ``---``/``+++`` line gives, as GNU's ``fetchname`` reads it: a quoted name
    up to its closing quote; else the text before the tab that starts a timestamp, less
    trailing blanks, or, with no tab on the line, the text up to the first blank."""
    if name.startswith(b'"') and (quoted := _QUOTED.match(name)):
        return quoted[0]
    if b"\t" in line:
        return name.rstrip(b" \r\f\v")
    return name.split(None, 1)[0] if name.strip() else name


def _unquote(name: str, patch: str) -> str:
    """A C-quoted name (git's, GNU's) as its bytes: \\t, \\", \\\\, octal \\303 and the rest."""

    def one(match: re.Match[bytes]) -> bytes:
        code = match[1]
        if code[:1].isdigit():
            return bytes([int(code, 8) & 0xFF])
        if code not in _ESCAPES:
            raise PatchParseError(f"{patch}: bad escape in a quoted diff header path: {name!r}")
        return bytes([_ESCAPES[code]])

    raw = name[1:-1].encode("utf-8", "surrogateescape")
    return _ESCAPE.sub(one, raw).decode("utf-8", "surrogateescape")


def tree_path(raw: str, strip: int, renames: Sequence[tuple[str, str]], patch: str) -> str | None:
    """Header path -> safe tree-relative path (None for /dev/null)."""
    raw = raw.removesuffix("\r")  # GNU ends a name at whitespace; a CRLF header leaves a CR
    if raw == DEV_NULL:
        return None
    quoted = len(raw) > 1 and raw.startswith('"') and raw.endswith('"')
    name = _unquote(raw, patch) if quoted else raw
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


# A git mode's file type (its digits above the last 4): regular, or none written (GNU's too).
_FILE_TYPES = {0o10: "regular file", 0: "regular file", 0o12: "symlink", 0o16: "gitlink"}


def check_modes(modes: list[bytes], path: str | None, name: str) -> None:
    """Each mode a file's git header names is octal and a regular file's: a symlink's or a
    submodule's diff is refused by name (its last three digits would make a mode-000 file)."""
    for mode in modes:
        if not _OCTAL.match(mode):
            raise PatchParseError(
                f"{name}: a git file mode is not octal: {mode.decode()[:20]!r}",
                hint="a mode is octal digits, as git writes it (100644, 100755)",
            )
        kind = _FILE_TYPES.get(int(mode[:-4] or b"0", 8), "special file")
        if kind != "regular file":
            raise PatchParseError(
                f"{name}: {path!r} is a {kind} in this git diff (mode {mode.decode()});"
                " bakery patches regular files only (refused)",
                hint="take that file's diff out of the patch; commit a symlink's target instead",
            )
