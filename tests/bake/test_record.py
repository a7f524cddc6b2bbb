"""RECORD rows on their own (fast): written by ``record_bytes``, read back by ``csv`` and
hashed by hashlib as PEP 376 spells it, never by the code under test."""

from __future__ import annotations

import base64
import csv
import hashlib
import io

import pytest

from bakery.bake.record import parse_record, record_bytes, record_hash
from bakery.errors import WheelError

ROWS = [
    ("vllm/configs/E=1,N=14336,device_name=NVIDIA_A100-SXM4-80GB.json", "sha256=AAA", 12),
    ('vllm/say "hi".py', "sha256=BBB", 3),
    ("vllm/plain.py", "sha256=CCC", 0),
    ("vllm-0.32.0.dist-info/RECORD", "", ""),
]


def _assert_reads_back(write_rows) -> None:
    """What pip and installer read from the bytes: one line per row, three fields, as given."""
    data = write_rows(ROWS)
    assert b"\r" not in data and data.endswith(b"\n")
    read = list(csv.reader(io.StringIO(data.decode(), newline="")))
    assert read == [[str(field) for field in row] for row in ROWS]


def test_record_rows_read_back_with_csv():
    _assert_reads_back(record_bytes)


def test_planted_unquoted_writer_is_caught():
    # The writer before RECORD became CSV: f-strings, no quoting.
    def unquoted(rows):
        return "".join(f"{p},{h},{s}\n" for p, h, s in rows).encode()

    with pytest.raises(AssertionError):
        _assert_reads_back(unquoted)


@pytest.mark.parametrize("data", [b"", b"x", b"hello\n" * 1000])
def test_record_hash_is_pep_376s(data: bytes):
    # sha256, urlsafe base64 without "=" padding (what pip checks on install)
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    assert record_hash(data) == f"sha256={digest}"


def test_parse_record_reads_what_csv_writes():
    out = io.StringIO(newline="")
    csv.writer(out, lineterminator="\r\n").writerows(ROWS)  # CRLF rows, as some tools write
    parsed = parse_record(out.getvalue(), "demo")
    assert parsed == {path: digest for path, digest, _ in ROWS if digest}


def test_parse_record_reports_every_bad_row_at_once():
    text = "a.py,sha256=x,1\nb.py,sha256=y\nc.py\nd.py,sha256=z,1,extra\n"
    with pytest.raises(WheelError, match=r"\(3\): row 2: .*row 3: .*row 4: ") as caught:
        parse_record(text, "demo-1.0.dist-info")
    assert caught.value.exit_code == 1
