"""Hostile input at the command line (issue 35): each is one ``error:`` line, a hint and
exit 2, never a traceback. Synthetic series (tests/_synthetic_release.py) and small diffs
written here; git is run by the tests themselves to commit what the series reads back."""

from __future__ import annotations

import subprocess

import pytest

from bakery.series.diff import render_file_diff
from tests._synthetic_release import make_loop
from tests.conftest import run_cli

GIT_ID = ["-c", "user.name=t", "-c", "user.email=t@t"]


def refused(proc, start: str) -> None:
    """Exit 2, and stderr is one error line starting with ``start`` plus one hint."""
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert proc.stderr.startswith(f"error: {start}"), proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 2 and lines[1].startswith("hint: "), proc.stderr


def commit(folder, message="series") -> None:
    git = ["git", "-C", str(folder), *GIT_ID]
    if not (folder / ".git").exists():
        subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-qm", message], check=True)


@pytest.mark.parametrize("number", ["²", "٣", "9" * 5000], ids=["superscript", "arabic", "long"])
def test_upto_and_good_read_only_ascii_patch_numbers(tmp_path, number):
    """'²' and '٣' are str.isdigit() but no patch number (int('²') raises); 5000 digits
    are past what int() reads (before: a ValueError traceback from each)."""
    series, build, cli, _, _ = make_loop(tmp_path)
    refused(cli("bake", "--upto", number), "not a patch of series t")
    args = ["--series", str(series), "--build", str(build), "--good", number, "--", "true"]
    refused(run_cli("bisect", *args), "not a patch of series t")


def hunk_diff(tmp_path, header: bytes, extended: bytes = b"") -> list[str]:
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "a.txt").write_bytes(b"one\n")
    body = render_file_diff("a.txt", b"one\n", b"one\ntwo\n").split(b"\n", 2)[2]
    head = b"diff --git a/a.txt b/a.txt\n" + extended + b"--- a/a.txt\n+++ b/a.txt\n"
    patch = tmp_path / "01-a.diff"
    patch.write_bytes(head + body.replace(b"@@ -1 +1,2 @@", header, 1))
    assert b"@@ -1 +1,2 @@" in body
    return [str(tree), str(patch)]


def test_a_hunk_header_number_past_what_int_reads(tmp_path):
    """A line number of 5000 digits (int() refuses past 4300): refused as too large."""
    args = hunk_diff(tmp_path, b"@@ -" + b"9" * 5000 + b" +1,2 @@")
    refused(run_cli("apply", *args), "01-a.diff: hunk #1 of 'a.txt': line number is too large")


def test_a_git_mode_that_is_not_octal(tmp_path):
    """``new mode 100689`` (8 and 9 are no octal digits): refused, never int(.., 8)."""
    args = hunk_diff(tmp_path, b"@@ -1 +1,2 @@", b"old mode 100644\nnew mode 100689\n")
    refused(run_cli("apply", *args), "01-a.diff: a git file mode is not octal")


def exported(tmp_path):
    """The synthetic series exported to a git repository: (series, build, cli, repo)."""
    series, build, cli, _, _ = make_loop(tmp_path)
    repo = tmp_path / "git"
    env = {"BAKERY_CACHE": str(tmp_path / "cache")}
    out = run_cli("export", "--git", str(repo), "--series", str(series), env=env)
    assert out.returncode == 0, out.stderr
    return series, build, cli, repo


def test_import_of_a_file_name_that_is_not_utf8(tmp_path):
    """A commit adding vllm/<0xff>.py: no patch can be named for it (before: a traceback)."""
    series, _, cli, repo = exported(tmp_path)
    before = {p.name: p.read_bytes() for p in series.iterdir()}
    (repo / "vllm" / "x.py").write_text("X = 1\n")
    (repo / "vllm" / "x.py").rename(repo / "vllm" / b"\xff.py".decode("utf-8", "surrogateescape"))
    commit(repo, "a file named in latin-1")
    proc = run_cli(
        "import", "--git", str(repo), "--series", str(series),
        env={"BAKERY_CACHE": str(tmp_path / "cache")},
    )  # fmt: skip
    refused(proc, "HEAD changes a file whose name is not UTF-8")
    assert {p.name: p.read_bytes() for p in series.iterdir()} == before


def committed_series(tmp_path, edit):
    """Patch 02 removed by refresh (its change undone in the baked tree), then series.toml
    committed with 02's table as ``edit`` makes it and the change made again: refresh
    re-creates 02 and takes its header from git HEAD."""
    series, build, cli, _, _ = make_loop(tmp_path)
    good = (series / "series.toml").read_text()
    tree_b = build / "baked" / "vllm" / "b.py"
    patched = tree_b.read_bytes()
    tree_b.write_text("B = 1\nLIMIT = 10\nNAME = 'b'\n")  # as the base has it
    assert "remove: 02-b.py.diff" in cli("refresh", "--yes").stdout
    without = (series / "series.toml").read_text()
    (series / "series.toml").write_text(edit(good))
    commit(series)
    (series / "series.toml").write_text(without)
    tree_b.unlink()  # a hard link to the build folder's pristine copy now
    tree_b.write_bytes(patched)
    return series, cli


def test_refresh_refuses_a_committed_series_toml_with_a_duplicate_key(tmp_path):
    """tomlkit raises KeyAlreadyPresent (no ParseError) on a key given twice in a table
    (before: a traceback from refresh and import)."""
    twice = 'file = "02-b.py.diff"\nsummary = "one"\nsummary = "two"\n'
    series, cli = committed_series(
        tmp_path, lambda text: text.replace('file = "02-b.py.diff"\n', twice)
    )
    before = (series / "series.toml").read_bytes()
    refused(cli("refresh", "--at", "2"), f"{series / 'series.toml'} at git HEAD: not valid TOML")
    assert (series / "series.toml").read_bytes() == before
    # import reads the same committed headers
    env = {"BAKERY_CACHE": str(tmp_path / "cache")}
    repo, where = tmp_path / "git", ["--series", str(series)]
    assert run_cli("export", "--git", str(repo), *where, env=env).returncode == 0
    (repo / "vllm" / "b.py").write_text("B = 1\nLIMIT = 14\nNAME = 'b'\n")
    commit(repo, "b.py again")
    proc = run_cli("import", "--git", str(repo), *where, env=env)
    refused(proc, f"{series / 'series.toml'} at git HEAD: not valid TOML")
    assert (series / "series.toml").read_bytes() == before


def test_refresh_refuses_a_committed_header_it_would_write_back(tmp_path):
    """A committed ``stage = 99`` is refused where it is read: refresh wrote it back
    unchecked, and every command after it exited 2 (finding 7)."""
    series, cli = committed_series(tmp_path, lambda text: text.replace("stage = 3", "stage = 99"))
    before = (series / "series.toml").read_bytes()
    proc = cli("refresh", "--at", "2")
    refused(proc, f"{series / 'series.toml'} at git HEAD: $.patches[1].stage: ")
    assert (series / "series.toml").read_bytes() == before
    assert cli("status").returncode == 0
