"""`refresh --no-bake` records the written series in the tree's BAKED.json, so the next
refresh and `status` see a bake of the series on disk (they refused, or said "unknown");
on the synthetic release pair (fast: tiny real wheels, no download)."""

import json

import pytest

from bakery.errors import BakeryError
from bakery.maintain import refresh
from bakery.series.series import load_series
from tests._synthetic_release import PATCHED, make_loop
from tests.conftest import run_cli


@pytest.fixture
def loop(tmp_path):
    return make_loop(tmp_path)


def edit(path, data: bytes) -> None:
    """As an editor saving via rename does: a new inode, the pristine cache untouched."""
    path.unlink()
    path.write_bytes(data)


def test_refresh_after_refresh_no_bake_is_not_refused(loop, tmp_path):
    series, build, cli, _, _ = loop
    target = build / "baked" / "vllm" / "b.py"
    edit(target, PATCHED["b.py"].replace(b"12", b"13"))
    proc = cli("refresh", "--no-bake")
    assert proc.returncode == 0, proc.stderr
    assert "update: 02-b.py.diff" in proc.stdout
    assert target.read_bytes() == PATCHED["b.py"].replace(b"12", b"13")  # tree left as it is

    # What it recorded is what a real bake of the written series writes, byte for byte.
    other = tmp_path / "other-build"
    cache = {"BAKERY_CACHE": str(tmp_path / "cache")}
    args = ("bake", "--series", str(series), "--build", str(other))
    assert run_cli(*args, env=cache).returncode == 0
    recorded = (build / "baked" / "BAKED.json").read_bytes()
    assert recorded == (other / "baked" / "BAKED.json").read_bytes()
    assert json.loads(recorded)["series"]["sha256"] == load_series(series).sha256

    report = json.loads(cli("status", "--json").stdout)["bases"]["default"]
    assert (report["stale"], report["pending"]) == ([], [])  # not "unknown"

    edit(target, PATCHED["b.py"].replace(b"12", b"14"))
    proc = cli("refresh")
    assert proc.returncode == 0, proc.stderr
    assert b"+LIMIT = 14  # dcp" in (series / "02-b.py.diff").read_bytes()


def test_a_hand_edit_after_refresh_no_bake_is_still_refused(loop):
    series, build, cli, _, _ = loop
    edit(build / "baked" / "vllm" / "b.py", PATCHED["b.py"].replace(b"12", b"13"))
    assert cli("refresh", "--no-bake").returncode == 0
    patch = series / "01-a.py.diff"
    edited = patch.read_bytes().replace(b"* 2", b"* 3")
    patch.write_bytes(edited)
    proc = cli("refresh")
    assert proc.returncode == 1, proc.stdout
    assert "changed: 01-a.py.diff" in proc.stderr
    # The way out names this series and build folder, not the default patches/.
    assert f"`git checkout -- {series}`" in proc.stderr
    assert f"`bakery bake --base default --series {series} --build {build}`" in proc.stderr
    assert patch.read_bytes() == edited


def test_record_refuses_a_tree_the_series_does_not_reproduce(loop):
    series, build, _, _, _ = loop
    manifest = build / "baked" / "BAKED.json"
    before = manifest.read_bytes()
    edit(build / "baked" / "vllm" / "c.py", b"C = 1\nD = 5\nE = 3\n")  # not refreshed
    with pytest.raises(BakeryError, match=r"does not reproduce the tree \(a bug\): \['c.py'\]"):
        refresh.record(load_series(series), "default", build / "baked", build.parent / "cache")
    assert manifest.read_bytes() == before
