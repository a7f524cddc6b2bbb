"""The wheel module on tiny synthetic wheels (fast): reading, extracting, Requires-Dist,
and the patched copy. Wheels are built here with ``zipfile``; what comes out is read back
with ``zipfile``, ``csv`` and ``hashlib``, never with the module's own parser.

Issue 22, finding 14 and the wheel-member tracebacks of 16: an extraction is bounded,
a failed one leaves no partial tree for the retry, and a member zipfile cannot read is one
WheelError (bakery.bake.wheel.extract and bake.pristine, on real zip files).
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import random
import stat
import zipfile
from pathlib import Path, PurePosixPath

import pytest
from packaging.version import Version

from bakery.bake import pristine as pristine_mod
from bakery.bake import wheel
from bakery.bake import wheel as wheel_mod
from bakery.bake.wheel import (
    extract,
    extract_sources,
    patched_wheel_name,
    pinned_requirement,
    read_members,
    read_wheel,
    write_patched_wheel,
)
from bakery.bake.zipwriter import ZipWriter
from bakery.errors import UnsafePathError, WheelError

DIST = "Demo_Pkg-1.0.dist-info"
METADATA = b"Metadata-Version: 2.1\nName: Demo_Pkg\nVersion: 1.0\n"
MEMBERS = {
    "demo/__init__.py": b"",
    "demo/core.py": b"def f():\n    return 1\n" * 200,
    "demo/tool.py": b"#!/usr/bin/env python\n",
    "demo/_C.so": b"\x7fELF not really",
    "demo/data/E=1,N=2.json": b"{}\n",
}
EXECUTABLE = {"demo/tool.py"}


def _hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def _make_wheel(
    folder: Path,
    members: dict[str, bytes] | None = None,
    *,
    metadata: bytes = METADATA,
    unrecorded: frozenset[str] = frozenset(),
    symlink: str | None = None,
) -> Path:
    """A wheel as setuptools writes one: members, METADATA, WHEEL, then a csv RECORD."""
    members = {
        **(MEMBERS if members is None else members),
        f"{DIST}/METADATA": metadata,
        f"{DIST}/WHEEL": b"Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    out = io.StringIO(newline="")
    rows = csv.writer(out, lineterminator="\n")
    rows.writerows((n, _hash(d), len(d)) for n, d in members.items() if n not in unrecorded)
    rows.writerow((f"{DIST}/RECORD", "", ""))
    path = folder / "Demo_Pkg-1.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as zf:
        for name, data in {**members, f"{DIST}/RECORD": out.getvalue().encode()}.items():
            info = zipfile.ZipInfo(name, date_time=(2025, 1, 2, 3, 4, 6))
            info.compress_type = zipfile.ZIP_DEFLATED
            mode = 0o755 if name in EXECUTABLE else 0o644
            info.external_attr = (stat.S_IFREG | mode) << 16
            zf.writestr(info, data, compresslevel=9)
        if symlink:
            info = zipfile.ZipInfo(symlink)
            info.external_attr = (stat.S_IFLNK | 0o777) << 16
            zf.writestr(info, "/etc/passwd")
    return path


# ---- reading ---------------------------------------------------------------------------


def test_read_wheel_name_version_dist_info_and_record(tmp_path):
    info = read_wheel(_make_wheel(tmp_path))
    assert (info.name, info.version, info.dist_info) == ("demo_pkg", Version("1.0"), DIST)
    expected = {n: _hash(d) for n, d in MEMBERS.items()}
    assert {n: h for n, h in info.record.items() if n.startswith("demo/")} == expected


@pytest.mark.parametrize(
    "name", ["../evil.py", "demo/../../evil.py", "/abs/evil.py", "demo\\..\\evil.py"]
)
def test_a_member_that_leaves_the_tree_is_refused(tmp_path, name):
    with pytest.raises(UnsafePathError, match="escapes the tree") as caught:
        read_wheel(_make_wheel(tmp_path, {**MEMBERS, name: b"owned\n"}))
    assert caught.value.exit_code == 2


def test_planted_missing_guard_lets_extract_write_outside(tmp_path, monkeypatch):
    # Without the member check, extract writes '../evil.py' beside the destination:
    # the refusal above is what keeps the wheel inside.
    (tmp_path / "w").mkdir()
    monkeypatch.setattr(wheel, "_safe_member", lambda name, path: None)
    info = read_wheel(_make_wheel(tmp_path / "w", {**MEMBERS, "../evil.py": b"owned\n"}))
    extract(info, tmp_path / "w" / "tree")
    assert (tmp_path / "w" / "evil.py").read_bytes() == b"owned\n"


def test_a_symlink_member_is_refused(tmp_path):
    with pytest.raises(UnsafePathError, match="symlink in wheel"):
        read_wheel(_make_wheel(tmp_path, symlink="demo/link.py"))


def test_two_dist_info_folders_are_refused(tmp_path):
    with pytest.raises(WheelError, match="expected one .dist-info"):
        read_wheel(_make_wheel(tmp_path, {**MEMBERS, "other-2.0.dist-info/METADATA": b""}))


def test_not_a_wheel_is_one_clear_error(tmp_path):
    path = tmp_path / "demo-1.0-py3-none-any.whl"
    path.write_bytes(b"PK\x03\x04 but no zip")
    with pytest.raises(WheelError, match="not a readable wheel") as caught:
        read_wheel(path)
    assert caught.value.exit_code == 1
    with zipfile.ZipFile(path, "w") as zf:  # a zip, but RECORD is missing
        zf.writestr(f"{DIST}/METADATA", METADATA)
    with pytest.raises(WheelError, match="not a readable wheel"):
        read_wheel(path)


def test_extract_writes_every_member_with_its_mode(tmp_path):
    info = read_wheel(_make_wheel(tmp_path))
    dest = tmp_path / "tree"
    extract(info, dest)
    on_disk = {p.relative_to(dest).as_posix(): p for p in dest.rglob("*") if p.is_file()}
    assert set(on_disk) == {*MEMBERS, f"{DIST}/METADATA", f"{DIST}/WHEEL", f"{DIST}/RECORD"}
    for name, data in MEMBERS.items():
        assert on_disk[name].read_bytes() == data
        mode = on_disk[name].stat().st_mode & 0o777
        assert mode == (0o755 if name in EXECUTABLE else 0o644), name


def test_extract_sources_keeps_python_and_stubs_compiled_modules(tmp_path):
    info = read_wheel(_make_wheel(tmp_path))
    dest = tmp_path / "src"
    extract_sources(info, dest)
    found = {p.relative_to(dest).as_posix() for p in dest.rglob("*") if p.is_file()}
    assert found == {n for n in MEMBERS if n.endswith((".py", ".so"))}
    assert (dest / "demo/core.py").read_bytes() == MEMBERS["demo/core.py"]
    assert (dest / "demo/_C.so").read_bytes() == b""
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_read_members_present_and_absent(tmp_path):
    got = read_members(_make_wheel(tmp_path), ["demo/core.py", "demo/missing.py"])
    assert got == {"demo/core.py": MEMBERS["demo/core.py"], "demo/missing.py": None}


# ---- Requires-Dist ---------------------------------------------------------------------

PINNING = METADATA + (
    b"Requires-Dist: torch==2.13.0\n"
    b"Requires-Dist: flashinfer-python>=0.7\n"
    b'Requires-Dist: numpy==2.1; extra == "bench"\n'
    b"Requires-Dist: xformers\n"
    b"\n"
    b"A description body is not a header:\n"
    b"Requires-Dist: flashinfer-python==9.9\n"
)
PINS = {
    "torch": "torch==2.13.0",
    "Torch": "torch==2.13.0",
    "flashinfer_python": None,  # >= is not a pin, and the body line is not a header
    "numpy": "numpy==2.1",
    "xformers": None,
    "absent": None,
}


def _assert_pins(pinned, info) -> None:
    assert {project: pinned(info, project) for project in PINS} == PINS


def test_pinned_requirement_reads_requires_dist_headers(tmp_path):
    _assert_pins(pinned_requirement, read_wheel(_make_wheel(tmp_path, metadata=PINNING)))


def test_planted_line_scanner_is_caught(tmp_path):
    # The scanner this replaced read every 'Requires-Dist:' line, the body's included.
    from packaging.requirements import Requirement

    def line_scanner(info, project):
        with zipfile.ZipFile(info.path) as zf:
            text = zf.read(f"{info.dist_info}/METADATA").decode()
        for line in text.splitlines():
            if line.startswith("Requires-Dist:"):
                req = Requirement(line.split(":", 1)[1].strip())
                specs = list(req.specifier)
                if req.name.replace("_", "-").lower() == project.replace("_", "-").lower():
                    if [s.operator for s in specs] == ["=="]:
                        return f"{req.name}=={specs[0].version}"
        return None

    with pytest.raises(AssertionError):
        _assert_pins(line_scanner, read_wheel(_make_wheel(tmp_path, metadata=PINNING)))


def test_a_bad_requires_dist_is_one_clear_error(tmp_path):
    info = read_wheel(_make_wheel(tmp_path, metadata=METADATA + b"Requires-Dist: torch ==== 1\n"))
    with pytest.raises(WheelError, match="unreadable Requires-Dist"):
        pinned_requirement(info, "torch")


# ---- the patched copy ------------------------------------------------------------------

NEW = Version("1.0+p.1")
NEW_DIST = "demo_pkg-1.0+p.1.dist-info"
REPLACED: dict[str, bytes | None] = {
    "demo/core.py": b"def f():\n    return 2\n",
    "demo/_C.so": None,
}


def _patch(tmp_path: Path, base: Path | None = None, out_name: str = "out.whl", **kw) -> Path:
    info = read_wheel(base or _make_wheel(tmp_path))
    out = tmp_path / out_name
    write_patched_wheel(info, out, NEW, kw.get("replaced", REPLACED), {"BAKED.json": b"{}\n"})
    return out


def _assert_record_matches(path: Path) -> list[list[str]]:
    """RECORD, read with csv, lists every member once, last itself, with hashlib's hashes."""
    with zipfile.ZipFile(path) as zf:
        names = zf.namelist()
        rows = list(csv.reader(io.StringIO(zf.read(names[-1]).decode(), newline="")))
        assert names[-1] == f"{NEW_DIST}/RECORD" and [r[0] for r in rows] == names
        assert rows[-1] == [names[-1], "", ""]
        for member, digest, size in rows[:-1]:
            data = zf.read(member)
            assert (digest, size) == (_hash(data), str(len(data))), member
    return rows


def test_patched_wheel_contents(tmp_path):
    out = _patch(tmp_path)
    _assert_record_matches(out)
    with zipfile.ZipFile(out) as zf:
        assert zf.testzip() is None
        names = zf.namelist()
        assert zf.read("demo/core.py") == REPLACED["demo/core.py"]
        assert "demo/_C.so" not in names
        assert zf.read(f"{NEW_DIST}/METADATA") == METADATA.replace(b"1.0\n", b"1.0+p.1\n")
        assert zf.read(f"{NEW_DIST}/BAKED.json") == b"{}\n"
        assert not [n for n in names if n.startswith(DIST)]
        body = [n for n in names if not n.startswith(NEW_DIST)]
        assert body == sorted(body) and names.index(body[-1]) == len(body) - 1
        infos = {i.filename: i for i in zf.infolist()}
        assert {i.date_time for i in infos.values()} == {(1980, 1, 1, 0, 0, 0)}
        assert infos["demo/tool.py"].external_attr >> 16 & 0o777 == 0o755  # mode kept
        assert infos["demo/core.py"].external_attr >> 16 & 0o777 == 0o644


def test_patched_wheel_is_byte_identical_across_writes(tmp_path):
    base = _make_wheel(tmp_path)
    assert (
        _patch(tmp_path, base, "a.whl").read_bytes() == _patch(tmp_path, base, "b.whl").read_bytes()
    )


def test_planted_wrong_record_hash_is_caught(tmp_path, monkeypatch):
    real = wheel.record_hash
    monkeypatch.setattr(wheel, "record_hash", lambda data: real(data + b"!"))
    with pytest.raises(AssertionError, match="demo/core.py"):
        _assert_record_matches(_patch(tmp_path))


def test_a_member_the_base_record_lacks_is_hashed_from_its_bytes(tmp_path):
    base = _make_wheel(tmp_path, unrecorded=frozenset({"demo/tool.py"}))
    rows = _assert_record_matches(_patch(tmp_path, base))
    assert [
        "demo/tool.py",
        _hash(MEMBERS["demo/tool.py"]),
        str(len(MEMBERS["demo/tool.py"])),
    ] in rows


@pytest.mark.parametrize("name", ["../evil.py", "demo/../../evil.py", "/etc/evil.py"])
def test_a_replaced_path_that_leaves_the_tree_writes_nothing(tmp_path, name):
    with pytest.raises(UnsafePathError):
        _patch(tmp_path, replaced={name: b"owned\n"})
    assert not (tmp_path / "out.whl").exists()


def test_planted_missing_guard_lets_an_escaping_member_into_the_wheel(tmp_path, monkeypatch):
    monkeypatch.setattr(wheel, "_safe_member", lambda name, path: None)
    out = _patch(tmp_path, replaced={"../evil.py": b"owned\n"})
    with zipfile.ZipFile(out) as zf:
        assert [n for n in zf.namelist() if ".." in PurePosixPath(n).parts] == ["../evil.py"]


def test_patched_wheel_name_keeps_the_tags(tmp_path):
    info = read_wheel(_make_wheel(tmp_path))
    assert patched_wheel_name(info, NEW) == "demo_pkg-1.0+p.1-py3-none-any.whl"


# Big and compressible: deflate at another level (a re-compressing copy) gives other bytes.
_rng = random.Random(7)
_WORDS = [
    "".join(_rng.choice("abcdefghijklmnop") for _ in range(_rng.randint(2, 9))) for _ in range(500)
]
BIG = " ".join(_rng.choice(_WORDS) for _ in range(20000))


def _stored(path: Path, name: str) -> bytes:
    """A member's compressed bytes as they lie in the zip (located by zipfile's directory)."""
    with zipfile.ZipFile(path) as zf:
        info = zf.getinfo(name)
    with open(path, "rb") as raw:
        raw.seek(info.header_offset + 26)
        skip = sum(int.from_bytes(raw.read(2), "little") for _ in range(2))
        raw.seek(info.header_offset + 30 + skip)
        return raw.read(info.compress_size)


def _untouched_differ(tmp_path: Path) -> list[str]:
    base = _make_wheel(tmp_path, {**MEMBERS, "demo/big.py": BIG.encode()})
    out = _patch(tmp_path, base)
    names = ["demo/big.py", "demo/tool.py", "demo/data/E=1,N=2.json", "demo/__init__.py"]
    return [n for n in names if _stored(out, n) != _stored(base, n)]


def test_untouched_members_are_copied_raw(tmp_path):
    assert _untouched_differ(tmp_path) == []


def test_planted_re_deflating_copy_is_caught(tmp_path, monkeypatch):
    def re_deflate(self, name, source, info):
        with zipfile.ZipFile(source) as zf:
            self.add_bytes(name, zf.read(info), info.external_attr)

    monkeypatch.setattr(ZipWriter, "add_raw", re_deflate)
    assert _untouched_differ(tmp_path) == ["demo/big.py"]


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


def test_a_mode_the_series_sets_reaches_the_wheel_as_the_tree(tmp_path):
    """A patch with git's ``new mode 100755`` (the hostile round: the tree got it, the
    wheel kept 0644): the member's Unix mode in the wheel, read by zipfile, is the tree's."""
    from _synthetic_release import make_loop

    series, build, cli, _, _ = make_loop(tmp_path)
    diff = series / "01-a.py.diff"
    mode_lines = b"diff --git baked-ours/a.py baked/a.py\nold mode 100644\nnew mode 100755\n"
    diff.write_bytes(mode_lines + diff.read_bytes())
    proc = cli("bake")
    assert proc.returncode == 0, proc.stderr
    assert stat.S_IMODE((build / "baked" / "vllm" / "a.py").stat().st_mode) == 0o755
    (wheel,) = (build / "dist").glob("*.whl")
    with zipfile.ZipFile(wheel) as zf:
        modes = {i.filename: stat.S_IMODE(i.external_attr >> 16) for i in zf.infolist()}
    assert modes["vllm/a.py"] == 0o755
    assert modes["vllm/b.py"] != 0o755  # a patched file without a mode line keeps its own
