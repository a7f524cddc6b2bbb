"""``refresh --check`` on a small synthetic pristine tree: one test per finding (fast).

Each series below is built so that exactly the findings it asserts are true of it; the
expected lists are complete, so a missing or an extra finding fails.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from bakery.maintain.refresh import patches_out_of_date
from bakery.series.diff import render_file_diff
from bakery.series.series import load_series
from tests.bake.test_identity_manifest import _series

BASE = b"".join(b"line %d\n" % i for i in range(40))
STEP1 = BASE.replace(b"line 5\n", b"five\n")
STEP2 = STEP1.replace(b"line 30\n", b"thirty\n")
OTHER = b"other\n" * 3


@pytest.fixture
def pristine(tmp_path) -> Path:
    root = tmp_path / "pristine"
    root.mkdir()
    (root / "a.py").write_bytes(BASE)
    (root / "b.py").write_bytes(OTHER)
    return root


def findings(tmp_path: Path, pristine: Path, patches: dict[str, bytes]) -> list[str]:
    return patches_out_of_date(load_series(_series(tmp_path / "series", patches)), pristine)


def test_up_to_date_series_has_no_finding(tmp_path, pristine):
    patches = {
        "01-a.diff": render_file_diff("a.py", BASE, STEP2),
        "02-b.diff": render_file_diff("b.py", OTHER, OTHER + b"more\n"),
    }
    assert findings(tmp_path, pristine, patches) == []


def test_out_of_order(tmp_path, pristine):
    patches = {  # 01 edits the line that 02 writes
        "01-late.diff": render_file_diff("a.py", STEP1, STEP1.replace(b"five\n", b"5\n")),
        "02-early.diff": render_file_diff("a.py", BASE, STEP1),
    }
    assert findings(tmp_path, pristine, patches) == [
        "01-late.diff: out of order: it applies only after a later patch"
    ]


def test_does_not_apply_even_with_fuzz(tmp_path, pristine):
    foreign = b"".join(b"foreign %d\n" % i for i in range(40))
    changed = foreign.replace(b"foreign 20\n", b"x\n")  # removes a line the base lacks
    patches = {"01-a.diff": render_file_diff("a.py", foreign, changed)}
    assert findings(tmp_path, pristine, patches) == ["01-a.diff: does not apply, even with fuzz 3"]


def test_already_upstream(tmp_path, pristine):
    (pristine / "a.py").write_bytes(STEP1)  # the base already carries the change
    patches = {"01-a.diff": render_file_diff("a.py", BASE, STEP1)}
    assert findings(tmp_path, pristine, patches) == [
        "01-a.diff: already in the base (upstream); remove it",
        "01-a.diff: stale: not byte-identical to what refresh writes",
    ]


def test_offset_is_not_clean(tmp_path, pristine):
    (pristine / "a.py").write_bytes(b"new 1\nnew 2\n" + BASE)
    patches = {"01-a.diff": render_file_diff("a.py", BASE, STEP1)}
    assert findings(tmp_path, pristine, patches) == [
        "01-a.diff: not clean: hunk #1 of a.py needs offset +2, fuzz 0",
        "01-a.diff: stale: not byte-identical to what refresh writes",
    ]


def test_fuzz_is_not_clean(tmp_path, pristine):
    (pristine / "a.py").write_bytes(BASE.replace(b"line 2\n", b"edited\n"))
    patches = {"01-a.diff": render_file_diff("a.py", BASE, STEP1)}
    assert findings(tmp_path, pristine, patches) == [
        "01-a.diff: not clean: hunk #1 of a.py needs offset +0, fuzz 1",
        "01-a.diff: stale: not byte-identical to what refresh writes",
    ]


def test_two_patches_touching_one_file(tmp_path, pristine):
    patches = {
        "01-a.diff": render_file_diff("a.py", BASE, STEP1),
        "02-a-again.diff": render_file_diff("a.py", STEP1, STEP2),
    }
    # Both apply cleanly; refresh writes one diff per file, so both are stale too.
    assert findings(tmp_path, pristine, patches) == [
        "02-a-again.diff: touches a.py, which 01-a.diff touches too",
        "01-a.diff: stale: not byte-identical to what refresh writes",
        "02-a-again.diff: stale: not byte-identical to what refresh writes",
    ]


def test_stale_header(tmp_path, pristine):
    canonical = render_file_diff("a.py", BASE, STEP1)
    stale = canonical.replace(b"a.py\n+++", b"a.py\t2026-09-10 20:13:20\n+++", 1)
    assert findings(tmp_path, pristine, {"01-a.diff": stale}) == [
        "01-a.diff: stale: not byte-identical to what refresh writes"
    ]
