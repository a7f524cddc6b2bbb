"""Small edges a new user hit (issue 24, item 9): `--base` names the bases, the hunk
hint names what bake has, refresh's dry-run diff is labelled as the patch file and its
new `[[patches]]` table is spaced, `bakery stages` reads in a terminal. Synthetic
series (tests/_synthetic_release.py) and the repo's stage table; fast."""

import re
import tomllib

from tests._synthetic_release import make_loop
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
