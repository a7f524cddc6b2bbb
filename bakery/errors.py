"""Every failure bakery reports on purpose: one root, one subclass per kind.

The CLI boundary turns these into one ``error:`` line, an optional hint and an
exit code; anything else escaping is a bug and keeps its traceback.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "BakeryError",
    "UsageError",
    "PatchParseError",
    "UnsafePathError",
    "UnreadableInput",
    "HunkFailed",
    "NearMatch",
    "WriteFailed",
    "SeriesError",
    "HashMismatch",
    "FetchError",
    "IndexUnreachable",
    "PreimageMismatch",
    "WheelError",
    "ManifestError",
    "InputTooLarge",
]


class BakeryError(Exception):
    """Root of bakery's own errors. ``exit_code`` 1 means "the work failed"."""

    exit_code = 1

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.hint = hint


class UsageError(BakeryError):
    """The invocation itself is wrong (flags, arguments)."""

    exit_code = 2


class PatchParseError(BakeryError):
    """A diff that is malformed, empty, binary or otherwise unreadable."""

    exit_code = 2


class UnsafePathError(BakeryError):
    """A path that would read or write outside the target tree."""

    exit_code = 2


class UnreadableInput(BakeryError):
    """An input that exists but cannot be read (permissions, I/O errors)."""

    exit_code = 2


class SeriesError(BakeryError):
    """series.toml and the patch directory disagree or are malformed."""

    exit_code = 2


@dataclass(frozen=True)
class NearMatch:
    """Where a failed hunk came closest: the window sharing the most lines with its old side."""

    line: int  # 1-based file line the window starts at
    offset: int  # line - where the diff header put the hunk
    differing: int  # lines of the window that are not the hunk's


class HunkFailed(BakeryError):
    """A hunk (or a whole file's patch) could not be placed.

    The fields say what failed, so no caller parses the message: ``patch`` and
    ``path`` name the patch and its file, ``hunk`` the 1-based hunk number (None
    when the file itself is wrong: missing, already there, or not what a deletion
    expects), ``expected`` the line the hunk was looked for near, and ``nearest``
    its nearest near-match (None when there is none: no line of the hunk is in the
    file, or the file is shorter than the hunk)."""

    def __init__(
        self,
        message: str,
        *,
        patch: str,
        path: str,
        hunk: int | None = None,
        expected: int | None = None,
        nearest: NearMatch | None = None,
        hint: str | None = None,
    ) -> None:
        super().__init__(message, hint=hint)
        self.patch = patch
        self.path = path
        self.hunk = hunk
        self.expected = expected
        self.nearest = nearest


class WriteFailed(BakeryError):
    """Everything placed, but the tree could not be written; every file was put back."""


class HashMismatch(BakeryError):
    """Downloaded or given bytes are not the pinned bytes."""


class FetchError(BakeryError):
    """The pinned artifact could not be fetched."""


class IndexUnreachable(FetchError):
    """The package index could not be asked at all (offline, a wrong index URL): the
    question could not be put, so it is the input's exit code, not the work's."""

    exit_code = 2


class PreimageMismatch(BakeryError):
    """A file the series touches is not what the base wheel's RECORD says."""


class WheelError(BakeryError):
    """A wheel that cannot be read or rewritten safely."""


class ManifestError(BakeryError):
    """A BAKED.json that is unreadable, of the wrong shape, or names paths outside its tree."""

    exit_code = 2


class InputTooLarge(OSError):
    """An input over the read bound (EFBIG, as the kernel's refusal of a write past the
    file size limit is: the boundary tells the two apart by this type). An ``OSError``,
    not a ``BakeryError``: readers that catch ``OSError`` for unreadable input catch it."""
