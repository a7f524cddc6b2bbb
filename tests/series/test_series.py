"""Hostile series.toml: wrong types, out-of-range values and escaping paths are refused
with one clear error (exit 2) before anything is written."""

from __future__ import annotations

import dataclasses
import os
import shutil
import zipfile
from pathlib import Path

import pytest
import tomlkit
from packaging.version import Version

from bakery.bake.bake import bake
from bakery.bake.wheel import read_wheel, write_patched_wheel
from bakery.cli.root import main
from bakery.errors import SeriesError, UnsafePathError
from bakery.series.series import load_series
from tests.conftest import REPO

REAL = REPO / "patches" / "dcp2"


def _set(*keys, value):
    def change(doc):
        table = doc
        for key in keys[:-1]:
            table = table[key]
        table[keys[-1]] = value

    return change


def _drop(*keys):
    def change(doc):
        table = doc
        for key in keys[:-1]:
            table = table[key]
        del table[keys[-1]]

    return change


# (case id, edit of the real series.toml, a phrase the one error line must hold)
CASES = [
    ("file-int", _set("patches", 0, "file", value=1), "$.patches[0].file: expected str, got int"),
    (
        "fuzz-str",
        _set("policy", "max_fuzz", value="abc"),
        "$.policy.max_fuzz: expected int, got str",
    ),
    (
        "fuzz-bool",
        _set("policy", "max_fuzz", value=True),
        "$.policy.max_fuzz: expected int, got bool",
    ),
    ("policy-int", _set("policy", value=5), "$.policy: expected a table/object, got int"),
    (
        "renames-list",
        _set("renames", value=["a/", "b/"]),
        "$.renames: expected a table/object, got an array",
    ),
    ("rename-int", _set("renames", "x/", value=3), "$.renames.x/: expected str, got int"),
    ("fuzz-99", _set("policy", "max_fuzz", value=99), "$.policy.max_fuzz: must be 0..3, not 99"),
    ("fuzz-neg", _set("policy", "max_fuzz", value=-1), "$.policy.max_fuzz: must be 0..3, not -1"),
    ("strip-neg", _set("policy", "strip", value=-1), "$.policy.strip: must be 0..16, not -1"),
    (
        "strip-huge",
        _set("policy", "strip", value=10**18),
        "$.policy.strip: must be 0..16, not 1000000000000000000",
    ),
    (
        "stage-str",
        _set("patches", 0, "stage", value="3"),
        "$.patches[0].stage: expected int, got str",
    ),
    ("stage-0", _set("patches", 0, "stage", value=0), "$.patches[0].stage: must be 1..9, not 0"),
    (
        "summary-empty",
        _set("patches", 0, "summary", value=" "),
        "$.patches[0].summary: must be a line of text, not ' '",
    ),
    ("summary-gone", _drop("patches", 0, "summary"), "$.patches[0].summary: missing"),
    (
        "unknown-top",
        _set("pakage", value="vllm"),
        "$.pakage: unknown field (known: bases, name, package",
    ),
    (
        "unknown-policy",
        _set("policy", "fuzz", value=1),
        "$.policy.fuzz: unknown field (known: strip, max_fuzz)",
    ),
    ("unknown-patch", _set("patches", 1, "stag", value=1), "$.patches[1].stag: unknown field"),
    (
        "sha-int",
        _set("bases", "cpu", "sha256", value=5),
        "$.bases.cpu.sha256: expected str, got int",
    ),
    ("pin-gone", _drop("bases", "cpu", "wheel"), "$.bases.cpu.wheel: missing"),
    ("default-gone", _drop("bases", "default"), "$.bases.default: missing"),
    ("bases-gone", _drop("bases"), "$.bases: missing"),
    (
        "patches-table",
        _set("patches", value={"file": "x"}),
        "$.patches: expected an array, got a table/object",
    ),
    (
        "allow-list",
        _set("linkcheck", value={"allow": [1]}),
        "$.linkcheck.allow: expected a table/object, got an array",
    ),
    ("package-up", _set("package", value="../../../x"), "$.package: must be a folder"),
    ("package-abs", _set("package", value="/tmp/x"), "names joined by '/'), not '/tmp/x'"),
    ("package-dot", _set("package", value="."), "$.package: must be a folder"),
    (
        "name-space",
        _set("name", value="a b"),
        "$.name: must be letters and digits (joined by . _ -), not 'a b'",
    ),
    ("rename-up", _set("renames", "models/", value="../../x/"), "leaves the tree"),
    ("rename-abs", _set("renames", "/etc/", value="models/"), "leaves the tree"),
    (
        "file-up",
        _set("patches", 0, "file", value="../01-x.diff"),
        "$.patches[0].file: must be NN-<path>.diff, not '../01-x.diff'",
    ),
    (
        "file-nul",
        _set("patches", 0, "file", value="01-a\0.diff"),
        "$.patches[0].file: must be NN-<path>.diff, not '01-a\\x00.diff'",
    ),
    (
        "sha-short",
        _set("bases", "cpu", "sha256", value="abc"),
        "$.bases.cpu.sha256: must be 64 lowercase hex digits, not 'abc'",
    ),
    (
        "sha-newline",
        _set("bases", "cpu", "sha256", value="a" * 64 + "\n"),
        "$.bases.cpu.sha256: must be 64 lowercase hex digits, not 'aaaa",
    ),
    (
        "wheel-up",
        _set("bases", "cpu", "wheel", value="../x.whl"),
        "$.bases.cpu.wheel: must be a file name, not '../x.whl'",
    ),
]


def _series_copy(tmp_path: Path, change) -> Path:
    copy = tmp_path / "series"
    shutil.copytree(REAL, copy)
    doc = tomlkit.parse((copy / "series.toml").read_text())
    change(doc)
    (copy / "series.toml").write_text(tomlkit.dumps(doc))
    return copy


def _bake_cli(capsys, series: Path, build: Path) -> tuple[int, list[str]]:
    code = main(["bake", "--base", "cpu", "--series", str(series), "--build", str(build)])
    captured = capsys.readouterr()
    return code, captured.err.splitlines()


@pytest.mark.parametrize("change, phrase", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_series_toml_is_one_clear_error_exit_2(tmp_path, capsys, change, phrase):
    series = _series_copy(tmp_path, change)
    build = tmp_path / "build"
    code, err = _bake_cli(capsys, series, build)
    assert code == 2, err
    assert len(err) == 2 and err[0].startswith("error: ") and err[1].startswith("hint: "), err
    assert phrase in err[0]
    assert not build.exists()


@pytest.mark.parametrize("kind", ["devzero", "fifo", "folder"])
def test_a_patch_that_is_not_a_regular_file_is_refused(tmp_path, capsys, kind):
    series = _series_copy(tmp_path, lambda doc: None)
    patch = series / "01-model_executor_kernels_attention_dsa_candidate_blocks.py.diff"
    patch.unlink()
    {"devzero": lambda: os.symlink("/dev/zero", patch), "fifo": lambda: os.mkfifo(patch)}.get(
        kind, patch.mkdir
    )()
    code, err = _bake_cli(capsys, series, tmp_path / "build")
    assert code == 2 and "patch is not a regular file" in err[0], err


def test_every_type_problem_is_named_at_once(tmp_path):
    def change(doc):
        doc["policy"]["max_fuzz"] = "abc"
        doc["patches"][0]["file"] = 1
        doc["bases"]["cpu"]["sha256"] = 5  # inside a map: the key is named, not [...]
        doc["colour"] = "blue"

    with pytest.raises(SeriesError, match=r"4 problems") as caught:
        load_series(_series_copy(tmp_path, change))
    assert caught.value.exit_code == 2
    for phrase in (
        "$.policy.max_fuzz: expected int, got str",
        "$.patches[0].file: expected str, got int",
        "$.bases.cpu.sha256: expected str, got int",
        "$.colour: unknown field",
    ):
        assert phrase in str(caught.value)


def test_every_range_problem_is_named_at_once(tmp_path):
    # Types right, values not: the checks after decoding also report every problem at once.
    def change(doc):
        doc["policy"]["strip"] = -1
        doc["patches"][1]["stage"] = 0
        doc["package"] = "../x"

    with pytest.raises(SeriesError, match=r"3 problems") as caught:
        load_series(_series_copy(tmp_path, change))
    phrases = (
        "$.policy.strip: must be 0..16, not -1",
        "$.patches[1].stage: must be 1..9, not 0",
        "$.package: must be a folder of the wheel such as 'vllm' (names joined by '/'), not '../x'",
    )
    for phrase in phrases:
        assert phrase in str(caught.value)
    assert caught.value.exit_code == 2  # bad input, as a type problem is


def test_the_real_series_is_valid():
    series = load_series(REAL)
    assert (series.package, series.max_fuzz, series.strip) == ("vllm", 0, 1)


NEW_FILE = b"""--- /dev/null
+++ b/evil.py
@@ -0,0 +1 @@
+print("written outside the build folder")
"""


def test_escaping_package_with_a_file_creating_patch_writes_nothing(tmp_path, capsys):
    """The issue's case: on the old code this bake exited 0, wrote b/x/evil.py beside the
    build folder and put a ../ member into the wheel."""
    series = tmp_path / "series"
    series.mkdir()
    toml = (REAL / "series.toml").read_text()
    head, _, _ = toml.partition("[[patches]]")
    head = head.replace('package = "vllm"', 'package = "../../../x"')
    (series / "series.toml").write_text(
        head + '[[patches]]\nfile = "01-evil.py.diff"\nstage = 1\nsummary = "creates a file"\n'
    )
    (series / "01-evil.py.diff").write_bytes(NEW_FILE)
    build = tmp_path / "a" / "b" / "c" / "build"
    before = {p for p in tmp_path.rglob("*")}
    code, err = _bake_cli(capsys, series, build)
    assert code == 2 and "$.package: must be a folder" in err[0], err
    assert {p for p in tmp_path.rglob("*")} == before  # nothing written anywhere
    assert not list(tmp_path.rglob("evil.py"))


@pytest.mark.slow
def test_bake_confines_the_package_even_past_the_loader(tmp_path, series, cache):
    """Second wall: a Series built in code (not loaded) with an escaping package."""
    bad = dataclasses.replace(series, package="../x")
    build = tmp_path / "build"
    with pytest.raises(UnsafePathError, match="leaves the tree"):
        bake(bad, "cpu", build=build, cache=cache)
    assert not build.exists()


def test_patched_wheel_never_gets_a_member_outside_the_root(tmp_path):
    base = tmp_path / "demo-1.0-py3-none-any.whl"
    with zipfile.ZipFile(base, "w") as zf:
        zf.writestr("demo/a.py", b"a\n")
        zf.writestr("demo-1.0.dist-info/METADATA", b"Name: demo\nVersion: 1.0\n")
        zf.writestr("demo-1.0.dist-info/RECORD", b"demo/a.py,,\n")
    out = tmp_path / "out.whl"
    for member in ("../evil.py", "demo/../../evil.py", "/abs.py"):
        with pytest.raises(UnsafePathError):
            write_patched_wheel(read_wheel(base), out, Version("1.0+x"), {member: b"x"}, {})
        assert not out.exists()
