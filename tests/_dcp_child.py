"""How the DCP drivers run: a child interpreter over one baked tree, and its gloo ranks.

- ``run_child(script, tree, ...)`` runs a driver with ``tree`` first on PYTHONPATH (so vLLM
  comes from the bake) and returns the JSON it prints after ``MARK``.
- ``fork_ranks(rank_fn, w, timeout_s)`` runs ``rank_fn(rank, store_path, outdir)`` in W
  forked processes over one real gloo group; each rank saves its results to
  ``outdir/rank{r}.pt``. Fork, not spawn: the ranks inherit the (slow) vLLM import and
  their own copy of any class-level state. A rank that fails or hangs fails the run.
- ``faster_interpreter()``: a driver's first call, before any kernel runs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parents[1]
MARK = "RESULT "  # a driver's last line: MARK + its JSON result


def faster_interpreter() -> None:
    """The emulation's Triton interpreter speed-ups (emulate/bakery_emulate/interpreter.py,
    same results: tests/emulate holds them to it; a candidate driver runs 1.4x faster).
    That one file is loaded, none of the emulation's stand-ins."""
    import importlib.util

    import triton.runtime.interpreter as interpreter

    path = REPO / "emulate" / "bakery_emulate" / "interpreter.py"
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
    proc = subprocess.run(
        command, env=child_env, capture_output=True, text=True, timeout=timeout, cwd=REPO
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(MARK)]
    if proc.returncode or not lines:
        raise RuntimeError(
            f"driver failed (rc {proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
        )
    return json.loads(lines[-1][len(MARK) :])


def rank_file(outdir: str, rank: int) -> str:
    return os.path.join(outdir, f"rank{rank}.pt")


def fork_ranks(rank_fn: Callable[[int, str, str], None], w: int, timeout_s: float) -> list[Any]:
    """What each of the W ranks saved, in rank order."""
    ctx = torch.multiprocessing.get_context("fork")
    with tempfile.TemporaryDirectory() as tmp:
        store = os.path.join(tmp, "store")
        procs = [ctx.Process(target=rank_fn, args=(r, store, tmp)) for r in range(w)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(timeout_s)
        bad = [(r, p.exitcode) for r, p in enumerate(procs) if p.exitcode != 0]
        for p in procs:
            if p.is_alive():
                p.kill()
        if bad:
            raise RuntimeError(f"gloo ranks failed (rank, exitcode): {bad}")
        return [torch.load(rank_file(tmp, r)) for r in range(w)]
