"""Differential test of the hunk engine against GNU ``patch`` itself (the independent oracle).

Files use a tiny alphabet so context repeats; the target gets decoy copies above and
below, drift between hunks, edited context (fuzz) or is already patched. The diff comes
from GNU ``diff -U N`` or from our own renderer. Both must give byte-identical output with
the same hunk placements, or both refuse. Line endings may be mixed within a file; each
line text keeps one ending, because our CR-blind matching (a CRLF file takes an LF diff) is
a deliberate difference from GNU, pinned by the last test below.
"""

from __future__ import annotations

import re
import subprocess
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bakery.errors import PatchParseError
from bakery.series import engine, locate
from bakery.series.apply import ApplyStatus, plan
from bakery.series.diff import parse_patch, render_file_diff, split_lines
from tests.conftest import run_tool
from tests.series.test_gnu_parity import gnu_patch, ours

pytestmark = [pytest.mark.property, pytest.mark.needs("patch"), pytest.mark.needs("diff")]
# Bounded: a fixed number of examples (each runs GNU patch once, ~5 ms) and no deadline.
DIFFERENTIAL = settings(
    max_examples=400,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
ALPHABET = [b"a", b"b", b"c", b"", b"a b"]


def _eol(text: bytes, style: str) -> bytes:
    """One ending per line text: 'mixed' files still never hold "a\\n" and "a\\r\\n"."""
    if style == "mixed":
        return b"\r\n" if sum(text) % 2 else b"\n"
    return b"\r\n" if style == "crlf" else b"\n"


def _join(texts: list[bytes], style: str, final_eol: bool) -> bytes:
    data = b"".join(t + _eol(t, style) for t in texts)
    if texts and not final_eol:
        data = data[: -len(_eol(texts[-1], style))]
    return data


@st.composite
def case(draw):
    style = draw(st.sampled_from(["lf", "crlf", "mixed"]))
    line = st.sampled_from(ALPHABET)
    old = draw(st.lists(line, min_size=6, max_size=30))
    new = list(old)
    for _ in range(draw(st.integers(1, 4))):  # the patch: edits anywhere, so often 2+ hunks
        at = draw(st.integers(0, len(new)))
        added = [b"new %d" % draw(st.integers(0, 3))] * draw(st.integers(0, 2))
        new[at : at + draw(st.integers(0, 2))] = added
    base = draw(st.sampled_from(["old", "old", "old", "new"]))  # "new": already applied
    target = list(old if base == "old" else new)
    for _ in range(draw(st.integers(0, 5))):  # drift, decoys and edited context
        kind = draw(st.sampled_from(["drift", "decoy", "edit", "delete"]))
        at = draw(st.integers(0, len(target)))
        if kind == "drift":
            target[at:at] = [draw(line)] * draw(st.integers(1, 3))
        elif kind == "decoy":  # a copy of some of the old text, above or below
            start = draw(st.integers(0, len(old) - 1))
            target[at:at] = old[start : start + draw(st.integers(1, 6))]
        elif at < len(target):
            target[at : at + 1] = [] if kind == "delete" else [draw(line)]
    final_eol = draw(st.booleans())
    files = [_join(t, style, final_eol or draw(st.booleans())) for t in (old, new, target)]
    return (*files, draw(st.integers(0, 3)), draw(st.sampled_from(["gnu", "ours"])))


def gnu_diff(old: bytes, new: bytes, context: int) -> bytes:
    with tempfile.TemporaryDirectory() as tmp:
        a, b = Path(tmp) / "a", Path(tmp) / "b"
        a.write_bytes(old)
        b.write_bytes(new)
        proc = subprocess.run(
            ["diff", f"-U{context}", "--label", "a/f", "--label", "b/f", str(a), str(b)],
            capture_output=True,
        )
    assert proc.returncode in (0, 1), proc.stderr
    return proc.stdout


def _crlf_file_lf_diff(target: bytes, diff: bytes) -> bool:
    """An all-CRLF target and a diff line with a bare LF: we write CRLF there, GNU does not."""
    crlf_file = target.count(b"\n") > 0 and target.count(b"\r\n") == target.count(b"\n")
    body = [line for line in diff.splitlines(keepends=True)[2:] if line[:1] in b" +-"]
    return crlf_file and any(not line.endswith(b"\r\n") for line in body)


def _moved(data, old: bytes, diff: bytes) -> bytes:
    """``old`` with one hunk's old side blanked out at its own place and copied elsewhere:
    either mirrored at the same distance above and below (which copy wins?) or once anywhere,
    possibly above an earlier hunk (a hunk may not move above the last one)."""
    hunks = parse_patch(diff, "p").files[0].hunks
    hunk = data.draw(st.sampled_from(hunks[::-1]), label="hunk")  # the last one by default
    pattern = [line.raw for line in hunk.old_lines]
    lines = split_lines(old)
    start, size = hunk.first - 1, len(pattern)
    if not size or not all(raw.endswith(b"\n") for raw in pattern):
        return old
    filler = b"zz\n"
    if data.draw(st.booleans(), label="mirror"):
        least = (size + 1) // 2  # the two copies may not overlap
        k = data.draw(st.integers(least, max(least, start)), label="distance")
        if start < k:
            return old
        gap = [filler] * (2 * k - size)
        return b"".join(lines[: start - k] + pattern + gap + pattern + lines[start + size :])
    blanked = lines[:start] + [filler] * size + lines[start + size :]
    at = data.draw(st.one_of(st.just(0), st.integers(0, len(blanked))), label="copy at")
    return b"".join(blanked[:at] + pattern + blanked[at:])


def _hunk(data, lines: list[bytes], start: int, stop: int, shift: int) -> bytes | None:
    """One hunk that edits ``lines[start:stop]``, its header moved ``shift`` lines off the
    place where it matches (None: the edit changed nothing, or a header would leave the file)."""
    chunk = lines[start:stop]
    if not all(raw.endswith(b"\n") for raw in chunk):
        return None
    edited = list(chunk)
    at = data.draw(st.integers(0, len(chunk)), label="edit at")
    eol = b"\r\n" if all(raw.endswith(b"\r\n") for raw in chunk) else b"\n"
    added = [b"new %d" % data.draw(st.integers(0, 3)) + eol] * data.draw(st.integers(0, 1))
    edited[at : at + data.draw(st.integers(0, 1))] = added
    body = render_file_diff("f", b"".join(chunk), b"".join(edited)).split(b"\n", 2)[2:]
    if not body or len(_HUNK_HEADER.findall(body[0])) != 1:
        return None
    m = _HUNK_HEADER.match(body[0])
    assert m is not None
    old, new = int(m[1]) + start + shift, int(m[3]) + start + shift
    if old < 1 or new < 0:
        return None
    sizes = [b"," + size if size is not None else b"" for size in (m[2], m[4])]
    return b"@@ -%d%s +%d%s @@" % (old, sizes[0], new, sizes[1]) + body[0][m.end() :]


def _overlapping(data, target: bytes) -> bytes | None:
    """A hand-made two-hunk diff whose second hunk matches only where it starts on the
    first hunk's lines (or just past them), its header at that place or moved off it.
    GNU 2.7.6 refuses a hunk that starts on lines an earlier hunk froze (its context
    before the last change, and the change), yet probes from 2 * guess - min_where upward
    when the guess itself is frozen, and fails a hunk whose change falls on frozen lines."""
    lines = split_lines(target)
    if len(lines) < 3:
        return None
    a1 = data.draw(st.integers(0, len(lines) - 2), label="hunk 1 from")
    b1 = data.draw(st.integers(a1 + 1, min(len(lines) - 1, a1 + 7)), label="hunk 1 to")
    a2 = data.draw(st.integers(a1, b1), label="hunk 2 from")
    b2 = data.draw(st.integers(a2 + 1, min(len(lines), a2 + 7)), label="hunk 2 to")
    shift = data.draw(st.one_of(st.just(0), st.integers(-10, 10)), label="hunk 2 header off by")
    first = _hunk(data, lines, a1, b1, 0)
    second = _hunk(data, lines, a2, b2, shift)
    if first is None or second is None:
        return None
    return b"--- a/f\n+++ b/f\n" + first + second


_HUNK_HEADER = re.compile(rb"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@", re.MULTILINE)


@DIFFERENTIAL
@given(case(), st.data())
def test_engine_matches_gnu_patch_byte_for_byte(example, data):
    old, new, target, fuzz, source = example
    if source == "gnu":
        diff = gnu_diff(old, new, data.draw(st.integers(0, 3), label="context"))
    else:
        diff = render_file_diff("f", old, new)
    placement = data.draw(st.sampled_from(["as drawn", "moved", "overlapping"]), label="target")
    if diff and placement == "moved":
        target = _moved(data, old, diff)
    elif placement == "overlapping":
        diff = _overlapping(data, target) or diff
    if not diff or _crlf_file_lf_diff(target, diff):
        return  # the deliberate difference, pinned by its own test below
    with tempfile.TemporaryDirectory() as tmp:
        expected, gnu_places = gnu_patch(target, diff, Path(tmp), fuzz)
    got, our_places = ours(target, diff, fuzz)
    assert got == expected, (diff, target)
    assert our_places == gnu_places
    # Survey (rebase's report) places each hunk as apply does, and never raises.
    placed, failed = engine.survey_file_patch("p", parse_patch(diff, "p").files[0], target, fuzz)
    if got is not None:
        assert failed == []
        assert {p.hunk: (p.offset, p.fuzz) for p in placed if p.offset or p.fuzz} == our_places


@DIFFERENTIAL
@given(case(), st.data())
def test_overlapping_hunks_match_gnu_patch(example, data):
    """Every example overlaps: hunk 2 can only match on or just past hunk 1's lines."""
    _, _, target, fuzz, _ = example
    diff = _overlapping(data, target)
    if diff is None or _crlf_file_lf_diff(target, diff):
        return
    assert ours(target, diff, fuzz) == _gnu(target, diff, fuzz), (diff, target)


# The engine walks offsets one by one only this far, then searches by index: pad past it.
FAR = locate._WALK + 1


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case(), st.data())
def test_far_offsets_match_gnu_patch(example, data):
    """Hunks moved farther than the near walk, past filler made of the file's own lines."""
    old, new, target, fuzz, _ = example
    diff = render_file_diff("f", old, new)
    lines = split_lines(target)
    whole = [line for line in split_lines(old) if line.endswith(b"\n")]
    if not diff or not whole or not lines[-1].endswith(b"\n"):
        return
    size = data.draw(st.integers(FAR, FAR + 80), label="filler lines")
    filler = data.draw(st.lists(st.sampled_from(whole), min_size=size, max_size=size))
    at = data.draw(st.one_of(st.just(0), st.integers(0, len(lines))), label="filler at")
    target = b"".join(lines[:at] + filler + lines[at:])
    if _crlf_file_lf_diff(target, diff):
        return
    expected = _gnu(target, diff, fuzz)
    assert ours(target, diff, fuzz) == expected, (diff, at, size)


def _gnu(target: bytes, diff: bytes, fuzz: int):
    with tempfile.TemporaryDirectory() as tmp:
        return gnu_patch(target, diff, Path(tmp), fuzz)


# Found by the differential run: hunk 1 is anchored to line 1 (no leading context) so it
# fails at fuzz 0 forward, but its reverse places at fuzz 0 -- the change is already there.
# GNU says "Reversed (or previously applied)" and skips; we used to force it in at fuzz 1.
REVERSED_DIFF = b"--- a/f\n+++ b/f\n@@ -1,2 +1 @@\n-a\n b\n"
REVERSED_TARGET = b"b\na\na\na\nb\n"


def test_first_hunk_whose_reverse_places_first_is_refused_like_gnu(tmp_path):
    (tmp_path / "f").write_bytes(REVERSED_TARGET)
    proc = subprocess.run(
        ["patch", "--batch", "--dry-run", "--fuzz=1", "f"],
        input=REVERSED_DIFF,
        capture_output=True,
        cwd=tmp_path,
    )
    assert b"Reversed (or previously applied) patch detected" in proc.stdout
    assert _gnu(REVERSED_TARGET, REVERSED_DIFF, 1) == (None, {})
    assert ours(REVERSED_TARGET, REVERSED_DIFF, 1) == (None, {})
    result = plan(tmp_path, [parse_patch(REVERSED_DIFF, "p")], max_fuzz=1)
    assert [o.status for o in result.outcomes] == [ApplyStatus.ALREADY_APPLIED]
    assert result.after["f"] == REVERSED_TARGET


def test_a_line_that_lost_its_newline_gets_one_before_added_lines():
    # Fuzz 1 drops the only context line, the file's last line, which has no newline.
    diff = b"--- a/f\n+++ b/f\n@@ -1 +1,2 @@\n a\n+new\n"
    expected = _gnu(b"a", diff, 1)
    assert expected == (b"a\nnew\n", {1: (0, 1)})
    assert ours(b"a", diff, 1) == expected


def test_lf_diff_on_crlf_file_is_a_deliberate_difference():
    """GNU refuses an LF diff on a CRLF file; we apply it and keep the file's CRLF."""
    diff = render_file_diff("f", b"a\nb\nc\n", b"a\nB\nc\n")
    target = b"a\r\nb\r\nc\r\n"
    assert _gnu(target, diff, 0) == (None, {})
    assert ours(target, diff, 0) == (b"a\r\nB\r\nc\r\n", {})
    assert _crlf_file_lf_diff(target, diff)


@pytest.mark.parametrize("header", [b"@@ -0,2 +1,3 @@", b"@@ -1,2 +0,3 @@", b"@@ -0,2 +0,3 @@"])
def test_a_range_at_line_0_with_lines_is_a_deliberate_difference(header):
    """GNU reads the 0 of a malformed range as a line number and applies the hunk; we refuse
    its header (the case generators above never write one)."""
    diff = b"--- a/f\n+++ b/f\n" + header + b"\n a\n+x\n b\n"
    assert _gnu(b"a\nb\nc\n", diff, 0) == (b"a\nx\nb\nc\n", {1: (1, 0)} if b"-0" in diff else {})
    with pytest.raises(PatchParseError, match="starts at line 0"):
        parse_patch(diff, "p")


def test_a_hunk_may_not_move_above_the_previous_one():
    old = b"".join(b"%d\n" % i for i in range(20))
    diff = render_file_diff("f", old, old.replace(b"4\n", b"four\n").replace(b"15\n", b"x\n"))
    second = parse_patch(diff, "p").files[0].hunks[1]
    lines, start = split_lines(old), second.first - 1
    copy = lines[start : start + len(second.old_lines)]
    # Hunk 2's context is gone from its place; its only copy sits above hunk 1.
    target = b"".join(copy + lines[:start] + [b"zz\n"] * len(copy) + lines[start + len(copy) :])
    assert _gnu(target, diff, 0) == (None, {})
    assert ours(target, diff, 0) == (None, {})


def _words(text: str) -> bytes:
    return b"".join(word.encode() + b"\n" for word in text.split())


# Found by the differential run (issue 23), lost again because the test was not
# derandomized: hunk 2's old side "b a b" is gone from its place; its only copy starts on
# hunk 1's context. GNU 2.7.6 refuses it ("Hunk #2 FAILED at 9"); we placed it at offset -7
# and deleted the "a" that was hunk 1's context: a silent wrong result.
OVERLAP_TARGET = _words("b a b b a a a a a a zz zz zz")
OVERLAP_DIFF = b"--- a/f\n+++ b/f\n@@ -1,2 +1,3 @@\n b\n+new 0\n a\n@@ -8,3 +9,2 @@\n b\n-a\n b\n"


def test_a_hunk_may_not_start_on_lines_an_earlier_hunk_used(tmp_path):
    assert _gnu(OVERLAP_TARGET, OVERLAP_DIFF, 0) == (None, {})
    assert ours(OVERLAP_TARGET, OVERLAP_DIFF, 0) == (None, {})
    (tmp_path / "f").write_bytes(OVERLAP_TARGET)
    (tmp_path / "p.diff").write_bytes(OVERLAP_DIFF)
    proc = run_tool("apply.py", "--fuzz", "0", str(tmp_path), str(tmp_path / "p.diff"))
    assert proc.returncode == 1, (proc.stdout, proc.stderr)
    assert "hunk #2 does not apply" in proc.stderr
    assert (tmp_path / "f").read_bytes() == OVERLAP_TARGET  # nothing written


def test_when_the_guess_is_frozen_gnu_scans_up_from_below_it():
    """Hunk 2's header (line 3) points at lines hunk 1 froze (1..4). GNU 2.7.6 then probes
    line 1, min_where (5), then 2, 3, ... upward: it lands at 2, below its guess, its context
    reusing hunk 1's lines while its change does not. A plain outward walk finds nothing."""
    target = _words("a1 a2 a3 a4 a5 a6 a7 a8 a9")
    diff = (
        b"--- a/f\n+++ b/f\n@@ -3,3 +3,3 @@\n a3\n-a4\n+b4\n a5\n"
        b"@@ -3,7 +3,7 @@\n a2\n a3\n a4\n-a5\n+b5\n a6\n a7\n a8\n"
    )
    expected = _gnu(target, diff, 0)
    assert expected == (_words("a1 a2 a3 b4 b5 a6 a7 a8 a9"), {2: (-1, 0)})
    assert ours(target, diff, 0) == expected


def test_a_fully_fuzzed_hunk_whose_guess_is_frozen_fails_like_gnu():
    """Found by the overlapping property: fuzz 1 drops hunk 2's only line, so GNU's first
    upward probe matches at once, at line 0, which GNU reads as "not found"."""
    target = b"a\na\na\na\na\na"
    diff = b"--- a/f\n+++ b/f\n@@ -1 +0,0 @@\n-a\n@@ -1 +1,2 @@\n+new 0\n a\n"
    assert _gnu(target, diff, 1) == (None, {})
    assert ours(target, diff, 1) == (None, {})


def test_an_added_line_that_context_follows_joins_a_line_without_newline_as_gnu():
    """Found by `make test-props` (fresh seeds): fuzz 2 places hunk 2 on the file's last
    line, which has no newline. GNU copies it, then writes the added line as it is (the
    newline fix is copy_till's and the trailing added lines'), so the two join."""
    target = b"a\na\na\na\na\na"
    diff = b"--- a/f\n+++ b/f\n@@ -1,3 +1,2 @@\n a\n a\n-a\n@@ -5,3 +5,4 @@\n a\n a\n+new 0\n a\n"
    expected = _gnu(target, diff, 2)
    assert expected[0] == b"a\na\na\na\nanew 0\n"
    assert ours(target, diff, 2) == expected


def test_a_change_on_frozen_lines_fails_as_misordered(tmp_path):
    target = _words("a1 a2 a3 a4 a5 a6 a7 a8 a9")
    diff = (
        b"--- a/f\n+++ b/f\n@@ -3,3 +3,3 @@\n a3\n-a4\n+b4\n a5\n"
        b"@@ -1,3 +1,3 @@\n a1\n-a2\n+b2\n a3\n"
    )
    (tmp_path / "f").write_bytes(target)
    gnu = subprocess.run(
        ["patch", "--batch", "--dry-run", "--fuzz=0", "f"],
        input=diff,
        capture_output=True,
        cwd=tmp_path,
    )
    assert b"misordered hunks" in gnu.stdout and gnu.returncode == 1
    assert ours(target, diff, 0) == (None, {})
    survey = engine.survey_file_patch("p", parse_patch(diff, "p").files[0], target, 0)
    assert [p.hunk for p in survey[0]] == [1]
    assert [f.hunk for f in survey[1]] == [2] and "misordered" in str(survey[1][0])


# Found comparing survey with apply on generated cases: a hunk with no old side (a `diff -U0`
# insertion, or a zero-context deletion reversed, as rebase's upstream check does) whose
# header points past the end of a shorter file. GNU reads lines past the end as empty, so it
# copies the whole file and appends; apply and survey raised IndexError (a traceback out of
# `bakery rebase`).
PAST_END_DIFF = b"--- a/f\n+++ b/f\n@@ -2,0 +3 @@\n+x\n@@ -5 +6 @@\n-b\n+y\n"


@pytest.mark.parametrize("target", [b"a\n", b"a", b""])
def test_an_insertion_past_the_end_of_a_shorter_file_appends_like_gnu(tmp_path, target):
    insertion = PAST_END_DIFF[: PAST_END_DIFF.index(b"@@ -5")]
    expected = _gnu(target, insertion, 0)
    assert expected == (b"a\nx\n" if target else b"x\n", {})
    assert ours(target, insertion, 0) == expected
    (tmp_path / "f").write_bytes(target)
    gnu = subprocess.run(
        ["patch", "--batch", "--dry-run", "--fuzz=0", "f"],
        input=PAST_END_DIFF,
        capture_output=True,
        cwd=tmp_path,
    )
    assert b"Hunk #2 FAILED" in gnu.stdout and b"Hunk #1" not in gnu.stdout
    placed, failed = engine.survey_file_patch(
        "p", parse_patch(PAST_END_DIFF, "p").files[0], target, 0
    )
    assert list(placed) == [engine.Placement(hunk=1, line=3, offset=0, fuzz=0)]
    assert [f.hunk for f in failed] == [2]


def test_apply_cli_skips_the_reversed_patch_instead_of_applying_it_twice(tmp_path):
    (tmp_path / "f").write_bytes(REVERSED_TARGET)
    (tmp_path / "p.diff").write_bytes(REVERSED_DIFF)
    proc = run_tool("apply.py", "--fuzz", "1", str(tmp_path), str(tmp_path / "p.diff"))
    assert proc.returncode == 0, proc.stderr
    assert "already applied" in proc.stdout
    assert (tmp_path / "f").read_bytes() == REVERSED_TARGET  # before the fix: one "a" less


@pytest.mark.parametrize("copies", ["both", "above", "below"])
def test_copies_just_past_the_near_walk_match_gnu(copies):
    """The hunk's context blanked, copies exactly one line past the near walk (above,
    below at the very end of the file, or both at the same distance: +k wins)."""
    old = [b"line %d\n" % i for i in range(600)]
    new = old[:299] + [b"changed\n"] + old[300:]
    diff = render_file_diff("f", b"".join(old), b"".join(new))
    (hunk,) = parse_patch(diff, "p").files[0].hunks
    start, size, far = hunk.first - 1, len(hunk.old_lines), FAR
    pattern = old[start : start + size]
    target = [b"filler %d\n" % i for i in range(start + far + size)]
    if copies in ("both", "above"):
        target[start - far : start - far + size] = pattern
    if copies in ("both", "below"):
        target[start + far : start + far + size] = pattern
    expected = _gnu(b"".join(target), diff, 0)
    assert expected[0] is not None
    assert ours(b"".join(target), diff, 0) == expected
