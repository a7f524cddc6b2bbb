"""No rank outlives its test, and no hang outlives its bound.

``_dcp_child.fork_ranks`` is the one way the tests start ranks: a rank that never returns
fails the call within its timeout, a rank that fails ends the wait at once, and every rank
still alive is killed with its process group (a grandchild too). The suite-wide guard
(pytest-timeout, configured in pyproject.toml) turns a wait with no bound of its own into a
failed test; a planted hang in a child pytest shows it fails within the bound and leaves no
process behind, and the same run with the kill planted out leaves one.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from _dcp_child import fork_ranks, kill_session, rank_file, session_members

TESTS = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent  # _dcp_child.py's folder


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_a_rank_that_never_returns_fails_within_the_bound_and_is_killed_with_its_group(
    tmp_path,
):
    def rank_fn(rank: int, store: str, out: str) -> None:
        if rank == 1:
            child = subprocess.Popen(["sleep", "600"])
            (tmp_path / "pids").write_text(f"{os.getpid()} {child.pid}")
            while True:
                time.sleep(1)
        import torch

        torch.save({"rank": rank}, rank_file(out, rank))

    start = time.monotonic()
    with pytest.raises(RuntimeError, match=r"rank 1 did not finish within 3 s \(killed\)"):
        fork_ranks(rank_fn, 2, 3)
    assert time.monotonic() - start < 15
    written = [int(p) for p in (tmp_path / "pids").read_text().split()]
    time.sleep(0.2)  # the orphaned grandchild is reaped by init, not by us
    assert [pid for pid in written if _alive(pid)] == []


def test_a_failing_rank_ends_the_wait_and_the_waiting_rank_is_killed():
    def rank_fn(rank: int, store: str, out: str) -> None:
        import torch.distributed as dist

        dist.init_process_group("gloo", store=dist.FileStore(store, 2), rank=rank, world_size=2)
        if rank == 1:
            raise SystemExit(7)
        dist.barrier()  # waits for rank 1 forever: only the kill ends it

    start = time.monotonic()
    with pytest.raises(RuntimeError) as failure:
        fork_ranks(rank_fn, 2, 300)
    assert time.monotonic() - start < 60  # not the 300 s bound
    assert str(failure.value) == (
        "DCP ranks failed (W=2): rank 1 exited with 7; rank 0 was still running (killed)"
    )


PLANTED_HANG = """
import os, subprocess, time
import pytest
import _dcp_child
from _dcp_child import fork_ranks

def rank_fn(rank, store, out):
    if rank == 1:
        subprocess.Popen(["sleep", "600"])
    while True:
        time.sleep(1)

@pytest.mark.timeout(3)
def test_hangs():
    if os.environ.get("PLANT_NO_KILL"):
        _dcp_child.kill_ranks = lambda procs: []
    fork_ranks(rank_fn, 2, 600)  # far past the test's own bound
"""


def _run_planted_hang(
    tmp_path: Path, plant: bool
) -> tuple[subprocess.CompletedProcess, float, int]:
    """A child pytest over the planted hang, in a session of its own: its result, how long
    it took, and its session id (every process it left behind is in that session)."""
    test = tmp_path / "test_planted_hang.py"
    test.write_text(textwrap.dedent(PLANTED_HANG))
    env = {**os.environ, "PYTHONPATH": str(HERE)}
    env.pop("PLANT_NO_KILL", None)
    if plant:
        env["PLANT_NO_KILL"] = "1"
    start = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(test)],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=120)
    finally:
        elapsed = time.monotonic() - start
    return subprocess.CompletedProcess(proc.args, proc.returncode, out), elapsed, proc.pid


def test_a_planted_hang_fails_the_suite_within_its_bound_and_leaves_no_process(tmp_path):
    done, elapsed, session = _run_planted_hang(tmp_path, plant=False)
    try:
        assert done.returncode == 1, done.stdout
        assert "Failed: Timeout (>3.0s) from pytest-timeout" in done.stdout, done.stdout
        assert "in _wait_all" in done.stdout  # the stack shows where it hung
        assert elapsed < 60
        time.sleep(0.2)
        assert session_members(session) == []
    finally:
        kill_session(session)


def test_the_same_hang_with_the_kill_planted_out_leaves_a_process(tmp_path):
    """The check above can fail: without the kill the hung rank's grandchild outlives
    pytest (the daemon rank itself is ended at exit; the grandchild is not its child)."""
    done, _, session = _run_planted_hang(tmp_path, plant=True)
    try:
        assert done.returncode == 1, done.stdout
        time.sleep(0.2)
        assert session_members(session) != []
    finally:
        kill_session(session)


def own_rank_starts(tests: Path = TESTS) -> list[str]:
    """Where a test could start processes the multiprocessing way outside ``_dcp_child``:
    an import of ``multiprocessing`` or ``torch.multiprocessing``, or ``os.fork``."""
    found = []
    for path in sorted(tests.rglob("*.py")):
        if path.relative_to(tests).as_posix() in ("_dcp_child.py", "lab/dcp/_dcp_child.py"):
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            elif isinstance(node, ast.Attribute) and node.attr in ("fork", "forkpty"):
                names = [ast.unparse(node)]
            else:
                continue
            for name in names:
                if "multiprocessing" in name.split(".") or name in ("os.fork", "os.forkpty"):
                    found.append(f"{path.relative_to(tests)}:{node.lineno} {name}")
    return found


def test_no_test_starts_ranks_its_own_way():
    assert own_rank_starts() == []


def test_a_rank_started_its_own_way_is_seen(tmp_path):
    (tmp_path / "_dcp_child.py").write_text("import multiprocessing\n")
    (tmp_path / "test_x.py").write_text(
        "import os\nimport torch.multiprocessing as mp\nos.fork()\n"
    )
    (tmp_path / "test_y.py").write_text("from multiprocessing import Process\n")
    assert own_rank_starts(tmp_path) == [
        "test_x.py:2 torch.multiprocessing",
        "test_x.py:3 os.fork",
        "test_y.py:1 multiprocessing",
    ]
