"""Issue 22, finding 18 (the smaller ones): bad input is exit 2 with the option it came
from, and a killed capture's staging folder is swept by the next capture."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.conftest import REPO, run_cli


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


def test_a_killed_captures_staging_is_swept_by_the_next(tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True).stdout.strip()  # fmt: skip
    left = tmp_path / f".bundle.tmp-{dead}"
    left.mkdir()
    (left / "case.json").write_bytes(b"x" * 1000)
    proc = run_cli("verify", "capture", "--url", "http://127.0.0.1:9", "--retries", "0",
                   "--out", str(tmp_path / "bundle"))  # fmt: skip
    assert proc.returncode != 0  # nothing listens there
    assert not left.exists() and not [p for p in os.listdir(tmp_path) if p.startswith(".")]
    assert REPO.exists()
