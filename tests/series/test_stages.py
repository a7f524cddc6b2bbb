"""stages.toml is the source of the DCP stage table; PLAN.md and series.toml agree."""

import ast
import shutil
import tomllib
from pathlib import Path

from bakery import project
from bakery.cli.root import main
from bakery.series.series import load_series
from bakery.series.stages import load_stages, plan_table, render_table, stage_table_problems

ROOT = Path(__file__).resolve().parents[2] / project.SERIES


def test_plan_table_is_generated_from_stages_toml():
    plan = (ROOT / "PLAN.md").read_text()
    assert plan_table(plan) == render_table(load_stages(ROOT))


def test_stages_one_to_nine_and_each_named_patch_is_in_the_series():
    stages = load_stages(ROOT)
    assert [s.number for s in stages] == list(range(1, 10))
    in_series = {e.file for e in load_series(ROOT).entries}
    for s in stages:
        assert set(s.patches) <= in_series, (s.number, set(s.patches) - in_series)
    env = tomllib.loads((ROOT / "stages.toml").read_text())["env"]
    for name, table in env.items():
        assert set(table["read_by"]) <= in_series, name


def test_the_launcher_and_patch_02_serve_the_same_draft_methods():
    """stages.toml's [gates] spec_methods (the launcher's) and patch 02's own tuple (the
    layer build's), read from the patch's added line with ast, not by the series' reader."""
    added = [
        line[1:]
        for line in (ROOT / "02-models_deepseek_v41_attention.py.diff").read_text().splitlines()
        if line.startswith("+_DSV41_DCP_SPEC_METHODS = ")
    ]
    assert len(added) == 1, added
    in_patch = ast.literal_eval(ast.parse(added[0]).body[0].value)
    gates = tomllib.loads((ROOT / "stages.toml").read_text())["gates"]
    assert tuple(gates["spec_methods"]) == in_patch == ("dspark",)


def test_consistent():
    assert stage_table_problems(ROOT) == []


def test_check_reports_a_stale_table_and_an_unknown_patch(tmp_path):
    copy = tmp_path / "dcp2"
    shutil.copytree(ROOT, copy)
    plan = copy / "PLAN.md"
    plan.write_text(plan.read_text().replace("| 9 | prefill-gather |", "| 9 | gather |"))
    toml = copy / "stages.toml"
    toml.write_text(
        toml.read_text().replace(
            'patches = ["02-models_deepseek_v41_attention.py.diff"]',
            'patches = ["02-models_deepseek_v41_attention.py.diff", "07-missing.diff"]',
        )
    )
    problems = stage_table_problems(copy)
    assert any("PLAN.md: stage table differs" in p for p in problems)
    assert any("'07-missing.diff'" in p for p in problems)


def test_the_stages_command_fails_on_a_stale_table_and_write_renders_it(tmp_path, capsys):
    copy = tmp_path / "dcp2"
    shutil.copytree(ROOT, copy)
    plan = copy / "PLAN.md"
    fresh = plan.read_text()
    plan.write_text(fresh.replace("| 9 | prefill-gather |", "| 9 | gather |"))
    assert main(["stages", "--series", str(copy)]) == 1
    err = capsys.readouterr().err
    assert "PLAN.md: stage table differs" in err and "hint: edit stages.toml" in err
    assert main(["stages", "--series", str(copy), "--write"]) == 0
    assert plan.read_text() == fresh  # the table rendered back, the prose untouched
