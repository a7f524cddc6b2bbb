"""Issue 26: the engine's scaling case (tools/big_diff.py, which `make bench` times at 30k
hunks), at 3k hunks: the written file equals GNU patch's byte for byte."""

import subprocess

import pytest

from bakery.series import apply
from bakery.series.diff import parse_patch
from tests.series.test_gnu_parity import gnu_patch, ours
from tools.big_diff import big_case

pytestmark = pytest.mark.needs("patch")


def test_the_big_case_is_written_as_gnu_patch_writes_it(tmp_path):
    target, diff = big_case(3000)
    patch = tmp_path / "big.diff"
    patch.write_bytes(diff)
    ours, gnu = tmp_path / "ours", tmp_path / "gnu"
    for tree in (ours, gnu):
        (tree / "pkg").mkdir(parents=True)
        (tree / "pkg" / "big.py").write_bytes(target)
    subprocess.run(["patch", "-s", "-p1", "-d", str(gnu), "-i", str(patch)], check=True)
    plan = apply.plan(ours, [parse_patch(diff, patch.name)])
    assert apply.write(plan) == ["pkg/big.py"]
    expected = (gnu / "pkg" / "big.py").read_bytes()
    assert expected != target  # GNU changed it: the comparison below means something
    assert (ours / "pkg" / "big.py").read_bytes() == expected
    (result,) = plan.outcomes[0].files
    assert len(result.placements) == 3000
    # The file drifts from the diff every 3000 lines: later hunks sit at growing offsets.
    assert {p.offset for p in result.placements} == set(range(10))


def test_a_one_change_hunk_places_only_where_each_old_line_matches_byte_for_byte(tmp_path):
    """The engine places most hunks by comparing spans of the file with the hunk's old side
    (series/engine.py): one byte off in any old line, at its start or its end, must place
    (or fail) exactly as GNU patch does, at fuzz 0 and 2."""
    target, diff = big_case(3)
    hunk = parse_patch(diff, "big.diff").files[0].hunks[1]
    lines = target.splitlines(keepends=True)
    for index in range(hunk.old_start - 1, hunk.old_start - 1 + hunk.old_len):
        line = lines[index]
        for edited in (b"Z" + line[1:], line[:-1] + b"Z\n"):
            changed = b"".join(lines[:index] + [edited] + lines[index + 1 :])
            for fuzz in (0, 2):
                assert ours(changed, diff, fuzz) == gnu_patch(changed, diff, tmp_path, fuzz)
