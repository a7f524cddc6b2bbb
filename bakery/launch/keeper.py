"""Process-group keeper: the session leader the launcher starts vLLM under (stdlib only).

usage: python -I keeper.py GRACE_S WATCH_FD -- COMMAND...

The launcher starts this in a new session, so the keeper's pid is the process
group of vLLM and of every process vLLM forks. The keeper runs COMMAND in that
group and reads WATCH_FD, the read end of a pipe whose write end only the
launcher holds:

- ``detach`` arrives: the server is ready, the launcher is leaving; keep running.
- EOF before that: the launcher died (even by SIGKILL) mid-start; tear down.
- SIGTERM or SIGINT (``stop``, or the launcher tearing down): tear down.

Tearing down is SIGTERM to the whole group, GRACE_S seconds for it to go, then
SIGKILL to the whole group (the keeper included) if anything is left. When
COMMAND exits on its own, the keeper sweeps what it left and exits with its status.
"""

import os
import signal
import subprocess
import sys
import threading
import time


class _State:
    """The keeper's one run: its child, and whether tearing down has begun."""

    child: "subprocess.Popen[bytes] | None" = None
    down = False


_lock = threading.Lock()
_state = _State()
_finished = threading.Event()


def _group_alive(pgid):
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def _others_alive(pgid):
    """True while any live (non-zombie) process of the group besides the keeper exists."""
    try:
        names = os.listdir("/proc")
    except OSError:
        return _group_alive(pgid)
    for name in names:
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            with open(f"/proc/{name}/stat") as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            return True
    return False


def teardown(grace):
    """SIGTERM the group, wait up to ``grace`` s, SIGKILL whatever is left (keeper too)."""
    with _lock:
        if _state.down:
            return
        _state.down = True
    try:
        pgid = os.getpgrp()
        os.killpg(pgid, signal.SIGTERM)  # our handler sees `down` and returns
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and _others_alive(pgid):
            time.sleep(0.2)
        if _others_alive(pgid):
            os.killpg(pgid, signal.SIGKILL)
    finally:
        _finished.set()


def _watch(fd, grace):
    data = b""
    while True:
        chunk = os.read(fd, 64)
        if not chunk:
            break
        data += chunk
        if b"detach" in data:
            os.close(fd)
            return
    teardown(grace)


def main(argv):
    grace, fd, command = float(argv[0]), int(argv[1]), argv[3:]
    if argv[2] != "--" or not command:
        print("usage: keeper.py GRACE_S WATCH_FD -- COMMAND...", file=sys.stderr)
        return 2
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: threading.Thread(target=teardown, args=(grace,)).start())
    _state.child = child = subprocess.Popen(command, stdin=subprocess.DEVNULL)
    threading.Thread(target=_watch, args=(fd, grace), daemon=True).start()
    status = child.wait()
    if not _state.down:
        time.sleep(1.0)  # let vLLM's own shutdown reap its workers first
        teardown(min(grace, 10.0))
    _finished.wait()
    return status if status >= 0 else 128 - status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
