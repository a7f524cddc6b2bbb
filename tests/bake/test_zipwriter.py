"""The raw-copy zip writer on its own (fast): what it writes is read back by ``zipfile``
(names, bytes, CRCs, modes, the fixed 1980 timestamp), and a copied member's compressed
bytes are compared byte for byte with the source's."""

from __future__ import annotations

import io
import random
import zipfile
from pathlib import Path

import pytest

from bakery.bake import zipwriter
from bakery.bake.zipwriter import ZipWriter
from bakery.errors import WheelError

# Words in a seeded random order: deflate level 9 and level 6 give different bytes for it.
_WORDS = ["alpha", "beta", "gamma", "delta", "x", "y=1", "def", "return"]
_TEXT = " ".join(random.Random(1).choice(_WORDS) for _ in range(20000)).encode()

SOURCE = {
    "pkg/deflated.py": (_TEXT, zipfile.ZIP_DEFLATED, 0o100755 << 16),
    "pkg/stored.bin": (random.Random(2).randbytes(3000), zipfile.ZIP_STORED, 0o100644 << 16),
    "pkg/ünïcode,name.py": (b"x = 1\n", zipfile.ZIP_DEFLATED, 0o100644 << 16),
}


def _source_zip(tmp_path: Path) -> Path:
    path = tmp_path / "source.zip"
    with zipfile.ZipFile(path, "w") as zf:
        for name, (data, method, attr) in SOURCE.items():
            info = zipfile.ZipInfo(name, date_time=(2024, 5, 6, 7, 8, 10))
            info.compress_type, info.external_attr = method, attr
            zf.writestr(info, data, compresslevel=9)
    return path


def _compressed(path: Path, name: str) -> bytes:
    """A member's stored (compressed) bytes, located with zipfile's own directory."""
    with zipfile.ZipFile(path) as zf:
        info = zf.getinfo(name)
    with open(path, "rb") as raw:
        raw.seek(info.header_offset + 26)
        name_len, extra_len = (int.from_bytes(raw.read(2), "little") for _ in range(2))
        raw.seek(info.header_offset + 30 + name_len + extra_len)
        return raw.read(info.compress_size)


def _assert_copied_raw(out: Path, source: Path) -> None:
    with zipfile.ZipFile(out) as zf:
        methods = {i.filename: i.compress_type for i in zf.infolist()}
    for name, (_, method, _) in SOURCE.items():
        assert methods[f"copied/{name}"] == method
        # compresslevel=9 in the source: a re-deflate at zipfile's default 6 would differ.
        assert _compressed(out, f"copied/{name}") == _compressed(source, name), name


def _write(tmp_path: Path, out_name: str = "out.zip") -> Path:
    source = _source_zip(tmp_path)
    out = tmp_path / out_name
    with zipfile.ZipFile(source) as zf, open(source, "rb") as raw, open(out, "wb") as dst:
        writer = ZipWriter(dst)
        writer.add_bytes("new/added.txt", b"added\n" * 100, 0o100600 << 16)
        for info in zf.infolist():
            writer.add_raw("copied/" + info.filename, raw, info)
        writer.finish()
    return out


def _assert_sound(path: Path, expected: dict[str, tuple[bytes, int]]) -> None:
    """zipfile reads every member back: names in order, bytes, modes, CRCs, timestamps."""
    with zipfile.ZipFile(path) as zf:
        assert zf.testzip() is None  # every CRC matches the bytes
        assert zf.namelist() == list(expected)
        for info in zf.infolist():
            data, attr = expected[info.filename]
            assert zf.read(info) == data, info.filename
            assert info.external_attr == attr and info.date_time == (1980, 1, 1, 0, 0, 0)
            assert info.create_system == 3 and info.flag_bits & 0x800  # Unix mode, UTF-8 name


EXPECTED = {
    "new/added.txt": (b"added\n" * 100, 0o100600 << 16),
    **{f"copied/{n}": (data, attr) for n, (data, _, attr) in SOURCE.items()},
}


def test_written_zip_reads_back_with_zipfile(tmp_path):
    _assert_sound(_write(tmp_path), EXPECTED)


def test_copied_members_keep_their_compressed_bytes_and_method(tmp_path):
    _assert_copied_raw(_write(tmp_path), tmp_path / "source.zip")


def test_planted_re_deflating_copy_is_caught(tmp_path, monkeypatch):
    def re_deflate(self, name, source, info):
        with zipfile.ZipFile(source) as zf:
            self.add_bytes(name, zf.read(info), info.external_attr)

    monkeypatch.setattr(ZipWriter, "add_raw", re_deflate)
    out = _write(tmp_path)
    _assert_sound(out, EXPECTED)  # the zip itself is still sound ...
    with pytest.raises(AssertionError):  # ... but the members were not copied raw
        _assert_copied_raw(out, tmp_path / "source.zip")


def test_same_input_gives_the_same_bytes(tmp_path):
    assert _write(tmp_path, "a.zip").read_bytes() == _write(tmp_path, "b.zip").read_bytes()


def test_planted_wrong_crc_is_caught(tmp_path, monkeypatch):
    monkeypatch.setattr(zipwriter.zlib, "crc32", lambda data: 12345)
    with pytest.raises((AssertionError, zipfile.BadZipFile)):
        _assert_sound(_write(tmp_path), EXPECTED)


def test_a_truncated_source_member_is_refused(tmp_path):
    source = _source_zip(tmp_path)
    with zipfile.ZipFile(source) as zf:
        info = zf.getinfo("pkg/stored.bin")
    whole = source.read_bytes()
    cut = io.BytesIO(whole[: info.header_offset + 30 + len(info.filename.encode()) + 10])
    with pytest.raises(WheelError, match="truncated member"):
        ZipWriter(io.BytesIO()).add_raw(info.filename, cut, info)


def test_a_directory_entry_pointing_at_no_header_is_refused(tmp_path):
    source = _source_zip(tmp_path)
    with zipfile.ZipFile(source) as zf:
        info = zf.getinfo("pkg/stored.bin")
    info.header_offset += 1
    with open(source, "rb") as raw, pytest.raises(WheelError, match="no local header"):
        ZipWriter(io.BytesIO()).add_raw(info.filename, raw, info)
