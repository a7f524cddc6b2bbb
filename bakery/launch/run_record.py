"""The record each run leaves, and reading it back.

A run folder ``artifacts/dcp2/<profile>/<UTC timestamp>/`` holds serve_command.sh
(the exact vLLM command, re-runnable), run_environment.json (versions, baked tree,
GPUs, env), serve.log and, while the server lives, server.pid: the process group,
the leader's start time and its whole command line. ``lifecycle`` writes it at
start; stop, status and logs read it back.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import re
import shlex
import stat
import subprocess
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import msgspec

from bakery import __version__
from bakery.bake.manifest import MANIFEST, served
from bakery.clock import FOLDER, ISO, utc_stamp
from bakery.launch.errors import LaunchError, ProfileError
from bakery.launch.host import Gpu, ProbeAnswer
from bakery.launch.model_config import candidate_blocks
from bakery.launch.plan import LaunchPlan
from bakery.launch.preflight import Facts
from bakery.launch.processes import carries_marker, cmdline, launched, start_ticks
from bakery.launch.profiles import ENV_NAME
from bakery.schema import Document, Sha256, try_decode, try_decode_json, write_json_atomic
from bakery.tree import read_bounded, write_atomic

__all__ = [
    "Record",
    "Running",
    "PidRecord",
    "RunEnvironment",
    "read_environment",
    "new_record",
    "write_record",
    "write_pid",
    "recorded",
    "read_pid",
    "tail",
    "latest_log",
    "follow",
    "rebaked_under",
    "launcher_argv",
]

PID_FILE = "server.pid"
LOG_FILE = "serve.log"
TAIL_LINES = 40
_INHERITED = ("CUDA_", "NCCL_", "VLLM_", "HF_", "TORCH_", "OMP_", "GLOO_", "DSV41_", "RAY_")
_SECRET = ("TOKEN", "SECRET", "KEY", "PASSWORD", "CREDENTIAL")


@dataclass(frozen=True)
class Record:
    """One run's folder; its log and pid file live at fixed names inside."""

    run_dir: Path

    @property
    def log(self) -> Path:
        return self.run_dir / LOG_FILE

    @property
    def pid_file(self) -> Path:
        return self.run_dir / PID_FILE


class PidRecord(Document, frozen=True, kw_only=True):
    """server.pid, in the order it is written. A record from before the launcher kept
    the command line has none (``cmdline`` UNSET); one that says null is refused."""

    pgid: int
    start_ticks: int | None  # None: /proc could not tell
    cmdline: tuple[str, ...] | msgspec.UnsetType = msgspec.UNSET
    url: str | None = None
    profile: str = "?"
    run_dir: str = ""
    command: tuple[str, ...] = ()


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
        if self.cmdline is None:  # a record from before the launcher kept one: as then
            return True
        # A pid file can copy a process's start time and command line; not its environment.
        same = tuple(cmdline(self.pgid) or ()) == self.cmdline
        return same and carries_marker(self.pgid, self.run_dir)

    @property
    def alive(self) -> bool:
        return self.leader_verified or bool(launched(self.run_dir))


# ---- writing -------------------------------------------------------------------------


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


def command_script(plan: LaunchPlan, run_id: str) -> str:
    q = shlex.quote
    lines = [
        "#!/usr/bin/env bash",
        f"# {plan.profile.name}: the exact vLLM command of run {run_id}, re-runnable.",
        "# Inherited from the caller's environment (secrets left out):",
    ]
    bad = [k for k, _ in plan.env if not ENV_NAME.fullmatch(k)]
    if bad:  # the profile's check refuses these first; never write one into a script
        raise ProfileError(f"not a variable name (refused): {bad[0]!r}")
    inherited = {k: v for k, v in inherited_env().items() if ENV_NAME.fullmatch(k)}
    lines += [f"export {k}={q(v)}" for k, v in inherited.items()]
    lines += ["# Set by the launcher:"]
    lines += [f"export {k}={q(v)}" for k, v in plan.env]
    lines += [f"export BAKERY_LAUNCH_RUN={q(run_id)}", "set -euo pipefail"]
    lines += [f"cd {q(str(plan.cwd))}"]
    lines.append("exec " + " ".join(q(a) for a in plan.command))
    return "\n".join(lines) + "\n"


class Versions(msgspec.Struct, frozen=True, kw_only=True):
    python: str = ""
    bakery: str = ""
    vllm: str | None = None  # None: the probe did not tell
    torch: str | None = None


class RunBaked(msgspec.Struct, frozen=True, kw_only=True):
    """The BAKED.json that served (``path``) and what it named, or why it could not be
    read (``error``, the other fields then left out)."""

    path: str | None
    sha256: Sha256 | msgspec.UnsetType = msgspec.UNSET  # of BAKED.json's bytes
    series_sha256: Sha256 | msgspec.UnsetType = msgspec.UNSET
    series: str | msgspec.UnsetType = msgspec.UNSET
    base: str | msgspec.UnsetType = msgspec.UNSET
    error: str | msgspec.UnsetType = msgspec.UNSET


class RunEnvironment(msgspec.Struct, frozen=True, kw_only=True):
    """run_environment.json, in the order it is written. Read back by `restart` and
    `status` from run folders of any bakery version: a field it does not know is
    ignored, one it lacks takes its default; a field of the wrong type refuses the whole
    record (the readers then say so, or skip it)."""

    created_utc: str = ""
    profile: str = ""
    profile_source: str = ""
    profile_text: str = ""
    launcher_argv: tuple[str, ...] = ()
    host: str = ""
    versions: Versions = Versions()
    python: str = ""
    vllm_file: str | None = None
    baked: RunBaked | None = None
    gpus: tuple[Gpu, ...] | None = None  # None: not queried
    supported_heads: tuple[int, ...] | None = None
    candidate_source_layer_id: int | None = None
    dsv41: dict[str, str] = {}
    env_set: dict[str, str] = {}
    inherited_env: dict[str, str] = {}
    command: tuple[str, ...] = ()
    url: str | None = None


def _baked(plan: LaunchPlan, facts: Facts) -> RunBaked:
    path = facts.manifest or (plan.tree / MANIFEST if plan.tree else None)
    if path is None:
        return RunBaked(path=None, error="no BAKED.json found")
    try:
        raw = path.read_bytes()
    except OSError as exc:
        return RunBaked(path=str(path), error=exc.strerror or type(exc).__name__)
    bake, why = served(raw)
    if bake is None:
        return RunBaked(path=str(path), error=why)
    return RunBaked(
        path=str(path),
        sha256=hashlib.sha256(raw).hexdigest(),
        series_sha256=bake.series.sha256,
        series=bake.series.name,
        base=bake.base.requirement,
    )


def environment(plan: LaunchPlan, facts: Facts, argv: list[str]) -> RunEnvironment:
    probe = facts.probe or ProbeAnswer()
    server_env = {**os.environ, **dict(plan.env)}
    return RunEnvironment(
        created_utc=utc_stamp(ISO),
        profile=plan.profile.name,
        profile_source=str(plan.profile.source),
        profile_text=plan.profile.source.read_text(),
        launcher_argv=tuple(argv),
        host=platform.node(),
        versions=Versions(
            python=platform.python_version(),
            bakery=__version__,
            vllm=probe.vllm_version,
            torch=probe.torch_version,
        ),
        python=str(plan.python),
        vllm_file=probe.vllm_file,
        baked=_baked(plan, facts),
        gpus=facts.gpus,
        supported_heads=tuple(facts.heads) if facts.heads else None,
        candidate_source_layer_id=(
            candidate_blocks(facts.model_config) if facts.model_config else None
        ),
        dsv41={k: v for k, v in sorted(server_env.items()) if k.startswith("DSV41_")},
        env_set=dict(plan.env),
        inherited_env=inherited_env(),
        command=tuple(plan.command),
        url=None if plan.headless else plan.url,
    )


def write_record(record: Record, plan: LaunchPlan, facts: Facts, argv: list[str]) -> None:
    run_id = f"{plan.profile.name}/{record.run_dir.name}"
    script = command_script(plan, run_id).encode()
    write_atomic(record.run_dir / "serve_command.sh", script, mode=0o755)
    write_json_atomic(
        record.run_dir / "run_environment.json",
        environment(plan, facts, argv),
        ascii_only=True,
    )


def write_pid(record: Record, plan: LaunchPlan, proc: subprocess.Popen) -> None:
    assert isinstance(proc.args, list), proc.args  # _spawn passes an argv list
    data = PidRecord(
        pgid=proc.pid,
        start_ticks=start_ticks(proc.pid),
        cmdline=tuple(proc.args),
        url=None if plan.headless else plan.url,
        profile=plan.profile.name,
        run_dir=str(record.run_dir),
        command=tuple(plan.command),
    )
    write_json_atomic(
        record.pid_file, data, ascii_only=True
    )  # stop and status never read half a file


# ---- reading back ----------------------------------------------------------------------


def recorded(artifacts: Path, profile: str | None) -> list[Running]:
    """Every pid file under ``artifacts`` (``artifacts/<profile>/<stamp>/server.pid``)."""
    pattern = f"{profile or '*'}/*/{PID_FILE}"
    # Resolved: the run marker in each process holds the absolute run folder.
    return [read_pid(path) for path in sorted(Path(artifacts).resolve().glob(pattern))]


def read_pid(path: Path) -> Running:
    try:
        data = json.loads(read_bounded(path, 1 << 20))  # a FIFO never hangs it
    except (OSError, ValueError, RecursionError) as exc:
        why = getattr(exc, "strerror", None) or f"{type(exc).__name__}: {exc}"
        return Running(path, -1, -1, None, path.parent.parent.name, error=why[:200])
    pid, problems = try_decode(data, PidRecord)
    if pid is None:
        why = "; ".join(problems)
        return Running(path, -1, -1, None, path.parent.parent.name, error=why[:200])
    return Running(
        path,
        pid.pgid,
        pid.start_ticks or -1,
        pid.url,
        pid.profile,
        None if isinstance(pid.cmdline, msgspec.UnsetType) else pid.cmdline,
    )


def read_environment(run_dir: Path) -> tuple[RunEnvironment | None, str]:
    """A run folder's run_environment.json, or ``(None, why)`` in one short line (a
    missing, unreadable, garbled or mistyped record)."""
    try:
        raw = read_bounded(run_dir / "run_environment.json", 4 << 20)
    except OSError as exc:
        return None, exc.strerror or type(exc).__name__
    return try_decode_json(raw, RunEnvironment)


def launcher_argv(run_dir: Path) -> list[str]:
    """The `start ...` arguments a run was launched with (for `restart`)."""
    path = run_dir / "run_environment.json"
    env, why = read_environment(run_dir)
    argv = env.launcher_argv if env is not None else ()
    if "start" in argv:
        return list(argv[argv.index("start") :])
    raise LaunchError(
        f"cannot tell how the run was started ({why or 'it holds no `start` command'}): "
        f"{str(path)!r}",
        hint="stop it with `run.sh stop`, then `run.sh start --profile NAME ...`",
    )


def rebaked_under(run_dir: Path) -> str | None:
    """Why the tree a run serves is no longer the series it started with (a re-bake or
    re-install under the running server), else None. The BAKED.json read is the one
    run_environment.json names, only when it is that file name: never another path."""
    env, _ = read_environment(run_dir)
    baked = env.baked if env is not None else None
    if baked is None or baked.path is None or isinstance(baked.series_sha256, msgspec.UnsetType):
        return None  # an old or damaged record: nothing to compare
    then, path = baked.series_sha256, Path(baked.path)
    if path.name != MANIFEST:
        return None
    try:
        now, why = served(read_bounded(path))
    except FileNotFoundError:
        return f"it serves series {then[:8]}; {path} is gone"
    except OSError as exc:
        now, why = None, exc.strerror or type(exc).__name__
    if now is None:
        return f"it serves series {then[:8]}; {path} is unreadable ({why})"
    if now.series.sha256 == then:
        return None
    return f"it serves series {then[:8]}, {path.parent} now holds {now.series.sha256[:8]}"


MAX_TAIL = 100_000  # lines `logs -n` shows at most
_TAIL_BYTES = 8 << 20  # read from the end of a log, however long it grew
# Terminal control bytes a log may hold (ESC sequences recolour or retitle the terminal):
# shown as "?" so a log cannot drive the terminal that reads it. Tab and newline stay.
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def printable(text: str) -> str:
    return _CONTROL.sub("?", text)


def _open_log(path: Path) -> BinaryIO | str:
    """``path`` opened for reading, or why it is no log. Opened non-blocking, so a FIFO or
    a device in its place never hangs it."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        return f"(no log: {exc.strerror})"
    handle = os.fdopen(fd, "rb")
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        handle.close()
        return "(no log: not a regular file)"
    return handle


def _last_lines(handle: BinaryIO, lines: int) -> str:
    """The last ``lines`` lines (at most ``MAX_TAIL``) up to where the read stops, which
    leaves ``handle`` there; control bytes shown as "?"."""
    handle.seek(max(0, os.fstat(handle.fileno()).st_size - _TAIL_BYTES))
    text = handle.read(_TAIL_BYTES).decode(errors="replace")
    kept = deque(text.splitlines(keepends=True), maxlen=min(lines, MAX_TAIL))
    return printable("".join(kept).rstrip()) if lines else ""


def tail(path: Path, lines: int = TAIL_LINES) -> str:
    """The last ``lines`` lines of a log (at most ``MAX_TAIL``), control bytes shown as "?"."""
    opened = _open_log(path)
    if isinstance(opened, str):
        return opened
    with opened:
        return _last_lines(opened, lines)


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
    """Write the last ``lines`` of ``log``, then what is appended while the run lives: read
    on from where the last lines were read, so a line written meanwhile is not lost."""
    opened = _open_log(log)
    if isinstance(opened, str):
        write(opened + "\n")
        return
    run_dir = log.parent
    with opened as handle:
        write(_last_lines(handle, lines) + "\n")
        while True:
            chunk = handle.read(1 << 20)
            if chunk:
                write(printable(chunk.decode(errors="replace")))
            elif not launched(run_dir):
                return  # the run is over and its log fully shown
            else:
                time.sleep(poll_s)
