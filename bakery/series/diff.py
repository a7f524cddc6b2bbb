"""Unified diffs in and out: the one module that knows the format.

``parse_patch`` reads a diff's bytes in one pass (headers and hunk bodies together) into
bakery's frozen types (``bakery.series.hunks``: a file's hunks stay the diff's own bytes
plus one row of numbers a hunk, so a large diff costs little more than its bytes). The header
grammar and its error messages are unidiff's (the parser bakery used before), the body rules
GNU patch's. One deliberate difference from GNU: a range that starts at line 0 yet has lines
(``@@ -0,6 +0,7 @@``; only an empty side starts at 0) is refused, where GNU 2.7 takes 0 as a
line number and applies the hunk. ``render_file_diff`` writes the
canonical form the series stores (``--- baked-ours/P`` / ``+++ baked/P``, 3 lines of
context, no timestamps, final newline).
"""

from __future__ import annotations

import os
import re
from array import array
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from bakery.errors import PatchParseError
from bakery.series.headers import DEV_NULL, check_modes, header_name, tree_path
from bakery.series.hunks import FilePatch, Hunk, HunkLine, Hunks, Patch

__all__ = ["HunkLine", "Hunk", "Hunks", "FilePatch", "Patch"]  # the types, from series.hunks
__all__ += ["parse_patch", "parse_renames", "read_patch"]
__all__ += ["render_file_diff", "split_lines", "OLD_PREFIX", "NEW_PREFIX"]

# Header prefixes of the series' own diffs (the seed's convention): the first
# path component is thrown away on apply, so these only need to be stable.
OLD_PREFIX = "baked-ours/"
NEW_PREFIX = "baked/"
CONTEXT_LINES = 3
# Lossless bytes <-> str for header paths and messages.
_CODEC = ("utf-8", "surrogateescape")
# A bound on what is read as a diff (``/dev/zero`` never ends); the largest
# file vLLM ships is well under 1 MiB, so a real series never comes near it.
MAX_PATCH_BYTES = 64 << 20
# GNU patch refuses line numbers that do not fit its LINENUM ("is too large").
MAX_LINE_NUMBER = 2**63 - 1
_NUMBER_DIGITS = len(str(MAX_LINE_NUMBER))
# GNU patch strips each line's trailing CR from a file's hunks when the later of its
# ``---``/``+++`` lines ends in CRLF ("Stripping trailing CRs from patch"): per file.
_ADDED, _REMOVED, _MARKER = b"+-\\"
_SPACE, _CR, _LF = b" \r\n"
# unidiff's line grammar (the parser bakery used before this one), over bytes: adapted
# from python-unidiff 1.0.1, MIT license, Copyright (c) 2012 Matias Bordese (LICENSES/unidiff.txt).
_GIT_HEADERS = (
    re.compile(rb'^diff --git (?P<source>"?a/[^\t\n]+"?) (?P<target>"?b/[^\t\n]+"?)'),
    re.compile(rb"^diff --git (?P<source>.*://[^\t\n]+) (?P<target>.*://[^\t\n]+)"),
    re.compile(rb"^diff --git (?P<source>[^\t\n]+) (?P<target>[^\t\n]+)"),
)
_GIT_NEW_FILE = re.compile(rb"^new file mode (?P<mode>\d+)\r?$")
_GIT_DELETED_FILE = re.compile(rb"^deleted file mode (?P<mode>\d+)\r?$")
_GIT_OLD_MODE = re.compile(rb"^old mode (?P<mode>\d+)\r?$")
_GIT_NEW_MODE = re.compile(rb"^new mode (?P<mode>\d+)\r?$")
_GIT_INDEX = re.compile(rb"^index [0-9a-f]+\.\.[0-9a-f]+ (?P<mode>\d+)\r?$")
_SOURCE = re.compile(rb'^--- (?P<name>"?[^\t\n]*"?)(?:\t[^\n]+)?')
_TARGET = re.compile(rb'^\+\+\+ (?P<name>"?[^\t\n]*"?)(?:\t[^\n]+)?')
_HUNK_HEADER = re.compile(rb"@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")  # matched at a line start
_HUNK_LINE = re.compile(_HUNK_HEADER.pattern + rb"[^\n]*\n")  # the whole ``@@`` line
_NO_NEWLINE = re.compile(rb"^\\ No newline at end of file")
_BINARY = re.compile(
    rb"^Binary files? (?P<source>[^\t]+?)(?:\t[\s0-9:\+-]+)?"
    rb"(?: and [^\t]+?(?:\t[\s0-9:\+-]+)?)? (differ|has changed)"
)


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


@dataclass(slots=True)  # one file's diff while it is read
class _Section:
    source: bytes  # the header names as written
    target: bytes
    mode: bytes | None = None  # from a git extended header
    modes: list[bytes] = field(default_factory=list)  # every mode its header names
    # As in Hunks: 4 bytes a number until one does not fit (30k hunks: 0.8 MB less).
    rows: array[int] = field(default_factory=lambda: array("I"))
    problem: tuple[int, str] | None = None  # the first hunk refused: raised after the walk
    strip_cr: bool = False  # its hunks' lines lose their trailing CR (GNU's choice, per file)


def _not_a_diff(name: str, message: str, line: bytes = b"") -> PatchParseError:
    return PatchParseError(f"{name}: not a unified diff ({message}{line.decode(*_CODEC)})")


def _read_body(
    body: bytes, pos: int, old_len: int, new_len: int, name: str, strip_cr: bool
) -> tuple[int, str, int]:
    """GNU's hunk rules, one line at a time: where the counted lines end, and the first thing
    in them GNU calls malformed and where ("" if none; the lines are counted all the same, so
    reading goes on in step). GNU looks for a marker only after the last line of a side (its
    ``incomplete_line``), and reads a line starting with a CR, or a hunk with no change, as
    malformed."""
    old = new = 0
    size = len(body)
    problem, at = "", pos
    marks = marked = changed = False  # the line before may take a marker / was one
    while pos < size and (old < old_len or new < new_len):
        end = body.find(b"\n", pos) + 1 or size
        first = body[pos]
        if first == _MARKER:
            if not marks and not problem:
                problem = (
                    "two 'No newline' markers in a row"
                    if marked
                    else "'No newline' marker after a line that is not the last of its side"
                    if old or new
                    else "'No newline' marker before any line"
                )
                at = pos
            marks, marked, pos = False, True, end
            continue
        if first == _ADDED:
            new += 1
            marks, changed = new == new_len, True
        elif first == _REMOVED:
            old += 1
            marks, changed = old == old_len, True
        elif first in (_SPACE, _LF, _CR):
            old, new = old + 1, new + 1
            marks = old == old_len or new == new_len
            if first == _CR and not problem and not (strip_cr and end - pos == 2):
                problem, at = "a line that starts with a carriage return", pos
        else:
            raise _not_a_diff(name, "Hunk diff line expected: ", body[pos:end])
        marked, pos = False, end
        if old > old_len or new > new_len:
            raise _not_a_diff(name, "Hunk is longer than expected")
    if old < old_len or new < new_len:
        raise _not_a_diff(name, "Hunk is shorter than expected")
    return pos, problem or ("" if changed else "a hunk that changes nothing"), at


def _numbers(header: re.Match[bytes]) -> tuple[int, int, int, int]:
    """A ``@@`` line's four numbers (an omitted length is 1). One with more digits than any
    line number has reads as one past the largest, so it is refused as too large: int()
    would raise past 4300 digits."""
    a, b, c, d = (
        int(g) if len(g) <= _NUMBER_DIGITS else MAX_LINE_NUMBER + 1 for g in header.groups(b"1")
    )
    return a, b, c, d


def _read_hunk(body: bytes, pos: int, header: re.Match[bytes], section: _Section, name: str) -> int:
    """The hunk whose ``@@`` line ends at ``pos``, added to ``section``; where reading goes on."""
    numbers = _numbers(header)
    old_start, old_len, new_start, new_len = numbers
    end, malformed, at = _read_body(body, pos, old_len, new_len, name, section.strip_cr)
    # GNU's body also takes the marker lines that follow the counted ones; unidiff read them
    # as lines of their own, so the walk still does (see _walk).
    stop = end
    while body.startswith(b"\\", stop):
        stop = body.find(b"\n", stop) + 1 or len(body)
    number = len(section.rows) // Hunks.WIDTH + 1
    if section.problem is None:
        if max(numbers) > MAX_LINE_NUMBER:
            digits = next(
                g for g, v in zip(header.groups(b"1"), numbers, strict=True) if v > MAX_LINE_NUMBER
            )
            shown = digits.decode() if len(digits) <= 40 else f"{digits[:20].decode()}..."
            section.problem = number, f"line number is too large: {shown}"
        elif (old_start == 0 < old_len) or (new_start == 0 < new_len):
            written = header[0][: header[0].index(b" @@", 2) + 3].decode()
            section.problem = (
                number,
                (f"malformed hunk header (a range that starts at line 0 must be empty): {written}"),
            )
        elif malformed:
            line = body.count(b"\n", 0, at) + 1
            text = body[at : body.find(b"\n", at) + 1 or len(body)].decode(*_CODEC)
            if at == pos:  # the hunk's own @@ line
                line, text = line - 1, header[0].decode(*_CODEC)
            section.problem = number, f"malformed hunk ({malformed}) at line {line}: {text!r}"
    fits = max(numbers) <= MAX_LINE_NUMBER  # else refused above; a row holds only what fits
    row = (number, *(numbers if fits else (0, 0, 0, 0)), pos, stop)
    if section.rows.typecode == "I" and max(row) >= 1 << 32:
        section.rows = array("q", section.rows)
    section.rows.extend(row)
    return end


def _read_hunks(body: bytes, pos: int, section: _Section, name: str) -> int:
    """The hunk whose ``@@`` line starts at ``pos`` and each one straight after it (most are),
    added to ``section``; where reading goes on.

    A body whose lines up to the next ``@@`` line (or the end) are all " ", "-" or "+", with
    the header's counts, is exactly those lines: taken at C speed, no line read on its own
    (these counts can only reach the header's at the body's last line). Any other hunk
    ``_read_hunk`` reads by unidiff's rules."""
    size = len(body)
    rows = section.rows
    # A header line always ends in a newline: parse_patch gives the body a final one.
    while header := _HUNK_LINE.match(body, pos):
        start = header.end()
        stop = body.find(b"\n@@ ", start - 1) + 1 or size
        lines = body.count(b"\n", start, stop)
        context = body.count(b"\n ", start - 1, stop - 1)
        removed = body.count(b"\n-", start - 1, stop - 1)
        added = body.count(b"\n+", start - 1, stop - 1)
        old_start, old_len, new_start, new_len = _numbers(header)
        if (
            lines == context + removed + added
            and context + removed == old_len
            and context + added == new_len
            and context < lines  # a change (GNU refuses a hunk without one)
            and not (old_start | old_len | new_start | new_len | stop) >> 32  # fits any row
            and (old_start or not old_len)  # else _read_hunk refuses the header
            and (new_start or not new_len)
        ):
            number = len(rows) // Hunks.WIDTH + 1
            rows.extend((number, old_start, old_len, new_start, new_len, start, stop))
            pos = stop
        else:
            pos = _read_hunk(body, start, header, section, name)
            rows = section.rows  # _read_hunk may have widened it
    return pos


def _walk(body: bytes, name: str) -> tuple[list[_Section], bool]:
    """Every file's section of ``body``, in one pass; and whether any is binary.

    Each line is read by unidiff's rules, in its order: git headers, ``---``/``+++``,
    ``@@`` (whose body ``_read_hunk`` reads), markers; anything else is text between
    files. Dispatch on the first byte is only for speed: each rule needs its own."""
    sections: list[_Section] = []
    current: _Section | None = None
    in_header = False  # inside a git extended header (unidiff's patch_info)
    source: bytes | None = None  # a "---" name waiting for its "+++"
    binary = False
    pos, size = 0, len(body)
    while pos < size:
        end = body.find(b"\n", pos) + 1 or size
        line = body[pos:end]
        pos = end
        first = line[0]
        if first == 0x40 and _HUNK_HEADER.match(line):  # "@"
            in_header = False
            if current is None:
                raise _not_a_diff(name, "Unexpected hunk found: ", line)
            pos = _read_hunks(body, pos - len(line), current, name)
            continue
        if first == 0x64:  # "d"
            for pattern in _GIT_HEADERS:
                if match := pattern.match(line):
                    in_header, source = True, match["source"]
                    current = _Section(source, match["target"])
                    sections.append(current)
                    break
            if match:
                continue
        if first == 0x6E and (match := _GIT_NEW_FILE.match(line)):  # "n"
            if current is None or not in_header:
                raise _not_a_diff(name, "Unexpected new file found: ", line)
            current.source, current.mode = DEV_NULL.encode(), match["mode"]
            current.modes.append(match["mode"])
            continue
        if first == 0x64 and (match := _GIT_DELETED_FILE.match(line)):
            if current is None or not in_header:
                raise _not_a_diff(name, "Unexpected deleted file found: ", line)
            current.target = DEV_NULL.encode()
            current.modes.append(match["mode"])
            continue
        if current is not None and in_header:
            if first == 0x6F and (match := _GIT_OLD_MODE.match(line)):  # "o"
                current.modes.append(match["mode"])
                continue
            if first == 0x6E and (match := _GIT_NEW_MODE.match(line)):
                current.mode = match["mode"]
                current.modes.append(match["mode"])
                continue
            if first == 0x69 and (match := _GIT_INDEX.match(line)):  # "i"
                current.mode = current.mode or match["mode"]
                current.modes.append(match["mode"])
                continue
        if first == _REMOVED and (match := _SOURCE.match(line)):
            source = header_name(match["name"], line)
            if current is not None and not in_header:
                current = None
            continue
        if first == _ADDED and (match := _TARGET.match(line)):
            target = header_name(match["name"], line)
            if current is not None and current.target.rstrip(b" \r") != target:
                raise _not_a_diff(name, "Target without source: ", line)
            if current is None:
                if source is None:
                    raise _not_a_diff(name, "Target without source: ", line)
                current = _Section(source, target)
                sections.append(current)
                in_header, source = False, None
            elif current.target != DEV_NULL.encode():  # GNU takes the ---/+++ names
                current.target = target
                if source is not None and current.source != DEV_NULL.encode():
                    current.source = source
            current.strip_cr = line.endswith(b"\r\n")
            continue
        if first == _MARKER and _NO_NEWLINE.match(line):
            if current is None:
                raise _not_a_diff(name, "Unexpected marker: ", line)
            if not current.rows:
                raise _not_a_diff(name, "Unexpected marker: No newline at end of file")
            continue
        if line in (b"\n", b"\r\n") and current is not None and current.rows:
            continue  # a blank line after a hunk
        if not in_header:
            current, in_header = None, True
        if first == 0x42 and (match := _BINARY.match(line)):  # "B"
            source, binary = match["source"], True
            current, in_header = None, False
        elif line in (b"GIT binary patch\n", b"GIT binary patch\r\n") and current is not None:
            # Only in a git header, as GNU reads it; elsewhere the line is text between files.
            binary = True
            current, in_header = None, False
    return sections, binary


def _without_crs(body: bytes, rows: array[int]) -> Hunks:
    """A file's hunks with each line's trailing CR stripped, as GNU reads them under CRLF
    headers: the span of its hunks, stripped, and each row's body moved to match. (Every
    row's start and stop is a line start, so no CRLF straddles one.)"""
    first = rows[Hunks.WIDTH - 2] - 1  # the newline that ends the first @@ line
    moved: array[int] = array(rows.typecode)
    gone, before = 0, first  # CRLFs dropped ahead of ``before``
    for at in range(0, len(rows), Hunks.WIDTH):
        start, stop = rows[at + Hunks.WIDTH - 2], rows[at + Hunks.WIDTH - 1]
        gone += body.count(b"\r\n", before, start)
        new_start = start - first - gone
        gone += body.count(b"\r\n", start, stop)
        moved.extend((*rows[at : at + Hunks.WIDTH - 2], new_start, stop - first - gone))
        before = stop
    return Hunks(body[first:before].replace(b"\r\n", b"\n"), moved)


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
    # A leading byte-order mark (an editor's) hides the first "---" line; GNU then names the
    # file from its "+++" line alone, which is the same file: read past it.
    body = body.removeprefix(b"\xef\xbb\xbf")
    sections, binary = _walk(body, name)
    if binary:
        raise PatchParseError(f"{name}: binary patches are not supported (refused)")
    files = []
    for section in sections:
        old = tree_path(section.source.decode(*_CODEC), strip, renames, name)
        new = tree_path(section.target.decode(*_CODEC), strip, renames, name)
        if old is None and new is None:
            raise PatchParseError(f"{name}: both sides are /dev/null")
        if old is not None and new is not None and old != new:
            raise PatchParseError(
                f"{name}: renames inside a diff are not supported (old {old!r}, new {new!r})"
            )
        check_modes(section.modes, new or old, name)
        if not section.rows:
            raise PatchParseError(f"{name}: no hunks for {new or old!r}")
        if section.problem:
            number, problem = section.problem
            raise PatchParseError(
                f"{name}: hunk #{number} of {new or old!r}: {problem}",
                hint="fix that hunk's @@ line or body in the patch file",
            )
        mode = int(section.mode[-3:], 8) if section.mode and new is not None else None
        hunks = _without_crs(body, section.rows) if section.strip_cr else Hunks(body, section.rows)
        files.append(FilePatch(old, new, hunks, new_mode=mode))
    if not files:
        raise PatchParseError(f"{name}: no file diffs found (is this a unified diff?)")
    return Patch(
        name=name,
        files=tuple(files),
        data=data,
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
    import difflib  # only here: the engine's processes never render a diff

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
