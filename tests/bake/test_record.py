"""RECORD rows on their own (fast): written by ``record_bytes``, read back by ``csv`` and
hashed by hashlib as PEP 376 spells it, never by the code under test.

RECORD is CSV: names with commas or quotes round-trip through the patched wheel.

Issue 22, finding 18: a wrong RECORD hash for an untouched member of the base wheel is
not copied into the patched wheel. pip copies a wheel's RECORD hashes into the installed
RECORD unchecked (and the wheel spec has installers refuse a wheel whose RECORD is wrong),
so the patched wheel records the member's real hash; pip, installing it, is the reader.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import subprocess
import sys
import zipfile
from base64 import urlsafe_b64encode
from pathlib import Path

import pytest
from packaging.version import Version

from bakery.bake.record import parse_record, record_bytes, record_hash
from bakery.bake.wheel import read_wheel, write_patched_wheel
from bakery.errors import WheelError
from bakery.series.diff import render_file_diff
from tests._synthetic_release import OLD, PATCHED, pin_toml, wheel
from tests.conftest import run_cli

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


# The shapes vLLM ships (fused_moe configs) plus a quote, which csv must double.
ODD_NAMES = [
    "demo/configs/E=1,N=14336,device_name=NVIDIA_A100-SXM4-80GB.json",
    'demo/say "hi".py',
    "demo/plain.py",
]


def _csv_rows(text: str) -> list[list[str]]:
    return list(csv.reader(io.StringIO(text, newline="")))


def _base_wheel(tmp_path: Path, record_text: str | None = None) -> Path:
    """A small real wheel whose RECORD is written by the csv module (as setuptools does)."""
    path = tmp_path / "demo-1.0-py3-none-any.whl"
    members = {name: f"# {name}\n".encode() for name in ODD_NAMES}
    members["demo-1.0.dist-info/METADATA"] = b"Metadata-Version: 2.1\nName: demo\nVersion: 1.0\n"
    members["demo-1.0.dist-info/WHEEL"] = b"Wheel-Version: 1.0\nRoot-Is-Purelib: true\n"
    if record_text is None:
        out = io.StringIO(newline="")
        writer = csv.writer(out, lineterminator="\n")
        writer.writerows((n, record_hash(d), len(d)) for n, d in members.items())
        writer.writerow(("demo-1.0.dist-info/RECORD", "", ""))
        record_text = out.getvalue()
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in members.items():
            zf.writestr(name, data)
        zf.writestr("demo-1.0.dist-info/RECORD", record_text)
    return path


def test_record_names_with_commas_and_quotes_are_read_as_csv(tmp_path):
    base = read_wheel(_base_wheel(tmp_path))
    assert sorted(n for n in base.record if n.startswith("demo/")) == sorted(ODD_NAMES)


def test_patched_wheel_record_is_csv_with_one_row_per_member(tmp_path):
    base = read_wheel(_base_wheel(tmp_path))
    out = tmp_path / "demo-1.0+p.1-py3-none-any.whl"
    replaced = {ODD_NAMES[0]: b'{"patched": 1}\n', ODD_NAMES[1]: None}
    write_patched_wheel(base, out, Version("1.0+p.1"), replaced, {"BAKED.json": b"{}\n"})
    with zipfile.ZipFile(out) as zf:
        names = zf.namelist()
        rows = _csv_rows(zf.read(names[-1]).decode())
        assert [r[0] for r in rows] == names and names[-1] == "demo-1.0+p.1.dist-info/RECORD"
        assert all(len(row) == 3 for row in rows), rows
        for member, digest, size in rows[:-1]:
            data = zf.read(member)
            assert (digest, int(size)) == (record_hash(data), len(data)), member
    assert ODD_NAMES[0] in names and ODD_NAMES[1] not in names


@pytest.mark.parametrize(
    "bad_row",
    ["demo/plain.py,sha256=x", "demo/plain.py,sha256=x,1,extra", '"demo/unterminated.py,sha,1'],
)
def test_a_record_row_that_is_not_three_fields_is_refused(tmp_path, bad_row):
    wheel = _base_wheel(tmp_path, f"demo/ok.py,sha256=y,2\n{bad_row}\n")
    with pytest.raises(WheelError, match="RECORD rows are not path,hash,size") as caught:
        read_wheel(wheel)
    assert caught.value.exit_code == 1


UNTOUCHED = "vllm/d.py"


def _real_hash(path: Path) -> str:
    return (
        "sha256="
        + urlsafe_b64encode(hashlib.sha256(path.read_bytes()).digest()).rstrip(b"=").decode()
    )


def _bake(tmp_path: Path) -> tuple[subprocess.CompletedProcess, Path, dict]:
    cache, series, build = tmp_path / "cache", tmp_path / "series", tmp_path / "build"
    files = {"a.py": OLD["a.py"], "d.py": b"D = 'untouched'\n"}
    pin = wheel(cache, "vllm", "0.1.0", files, wrong=frozenset({UNTOUCHED}))
    series.mkdir(exist_ok=True)
    (series / "01-a.py.diff").write_bytes(render_file_diff("a.py", OLD["a.py"], PATCHED["a.py"]))
    (series / "series.toml").write_text(
        'name = "t"\npackage = "vllm"\n\n[policy]\nstrip = 1\nmax_fuzz = 0\n\n'
        + pin_toml("default", pin)
        + '[[patches]]\nfile = "01-a.py.diff"\nstage = 1\nsummary = "a"\n'
    )
    env = {"BAKERY_CACHE": str(cache)}
    proc = run_cli("bake", "--series", str(series), "--build", str(build), env=env)
    return proc, build, pin


def test_the_patched_wheel_records_the_real_hash_and_pip_installs_it_true(tmp_path):
    proc, build, pin = _bake(tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert f"wrong hash for 1 member(s) (first '{UNTOUCHED}')" in proc.stderr
    (out,) = (build / "dist").glob("*.whl")
    target = tmp_path / "site"
    pip = [sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "--quiet"]
    subprocess.run([*pip, "--target", str(target), str(out)], check=True)
    (record,) = target.glob("vllm-*.dist-info/RECORD")
    rows = list(csv.reader(record.read_text().splitlines()))
    hashed = {name: digest for name, digest, _ in rows if digest}
    assert UNTOUCHED in hashed and "vllm/a.py" in hashed
    for name, digest in hashed.items():  # pip's installed RECORD, against hashlib
        assert digest == _real_hash(target / name), name


def test_the_errata_are_found_once_and_kept_the_wheel_stays_byte_identical(tmp_path):
    proc, build, pin = _bake(tmp_path)
    assert proc.returncode == 0, proc.stderr
    (out,) = (build / "dist").glob("*.whl")
    first = out.read_bytes()
    kept = build / ".pristine" / f"{pin['sha256']}.record.json"  # beside the tree they are of
    assert kept.is_file()
    kept.unlink()  # as a tree an older bakery extracted: found again from the wheel
    series, env = tmp_path / "series", {"BAKERY_CACHE": str(tmp_path / "cache")}
    for _ in range(2):  # then read from what was kept
        again = run_cli("bake", "--series", str(series), "--build", str(build), env=env)
        assert again.returncode == 0 and "wrong hash for 1 member(s)" in again.stderr
        assert out.read_bytes() == first and kept.is_file()
    with zipfile.ZipFile(out) as zf:
        assert zf.read(UNTOUCHED) == b"D = 'untouched'\n"
