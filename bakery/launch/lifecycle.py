"""Start, stop and status of a served baked tree, and the record each run leaves.

``start`` runs after a clean preflight: it writes the record
(``artifacts/dcp2/<profile>/<UTC timestamp>/``: serve_command.sh,
run_environment.json, serve.log, server.pid), starts the keeper (``keeper.py``)
as a new session leader with vLLM under it, waits for ``/health`` and a 1-token
``/v1/completions``, then tells the keeper to detach and returns. SIGINT or
SIGTERM during the wait tears the whole group down; SIGKILL of the launcher
closes the keeper's pipe and the keeper tears it down. ``stop`` and ``status``
work from the run folders: a pid file names the process group, the leader's
start time and its whole command line, and every process of a run carries the
run folder in its environment (``processes.MARK``), so ``stop`` ends all of
them (a dead leader's members and a corrupt pid file's run included) and
nothing else (see ``processes``).
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shlex
import signal
import subprocess
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path

import httpx

from bakery import __version__
from bakery.bake.manifest import MANIFEST
from bakery.clock import FOLDER, ISO, utc_stamp
from bakery.launch import keeper as keeper_module
from bakery.launch.errors import LaunchError, LaunchInterrupted
from bakery.launch.model_config import candidate_blocks
from bakery.launch.plan import LaunchPlan
from bakery.launch.preflight import Facts
from bakery.launch.processes import (
    MARK,
    cmdline,
    end_processes,
    group_members,
    launched,
    launched_runs,
    start_ticks,
)
from bakery.tree import write_json_atomic

__all__ = [
    "Record",
    "Running",
    "start",
    "stop",
    "status",
    "recorded",
    "group_members",
    "tail",
    "wait_ready",
    "latest_log",
    "follow",
]

PID_FILE = "server.pid"
LOG_FILE = "serve.log"
TAIL_LINES = 40
HEADLESS_SETTLE_S = 10.0
PROGRESS_S = 15.0  # seconds between two "waiting" lines during start
PROGRESS_WIDTH = 160
_INHERITED = ("CUDA_", "NCCL_", "VLLM_", "HF_", "TORCH_", "OMP_", "GLOO_", "DSV41_", "RAY_")
_SECRET = ("TOKEN", "SECRET", "KEY", "PASSWORD", "CREDENTIAL")


@dataclass(frozen=True)
class Record:
    run_dir: Path

    @property
    def log(self) -> Path:
        return self.run_dir / LOG_FILE

    @property
    def pid_file(self) -> Path:
        return self.run_dir / PID_FILE


@dataclass(frozen=True)
class Running:
    """One pid file, read back: the group, the leader's identity, where it serves.

    ``error``: why the pid file could not be read (the run's processes are still
    found by their marker); the other fields are then placeholders.
    """

    pid_file: Path
    pgid: int
    start_ticks: int
    url: str | None
    profile: str
    # None: a pid file from before the command line was recorded (checked by start time alone)
    cmdline: tuple[str, ...] | None = ()
    error: str | None = None

    @property
    def run_dir(self) -> Path:
        return self.pid_file.parent

    @property
    def leader_verified(self) -> bool:
        """The recorded leader is alive and is the process the launcher started."""
        if self.error or self.pgid <= 0 or start_ticks(self.pgid) != self.start_ticks:
            return False
        if self.cmdline is None:
            return True
        return tuple(cmdline(self.pgid) or ()) == self.cmdline

    @property
    def alive(self) -> bool:
        return self.leader_verified or bool(launched(self.run_dir))


# ---- processes ----------------------------------------------------------------------


def tail(path: Path, lines: int = TAIL_LINES) -> str:
    try:
        with open(path, errors="replace") as handle:
            return "".join(deque(handle, maxlen=lines)).rstrip()
    except OSError as exc:
        return f"(no log: {exc.strerror})"


# ---- the record -------------------------------------------------------------------------


def new_record(plan: LaunchPlan) -> Record:
    stamp = utc_stamp(FOLDER)
    for n in range(1, 100):
        run_dir = plan.artifacts / (stamp if n == 1 else f"{stamp}-{n}")
        try:
            run_dir.mkdir(parents=True)
            return Record(run_dir)
        except FileExistsError:
            continue
    raise LaunchError(f"cannot make a fresh run folder (100 taken): {str(plan.artifacts)!r}")


def inherited_env() -> dict[str, str]:
    """The caller's variables that shape a run (secrets left out by name)."""
    return {
        k: v
        for k, v in sorted(os.environ.items())
        if k.startswith(_INHERITED) and not any(s in k.upper() for s in _SECRET)
    }


def serve_env(plan: LaunchPlan, record: Record) -> dict[str, str]:
    run_id = f"{plan.profile.name}/{record.run_dir.name}"
    # MARK is how stop finds every process of this run; it is left out of
    # serve_command.sh, so a hand re-run is not this run's.
    return {**os.environ, **dict(plan.env), "BAKERY_LAUNCH_RUN": run_id, MARK: str(record.run_dir)}


def command_script(plan: LaunchPlan, run_id: str) -> str:
    q = shlex.quote
    lines = [
        "#!/usr/bin/env bash",
        f"# {plan.profile.name}: the exact vLLM command of run {run_id}, re-runnable.",
        "# Inherited from the caller's environment (secrets left out):",
    ]
    lines += [f"export {k}={q(v)}" for k, v in inherited_env().items()]
    lines += ["# Set by the launcher:"]
    lines += [f"export {k}={q(v)}" for k, v in plan.env]
    lines += [f"export BAKERY_LAUNCH_RUN={q(run_id)}", "set -euo pipefail"]
    lines += [f"cd {q(str(plan.cwd))}"]
    lines.append("exec " + " ".join(q(a) for a in plan.command))
    return "\n".join(lines) + "\n"


def _baked(plan: LaunchPlan, facts: Facts) -> dict:
    path = facts.manifest or (plan.tree / MANIFEST if plan.tree else None)
    if path is None:
        return {"path": None, "error": "no BAKED.json found"}
    try:
        raw = path.read_bytes()
    except OSError as exc:
        return {"path": str(path), "error": exc.strerror}
    data = json.loads(raw)
    return {
        "path": str(path),
        "sha256": hashlib.sha256(raw).hexdigest(),
        "series_sha256": data["series"]["sha256"],
        "series": data["series"]["name"],
        "base": data["base"]["requirement"],
    }


def environment(plan: LaunchPlan, facts: Facts, argv: list[str]) -> dict:
    probe = facts.probe or {}
    server_env = {**os.environ, **dict(plan.env)}
    return {
        "created_utc": utc_stamp(ISO),
        "profile": plan.profile.name,
        "profile_source": str(plan.profile.source),
        "profile_text": plan.profile.source.read_text(),
        "launcher_argv": argv,
        "host": platform.node(),
        "versions": {
            "python": platform.python_version(),
            "bakery": __version__,
            "vllm": probe.get("vllm_version"),
            "torch": probe.get("torch_version"),
        },
        "python": str(plan.python),
        "vllm_file": probe.get("vllm_file"),
        "baked": _baked(plan, facts),
        "gpus": [g.__dict__ for g in facts.gpus] if facts.gpus is not None else None,
        "supported_heads": list(facts.heads) if facts.heads else None,
        "candidate_source_layer_id": (
            candidate_blocks(facts.model_config) if facts.model_config else None
        ),
        "dsv41": {k: v for k, v in sorted(server_env.items()) if k.startswith("DSV41_")},
        "env_set": dict(plan.env),
        "inherited_env": inherited_env(),
        "command": list(plan.command),
        "url": None if plan.headless else plan.url,
    }


def write_record(record: Record, plan: LaunchPlan, facts: Facts, argv: list[str]) -> None:
    run_id = f"{plan.profile.name}/{record.run_dir.name}"
    script = record.run_dir / "serve_command.sh"
    script.write_text(command_script(plan, run_id))
    script.chmod(0o755)
    env = environment(plan, facts, argv)
    (record.run_dir / "run_environment.json").write_text(json.dumps(env, indent=2) + "\n")


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


def _write_pid(record: Record, plan: LaunchPlan, proc: subprocess.Popen) -> None:
    assert isinstance(proc.args, list), proc.args  # _spawn passes an argv list
    data = {
        "pgid": proc.pid,
        "start_ticks": start_ticks(proc.pid),
        "cmdline": list(proc.args),
        "url": None if plan.headless else plan.url,
        "profile": plan.profile.name,
        "run_dir": str(record.run_dir),
        "command": list(plan.command),
    }
    write_json_atomic(record.pid_file, data)  # stop and status never read half a file


def _abort(proc: subprocess.Popen, record: Record, grace_s: float) -> None:
    for sig in (signal.SIGINT, signal.SIGTERM):
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
    previous = {s: signal.signal(s, _raise_interrupted) for s in (signal.SIGINT, signal.SIGTERM)}
    proc = write_fd = None
    try:
        proc, write_fd = _spawn(plan, record, grace_s)
        _write_pid(record, plan, proc)
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


def recorded(artifacts: Path, profile: str | None) -> list[Running]:
    """Every pid file under ``artifacts`` (``artifacts/<profile>/<stamp>/server.pid``)."""
    pattern = f"{profile or '*'}/*/{PID_FILE}"
    # Resolved: the run marker in each process holds the absolute run folder.
    return [_read_pid(path) for path in sorted(Path(artifacts).resolve().glob(pattern))]


def _read_pid(path: Path) -> Running:
    try:
        data = json.loads(path.read_bytes())
        return Running(
            path,
            int(data["pgid"]),
            int(data["start_ticks"] or -1),
            data.get("url"),
            str(data.get("profile", "?")),
            tuple(str(a) for a in data["cmdline"]) if "cmdline" in data else None,
        )
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        why = getattr(exc, "strerror", None) or f"{type(exc).__name__}: {exc}"
        return Running(path, -1, -1, None, path.parent.parent.name, error=why[:200])


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
    return _stop_one(_read_pid(record.pid_file), grace_s) > 0


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


def latest_log(artifacts: Path, profile: str | None) -> Path:
    """The serve.log of the newest recorded run (of ``profile``); raises LaunchError."""
    runs = sorted(Path(artifacts).glob(f"{profile or '*'}/*/{LOG_FILE}"), key=_run_order)
    if not runs:
        raise LaunchError(
            f"no run recorded under {artifacts}" + (f" for {profile}" if profile else ""),
            hint="start one with `run.sh start`, or point at the runs with "
            "`run.sh logs --artifacts DIR`",
        )
    return runs[-1]


def _run_order(log: Path) -> tuple[str, str]:
    return (log.parent.name, log.parent.parent.name)  # UTC stamps sort in time order


def follow(log: Path, lines: int, write, poll_s: float = 0.5) -> None:
    """Write the last ``lines`` of ``log``, then what is appended while the run lives."""
    write(tail(log, lines) + "\n")
    run_dir = log.parent
    with open(log, "rb") as handle:
        handle.seek(0, os.SEEK_END)
        while True:
            chunk = handle.read()
            if chunk:
                write(chunk.decode(errors="replace"))
            elif not launched(run_dir):
                return  # the run is over and its log fully shown
            else:
                time.sleep(poll_s)


def health(url: str | None) -> str:
    if url is None:
        return "headless"
    try:
        code = httpx.get(f"{url}/health", timeout=5.0, trust_env=False).status_code
    except httpx.TransportError as exc:
        return f"no answer ({type(exc).__name__})"
    return "healthy" if code == 200 else f"unhealthy (HTTP {code})"


def status(artifacts: Path, profile: str | None) -> list[dict]:
    rows = []
    for run in recorded(artifacts, profile):
        alive = run.alive
        if run.error:
            shown = f"unreadable pid file ({run.error})"
        else:
            shown = health(run.url) if alive else "dead (stale pid file)"
        rows.append(
            {
                "profile": run.profile,
                "pgid": run.pgid,
                "url": run.url,
                "running": alive,
                "health": shown,
                "run_dir": str(run.run_dir),
            }
        )
    return rows
