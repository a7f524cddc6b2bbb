"""Refresh round trips and the "patches are up to date" lint, on the real cpu base.

``refresh --check`` on a small synthetic pristine tree: one test per finding (fast).

Each series below is built so that exactly the findings it asserts are true of it; the
expected lists are complete, so a missing or an extra finding fails.

`refresh --no-bake` records the written series in the tree's BAKED.json, so the next
refresh and `status` see a bake of the series on disk (they refused, or said "unknown");
on the synthetic release pair (fast: tiny real wheels, no download).

Fast: ``refresh`` refuses when only the series' apply settings changed after the bake.

The bake records the series sha256 (settings included); a fuzz or rename change alone
leaves every patch's bytes as they were, so a check that compares patches only would
let refresh rewrite the series from a tree baked under other settings.

Issue 22: refresh never reads through a symlink out of the tree, never writes a series it
cannot bake, and writes its files all or nothing under a write fault or a kill (findings 7,
11, 12, 13), through the CLI on the synthetic release.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import tomlkit

from bakery.errors import BakeryError
from bakery.maintain import refresh as maintain_refresh
from bakery.maintain.refresh import patches_out_of_date
from bakery.series.diff import render_file_diff
from bakery.series.series import load_series
from tests._synthetic_release import PATCHED, make_loop, series_folder
from tests.conftest import REPO, SEED, run_cli
from tests.maintain.test_rebase_loop import snapshot

PATCHED_FILE = "models/deepseek_v41/nvidia/flashinfer_sparse.py"
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


@pytest.mark.slow
def test_edit_refresh_rebake_reproduces_the_edits(workspace):
    series, build, package = workspace
    patched = (package / PATCHED_FILE).read_bytes() + b"# refreshed edit\n"
    untouched = (package / UNTOUCHED).read_bytes().replace(b"\n", b"\n# new\n", 1)
    edit(package / PATCHED_FILE, patched)
    edit(package / UNTOUCHED, untouched)  # not through the hard link into the shared cache
    last = max(int(name.split("-", 1)[0]) for name in entries(series))
    added = f"{last + 1:02d}-models_deepseek_v41_quant_config.py.diff"  # after the last
    proc = refresh(series, build, "--stage", "2", "--summary", "quant config note")
    assert proc.returncode == 0, proc.stderr
    assert "update: 09-models_deepseek_v41_nvidia_flashinfer_sparse.py.diff" in proc.stdout
    assert f"add: {added}" in proc.stdout
    new = entries(series)[added]
    assert (new["stage"], new["summary"]) == (2, "quant config note")
    # The re-bake (done by refresh) reproduces both edits from the patches alone.
    assert (package / PATCHED_FILE).read_bytes() == patched
    assert (package / UNTOUCHED).read_bytes() == untouched
    assert "# Diff paths are relative" in (series / "series.toml").read_text()  # comments kept
    check = run_cli("refresh", "--check", "--base", "cpu", "--series", str(series))
    assert check.returncode == 0, check.stdout


@pytest.mark.slow
def test_refresh_without_edits_rewrites_nothing(workspace):
    series, build, _ = workspace
    before = {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in series.iterdir()}
    proc = refresh(series, build)
    assert proc.returncode == 0 and "nothing to refresh" in proc.stdout
    assert {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in series.iterdir()} == before


@pytest.mark.slow
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


@pytest.mark.slow
def test_check_fails_on_a_fuzzed_patch(tmp_path):
    series = tmp_path / "series"
    shutil.copytree(REPO / "patches" / "dcp2", series)
    nine = "09-models_deepseek_v41_nvidia_flashinfer_sparse.py.diff"
    _replace_patch(series, nine, nine, SEED.read_bytes())  # the seed needs fuzz 2
    proc = run_check(series)
    assert proc.returncode == 1
    assert f"{nine}: not clean: hunk #1 of {PATCHED_FILE} needs offset +0, fuzz 1" in proc.stdout
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


@pytest.mark.slow
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


@pytest.mark.slow
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


@pytest.mark.slow
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


@pytest.mark.slow
def test_refresh_ignores_stray_files(workspace):
    series, build, package = workspace
    folder = package / PATCHED_FILE.rsplit("/", 1)[0]
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
    edit(package / PATCHED_FILE, (package / PATCHED_FILE).read_bytes() + b"# kept edit\n")
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


@pytest.mark.slow
def test_refresh_dry_run_shows_the_patch_diff_and_writes_nothing(workspace):
    series, build, package = workspace
    edit(package / PATCHED_FILE, (package / PATCHED_FILE).read_bytes() + b"# dry edit\n")
    before = {p.name: p.read_bytes() for p in series.iterdir()}
    proc = refresh(series, build, "--dry-run")
    assert proc.returncode == 0, proc.stderr
    nine = "09-models_deepseek_v41_nvidia_flashinfer_sparse.py.diff"
    assert f"would update: {nine}" in proc.stdout
    assert f"/{nine}\n+++ " in proc.stdout and "\n++# dry edit\n" in proc.stdout
    assert proc.stdout.rstrip().endswith("dry run: nothing written")
    assert {p.name: p.read_bytes() for p in series.iterdir()} == before
    assert (package / PATCHED_FILE).read_bytes().endswith(b"# dry edit\n")  # no re-bake either


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


@pytest.mark.slow
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


BASE = b"".join(b"line %d\n" % i for i in range(40))
STEP1 = BASE.replace(b"line 5\n", b"five\n")
STEP2 = STEP1.replace(b"line 30\n", b"thirty\n")
OTHER = b"other\n" * 3


@pytest.fixture
def pristine(tmp_path) -> Path:
    root = tmp_path / "pristine"
    root.mkdir()
    (root / "a.py").write_bytes(BASE)
    (root / "b.py").write_bytes(OTHER)
    return root


def findings(tmp_path: Path, pristine: Path, patches: dict[str, bytes]) -> list[str]:
    return patches_out_of_date(load_series(series_folder(tmp_path / "series", patches)), pristine)


def test_up_to_date_series_has_no_finding(tmp_path, pristine):
    patches = {
        "01-a.diff": render_file_diff("a.py", BASE, STEP2),
        "02-b.diff": render_file_diff("b.py", OTHER, OTHER + b"more\n"),
    }
    assert findings(tmp_path, pristine, patches) == []


def test_out_of_order(tmp_path, pristine):
    patches = {  # 01 edits the line that 02 writes
        "01-late.diff": render_file_diff("a.py", STEP1, STEP1.replace(b"five\n", b"5\n")),
        "02-early.diff": render_file_diff("a.py", BASE, STEP1),
    }
    assert findings(tmp_path, pristine, patches) == [
        "01-late.diff: out of order: it applies only after a later patch"
    ]


def test_does_not_apply_even_with_fuzz(tmp_path, pristine):
    foreign = b"".join(b"foreign %d\n" % i for i in range(40))
    changed = foreign.replace(b"foreign 20\n", b"x\n")  # removes a line the base lacks
    patches = {"01-a.diff": render_file_diff("a.py", foreign, changed)}
    assert findings(tmp_path, pristine, patches) == ["01-a.diff: does not apply, even with fuzz 3"]


def test_already_upstream(tmp_path, pristine):
    (pristine / "a.py").write_bytes(STEP1)  # the base already carries the change
    patches = {"01-a.diff": render_file_diff("a.py", BASE, STEP1)}
    assert findings(tmp_path, pristine, patches) == [
        "01-a.diff: already in the base (upstream); remove it",
        "01-a.diff: stale: not byte-identical to what refresh writes",
    ]


def test_offset_is_not_clean(tmp_path, pristine):
    (pristine / "a.py").write_bytes(b"new 1\nnew 2\n" + BASE)
    patches = {"01-a.diff": render_file_diff("a.py", BASE, STEP1)}
    assert findings(tmp_path, pristine, patches) == [
        "01-a.diff: not clean: hunk #1 of a.py needs offset +2, fuzz 0",
        "01-a.diff: stale: not byte-identical to what refresh writes",
    ]


def test_fuzz_is_not_clean(tmp_path, pristine):
    (pristine / "a.py").write_bytes(BASE.replace(b"line 2\n", b"edited\n"))
    patches = {"01-a.diff": render_file_diff("a.py", BASE, STEP1)}
    assert findings(tmp_path, pristine, patches) == [
        "01-a.diff: not clean: hunk #1 of a.py needs offset +0, fuzz 1",
        "01-a.diff: stale: not byte-identical to what refresh writes",
    ]


def test_two_patches_touching_one_file(tmp_path, pristine):
    patches = {
        "01-a.diff": render_file_diff("a.py", BASE, STEP1),
        "02-a-again.diff": render_file_diff("a.py", STEP1, STEP2),
    }
    # Both apply cleanly; refresh writes one diff per file, so both are stale too.
    assert findings(tmp_path, pristine, patches) == [
        "02-a-again.diff: touches a.py, which 01-a.diff touches too",
        "01-a.diff: stale: not byte-identical to what refresh writes",
        "02-a-again.diff: stale: not byte-identical to what refresh writes",
    ]


def test_stale_header(tmp_path, pristine):
    canonical = render_file_diff("a.py", BASE, STEP1)
    stale = canonical.replace(b"a.py\n+++", b"a.py\t2026-09-10 20:13:20\n+++", 1)
    assert findings(tmp_path, pristine, {"01-a.diff": stale}) == [
        "01-a.diff: stale: not byte-identical to what refresh writes"
    ]


@pytest.fixture
def loop(tmp_path):
    return make_loop(tmp_path)


def test_refresh_after_refresh_no_bake_is_not_refused(loop, tmp_path):
    series, build, cli, _, _ = loop
    target = build / "baked" / "vllm" / "b.py"
    edit(target, PATCHED["b.py"].replace(b"12", b"13"))
    proc = cli("refresh", "--no-bake")
    assert proc.returncode == 0, proc.stderr
    assert "update: 02-b.py.diff" in proc.stdout
    assert target.read_bytes() == PATCHED["b.py"].replace(b"12", b"13")  # tree left as it is

    # What it recorded is what a real bake of the written series writes, byte for byte.
    other = tmp_path / "other-build"
    cache = {"BAKERY_CACHE": str(tmp_path / "cache")}
    args = ("bake", "--series", str(series), "--build", str(other))
    assert run_cli(*args, env=cache).returncode == 0
    recorded = (build / "baked" / "BAKED.json").read_bytes()
    assert recorded == (other / "baked" / "BAKED.json").read_bytes()
    assert json.loads(recorded)["series"]["sha256"] == load_series(series).sha256

    report = json.loads(cli("status", "--json").stdout)["bases"]["default"]
    assert (report["stale"], report["pending"]) == ([], [])  # not "unknown"

    edit(target, PATCHED["b.py"].replace(b"12", b"14"))
    proc = cli("refresh")
    assert proc.returncode == 0, proc.stderr
    assert b"+LIMIT = 14  # dcp" in (series / "02-b.py.diff").read_bytes()


def test_a_hand_edit_after_refresh_no_bake_is_still_refused(loop):
    series, build, cli, _, _ = loop
    edit(build / "baked" / "vllm" / "b.py", PATCHED["b.py"].replace(b"12", b"13"))
    assert cli("refresh", "--no-bake").returncode == 0
    patch = series / "01-a.py.diff"
    edited = patch.read_bytes().replace(b"* 2", b"* 3")
    patch.write_bytes(edited)
    proc = cli("refresh")
    assert proc.returncode == 1, proc.stdout
    assert "changed: 01-a.py.diff" in proc.stderr
    # The way out names this series and build folder, not the default patches/.
    assert f"`git checkout -- {series}`" in proc.stderr
    assert f"`bakery bake --base default --series {series} --build {build}`" in proc.stderr
    assert patch.read_bytes() == edited


def test_record_refuses_a_tree_the_series_does_not_reproduce(loop):
    series, build, _, _, _ = loop
    manifest = build / "baked" / "BAKED.json"
    before = manifest.read_bytes()
    edit(build / "baked" / "vllm" / "c.py", b"C = 1\nD = 5\nE = 3\n")  # not refreshed
    with pytest.raises(BakeryError, match=r"does not reproduce the tree \(a bug\): \['c.py'\]"):
        maintain_refresh.record(
            load_series(series), "default", build / "baked", build.parent / "cache"
        )
    assert manifest.read_bytes() == before


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("max_fuzz = 0", "max_fuzz = 1"),
        ("[policy]\n", '[renames]\n"gone/" = "elsewhere/"\n\n[policy]\n'),
    ],
    ids=["fuzz", "renames"],
)
def test_refresh_refuses_a_series_whose_apply_settings_alone_changed(tmp_path, old, new):
    series, build, cli, _, _ = make_loop(tmp_path)
    toml = series / "series.toml"
    edited = build / "baked" / "vllm" / "a.py"
    edited.write_bytes(edited.read_bytes() + b"# an edit refresh would pick up\n")
    assert cli("refresh", "--dry-run").returncode == 0  # the same series: refresh may go
    before = {p.name: p.read_bytes() for p in series.iterdir()}
    assert old in toml.read_text()
    toml.write_text(toml.read_text().replace(old, new, 1))
    proc = cli("refresh", "--yes")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "changed: the series' apply settings (renames, strip, fuzz)" in proc.stderr
    assert "error: the series changed after" in proc.stderr
    after = {p.name: p.read_bytes() for p in series.iterdir()}
    assert after == {**before, "series.toml": toml.read_bytes()}  # no patch rewritten


def secret(tmp_path: Path) -> Path:
    path = tmp_path / "secret.txt"
    path.write_bytes(b"TOP SECRET do not copy\n")
    return path


@pytest.mark.parametrize("where", ["new.py", "a.py"])
def test_refresh_never_reads_through_a_symlink_out_of_the_tree(loop, tmp_path, where):
    series, build, cli, _, _ = loop
    before = snapshot(series)
    link = build / "baked" / "vllm" / where
    link.unlink(missing_ok=True)  # a tracked file replaced by the symlink, or a new one
    link.symlink_to(secret(tmp_path))
    proc = cli("refresh", "--no-bake")
    assert proc.returncode == 2, proc.stderr
    assert f"'{where}': a symlink (refresh never reads through one)" in proc.stderr
    assert snapshot(series) == before
    assert not any(b"TOP SECRET" in data for data, _ in snapshot(series).values())


def test_a_symlinked_folder_in_the_tree_is_refused_too(loop, tmp_path):
    series, build, cli, _, _ = loop
    before = snapshot(series)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "x.py").write_bytes(b"SECRET = 1\n")
    (build / "baked" / "vllm" / "sub").symlink_to(outside)
    proc = cli("refresh", "--no-bake")
    assert proc.returncode == 2 and "'sub': a symlink" in proc.stderr, proc.stderr
    assert snapshot(series) == before


@pytest.mark.parametrize(
    "name, why",
    [
        ("tab\there.py", "a control character or a backslash"),
        ("new\nline.py", "a control character or a backslash"),
        ("back\\slash.py", "a control character or a backslash"),
    ],
)
def test_refresh_refuses_a_name_no_patch_can_carry(loop, name, why):
    series, build, cli, _, _ = loop
    before = snapshot(series)
    (build / "baked" / "vllm" / name).write_bytes(b"X = 1\n")
    proc = cli("refresh", "--no-bake")
    assert proc.returncode == 2 and why in proc.stderr, proc.stderr
    assert len(proc.stderr.splitlines()) == 2  # one error line (the name is escaped), a hint
    assert snapshot(series) == before


def test_refresh_refuses_a_tracked_file_turned_into_a_folder(loop):
    series, build, cli, _, _ = loop
    before = snapshot(series)
    target = build / "baked" / "vllm" / "b.py"
    target.unlink()
    target.mkdir()
    (target / "inner.py").write_bytes(b"Y = 2\n")
    proc = cli("refresh", "--no-bake")
    assert proc.returncode == 2 and "'b.py': a file of the base is a folder" in proc.stderr
    assert snapshot(series) == before


@pytest.mark.parametrize(
    "name, data",
    [
        ("ext.abi3.so", b"\x7fELF\x02\x01\x01\x00" + b"\x00" * 4000 + b"EDITED!"),
        ("a.py", b"x = 1\n" * 2000 + b"y = '\x00'\n"),  # the NUL past git's 8000 bytes
    ],
    ids=["so", "nul-past-8000-bytes"],
)
def test_a_binary_file_is_refused_at_once_never_diffed(loop, name, data):
    """Finding 18: a 7-byte edit to a .so became a 43 s diff (and a patch no tool applies)."""
    series, build, cli, _, _ = loop
    before = snapshot(series)
    (build / "baked" / "vllm" / name).write_bytes(data)
    proc = cli("refresh", "--no-bake")
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("error: ") and len(proc.stderr.splitlines()) == 2
    assert f"'{name}': a binary file (a NUL byte), which no text diff carries" in proc.stderr
    assert snapshot(series) == before


def test_a_fifo_in_the_tree_neither_hangs_nor_becomes_a_patch(loop):
    series, build, cli, _, _ = loop
    before = snapshot(series)
    os.mkfifo(build / "baked" / "vllm" / "pipe.py")
    proc = cli("refresh", "--no-bake")  # run_cli has no timeout: a hang fails the suite
    assert proc.returncode == 2 and "'pipe.py': not a regular file" in proc.stderr
    assert snapshot(series) == before


# The CLI in a child with a file size limit: the kernel refuses a write part-way (EFBIG),
# a real write fault wherever it falls, as a full disk would.
_UNDER_LIMIT = """
import resource, signal, sys
sys.dont_write_bytecode = True  # a .pyc cut at the limit would break later imports
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (16 * 1024, resource.RLIM_INFINITY))
from bakery.cli.root import main
sys.exit(main(sys.argv[1:]))
"""


def test_a_write_fault_mid_refresh_leaves_the_series_whole(loop, tmp_path):
    series, build, cli, _, _ = loop
    package = build / "baked" / "vllm"
    (package / "a.py").write_bytes(b"A = 3\n")  # an update, written first by the old code
    (package / "c.py").write_bytes(b"C = 1\nD = 2\nE = 3\n")  # 03 goes: a removal
    (package / "big.py").write_bytes(b"x = 1\n" * 8000)  # its new patch is over the limit
    before = snapshot(series)
    proc = subprocess.run(
        [sys.executable, "-c", _UNDER_LIMIT, "refresh", "--no-bake", "--yes",
         "--series", str(series), "--build", str(build)],
        capture_output=True, text=True, cwd=REPO,
        env={**os.environ, "BAKERY_CACHE": str(tmp_path / "cache")},
    )  # fmt: skip
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.startswith("error: File too large") and ": None" not in proc.stderr
    assert "Traceback" not in proc.stderr
    assert snapshot(series) == before  # no patch updated, none removed, none orphaned
    assert not [p.name for p in tmp_path.iterdir() if ".new-" in p.name]
    proc = cli("refresh", "--no-bake", "--yes")  # the retry works: nothing half-done
    assert proc.returncode == 0, proc.stderr
    assert (series / "04-big.py.diff").exists() and not (series / "03-c.py.diff").exists()


# refresh in a child that SIGKILLs itself at its argv[1]-th rename, unlink or exchange in
# bakery.tree: every step of the multi-file write, wherever it is.
_KILLED = """
import os, signal, sys
from bakery import tree
count = [0]
def counted(real):
    def wrapper(*args, **kwargs):
        count[0] += 1
        at = sys.argv[1]  # the n-th call, or the first whose target ends so
        if (count[0] == int(at)) if at.isdigit() else str(args[-1]).endswith(at):
            os.kill(os.getpid(), signal.SIGKILL)
        return real(*args, **kwargs)
    return wrapper
for name in ("replace", "rename", "unlink"):
    setattr(tree.os, name, counted(getattr(os, name)))
tree._exchange = counted(tree._exchange)
from bakery.cli.root import main
sys.exit(main(sys.argv[2:]))
"""


def test_a_refresh_killed_at_any_step_leaves_the_old_or_the_new_series(loop, tmp_path):
    series, build, cli, _, _ = loop
    package = build / "baked" / "vllm"
    (package / "a.py").write_bytes(b"A = 3\n")
    (package / "c.py").write_bytes(b"C = 1\nD = 2\nE = 3\n")
    (package / "new.py").write_bytes(b"N = 1\n")
    old = snapshot(series)
    # The record refresh --no-bake writes after the series: a kill may fall between them.
    records = [build / "baked" / "BAKED.json", build / ".baked.stamp.json"]
    old_records = {path: path.read_bytes() for path in records}
    old_sha = json.loads(old_records[records[0]])["series"]["sha256"]
    seen = set()
    for step in range(1, 40):
        proc = subprocess.run(
            [sys.executable, "-c", _KILLED, str(step), "refresh", "--no-bake", "--yes",
             "--series", str(series), "--build", str(build)],
            capture_output=True, text=True, cwd=REPO,
            env={**os.environ, "BAKERY_CACHE": str(tmp_path / "cache")},
        )  # fmt: skip
        now = snapshot(series)
        if proc.returncode == 0:
            break
        assert proc.returncode == -signal.SIGKILL, proc.stderr
        assert now == old or sorted(p.name for p in series.iterdir()) == [
            "01-a.py.diff",
            "02-b.py.diff",
            "04-new.py.diff",
            "series.toml",
        ], f"step {step}: a half-written series: {sorted(p.name for p in series.iterdir())}"
        seen.add(now == old)
        recorded = json.loads(records[0].read_bytes())["series"]["sha256"]
        assert recorded == old_sha or now != old, f"step {step}: recorded a series not on disk"
        if now != old:  # the new series is whole: put the old one and its record back
            for path in series.iterdir():
                path.unlink()
            for name, (data, _) in old.items():
                Path(name).write_bytes(data)
            for path, data in old_records.items():
                path.write_bytes(data)
    else:
        raise AssertionError("refresh never finished")
    assert seen == {True, False}, seen  # kills fell on both sides of the exchange
    assert cli("refresh", "--check").returncode in (0, 1)  # the series reads back
    assert not [p.name for p in series.iterdir() if p.name.startswith(".")]
    proc = cli("refresh", "--no-bake", "--yes")  # a later run sweeps the killed clones
    assert not [p.name for p in tmp_path.iterdir() if ".new-" in p.name], proc.stderr


def test_a_refresh_killed_between_its_record_and_its_stamp_refreshes_again(loop, tmp_path):
    # CI found this kill point by chance (the loop above now restores the record too).
    series, build, cli, _, _ = loop
    (build / "baked" / "vllm" / "a.py").write_bytes(b"A = 3\n")
    proc = subprocess.run(
        [sys.executable, "-c", _KILLED, ".baked.stamp.json", "refresh", "--no-bake", "--yes",
         "--series", str(series), "--build", str(build)],
        capture_output=True, text=True, cwd=REPO,
        env={**os.environ, "BAKERY_CACHE": str(tmp_path / "cache")},
    )  # fmt: skip
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    recorded = json.loads((build / "baked" / "BAKED.json").read_bytes())["series"]["sha256"]
    assert recorded == load_series(series).sha256  # the record names the series on disk
    assert b"+A = 3" in (series / "01-a.py.diff").read_bytes()
    proc = cli("refresh", "--no-bake", "--yes")
    assert proc.returncode == 0, proc.stderr
    assert cli("refresh", "--check").returncode == 0
    # The killed write's temp file is named for its pid: the next bake sweeps it.
    assert [p.name for p in build.iterdir() if p.name.startswith("..baked.stamp.json.")]
    assert cli("bake").returncode == 0
    assert not [p.name for p in build.iterdir() if p.name.startswith("..baked.stamp.json.")]
