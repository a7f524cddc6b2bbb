"""A failed hunk is structure, not a string: HunkFailed's fields, and rebase reading them.

GNU patch is the independent reader for which hunk fails and where it was looked for;
the near-match line comes from where the test itself moved the hunk's lines.
"""

from __future__ import annotations

import json
import re
import subprocess

import pytest

from bakery.cli.root import main
from bakery.errors import HunkFailed, NearMatch
from bakery.maintain import rebase
from bakery.maintain.rebase import HunkVerdict, PatchVerdict, patch_status, survey
from bakery.series import apply
from bakery.series.diff import parse_patch, render_file_diff
from bakery.series.engine import apply_file_patch
from bakery.series.series import load_series
from tests._synthetic_release import series_folder

PATH = "pkg/mod.py"
BASE = [b"v%d = %d" % (i, i) for i in range(1, 41)]
ON_TOP = 2  # lines the release adds above hunk 1 (it places at offset 2)
INSERTED = 4  # lines the release adds between hunk 1 and hunk 2


def _text(lines: list[bytes]) -> bytes:
    return b"\n".join(lines) + b"\n"


def _edited() -> bytes:
    """Three one-line replacements, far apart: three hunks, none changing the line count."""
    new = list(BASE)
    for at in (4, 19, 34):
        new[at] = b"changed %d" % at
    return _text(new)


DIFF = render_file_diff(PATH, _text(BASE), _edited())


def _release() -> bytes:
    """The base as a release moved it: 2 lines added on top, 4 more above hunk 2, and one
    of hunk 2's context lines edited, so hunk 2 cannot place while hunks 1 and 3 can."""
    lines = list(BASE)
    lines[17] = b"v18 = 180"  # the first context line above hunk 2's change (line 18)
    top = [b"# top %d" % i for i in range(ON_TOP)]
    return _text(top + lines[:12] + [b"# new %d" % i for i in range(INSERTED)] + lines[12:])


def _header_starts(diff: bytes) -> list[int]:
    return [int(m) for m in re.findall(rb"^@@ -(\d+)", diff, re.M)]


def _gnu(tmp_path, diff: bytes, target: bytes) -> dict[int, int | None]:
    """Hunk number -> the offset GNU patch 2.7 placed it at, or None where it FAILED."""
    tree = tmp_path / "gnu"
    (tree / "pkg").mkdir(parents=True)
    (tree / PATH).write_bytes(target)
    (tmp_path / "p.diff").write_bytes(diff)
    proc = subprocess.run(
        ["patch", "--dry-run", "--verbose", "--batch", "--forward", "--fuzz=0", "-p1"]
        + ["-d", str(tree), "-i", str(tmp_path / "p.diff")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    hunks = re.findall(
        r"Hunk #(\d+) (succeeded|FAILED) at \d+(?: \(offset (-?\d+) lines?\))?", proc.stdout
    )
    return {int(n): None if how == "FAILED" else int(offset or 0) for n, how, offset in hunks}


@pytest.mark.needs("patch")
def test_a_real_failing_hunk_carries_patch_path_number_and_nearest_match(tmp_path):
    patch = parse_patch(DIFF, "07-mod.diff")
    with pytest.raises(HunkFailed) as raised:
        apply_file_patch(patch.name, patch.files[0], _release(), 0)
    failure = raised.value
    gnu = _gnu(tmp_path, DIFF, _release())
    assert gnu == {1: ON_TOP, 2: None, 3: ON_TOP + INSERTED}  # GNU: only hunk 2 fails
    header = _header_starts(DIFF)[1]
    assert (failure.patch, failure.path, failure.hunk) == ("07-mod.diff", PATH, 2)
    # Looked for where hunk 1's offset sends it (GNU carries offsets over); found, one
    # line edited, INSERTED lines lower.
    assert failure.expected == header + gnu[1]
    moved = ON_TOP + INSERTED  # the offset counts from the diff header, as placements do
    assert failure.nearest == NearMatch(line=header + moved, offset=moved, differing=1)
    # The message is what it always was, and agrees with the fields.
    assert str(failure).startswith(
        f"07-mod.diff: hunk #2 does not apply to '{PATH}' (expected near line {header + 2})\n"
        f" nearest near-match at line {header + moved} (offset {moved}): 1 of 7 lines differ:\n"
    )
    # The series' planner re-raises the engine's failure itself, fields and all.
    tree = tmp_path / "tree"
    (tree / "pkg").mkdir(parents=True)
    (tree / PATH).write_bytes(_release())
    with pytest.raises(HunkFailed) as planned:
        apply.plan(tree, [patch])
    assert (planned.value.hunk, planned.value.nearest) == (2, failure.nearest)


def test_a_hunk_with_no_line_in_the_file_has_no_nearest_match():
    patch = parse_patch(DIFF, "07-mod.diff")
    with pytest.raises(HunkFailed) as raised:
        apply_file_patch(patch.name, patch.files[0], b"unrelated\n" * 50, 0)
    first = _header_starts(DIFF)[0]
    assert (raised.value.hunk, raised.value.expected, raised.value.nearest) == (1, first, None)
    with pytest.raises(HunkFailed) as missing:
        apply_file_patch(patch.name, patch.files[0], None, 0)
    assert (missing.value.patch, missing.value.path, missing.value.hunk) == (
        "07-mod.diff",
        PATH,
        None,
    )


def _survey(tmp_path, name: str, release: bytes, diff: bytes = DIFF):
    series = load_series(series_folder(tmp_path / "series", {name: diff}))
    return series, survey(series, {PATH: release}, 0)


def test_survey_labels_each_hunk_and_the_patch():
    statuses = [
        rebase.HunkStatus("p", "f", 1, HunkVerdict.CLEAN),
        rebase.HunkStatus("p", "f", 2, HunkVerdict.FUZZ, 0, 1),
        rebase.HunkStatus("q", "f", 1, HunkVerdict.UPSTREAM),
        rebase.HunkStatus("r", "f", 1, HunkVerdict.UPSTREAM),
        rebase.HunkStatus("r", "f", 2, HunkVerdict.OFFSET, 3, 0),
        rebase.HunkStatus("s", "f", 1, HunkVerdict.FAILED),
    ]
    verdicts = {p: patch_status(statuses, p) for p in "pqrs"}
    assert verdicts == {
        "p": PatchVerdict.FUZZ,
        "q": PatchVerdict.UPSTREAM,
        "r": PatchVerdict.FAILS,  # partly upstream: a hand must split it
        "s": PatchVerdict.FAILS,
    }
    assert json.dumps(verdicts) == (
        '{"p": "fuzz", "q": "upstream", "r": "fails", "s": "fails"}'
    )  # the words the reports always printed


@pytest.mark.needs("patch")
def test_survey_reports_the_failed_hunk_by_its_field(tmp_path):
    """A patch file whose own name reads "hunk #2 ": searching messages for it (as survey
    once did) hands hunk 2 the report of hunk 1."""
    release = _release().replace(b"v2 = 2\n", b"v2 = 20\n")  # hunk 1 now fails as well
    name = "07-fix hunk #2 .diff"
    assert _gnu(tmp_path, DIFF, release) == {1: None, 2: None, 3: ON_TOP + INSERTED}
    _, statuses = _survey(tmp_path, name, release)
    by_hunk = {s.hunk: s for s in statuses}
    assert [by_hunk[n].status for n in (1, 2, 3)] == [
        HunkVerdict.FAILED,
        HunkVerdict.FAILED,
        HunkVerdict.OFFSET,
    ]
    assert by_hunk[1].detail.startswith(f"{name}: hunk #1 does not apply")
    assert by_hunk[2].detail.startswith(f"{name}: hunk #2 does not apply")
    assert (by_hunk[3].offset, by_hunk[3].fuzz) == (ON_TOP + INSERTED, 0)


def test_survey_matches_failures_to_hunks_without_reading_the_message(tmp_path, monkeypatch):
    """Every failure's message replaced by one that names no hunk: the fields still place
    each report on its hunk."""
    real = rebase.survey_file_patch

    def withheld(patch_name, file_patch, before, max_fuzz):
        placed, failures = real(patch_name, file_patch, before, max_fuzz)
        return placed, [
            HunkFailed(f"report {f.hunk}", patch=f.patch, path=f.path, hunk=f.hunk)
            for f in failures
        ]

    monkeypatch.setattr(rebase, "survey_file_patch", withheld)
    _, statuses = _survey(tmp_path, "07-mod.diff", _release())
    assert [(s.hunk, s.status, s.detail) for s in statuses] == [
        (1, HunkVerdict.OFFSET, ""),
        (2, HunkVerdict.FAILED, "report 2"),
        (3, HunkVerdict.OFFSET, ""),
    ]


def test_apply_json_still_prints_the_status_words(tmp_path, capsys):
    tree = tmp_path / "tree"
    (tree / "pkg").mkdir(parents=True)
    (tree / PATH).write_bytes(_text(BASE))
    (tmp_path / "01-mod.diff").write_bytes(DIFF)
    runs = []
    for _ in range(2):  # applied, then already applied
        assert main(["apply", "--json", str(tree), str(tmp_path / "01-mod.diff")]) == 0
        runs.append(capsys.readouterr().out)
    assert [json.loads(out)["patches"][0]["status"] for out in runs] == [
        "applied",
        "already-applied",
    ]
    assert '"status": "already-applied",' in runs[1]
