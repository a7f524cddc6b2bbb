"""tools/apply.py as a user meets it: placements, dry runs, refusals, atomicity."""

import json
import os
import resource
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bakery.cli.root import main
from bakery.series.diff import render_file_diff
from tests.conftest import REPO, run_cli, run_tool


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


def test_strip_drops_that_many_leading_path_components(tree, tmp_path):
    """-p1 (the default) drops a git diff's a/ and b/; --strip 0 keeps them (old and new
    then differ: a rename, refused); --strip 2 takes a diff made one folder up."""
    hunk = b"@@ -1,3 +1,3 @@\n one\n-two\n+2\n three\n"
    git = tmp_path / "git.diff"
    git.write_bytes(b"--- a/pkg/b.py\n+++ b/pkg/b.py\n" + hunk)
    up = tmp_path / "up.diff"
    up.write_bytes(b"--- a/tree/pkg/b.py\n+++ b/tree/pkg/b.py\n" + hunk)
    before = snapshot(tree)
    proc = run_tool("apply.py", "--strip", "0", "--dry-run", str(tree), str(git))
    assert proc.returncode == 2 and "renames inside a diff are not supported" in proc.stderr
    proc = run_tool("apply.py", "--dry-run", str(tree), str(up))
    assert proc.returncode == 1 and "patches 'tree/pkg/b.py', which does not exist" in proc.stderr
    assert snapshot(tree) == before
    assert run_tool("apply.py", "--strip", "1", "--dry-run", str(tree), str(git)).returncode == 0
    assert run_tool("apply.py", "--strip", "2", str(tree), str(up)).returncode == 0
    assert (tree / "pkg" / "b.py").read_bytes() == b"one\n2\nthree\n"


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


# --- hostile input: one clear error, the documented exit code, no hang -------------------------


def run_apply(*args: str, timeout: float = 120, **kwargs) -> subprocess.CompletedProcess:
    """tools/apply.py with a time limit: a hang fails the test instead of the suite."""
    return subprocess.run(
        [sys.executable, str(REPO / "tools" / "apply.py"), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        **kwargs,
    )


def gnu_patch(tree: Path, diff: Path, *flags: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["patch", "-s", "--no-backup-if-mismatch", "-p1", "-d", str(tree), "-i", str(diff), *flags],
        capture_output=True,
        text=True,
        timeout=120,
    )


def clean_error(proc, code: int) -> None:
    assert proc.returncode == code, proc.stderr
    assert proc.stderr.startswith("error: ") and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) <= 2


@pytest.mark.parametrize(
    "data, says",
    [
        (b"--- a/pkg/b\x00.py\n+++ b/pkg/b\x00.py\n@@ -1 +1 @@\n-one\n+1\n", "NUL byte"),
        (b"--- a/pkg/b.py\n+++ b/pkg/b.py\n@@ -1" + b"9" * 30 + b",1 +1 @@\n-one\n+1\n", "large"),
    ],
    ids=["nul-in-path", "line-number-too-large"],
)
def test_malformed_headers_are_refused(data, says, tree, tmp_path):
    diff = tmp_path / "x.diff"
    diff.write_bytes(data)
    before = snapshot(tree)
    proc = run_apply(str(tree), str(diff))
    clean_error(proc, 2)
    assert says in proc.stderr and snapshot(tree) == before


@pytest.mark.parametrize("dry_run", [["--dry-run"], []], ids=["dry-run", "apply"])
def test_a_hunk_header_at_line_0_with_lines_is_refused_and_nothing_is_written(
    dry_run, tree, tmp_path
):
    """GNU patch 2.7 applies ``@@ -0,2 +1,3 @@`` (0 read as a line number); we refuse it,
    before the good patch ahead of it in the series touches anything."""
    old, new = edit_a(tree)
    good = write_diff(tmp_path, "01-a.diff", "pkg/a.py", old, new)
    bad = tmp_path / "02-b.diff"
    bad.write_bytes(b"--- a/pkg/b.py\n+++ b/pkg/b.py\n@@ -0,2 +1,3 @@\n one\n+1.5\n two\n")
    before = snapshot(tree)
    proc = run_cli("apply", *dry_run, str(tree), str(good), str(bad))
    clean_error(proc, 2)
    assert proc.stderr == (
        "error: 02-b.diff: hunk #1 of 'pkg/b.py': malformed hunk header"
        " (a range that starts at line 0 must be empty): @@ -0,2 +1,3 @@\n"
        "hint: fix that hunk's @@ line or body in the patch file\n"
    )
    assert snapshot(tree) == before


def test_dev_zero_as_the_patch_is_refused_after_a_bounded_read(tree):
    proc = run_apply(str(tree), "/dev/zero", timeout=60)
    clean_error(proc, 2)
    assert "larger than" in proc.stderr


def test_a_fifo_nobody_writes_as_the_patch_is_empty_not_a_hang(tree, tmp_path):
    os.mkfifo(tmp_path / "pipe.diff")
    proc = run_apply(str(tree), str(tmp_path / "pipe.diff"), timeout=60)
    clean_error(proc, 2)
    assert "no file diffs found" in proc.stderr


@pytest.mark.needs("patch")  # fails under CI=true when missing
def test_absurd_start_line_places_like_gnu_patch_without_walking_to_it(tree, tmp_path):
    """An offset of -10**15 lines: the search is bounded by the file, not the distance."""
    diff = tmp_path / "far.diff"
    diff.write_bytes(
        b"--- a/pkg/b.py\n+++ b/pkg/b.py\n@@ -1000000000000000,3 +1000000000000000,3 @@\n"
        b" one\n-two\n+2\n three\n"
    )
    gnu = tmp_path / "gnu"
    shutil.copytree(tree, gnu)
    assert gnu_patch(gnu, diff).returncode == 0
    proc = run_apply("--json", str(tree), str(diff), timeout=60)
    assert proc.returncode == 0, proc.stderr
    (hunk,) = json.loads(proc.stdout)["patches"][0]["files"][0]["hunks"]
    assert hunk["line"] == 1 and hunk["offset"] == 1 - 10**15
    assert snapshot(tree) == snapshot(gnu)


def test_unreadable_target_is_bad_input(tree, tmp_path, monkeypatch, capsys):
    """README: an unreadable input exits 2 (root reads any file, so the read is made to fail)."""
    old, new = edit_a(tree)
    diff = write_diff(tmp_path, "01-a.diff", "pkg/a.py", old, new)
    real_read = Path.read_bytes

    def refuse(self):
        if self.name == "a.py":
            raise PermissionError(13, "Permission denied", str(self))
        return real_read(self)

    monkeypatch.setattr(Path, "read_bytes", refuse)
    assert main(["apply", str(tree), str(diff)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: cannot read target (Permission denied): 'pkg/a.py'")


def test_fifo_target_is_refused_not_read(tree, tmp_path):
    """Reading a FIFO blocks forever; GNU patch refuses a target that is not a regular file."""
    os.mkfifo(tree / "pkg" / "fifo.py")
    diff = write_diff(tmp_path, "01-f.diff", "pkg/fifo.py", b"a\n", b"b\n")
    proc = run_apply(str(tree), str(diff), timeout=60)
    clean_error(proc, 2)
    assert "not a regular file" in proc.stderr


@pytest.mark.needs("patch")  # fails under CI=true when missing
def test_symlink_target_inside_the_tree_is_refused_as_gnu_patch_does(tree, tmp_path):
    """A link to a file inside the tree: not replaced by a regular file, not written through."""
    os.symlink("b.py", tree / "pkg" / "link.py")
    diff = write_diff(
        tmp_path, "01-l.diff", "pkg/link.py", b"one\ntwo\nthree\n", b"one\n2\nthree\n"
    )
    before = snapshot(tree)
    proc = run_apply(str(tree), str(diff))
    clean_error(proc, 2)
    assert "symlink" in proc.stderr
    assert os.readlink(tree / "pkg" / "link.py") == "b.py" and snapshot(tree) == before
    assert gnu_patch(tree, diff, "--dry-run").returncode != 0  # GNU refuses it too


@pytest.mark.needs("patch")  # fails under CI=true when missing
def test_crlf_diff_applies_as_gnu_patch_applies_it(tree, tmp_path):
    old, new = edit_a(tree)
    lf = render_file_diff("pkg/a.py", old, new) + render_file_diff("pkg/n.py", None, b"x\ny\n")
    diff = tmp_path / "crlf.diff"
    diff.write_bytes(lf.replace(b"\n", b"\r\n"))
    gnu = tmp_path / "gnu"
    shutil.copytree(tree, gnu)
    assert gnu_patch(gnu, diff).returncode == 0
    proc = run_apply(str(tree), str(diff))
    assert proc.returncode == 0, proc.stderr
    assert snapshot(tree) == snapshot(gnu)
    assert (tree / "pkg" / "n.py").read_bytes() == b"x\ny\n"


# --- all or nothing at write time ---------------------------------------------------------------


def two_file_series(tree: Path, tmp_path: Path) -> tuple[list[str], dict[str, bytes]]:
    """01 edits pkg/a.py (small); 02 edits pkg/big.py (400 KB): (patch args, expected files)."""
    big = b"".join(b"row %d\n" % i for i in range(40_000))
    (tree / "pkg" / "big.py").write_bytes(big)
    old, new = edit_a(tree)
    first = write_diff(tmp_path, "01-a.diff", "pkg/a.py", old, new)
    big_new = big.replace(b"row 5\n", b"row five\n")
    second = write_diff(tmp_path, "02-big.diff", "pkg/big.py", big, big_new)
    return [str(first), str(second)], {"pkg/a.py": new, "pkg/big.py": big_new}


def test_full_disk_on_the_second_file_changes_nothing_and_a_rerun_recovers(tree, tmp_path):
    """A real write fault, even as root: RLIMIT_FSIZE makes writing the 400 KB file fail
    (EFBIG, as ENOSPC would) after the small first file was staged."""
    patches, expected = two_file_series(tree, tmp_path)
    before = snapshot(tree)

    def small_files_only():
        resource.setrlimit(resource.RLIMIT_FSIZE, (64 << 10, 64 << 10))

    no_pyc = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}  # a .pyc cut short breaks imports
    proc = run_apply(str(tree), *patches, preexec_fn=small_files_only, env=no_pyc)
    clean_error(proc, 1)
    assert "every file was put back" in proc.stderr
    assert snapshot(tree) == before  # no file changed, no temp file left (rglob sees dot files)
    rerun = run_apply(str(tree), *patches)
    assert rerun.returncode == 0, rerun.stderr
    assert {p: snapshot(tree)[p] for p in expected} == expected


def test_a_failed_rename_puts_back_every_file_already_swapped(tree, tmp_path, monkeypatch):
    """The last of three renames fails: the edited file gets its own inode back, the deleted
    one returns, the created file and its new folders go."""
    old, new = edit_a(tree)
    diff = tmp_path / "01-three.diff"
    diff.write_bytes(
        render_file_diff("pkg/a.py", old, new)
        + render_file_diff("pkg/b.py", b"one\ntwo\nthree\n", None)
        + render_file_diff("pkg/new/deep/c.py", None, b"c\n")
    )
    before = snapshot(tree)
    inode = (tree / "pkg" / "a.py").stat().st_ino
    real_replace = os.replace

    def full_disk(src, dst):
        if str(dst).endswith("c.py"):
            raise OSError(28, "No space left on device", str(dst))
        return real_replace(src, dst)

    monkeypatch.setattr(os, "replace", full_disk)
    assert main(["apply", str(tree), str(diff)]) == 1
    assert snapshot(tree) == before and not (tree / "pkg" / "new").exists()
    assert (tree / "pkg" / "a.py").stat().st_ino == inode
    monkeypatch.setattr(os, "replace", real_replace)
    assert main(["apply", str(tree), str(diff)]) == 0
    assert (tree / "pkg" / "a.py").read_bytes() == new and not (tree / "pkg" / "b.py").exists()
    assert (tree / "pkg" / "new" / "deep" / "c.py").read_bytes() == b"c\n"
