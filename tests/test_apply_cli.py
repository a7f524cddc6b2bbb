"""tools/apply.py as a user meets it: placements, dry runs, refusals, atomicity."""

import json
import os
from pathlib import Path

import pytest

from bakery.diff import render_file_diff
from tests.conftest import run_tool


def snapshot(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }


@pytest.fixture
def tree(tmp_path):
    root = tmp_path / "tree"
    (root / "pkg").mkdir(parents=True)
    (root / "pkg" / "a.py").write_bytes(b"".join(b"line %d\n" % i for i in range(1, 21)))
    (root / "pkg" / "b.py").write_bytes(b"one\ntwo\nthree\n")
    return root


def write_diff(tmp_path, name, path, old, new):
    diff = tmp_path / name
    diff.write_bytes(render_file_diff(path, old, new))
    return diff


def edit_a(tree):
    old = (tree / "pkg" / "a.py").read_bytes()
    return old, old.replace(b"line 10\n", b"line ten\n")


def test_apply_reports_json_placements_and_writes(tree, tmp_path):
    old, new = edit_a(tree)
    diff = write_diff(tmp_path, "01-a.diff", "pkg/a.py", old, new)
    (tree / "pkg" / "a.py").write_bytes(b"extra\n" * 3 + old)  # the hunk moved down 3 lines
    proc = run_tool("apply.py", "--json", str(tree), str(diff))
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    (hunk,) = report["patches"][0]["files"][0]["hunks"]
    assert (hunk["line"], hunk["offset"], hunk["fuzz"]) == (10, 3, 0)
    assert (tree / "pkg" / "a.py").read_bytes() == b"extra\n" * 3 + new


def test_dry_run_writes_nothing(tree, tmp_path):
    old, new = edit_a(tree)
    diff = write_diff(tmp_path, "01-a.diff", "pkg/a.py", old, new)
    before = snapshot(tree)
    proc = run_tool("apply.py", "--dry-run", str(tree), str(diff))
    assert proc.returncode == 0 and "dry run" in proc.stdout
    assert snapshot(tree) == before


def test_reverse_unapplies_and_second_apply_is_already_applied(tree, tmp_path):
    old, new = edit_a(tree)
    diff = write_diff(tmp_path, "01-a.diff", "pkg/a.py", old, new)
    assert run_tool("apply.py", str(tree), str(diff)).returncode == 0
    again = run_tool("apply.py", str(tree), str(diff))
    assert again.returncode == 0 and "already applied" in again.stdout
    assert (tree / "pkg" / "a.py").read_bytes() == new
    assert run_tool("apply.py", "--reverse", str(tree), str(diff)).returncode == 0
    assert (tree / "pkg" / "a.py").read_bytes() == old


def test_series_with_failing_second_patch_leaves_tree_unchanged(tree, tmp_path):
    old, new = edit_a(tree)
    first = write_diff(tmp_path, "01-a.diff", "pkg/a.py", old, new)
    second = write_diff(tmp_path, "02-b.diff", "pkg/b.py", b"one\nTWO\nthree\n", b"one\n2\nthree\n")
    before = snapshot(tree)
    proc = run_tool("apply.py", str(tree), str(first), str(second))
    assert proc.returncode == 1
    assert snapshot(tree) == before
    # The failure names the patch, the hunk, the path and the nearest near-match.
    assert "02-b.diff: hunk #1 does not apply to 'pkg/b.py'" in proc.stderr
    assert "nearest near-match at line 1" in proc.stderr and "'TWO'" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_fuzz_is_bounded_by_the_caller(tree, tmp_path):
    old = (tree / "pkg" / "a.py").read_bytes()
    diff = write_diff(tmp_path, "01-a.diff", "pkg/a.py", old, old.replace(b"line 10\n", b"X\n"))
    (tree / "pkg" / "a.py").write_bytes(old.replace(b"line 7\n", b"line seven\n"))
    assert run_tool("apply.py", str(tree), str(diff)).returncode == 1
    proc = run_tool("apply.py", "--fuzz", "1", "--json", str(tree), str(diff))
    assert proc.returncode == 0
    assert json.loads(proc.stdout)["patches"][0]["files"][0]["hunks"][0]["fuzz"] == 1


HOSTILE = {
    "dotdot": b"--- a/../escape.txt\n+++ b/../escape.txt\n@@ -0,0 +1 @@\n+pwned\n",
    "absolute": b"--- /tmp/escape.txt\n+++ /tmp/escape.txt\n@@ -0,0 +1 @@\n+pwned\n",
    "symlink": b"--- a/link/escape.txt\n+++ b/link/escape.txt\n@@ -0,0 +1 @@\n+pwned\n",
    "binary": b"diff --git a/x.bin b/x.bin\nGIT binary patch\nliteral 5\nMcmZ?l\n\nliteral 0\n",
    "garbage": b"\x00\x01this is not\xff a diff at all\n",
}


@pytest.mark.parametrize("kind", sorted(HOSTILE))
def test_hostile_patches_write_nothing_anywhere(kind, tree, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    os.symlink(outside, tree / "link")
    diff = tmp_path / f"{kind}.diff"
    diff.write_bytes(HOSTILE[kind])
    before_tree, before_out = snapshot(tree), snapshot(outside)
    proc = run_tool("apply.py", str(tree), str(diff))
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("error: ") and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) <= 2
    assert snapshot(tree) == before_tree and snapshot(outside) == before_out
    assert not Path("/tmp/escape.txt").exists() and not (tmp_path / "escape.txt").exists()


def test_usage_errors_exit_2(tree, tmp_path):
    assert run_tool("apply.py", str(tree)).returncode == 2
    proc = run_tool("apply.py", "--rename", "nonsense", str(tree), str(tree / "pkg" / "a.py"))
    assert proc.returncode == 2 and "OLD=NEW" in proc.stderr


def test_git_diff_creates_with_mode_and_deletes_files(tree, tmp_path):
    diff = tmp_path / "01-git.diff"
    diff.write_bytes(
        b"diff --git a/pkg/run.sh b/pkg/run.sh\nnew file mode 100755\nindex 0000000..1111111\n"
        b"--- /dev/null\n+++ b/pkg/run.sh\n@@ -0,0 +1,2 @@\n+#!/bin/sh\n+echo hi\n"
        b"diff --git a/pkg/b.py b/pkg/b.py\ndeleted file mode 100644\nindex 2222222..0000000\n"
        b"--- a/pkg/b.py\n+++ /dev/null\n@@ -1,3 +0,0 @@\n-one\n-two\n-three\n"
    )
    proc = run_tool("apply.py", str(tree), str(diff))
    assert proc.returncode == 0, proc.stderr
    created = tree / "pkg" / "run.sh"
    assert created.read_bytes() == b"#!/bin/sh\necho hi\n"
    assert created.stat().st_mode & 0o777 == 0o755
    assert not (tree / "pkg" / "b.py").exists()
    # And back: the reverse recreates the deleted file and removes the created one.
    assert run_tool("apply.py", "--reverse", str(tree), str(diff)).returncode == 0
    assert (tree / "pkg" / "b.py").read_bytes() == b"one\ntwo\nthree\n" and not created.exists()
