"""The ground module ``bakery.tree`` on its own (fast): safe paths, the atomic writer
(under a real write fault), clones, swaps, stamps and the sweep of dead writers' leftovers.

tree.write_text_atomic / schema.write_json_atomic: exact bytes, and nothing left on failure.
"""

from __future__ import annotations

import json
import math
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bakery import tree
from bakery.errors import UnsafePathError
from bakery.schema import write_json_atomic
from bakery.tree import (
    clone_tree,
    empty_trash,
    inside,
    read_file,
    relative,
    stage_beside,
    stamp,
    swap_into_place,
    sweep_dead,
    write_atomic,
    write_text_atomic,
)
from tests._faults import assert_atomic_under_fault


@pytest.mark.parametrize("rel", ["", "/etc/passwd", "../x", "a/../../x", "a/\0b"])
def test_relative_refuses_paths_that_leave(rel):
    with pytest.raises(UnsafePathError, match="leaves the tree") as caught:
        relative(rel)
    assert caught.value.exit_code == 2


def test_inside_follows_symlinks_only_within_the_root(tmp_path):
    root, outside = tmp_path / "root", tmp_path / "outside"
    (root / "pkg").mkdir(parents=True)
    outside.mkdir()
    (root / "in").symlink_to(root / "pkg")
    (root / "out").symlink_to(outside)
    assert inside(root, "in/mod.py") == root / "in/mod.py"
    with pytest.raises(UnsafePathError, match="through a symlink"):
        inside(root, "out/mod.py")


def test_read_file_absent_present_and_a_folder(tmp_path):
    (tmp_path / "a.py").write_bytes(b"x\n")
    (tmp_path / "pkg").mkdir()
    assert read_file(tmp_path, "a.py") == b"x\n"
    assert read_file(tmp_path, "missing.py") is None
    with pytest.raises(UnsafePathError, match="is a directory"):
        read_file(tmp_path, "pkg")


# ---- the atomic writer -----------------------------------------------------------------


def test_write_atomic_creates_folders_and_keeps_or_sets_the_mode(tmp_path):
    path = tmp_path / "a" / "b" / "new.txt"
    write_atomic(path, b"one\n")
    assert path.read_bytes() == b"one\n" and path.stat().st_mode & 0o777 == 0o644
    path.chmod(0o750)
    write_atomic(path, b"two\n")
    assert path.read_bytes() == b"two\n" and path.stat().st_mode & 0o777 == 0o750
    write_atomic(path, b"three\n", mode=0o600)
    assert path.stat().st_mode & 0o777 == 0o600


def _write_beside_a_hard_link(tmp_path: Path, write) -> bytes:
    """What a hard link to the old file (the pristine cache's) reads after ``write``."""
    cached, baked = tmp_path / "cache.py", tmp_path / "baked.py"
    cached.write_bytes(b"pristine\n")
    os.link(cached, baked)
    write(baked, b"patched\n")
    assert baked.read_bytes() == b"patched\n"
    return cached.read_bytes()


def test_write_atomic_never_writes_through_a_hard_link(tmp_path):
    assert _write_beside_a_hard_link(tmp_path, write_atomic) == b"pristine\n"


def test_planted_in_place_write_through_a_hard_link_is_caught(tmp_path):
    assert _write_beside_a_hard_link(tmp_path, Path.write_bytes) == b"patched\n"


def test_write_atomic_under_a_write_fault_keeps_the_old_file_and_no_temp(tmp_path):
    assert_atomic_under_fault("tree.write_atomic", tmp_path)


def test_planted_in_place_writer_is_caught_by_the_fault_check(tmp_path):
    with pytest.raises(AssertionError, match="the old file was damaged"):
        assert_atomic_under_fault("planted in-place", tmp_path)


def test_write_atomic_removes_its_temp_when_the_rename_fails(tmp_path, monkeypatch):
    path = tmp_path / "f.txt"
    path.write_bytes(b"old\n")

    def refuse(src, dst):
        raise PermissionError(13, "refused", str(dst))

    monkeypatch.setattr(tree.os, "replace", refuse)
    with pytest.raises(PermissionError):
        write_atomic(path, b"new\n")
    assert path.read_bytes() == b"old\n" and [p.name for p in tmp_path.iterdir()] == ["f.txt"]


def test_stage_beside_leaves_the_rename_to_the_caller(tmp_path, monkeypatch):
    target = tmp_path / "mod.py"
    target.write_bytes(b"old\n")
    target.chmod(0o755)
    staged = stage_beside(target, b"new\n", suffix=".new")
    assert staged.parent == tmp_path and staged.name.startswith(".mod.py.")
    assert staged.name.endswith(".new") and staged.stat().st_mode & 0o777 == 0o755
    assert (target.read_bytes(), staged.read_bytes()) == (b"old\n", b"new\n")
    staged.unlink()

    def refuse(path, mode):
        raise PermissionError(1, "refused", path)

    monkeypatch.setattr(tree.os, "chmod", refuse)
    with pytest.raises(PermissionError):
        stage_beside(target, b"new\n")
    assert [p.name for p in tmp_path.iterdir()] == ["mod.py"]


# ---- clones, stamps, swaps -------------------------------------------------------------


def _files(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def _tree(root: Path) -> Path:
    (root / "pkg" / "sub").mkdir(parents=True)
    (root / "top.txt").write_bytes(b"top\n")
    (root / "pkg" / "a.py").write_bytes(b"a\n")
    (root / "pkg" / "sub" / "b.py").write_bytes(b"b\n")
    return root


def test_clone_tree_links_every_file_but_the_skipped(tmp_path):
    src = _tree(tmp_path / "src")
    clone_tree(src, tmp_path / "dst", skip=frozenset({"pkg/a.py"}))
    got = _files(tmp_path / "dst")
    assert got == {"top.txt": b"top\n", "pkg/sub/b.py": b"b\n"}
    assert os.path.samefile(src / "pkg/sub/b.py", tmp_path / "dst/pkg/sub/b.py")


def test_clone_tree_copies_where_linking_fails(tmp_path, monkeypatch):
    src = _tree(tmp_path / "src")

    def cross_device(a, b):
        raise OSError(18, "Invalid cross-device link")

    monkeypatch.setattr(tree.os, "link", cross_device)
    clone_tree(src, tmp_path / "dst")
    assert _files(tmp_path / "dst") == _files(src)
    assert not os.path.samefile(src / "top.txt", tmp_path / "dst/top.txt")


def test_stamp_sees_a_write_through_a_hard_link(tmp_path):
    src = _tree(tmp_path / "src")
    clone_tree(src, tmp_path / "dst")
    before = stamp(src)
    assert set(before) == {"top.txt", "pkg/a.py", "pkg/sub/b.py"}
    edited = tmp_path / "dst/pkg/a.py"
    with open(edited, "r+b") as f:  # same size, same inode
        f.write(b"A")
    # A later mtime, as a write a moment after the bake has (not left to the clock's tick)
    st = edited.stat()
    os.utime(edited, ns=(st.st_atime_ns, before["pkg/a.py"][1] + 10**9))
    after = stamp(src)
    assert after["pkg/a.py"] != before["pkg/a.py"] and after["top.txt"] == before["top.txt"]


@pytest.mark.parametrize("exchange", [True, False], ids=["renameat2", "two-renames"])
def test_swap_into_place_puts_new_at_final_and_old_in_trash(tmp_path, monkeypatch, exchange):
    if not exchange:
        monkeypatch.setattr(tree, "_exchange", lambda a, b: False)
    final, new, trash = tmp_path / "baked", tmp_path / ".baked.new-1", tmp_path / ".trash"
    (final / "pkg").mkdir(parents=True)
    (final / "pkg/old.py").write_bytes(b"old\n")
    (new / "pkg").mkdir(parents=True)
    (new / "pkg/new.py").write_bytes(b"new\n")
    swap_into_place(new, final, trash)
    assert _files(final) == {"pkg/new.py": b"new\n"} and not new.exists()
    [old] = list(trash.iterdir())
    assert _files(old) == {"pkg/old.py": b"old\n"}
    fresh = tmp_path / ".other.new-1"
    fresh.mkdir()
    swap_into_place(fresh, tmp_path / "other", trash)  # nothing there yet
    assert (tmp_path / "other").is_dir() and len(list(trash.iterdir())) == 1


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_sweep_dead_clears_only_dead_writers_leftovers(tmp_path):
    dead, live, mine = _dead_pid(), os.getppid(), os.getpid()
    (tmp_path / f".x.whl.tmp-{dead}").write_bytes(b"half")
    (tmp_path / f".tree.new-{dead}" / "pkg").mkdir(parents=True)
    kept = [f".y.whl.tmp-{live}", f".z.whl.tmp-{mine}", ".hidden", "x.whl", ".a.tmp-notapid"]
    for name in kept:
        (tmp_path / name).write_bytes(b"keep")
    swept = sweep_dead(tmp_path)
    assert sorted(p.name for p in swept) == sorted([f".tree.new-{dead}", f".x.whl.tmp-{dead}"])
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(kept)


def test_sweep_dead_into_trash_moves_instead_of_removing(tmp_path):
    folder, trash = tmp_path / "dist", tmp_path / ".trash"
    folder.mkdir()
    (folder / f".x.whl.tmp-{_dead_pid()}").write_bytes(b"half")
    assert len(sweep_dead(folder, trash)) == 1
    assert list(folder.iterdir()) == [] and [p.read_bytes() for p in trash.iterdir()] == [b"half"]


def test_empty_trash_renames_at_once_and_deletes_in_the_background(tmp_path):
    trash = tmp_path / ".trash"
    (trash / "old-tree" / "pkg").mkdir(parents=True)
    (trash / "old-tree" / "pkg" / "a.py").write_bytes(b"a\n")
    empty_trash(trash)
    assert not trash.exists()  # the next bake gets a fresh trash folder at once
    deadline = time.monotonic() + 30
    while list(tmp_path.iterdir()) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert list(tmp_path.iterdir()) == []


def test_json_is_indented_utf8_with_a_final_newline(tmp_path):
    path = tmp_path / "sub" / "report.json"
    write_json_atomic(path, {"b": [1, 2], "a": "ü"}, sort_keys=True)
    assert path.read_bytes() == b'{\n  "a": "\xc3\xbc",\n  "b": [\n    1,\n    2\n  ]\n}\n'
    assert stat.S_IMODE(path.stat().st_mode) == 0o644  # readable like every other output


def test_key_order_is_kept_unless_asked(tmp_path):
    path = tmp_path / "response.json"
    write_json_atomic(path, {"z": 1, "a": 2})
    assert path.read_text() == '{\n  "z": 1,\n  "a": 2\n}\n'


def test_strict_refuses_nan_and_leaves_the_old_file_and_no_temp(tmp_path):
    path = tmp_path / "gates.json"
    write_text_atomic(path, "old\n")
    with pytest.raises(ValueError):
        write_json_atomic(path, {"kl": math.nan}, strict=True)
    assert path.read_text() == "old\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gates.json"]


def test_default_serializes_what_json_cannot(tmp_path):
    path = tmp_path / "summary.json"
    write_json_atomic(path, {"bundle": tmp_path / "b"}, default=str)
    assert path.read_text() == f'{{\n  "bundle": "{tmp_path / "b"}"\n}}\n'


def test_ascii_only_json_holds_undecodable_environment_bytes(tmp_path):
    # os.environ gives an undecodable byte as a lone surrogate; UTF-8 cannot encode one.
    value = {"HF_HOME": "/data/caf\udce9"}
    with pytest.raises(UnicodeEncodeError):
        write_json_atomic(tmp_path / "utf8.json", value)
    assert not list(tmp_path.iterdir())  # the failed write left nothing behind
    write_json_atomic(tmp_path / "env.json", value, ascii_only=True)
    assert json.loads((tmp_path / "env.json").read_text()) == value
