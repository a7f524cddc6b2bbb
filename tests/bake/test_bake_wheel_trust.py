"""A rebake of the same inputs keeps the patched wheel the last bake wrote (no 330 MB
rewrite) while its trust record holds: the same inputs, device, inode, size and mtime.
Any change to the file, or to what its bytes follow from, writes it again."""

import json
import os

import pytest

from bakery.bake import bake as bake_mod
from bakery.bake.bake import bake
from bakery.series.series import load_series
from tests._synthetic_release import make_loop


@pytest.fixture
def loop(tmp_path, monkeypatch):
    """A synthetic series baked once (by the CLI), and a counter of wheel writes."""
    series_dir, build, _, _, _ = make_loop(tmp_path)
    writes = []
    real = bake_mod.write_patched_wheel
    monkeypatch.setattr(bake_mod, "write_patched_wheel",
                        lambda *a, **k: writes.append(a[1]) or real(*a, **k))  # fmt: skip

    def rebake():
        return bake(load_series(series_dir), build=build, cache=tmp_path / "cache").wheel

    return rebake, writes, build


def test_a_rebake_of_the_same_inputs_keeps_the_wheel(loop):
    rebake, writes, _ = loop
    wheel = rebake()
    before, data = os.stat(wheel), wheel.read_bytes()
    assert rebake() == wheel and writes == []
    after = os.stat(wheel)
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    assert wheel.read_bytes() == data


def _in_place(wheel):
    with open(wheel, "r+b") as handle:  # same size, same inode, a new mtime
        handle.write(b"X")


def _same_size_and_mtime(wheel):
    """`cp -p` of another file: only the inode differs."""
    st = os.stat(wheel)
    other = wheel.with_name("other")
    other.write_bytes(b"X" * st.st_size)
    os.utime(other, ns=(st.st_atime_ns, st.st_mtime_ns))
    os.replace(other, wheel)


CHANGES = {
    "changed in place, same size": _in_place,
    "another file, same size and mtime": _same_size_and_mtime,
    "appended to": lambda w: w.write_bytes(w.read_bytes() + b"\n"),
    "touched": lambda w: os.utime(w),
    "deleted": lambda w: w.unlink(),
}


@pytest.mark.parametrize("change", CHANGES)
def test_a_changed_wheel_is_written_again(loop, change):
    rebake, writes, _ = loop
    wheel = rebake()
    data = wheel.read_bytes()
    CHANGES[change](wheel)
    assert rebake() == wheel and len(writes) == 1
    assert wheel.read_bytes() == data


RECORDS = {
    **{
        field: lambda r, o, f=field: r.write_text(
            json.dumps({**json.loads(r.read_text()), f: 1 if f != "sha256" else "0" * 64})
        )  # fmt: skip
        for field in ("sha256", "st_dev", "st_ino", "st_size", "st_mtime_ns", "st_ctime_ns")
    },
    "older, without ctime": lambda r, o: r.write_text(
        json.dumps({k: v for k, v in json.loads(r.read_text()).items() if k != "st_ctime_ns"})
    ),  # fmt: skip
    "not json": lambda r, o: r.write_text("{"),
    "a folder": lambda r, o: (r.unlink(), r.mkdir()),
    "a link out of the build folder": lambda r, o: (
        o.write_bytes(r.read_bytes()),
        r.unlink(),
        r.symlink_to(o),
    ),
}


@pytest.mark.parametrize("kind", RECORDS)
def test_a_record_that_does_not_vouch_writes_the_wheel_again(loop, kind, tmp_path):
    rebake, writes, build = loop
    rebake()
    outside = tmp_path / "outside.json"
    RECORDS[kind](build / ".baked.wheel.json", outside)
    before = outside.read_bytes() if outside.exists() else None
    rebake()
    assert len(writes) == 1
    assert (outside.read_bytes() if outside.exists() else None) == before


def test_every_input_of_the_wheel_moves_its_key(monkeypatch):
    base = ("ab" * 32, "vllm-1+t.1-py3-none-any.whl", {"vllm/a.py": b"a", "vllm/b.py": None},
            {"BAKED.json": b"{}"}, {"vllm/c.py": "sha256=x"})  # fmt: skip
    key = bake_mod._wheel_inputs(*base)
    others = [
        ("cd" * 32, *base[1:]),
        (base[0], "vllm-1+t.2-py3-none-any.whl", *base[2:]),
        (*base[:2], {"vllm/a.py": b"A", "vllm/b.py": None}, *base[3:]),
        (*base[:2], {"vllm/a.py": b"a"}, *base[3:]),
        (*base[:2], {"vllm/a.py": b"a", "vllm/b.py": b""}, *base[3:]),
        (*base[:3], {"BAKED.json": b"{ }"}, base[4]),
        (*base[:4], {}),
    ]
    keys = {bake_mod._wheel_inputs(*other) for other in others}
    assert key not in keys and len(keys) == len(others)
    monkeypatch.setattr(bake_mod, "_WRITER", bake_mod._WRITER[:-1])  # the writer edited
    assert bake_mod._wheel_inputs(*base) != key


def _rewritten_with_mtime_put_back(path):
    """Another byte written in place, then the old mtime put back (utime): device, inode,
    size and mtime all as before; only the ctime moved."""
    st = os.stat(path)
    data = bytearray(path.read_bytes())
    data[10] ^= 1  # the first member's mtime in its local header: still a zip
    with open(path, "r+b") as handle:
        handle.write(data)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    after = os.stat(path)
    assert (after.st_ino, after.st_size, after.st_mtime_ns) == (
        st.st_ino, st.st_size, st.st_mtime_ns
    )  # fmt: skip


def test_a_wheel_rewritten_in_place_with_its_mtime_put_back_is_not_trusted(tmp_path, monkeypatch):
    """The cached base wheel and the baked one, each rewritten in place with its mtime put
    back: `bakery bake` hashes the cached one again and refuses it (it cannot fetch it
    here), and writes the baked one again (before: both were trusted by their stat)."""
    from bakery.bake import fetch as fetch_mod
    from bakery.errors import FetchError

    series, build, cli, _, _ = make_loop(tmp_path)
    (cached,) = (tmp_path / "cache" / "wheels").glob("*/vllm-0.1.0-*.whl")
    os.utime(cached, ns=(1_700_000_000 * 10**9,) * 2)  # long ago: the next hash records it
    hashes = []
    real = fetch_mod.sha256_file
    monkeypatch.setattr(fetch_mod, "sha256_file", lambda p: hashes.append(p) or real(p))

    def offline(*args, **kwargs):
        raise FetchError("no download in this test")

    monkeypatch.setattr(fetch_mod, "_pip_download", offline)
    assert cli("bake").returncode == 0 and hashes == [cached]  # hashed, recorded
    (baked,) = (build / "dist").glob("vllm-0.1.0+*.whl")
    good = baked.read_bytes()
    assert cli("bake").returncode == 0 and hashes == [cached]  # trusted by its stat

    _rewritten_with_mtime_put_back(baked)
    assert cli("bake").returncode == 0
    assert baked.read_bytes() == good  # written again, not kept

    _rewritten_with_mtime_put_back(cached)
    proc = cli("bake")
    assert hashes == [cached, cached]  # hashed again
    assert proc.returncode == 1 and proc.stderr.startswith("error: no download in this test")
