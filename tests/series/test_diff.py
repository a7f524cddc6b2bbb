"""The diff border: bytes in (one pass), frozen types out, canonical diffs back."""

from pathlib import Path

import pytest

from bakery.errors import PatchParseError, UnsafePathError
from bakery.series.diff import parse_patch, read_patch, render_file_diff, split_lines
from tests.conftest import SEED

RENAME = (("models/deepseek_v4_1/", "models/deepseek_v41/"),)


def test_seed_is_stored_verbatim_and_lacks_its_final_newline():
    data = SEED.read_bytes()
    assert not data.endswith(b"\n")
    patch = parse_patch(data, SEED.name, renames=RENAME)
    assert patch.missing_final_newline
    assert patch.paths == ("models/deepseek_v41/nvidia/flashinfer_sparse.py",)
    assert len(patch.files[0].hunks) == 12
    # The last line of the seed is an added line whose newline was lost with the file's.
    assert patch.files[0].hunks[-1].lines[-1].eol == b"\n"


def test_path_comes_from_header_not_file_name():
    diff = b"--- a/x/my_file.py\n+++ b/x/my_file.py\n@@ -1 +1 @@\n-a\n+b\n"
    assert parse_patch(diff, "01-x_my_other_name.py.diff").paths == ("x/my_file.py",)


def test_no_newline_markers_on_both_sides():
    diff = (
        b"--- a/f\n+++ b/f\n@@ -1,2 +1,2 @@\n a\n-b\n\\ No newline at end of file\n"
        b"+c\n\\ No newline at end of file\n"
    )
    hunk = parse_patch(diff, "p").files[0].hunks[0]
    assert [(line.kind, line.text, line.eol) for line in hunk.lines] == [
        (" ", b"a", b"\n"),
        ("-", b"b", b""),
        ("+", b"c", b""),
    ]


def test_git_extended_headers_new_mode_and_index():
    diff = (
        b"diff --git a/run.sh b/run.sh\nold mode 100644\nnew mode 100755\n"
        b"index 1111111..2222222\n--- a/run.sh\n+++ b/run.sh\n@@ -1 +1 @@\n-x\n+y\n"
    )
    (fp,) = parse_patch(diff, "p").files
    assert fp.path == "run.sh" and fp.new_mode == 0o755


def test_new_and_deleted_files():
    new = b"--- /dev/null\n+++ b/n.py\n@@ -0,0 +1,2 @@\n+a\n+b\n"
    gone = b"--- a/o.py\n+++ /dev/null\n@@ -1 +0,0 @@\n-a\n"
    assert parse_patch(new, "p").files[0].creates
    assert parse_patch(gone, "p").files[0].deletes


@pytest.mark.parametrize(
    "header, error",
    [
        (b"--- /etc/passwd\n+++ /etc/passwd\n", UnsafePathError),
        (b"--- a/../../x\n+++ b/../../x\n", UnsafePathError),
    ],
)
def test_unsafe_header_paths_are_refused(header, error):
    with pytest.raises(error, match="refused"):
        parse_patch(header + b"@@ -1 +1 @@\n-a\n+b\n", "p")


def test_rename_that_escapes_is_refused():
    diff = b"--- a/m/x\n+++ b/m/x\n@@ -1 +1 @@\n-a\n+b\n"
    with pytest.raises(UnsafePathError):
        parse_patch(diff, "p", renames=(("m/", "../"),))


@pytest.mark.parametrize(
    "data",
    [
        b"hello world\nthis is not a diff\n",
        b"",
        b"--- a/f\n+++ b/f\n@@ -1,3 +1,3 @@\n a\n",  # hunk shorter than its header
        b"diff --git a/f.bin b/f.bin\nGIT binary patch\nliteral 3\nKcmZ?\n",
        b"Binary files a/f.bin and b/f.bin differ\n",
    ],
)
def test_garbage_and_binary_are_refused(data):
    with pytest.raises(PatchParseError):
        parse_patch(data, "p")


def test_render_roundtrip_keeps_crlf_and_missing_newline():
    old = b"a\r\nb\r\nc"
    new = b"a\r\nB\r\nc\r\nd"
    diff = render_file_diff("f.txt", old, new)
    assert diff.startswith(b"--- baked-ours/f.txt\n+++ baked/f.txt\n@@ -1,3 +1,4 @@\n")
    assert b"\\ No newline at end of file\n" in diff and diff.endswith(b"\n")
    fp = parse_patch(diff, "p").files[0]
    assert [line.raw for line in fp.hunks[0].new_lines] == split_lines(new)


def test_render_is_empty_without_change():
    assert render_file_diff("f", b"a\n", b"a\n") == b""


def test_nul_byte_in_a_header_path_is_refused():
    diff = b"--- a/pkg/b\x00.py\n+++ b/pkg/b\x00.py\n@@ -1 +1 @@\n-a\n+b\n"
    with pytest.raises(PatchParseError, match="NUL byte"):
        parse_patch(diff, "p")


def test_line_numbers_gnu_patch_calls_too_large_are_refused():
    huge = b"99999999999999999999999999999"
    diff = b"--- a/f\n+++ b/f\n@@ -" + huge + b",1 +" + huge + b",1 @@\n-a\n+b\n"
    with pytest.raises(PatchParseError, match="too large"):
        parse_patch(diff, "p")


def test_crlf_diff_is_read_as_gnu_patch_reads_it():
    """Both header lines end in CRLF: GNU strips every line's trailing CR."""
    lf = b"--- /dev/null\n+++ b/n.py\n@@ -0,0 +1,2 @@\n+a\n+b\n--- a/o.py\n+++ b/o.py\n"
    lf += b"@@ -1,2 +1,2 @@\n x\n-y\n+z\n"
    crlf = parse_patch(lf.replace(b"\n", b"\r\n"), "p")
    assert crlf.paths == ("n.py", "o.py") and crlf.files[0].creates
    assert crlf.files == parse_patch(lf, "p").files


def test_crlf_body_under_lf_headers_keeps_its_crlf():
    """A git diff of a CRLF file: the CRs are content, as GNU patch keeps them."""
    diff = b"--- a/f\n+++ b/f\n@@ -1,2 +1,2 @@\n x\r\n-y\r\n+z\r\n"
    hunk = parse_patch(diff, "p").files[0].hunks[0]
    assert {line.eol for line in hunk.lines} == {b"\r\n"}


def test_patch_read_is_bounded(tmp_path):
    with pytest.raises(PatchParseError, match="larger than"):
        read_patch(Path("/dev/zero"))
    small = tmp_path / "x.diff"
    small.write_bytes(b"x" * 10)
    assert read_patch(small) == b"x" * 10
    with pytest.raises(PatchParseError, match="cannot read patch"):
        read_patch(tmp_path / "missing.diff")


def test_an_empty_line_in_a_hunk_is_an_empty_context_line():
    """Editors and mailers strip the lone space of an empty context line; GNU reads it back.
    A bare CRLF line is one only where GNU strips the diff's CRs (its CRLF headers); under LF
    headers GNU calls it malformed (tests/series/test_diff_malformed.py)."""
    diff = b"--- a/f\n+++ b/f\n@@ -1,4 +1,4 @@\n a\n\n\n-b\n+c\n"
    hunk = parse_patch(diff, "p").files[0].hunks[0]
    assert [(line.kind, line.text, line.eol) for line in hunk.lines] == [
        (" ", b"a", b"\n"),
        (" ", b"", b"\n"),
        (" ", b"", b"\n"),
        ("-", b"b", b"\n"),
        ("+", b"c", b"\n"),
    ]
    crlf = parse_patch(diff.replace(b"\n", b"\r\n"), "p").files[0].hunks[0]
    assert crlf == hunk


def test_a_blank_line_after_a_hunk_is_not_part_of_it():
    """GNU ends a hunk at its header's counts; unidiff's full parse appended the blank line."""
    diff = (
        b"--- a/f\n+++ b/f\n@@ -1,2 +1,2 @@\n a\n-b\n+c\n\n--- a/g\n+++ b/g\n@@ -1 +1 @@\n-x\n+y\n"
    )
    first, second = parse_patch(diff, "p").files
    assert len(first.hunks[0].lines) == 3 and second.path == "g"


@pytest.mark.parametrize("line", [b"\n", b"\r\n"])
def test_a_hunk_ends_at_its_counts_though_body_lines_follow_up_to_the_next_hunk(line):
    """An empty line is a context line, so this hunk's counts end before "-b": the parser,
    which takes most bodies whole up to the next ``@@``, must not take this one whole."""
    diff = b"--- a/f\n+++ b/f\n@@ -1,2 +1,2 @@\n a\n" + line + b"-b\n+c\n@@ -5 +5 @@\n-x\n+y\n"
    with pytest.raises(PatchParseError, match="Unexpected hunk found"):
        parse_patch(diff, "p")  # "-b" and "+c" are no hunk's: the file's section ended


# A range starts at line 0 only when it is empty (a created or deleted file, or an insertion
# at the top). GNU 2.7 takes the 0 as a line number and applies such a hunk; we refuse it.
LINE_0_HEADERS = {
    "old side": b"@@ -0,2 +1,3 @@",
    "new side": b"@@ -1,2 +0,3 @@",
    "both sides": b"@@ -0,2 +0,3 @@",
}
LINE_0_MESSAGE = (
    "p: hunk #{} of 'f': malformed hunk header (a range that starts at line 0 must be empty): {}"
)


@pytest.mark.parametrize("shape", sorted(LINE_0_HEADERS))
@pytest.mark.parametrize(
    "body",
    [b" a\n+x\n b\n", b" a\n+x\n b\n\\ No newline at end of file\n"],
    ids=["read whole", "read line by line"],  # the parser's two paths
)
def test_a_range_at_line_0_with_lines_is_refused(shape, body):
    header = LINE_0_HEADERS[shape]
    with pytest.raises(PatchParseError) as refused:
        parse_patch(b"--- a/f\n+++ b/f\n" + header + b" f()\n" + body, "p")
    assert str(refused.value) == LINE_0_MESSAGE.format(1, header.decode())


def test_a_later_hunk_at_line_0_is_named_by_its_number():
    diff = b"--- a/f\n+++ b/f\n@@ -1 +1 @@\n-a\n+b\n@@ -0 +9 @@\n-c\n+d\n"  # "-0": length 1
    with pytest.raises(PatchParseError) as refused:
        parse_patch(diff, "p")
    assert str(refused.value) == LINE_0_MESSAGE.format(2, "@@ -0 +9 @@")


@pytest.mark.parametrize(
    "header, body",
    [
        (b"@@ -0,0 +1,2 @@", b"+a\n+b\n"),  # a created file, or an insertion at the top
        (b"@@ -1,2 +0,0 @@", b"-a\n-b\n"),  # a deleted file, or the top lines deleted
        (b"@@ -3,0 +4,2 @@", b"+a\n+b\n"),  # an insertion after line 3
    ],
)
def test_empty_ranges_may_start_at_line_0_and_stay_valid_reversed(header, body):
    """``bakery rebase`` surveys reversed patches: a valid header's reverse is valid too."""
    (hunk,) = parse_patch(b"--- a/f\n+++ b/f\n" + header + b"\n" + body, "p").files[0].hunks
    back = hunk.reversed()
    numbers = (back.old_start, back.old_len, back.new_start, back.new_len)
    flipped = b"@@ -%d,%d +%d,%d @@\n" % numbers
    assert parse_patch(b"--- a/f\n+++ b/f\n" + flipped + back.body, "p").files[0].hunks == [back]
