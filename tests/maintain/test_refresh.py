"""Refresh round trips and the "patches are up to date" lint, on the real cpu base."""

import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest
import tomlkit

from bakery.series.diff import render_file_diff
from tests.conftest import REPO, SEED, run_cli

pytestmark = pytest.mark.slow
PATCHED = "models/deepseek_v41/nvidia/flashinfer_sparse.py"
UNTOUCHED = "models/deepseek_v41/quant_config.py"


@pytest.fixture
def workspace(tmp_path, cpu_bake):
    series = tmp_path / "series"
    shutil.copytree(REPO / "patches" / "dcp2", series)
    build = tmp_path / "build"
    proc = run_cli("bake", "--base", "cpu", "--series", str(series), "--build", str(build))
    assert proc.returncode == 0, proc.stderr
    return series, build, build / "baked-cpu" / "vllm"


def refresh(series, build, *extra):
    return run_cli(
        "refresh", "--base", "cpu", "--series", str(series), "--build", str(build), *extra
    )


def entries(series: Path) -> dict[str, dict]:
    data = tomllib.loads((series / "series.toml").read_text())
    return {p["file"]: p for p in data["patches"]}


def test_edit_refresh_rebake_reproduces_the_edits(workspace):
    series, build, package = workspace
    patched = (package / PATCHED).read_bytes() + b"# refreshed edit\n"
    untouched = (package / UNTOUCHED).read_bytes().replace(b"\n", b"\n# new\n", 1)
    edit(package / PATCHED, patched)
    edit(package / UNTOUCHED, untouched)  # not through the hard link into the shared cache
    proc = refresh(series, build, "--stage", "2", "--summary", "quant config note")
    assert proc.returncode == 0, proc.stderr
    assert "update: 09-models_deepseek_v41_nvidia_flashinfer_sparse.py.diff" in proc.stdout
    assert "add: 10-models_deepseek_v41_quant_config.py.diff" in proc.stdout
    new = entries(series)["10-models_deepseek_v41_quant_config.py.diff"]
    assert (new["stage"], new["summary"]) == (2, "quant config note")
    # The re-bake (done by refresh) reproduces both edits from the patches alone.
    assert (package / PATCHED).read_bytes() == patched
    assert (package / UNTOUCHED).read_bytes() == untouched
    assert "# Diff paths are relative" in (series / "series.toml").read_text()  # comments kept
    check = run_cli("refresh", "--check", "--base", "cpu", "--series", str(series))
    assert check.returncode == 0, check.stdout


def test_refresh_without_edits_rewrites_nothing(workspace):
    series, build, _ = workspace
    before = {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in series.iterdir()}
    proc = refresh(series, build)
    assert proc.returncode == 0 and "nothing to refresh" in proc.stdout
    assert {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in series.iterdir()} == before


def test_patch_of_a_reverted_file_is_removed_only_when_confirmed(workspace, pristine_cpu):
    series, build, package = workspace
    target = "v1/attention/backends/mla/sparse_swa.py"
    shutil.copyfile(pristine_cpu / "vllm" / target, package / target)
    name = "05-v1_attention_backends_mla_sparse_swa.py.diff"
    proc = refresh(series, build)  # not a TTY and no --yes: refuse, write nothing
    assert proc.returncode == 2 and "pass --yes" in proc.stderr
    assert (series / name).exists()
    proc = refresh(series, build, "--yes")
    assert proc.returncode == 0 and f"remove: {name}" in proc.stdout
    assert not (series / name).exists() and name not in entries(series)


def _replace_patch(series: Path, old: str, new_name: str, data: bytes):
    (series / old).unlink()
    (series / new_name).write_bytes(data)
    toml = (series / "series.toml").read_text().replace(old, new_name)
    (series / "series.toml").write_text(toml)


def run_check(series):
    return run_cli("refresh", "--check", "--base", "cpu", "--series", str(series))


def test_check_fails_on_a_fuzzed_patch(tmp_path):
    series = tmp_path / "series"
    shutil.copytree(REPO / "patches" / "dcp2", series)
    nine = "09-models_deepseek_v41_nvidia_flashinfer_sparse.py.diff"
    _replace_patch(series, nine, nine, SEED.read_bytes())  # the seed needs fuzz 2
    proc = run_check(series)
    assert proc.returncode == 1
    assert f"{nine}: not clean: hunk #1 of {PATCHED} needs offset +0, fuzz 1" in proc.stdout
    assert f"{nine}: stale" in proc.stdout
    assert "need" in proc.stderr and "refresh" in proc.stderr


def minimal_series(tmp_path: Path, patches: dict[str, bytes]) -> Path:
    """The repo's pins and policy with only ``patches`` in it."""
    series = tmp_path / "series"
    series.mkdir(parents=True)
    toml = (REPO / "patches" / "dcp2" / "series.toml").read_text()
    toml = toml[: toml.index("[[patches]]")]
    for name, data in patches.items():
        (series / name).write_bytes(data)
        toml += f'[[patches]]\nfile = "{name}"\nstage = 2\nsummary = "test patch"\n\n'
    (series / "series.toml").write_text(toml)
    return series


SWA = "v1/attention/backends/mla/sparse_swa.py"


def test_check_fails_on_a_stale_patch(tmp_path, pristine_cpu):
    base = (pristine_cpu / "vllm" / SWA).read_bytes()
    edited = base + b"# appended\n"
    canonical = render_file_diff(SWA, base, edited)
    assert run_check(minimal_series(tmp_path / "ok", {"01-swa.diff": canonical})).returncode == 0
    # The same change with a timestamped header (as `diff -u` writes): clean, but stale.
    stale = canonical.replace(b".py\n+++", b".py\t2026-09-10 20:13:20\n+++", 1)
    proc = run_check(minimal_series(tmp_path / "stale", {"01-swa.diff": stale}))
    assert proc.returncode == 1
    assert proc.stdout.strip() == "01-swa.diff: stale: not byte-identical to what refresh writes"


def test_check_fails_on_a_patch_out_of_order(tmp_path, pristine_cpu):
    base = (pristine_cpu / "vllm" / SWA).read_bytes()
    step1 = base.replace(b"\n", b"\n# step one\n", 1)
    step2 = step1.replace(b"# step one\n", b"# step one\n# step two\n", 1)
    series = minimal_series(
        tmp_path,
        {
            "01-late.diff": render_file_diff(SWA, step1, step2),
            "02-early.diff": render_file_diff(SWA, base, step1),
        },
    )
    proc = run_check(series)
    assert proc.returncode == 1
    assert proc.stdout.strip() == "01-late.diff: out of order: it applies only after a later patch"


# --- data-loss guards (issue 11) --------------------------------------------------------------
FIVE = "05-v1_attention_backends_mla_sparse_swa.py.diff"


def edit(path: Path, data: bytes) -> None:
    """Replace a baked file as an editor that saves via rename does: a new inode, so the
    shared pristine cache the baked tree is hard-linked to stays untouched."""
    path.unlink()
    path.write_bytes(data)


def test_refresh_refuses_a_patch_edited_after_the_bake(workspace):
    series, build, _ = workspace
    patch = series / FIVE
    edited = patch.read_bytes().replace(b"# rank 0 attends it once", b"# rank 0 attends it ONCE")
    assert edited != patch.read_bytes()
    patch.write_bytes(edited)
    proc = refresh(series, build, "--no-bake")
    assert proc.returncode == 1, proc.stdout
    assert f"changed: {FIVE}" in proc.stderr
    assert "refresh would undo that change" in proc.stderr
    bake = f"`bakery bake --base cpu --series {series} --build {build}`"  # this series, here
    assert f"hint: to keep the series as it is, re-bake ({bake}" in proc.stderr
    assert f"`git checkout -- {series}`" in proc.stderr
    assert patch.read_bytes() == edited  # the hand edit survives
    assert "update:" not in proc.stdout


def test_refresh_ignores_stray_files(workspace):
    series, build, package = workspace
    folder = package / PATCHED.rsplit("/", 1)[0]
    strays = [
        "flashinfer_sparse.py.orig",
        "flashinfer_sparse.py.rej",
        ".flashinfer_sparse.py.swp",
        "flashinfer_sparse.py~",
        "#flashinfer_sparse.py#",
        "flashinfer_sparse.py.bak",
    ]
    for name in strays:
        (folder / name).write_bytes(b"leftover\n")
    edit(package / PATCHED, (package / PATCHED).read_bytes() + b"# kept edit\n")
    before = sorted(p.name for p in series.iterdir())
    proc = refresh(series, build, "--no-bake")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("ignored (stray file): ") == len(strays)
    assert [line for line in proc.stdout.splitlines() if not line.startswith("ignored")] == [
        "update: 09-models_deepseek_v41_nvidia_flashinfer_sparse.py.diff",
        f"recorded in {build / 'baked-cpu' / 'BAKED.json'}: the tree is a bake of the series",
    ]
    assert sorted(p.name for p in series.iterdir()) == before
    assert b"leftover" not in b"".join(p.read_bytes() for p in series.iterdir())


def test_refresh_dry_run_shows_the_patch_diff_and_writes_nothing(workspace):
    series, build, package = workspace
    edit(package / PATCHED, (package / PATCHED).read_bytes() + b"# dry edit\n")
    before = {p.name: p.read_bytes() for p in series.iterdir()}
    proc = refresh(series, build, "--dry-run")
    assert proc.returncode == 0, proc.stderr
    nine = "09-models_deepseek_v41_nvidia_flashinfer_sparse.py.diff"
    assert f"would update: {nine}" in proc.stdout
    assert f"/{nine}\n+++ " in proc.stdout and "\n++# dry edit\n" in proc.stdout
    assert proc.stdout.rstrip().endswith("dry run: nothing written")
    assert {p.name: p.read_bytes() for p in series.iterdir()} == before
    assert (package / PATCHED).read_bytes().endswith(b"# dry edit\n")  # no re-bake either


def git(folder: Path, *args: str) -> None:
    ident = [
        "-c",
        "user.name=t",
        "-c",
        "user.email=t@example.invalid",
        "-c",
        "commit.gpgsign=false",
    ]
    subprocess.run(["git", *ident, "-C", str(folder), *args], check=True, capture_output=True)


def test_reusing_a_patch_number_keeps_its_stage_and_summary(workspace):
    series, build, package = workspace
    git(series, "init", "-q")
    git(series, "add", "-A")
    git(series, "commit", "-qm", "series")
    old = entries(series)[FIVE]
    patched = (package / SWA).read_bytes()
    # The maintainer drops 05 (say it failed on a rebase), re-bakes, redoes the edit by hand.
    (series / FIVE).unlink()
    doc = tomlkit.parse((series / "series.toml").read_text())
    patches = doc["patches"]
    del patches[next(i for i, t in enumerate(patches) if t["file"] == FIVE)]
    (series / "series.toml").write_text(tomlkit.dumps(doc))
    assert (
        run_cli("bake", "--base", "cpu", "--series", str(series), "--build", str(build)).returncode
        == 0
    )
    edit(package / SWA, patched)
    proc = refresh(series, build, "--at", "5")
    assert proc.returncode == 0, proc.stderr
    assert f"add: {FIVE}" in proc.stdout
    new = entries(series)[FIVE]
    assert (new["stage"], new["summary"]) == (old["stage"], old["summary"])
    assert run_check(series).returncode == 0
