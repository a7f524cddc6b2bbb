"""The rebase conflict loop (--checkout, --continue, --abort) on a synthetic release pair
(tests/_synthetic_release.py). Fast; the real 0.32.0 -> 0.33.0 pair is in test_rebase.py
(slow)."""

import os
import tomllib
from pathlib import Path

import pytest

from tests._synthetic_release import CONFLICT, NEW, make_loop


@pytest.fixture
def loop(tmp_path):
    return make_loop(tmp_path)


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
    # A new file is an edit too (refresh would add it as a patch), though no hash sees it.
    assert cli("bake").returncode == 0  # a clean tree again
    (build / "baked" / "vllm" / "extra.py").write_bytes(b"X = 1\n")
    proc = cli("rebase", "--to", "vllm==0.2.0", "--checkout")
    assert proc.returncode == 2 and "add 04-extra.py.diff" in proc.stderr
    assert not (build / ".rebase").exists()


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
