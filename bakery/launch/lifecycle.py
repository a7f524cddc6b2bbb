"""Start, stop and status of a served baked tree.

``start`` runs after a clean preflight: it writes the run's record
(``run_record``), starts the keeper (``keeper.py``) as a new session leader with
vLLM under it, waits for ``/health`` and a 1-token ``/v1/completions``, then tells
the keeper to detach and returns. SIGINT or SIGTERM during the wait tears the
whole group down; SIGKILL of the launcher closes the keeper's pipe and the keeper
tears it down. ``stop`` and ``status`` work from the run folders: a pid file names
the process group, the leader's start time and its whole command line, and every
process of a run carries the run folder in its environment (``processes.MARK``),
so ``stop`` ends all of them (a dead leader's members and a corrupt pid file's run
included) and nothing else (see ``processes``).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import msgspec

from bakery.launch import keeper as keeper_module
from bakery.launch.errors import LaunchError, LaunchInterrupted
from bakery.launch.plan import LaunchPlan
from bakery.launch.preflight import Facts
from bakery.launch.processes import MARK, end_processes, launched_runs
from bakery.launch.run_record import (
    PID_FILE,
    TAIL_LINES,
    Record,
    Running,
    new_record,
    read_pid,
    rebaked_under,
    recorded,
    tail,
    write_pid,
    write_record,
)

__all__ = ["start", "stop", "stop_record", "status", "ServerRow", "wait_ready"]

HEADLESS_SETTLE_S = 10.0
PROGRESS_S = 15.0  # seconds between two "waiting" lines during start
PROGRESS_WIDTH = 160


def serve_env(plan: LaunchPlan, record: Record) -> dict[str, str]:
    run_id = f"{plan.profile.name}/{record.run_dir.name}"
    # MARK is how stop finds every process of this run; it is left out of
    # serve_command.sh, so a hand re-run is not this run's.
    return {**os.environ, **dict(plan.env), "BAKERY_LAUNCH_RUN": run_id, MARK: str(record.run_dir)}


# ---- readiness --------------------------------------------------------------------------


def _ready_once(client: httpx.Client, plan: LaunchPlan) -> bool:
    try:
        if client.get(f"{plan.url}/health", timeout=5.0).status_code != 200:
            return False
    except httpx.TransportError:
        return False
    body = {
        "model": plan.profile.served_model_name,
        "prompt": "Hello",
        "max_tokens": 1,
        "temperature": 0,
    }
    reply = client.post(f"{plan.url}/v1/completions", json=body, timeout=120.0)
    if reply.status_code != 200 or len(reply.json().get("choices", [])) != 1:
        raise LaunchError(
            f"the 1-token completion probe failed (HTTP {reply.status_code}): {reply.text[:300]!r}",
            hint="see the server log",
        )
    return True


def last_line(path: Path) -> str:
    """The log's last non-empty line (vLLM's progress), shortened for one terminal row."""
    line = next((ln for ln in reversed(tail(path, 5).splitlines()) if ln.strip()), "")
    return line.strip()[:PROGRESS_WIDTH]


def wait_ready(
    plan: LaunchPlan, proc: subprocess.Popen, log: Path, timeout_s: float, say=None
) -> float:
    """Seconds until /health and a 1-token completion answer; raises LaunchError.

    Every ``PROGRESS_S`` seconds ``say`` gets the elapsed time and the log's last
    line: a boot can take up to 30 minutes, and silence looks like a hang.
    """
    started = time.monotonic()
    deadline = started + timeout_s
    shown = started
    with httpx.Client(trust_env=False) as client:
        while time.monotonic() < deadline:
            if say is not None and time.monotonic() - shown >= PROGRESS_S:
                shown = time.monotonic()
                say(f"waiting {shown - started:.0f} s / {timeout_s:g} s: {last_line(log)}")
            if proc.poll() is not None:
                raise LaunchError(
                    f"the server exited with status {proc.returncode} before it was ready; "
                    f"last {TAIL_LINES} log lines of {log}:\n{tail(log)}",
                    hint="fix what the log shows, then start again",
                )
            if plan.headless:
                if time.monotonic() - started >= HEADLESS_SETTLE_S:
                    return time.monotonic() - started
            elif _ready_once(client, plan):
                return time.monotonic() - started
            time.sleep(1.0)
    raise LaunchError(
        f"the server was not ready within {timeout_s:g} s; last {TAIL_LINES} log lines of "
        f"{log}:\n{tail(log)}",
        hint="if it was still loading, give it longer (`run.sh start --startup-timeout S`)",
    )


# ---- start / stop / status --------------------------------------------------------------


class _Interrupted(Exception):
    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _raise_interrupted(signum, _frame):
    raise _Interrupted(signum)


# INT, TERM and HUP alike: a TERM from a supervisor or a closed terminal (HUP) must tear
# down what a Ctrl-C tears down, so each raises where the code is and its finally runs.
TEARDOWN_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@contextlib.contextmanager
def torn_down_on_signals(log: Path | str) -> Iterator[None]:
    """Run the block with INT, TERM and HUP raising in it (so its ``finally`` stops what
    it started); the signal becomes ``LaunchInterrupted`` (exit 128 + signal)."""
    previous = {s: signal.signal(s, _raise_interrupted) for s in TEARDOWN_SIGNALS}
    try:
        yield
    except _Interrupted as exc:
        raise LaunchInterrupted(exc.signum, log) from None
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _spawn(plan: LaunchPlan, record: Record, grace_s: float) -> tuple[subprocess.Popen, int]:
    read_fd, write_fd = os.pipe()
    keeper = [str(plan.python), "-I", keeper_module.__file__, str(grace_s), str(read_fd), "--"]
    with open(record.log, "ab") as log:
        try:
            proc = subprocess.Popen(
                [*keeper, *plan.command],
                cwd=plan.cwd,
                env=serve_env(plan, record),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                pass_fds=(read_fd,),
            )
        finally:
            os.close(read_fd)
    return proc, write_fd


def _abort(proc: subprocess.Popen, record: Record, grace_s: float) -> None:
    for sig in TEARDOWN_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)  # a second Ctrl-C must not cut the teardown short
    end_processes(record.run_dir, proc.pid, grace_s)  # the group and any that left it
    proc.wait(timeout=30)
    record.pid_file.unlink(missing_ok=True)


def start(
    plan: LaunchPlan, facts: Facts, argv: list[str], *, grace_s: float = 30.0, say=print
) -> tuple[Record, float]:
    """Record, spawn, wait until ready; on any failure nothing of the group is left."""
    record = new_record(plan)
    write_record(record, plan, facts, argv)
    previous = {s: signal.signal(s, _raise_interrupted) for s in TEARDOWN_SIGNALS}
    proc = write_fd = None
    try:
        proc, write_fd = _spawn(plan, record, grace_s)
        write_pid(record, plan, proc)
        say(f"started {plan.profile.name} (process group {proc.pid}); log: {record.log}")
        elapsed = wait_ready(plan, proc, record.log, plan.profile.startup_timeout_s, say)
        os.write(write_fd, b"detach\n")
    except BaseException as exc:
        if proc is not None:
            say(f"tearing down process group {proc.pid} ({type(exc).__name__}: {exc})"[:300])
            _abort(proc, record, grace_s)
        if isinstance(exc, _Interrupted):
            raise LaunchInterrupted(exc.signum, record.log) from None
        raise
    finally:
        if write_fd is not None:
            os.close(write_fd)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return record, elapsed


def _stop_one(run: Running, grace_s: float) -> int:
    """End every process of one recorded run; how many there were (0: a stale record)."""
    leader = run.pgid if run.leader_verified else None
    count, survivors = end_processes(run.run_dir, leader, grace_s)
    if survivors:
        raise LaunchError(
            f"processes of {run.run_dir} survived SIGKILL: {survivors!r}",
            hint="check for D-state processes",
        )
    run.pid_file.unlink(missing_ok=True)
    return count


def stop_record(record: Record, grace_s: float) -> bool:
    """Stop the server of one run (the matrix's way); False if it was not running."""
    if not record.pid_file.exists():
        return False
    previous = {s: signal.signal(s, signal.SIG_IGN) for s in TEARDOWN_SIGNALS}
    try:  # a second TERM must not cut the teardown short
        return _stop_one(read_pid(record.pid_file), grace_s) > 0
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def stop(artifacts: Path, profile: str | None, grace_s: float, say=print) -> int:
    """Stop every recorded server (of ``profile``); returns how many were running."""
    stopped = 0
    for run in recorded(artifacts, profile):
        count = _stop_one(run, grace_s)
        if run.error:
            say(
                f"{run.profile}: unreadable pid file {run.pid_file} ({run.error}) removed; "
                f"{count} process(es) of that run ended"
            )
        elif count:
            say(f"{run.profile}: stopped process group {run.pgid} ({count} process(es))")
        else:
            say(f"{run.profile}: not running (stale pid file {run.pid_file} removed)")
        stopped += bool(count)
    stopped += _stop_unrecorded(artifacts, profile, grace_s, say)
    if not stopped:
        say("nothing running" + (f" for {profile}" if profile else ""))
    return stopped


def _stop_unrecorded(artifacts: Path, profile: str | None, grace_s: float, say) -> int:
    """Runs under ``artifacts`` with live processes but no pid file (a start that died
    between spawning and writing it, or a pid file deleted by hand): end them too."""
    root = Path(artifacts).resolve()
    stopped = 0
    for run_dir in sorted(launched_runs()):
        inside = run_dir.parent.parent == root and (profile in (None, run_dir.parent.name))
        if not inside or (run_dir / PID_FILE).exists():
            continue
        count, survivors = end_processes(run_dir, None, grace_s)
        if survivors:
            raise LaunchError(f"processes of {run_dir} survived SIGKILL: {survivors!r}")
        say(f"{run_dir.parent.name}: ended {count} process(es) of {run_dir} (no pid file)")
        stopped += bool(count)
    return stopped


def health(url: str | None) -> str:
    if url is None:
        return "headless"
    try:
        code = httpx.get(f"{url}/health", timeout=5.0, trust_env=False).status_code
    except httpx.TransportError as exc:
        return f"no answer ({type(exc).__name__})"
    return "healthy" if code == 200 else f"unhealthy (HTTP {code})"


class ServerRow(msgspec.Struct, frozen=True, kw_only=True):
    """One recorded server as `status` shows it (``launch status --json`` prints these rows,
    `bakery status` its running ones): ``health`` in words, ``rebaked`` the bake that
    replaced the one it serves (None: none, or not running)."""

    profile: str
    pgid: int
    url: str | None
    running: bool
    health: str
    run_dir: str
    rebaked: str | None

    @property
    def healthy(self) -> bool:
        return self.running and self.health in ("healthy", "headless")


def status(artifacts: Path, profile: str | None) -> list[ServerRow]:
    rows = []
    for run in recorded(artifacts, profile):
        alive = run.alive
        if run.error:
            shown = f"unreadable pid file ({run.error})"
        else:
            shown = health(run.url) if alive else "dead (stale pid file)"
        rows.append(
            ServerRow(
                profile=run.profile,
                pgid=run.pgid,
                url=run.url,
                running=alive,
                health=shown,
                run_dir=str(run.run_dir),
                rebaked=rebaked_under(run.run_dir) if alive else None,
            )
        )
    return rows
