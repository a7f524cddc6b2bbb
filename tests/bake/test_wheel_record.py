"""RECORD is CSV: names with commas or quotes round-trip through the patched wheel."""

from __future__ import annotations

import csv
import io
import zipfile
from pathlib import Path

import pytest
from packaging.version import Version

from bakery.bake.record import record_hash
from bakery.bake.wheel import read_wheel, write_patched_wheel
from bakery.errors import WheelError

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
