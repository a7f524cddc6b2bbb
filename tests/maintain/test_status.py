"""`bakery status`, `bakery --version` and finding the repo root from a subfolder."""

import json
import tomllib

import pytest

from tests._synthetic_release import make_loop
from tests.conftest import REPO, run_cli, run_door

# Run from a subfolder, ``-m bakery`` must still import this checkout's bakery.
HERE = {"PYTHONPATH": str(REPO)}


@pytest.fixture
def loop(tmp_path):
    return make_loop(tmp_path)


def status(cli) -> dict:
    proc = cli("status", "--json")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_status_reports_bake_pending_edits_staleness_and_rebase(loop):
    series, build, cli, _, _ = loop
    baked = json.loads((build / "baked" / "BAKED.json").read_text())
    report = status(cli)
    default, cpu = report["bases"]["default"], report["bases"]["cpu"]
    assert report["series"]["sha256"] == baked["series"]["sha256"]
    assert (default["baked"], default["stale"], default["pending"]) == (True, [], [])
    assert (
        default["pin"]
        == tomllib.loads((series / "series.toml").read_text())["bases"]["default"]["requirement"]
    )
    assert cpu["baked"] is False and report["rebase"] is None and report["servers"] == []

    # An edit in the tree is pending (what refresh would write); a stray file is not.
    target = build / "baked" / "vllm" / "a.py"
    data = target.read_bytes()
    target.unlink()
    target.write_bytes(data + b"# more\n")
    (target.parent / "a.py.rej").write_bytes(b"stray\n")
    default = status(cli)["bases"]["default"]
    assert default["pending"] == [{"action": "update", "file": "01-a.py.diff"}]
    assert default["strays"] == ["a.py.rej"]
    assert "modified: vllm/a.py" in default["stale"]
    text = cli("status").stdout
    assert "pending: update 01-a.py.diff" in text and "ignored (stray file): a.py.rej" in text

    # A series edited after the bake: stale, and pending edits cannot be told.
    target.unlink()
    target.write_bytes(data)
    (series / "02-b.py.diff").write_bytes((series / "02-b.py.diff").read_bytes() + b" \n")
    default = status(cli)["bases"]["default"]
    assert default["pending"] is None and "baked from series" in default["stale"][0]


def test_status_shows_a_rebase_in_progress(loop):
    _, _, cli, _, _ = loop
    assert cli("rebase", "--to", "vllm==0.2.0", "--checkout").returncode == 1
    assert status(cli)["rebase"] == {"release": "vllm==0.2.0", "conflicts": ["b.py"]}
    assert "rebase onto vllm==0.2.0 in progress; conflicts left: b.py" in cli("status").stdout


def test_version_names_the_series_and_its_pins_from_a_subfolder():
    proc = run_door("--version", cwd=REPO / "launcher" / "dcp2", env=HERE)  # python -m bakery
    assert proc.returncode == 0, proc.stderr
    toml = tomllib.loads((REPO / "patches" / "dcp2" / "series.toml").read_text())
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("bakery ") and lines[1].startswith("series dcp2 sha256 ")
    for key, pin in [*toml["bases"].items(), *toml["dependencies"].items()]:
        assert f"  {key}: {pin['requirement']} sha256 {pin['sha256']}" in lines


def test_commands_find_the_repo_root_from_a_subfolder(tmp_path):
    proc = run_cli(
        "bake", "--check", "--build", str(tmp_path / "none"), cwd=REPO / "launcher", env=HERE
    )
    assert "no series here" not in proc.stderr
    assert proc.returncode == 1 and f"no baked tree at {tmp_path / 'none' / 'baked'}" in proc.stdout
    proc = run_cli("status", cwd=REPO / "launcher" / "dcp2", env=HERE)
    assert proc.returncode == 0 and "at ../../patches/dcp2" in proc.stdout
    outside = run_cli("status", cwd=tmp_path, env=HERE)
    assert outside.returncode == 2 and "no series here" in outside.stderr


def test_status_escapes_control_characters_from_a_header(loop):
    """Issue 35, finding 15. Before: a summary's carriage return and escape sequence went to
    the terminal raw (the line could be overwritten or the screen cleared)."""
    series, _, cli, _, _ = loop
    toml = series / "series.toml"
    text = toml.read_text()
    at = text.index('summary = "') + len('summary = "')
    toml.write_text(text[:at] + "hidden\\rshown \\u001b[2J" + text[at:])
    out = cli("status").stdout
    assert "\r" not in out and "\x1b" not in out
    assert "hidden\\rshown \\x1b[2J" in out
