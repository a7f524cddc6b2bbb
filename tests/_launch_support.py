"""Helpers shared by the launcher tests: run.sh as a user runs it, ports, process scans."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from pathlib import Path
from typing import NamedTuple

import tomlkit

from bakery.cli.launch import main
from bakery.launch.host import ProbeAnswer, ProbeArgs

REPO = Path(__file__).resolve().parents[1]
RUN_SH = REPO / "launcher" / "dcp2" / "run.sh"
PROFILES = REPO / "launcher" / "dcp2" / "profiles"
SERIES = REPO / "patches" / "dcp2"
DATA = REPO / "tests" / "data" / "launch"
PYTHON = REPO / ".venv" / "bin" / "python"


def run_sh(*args: str, timeout: float = 600, env: dict | None = None, cwd: Path | None = None):
    """``launcher/dcp2/run.sh ARGS`` as a subprocess; bounded by ``timeout``."""
    return subprocess.run(
        [str(RUN_SH), *args],
        cwd=cwd or REPO,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def marked(run_prefix: str) -> list[int]:
    """Live processes whose environment carries BAKERY_LAUNCH_RUN=<run_prefix...>.

    Every process the launcher starts inherits that variable, so this finds one
    even if it left the process group (setsid) or was re-parented. A run id
    (profile/UTC second) is not unique: a run of another test or checkout in the
    same second shares it. To follow one run, use ``launched_in``.
    """
    return _scan(lambda item: item.startswith(f"BAKERY_LAUNCH_RUN={run_prefix}".encode()))


def launched_in(run_dir: Path) -> list[int]:
    """Live processes whose BAKERY_LAUNCH_DIR is exactly ``run_dir`` (absolute: one run)."""
    return _scan(f"BAKERY_LAUNCH_DIR={run_dir}".encode().__eq__)


def _scan(wanted) -> list[int]:
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as handle:
                state = handle.read().rsplit(")", 1)[1].split()[0]
            environ = Path(f"/proc/{name}/environ").read_bytes()
        except OSError:
            continue
        if state != "Z" and any(map(wanted, environ.split(b"\0"))):
            found.append(int(name))
    return found


def wait_until(predicate, timeout: float, step: float = 0.5) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(step)
    return bool(predicate())


def series_with_stage(dest: Path, number: int, status: str, *more: tuple[int, str]) -> Path:
    """A copy of the dcp2 series whose stage ``number`` (and each of ``more``) has ``status``.

    Stage 4 (candidate blocks) is implemented by another change of this round; the
    launcher's tests pin the status they need instead of depending on the merge order.
    An implemented stage must name a patch: it gets stage 3's when it has none.
    """
    shutil.copytree(SERIES, dest)
    data = tomlkit.parse((dest / "stages.toml").read_text())
    stages = {s["number"]: s for s in data["stages"]}
    for n, st in ((number, status), *more):
        stages[n]["status"] = st
        if st == "implemented" and not stages[n]["patches"]:
            stages[n]["patches"] = list(stages[3]["patches"])
    (dest / "stages.toml").write_text(tomlkit.dumps(data))
    return dest


def canned_probe(**parsed):
    """A probe answer with vLLM's parse of the plan's own layout (``parsed`` overrides)."""

    def probe(plan) -> ProbeAnswer:
        lay, args = plan.profile.layout, plan.profile.vllm_args
        flag = "--cp-kv-cache-interleave-size"
        interleave = int(args[args.index(flag) + 1]) if flag in args else None
        values = {
            "tensor_parallel_size": lay.tp,
            "pipeline_parallel_size": lay.pp,
            "decode_context_parallel_size": lay.dcp,
            "cp_kv_cache_interleave_size": interleave,
            "dcp_kv_cache_interleave_size": 1,
            **parsed,
        }
        return ProbeAnswer(
            vllm_file=str(plan.tree / "vllm" / "__init__.py"),
            vllm_version="0.32.0",
            torch_version="2.13.0+cpu",
            ray=False,
            args=ProbeArgs(ok=True, parsed=values),
        )

    return probe


def tiny_model_dir(dest: Path) -> Path:
    """A model folder with a tiny Llama config.json: cpu-tiny's --model for in-process
    preflights (the real tiny model, build/tiny-llama, is made only by the smoke tests)."""
    dest.mkdir(parents=True, exist_ok=True)
    config = '{"model_type": "llama", "architectures": ["LlamaForCausalLM"]}\n'
    (dest / "config.json").write_text(config)
    return dest


class Launched(NamedTuple):
    """What ``run.sh start`` said: its exit code, the problem lines of a refusal (its
    ``  - `` items) and the whole of stderr."""

    code: int
    problems: list[str]
    err: str


def launch(capsys, env, *args: str, profile: str = "cpu-tiny", port: int | None = None):
    """``run.sh start`` in process (``bakery.cli.launch.main``) on the ``env`` fixture's
    build, artifacts, series and python, on a free port (and its tiny model for cpu-tiny).
    ``args`` come last, so a ``--`` among them passes vLLM flags. No traceback may reach the
    user, and a dry run leaves no record."""
    argv = ["start", "--profile", profile, "--build", str(env["build"])]
    argv += ["--artifacts", str(env["art"]), "--series", str(env["series"])]
    argv += ["--python", str(PYTHON), "--port", str(port or free_port())]
    argv += ["--model", str(env["model"])] if profile == "cpu-tiny" else []
    code = main([*argv, *args])
    err = capsys.readouterr().err
    assert "Traceback" not in err
    if "--dry-run" in args:
        assert not env["art"].exists(), "a dry run must leave no record"
    return Launched(code, [line[4:] for line in err.splitlines() if line.startswith("  - ")], err)
