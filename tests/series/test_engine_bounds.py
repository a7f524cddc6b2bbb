"""The hunk search stays bounded by the file, and its far search keeps GNU patch's order."""

import random
import re

import pytest

from bakery.errors import HunkFailed, NearMatch
from bakery.series import locate
from bakery.series.diff import parse_patch, render_file_diff
from bakery.series.engine import apply_file_patch
from tests.series.test_gnu_parity import gnu_patch, ours

WORDS = [b"a = 1", b"b = 2", b"", b"return x", b"pass", b"x += 1"]


def far_case(rng: random.Random) -> tuple[bytes, bytes, int]:
    """(target, diff, fuzz): a diff whose hunks' header lines are thousands of lines off, in
    a file holding copies of the hunks' old sides (some one line off, so only fuzz takes
    them) above and below the guess, so the search must choose among far candidates."""
    base = [b"line %d" % i for i in range(60)]
    new = list(base)
    for at in sorted(rng.sample(range(5, 55), rng.randint(1, 3)), reverse=True):
        new[at] = b"changed %d" % at
    diff = render_file_diff("f", b"\n".join(base) + b"\n", b"\n".join(new) + b"\n")
    hunks = parse_patch(diff, "p").files[0].hunks
    olds = [[line.text for line in hunk.old_lines] for hunk in hunks]
    target = [rng.choice(WORDS) for _ in range(rng.randint(2000, 4000))]
    for _ in range(rng.randint(2, 8)):
        decoy = list(rng.choice(olds))
        if rng.random() < 0.7:
            decoy[rng.choice([0, -1])] = b"decoy"  # an end line: fuzz 1 takes it
        at = rng.randrange(len(target))
        target[at:at] = decoy
    if rng.random() < 0.5:  # the real place loses a context line: only fuzz places the hunk
        base = list(base)
        base[rng.choice(hunks).old_start - 1] = b"edited"
    at = rng.randrange(len(target))
    target[at:at] = base
    shift = rng.randrange(len(target))  # where the headers send the search first
    diff = re.sub(
        rb"@@ -(\d+)",
        lambda m: b"@@ -%d" % (int(m[1]) + shift),
        diff,
    )
    return b"\n".join(target) + b"\n", diff, rng.randint(0, 2)


@pytest.mark.needs("patch")  # fails under CI=true when missing
@pytest.mark.parametrize("seed", range(40))
def test_far_offsets_place_like_gnu_patch(seed, tmp_path):
    target, diff, fuzz = far_case(random.Random(seed))
    assert ours(target, diff, fuzz) == gnu_patch(target, diff, tmp_path, fuzz)


@pytest.mark.needs("patch")  # fails under CI=true when missing
def test_equal_distance_prefers_below_as_gnu_patch_does(tmp_path):
    window = [b"ctx 1", b"ctx 2", b"old", b"ctx 3", b"ctx 4"]
    filler = [b"f %d" % i for i in range(1000)]
    target = b"\n".join(window + filler + [b"mid"] + filler + window) + b"\n"
    diff = b"--- a/f\n+++ b/f\n@@ -1004,5 +1004,5 @@\n ctx 1\n ctx 2\n-old\n+new\n ctx 3\n ctx 4\n"
    result = ours(target, diff, 0)
    assert result == gnu_patch(target, diff, tmp_path, 0)
    assert result[1] == {1: (1003, 0)}  # windows at 1 and 2007, both 1003 away


def test_a_failed_hunk_in_a_3_million_line_file_is_not_a_line_by_line_scan(monkeypatch):
    """The failed search visits only the lines equal to the hunk's first line, and the
    message names the real near-match (it said "fewer lines than the context")."""
    data = b"".join(b"x = %d\n" % i for i in range(3_000_000))
    calls = 0
    real = locate.Matcher.matches

    def counted(self, *args):
        nonlocal calls
        calls += 1
        return real(self, *args)

    monkeypatch.setattr(locate.Matcher, "matches", counted)
    diff = (
        b"--- a/f\n+++ b/f\n@@ -1500000,3 +1500000,3 @@\n x = 2999990\n-nope\n+yes\n x = 2999992\n"
    )
    with pytest.raises(HunkFailed) as failed:
        apply_file_patch("p", parse_patch(diff, "p").files[0], data, 0)
    # One bounded walk forward and, hunk 1 failing, one for GNU's reversed-patch try.
    assert calls < 2 * (2 * locate._WALK + 10), calls
    assert "nearest near-match at line 2999991 (offset 1499991): 1 of 3 lines differ" in str(
        failed.value
    )
    assert failed.value.nearest == NearMatch(line=2999991, offset=1499991, differing=1)
    unrelated = b"--- a/f\n+++ b/f\n@@ -5,3 +5,3 @@\n nope 1\n-nope 2\n+yes\n nope 3\n"
    with pytest.raises(HunkFailed, match="no line of the hunk's old side is in the file"):
        apply_file_patch("p", parse_patch(unrelated, "p").files[0], data, 0)
    with pytest.raises(HunkFailed, match="the file has 1 lines, fewer than the hunk's 3"):
        apply_file_patch("p", parse_patch(unrelated, "p").files[0], b"nope 1\n", 0)
