"""Issue 22, finding 14 and the wheel-member tracebacks of 16: an extraction is bounded,
a failed one leaves no partial tree for the retry, and a member zipfile cannot read is one
WheelError (bakery.bake.wheel.extract and bake.pristine, on real zip files)."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest

from bakery.bake import pristine as pristine_mod
from bakery.bake import wheel as wheel_mod
from bakery.errors import WheelError


def info(path: Path) -> wheel_mod.WheelInfo:
    return wheel_mod.WheelInfo(path, "vllm", None, "vllm-0.dist-info", {})  # type: ignore[arg-type]


def test_a_zip_bomb_is_refused_before_anything_is_written(tmp_path):
    path = tmp_path / "bomb.whl"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        with zf.open("vllm/zeros.bin", "w", force_zip64=True) as out:
            for _ in range(300):
                out.write(bytes(1 << 20))  # 300 MiB of zeros: a few hundred KiB zipped
    assert path.stat().st_size < 2 << 20
    dest = tmp_path / "out"
    with pytest.raises(WheelError, match="would extract to 314572800 bytes, over its bound"):
        wheel_mod.extract(info(path), dest)
    assert not dest.exists()


def test_a_member_with_a_bad_crc_is_one_wheel_error(tmp_path):
    path = tmp_path / "bad.whl"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as zf:
        zf.writestr("vllm/a.py", b"A = 1\n" * 100)
    data = bytearray(path.read_bytes())
    at = data.index(b"A = 1\n")
    data[at] = ord("B")  # the stored bytes no longer match their CRC
    path.write_bytes(bytes(data))
    with pytest.raises(WheelError, match=r"member 'vllm/a.py' cannot be read \(Bad CRC"):
        wheel_mod.extract(info(path), tmp_path / "out")


def test_a_failed_extraction_leaves_nothing_for_the_retry(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    (cache / "pristine").mkdir(parents=True)
    calls = []

    def full_disk(wheel, dest):
        dest.mkdir(parents=True)
        (dest / "half.py").write_bytes(b"x")
        calls.append(dest)
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(pristine_mod, "extract", full_disk)
    for _ in range(3):
        with pytest.raises(OSError):
            pristine_mod.pristine(info(tmp_path / "w.whl"), "ab" * 32, cache)
        assert list((cache / "pristine").iterdir()) == []  # nothing piles up
    assert len(calls) == 3
