"""Issue 22: names from our own files never become paths or shell text (findings 3, 5 and
the matrix ranges of 18), through the launcher's CLI."""

from __future__ import annotations

import dataclasses
import os
import shlex
import subprocess

import pytest
from _launch_support import PROFILES, PYTHON, REPO, SERIES

from bakery.cli.launch import main
from bakery.launch import run_record
from bakery.launch.errors import ProfileError
from bakery.launch.gates import load_gate_table
from bakery.launch.plan import make_plan
from bakery.launch.profiles import load_profile

MATRIX = (REPO / "launcher" / "dcp2" / "matrix-cpu.toml").read_text()


def matrix_with(tmp_path, *, name: str = "cand", head: str = "") -> str:
    """matrix-cpu.toml's settings (``head``, a ``key = value`` line, replaces its key's),
    a baseline and one candidate named ``name``."""
    key = head.split("=")[0].strip()
    top = MATRIX.split("[baseline]")[0].splitlines()
    text = head + "".join(f"{line}\n" for line in top if not key or not line.startswith(key))
    text += '[baseline]\nname = "base"\nprofile = "cpu-tiny"\n\n'
    text += f'[[candidates]]\nname = "{name.encode("unicode_escape").decode()}"\n'
    text += 'profile = "cpu-tiny"\n'
    path = tmp_path / "m.toml"
    path.write_text(text)
    return str(path)


def run_matrix(capsys, tmp_path, path: str) -> tuple[int, str]:
    out = tmp_path / "run" / "out"
    code = main(["matrix", "--matrix", path, "--out", str(out), "--artifacts", str(tmp_path)])
    return code, capsys.readouterr().err


@pytest.mark.parametrize(
    "name", ["../../../escape", "/tmp/escape-abs", "a/b", "..", ".hidden", "x\ny", "", "a b"]
)
def test_a_matrix_name_that_is_a_path_is_refused_before_anything_runs(capsys, tmp_path, name):
    path = matrix_with(tmp_path, name=name)
    before = set(tmp_path.rglob("*"))
    code, err = run_matrix(capsys, tmp_path, path)
    assert code == 2, err
    assert "candidates[0].name" in err and "not a plain name" in err
    assert err.startswith("error: ") and len(err.splitlines()) == 2
    assert set(tmp_path.rglob("*")) == before  # no bundle, no report, no run folder
    assert not os.path.exists("/tmp/escape-abs")


@pytest.mark.parametrize(
    "line, field",
    [
        ("top_n = 0", "top_n"),
        ("top_n = -3", "top_n"),
        ("low_margin = nan", "low_margin"),
        ("low_margin = inf", "low_margin"),
        ("low_margin = -0.5", "low_margin"),
        ("concurrency = 0", "concurrency"),
    ],
)
def test_matrix_settings_out_of_range_are_refused(capsys, tmp_path, line, field):
    code, err = run_matrix(capsys, tmp_path, matrix_with(tmp_path, head=line + "\n"))
    assert code == 2 and f"$.{field}: must be" in err, err


def test_a_bundle_path_from_a_name_is_confined_where_it_is_written(tmp_path):
    """The second wall: the writer joins a name only through own_path."""
    from bakery.errors import UnsafePathError
    from bakery.tree import own_path

    for bad in ("../x", "/abs", "a/../../b", "x\n"):
        with pytest.raises(UnsafePathError):
            own_path(tmp_path / "bundles", bad, "a matrix name")
    (tmp_path / "bundles").mkdir()
    (tmp_path / "bundles" / "link").symlink_to(tmp_path)
    with pytest.raises(UnsafePathError, match="symlink"):
        own_path(tmp_path / "bundles", "link", "a matrix name")


INJECTED = "X; touch pwned; Y"


def test_a_profile_env_key_that_is_shell_code_is_refused(capsys, tmp_path):
    profile = tmp_path / "evil.toml"
    text = (PROFILES / "cpu-tiny.toml").read_text()
    profile.write_text(text.replace("[env]\n", f'[env]\n"{INJECTED}" = "1"\n"" = "2"\n'))
    code = main(["start", "--profile", str(profile), "--dry-run", "--artifacts", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 2, err
    words = "must be a variable name (letters, digits, _; not a digit first)"
    assert f"$.env key {INJECTED!r}: {words}, not {INJECTED!r}" in err
    assert f"$.env key '': {words}, not ''" in err
    assert not (tmp_path / "pwned").exists() and not list(tmp_path.rglob("serve_command.sh"))


def test_serve_command_never_holds_an_unquoted_name(tmp_path, monkeypatch):
    """Behind the profile check: the script writer refuses a bad name itself, and leaves
    out inherited variables whose names a shell could not export."""
    profile = load_profile("cpu-tiny", PROFILES, load_gate_table(SERIES))
    plan = make_plan(profile, python=PYTHON, tree=None, root=REPO, artifacts=tmp_path)
    with pytest.raises(ProfileError, match="not a variable name"):
        run_record.command_script(
            dataclasses.replace(plan, env=(*plan.env, (INJECTED, "1"))), "run"
        )
    monkeypatch.setenv(f"DSV41_{INJECTED}", "1")
    monkeypatch.setenv("DSV41_OK", "$(touch pwned)")
    script = run_record.command_script(plan, "run")
    assert "touch pwned; Y" not in script
    assert f"export DSV41_OK={shlex.quote('$(touch pwned)')}" in script
    runnable = script.replace("exec ", "echo ").replace("set -euo pipefail", "")
    proc = subprocess.run(["bash", "-c", runnable], cwd=tmp_path, capture_output=True)
    assert proc.returncode == 0 and not (tmp_path / "pwned").exists(), proc.stderr


def test_a_forged_pid_file_never_makes_stop_signal_an_unrelated_group(tmp_path):
    """Finding 18: pgid, start ticks and command line copied from a live process that the
    launcher never started (no run marker in its environment): stop leaves it alone."""
    import json
    import time

    from bakery.launch.processes import cmdline, start_ticks

    victim = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        time.sleep(0.2)
        run = tmp_path / "art" / "cpu-tiny" / "20260101T000000Z"
        run.mkdir(parents=True)
        (run / "server.pid").write_text(json.dumps({
            "pgid": victim.pid, "start_ticks": start_ticks(victim.pid),
            "cmdline": cmdline(victim.pid), "url": None, "profile": "cpu-tiny",
        }))  # fmt: skip
        code = main(["stop", "--artifacts", str(tmp_path / "art"), "--grace", "1"])
        assert code in (0, 1)
        assert victim.poll() is None, "stop signalled a group the launcher never started"
    finally:
        victim.kill()
        victim.wait()


@pytest.mark.parametrize("model", ["", "  ", "a\nerror: forged line", "x\x1b[31m"])
def test_an_empty_or_control_character_model_is_refused(capsys, tmp_path, model):
    code = main(["start", "--profile", "cpu-tiny", "--model", model, "--dry-run",
                 "--artifacts", str(tmp_path)])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.startswith("error: empty or holding a control character: --model ")
    assert len(err.splitlines()) == 2  # the newline is escaped: no forged line


@pytest.mark.parametrize(
    "line, field",
    [
        ("stage_max = 100000000000000000000000", "stage_max"),
        ("stage_max = 0", "stage_max"),
        ("stage_min = -1", "stage_min"),
        ("stage_default = 10", "stage_default"),
        ("dcp_min_stage = 99", "dcp_min_stage"),
        ("stage_min = 5", ""),  # above stage_default 3
    ],
)
def test_a_stage_range_beyond_the_table_is_refused(capsys, tmp_path, line, field):
    """Finding 18: stages.toml's [gates] numbers name stages of the table, in order."""
    import shutil

    series = tmp_path / "dcp2"
    shutil.copytree(SERIES, series)
    text = (series / "stages.toml").read_text()
    key = line.split(" = ")[0]
    lines = [line if row.startswith(f"{key} = ") else row for row in text.splitlines()]
    assert lines != text.splitlines()
    (series / "stages.toml").write_text("\n".join(lines) + "\n")
    code = main(["start", "--profile", "cpu-tiny", "--series", str(series), "--dry-run",
                 "--artifacts", str(tmp_path / "art")])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.startswith("error: ") and len(err.splitlines()) == 2, err  # error + hint
    assert f"$.gates.{field}: must be" in err if field else "$.gates: stage_min <=" in err
    assert not (tmp_path / "art").exists()
