"""Bake up to patch N (quilt's push N) and `bakery bisect` (git bisect run) on the
synthetic series (tests/_synthetic_release.py): 01 adds a2() to a.py, 02 changes b.py's
LIMIT, 03 changes c.py's D. What a step baked is read from the tree's files directly."""

import os
import sys

from tests._synthetic_release import OLD, PATCHED, make_loop
from tests.conftest import run_cli


def bisect(tmp_path, *command):
    """`bakery bisect` with the loop's series, build and cache before the `--`."""
    where = ["--series", str(tmp_path / "series"), "--build", str(tmp_path / "build")]
    env = {"BAKERY_CACHE": str(tmp_path / "cache")}
    return run_cli("bisect", *where, "--", *command, env=env)


def test_bake_upto_bakes_the_first_patches_only_and_no_wheel(tmp_path):
    series, build, cli, _, _ = make_loop(tmp_path)
    package = build / "baked" / "vllm"
    wheels = sorted(os.listdir(build / "dist"))
    proc = cli("bake", "--upto", "02")
    assert proc.returncode == 0, proc.stderr
    assert "with 2 of 3 patch(es) (up to 02-b.py.diff); no wheel" in proc.stdout
    assert (package / "a.py").read_bytes() == PATCHED["a.py"]
    assert (package / "b.py").read_bytes() == PATCHED["b.py"]
    assert (package / "c.py").read_bytes() == OLD["c.py"]  # 03 not applied
    assert sorted(os.listdir(build / "dist")) == wheels  # the real wheel stays
    status = cli("status").stdout
    assert "a bisect bake up to 02-b.py.diff" in status
    assert cli("bake", "--check").returncode == 1  # not the series' bake
    refused = cli("refresh")  # a refresh would drop 03: refused
    assert refused.returncode == 1 and "added: 03-c.py.diff" in refused.stderr
    assert cli("bake", "--upto", "0").returncode == 0
    assert all((package / f).read_bytes() == OLD[f] for f in OLD)
    assert cli("bake", "--upto", "03-c.py.diff").returncode == 0  # all three: the series' tree
    assert cli("bake", "--check").returncode == 0
    bad = cli("bake", "--upto", "7")
    assert bad.returncode == 2 and "not a patch of series t" in bad.stderr


def test_bisect_finds_the_first_bad_patch_and_bakes_the_series_again(tmp_path):
    series, build, cli, _, _ = make_loop(tmp_path)
    tree_b = build / "baked" / "vllm" / "b.py"
    # "The test": fails once b.py carries the dcp limit (patch 02).
    check = f"import sys; sys.exit('# dcp' in open({str(tree_b)!r}).read())"
    proc = bisect(tmp_path, sys.executable, "-c", check)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "first bad patch: 02-b.py.diff (stage 3): patch 2" in proc.stdout
    steps = [line for line in proc.stdout.splitlines() if line.startswith("bisect: ")]
    assert steps[0] == "bisect: 3 of 3 patch(es) (up to 03-c.py.diff): bad (exit 1)"
    assert steps[1] == "bisect: 0 of 3 patch(es) (up to none): good"
    assert cli("bake", "--check").returncode == 0  # the whole series, wheel and all


def test_bisect_says_when_there_is_nothing_to_find(tmp_path):
    _, _, cli, _, _ = make_loop(tmp_path)
    passing = bisect(tmp_path, sys.executable, "-c", "pass")
    assert passing.returncode == 1 and "passes on the whole series" in passing.stderr
    failing = bisect(tmp_path, sys.executable, "-c", "raise SystemExit(3)")
    assert failing.returncode == 1
    assert "error: COMMAND fails with 0 patch(es) too (--good 0)" in failing.stderr
    assert cli("bake", "--check").returncode == 0


def test_commands_that_replace_the_tree_keep_pending_edits(tmp_path):
    """An edit in build/baked that `status` lists as pending: `bake --upto`, `bisect` and a
    plain `bake` refuse to drop it (exit 2, naming the file) unless --discard-edits
    (before: each silently replaced the tree and the edit was gone)."""
    series, build, cli, _, _ = make_loop(tmp_path)
    edited = build / "baked" / "vllm" / "c.py"
    edited.write_bytes(PATCHED["c.py"] + b"MINE = 1\n")
    assert "pending: update 03-c.py.diff" in cli("status").stdout
    refusals = [
        cli("bake", "--upto", "02"),
        bisect(tmp_path, sys.executable, "-c", "raise SystemExit(1)"),
        cli("bake"),
    ]
    for proc in refusals:
        assert proc.returncode == 2, (proc.args, proc.stdout, proc.stderr)
        assert "holds 1 edit(s) since its bake that this would drop: vllm/c.py" in proc.stderr
        assert proc.stderr.count("\n") == 2 and "\nhint: " in proc.stderr
        assert edited.read_bytes().endswith(b"MINE = 1\n")
    # An edit of an untouched file and a new file count too, also in a bisect bake's tree.
    assert cli("bake", "--upto", "02", "--discard-edits").returncode == 0
    assert edited.read_bytes() == OLD["c.py"]
    (build / "baked" / "vllm" / "__init__.py").write_text("X = 1\n")
    (build / "baked" / "vllm" / "new.py").write_text("N = 1\n")
    proc = cli("bake")
    assert proc.returncode == 2 and "vllm/__init__.py, vllm/new.py" in proc.stderr
    assert cli("bake", "--discard-edits").returncode == 0
    assert cli("bake", "--check").returncode == 0
    # Bytecode a run left in the tree is no edit.
    (build / "baked" / "vllm" / "__pycache__").mkdir()
    (build / "baked" / "vllm" / "__pycache__" / "a.cpython-312.pyc").write_bytes(b"\0")
    assert cli("bake").returncode == 0


def test_a_tree_whose_baked_json_is_gone_is_not_replaced_with_its_edits(tmp_path):
    """build/baked holding an edit, its BAKED.json removed (or a symlink, never read):
    `bake`, `bake --upto` and `bisect` refuse (exit 2) and the edit stays, as for a tree
    whose BAKED.json names the edit; --discard-edits replaces it (before: nothing told
    the edit from the bake, the tree was swapped out and the edit was gone)."""
    series, build, cli, _, _ = make_loop(tmp_path)
    tree = build / "baked"
    edited = tree / "vllm" / "c.py"
    edited.write_bytes(PATCHED["c.py"] + b"MINE = 1\n")
    record = tree / "BAKED.json"
    kept = tmp_path / "BAKED.json"
    record.rename(kept)
    for link in (False, True):
        if link:
            record.symlink_to(kept)
        refusals = [
            cli("bake"),
            cli("bake", "--upto", "02"),
            bisect(tmp_path, sys.executable, "-c", "raise SystemExit(1)"),
        ]
        for proc in refusals:
            assert proc.returncode == 2, (proc.args, proc.stdout, proc.stderr)
            assert "holds files but no BAKED.json of its bake" in proc.stderr
            assert proc.stderr.count("\n") == 2 and "\nhint: " in proc.stderr
            assert edited.read_bytes().endswith(b"MINE = 1\n")
    assert cli("bake", "--discard-edits").returncode == 0
    assert edited.read_bytes() == PATCHED["c.py"] and not record.is_symlink()
    assert cli("bake", "--check").returncode == 0


def test_bake_never_writes_through_a_symlinked_dist(tmp_path):
    """build/dist a symlink to another folder: bake refuses (exit 2) and that folder is
    untouched (before: the wheel was written there and its older wheels were moved out)."""
    series, build, cli, _, _ = make_loop(tmp_path)
    dist = build / "dist"
    theirs = tmp_path / "theirs"
    dist.rename(theirs)
    dist.symlink_to(theirs)
    before = {p.name: p.read_bytes() for p in theirs.iterdir()}
    (series / "03-c.py.diff").write_bytes((series / "03-c.py.diff").read_bytes())
    toml = series / "series.toml"
    toml.write_text(toml.read_text().replace('summary = "patch 3"', 'summary = "patch 3."'))
    text = (series / "03-c.py.diff").read_text().replace("D = 4", "D = 5")
    (series / "03-c.py.diff").write_text(text)  # a new series: a new wheel name
    proc = cli("bake")
    assert proc.returncode == 2 and "symlink" in proc.stderr, proc.stderr
    assert {p.name: p.read_bytes() for p in theirs.iterdir()} == before
    assert dist.is_symlink()


def test_status_and_clean_after_a_bisect_bake_keep_the_real_wheel(tmp_path):
    """After `bake --upto`, status names the wheel the last whole bake wrote (not the one
    the partial series would have) and no "older" wheel, and clean keeps it (before:
    status called the real wheel older and clean removed it)."""
    series, build, cli, _, _ = make_loop(tmp_path)
    (wheel,) = sorted((build / "dist").glob("*.whl"))
    assert cli("bake", "--upto", "02").returncode == 0
    status = cli("status").stdout
    assert f"  wheel: {wheel} (the last whole bake's; a bisect bake writes none)" in status
    assert "older wheel" not in status
    proc = cli("clean")
    assert proc.returncode == 0, proc.stderr
    assert wheel.is_file() and str(wheel) not in proc.stdout
