"""merge.force: the series forced onto a release's files, for linkcheck. A patch that
places is applied; one that does not is union-merged (both sides' lines where they
clash), or, when that does not parse, placed as far as its hunks go."""

from __future__ import annotations

from bakery.maintain.merge import force
from bakery.series.diff import render_file_diff
from bakery.series.series import load_series
from tests._synthetic_release import series_folder

OLD = b"import os\n\nLIMIT = 10\n\n\ndef f():\n    return LIMIT\n"
PATCHED = b"import os\nimport sys\n\nLIMIT = 12\n\n\ndef f():\n    return LIMIT, sys.argv\n"


def _series(tmp_path, patched: bytes = PATCHED):
    diff = render_file_diff("m.py", OLD, patched)
    return load_series(series_folder(tmp_path / "s", {"01-m.py.diff": diff}))


def test_a_patch_that_places_is_applied(tmp_path):
    series = _series(tmp_path)
    files, forced = force(series, {"m.py": OLD}, {"m.py": b"# new\n" + OLD}, "r", 3)
    assert files["m.py"] == b"# new\n" + PATCHED and forced == []


def test_a_clash_is_union_merged(tmp_path):
    series = _series(tmp_path)
    release = OLD.replace(b"LIMIT = 10", b"LIMIT = 20")
    files, forced = force(series, {"m.py": OLD}, {"m.py": release}, "r", 0)
    assert b"LIMIT = 20\nLIMIT = 12\n" in files["m.py"] and b"import sys\n" in files["m.py"]
    assert [(f.patch, f.how) for f in forced] == [("01-m.py.diff", "merged")]


def test_a_union_that_does_not_parse_places_what_places(tmp_path):
    old = b"import os\n" + b"\n" * 8 + b"def f(a):\n    if a:\n        return 1\n    return 2\n"
    patched = old.replace(b"import os\n", b"import os\nimport sys\n").replace(
        b"    return 2\n", b"    else:\n        return sys\n"
    )
    diff = render_file_diff("m.py", old, patched)
    series = load_series(series_folder(tmp_path / "s", {"01-m.py.diff": diff}))
    # The release changed the same line: the union puts `else:` after `return 3`.
    release = old.replace(b"    return 2\n", b"    return 3\n")
    files, forced = force(series, {"m.py": old}, {"m.py": release}, "r", 0)
    (entry,) = forced
    assert (entry.how, entry.skipped, entry.unbound) == ("partly placed", (2,), frozenset())
    assert files["m.py"] == release.replace(b"import os\n", b"import os\nimport sys\n")
