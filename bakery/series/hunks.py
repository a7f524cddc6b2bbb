"""A diff's frozen types: ``Patch`` -> ``FilePatch`` -> ``Hunks`` of ``Hunk`` -> ``HunkLine``.

A file's hunks are kept as the diff's own bytes and one row of numbers a hunk, so a large diff
costs little more than its bytes; ``Hunk`` objects and their lines are made on demand. The
parser that makes them is ``bakery.series.diff``.
"""

from __future__ import annotations

import re
from array import array
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import TypeVar, overload

__all__ = ["HunkLine", "Hunk", "Hunks", "Rows", "FilePatch", "Patch"]

_ADDED, _REMOVED, _MARKER = b"+-\\"
_LF = b"\n"[0]
_KINDS = {_ADDED: "+", _REMOVED: "-"}
# A body's kinds, one byte a line: every line that is not "+", "-" or a marker is context.
_LINE_START = re.compile(rb"^.", re.MULTILINE | re.DOTALL)
_AS_KIND = bytes(c if c in b"+-\\" else b" "[0] for c in range(256))
_REVERSE = re.compile(rb"^[+-]", re.MULTILINE)


T = TypeVar("T")


@dataclass(frozen=True, slots=True)  # millions of them for a large diff
class HunkLine:
    kind: str  # " " context, "-" removed, "+" added
    text: bytes  # without the line ending
    eol: bytes  # b"\n", b"\r\n", or b"" ("\ No newline at end of file")

    @property
    def raw(self) -> bytes:
        return self.text + self.eol


@dataclass(frozen=True, slots=True)  # one per hunk: 30k for a large diff
class Hunk:
    number: int  # 1-based within its file
    old_start: int
    old_len: int
    new_start: int
    new_len: int
    body: bytes  # its lines as the diff has them, "\\ No newline" markers included

    @property
    def lines(self) -> tuple[HunkLine, ...]:
        """GNU's reading: a marker takes the line before it its ending; "" is empty context."""
        body = self.body
        lines: list[HunkLine] = []
        pos, size = 0, len(body)
        while pos < size:
            end = body.find(b"\n", pos) + 1 or size
            first = body[pos]
            if first == _MARKER:  # never the first line: the parser refuses that
                lines[-1] = replace(lines[-1], eol=b"")
            else:
                crlf = end - pos >= 2 and body[end - 2 : end] == b"\r\n"
                eol = b"\r\n" if crlf else b"\n" if body[end - 1] == _LF else b""
                lines.append(HunkLine(_KINDS.get(first, " "), body[pos + 1 : end - len(eol)], eol))
            pos = end
        return tuple(lines)

    @property
    def kinds(self) -> bytes:
        """One byte a line, ``b" "``, ``b"-"`` or ``b"+"`` (markers left out), at C speed."""
        return b"".join(_LINE_START.findall(self.body)).translate(_AS_KIND, b"\\")

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
        return len(self.kinds) - len(self.kinds.lstrip(b" "))

    @property
    def suffix_context(self) -> int:
        return len(self.kinds) - len(self.kinds.rstrip(b" "))

    def reversed(self) -> Hunk:
        return replace(
            self,
            old_start=self.new_start,
            old_len=self.new_len,
            new_start=self.old_start,
            new_len=self.old_len,
            body=_REVERSE.sub(lambda m: b"-" if m[0] == b"+" else b"+", self.body),
        )


class Rows(Sequence[T]):
    """A sequence kept as ``WIDTH`` numbers an item in one array, each item made only when
    asked for (30k small objects cost more than their numbers)."""

    __slots__ = ("rows",)
    WIDTH: int
    ITEM: str  # what an item is called, for the IndexError

    rows: array[int]

    def _item(self, index: int) -> T:
        raise NotImplementedError

    def __len__(self) -> int:
        return len(self.rows) // self.WIDTH

    @overload
    def __getitem__(self, index: int) -> T: ...
    @overload
    def __getitem__(self, index: slice) -> tuple[T, ...]: ...
    def __getitem__(self, index: int | slice) -> T | tuple[T, ...]:
        if isinstance(index, slice):
            return tuple(self[i] for i in range(len(self))[index])
        if not -len(self) <= index < len(self):
            raise IndexError(f"{self.ITEM} index out of range")
        return self._item(index % len(self))

    def __iter__(self) -> Iterator[T]:
        return (self[i] for i in range(len(self)))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Sequence) and tuple(self) == tuple(other)

    def __hash__(self) -> int:
        return hash(tuple(self))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({list(self)!r})"


class Hunks(Rows[Hunk]):
    """A file's hunks as the diff's bytes and one row of numbers a hunk: a ``Hunk`` is made only
    when asked for (30k hunk objects and their bodies cost more than the diff's own bytes)."""

    __slots__ = ("source",)
    WIDTH = 7  # a row: number, old_start, old_len, new_start, new_len, body start, body stop
    ITEM = "hunk"
    # ``source[start - 1]`` is always a newline: the end of the hunk's ``@@`` line.

    def __init__(self, source: bytes, rows: array[int]) -> None:
        self.source = source
        self.rows = rows

    @classmethod
    def of(cls, hunks: Iterable[Hunk]) -> Hunks:
        rows: array[int] = array("q")
        bodies = [b"\n"]  # as in a diff, every body follows a newline (the engine counts on it)
        size = 1
        for h in hunks:
            rows.extend((h.number, h.old_start, h.old_len, h.new_start, h.new_len, size))
            size += len(h.body)
            rows.append(size)
            bodies.append(h.body)
        return cls(b"".join(bodies), rows)

    def row(self, index: int) -> array[int]:
        return self.rows[index * self.WIDTH : (index + 1) * self.WIDTH]

    def _item(self, index: int) -> Hunk:
        number, old_start, old_len, new_start, new_len, start, stop = self.row(index)
        return Hunk(number, old_start, old_len, new_start, new_len, self.source[start:stop])


@dataclass(frozen=True)
class FilePatch:
    old_path: str | None  # tree-relative; None for /dev/null
    new_path: str | None
    hunks: Sequence[Hunk]  # always a Hunks once made (other sequences are turned into one)
    new_mode: int | None = None  # from a git extended header

    def __post_init__(self) -> None:
        if not isinstance(self.hunks, Hunks):
            object.__setattr__(self, "hunks", Hunks.of(self.hunks))

    @property
    def table(self) -> Hunks:
        assert isinstance(self.hunks, Hunks)  # __post_init__
        return self.hunks

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
            hunks=Hunks.of(h.reversed() for h in self.hunks),
        )


@dataclass(frozen=True)
class Patch:
    name: str  # the patch file's name, for messages
    files: tuple[FilePatch, ...]
    data: bytes = field(repr=False, compare=False)  # the bytes as given
    missing_final_newline: bool = False

    @cached_property
    def sha256(self) -> str:
        """Of the bytes as given; hashed when asked (placing needs no hash, nor OpenSSL loaded)."""
        import hashlib

        return hashlib.sha256(self.data).hexdigest()

    @property
    def paths(self) -> tuple[str, ...]:
        return tuple(f.path for f in self.files)

    def reversed(self) -> Patch:
        return replace(self, files=tuple(f.reversed() for f in reversed(self.files)))
