"""Issue 22, finding 18: a wrong RECORD hash for an untouched member of the base wheel is
not copied into the patched wheel. pip copies a wheel's RECORD hashes into the installed
RECORD unchecked (and the wheel spec has installers refuse a wheel whose RECORD is wrong),
so the patched wheel records the member's real hash; pip, installing it, is the reader."""

from __future__ import annotations

import csv
import hashlib
import subprocess
import sys
import zipfile
from base64 import urlsafe_b64encode
from pathlib import Path

from bakery.series.diff import render_file_diff
from tests._synthetic_release import OLD, PATCHED, pin_toml, wheel
from tests.conftest import run_cli

UNTOUCHED = "vllm/d.py"


def _real_hash(path: Path) -> str:
    return "sha256=" + urlsafe_b64encode(hashlib.sha256(path.read_bytes()).digest()).rstrip(
        b"="
    ).decode()


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
    kept = tmp_path / "cache" / "pristine" / f"{pin['sha256']}.record.json"
    assert kept.is_file()
    kept.unlink()  # as a tree an older bakery extracted: found again from the wheel
    series, env = tmp_path / "series", {"BAKERY_CACHE": str(tmp_path / "cache")}
    for _ in range(2):  # then read from what was kept
        again = run_cli("bake", "--series", str(series), "--build", str(build), env=env)
        assert again.returncode == 0 and "wrong hash for 1 member(s)" in again.stderr
        assert out.read_bytes() == first and kept.is_file()
    with zipfile.ZipFile(out) as zf:
        assert zf.read(UNTOUCHED) == b"D = 'untouched'\n"
