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
diff, and added lines take the file's CRLF endings.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import compress, count

from bakery.errors import HunkFailed, NearMatch
from bakery.series.diff import FilePatch, Hunk, HunkLine, split_lines

__all__ = ["Placement", "FileResult", "apply_file_patch", "survey_file_patch"]

# A line's identity for matching: the line with any CRLF ending read as LF
# ("\ No newline at end of file" matters; LF versus CRLF does not).
_Key = bytes
# Offsets tried one by one before the far search by index (most hunks sit within a few lines).
_WALK = 256
# How often one line repeated in a hunk votes for near-match windows.
_MAX_VOTES = 4


@dataclass(frozen=True)
class Placement:
    hunk: int
    line: int  # 1-based pre-image line of the hunk's first old-side line
    offset: int  # line - where the diff header put it
    fuzz: int


@dataclass(frozen=True)
class FileResult:
    path: str
    before: bytes | None  # None: the file did not exist
    after: bytes | None  # None: the patch deletes it
    placements: tuple[Placement, ...]
    mode: int | None = None


def _file_keys(lines: list[bytes], data: bytes) -> list[_Key]:
    if b"\r\n" not in data:
        return lines  # LF only: every line is its own key (the common case, and free)
    return [raw[:-2] + b"\n" if raw.endswith(b"\r\n") else raw for raw in lines]


def _line_key(line: HunkLine) -> _Key:
    return line.text + b"\n" if line.eol else line.text


class _Matcher:
    """GNU patch's ``locate_hunk`` over one file's pre-image."""

    def __init__(self, keys: Sequence[_Key]) -> None:
        self.keys = keys

    def matches(
        self, where: int, pattern: Sequence[_Key], prefix_fuzz: int, suffix_fuzz: int
    ) -> bool:
        """GNU ``patch_match``: pattern lines [prefix_fuzz, len - suffix_fuzz) at ``where``."""
        base = where - 1
        stop = len(pattern) - suffix_fuzz
        keys = self.keys
        if base + prefix_fuzz < 0 or base + stop > len(keys):
            return False
        return all(keys[base + i] == pattern[i] for i in range(prefix_fuzz, stop))

    def locate(
        self, hunk: Hunk, pattern: Sequence[_Key], fuzz: int, in_offset: int, frozen: int
    ) -> int:
        """1-based line where the hunk's old side starts, or 0 if none."""
        n_input = len(self.keys)
        pat_lines = len(pattern)
        first_guess = hunk.first + in_offset
        prefix, suffix = hunk.prefix_context, hunk.suffix_context
        context = max(prefix, suffix)
        prefix_fuzz = fuzz + prefix - context
        suffix_fuzz = fuzz + suffix - context
        max_where = n_input - (pat_lines - suffix_fuzz) + 1
        min_where = frozen + 1  # GNU 2.7.6: no overlap with an earlier hunk's frozen lines
        max_pos = max_where - first_guess
        max_neg = first_guess - min_where
        max_offset = max(max_pos, max_neg)
        if not pat_lines:  # an empty old side matches anywhere
            return first_guess
        if first_guess <= max_neg:
            max_neg = first_guess - 1
        if prefix_fuzz < 0 and hunk.first <= 1:
            # Less leading context than trailing: the hunk sits at the file start.
            if suffix_fuzz < 0 and (pat_lines != n_input or prefix < frozen):
                return 0
            offset = 1 - first_guess
            if (
                frozen <= prefix
                and offset <= max_pos
                and self.matches(1, pattern, 0, max(suffix_fuzz, 0))
            ):
                return 1
            return 0
        prefix_fuzz = max(prefix_fuzz, 0)
        if suffix_fuzz < 0:
            # Less trailing context than leading: the hunk sits at the file end.
            offset = first_guess - (n_input - pat_lines + 1)
            if offset <= max_neg and self.matches(first_guess - offset, pattern, prefix_fuzz, 0):
                return first_guess - offset
            return 0
        # Only offsets at which one side lies inside the file can match: an absurd
        # start line must not cost one step per line of distance.
        lowest = 1 - prefix_fuzz
        if max_neg < 0 <= max_pos:
            # The guess lies on frozen lines. GNU's loop then starts at the negative offset
            # guess - min_where, so its "+offset" probe walks up from 2 * guess - min_where
            # (frozen lines included) after one probe at min_where: one increasing scan.
            start = first_guess + max_neg
            if prefix_fuzz >= pat_lines - suffix_fuzz:
                # Fuzz dropped every line: GNU's first probe matches, even at line 0 or
                # above (0 reads as "not found"; above fails as misordered).
                return start
            for where in (start, min_where):
                if self.matches(where, pattern, prefix_fuzz, suffix_fuzz):
                    return where
            return self._scan_up(
                max(start + 1, lowest), max_where, pattern, prefix_fuzz, suffix_fuzz
            )
        first = max(0, lowest - first_guess, first_guess - max_where)
        last = min(max_offset, max(max_where - first_guess, first_guess - lowest))
        # Near the guess, walk GNU's order (+k before -k) one offset at a time;
        # farther out, visit only the lines equal to the first compared line,
        # found at C speed and sorted into the same order (a failed hunk would
        # otherwise scan the whole file in Python).
        near = min(last, first + _WALK)
        for offset in range(first, near + 1):
            if offset <= max_pos and self.matches(
                first_guess + offset, pattern, prefix_fuzz, suffix_fuzz
            ):
                return first_guess + offset
            if offset <= max_neg and self.matches(
                first_guess - offset, pattern, prefix_fuzz, suffix_fuzz
            ):
                return first_guess - offset
        if near == last or prefix_fuzz >= pat_lines - suffix_fuzz:
            return 0
        anchor = pattern[prefix_fuzz]
        far = []
        # keys[i] is the pattern's first compared line when the hunk starts at i + 1 - prefix_fuzz
        for where in compress(count(1 - prefix_fuzz), map(anchor.__eq__, self.keys)):
            offset = where - first_guess
            if near < offset <= min(max_pos, last):
                far.append((offset, 0, where))
            elif near < -offset <= min(max_neg, last):
                far.append((-offset, 1, where))
        for _, _, where in sorted(far):
            if self.matches(where, pattern, prefix_fuzz, suffix_fuzz):
                return where
        return 0

    def _scan_up(
        self, low: int, high: int, pattern: Sequence[_Key], prefix_fuzz: int, suffix_fuzz: int
    ) -> int:
        """The first line in [low, high] where the pattern matches, or 0."""
        near = min(high, low + _WALK)
        for where in range(low, near + 1):
            if self.matches(where, pattern, prefix_fuzz, suffix_fuzz):
                return where
        if near == high or prefix_fuzz >= len(pattern) - suffix_fuzz:
            return 0
        anchor = pattern[prefix_fuzz]
        for where in compress(count(1 - prefix_fuzz), map(anchor.__eq__, self.keys)):
            if near < where <= high and self.matches(where, pattern, prefix_fuzz, suffix_fuzz):
                return where
        return 0

    def nearest(self, pattern: Sequence[_Key], guess: int) -> tuple[int, int]:
        """(line, votes) of the window sharing the most lines with ``pattern``, ties
        nearest ``guess``; (0, 0) when no window does. One pass over the file: each
        file line equal to a pattern line votes for the window that would align them."""
        wanted: dict[_Key, list[int]] = {}
        for index, key in enumerate(pattern):
            wanted.setdefault(key, []).append(index)
        last = len(self.keys) - len(pattern) + 1  # the last window that fits
        votes: Counter[int] = Counter()
        hits = compress(count(1), map(wanted.__contains__, self.keys))  # at C speed
        for line in hits:
            # A line repeated in the pattern (blank lines) votes a bounded number
            # of times, so the work stays linear in the file.
            for index in wanted[self.keys[line - 1]][:_MAX_VOTES]:
                if 1 <= line - index <= last:
                    votes[line - index] += 1
        if not votes:
            return 0, 0
        where = max(votes, key=lambda w: (votes[w], -abs(w - guess), w))
        return where, votes[where]


def _is_crlf(data: bytes) -> bool:
    """Every line ending is CRLF (and there is at least one)."""
    newlines = data.count(b"\n")
    return newlines > 0 and data.count(b"\r\n") == newlines


def _added(line: HunkLine, crlf: bool) -> bytes:
    if line.eol == b"\n" and crlf:
        return line.text + b"\r\n"
    return line.raw


def _failure(patch_name: str, path: str, hunk: Hunk, matcher: _Matcher, guess: int) -> HunkFailed:
    pattern = [_line_key(line) for line in hunk.old_lines]
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
        if found != _line_key(line):
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


def _first_change(hunk: Hunk, where: int) -> int | None:
    """The input line GNU copies up to before the hunk's first change (None: no change)."""
    old_index = 0
    for line in hunk.lines:
        if line.kind != " ":
            return where + old_index - 1
        old_index += 1
    return None


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
    patch_name: str, path: str, hunk: Hunk, matcher: _Matcher, fuzz: int
) -> None:
    """GNU's precedence: when the first hunk fails at fuzz N, its reverse is tried at fuzz N
    before fuzz N+1, so a change already in the file is not applied again with more fuzz."""
    back = hunk.reversed()
    if matcher.locate(back, [_line_key(line) for line in back.old_lines], fuzz, 0, 0):
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
) -> tuple[bytes, list[Placement], list[HunkFailed]]:
    """GNU patch's hunk loop; with ``keep_going`` a failed hunk is skipped, as GNU does."""
    lines = split_lines(before or b"")
    matcher = _Matcher(_file_keys(lines, before or b""))
    crlf = _is_crlf(before or b"")
    out: list[bytes] = []
    frozen = 0  # input lines already copied or consumed (GNU last_frozen_line)

    def emit(chunk: list[bytes], fix: bool = True) -> None:
        # GNU's after_newline: a line that lost its newline (fuzz dropped the
        # "\ No newline" context, or drift) gets one before a copied line or a
        # hunk's trailing added lines; GNU writes an added line that some context
        # still follows as it is (``fix`` False), so it joins that line.
        if fix and chunk and out and not out[-1].endswith(b"\n"):
            out.append(b"\n")
        out.extend(chunk)

    def copy_till(n: int) -> None:
        nonlocal frozen
        if n > frozen:
            emit(lines[frozen:n])
            frozen = n

    placements: list[Placement] = []
    failures: list[HunkFailed] = []
    in_offset = 0
    for hunk in file_patch.hunks:
        pattern = [_line_key(line) for line in hunk.old_lines]
        max_here = min(max_fuzz, max(hunk.prefix_context, hunk.suffix_context))
        where = 0
        fuzz = 0
        for fuzz in range(max_here + 1):
            where = matcher.locate(hunk, pattern, fuzz, in_offset, frozen)
            if where:
                break
            if hunk is file_patch.hunks[0] and not keep_going:
                _refuse_if_reversed(patch_name, file_patch.path, hunk, matcher, fuzz)
        if not where:
            failures.append(
                _failure(patch_name, file_patch.path, hunk, matcher, hunk.first + in_offset)
            )
            if keep_going:
                continue
            raise failures[0]
        in_offset = where - hunk.first
        first_change = _first_change(hunk, where)
        if first_change is not None and first_change < frozen:
            # GNU's copy_till refuses ("misordered hunks"): the hunk matched, partly on
            # lines an earlier hunk froze, and its change would fall among them.
            failures.append(_misordered(patch_name, file_patch.path, hunk, where, frozen))
            if keep_going:
                continue
            raise failures[0]
        placements.append(Placement(hunk=hunk.number, line=where, offset=in_offset, fuzz=fuzz))
        old_index = 0  # old-side lines of this hunk consumed so far
        # GNU adds the lost newline only before added lines that no context follows.
        last_context = max((i for i, ln in enumerate(hunk.lines) if ln.kind == " "), default=-1)
        for index, line in enumerate(hunk.lines):
            if line.kind == "-":
                copy_till(where + old_index - 1)
                frozen += 1
                old_index += 1
            elif line.kind == "+":
                copy_till(where + old_index - 1)
                emit([_added(line, crlf)], fix=index > last_context)
            else:
                old_index += 1
    copy_till(len(lines))
    return b"".join(out), placements, failures


def survey_file_patch(
    patch_name: str, file_patch: FilePatch, before: bytes | None, max_fuzz: int
) -> tuple[list[Placement], list[HunkFailed]]:
    """Place every hunk, continuing past failures (for reports, like GNU's rejects)."""
    if (file_patch.creates and before) or (not file_patch.creates and before is None):
        where = "already exists" if before else "does not exist"
        failure = f"{patch_name}: {file_patch.path!r} {where}"
        return [], [HunkFailed(failure, patch=patch_name, path=file_patch.path)]
    _, placements, failures = _apply_hunks(patch_name, file_patch, before, max_fuzz, True)
    return placements, failures


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
        return FileResult(path, before, None, tuple(placements))
    return FileResult(path, before, after, tuple(placements), mode=file_patch.new_mode)
