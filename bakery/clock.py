"""UTC time stamps: the one clock behind run folders, records and reports.

Always UTC, so stamps from two hosts compare and sort; a naive ``datetime`` (local
time of unknown zone) is refused rather than guessed at.
"""

from __future__ import annotations

from datetime import UTC, datetime

__all__ = ["FOLDER", "ISO", "MINUTE", "utc_stamp"]

FOLDER = "%Y%m%dT%H%M%SZ"  # a folder name: no ":" or spaces, sorts in time order
ISO = "%Y-%m-%dT%H:%M:%S+00:00"  # ISO 8601 to the second, as datetime.isoformat writes it
MINUTE = "%Y-%m-%d %H:%M UTC"  # for a human reading a report header


def utc_stamp(fmt: str = FOLDER, now: datetime | None = None) -> str:
    """``now`` (default: this instant) in UTC, formatted with ``fmt``."""
    if now is None:
        now = datetime.now(UTC)
    elif now.tzinfo is None:
        raise ValueError(f"naive datetime (no time zone), cannot be put in UTC: {now!r}")
    return now.astimezone(UTC).strftime(fmt)
