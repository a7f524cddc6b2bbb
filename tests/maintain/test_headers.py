"""Per-patch headers (issue 24): description, author and upstream status in series.toml
beside each patch's stage and summary; shown by `status`, kept by `refresh` and by the
rebase loop, refused when malformed. Synthetic series (tests/_synthetic_release.py)."""

import json
import tomllib

from tests._synthetic_release import make_loop

HEADER = (
    'description = """\nRaise the limit for DCP.\n\nWhy: two ranks share the budget.\n"""\n'
    'author = "A. Maintainer <a@example.org>"\n'
    'upstream = "not submitted"\n'
)


def with_header(series, patch="02-b.py.diff"):
    text = (series / "series.toml").read_text()
    anchor = f'file = "{patch}"\n'
    (series / "series.toml").write_text(text.replace(anchor, anchor + HEADER))


def header_of(series, patch="02-b.py.diff") -> dict:
    tables = tomllib.loads((series / "series.toml").read_text())["patches"]
    table = next(t for t in tables if t["file"] == patch)
    return {k: table.get(k) for k in ("description", "author", "upstream")}


EXPECTED = {
    "description": "Raise the limit for DCP.\n\nWhy: two ranks share the budget.\n",
    "author": "A. Maintainer <a@example.org>",
    "upstream": "not submitted",
}


def test_status_shows_the_header_and_json_has_all_of_it(tmp_path):
    series, _, cli, _, _ = make_loop(tmp_path)
    with_header(series)
    out = cli("status").stdout
    assert (
        "  02-b.py.diff (stage 3; upstream not submitted; author A. Maintainer "
        "<a@example.org>): patch 2\n"
    ) in out
    assert "  01-a.py.diff (stage 2): patch 1\n" in out
    rows = json.loads(cli("status", "--json").stdout)["patches"]
    assert rows[1] == {"file": "02-b.py.diff", "stage": 3, "summary": "patch 2", **EXPECTED}
    assert rows[0] == {"file": "01-a.py.diff", "stage": 2, "summary": "patch 1"}


def test_refresh_keeps_the_header(tmp_path):
    series, build, cli, _, _ = make_loop(tmp_path)
    with_header(series)
    (build / "baked" / "vllm" / "b.py").write_text("B = 1\nLIMIT = 14  # dcp\nNAME = 'b'\n")
    proc = cli("refresh")
    assert proc.returncode == 0 and "update: 02-b.py.diff" in proc.stdout, proc.stderr
    assert header_of(series) == EXPECTED


def test_the_rebase_loop_keeps_the_header(tmp_path):
    series, build, cli, _, _ = make_loop(tmp_path)
    with_header(series)
    assert cli("rebase", "--to", "vllm==0.2.0", "--checkout").returncode == 1
    (build / "baked" / "vllm" / "b.py").write_text("B = 1\nLIMIT = 24  # dcp\nNAME = 'b'\n")
    proc = cli("rebase", "--continue")
    assert proc.returncode == 0, proc.stderr
    assert "update: 02-b.py.diff" in proc.stdout
    assert header_of(series) == EXPECTED


def test_a_header_that_is_not_one_line_is_refused(tmp_path):
    series, _, cli, _, _ = make_loop(tmp_path)
    text = (series / "series.toml").read_text()
    anchor = 'file = "01-a.py.diff"\n'
    (series / "series.toml").write_text(text.replace(anchor, anchor + 'author = "a\\nb"\n'))
    proc = cli("status")
    assert proc.returncode == 2
    assert "$.patches[0].author: must be one line, not 'a\\nb'" in proc.stderr


def test_a_patch_removed_then_made_again_gets_its_committed_header_back(tmp_path):
    import subprocess

    series, build, cli, _, _ = make_loop(tmp_path)
    with_header(series)
    git = ["git", "-C", str(series), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-qm", "series"], check=True)
    tree_b = build / "baked" / "vllm" / "b.py"
    tree_b.write_text("B = 1\nLIMIT = 10\nNAME = 'b'\n")  # as the base has it
    assert "remove: 02-b.py.diff" in cli("refresh", "--yes").stdout
    assert "02-b.py.diff" not in (series / "series.toml").read_text()
    tree_b.write_text("B = 1\nLIMIT = 16  # dcp\nNAME = 'b'\n")
    proc = cli("refresh", "--at", "2")
    assert proc.returncode == 0 and "add: 02-b.py.diff" in proc.stdout, proc.stderr
    assert header_of(series) == EXPECTED
