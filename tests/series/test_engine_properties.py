"""Property tests of the hunk engine over random texts (LF, CRLF, no final newline)."""

import os
import subprocess
import sys

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from bakery.series.diff import parse_patch, render_file_diff
from bakery.series.engine import apply_file_patch
from tests.conftest import REPO

pytestmark = pytest.mark.property
SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def texts(draw, unique=False):
    """A file as bytes: a few short lines from a tiny alphabet (so context repeats)."""
    eol = draw(st.sampled_from([b"\n", b"\r\n"]))
    if unique:
        count = draw(st.integers(1, 40))
        body = [b"line %d" % i for i in draw(st.permutations(range(200)))[:count]]
    else:
        body = draw(st.lists(st.sampled_from([b"a", b"b", b"c", b"", b"x y", b"\tz"]), max_size=30))
    data = b"".join(line + eol for line in body)
    if body and draw(st.booleans()):
        data = data[: -len(eol)]  # no newline at end of file
    return data


@st.composite
def edited(draw, base: bytes):
    """``base`` with random line replacements, insertions and deletions (same EOL style)."""
    eol = b"\r\n" if b"\r\n" in base else b"\n"
    lines = base.split(eol)
    for _ in range(draw(st.integers(0, 5))):
        op = draw(st.sampled_from(["insert", "delete", "replace"]))
        at = draw(st.integers(0, len(lines)))
        new = b"new %d" % draw(st.integers(0, 9))
        if op == "insert":
            lines.insert(at, new)
        elif at < len(lines):
            if op == "delete":
                del lines[at]
            else:
                lines[at] = new
    return eol.join(lines)


def _apply(diff: bytes, target: bytes, fuzz: int = 0, reverse: bool = False):
    patch = parse_patch(diff, "p")
    if reverse:
        patch = patch.reversed()
    return apply_file_patch("p", patch.files[0], target, fuzz)


@SETTINGS
@given(st.data())
def test_apply_diff_gives_b_and_reverse_gives_a(data):
    a = data.draw(texts())
    b = data.draw(edited(a))
    diff = render_file_diff("f", a, b)
    if not diff:
        assert a == b
        return
    assert _apply(diff, a).after == b
    assert _apply(diff, b, reverse=True).after == a


@SETTINGS
@given(st.data())
def test_lines_inserted_above_shift_every_hunk_by_their_count(data):
    a = data.draw(texts(unique=True))
    b = data.draw(edited(a))
    diff = render_file_diff("f", a, b)
    assume(diff)
    # GNU semantics: a first hunk with less leading than trailing context is
    # anchored to line 1 and (rightly) refuses to move at fuzz 0.
    first = parse_patch(diff, "p").files[0].hunks[0]
    assume(first.prefix_context >= first.suffix_context or first.first > 1)
    eol = b"\r\n" if b"\r\n" in a else b"\n"
    above = data.draw(st.integers(1, 25))
    prefix = b"".join(b"inserted %d" % i + eol for i in range(above))
    result = _apply(diff, prefix + a)
    assert result.after == prefix + b
    assert {p.offset for p in result.placements} == {above}
    assert all(p.fuzz == 0 for p in result.placements)


def test_lf_diff_applies_to_crlf_target_keeping_crlf():
    diff = render_file_diff("f", b"a\nb\nc\n", b"a\nB\nc\nd\n")
    assert _apply(diff, b"a\r\nb\r\nc\r\n").after == b"a\r\nB\r\nc\r\nd\r\n"


def test_hunk_anchored_at_file_start_does_not_move_at_fuzz_0():
    diff = render_file_diff("f", b"line 0\n", b"new 0\nline 0\n")
    with pytest.raises(Exception, match="does not apply"):
        _apply(diff, b"inserted 0\nline 0\n")


def test_no_newline_is_not_matched_by_a_newline():
    diff = render_file_diff("f", b"a\nb", b"a\nc")
    with pytest.raises(Exception, match="does not apply"):
        _apply(diff, b"a\nb\n")


_DRAWS = """
import os
from hypothesis import given, strategies as st

@given(st.lists(st.integers()))
def test_draws(xs):
    with open(os.environ["DRAWS_OUT"], "a") as out:
        out.write(repr(xs) + "\\n")
"""


def _draws(tmp_path, run: int, **env: str) -> str:
    """The examples a throwaway property test sees in one child pytest, under tests/conftest."""
    test = tmp_path / "test_draws.py"
    test.write_text(_DRAWS)
    out = tmp_path / f"draws-{run}.txt"
    environ = {k: v for k, v in os.environ.items() if k not in ("CI", "HYPOTHESIS_PROFILE")}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "tests.conftest",
            "-p",
            "no:cacheprovider",
            "--rootdir",
            str(REPO),
            "-c",
            str(REPO / "pyproject.toml"),
            str(test),
        ],
        cwd=REPO,
        env={**environ, **env, "DRAWS_OUT": str(out)},
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return out.read_text()


def test_property_tests_are_derandomized_under_ci_and_fresh_for_make_test_props(tmp_path):
    ci = [_draws(tmp_path, run, CI="true") for run in (1, 2)]
    assert ci[0] == ci[1] and ci[0].count("\n") >= 50
    fresh = [_draws(tmp_path, run, CI="true", HYPOTHESIS_PROFILE="fresh") for run in (3, 4)]
    assert fresh[0] != fresh[1]
