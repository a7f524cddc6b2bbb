"""After `bake --wheel W` the wheel is in the cache under its verified sha256, so later
commands that need the pin (here `refresh --check`) work with pip unable to download."""

import hashlib
import os

import pytest

from tests.conftest import REPO, run_cli

pytestmark = pytest.mark.slow
OFFLINE = {"PIP_NO_INDEX": "1", "PIP_CONFIG_FILE": "/dev/null", "PIP_FIND_LINKS": ""}


def test_bake_with_a_local_wheel_makes_later_commands_work_offline(
    tmp_path, series, cache, cpu_bake
):
    pin = series.base("cpu")
    given = tmp_path / "given" / pin.wheel
    given.parent.mkdir()
    os.link(cache / "wheels" / pin.sha256 / pin.wheel, given)
    env = {**OFFLINE, "BAKERY_CACHE": str(tmp_path / "cache")}
    check = ["refresh", "--check", "--base", "cpu", "--series", str(REPO / "patches" / "dcp2")]
    before = run_cli(*check, env=env)  # proves pip really cannot download here
    assert before.returncode == 1 and "pip could not download" in before.stderr
    assert (
        "hint: check the network, or put a local copy of the pinned wheel in the cache once "
        "with `bakery bake --base cpu --wheel PATH`" in before.stderr
    )
    bake = run_cli(
        "bake", "--base", "cpu", "--wheel", str(given), "--build", str(tmp_path / "b"), env=env
    )
    assert bake.returncode == 0, bake.stderr
    cached = tmp_path / "cache" / "wheels" / pin.sha256 / pin.wheel
    assert hashlib.sha256(cached.read_bytes()).hexdigest() == pin.sha256
    after = run_cli(*check, env=env)
    assert after.returncode == 0, after.stderr
