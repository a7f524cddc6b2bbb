"""Issue 26, item 8: one way to exit 1 (an ``error:`` line from the boundary), and an
OSError is exit 2 when a path cannot be read or written as given (README), 1 only when
the disk fails the work; each with a hint. Bad input is exit 2 with the option it came
from."""

from __future__ import annotations

import errno
import re
import shutil
from pathlib import Path

import pytest

from bakery.cli import series as series_cli
from bakery.cli.root import main
from tests._synthetic_release import make_loop
from tests.conftest import REPO, run_cli


def test_an_input_over_the_read_bound_is_exit_2_with_a_hint(tmp_path):
    _, build, cli, _, _ = make_loop(tmp_path)
    huge = build / "baked" / "vllm" / "huge.py"
    with open(huge, "wb") as handle:  # 65 MiB of text: no NUL, over refresh's 64 MiB bound
        handle.write(b"x = 1\n" * (65 * (1 << 20) // 6))
    proc = cli("refresh", "--dry-run")
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.splitlines()
    assert lines[0].startswith("error: larger than") and str(huge) in lines[0]
    assert lines[1].startswith("hint: check the path named") and len(lines) == 2


@pytest.mark.parametrize(
    "code, expected",
    [(errno.EACCES, 2), (errno.ENOENT, 2), (errno.EISDIR, 2), (errno.ENOSPC, 1), (errno.EROFS, 1)],
)
def test_an_oserror_is_2_for_a_path_and_1_for_the_disk(capsys, monkeypatch, code, expected):
    def fails(root):
        raise OSError(code, "as the system says", "PLAN.md")

    monkeypatch.setattr(series_cli.stages, "stage_table_problems", fails)
    assert main(["stages"]) == expected
    err = capsys.readouterr().err.splitlines()
    assert err[0] == "error: as the system says: 'PLAN.md'" and err[1].startswith("hint: ")
    assert ("free space" in err[1]) == (expected == 1)


def silent_exits(folder: Path) -> list[str]:
    """`return 1`, click's Exit(1) or sys.exit(1) in a command: an exit 1 with no error."""
    found = []
    for path in sorted(folder.glob("*.py")):
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if re.search(r"return 1\b|Exit\(1\)|exit\(1\)", line):
                found.append(f"{path.name}:{number}: {line.strip()}")
    return found


def test_no_command_exits_1_but_through_an_error():
    assert silent_exits(REPO / "bakery" / "cli") == []


def test_planted_silent_exit_is_caught(tmp_path):
    """The CLI with bisect's old `return 1` put back."""
    shutil.copytree(REPO / "bakery" / "cli", tmp_path / "cli")
    bake = tmp_path / "cli" / "bake.py"
    text = bake.read_text()
    bake.write_text(text.replace("        if passes(total):\n", "        if passes(total):\n"
                                 "            return 1\n", 1))  # fmt: skip
    (found,) = silent_exits(tmp_path / "cli")
    assert found.startswith("bake.py:") and found.endswith(": return 1")


@pytest.mark.parametrize("kind", ["missing", "devnull", "folder"])
def test_a_wheel_that_is_no_regular_file_is_bad_input(tmp_path, kind):
    wheel = {"missing": tmp_path / "nope.whl", "devnull": "/dev/null", "folder": tmp_path}[kind]
    proc = run_cli("bake", "--base", "cpu", "--wheel", str(wheel), "--build", str(tmp_path / "b"))
    assert proc.returncode == 2, proc.stderr
    if kind != "folder":  # a folder is click's own refusal (dir_okay=False)
        assert proc.stderr.startswith("error: --wheel is not a regular file")


@pytest.mark.parametrize("command", ["capture", "calibrate"])
def test_capture_out_that_is_a_file_is_bad_input(tmp_path, command):
    out = tmp_path / "file"
    out.write_text("mine\n")
    proc = run_cli("verify", command, "--url", "http://127.0.0.1:9", "--out", str(out))
    assert proc.returncode == 2, proc.stderr
    assert "not a file" in proc.stderr and out.read_text() == "mine\n"


def test_rebase_matrix_names_its_own_option():
    proc = run_cli("rebase-matrix", "--releases", "0.30.0,not a version")
    assert proc.returncode == 2 and proc.stderr.startswith("error: --releases "), proc.stderr
    assert "--to" not in proc.stderr
