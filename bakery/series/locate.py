"""GNU patch's ``locate_hunk`` over one file's pre-image, for the hunk engine.

Lines are compared as spans of the file's bytes (a CRLF file's with its CRLFs read as LF)
against a hunk's old side joined the same way, so a 300k-line file is never split into
300k objects on the way to a match; the file's lines exist as objects only for a far
search or a failure's report.
"""

from __future__ import annotations

from array import array
from collections import Counter
from collections.abc import Sequence
from itertools import accumulate, compress, count
from typing import NamedTuple

from bakery.series.diff import HunkLine, split_lines

__all__ = ["Key", "Matcher", "Pattern", "Shape", "line_key", "line_starts"]

# A line's identity for matching: the line with any CRLF ending read as LF
# ("\ No newline at end of file" matters; LF versus CRLF does not).
Key = bytes
# Offsets tried one by one before the far search by index (most hunks sit within a few lines).
_WALK = 256
# How often one line repeated in a hunk votes for near-match windows.
_MAX_VOTES = 4
# Bytes of a file split at once while finding its line starts.
_CHUNK = 1 << 18


def line_key(line: HunkLine) -> Key:
    return line.text + b"\n" if line.eol else line.text


def line_starts(data: bytes) -> array[int]:
    """Where each of ``data``'s lines starts, and its end last: one int a line, found at C
    speed a chunk at a time (a list of the lines would cost 3x the file's bytes)."""
    starts = array("I" if len(data) < 1 << 32 else "q", [0])  # 4 bytes a line where they do
    pos, size = 0, len(data)
    while pos < size:
        stop = data.find(b"\n", pos + _CHUNK) + 1 or size
        ends = accumulate(map(len, split_lines(data[pos:stop])), initial=pos)
        next(ends)
        starts.extend(ends)
        pos = stop
    return starts


class Pattern:
    """A hunk's old side as keys: one bytes (``blob``) with its lines found on demand."""

    __slots__ = ("blob", "count", "_keys", "_starts")

    def __init__(self, blob: bytes, count: int, keys: list[Key] | None = None) -> None:
        self.blob = blob
        self.count = count
        self._keys = keys
        self._starts: array[int] | None = None

    @classmethod
    def of(cls, lines: Sequence[HunkLine]) -> Pattern:
        keys = [line_key(line) for line in lines]
        return cls(b"".join(keys), len(keys), keys)

    @property
    def keys(self) -> list[Key]:
        if self._keys is None:  # a simple body's blob: every key ends in LF, none has a CR
            self._keys = self.blob.splitlines(keepends=True)
        return self._keys

    def span(self, first: int, stop: int) -> bytes:
        if self._starts is None:
            self._starts = array("q", accumulate(map(len, self.keys), initial=0))
        return self.blob[self._starts[first] : self._starts[stop]]


class Shape(NamedTuple):
    """What placement needs of a hunk (a tuple: one is made per hunk, 30k for a large diff)."""

    first: int
    prefix: int  # leading context lines
    suffix: int  # trailing context lines
    kinds: bytes  # one byte a body line: b" ", b"-" or b"+" (see Hunk.kinds)
    last_context: int  # index of the last context line, -1 when none
    pattern: Pattern
    lines: list[bytes] | None  # a simple body's lines, without their LF


class Matcher:
    """GNU patch's ``locate_hunk`` over one file's pre-image.

    Lines are compared as spans of the file's bytes (a CRLF file's with its CRLFs read as
    LF), so a 300k-line file is never split into 300k objects on the way to a match."""

    def __init__(self, data: bytes) -> None:
        self.data = data if b"\r\n" not in data else data.replace(b"\r\n", b"\n")
        self.size = self.data.count(b"\n") + (not self.data.endswith(b"\n") and bool(self.data))
        self._starts: array[int] | None = None
        self._keys: list[Key] | None = None

    @property
    def starts(self) -> array[int]:
        """Where each line starts (made on the first search off the diff's own guess)."""
        if self._starts is None:
            self._starts = line_starts(self.data)
        return self._starts

    @property
    def keys(self) -> list[Key]:
        """Every line's key (made on the first far search or failure only)."""
        if self._keys is None:
            self._keys = split_lines(self.data)
        return self._keys

    def matches(self, where: int, pattern: Pattern, prefix_fuzz: int, suffix_fuzz: int) -> bool:
        """GNU ``patch_match``: pattern lines [prefix_fuzz, len - suffix_fuzz) at ``where``."""
        base = where - 1
        stop = pattern.count - suffix_fuzz
        if base + prefix_fuzz < 0 or base + stop > self.size:
            return False
        if prefix_fuzz >= stop:
            return True  # nothing left to compare
        starts = self.starts
        found = self.data[starts[base + prefix_fuzz] : starts[base + stop]]
        if prefix_fuzz == 0 and suffix_fuzz == 0:
            return found == pattern.blob
        return found == pattern.span(prefix_fuzz, stop)

    def locate(self, hunk: Shape, fuzz: int, in_offset: int, frozen: int) -> int:
        """1-based line where the hunk's old side starts, or 0 if none."""
        n_input = self.size
        pattern = hunk.pattern
        pat_lines = pattern.count
        first_guess = hunk.first + in_offset
        prefix, suffix = hunk.prefix, hunk.suffix
        if (
            fuzz == 0
            and prefix == suffix
            and pat_lines
            and frozen < first_guess <= n_input - pat_lines + 1
            and self.matches(first_guess, pattern, 0, 0)
        ):
            return first_guess  # where the walk below probes first (most hunks sit there)
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
        anchor = pattern.keys[prefix_fuzz]
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
        self, low: int, high: int, pattern: Pattern, prefix_fuzz: int, suffix_fuzz: int
    ) -> int:
        """The first line in [low, high] where the pattern matches, or 0."""
        near = min(high, low + _WALK)
        for where in range(low, near + 1):
            if self.matches(where, pattern, prefix_fuzz, suffix_fuzz):
                return where
        if near == high or prefix_fuzz >= pattern.count - suffix_fuzz:
            return 0
        anchor = pattern.keys[prefix_fuzz]
        for where in compress(count(1 - prefix_fuzz), map(anchor.__eq__, self.keys)):
            if near < where <= high and self.matches(where, pattern, prefix_fuzz, suffix_fuzz):
                return where
        return 0

    def nearest(self, pattern: Sequence[Key], guess: int) -> tuple[int, int]:
        """(line, votes) of the window sharing the most lines with ``pattern``, ties
        nearest ``guess``; (0, 0) when no window does. One pass over the file: each
        file line equal to a pattern line votes for the window that would align them."""
        wanted: dict[Key, list[int]] = {}
        for index, key in enumerate(pattern):
            wanted.setdefault(key, []).append(index)
        last = self.size - len(pattern) + 1  # the last window that fits
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
