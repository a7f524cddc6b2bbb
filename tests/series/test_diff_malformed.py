"""Malformed hunk bodies (issue 35, findings 14a and 14b): where GNU patch says "malformed
patch", bakery refuses the diff with one message naming the patch, the file and the hunk
(exit 2), never applies it nor reports a hunk that "does not apply". GNU patch is the oracle:
each shape is checked to be one GNU refuses, then that we refuse it the same way."""

from __future__ import annotations

import subprocess

import pytest

from bakery.errors import PatchParseError
from bakery.series.diff import parse_patch
from tests.conftest import run_tool

pytestmark = pytest.mark.needs("patch")

MARK = b"\\ No newline at end of file\n"
HEAD = b"--- a/f\n+++ b/f\n"
# name: (hunk body after HEAD, the target's bytes, what our message says)
MALFORMED = {
    "marker after a context line that is not the last": (
        b"@@ -1,3 +1,3 @@\n a\n" + MARK + b"-b\n+c\n d\n",
        b"a\nb\nd\n",
        "'No newline' marker after a line that is not the last of its side",
    ),
    "marker after a removed line that is not the last": (
        b"@@ -1,3 +1,3 @@\n a\n-b\n" + MARK + b"+c\n d\n",
        b"a\nb\nd\n",
        "'No newline' marker after a line that is not the last of its side",
    ),
    "marker after an added line that is not the last": (
        b"@@ -1,2 +1,3 @@\n a\n+x\n" + MARK + b" b\n",
        b"a\nb\n",
        "'No newline' marker after a line that is not the last of its side",
    ),
    "two markers in a row": (
        b"@@ -1,2 +1,2 @@\n a\n-b\n" + MARK + MARK + b"+c\n",
        b"a\nb",
        "two 'No newline' markers in a row",
    ),
    "marker before context": (
        b"@@ -1,2 +1,2 @@\n" + MARK + b" a\n-b\n+c\n",
        b"a\nb\n",
        "'No newline' marker before any line",
    ),
    "an empty hunk": (b"@@ -1,0 +1,0 @@\n", b"a\nb\n", "a hunk that changes nothing"),
    "an empty hunk before another": (
        b"@@ -1,0 +1,0 @@\n@@ -1 +1 @@\n-a\n+b\n",
        b"a\nb\n",
        "a hunk that changes nothing",
    ),
    "a hunk of context only": (
        b"@@ -1,2 +1,2 @@\n a\n b\n",
        b"a\nb\n",
        "a hunk that changes nothing",
    ),
    "a context line starting with CR": (
        b"@@ -1,2 +1,2 @@\n\ra\n-b\n+c\n",
        b"a\nb\n",
        "a line that starts with a carriage return",
    ),
    "a bare CRLF line under LF headers": (
        b"@@ -1,3 +1,3 @@\n a\n\r\n-b\n+c\n",
        b"a\n\r\nb\n",
        "a line that starts with a carriage return",
    ),
}


def gnu(tmp_path, diff: bytes, target: bytes) -> subprocess.CompletedProcess:
    (tmp_path / "f").write_bytes(target)
    return subprocess.run(
        ["patch", "-p1", "--batch", "--dry-run"], input=diff, capture_output=True, cwd=tmp_path
    )


@pytest.mark.parametrize("shape", sorted(MALFORMED))
def test_gnu_calls_it_malformed_and_we_refuse_naming_patch_file_and_hunk(tmp_path, shape):
    body, target, why = MALFORMED[shape]
    proc = gnu(tmp_path, HEAD + body, target)
    assert proc.returncode == 2 and b"malformed patch" in proc.stdout + proc.stderr, proc
    with pytest.raises(PatchParseError) as refused:
        parse_patch(HEAD + body, "p")
    assert str(refused.value).startswith("p: hunk #1 of 'f': malformed hunk ("), refused.value
    assert why in str(refused.value)


def test_a_mid_hunk_marker_is_exit_2_at_the_door_not_a_hunk_that_does_not_apply(tmp_path):
    """Before: exit 1 and "hunk wants 'b' / file has 'b'" (finding 14a)."""
    body, target, _ = MALFORMED["marker after a removed line that is not the last"]
    (tmp_path / "f").write_bytes(target)
    (tmp_path / "p.diff").write_bytes(HEAD + body)
    proc = run_tool("apply.py", str(tmp_path), str(tmp_path / "p.diff"))
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert proc.stderr.startswith("error: p.diff: hunk #1 of 'f': malformed hunk (")
    assert "wants" not in proc.stderr and (tmp_path / "f").read_bytes() == target


VALID = {
    "marker on the last lines of both sides": (
        b"@@ -1,2 +1,2 @@\n a\n-b\n" + MARK + b"+c\n" + MARK,
        b"a\nb",
    ),
    "marker on the last context line": (b"@@ -1,2 +1,2 @@\n-a\n+c\n b\n" + MARK, b"a\nb"),
    "marker on a context line last of its old side only": (
        b"@@ -1,2 +1,3 @@\n a\n b\n" + MARK + b"+c\n",
        b"a\nb",
    ),
    "an empty line is empty context": (b"@@ -1,3 +1,3 @@\n a\n\n-b\n+c\n", b"a\n\nb\n"),
    # After its counted lines a hunk is over: GNU reads more markers as text between files.
    "two markers after the last line": (
        b"@@ -1,2 +1,2 @@\n a\n-b\n" + MARK + b"+c\n" + MARK + MARK,
        b"a\nb",
    ),
}


@pytest.mark.parametrize("shape", sorted(VALID))
def test_marker_shapes_gnu_takes_are_read_as_gnu_reads_them(tmp_path, shape):
    body, target = VALID[shape]
    assert gnu(tmp_path, HEAD + body, target).returncode == 0
    out = tmp_path / "out"
    subprocess.run(
        ["patch", "-p1", "--batch", "-o", str(out), "f"],
        input=HEAD + body,
        cwd=tmp_path,
        check=True,
        capture_output=True,
    )
    from tests.series.test_gnu_parity import ours

    assert ours(target, HEAD + body, 0)[0] == out.read_bytes()
