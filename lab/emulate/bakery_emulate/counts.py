"""What the run exercised, per process: indexer scoring calls, candidate-block
publishes (and how many took patch 06's index-K exchange, and its gathers on a rank that
held no key of the chunk), the compressed positions candidate filtering removed, the
model steps that held more than one request, and a digest of every sliding-window KV
row written (target and draft layers: replicated under DCP, so every rank's must agree).

Written as ``emulate/<pid>.json`` under the launcher's run folder
($BAKERY_LAUNCH_DIR) after every update, so the parity matrix can show that a pass
ran the indexer and filtered candidates. Nothing is written outside a launcher run.
"""

from __future__ import annotations

import inspect
import json
import os
from pathlib import Path

import torch

COUNTS = {
    "indexer_calls": 0,
    "candidate_publishes": 0,
    "index_k_publishes": 0,
    "candidate_masked_positions": 0,
    "index_k_keyless_gathers": 0,
    "multi_request_steps": 0,
    "swa_kv_digest": 0,
}
# Summed modulo a prime, so the order of the writes does not matter and the sum stays
# an int64 (JSON and msgspec read it exactly).
DIGEST_MOD = (1 << 61) - 1
_RANKS: dict[str, int] = {}


def _target() -> Path | None:
    run = os.environ.get("BAKERY_LAUNCH_DIR")
    return Path(run) / "emulate" / f"{os.getpid()}.json" if run else None


def _ranks() -> dict[str, int]:
    if not _RANKS:
        from vllm.distributed import get_dcp_group, get_tp_group

        _RANKS.update(
            tp_rank=get_tp_group().rank_in_group,
            dcp_rank=get_dcp_group().rank_in_group,
            dcp_world_size=get_dcp_group().world_size,
        )
    return _RANKS


def bump(**counts: int) -> None:
    for key, value in counts.items():
        COUNTS[key] += value
    COUNTS["swa_kv_digest"] %= DIGEST_MOD
    target = _target()
    if target is None:
        return
    target.parent.mkdir(exist_ok=True)
    tmp = target.with_suffix(".tmp")
    tmp.write_text(json.dumps({**_ranks(), **COUNTS}))
    os.replace(tmp, target)


def counted_scoring(fn):
    def scoring(*args, **kwargs):
        bump(indexer_calls=1)
        return fn(*args, **kwargs)

    return scoring


def counted_candidate_step(step):
    """``_candidate_step`` that also counts its publishes (and those by the index-K
    exchange) and the positions its mask removed."""

    signature = inspect.signature(step)

    def candidate_step(logits, *args, **kwargs):
        given = signature.bind(logits, *args, **kwargs).arguments  # by name, however passed
        if given["write"]:
            step(logits, *args, **kwargs)
            index_k = given.get("index_k")  # patch 06's index-K exchange (prefill)
            bump(candidate_publishes=1, index_k_publishes=int(index_k is not None))
            return
        finite = torch.isfinite(logits).sum().item()
        step(logits, *args, **kwargs)
        bump(candidate_masked_positions=int(finite - torch.isfinite(logits).sum().item()))

    return candidate_step


def counted_index_k_keys(gather):
    """Patch 06's ``_dcp_index_k_keys`` that also counts the gathers this rank joined
    holding no key of the chunk (issue 33's crash: it raised there)."""

    def index_k_keys(k_quant, k_scale, chunk, *args, **kwargs):
        keys = gather(k_quant, k_scale, chunk, *args, **kwargs)
        bump(index_k_keyless_gathers=int(chunk.local_total_seq_lens == 0))
        return keys

    return index_k_keys


def counted_steps(execute_model):
    """The model runner's ``execute_model`` that counts the steps scheduling more than
    one request (a batch: prefills and decodes of several requests in one forward)."""

    def counted(self, scheduler_output, *args, **kwargs):
        real = not kwargs.get("dummy_run", False)  # warmup and profile runs are not steps
        if real and len(scheduler_output.num_scheduled_tokens) > 1:
            bump(multi_request_steps=1)
        return execute_model(self, scheduler_output, *args, **kwargs)

    return counted
