"""Every failure bakery reports on purpose: one root, one subclass per kind.

The CLI boundary turns these into one ``error:`` line, an optional hint and an
exit code; anything else escaping is a bug and keeps its traceback.
"""

from __future__ import annotations

__all__ = [
    "BakeryError",
    "UsageError",
    "PatchParseError",
    "UnsafePathError",
    "UnreadableInput",
    "HunkFailed",
    "WriteFailed",
    "SeriesError",
    "HashMismatch",
    "FetchError",
    "PreimageMismatch",
    "WheelError",
    "ManifestError",
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


class HunkFailed(BakeryError):
    """A hunk could not be placed; the message carries the nearest near-match."""


class WriteFailed(BakeryError):
    """Everything placed, but the tree could not be written; every file was put back."""


class HashMismatch(BakeryError):
    """Downloaded or given bytes are not the pinned bytes."""


class FetchError(BakeryError):
    """The pinned artifact could not be fetched."""


class PreimageMismatch(BakeryError):
    """A file the series touches is not what the base wheel's RECORD says."""


class WheelError(BakeryError):
    """A wheel that cannot be read or rewritten safely."""


class ManifestError(BakeryError):
    """A BAKED.json that is unreadable, of the wrong shape, or names paths outside its tree."""

    exit_code = 2
