"""The processes of a run: found by /proc, identified by more than a pid, ended for good.

Every process the launcher starts inherits ``BAKERY_LAUNCH_DIR=<run folder>``
(absolute, so unique per run), and that is how ``stop`` finds them: the group
leader (the keeper), vLLM, its workers, and any that left the process group or
outlived their leader. A pid alone names nothing for long (pids are reused), so
a leader is trusted only when its start time and its whole command line match
the record, and a process is signalled through a pidfd opened before its marker
is checked again, so a pid recycled in between is never signalled.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

__all__ = [
    "MARK",
    "cmdline",
    "start_ticks",
    "group_members",
    "launched",
    "launched_runs",
    "end_processes",
]

MARK = "BAKERY_LAUNCH_DIR"


def _stat(pid: int) -> list[str] | None:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()
    except OSError:
        return None


def start_ticks(pid: int) -> int | None:
    """The process's start time in clock ticks since boot; None if gone or a zombie."""
    fields = _stat(pid)
    return None if fields is None or fields[0] == "Z" else int(fields[19])


def cmdline(pid: int) -> list[str] | None:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    return [part.decode(errors="surrogateescape") for part in raw.split(b"\0")[:-1]]


def _pids() -> list[int]:
    return [int(name) for name in os.listdir("/proc") if name.isdigit()]


def group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes whose process group is ``pgid``."""
    members = []
    for pid in _pids():
        fields = _stat(pid)
        if fields and fields[0] != "Z" and int(fields[2]) == pgid:
            members.append(pid)
    return members


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass  # the group is already gone: nothing left to signal


def _marked(pid: int, needle: bytes) -> bool:
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:  # gone, or not ours to read: not ours to end either
        return False
    return needle in environ.split(b"\0")


def carries_marker(pid: int, run_dir: Path) -> bool:
    """Whether ``pid`` was started for the run in ``run_dir`` (its environment says so)."""
    return _marked(pid, f"{MARK}={run_dir}".encode())


def launched(run_dir: Path) -> list[int]:
    """Live processes started for the run recorded in ``run_dir`` (by their marker)."""
    needle = f"{MARK}={run_dir}".encode()
    found = []
    for pid in _pids():
        fields = _stat(pid)
        if fields and fields[0] != "Z" and _marked(pid, needle):
            found.append(pid)
    return found


def launched_runs() -> set[Path]:
    """The run folders of every live process the launcher started (one /proc scan)."""
    prefix = f"{MARK}=".encode()
    runs = set()
    for pid in _pids():
        fields = _stat(pid)
        if not fields or fields[0] == "Z":
            continue
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes()
        except OSError:
            continue
        for item in environ.split(b"\0"):
            if item.startswith(prefix):
                runs.add(Path(item[len(prefix) :].decode(errors="surrogateescape")))
    return runs


def _signal_marked(pid: int, needle: bytes, sig: int) -> None:
    """Signal ``pid`` only if, once pinned by a pidfd, it still carries the marker."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    try:
        if _marked(pid, needle):
            signal.pidfd_send_signal(fd, sig)
    except ProcessLookupError:
        pass  # it exited between the check and the signal
    finally:
        os.close(fd)


def end_processes(run_dir: Path, leader: int | None, grace_s: float) -> tuple[int, list[int]]:
    """End every process of the run: SIGTERM, ``grace_s`` to go, then SIGKILL.

    ``leader``: a verified group leader whose whole group is ours too (None when
    it is dead or could not be verified). Returns (how many there were, survivors).
    """
    needle = f"{MARK}={run_dir}".encode()

    def targets() -> list[int]:
        found = set(launched(run_dir))
        if leader is not None:
            found |= set(group_members(leader))
        return sorted(found)

    first = targets()
    if leader is not None:
        _signal_group(leader, signal.SIGTERM)
    for pid in first:
        _signal_marked(pid, needle, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while targets() and time.monotonic() < deadline:
        time.sleep(0.2)
    deadline = time.monotonic() + 10.0
    while (left := targets()) and time.monotonic() < deadline:
        if leader is not None:
            _signal_group(leader, signal.SIGKILL)
        for pid in left:
            _signal_marked(pid, needle, signal.SIGKILL)
        time.sleep(0.2)
    return len(first), targets()
