"""The one project-root resolver: $BAKERY_ROOT, else the nearest folder holding the series."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from bakery import project

REPO = Path(__file__).resolve().parents[1]


def _checkout(tmp_path: Path) -> Path:
    root = tmp_path / "checkout"
    (root / project.SERIES).mkdir(parents=True)
    (root / project.SERIES / "series.toml").write_text("")
    (root / "deep" / "er").mkdir(parents=True)
    return root


def test_found_from_a_subfolder_as_git_finds_dot_git(tmp_path, monkeypatch):
    root = _checkout(tmp_path)
    monkeypatch.delenv(project.ROOT_ENV, raising=False)
    monkeypatch.chdir(root / "deep" / "er")
    assert project.root() == Path("../..")
    assert (project.root() / project.SERIES / "series.toml").is_file()
    monkeypatch.chdir(root)
    assert project.root() == Path(".")


def test_no_checkout_above_means_the_current_folder(tmp_path, monkeypatch):
    monkeypatch.delenv(project.ROOT_ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    assert project.root() == Path(".")


def test_the_environment_wins(tmp_path, monkeypatch):
    root = _checkout(tmp_path)
    monkeypatch.chdir(root / "deep")
    monkeypatch.setenv(project.ROOT_ENV, str(tmp_path / "elsewhere"))
    assert project.root() == tmp_path / "elsewhere"


def test_run_sh_serves_its_own_checkout_from_any_folder(tmp_path):
    """The launcher's defaults are the checkout's, not the caller's folder: run.sh names
    its checkout in $BAKERY_ROOT (the default artifacts folder shows in the refusal)."""
    env = {
        **os.environ,
        "BAKERY_ROOT": "/nonexistent",  # run.sh sets its own
        "BAKERY_PYTHON": sys.executable,
    }
    proc = subprocess.run(
        [str(REPO / "launcher/dcp2/run.sh"), "logs", "--profile", "no-such-profile-ever"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert proc.returncode == 1
    assert f"no run recorded under {REPO / project.ARTIFACTS}" in proc.stderr, proc.stderr
    assert list(tmp_path.iterdir()) == []  # nothing written in the caller's folder
