"""An append to an untouched baked file writes through its hard link into the pristine
cache: `bake --check` and `check` must see it (per-file hashes of the tree cannot)."""

import os

import pytest

from tests.conftest import run_cli

pytestmark = pytest.mark.slow
UNTOUCHED = "vllm/models/deepseek_v41/quant_config.py"


def test_append_through_a_hard_link_is_reported_by_bake_check_and_check(
    tmp_path, series, cache, cpu_bake
):
    pin = series.base("cpu")
    # A private cache (the real wheel, a fresh pristine tree): the append below must
    # not reach the cache every other bake on this machine shares.
    private = tmp_path / "cache"
    (private / "wheels" / pin.sha256).mkdir(parents=True)
    os.symlink(
        cache / "wheels" / pin.sha256 / pin.wheel, private / "wheels" / pin.sha256 / pin.wheel
    )
    env = {"BAKERY_CACHE": str(private)}
    build = tmp_path / "build"
    assert run_cli("bake", "--base", "cpu", "--build", str(build), env=env).returncode == 0
    tree = build / "baked-cpu"
    assert (
        os.stat(tree / UNTOUCHED).st_ino
        == os.stat(private / "pristine" / pin.sha256 / UNTOUCHED).st_ino
    )
    for args in (["bake", "--check", "--base", "cpu", "--build", str(build)], ["check", str(tree)]):
        assert run_cli(*args, env=env).returncode == 0
    with open(tree / UNTOUCHED, "ab") as handle:  # `echo ... >> file`
        handle.write(b"# appended\n")
    for args in (["bake", "--check", "--base", "cpu", "--build", str(build)], ["check", str(tree)]):
        proc = run_cli(*args, env=env)
        assert proc.returncode == 1, (args, proc.stdout)
        assert f"modified through a hard link into the pristine cache: {UNTOUCHED}" in proc.stdout
