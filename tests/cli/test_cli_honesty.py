"""Small promises of the CLI (issue 11): "-" is stdout, a dry run says "would", a
missing bake is a clear error, a missing release is a matrix row, --strict fails CI."""

import json
import shutil

from bakery.series.diff import render_file_diff
from tests._synthetic_release import make_loop
from tests._verify_support import MTP, NOMTP, require_fixtures
from tests.conftest import REPO, run_cli

HERE = {"PYTHONPATH": str(REPO)}
OFFLINE = {"PIP_NO_INDEX": "1", "PIP_CONFIG_FILE": "/dev/null", "PIP_FIND_LINKS": ""}


def test_apply_dry_run_says_would_apply(tmp_path):
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "a.txt").write_bytes(b"one\n")
    patch = tmp_path / "01-a.diff"
    patch.write_bytes(render_file_diff("a.txt", b"one\n", b"one\ntwo\n"))
    proc = run_cli("apply", "--dry-run", str(tree), str(patch))
    assert proc.returncode == 0, proc.stderr
    assert "01-a.diff: would apply" in proc.stdout and ": applied" not in proc.stdout
    assert (tree / "a.txt").read_bytes() == b"one\n"


def test_verify_compare_json_dash_is_stdout(tmp_path):
    require_fixtures()
    proc = run_cli("verify", "compare", str(NOMTP), str(MTP), "--json", "-", cwd=tmp_path, env=HERE)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)  # nothing but the report on stdout
    assert report["passed"] is True and "parity passed" in proc.stderr
    assert not (tmp_path / "-").exists()


def test_importcheck_with_nothing_baked_is_one_error_and_a_hint(tmp_path):
    shutil.copytree(REPO / "patches" / "dcp2", tmp_path / "patches" / "dcp2")
    proc = run_cli("importcheck", "--base", "cpu", cwd=tmp_path, env=HERE)
    assert proc.returncode == 1
    assert proc.stderr.splitlines() == [
        "error: no baked tree to import from: 'build/baked-cpu'",
        "hint: run `bakery bake --base cpu` first, or pass `bakery importcheck --tree DIR`",
    ]
    help_text = " ".join(run_cli("importcheck", "--help").stdout.split())
    assert "build/baked for --base default, build/baked-cpu for --base cpu" in help_text


def test_matrix_missing_release_is_a_row_and_strict_fails(tmp_path):
    series = make_loop(tmp_path)[0]
    out = tmp_path / "matrix"
    env = {**OFFLINE, "BAKERY_CACHE": str(tmp_path / "cache")}  # 0.9.9 was never released
    args = [
        "matrix",
        "--series",
        str(series),
        "--releases",
        "0.1.1,0.9.9",
        "--no-linkcheck",
        "--out",
        str(out),
    ]
    proc = run_cli(*args, env=env)
    assert proc.returncode == 0, proc.stderr
    rows = {line.split(" | ")[0].strip("| "): line for line in proc.stdout.splitlines()}
    assert rows["02-b.py.diff"].endswith("| clean | missing |")
    assert rows["linkcheck"].endswith("| skipped | no release |")
    assert "warning: 0.9.9: pip could not download" in proc.stderr
    table = json.loads((out / "matrix.json").read_text())
    assert table["releases"]["0.9.9"]["error"] and table["releases"]["0.1.1"]["sha256"]
    strict = run_cli(*args, "--strict", env=env)
    assert strict.returncode == 1 and "0.9.9: release missing" in strict.stderr
    clean = [a if a != "0.1.1,0.9.9" else "0.1.1" for a in args]
    assert run_cli(*clean, "--strict", env=env).returncode == 0
    failing = [a if a != "0.1.1,0.9.9" else "0.2.0" for a in args]
    proc = run_cli(*failing, "--strict", env=env)
    assert proc.returncode == 1 and "0.2.0: 02-b.py.diff fails" in proc.stderr
