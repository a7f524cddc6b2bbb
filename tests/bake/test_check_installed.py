"""`bakery check` of an installed patched wheel from outside its environment, and of every
member, not only the patched ones (issue 24, item 4).

The patched cpu wheel goes into a fresh venv that has no bakery (pip --python installs it
from outside); `bakery check --python` finds its site-packages by asking that Python.
A line appended to an unpatched file (vllm/envs.py), which the BAKED.json re-hash alone
passed, is caught against the wheel's RECORD."""

import csv
import subprocess
import sys

import pytest

from tests.conftest import run_cli

UNPATCHED = "vllm/envs.py"


@pytest.fixture(scope="module")
def venv(module_tmp, cpu_bake):
    root = module_tmp("vllm-env") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True)
    python = root / "bin" / "python"
    install = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet"]
        + ["--no-deps", "--no-compile", "--disable-pip-version-check", str(cpu_bake.wheel)],
        capture_output=True,
        text=True,
    )
    assert install.returncode == 0, install.stderr[-2000:]
    return python, next(root.glob("lib/python*/site-packages"))


def test_check_python_needs_no_bakery_in_that_environment(venv):
    python, site = venv
    alone = subprocess.run([str(python), "-I", "-c", "import bakery"], capture_output=True)
    assert alone.returncode != 0, "bakery must not be importable in the vLLM environment"
    proc = run_cli("check", "--python", str(python))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (record,) = site.glob("*.dist-info/RECORD")
    hashed = [row for row in csv.reader(record.open(newline="")) if row[1]]
    assert "other file(s) match RECORD" in proc.stdout
    others = int(proc.stdout.split("; ")[1].split()[0])
    touched = int(proc.stdout.split("ok: ")[1].split()[0])
    assert others + touched == len(hashed) - 1  # BAKED.json itself is RECORD's, not a file's


def test_an_edit_to_an_unpatched_installed_file_is_caught(venv):
    python, site = venv
    target = site / UNPATCHED
    original = target.read_bytes()
    try:
        target.write_bytes(original + b"\nLEAKED = 1\n")
        proc = run_cli("check", "--python", str(python))
        assert proc.returncode == 1, proc.stdout
        assert f"modified: {UNPATCHED}" in proc.stdout.splitlines()
        assert "error: 1 file(s) drifted from" in proc.stderr
        target.unlink()
        proc = run_cli("check", str(site))  # the same through the folder
        assert proc.returncode == 1 and f"missing: {UNPATCHED}" in proc.stdout.splitlines()
    finally:
        target.write_bytes(original)
    assert run_cli("check", "--python", str(python)).returncode == 0


def test_a_replaced_unpatched_file_of_a_baked_tree_is_caught(tmp_path, series, cache):
    """Replaced, not written through the hard link (the pristine cache stays as it is)."""
    from bakery.bake.bake import bake

    tree = bake(series, "cpu", build=tmp_path, cache=cache).tree
    target = tree / UNPATCHED
    data = target.read_bytes()
    target.unlink()
    target.write_bytes(data + b"# edited\n")
    proc = run_cli("check", str(tree))
    assert proc.returncode == 1 and f"modified: {UNPATCHED}" in proc.stdout.splitlines()


def test_check_usage_and_a_python_without_the_wheel(tmp_path):
    both = run_cli("check", str(tmp_path), "--python", sys.executable)
    neither = run_cli("check")
    for proc in (both, neither):
        assert proc.returncode == 2 and "give a DIRECTORY or --python" in proc.stderr
    plain = run_cli("check", "--python", "/usr/bin/python3")
    assert plain.returncode == 1 and "no patched wheel installed for /usr/bin/python3" in (
        plain.stderr
    )
    missing = run_cli("check", "--python", str(tmp_path / "nope"))
    assert missing.returncode == 2 and "cannot run that Python" in missing.stderr
    assert "Traceback" not in both.stderr + neither.stderr + plain.stderr + missing.stderr
