"""RECORD, a wheel's list of members with their sha256 and size (PEP 376, PEP 427).

RECORD is CSV: about 600 vLLM members have commas in their names
(fused_moe/configs/E=1,N=14336,...), so their rows must be quoted. Rows are
read and written with the ``csv`` module in pypa/installer's dialect
(records.py), which is what pip and installer read.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
from collections.abc import Iterable

from bakery.errors import WheelError

__all__ = ["hash_field", "record_hash", "record_hash_file", "parse_record", "record_bytes"]


class _RecordDialect(csv.excel):
    # Excel's quoting, with "\n" line ends as installer and wheel write them.
    lineterminator = "\n"


def hash_field(digest: bytes) -> str:
    """The RECORD hash field of a sha256 digest: ``sha256=`` and the urlsafe base64
    digest without padding."""
    return "sha256=" + base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def record_hash(data: bytes) -> str:
    """The RECORD hash field of ``data``."""
    return hash_field(hashlib.sha256(data).digest())


def record_hash_file(path) -> str:
    """``record_hash`` of a file, read in chunks (vLLM ships .so files of hundreds of MB)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return hash_field(digest.digest())


def parse_record(text: str, where: str) -> dict[str, str]:
    """RECORD -> member -> "sha256=..." (rows without a hash, such as RECORD's own, are
    left out); every row that is not ``path,hash,size`` is reported at once."""
    record: dict[str, str] = {}
    bad: list[str] = []
    reader = csv.reader(io.StringIO(text, newline=""), _RecordDialect)
    try:
        for row in reader:
            if len(row) != 3:
                bad.append(f"row {reader.line_num}: {row!r}")
            elif row[1]:
                record[row[0]] = row[1]
    except csv.Error as exc:
        bad.append(f"row {reader.line_num}: {exc}")
    if bad:
        raise WheelError(
            f"{where}: RECORD rows are not path,hash,size ({len(bad)}): " + "; ".join(bad[:5])
        )
    return record


def record_bytes(rows: Iterable[tuple[str, str, str | int]]) -> bytes:
    """RECORD's bytes for ``(path, hash, size)`` rows, quoted where a field needs it."""
    out = io.StringIO(newline="")
    csv.writer(out, _RecordDialect).writerows(rows)
    return out.getvalue().encode()
