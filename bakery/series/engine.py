"""The hunk engine: place and apply one file's hunks, with GNU patch semantics.

Placement follows GNU patch 2.7 (``locate_hunk``/``apply_hunk``): exact line
first, then the nearest offset searching outward (+k before -k), then fuzz,
which drops up to N context lines from the hunk ends (the longer end first).
Offsets carry over to the next hunk. As GNU 2.7.6 ("don't allow hunks to overlap"), a
hunk's search starts past the lines an earlier hunk froze (all input up to its last
change: its leading context included, its trailing context not); when the guess itself
lies on frozen lines, GNU's loop probes upward from below it, and a hunk found there whose
change would fall on frozen lines fails ("misordered hunks"). As in GNU, when the first
hunk fails at fuzz N but its reverse places at fuzz N, the patch is refused as reversed
(or already applied) rather than forced in at fuzz N+1. A line that lost its
newline gets one before anything follows it. Context lines come from the file, so the
result matches GNU patch byte for byte. Beyond GNU: a CRLF file matches an LF
diff, and added lines take the file's CRLF endings. Unlike GNU, no hunk whose range starts
at line 0 yet has lines gets here: ``bakery.series.diff`` refuses its header.
"""

from __future__ import annotations

import io
import re
from array import array
from collections.abc import Sequence
from dataclasses import dataclass

from bakery.errors import HunkFailed, NearMatch
from bakery.series.diff import FilePatch, Hunk, HunkLine
from bakery.series.hunks import Rows
from bakery.series.locate import Matcher, Pattern, Shape, line_key, line_starts

__all__ = [
    "Placement",
    "Placements",
    "FileResult",
    "apply_file_patch",
    "place_what_places",
    "survey_file_patch",
]

_RUNS = re.compile(rb" +|-+|\++")  # runs of one kind, over a hunk's kinds
# A body of one change: leading context, removed lines, added lines, trailing context.
_ONE_CHANGE = re.compile(rb"((?: .*\n)*)((?:-.*\n)*)((?:\+.*\n)*)(?: .*\n)*")  # ".*": C speed
# Each line's kind (over a body from the newline before it).
_KIND = re.compile(rb"\n[-+ ]")
_ADDED, _REMOVED = b"+-"


@dataclass(frozen=True, slots=True)  # one per hunk
class Placement:
    hunk: int
    line: int  # 1-based pre-image line of the hunk's first old-side line
    offset: int  # line - where the diff header put it
    fuzz: int


class Placements(Rows[Placement]):
    """A file's placements as four numbers a hunk; a ``Placement`` is made when asked for
    (30k of them, with their line numbers, cost more than 3 MB)."""

    __slots__ = ()
    WIDTH = 4
    ITEM = "placement"

    def __init__(self) -> None:
        self.rows = array("q")

    def add(self, hunk: int, line: int, offset: int, fuzz: int) -> None:
        self.rows.extend((hunk, line, offset, fuzz))

    def _item(self, index: int) -> Placement:
        at = index * 4
        return Placement(*self.rows[at : at + 4])


@dataclass(frozen=True)
class FileResult:
    path: str
    before: bytes | None  # None: the file did not exist
    after: bytes | None  # None: the patch deletes it
    placements: Sequence[Placement]
    mode: int | None = None


def _is_crlf(data: bytes) -> bool:
    """Every line ending is CRLF (and there is at least one)."""
    newlines = data.count(b"\n")
    return newlines > 0 and data.count(b"\r\n") == newlines


def _added(line: HunkLine, crlf: bool) -> bytes:
    if line.eol == b"\n" and crlf:
        return line.text + b"\r\n"
    return line.raw


def _simple(body: bytes) -> bool:
    """Only " ", "-" and "+" lines, no CR: the body's bytes are its keys and its output."""
    return (
        b"\r" not in body
        and b"\n\\" not in body
        and b"\n\n" not in body
        and not body.startswith((b"\\", b"\n"))
    )


def _shape(hunk: Hunk) -> Shape:
    body = hunk.body
    first = hunk.old_start + 1 if hunk.old_len == 0 else hunk.old_start  # Hunk.first
    if _simple(body):
        lines = body.split(b"\n")
        lines.pop()  # after the last LF
        kinds = bytes([line[0] for line in lines])
        old = [line[1:] for line in lines if line[0] != _ADDED]
        pattern = Pattern(b"\n".join(old) + b"\n" if old else b"", len(old))
    else:
        kinds = hunk.kinds
        lines, pattern = None, Pattern.of(hunk.old_lines)
    prefix, suffix = len(kinds) - len(kinds.lstrip(b" ")), len(kinds) - len(kinds.rstrip(b" "))
    return Shape(first, prefix, suffix, kinds, kinds.rfind(b" "), pattern, lines)


def _failure(patch_name: str, path: str, hunk: Hunk, matcher: Matcher, guess: int) -> HunkFailed:
    pattern = [line_key(line) for line in hunk.old_lines]
    where, _ = matcher.nearest(pattern, guess)
    head = (
        f"{patch_name}: hunk #{hunk.number} does not apply to {path!r} (expected near line {guess})"
    )

    def failed(message: str, nearest: NearMatch | None = None) -> HunkFailed:
        return HunkFailed(
            message,
            patch=patch_name,
            path=path,
            hunk=hunk.number,
            expected=guess,
            nearest=nearest,
            hint="refresh the patch against this base (`bakery rebase --checkout` writes the "
            "conflicts to fix), or allow fuzz (`bakery apply --fuzz N`)",
        )

    if len(matcher.keys) < len(pattern):
        return failed(
            f"{head}: the file has {len(matcher.keys)} lines, fewer than the hunk's "
            f"{len(pattern)} lines of old side"
        )
    if where <= 0:
        return failed(f"{head}: no line of the hunk's old side is in the file")
    diffs = []
    for i, line in enumerate(hunk.old_lines):
        found = matcher.keys[where - 1 + i]
        if found != line_key(line):
            shown = found.rstrip(b"\n").decode("utf-8", "replace")
            diffs.append(
                f"  line {where + i}: hunk wants {line.text.decode('utf-8', 'replace')!r}\n"
                f"  {' ' * len(str(where + i))}       file has  {shown!r}"
            )
    nearest = NearMatch(line=where, offset=where - hunk.first, differing=len(diffs))
    return failed(
        f"{head}\n nearest near-match at line {where} (offset {nearest.offset}): "
        f"{len(diffs)} of {len(pattern)} lines differ:\n" + "\n".join(diffs[:8]),
        nearest,
    )


def _misordered(patch_name: str, path: str, hunk: Hunk, where: int, frozen: int) -> HunkFailed:
    return HunkFailed(
        f"{patch_name}: hunk #{hunk.number} matches {path!r} at line {where}, but its change "
        f"falls on lines 1..{frozen} that an earlier hunk already used (misordered hunks)",
        patch=patch_name,
        path=path,
        hunk=hunk.number,
        expected=where,
        hint="the patch's hunks overlap or are out of order: regenerate it with `bakery refresh`",
    )


def _refuse_if_reversed(
    patch_name: str, path: str, hunk: Hunk, matcher: Matcher, fuzz: int
) -> None:
    """GNU's precedence: when the first hunk fails at fuzz N, its reverse is tried at fuzz N
    before fuzz N+1, so a change already in the file is not applied again with more fuzz."""
    if matcher.locate(_shape(hunk.reversed()), fuzz, 0, 0):
        raise HunkFailed(
            f"{patch_name}: hunk #{hunk.number} does not apply to {path!r} at fuzz {fuzz}, "
            "but its reverse does: reversed (or previously applied)",
            hint="the base may already carry this change; check it, or refresh the patch",
            patch=patch_name,
            path=path,
            hunk=hunk.number,
        )


def _apply_hunks(
    patch_name: str, file_patch: FilePatch, before: bytes | None, max_fuzz: int, keep_going: bool
) -> tuple[bytes, Placements, list[HunkFailed]]:
    """GNU patch's hunk loop; with ``keep_going`` a failed hunk is skipped, as GNU does."""
    data = before or b""
    matcher = Matcher(data)
    view = memoryview(data)
    exact = matcher.data is data  # no CRLF: a line's key is its bytes
    crlf = not exact and _is_crlf(data)  # (a file without CRLF is not: skip two counts)
    out = io.BytesIO()
    open_end = False  # the last bytes written end without a newline
    frozen = 0  # input lines already copied or consumed (GNU last_frozen_line)
    written = 0  # where line ``frozen`` + 1 starts in ``data``; -1: not known (see starts)
    crlf_starts: list[array[int]] = []  # a CRLF file's own line starts, made once when needed

    def starts() -> array[int]:
        """Where each line of ``data`` starts (made on the first hunk off the fast path)."""
        if exact:
            return matcher.starts
        if not crlf_starts:
            crlf_starts.append(line_starts(data))
        return crlf_starts[0]

    def line_end(line: int) -> int:
        """Where input line ``line`` ends (0: before line 1). A zero-context hunk may add past
        the end, moving ``frozen`` there; as GNU's ifetch, lines past the end are empty."""
        ends = starts()
        return ends[min(line, len(ends) - 1)]

    def emit(chunk: bytes | memoryview, fix: bool = True) -> None:
        # GNU's after_newline: a line that lost its newline (fuzz dropped the
        # "\ No newline" context, or drift) gets one before a copied line or a
        # hunk's trailing added lines; GNU writes an added line that some context
        # still follows as it is (``fix`` False), so it joins that line.
        nonlocal open_end
        if fix and open_end:
            out.write(b"\n")
        out.write(chunk)
        open_end = chunk[-1:] != b"\n"

    def copy_till(n: int) -> None:
        nonlocal frozen, written
        if n > frozen:
            chunk = view[line_end(frozen) : line_end(n)]
            if chunk:
                emit(chunk)
            frozen = n
        written = -1

    placements = Placements()
    failures: list[HunkFailed] = []
    in_offset = 0
    table = file_patch.table
    source, rows = table.source, table.rows
    # The one-change path reads a body's bytes as its lines: only where none holds a CR.
    fast = exact and bool(rows) and source.find(b"\r", rows[5], rows[-1]) < 0
    one_change, count, write = _ONE_CHANGE.fullmatch, source.count, out.write
    place = placements.rows.extend  # (Placements.add without its call: 30k of them)
    index_: array[int] | None = None  # starts(), once the one-change path needs it
    for index, (number, old_start, old_len, _, new_len, start, stop) in enumerate(
        zip(*[iter(rows)] * table.WIDTH, strict=True)  # one row at a time, as a tuple
    ):
        guess = (old_start + 1 if old_len == 0 else old_start) + in_offset
        one = one_change(source, start, stop) if fast and old_len else None
        if one and frozen < guess and not open_end:
            # Most hunks: one change between equal runs of context, found whole where the diff
            # (and the offset so far) puts it, which is where locate looks first. The body's
            # lines lose their kinds at C speed; the context written is the file's own.
            (_, _), (_, lead), (_, cut), (_, end) = one.regs  # where each run ends
            prefix, suffix = count(b"\n", start, lead), count(b"\n", end, stop)
            if lead < end and prefix == suffix:
                if written < 0:
                    written = line_end(frozen)
                if index_ is None:
                    index_ = starts()  # the file's lines, indexed once at C speed
                at = index_[guess - 1] if guess < len(index_) else len(data)
                removed = old_len - prefix - suffix
                # Byte offsets in ``lines``: where the leading context, removed and added lines end.
                lead_end = lead - start - prefix
                removed_end = cut - start - prefix - removed
                added_end = end - start - removed - new_len + suffix
                lines = memoryview(_KIND.sub(b"\n", source[start - 1 : stop]))[1:]
                if data.startswith(lines[:removed_end], at) and data.startswith(
                    lines[added_end:], at + removed_end
                ):
                    if at + lead_end > written:
                        write(view[written : at + lead_end])
                    if added_end > removed_end:
                        write(lines[removed_end:added_end])
                    written = at + removed_end
                    frozen = guess - 1 + old_len - suffix
                    place((number, guess, in_offset, 0))
                    continue
        hunk = table[index]
        shape = _shape(hunk)
        max_here = min(max_fuzz, max(shape.prefix, shape.suffix))
        where = 0
        fuzz = 0
        for fuzz in range(max_here + 1):
            where = matcher.locate(shape, fuzz, in_offset, frozen)
            if where:
                break
            if index == 0 and not keep_going:
                _refuse_if_reversed(patch_name, file_patch.path, hunk, matcher, fuzz)
        if not where:
            failures.append(
                _failure(patch_name, file_patch.path, hunk, matcher, hunk.first + in_offset)
            )
            if keep_going:
                continue
            raise failures[0]
        in_offset = where - hunk.first
        # GNU copies the input up to line where + prefix - 1 before the hunk's first change.
        if shape.prefix < len(shape.kinds) and where + shape.prefix - 1 < frozen:
            # GNU's copy_till refuses ("misordered hunks"): the hunk matched, partly on
            # lines an earlier hunk froze, and its change would fall among them.
            failures.append(_misordered(patch_name, file_patch.path, hunk, where, frozen))
            if keep_going:
                continue
            raise failures[0]
        placements.add(hunk.number, where, in_offset, fuzz)
        written = -1  # the loops below move ``frozen`` past lines they do not write
        old_index = 0  # old-side lines of this hunk consumed so far
        # GNU adds the lost newline only before added lines that no context follows.
        last_context = shape.last_context
        if shape.lines is not None:  # whole runs of one kind at a time
            for run in _RUNS.finditer(shape.kinds):
                start, end = run.span()
                kind = shape.kinds[start]
                if kind == _REMOVED:
                    copy_till(where + old_index - 1)
                    frozen += end - start
                    old_index += end - start
                elif kind == _ADDED:
                    copy_till(where + old_index - 1)
                    added = [line[1:] for line in shape.lines[start:end]]
                    eol = b"\r\n" if crlf else b"\n"
                    emit(eol.join(added) + eol, start > last_context)
                else:
                    old_index += end - start
            continue
        for line_index, line in enumerate(hunk.lines):
            if line.kind == "-":
                copy_till(where + old_index - 1)
                frozen += 1
                old_index += 1
            elif line.kind == "+":
                copy_till(where + old_index - 1)
                emit(_added(line, crlf), fix=line_index > last_context)
            else:
                old_index += 1
    rest = written if written >= 0 else line_end(frozen)
    if rest < len(data):
        emit(view[rest:])
    return out.getvalue(), placements, failures


def survey_file_patch(
    patch_name: str, file_patch: FilePatch, before: bytes | None, max_fuzz: int
) -> tuple[Placements, list[HunkFailed]]:
    """Place every hunk, continuing past failures (for reports, like GNU's rejects)."""
    if (file_patch.creates and before) or (not file_patch.creates and before is None):
        where = "already exists" if before else "does not exist"
        failure = f"{patch_name}: {file_patch.path!r} {where}"
        return Placements(), [HunkFailed(failure, patch=patch_name, path=file_patch.path)]
    _, placements, failures = _apply_hunks(patch_name, file_patch, before, max_fuzz, True)
    return placements, failures


def place_what_places(
    patch_name: str, file_patch: FilePatch, before: bytes, max_fuzz: int
) -> tuple[bytes, list[HunkFailed]]:
    """GNU patch's result when hunks fail: every hunk that places applied, the rest left
    out (its rejects); for checking code a patch would leave, never for writing a tree."""
    after, _, failures = _apply_hunks(patch_name, file_patch, before, max_fuzz, True)
    return after, failures


def apply_file_patch(
    patch_name: str, file_patch: FilePatch, before: bytes | None, max_fuzz: int
) -> FileResult:
    """Apply every hunk of ``file_patch`` to ``before``; raise ``HunkFailed``."""
    path = file_patch.path
    if file_patch.creates and before:
        raise HunkFailed(
            f"{patch_name}: creates {path!r}, which already exists", patch=patch_name, path=path
        )
    if not file_patch.creates and before is None:
        raise HunkFailed(
            f"{patch_name}: patches {path!r}, which does not exist", patch=patch_name, path=path
        )
    after, placements, _ = _apply_hunks(patch_name, file_patch, before, max_fuzz, False)
    if file_patch.deletes:
        if after:
            raise HunkFailed(
                f"{patch_name}: deletes {path!r}, but its content differs from the patch",
                patch=patch_name,
                path=path,
            )
        return FileResult(path, before, None, placements)
    return FileResult(path, before, after, placements, mode=file_patch.new_mode)
