"""The keeper holds the process group: pipe EOF or SIGTERM tears it down, ``detach`` does not.

Fast: the served command is a shell that forks a grandchild, both sleeping, so
a group teardown has more than one process to take down. No vLLM here; the
real-server versions are in test_launch_smoke.py.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest
from _launch_support import wait_until

from bakery.launch import keeper
from bakery.launch.processes import group_members

SERVE = ["/bin/sh", "-c", "sleep 300 & sleep 300; wait"]


def spawn(grace: float = 5.0):
    read_fd, write_fd = os.pipe()
    proc = subprocess.Popen(
        [sys.executable, "-I", keeper.__file__, str(grace), str(read_fd), "--", *SERVE],
        start_new_session=True,
        pass_fds=(read_fd,),
        stdin=subprocess.DEVNULL,
    )
    os.close(read_fd)
    assert wait_until(lambda: len(group_members(proc.pid)) >= 4, 20), group_members(proc.pid)
    return proc, write_fd


@pytest.fixture
def cleanup():
    groups = []
    yield groups
    for pgid in groups:  # whatever a failed test left running
        try:
            os.killpg(pgid, signal.SIGKILL)
        except ProcessLookupError:
            continue
        wait_until(lambda pgid=pgid: not group_members(pgid), 10)


def test_pipe_eof_tears_the_group_down(cleanup):
    proc, write_fd = spawn()
    cleanup.append(proc.pid)
    os.close(write_fd)  # what the launcher's death looks like, SIGKILL included
    proc.wait(timeout=30)
    assert wait_until(lambda: not group_members(proc.pid), 10), group_members(proc.pid)


def test_detach_keeps_the_server_and_sigterm_then_stops_it(cleanup):
    proc, write_fd = spawn()
    cleanup.append(proc.pid)
    os.write(write_fd, b"detach\n")
    os.close(write_fd)
    assert not wait_until(lambda: proc.poll() is not None, 3), "detach must keep it running"
    assert len(group_members(proc.pid)) >= 4
    os.killpg(proc.pid, signal.SIGTERM)
    proc.wait(timeout=30)
    assert wait_until(lambda: not group_members(proc.pid), 10), group_members(proc.pid)


def test_a_child_that_ignores_sigterm_is_killed_after_the_grace(cleanup):
    read_fd, write_fd = os.pipe()
    stubborn = ["/bin/sh", "-c", "trap '' TERM; sleep 300 & wait; wait"]
    proc = subprocess.Popen(
        [sys.executable, "-I", keeper.__file__, "1.0", str(read_fd), "--", *stubborn],
        start_new_session=True,
        pass_fds=(read_fd,),
    )
    os.close(read_fd)
    cleanup.append(proc.pid)
    assert wait_until(lambda: len(group_members(proc.pid)) >= 3, 20)
    os.close(write_fd)
    assert wait_until(lambda: not group_members(proc.pid), 15), group_members(proc.pid)
    assert proc.wait(timeout=5) == -signal.SIGKILL
