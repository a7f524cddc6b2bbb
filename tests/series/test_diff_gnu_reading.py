"""Diffs GNU patch reads one way and bakery used to read another (issue 35, findings 14c,
14e, 15): each case is put to GNU patch itself (the oracle) and to ``bakery apply`` on the
same tree; both must leave the same bytes, or bakery must refuse by name (exit 2)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.conftest import run_tool

pytestmark = pytest.mark.needs("patch")


def both(tmp_path: Path, files: dict[str, bytes], diff: bytes):
    """(GNU's exit code, its tree), (our exit code, our tree, our stderr)."""
    trees = []
    for side in ("gnu", "ours"):
        tree = tmp_path / side
        tree.mkdir()
        for name, data in files.items():
            (tree / name).parent.mkdir(parents=True, exist_ok=True)
            (tree / name).write_bytes(data)
        trees.append(tree)
    (tmp_path / "p.diff").write_bytes(diff)
    gnu = subprocess.run(
        ["patch", "-p1", "--batch", "-i", str(tmp_path / "p.diff")],
        cwd=trees[0],
        capture_output=True,
    )
    ours = run_tool("apply.py", str(trees[1]), str(tmp_path / "p.diff"))
    return (gnu.returncode, read(trees[0])), (ours.returncode, read(trees[1]), ours.stderr)


def read(tree: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(tree)): p.read_bytes() for p in sorted(tree.rglob("*")) if p.is_file()
    }


CRLF_BODY = b"@@ -1,2 +1,2 @@\r\n a\r\n-b\r\n+c\r\n"
LF_HEADERS_CRLF_BODY = b"--- a/g\n+++ b/g\n@@ -1,2 +1,2 @@\n x\r\n-y\r\n+z\r\n"


@pytest.mark.parametrize(
    "diff, files",
    [
        # Only the "+++" line ends in CRLF: GNU strips the CRs (the later header decides).
        (b"--- a/f\n+++ b/f\r\n" + CRLF_BODY, {"f": b"a\nb\n"}),
        # The first file's headers are LF (its body's CRs are content), the second's CRLF.
        (
            LF_HEADERS_CRLF_BODY + b"--- a/f\r\n+++ b/f\r\n" + CRLF_BODY,
            {"f": b"a\nb\n", "g": b"x\r\ny\r\n"},
        ),
        # The first file's headers are CRLF (stripped), the second's LF (its CRs kept).
        (
            b"--- a/f\r\n+++ b/f\r\n" + CRLF_BODY + LF_HEADERS_CRLF_BODY,
            {"f": b"a\nb\n", "g": b"x\r\ny\r\n"},
        ),
    ],
    ids=["plus-line-only", "lf-then-crlf", "crlf-then-lf"],
)
def test_the_strip_cr_choice_is_made_per_file_as_gnu_makes_it(tmp_path, diff, files):
    """Finding 14c. Before: decided once from the diff's first header pair, so an LF file
    got CRLF lines written into it (and a CRLF file of a later LF-headed diff lost its CRs)."""
    (gnu_rc, gnu_tree), (our_rc, our_tree, err) = both(tmp_path, files, diff)
    assert gnu_rc == 0 and our_rc == 0, err
    assert our_tree == gnu_tree


def test_the_stripped_file_reads_as_its_lf_twin():
    from bakery.series.diff import parse_patch

    crlf = parse_patch(LF_HEADERS_CRLF_BODY + b"--- a/f\r\n+++ b/f\r\n" + CRLF_BODY, "p")
    lf = parse_patch(
        LF_HEADERS_CRLF_BODY + b"--- a/f\n+++ b/f\n" + CRLF_BODY.replace(b"\r", b""), "p"
    )
    assert crlf.files == lf.files
    assert {line.eol for line in crlf.files[0].hunks[0].lines} == {b"\r\n"}


GIT_LINE_ADDED = b"--- a/f\n+++ b/f\n@@ -1,2 +1,2 @@\n a\n-b\n+GIT binary patch\n"


@pytest.mark.parametrize(
    "diff",
    [
        GIT_LINE_ADDED,
        b"Subject: GIT binary patch\n\nGIT binary patch\n\n" + GIT_LINE_ADDED,
    ],
    ids=["an added line", "a preamble"],
)
def test_text_holding_git_binary_patch_is_not_binary(tmp_path, diff):
    """Finding 14e. Before: any diff whose bytes held "GIT binary patch" was refused as binary."""
    (gnu_rc, gnu_tree), (our_rc, our_tree, err) = both(tmp_path, {"f": b"a\nb\n"}, diff)
    assert gnu_rc == 0 and our_rc == 0, err
    assert our_tree == gnu_tree == {"f": b"a\nGIT binary patch\n"}


def test_a_real_git_binary_hunk_is_still_refused(tmp_path):
    diff = b"diff --git a/f.bin b/f.bin\nindex 1..2 100644\nGIT binary patch\nliteral 3\nKcmZ?\n\n"
    (_, _), (our_rc, _, err) = both(tmp_path, {"f.bin": b"\0\1"}, diff)
    assert our_rc == 2 and "binary patches are not supported (refused)" in err


SYMLINK = (
    b"diff --git a/link b/link\nnew file mode 120000\nindex 0000000..1111111\n"
    b"--- /dev/null\n+++ b/link\n@@ -0,0 +1 @@\n+target\n\\ No newline at end of file\n"
)


@pytest.mark.parametrize(
    "diff",
    [
        SYMLINK,
        SYMLINK.replace(b"new file mode 120000\nindex 0000000..1111111", b"index 1..2 120000")
        .replace(b"--- /dev/null", b"--- a/link")
        .replace(b"@@ -0,0 +1 @@\n", b"@@ -1 +1 @@\n-old\n\\ No newline at end of file\n"),
        SYMLINK.replace(b"new file mode 120000\n", b"old mode 100644\nnew mode 120000\n"),
        SYMLINK.replace(b"new file mode 120000\n", b"new file mode 160000\n"),
    ],
    ids=["new symlink", "changed symlink", "file to symlink", "gitlink"],
)
def test_a_git_symlink_diff_is_refused_by_name_never_a_mode_000_file(tmp_path, diff):
    """Finding 14d. Before: mode 120000's last three digits made a regular file of mode 000."""
    files = {} if b"-old" not in diff else {"link": b"old"}
    (_, _), (our_rc, our_tree, err) = both(tmp_path, files, diff)
    assert our_rc == 2, err
    assert err.startswith("error: p.diff: 'link' is a ") and "(refused)" in err, err
    assert our_tree == files


A_TO_X = b"@@ -1 +1 @@\n-a\n+x\n"


@pytest.mark.parametrize(
    "headers, files",
    [
        (b'diff --git "a/x\\ty" "b/x\\ty"\n--- "a/x\\ty"\n+++ "b/x\\ty"\n', {"x\ty": b"a\n"}),
        (b'--- "a/\\303\\251"\n+++ "b/\\303\\251"\n', {"\u00e9": b"a\n"}),
        (b'--- "a/q\\"\\\\"\n+++ "b/q\\"\\\\"\n', {'q"\\': b"a\n"}),
        (b"--- a/f \n+++ b/f \n", {"f ": b"a\n", "f": b"a\n"}),
        (b"--- a/f \t2020-01-01\n+++ b/f \t2020-01-01\n", {"f ": b"a\n", "f": b"a\n"}),
        (b"--- a/x y\t\n+++ b/x y\t\n", {"x y": b"a\n", "x": b"a\n"}),
        (b"diff --git a/x y b/x y\n--- a/x y\t\n+++ b/x y\t\n", {"x y": b"a\n"}),
    ],
    ids=[
        "c-quoted tab",
        "c-quoted octal",
        "c-quoted quote",
        "trailing space",
        "space tab",
        "space tab, plain",
        "space tab, git",
    ],
)
def test_header_names_are_read_as_gnu_reads_them(tmp_path, headers, files):
    """Finding 15. Before: quoted names kept their escapes ('x\\\\ty' "does not exist"), and
    a trailing blank stayed in the name, so the file 'f ' was patched where GNU patches 'f'."""
    (gnu_rc, gnu_tree), (our_rc, our_tree, err) = both(tmp_path, files, headers + A_TO_X)
    assert gnu_rc == 0 and our_rc == 0, err
    assert our_tree == gnu_tree != files


def test_a_leading_byte_order_mark_is_read_past_as_gnu_does(tmp_path):
    """Finding 15. Before: 'Target without source' (exit 2) where GNU patches the file."""
    diff = b"\xef\xbb\xbf--- a/f\n+++ b/f\n" + A_TO_X
    (gnu_rc, gnu_tree), (our_rc, our_tree, err) = both(tmp_path, {"f": b"a\n"}, diff)
    assert gnu_rc == 0 and our_rc == 0, err
    assert our_tree == gnu_tree == {"f": b"x\n"}
