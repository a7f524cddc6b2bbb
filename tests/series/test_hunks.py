"""series/hunks.py: a file's hunks kept as the diff's bytes plus rows of numbers, and the
engine's placements kept as numbers, still read as the sequences of objects they stand for."""

from dataclasses import asdict

from bakery.series.diff import FilePatch, parse_patch
from bakery.series.engine import apply_file_patch

DIFF = b"".join(
    [
        b"--- a/f\n+++ b/f\n",
        b"@@ -1,3 +1,3 @@\n a\n-b\n+B\n c\n",
        b"@@ -5,3 +5,3 @@\n e\n-f\n+F\n g\n",
        b"@@ -8,3 +8,3 @@\n h\n-i\n+I\n j\n",
    ]
)
FILE = b"".join(bytes([c]) + b"\n" for c in b"abcdefghij")


def test_hunks_read_as_a_tuple_of_hunks():
    hunks = parse_patch(DIFF, "p").files[0].hunks
    assert len(hunks) == 3 and [h.number for h in hunks] == [1, 2, 3]
    assert hunks[-1].old_start == 8 and hunks[-1].body == b" h\n-i\n+I\n j\n"
    assert [h.number for h in hunks[1:]] == [2, 3]
    assert hunks == tuple(hunks) and tuple(hunks) == hunks
    # A file patch made from Hunk objects (as rebase makes one of a single hunk) keeps
    # each hunk's own number and body.
    single = FilePatch("f", "f", (hunks[1],))
    assert list(single.hunks) == [hunks[1]]
    assert FilePatch("f", "f", tuple(hunks)) == parse_patch(DIFF, "p").files[0]


def test_line_numbers_past_four_bytes_keep_their_value():
    far = 2**32 + 5
    diff = b"--- a/f\n+++ b/f\n@@ -%d,1 +%d,1 @@\n-x\n+y\n" % (far, far)
    (hunk,) = parse_patch(diff, "p").files[0].hunks
    assert (hunk.old_start, hunk.new_start) == (far, far)


def test_placements_read_as_placement_objects():
    result = apply_file_patch("p", parse_patch(DIFF, "p").files[0], FILE, 0)
    changed = {b"b\n": b"B\n", b"f\n": b"F\n", b"i\n": b"I\n"}
    assert result.after == b"".join(changed.get(line, line) for line in FILE.splitlines(True))
    last = {"hunk": 3, "line": 8, "offset": 0, "fuzz": 0}
    assert [asdict(p) for p in result.placements][-1] == last
    assert result.placements[-1] == result.placements[2] and len(result.placements[:2]) == 2
    assert result.placements == tuple(result.placements)
