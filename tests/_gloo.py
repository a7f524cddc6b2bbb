"""W ranks over one real gloo group, forked after the drivers' (slow) vLLM import.

``fork_ranks(rank_fn, w, timeout_s)`` runs ``rank_fn(rank, store_path, outdir)`` in W
forked processes; each rank saves its results to ``outdir/rank{r}.pt`` with torch.save.
Fork, not spawn: the ranks inherit the imported baked tree (and their own copy of any
class-level state). A rank that fails or hangs fails the whole run.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from typing import Any

import torch


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
