"""How the DCP drivers run: a child interpreter over one baked tree, and its gloo ranks.

- ``run_child(script, tree, ...)`` runs a driver with ``tree`` first on PYTHONPATH (so vLLM
  comes from the bake) and returns the JSON it prints after ``MARK``.
- ``fork_ranks(rank_fn, w, timeout_s)`` runs ``rank_fn(rank, store_path, outdir)`` in W
  forked processes over one real gloo group; each rank saves its results to
  ``outdir/rank{r}.pt``. Fork, not spawn: the ranks inherit the (slow) vLLM import and
  their own copy of any class-level state. A rank that fails or hangs fails the run
  within ``timeout_s``, and no rank outlives the call. It is the one way the tests start
  ranks (tests/test_house.py holds that).
- ``faster_interpreter()``: a driver's first call, before any kernel runs.
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from multiprocessing.connection import wait
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parents[3]
MARK = "RESULT "  # a driver's last line: MARK + its JSON result
REAP_S = 10  # a SIGKILLed rank is reaped within this


def faster_interpreter() -> None:
    """The emulation's Triton interpreter speed-ups (lab/emulate/bakery_emulate/interpreter.py,
    same results: tests/lab/emulate holds them to it; a candidate driver runs 1.4x faster).
    That one file is loaded, none of the emulation's stand-ins."""
    import importlib.util

    import triton.runtime.interpreter as interpreter

    path = REPO / "lab" / "emulate" / "bakery_emulate" / "interpreter.py"
    spec = importlib.util.spec_from_file_location("_emulated_interpreter", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.speed_up(interpreter)


def run_child(
    script: str,
    tree: Path,
    args: Sequence[str] = (),
    env: dict[str, str] | None = None,
    timeout: float = 300,
    python_flags: Sequence[str] = (),
) -> dict:
    """Run ``script TREE ARGS`` in a child with ``tree`` first on PYTHONPATH; its result."""
    child_env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(tree), str(REPO)]),
        "OMP_NUM_THREADS": "1",
        "VLLM_LOGGING_LEVEL": "WARNING",
        **(env or {}),
    }
    command = [sys.executable, *python_flags, script, str(tree), *args]
    # A session of its own: on a timeout the driver and every rank it forked go together.
    proc = subprocess.Popen(
        command,
        env=child_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
        start_new_session=True,
    )
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_session(proc.pid)
        stdout, stderr = proc.communicate()
        raise RuntimeError(
            f"driver did not finish within {timeout:g} s (killed with its ranks):\n"
            f"{stdout[-3000:]}\n{stderr[-5000:]}"
        ) from None
    finally:
        kill_session(proc.pid)  # an interrupted wait, or ranks the driver left behind
    lines = [ln for ln in stdout.splitlines() if ln.startswith(MARK)]
    if proc.returncode or not lines:
        raise RuntimeError(
            f"driver failed (rc {proc.returncode}):\n{stdout[-3000:]}\n{stderr[-5000:]}"
        )
    return json.loads(lines[-1][len(MARK) :])


def session_members(sid: int) -> list[int]:
    """The pids whose session is ``sid`` (read from /proc: a rank may lead its own group)."""
    pids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError):
            # pid (comm) state ppid pgrp session ...: comm may hold spaces and parentheses
            fields = stat.read_text().rpartition(")")[2].split()
            if int(fields[3]) == sid and fields[0] != "Z":
                pids.append(int(stat.parent.name))
    return pids


def kill_session(sid: int) -> None:
    """SIGKILL every live process of session ``sid`` (a child started in a new session)."""
    for pid in session_members(sid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def rank_file(outdir: str, rank: int) -> str:
    return os.path.join(outdir, f"rank{rank}.pt")


def fork_ranks(rank_fn: Callable[[int, str, str], None], w: int, timeout_s: float) -> list[Any]:
    """What each of the W ranks saved, in rank order.

    One deadline bounds the whole run. Each rank leads its own process group; once a rank
    fails, the deadline passes, or this call is interrupted (pytest-timeout's alarm), every
    rank still alive is killed with its group and reaped before this returns or raises, and
    the error names each rank that failed or did not finish."""
    ctx = multiprocessing.get_context("fork")
    with tempfile.TemporaryDirectory() as tmp:
        store = os.path.join(tmp, "store")
        # daemon: an interpreter exiting past a missed kill terminates them, never waits.
        procs = [
            ctx.Process(target=_rank_main, args=(rank_fn, r, store, tmp), daemon=True)
            for r in range(w)
        ]
        try:
            for p in procs:
                p.start()
                _lead_group(p.pid)
            failed = _wait_all(procs, time.monotonic() + timeout_s)
        finally:
            killed = kill_ranks(procs)
        problems = [f"rank {r} exited with {procs[r].exitcode}" for r in failed]
        problems += [
            f"rank {r} did not finish within {timeout_s:g} s (killed)"
            if not failed
            else f"rank {r} was still running (killed)"
            for r in killed
        ]
        if problems:
            raise RuntimeError(f"DCP ranks failed (W={w}): " + "; ".join(problems))
        return [torch.load(rank_file(tmp, r), weights_only=False) for r in range(w)]


def _rank_main(rank_fn: Callable[[int, str, str], None], rank: int, store: str, out: str) -> None:
    _lead_group(0)
    rank_fn(rank, store, out)


def _lead_group(pid: int) -> None:
    """Make ``pid`` (0: this process) lead its own process group. Parent and child both
    call it, so the group exists before either one can be signalled."""
    with contextlib.suppress(PermissionError, ProcessLookupError):
        os.setpgid(pid, 0)


def _wait_all(procs: list[Any], deadline: float) -> list[int]:
    """Wait until every rank ended or the deadline passed; the ranks that exited non-zero
    (waiting stops at the first, since the others would wait for it in a collective)."""
    pending = {p.sentinel: r for r, p in enumerate(procs)}
    while pending and (left := deadline - time.monotonic()) > 0:
        for sentinel in wait(list(pending), left):
            rank = pending.pop(sentinel)
            procs[rank].join()
            if procs[rank].exitcode != 0:
                return [rank]
    return []


def kill_ranks(procs: list[Any]) -> list[int]:
    """SIGKILL every rank still alive with its process group, and reap it; their ranks."""
    alive = [r for r, p in enumerate(procs) if p.pid is not None and p.is_alive()]
    for r in alive:
        try:
            os.killpg(procs[r].pid, signal.SIGKILL)
        except ProcessLookupError:  # not its group's leader yet: the process alone
            procs[r].kill()
    for r in alive:
        procs[r].join(REAP_S)
    return alive
