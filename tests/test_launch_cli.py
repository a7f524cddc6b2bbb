"""run.sh in vLLM's own words: -tp/-dcp spellings, progress while start waits, ``logs [-f]``.

Fast: the "server" is a shell under the real keeper (no vLLM); the real-server
versions of start and stop are in test_launch_smoke.py.
"""

from __future__ import annotations

import dataclasses
import os

import pytest
from _launch_support import PROFILES, PYTHON, REPO, SERIES, canned_probe, free_port

from bakery.launch import lifecycle, preflight
from bakery.launch.cli import main
from bakery.launch.errors import LaunchError
from bakery.launch.gates import load_gate_table
from bakery.launch.plan import make_plan
from bakery.launch.preflight import Facts
from bakery.launch.profiles import load_profile, override


@pytest.fixture
def env(monkeypatch, tmp_path, cpu_bake):
    monkeypatch.setattr(preflight, "run_probe", canned_probe())
    monkeypatch.delenv("PYTHONPATH", raising=False)
    return {"build": cpu_bake.tree.parent, "art": tmp_path / "art"}


@pytest.mark.parametrize(
    "spelling",
    [
        ("--tp", "3", "--dcp", "2"),
        ("-tp", "3", "-dcp", "2"),
        ("--tensor-parallel-size", "3", "--decode-context-parallel-size", "2"),
        ("--tensor-parallel-size=3", "-dcp", "2"),
    ],
)
def test_vllms_spellings_of_tp_and_dcp(capsys, env, spelling):
    code = main(
        ["start", "--profile", "cpu-tiny", "--dry-run", "--build", str(env["build"])]
        + ["--artifacts", str(env["art"]), "--port", str(free_port()), *spelling]
    )
    err = capsys.readouterr().err
    assert code == 3
    assert (
        "  - TP not divisible by DCP (DCP groups split the TP group evenly): --tp 3 --dcp 2" in err
    )


def shell_plan(art, shell: str, timeout_s: float = 3.0):
    profile = load_profile("cpu-tiny", PROFILES, load_gate_table(SERIES))
    profile = override(profile, port=free_port(), startup_timeout_s=timeout_s)
    plan = make_plan(
        profile, python=PYTHON, tree=REPO / "build" / "baked-cpu", root=REPO, artifacts=art
    )
    return dataclasses.replace(plan, command=("/bin/sh", "-c", shell))


def test_start_shows_elapsed_time_and_the_last_log_line_while_it_waits(tmp_path, monkeypatch):
    monkeypatch.setattr(lifecycle, "PROGRESS_S", 0.5)
    plan = shell_plan(tmp_path / "art", "echo 'Loading weights took 1.2 s'; echo; sleep 300")
    said = []
    with pytest.raises(LaunchError, match="the server was not ready within 3 s"):
        lifecycle.start(plan, Facts(), [], grace_s=1.0, say=said.append)
    waits = [s for s in said if s.startswith("waiting ")]
    assert waits, said
    assert waits[-1].endswith(" / 3 s: Loading weights took 1.2 s")
    seconds = [int(w.split()[1]) for w in waits]
    assert seconds == sorted(seconds) and seconds[-1] >= 2


def test_logs_prints_the_newest_runs_log(capsys, tmp_path):
    art = tmp_path / "art"
    for text in ("first run", "second run"):
        plan = shell_plan(art, f"echo '{text}'; exit 3")
        with pytest.raises(LaunchError):
            lifecycle.start(plan, Facts(), [], grace_s=1.0, say=lambda _: None)
    code = main(["logs", "--artifacts", str(art)])
    out = capsys.readouterr()
    assert code == 0
    assert out.out.strip() == "second run"
    assert out.err.startswith(f"log: {art}/cpu-tiny/")


def test_logs_follow_prints_until_the_run_ends(capsys, tmp_path):
    art = tmp_path / "art"
    plan = shell_plan(art, "echo one; sleep 1; echo two; sleep 1; echo three")
    record = lifecycle.new_record(plan)
    proc, write_fd = lifecycle._spawn(plan, record, 1.0)
    os.write(write_fd, b"detach\n")
    os.close(write_fd)
    code = main(["logs", "-f", "--artifacts", str(art)])
    out = capsys.readouterr().out
    assert code == 0
    assert out.split() == ["one", "two", "three"]
    assert proc.wait(timeout=10) == 0


def test_logs_with_no_run_is_one_error(capsys, tmp_path):
    code = main(["logs", "--artifacts", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 1
    assert err.splitlines()[0] == f"error: no run recorded under {tmp_path}"
