"""Issue 22: paths read back from our own files and folders (state.json, the lock, the
trash) are confined, never followed; the rebase loop owns its series (findings 1, 2, 4, 6)."""

import json
import os
import shutil
from pathlib import Path

import pytest

from tests._synthetic_release import make_loop
from tests.conftest import run_cli
from tests.maintain.test_rebase_loop import snapshot

FIXED = b"B = 1\nLIMIT = 24  # dcp: twice upstream's\nNAME = 'b'\n"


@pytest.fixture
def loop(tmp_path):
    return make_loop(tmp_path)


def edit_state(build: Path, **values) -> None:
    path = build / ".rebase" / "state.json"
    state = json.loads(path.read_text())
    state.update(values)
    path.write_text(json.dumps(state))


def victim_folder(tmp_path: Path) -> tuple[Path, dict]:
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "precious.txt").write_bytes(b"mine\n")
    (victim / "series.toml").write_bytes(b"not yours\n")
    return victim, snapshot(victim)


def test_abort_refuses_a_state_naming_another_series_folder(loop, tmp_path):
    series, build, cli, _, _ = loop
    victim, before = victim_folder(tmp_path)
    assert cli("rebase", "--to", "vllm==0.2.0", "--checkout").returncode == 1
    edit_state(build, series=str(victim))
    for args in (["--abort"], ["--continue"]):
        proc = cli("rebase", *args)
        assert proc.returncode == 2 and "is of another series" in proc.stderr, proc.stderr
        assert len(proc.stderr.splitlines()) == 2
    assert snapshot(victim) == before  # nothing deleted, nothing copied in


@pytest.mark.parametrize(
    "base_key", ["/../../../victim", "../victim", "cpu/../../victim", "default\n", ""]
)
def test_a_forged_base_key_moves_nothing(loop, tmp_path, base_key):
    series, build, cli, _, _ = loop
    victim, before = victim_folder(tmp_path)
    assert cli("rebase", "--to", "vllm==0.2.0", "--checkout").returncode == 1
    (build / "baked-").mkdir()  # as the report found it: a folder for the join to climb
    edit_state(build, base_key=base_key)
    tree = snapshot(build / "baked")
    proc = cli("rebase", "--abort")
    assert proc.returncode == 2 and "damaged" in proc.stderr, proc.stderr
    assert f"$.base_key: must be a base name, not {base_key!r}" in proc.stderr, proc.stderr
    assert snapshot(victim) == before and victim.is_dir()
    assert snapshot(build / "baked") == tree and (build / ".rebase" / "baked").is_dir()


def test_abort_without_the_saved_series_never_empties_the_live_one(loop):
    series, build, cli, _, _ = loop
    before = snapshot(series)
    assert cli("rebase", "--to", "vllm==0.2.0", "--checkout").returncode == 1
    for path in sorted((build / ".rebase" / "series").iterdir()):
        path.unlink()
    (build / ".rebase" / "series").rmdir()
    proc = cli("rebase", "--abort")
    assert proc.returncode == 0, proc.stderr  # checkout wrote nothing into the series
    assert snapshot(series) == before
    assert cli("bake", "--check").returncode == 0


def continue_that_fails_after_writing_the_series(build: Path, cli) -> None:
    (build / "baked" / "vllm" / "b.py").write_bytes(FIXED)
    (build / "dist").rename(build / "dist-moved")
    (build / "dist").write_bytes(b"a file where the wheel folder goes\n")
    proc = cli("rebase", "--continue")
    assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stderr
    (build / "dist").unlink()
    (build / "dist-moved").rename(build / "dist")


def test_abort_after_a_failed_continue_puts_back_only_what_continue_wrote(loop):
    series, build, cli, _, _ = loop
    before = snapshot(series)
    assert cli("rebase", "--to", "vllm==0.2.0", "--checkout").returncode == 1
    (series / "NOTES.md").write_bytes(b"a hand's file\n")
    continue_that_fails_after_writing_the_series(build, cli)
    assert not (series / "03-c.py.diff").exists()  # it did write the series
    proc = cli("rebase", "--abort")
    assert proc.returncode == 0, proc.stderr
    assert (series / "NOTES.md").read_bytes() == b"a hand's file\n"
    (series / "NOTES.md").unlink()
    assert snapshot(series) == before
    assert not [p for p in series.parent.iterdir() if ".new-" in p.name]


def test_abort_after_a_failed_continue_without_the_saved_series_is_refused(loop):
    series, build, cli, _, _ = loop
    assert cli("rebase", "--to", "vllm==0.2.0", "--checkout").returncode == 1
    continue_that_fails_after_writing_the_series(build, cli)
    written = snapshot(series)
    saved = build / ".rebase" / "series"
    saved.rename(build / "elsewhere")
    proc = cli("rebase", "--abort")
    assert proc.returncode == 2 and "the saved series" in proc.stderr, proc.stderr
    assert snapshot(series) == written  # refused before anything moved
    (build / "elsewhere").rename(saved)
    assert cli("rebase", "--abort").returncode == 0


def test_a_rerun_continue_after_a_failed_bake_finishes(loop):
    series, build, cli, _, _ = loop
    assert cli("rebase", "--to", "vllm==0.2.0", "--checkout").returncode == 1
    continue_that_fails_after_writing_the_series(build, cli)
    proc = cli("rebase", "--continue")
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in series.iterdir()) == [
        "01-a.py.diff",
        "02-b.py.diff",
        "series.toml",
    ]
    assert cli("bake", "--check").returncode == 0


def test_two_loops_on_one_series_never_undo_each_other(loop, tmp_path):
    series, build, cli, _, _ = loop
    other = tmp_path / "build-2"
    env = {"BAKERY_CACHE": str(tmp_path / "cache")}

    def cli2(*args):
        return run_cli(*args, "--series", str(series), "--build", str(other), env=env)

    assert cli2("bake").returncode == 0
    assert cli("rebase", "--to", "vllm==0.2.0", "--checkout").returncode == 1
    assert cli2("rebase", "--to", "vllm==0.2.0", "--checkout").returncode == 1
    (build / "baked" / "vllm" / "b.py").write_bytes(FIXED)
    assert cli("rebase", "--continue").returncode == 0
    finished = snapshot(series)
    (other / "baked" / "vllm" / "b.py").write_bytes(FIXED)
    proc = cli2("rebase", "--continue")  # its series is gone: it must not write over it
    assert proc.returncode == 2 and "changed after this rebase was checked out" in proc.stderr
    assert snapshot(series) == finished
    proc = cli2("rebase", "--abort")
    assert proc.returncode == 0, proc.stderr
    assert snapshot(series) == finished  # the finished rebase is kept
    assert cli("bake", "--check").returncode == 0


def test_a_symlinked_lock_is_neither_followed_nor_truncated(loop, tmp_path):
    _, build, cli, _, _ = loop
    target = tmp_path / "precious.txt"
    target.write_bytes(b"do not truncate\n")
    (build / ".bake.lock").unlink()
    (build / ".bake.lock").symlink_to(target)
    proc = cli("bake")
    assert proc.returncode == 2 and "symlink or not a regular file" in proc.stderr, proc.stderr
    assert target.read_bytes() == b"do not truncate\n"
    (build / ".bake.lock").unlink()
    os.mkfifo(build / ".bake.lock")  # a FIFO there must not hang the bake either
    proc = cli("bake")
    assert proc.returncode == 2 and "not a regular file" in proc.stderr, proc.stderr


def test_a_symlinked_trash_receives_nothing(loop, tmp_path):
    _, build, cli, _, _ = loop
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    trash = build / ".trash"
    if trash.exists():
        trash.rmdir()
    trash.symlink_to(elsewhere)
    tree = snapshot(build / "baked")
    proc = cli("bake")
    assert proc.returncode == 2 and ".trash" in proc.stderr and "symlink" in proc.stderr
    assert list(elsewhere.iterdir()) == []  # neither the old tree nor the wheel moved there
    assert snapshot(build / "baked") == tree
    trash.unlink()
    assert cli("bake").returncode == 0


def test_an_append_in_one_checkout_never_reaches_another(loop, tmp_path):
    """Finding 8 (and issue 24, item 5): two build folders share the pristine cache, but
    neither links to it: an append to an untouched file of the first stays there."""
    series, build, cli, _, _ = loop
    other, series2 = tmp_path / "build-2", tmp_path / "series-2"  # a second git checkout
    shutil.copytree(series, series2)
    env = {"BAKERY_CACHE": str(tmp_path / "cache")}

    def cli2(*args):
        return run_cli(*args, "--series", str(series2), "--build", str(other), env=env)

    assert cli2("bake").returncode == 0
    with open(build / "baked" / "vllm" / "__init__.py", "ab") as handle:  # in place
        handle.write(b"EVIL = 1\n")
    assert b"EVIL" not in (other / "baked" / "vllm" / "__init__.py").read_bytes()
    assert cli2("bake", "--check").returncode == 0
    proc = cli("bake", "--check")
    assert proc.returncode == 1 and "modified since the bake: vllm/__init__.py" in proc.stdout
    assert cli("bake", "--discard-edits").returncode == 0 and cli("bake", "--check").returncode == 0
