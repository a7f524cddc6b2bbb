"""Small edges a new user hit (issue 24, item 9): `--base` names the bases, the hunk
hint names what bake has, refresh's dry-run diff is labelled as the patch file and its
new `[[patches]]` table is spaced, `bakery stages` reads in a terminal. Synthetic
series (tests/_synthetic_release.py) and the repo's stage table; fast.

Small promises of the CLI (issue 11): "-" is stdout, a dry run says "would", a
missing bake is a clear error, a missing release is a matrix row, --strict fails CI.
"""

from __future__ import annotations

import json
import re
import shutil
import tomllib

from bakery.series.diff import render_file_diff
from tests._synthetic_release import make_loop
from tests._verify_support import MTP, NOMTP, require_fixtures
from tests.conftest import REPO, run_cli


def test_an_unknown_base_names_the_known_ones(tmp_path):
    _, _, cli, _, _ = make_loop(tmp_path)
    for command in (["bake"], ["bake", "--check"], ["refresh", "--check"]):
        proc = cli(*command, "--base", "foo")
        assert proc.returncode == 2, proc.stderr
        assert "error: unknown base (known: cpu, default): 'foo'" in proc.stderr
        assert "hint: pass one of them as `--base KEY` (the [bases.KEY] tables of " in proc.stderr


def test_a_failed_hunk_in_bake_hints_at_the_series_fuzz_policy(tmp_path):
    series, _, cli, _, _ = make_loop(tmp_path)
    patch = series / "02-b.py.diff"
    patch.write_text(patch.read_text().replace(" NAME = 'b'", " NAME = 'x'"))
    proc = cli("bake")
    assert proc.returncode == 1, proc.stderr
    assert "02-b.py.diff: hunk #1 does not apply" in proc.stderr
    hint = next(line for line in proc.stderr.splitlines() if line.startswith("hint: "))
    assert "--fuzz" not in hint and "`max_fuzz` under [policy]" in hint


def test_refresh_dry_run_labels_the_patch_file_and_new_tables_are_spaced(tmp_path):
    series, build, cli, _, _ = make_loop(tmp_path)
    with open(build / "baked" / "vllm" / "a.py", "a") as handle:
        handle.write("A3 = 3\n")
    proc = cli("refresh", "--dry-run")
    assert proc.returncode == 0, proc.stderr
    assert f"--- {series / '01-a.py.diff'}\n+++ {series / '01-a.py.diff'}\n" in proc.stdout
    # The patch's own lines keep the series' labels, one level down in the diff.
    assert " --- baked-ours/a.py\n" in proc.stdout
    assert not re.search(r"^(---|\+\+\+) baked", proc.stdout, re.M)

    (build / "baked" / "vllm" / "new.py").write_text("N = 1\n")
    assert cli("refresh").returncode == 0
    text = (series / "series.toml").read_text()
    tables = text.count("[[patches]]")
    assert tables == 4 and text.count("\n\n[[patches]]\n") == tables, text
    assert tomllib.loads(text)["patches"][-1]["file"] == "04-new.py.diff"


def test_stages_prints_a_terminal_form_and_the_markdown_on_request():
    proc = run_cli("stages")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == "stage 1: dcp-state (implemented)"
    assert max(len(line) for line in lines) <= 100
    assert "|" not in proc.stdout.replace("ag_rs|a2a", "").replace("0|1", "")
    stages = tomllib.loads((REPO / "patches" / "dcp2" / "stages.toml").read_text())["stages"]
    heads = [line for line in lines if line.startswith("stage ")]
    assert heads == [f"stage {s['number']}: {s['name']} ({s['status']})" for s in stages]
    markdown = run_cli("stages", "--markdown")
    plan = (REPO / "patches" / "dcp2" / "PLAN.md").read_text()
    assert markdown.returncode == 0 and markdown.stdout.strip() in plan


def test_refresh_names_the_patches_it_would_remove_without_a_list_repr(tmp_path):
    series, build, cli, _, _ = make_loop(tmp_path)
    (build / "baked" / "vllm" / "b.py").write_text("B = 1\nLIMIT = 10\nNAME = 'b'\n")
    proc = cli("refresh")
    assert proc.returncode == 2
    assert "error: would remove 1 patch(es) (pass --yes): 02-b.py.diff\n" in proc.stderr
    assert (series / "02-b.py.diff").is_file()


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
