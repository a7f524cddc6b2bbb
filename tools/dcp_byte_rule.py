"""The stage-4 candidate exchange's byte rule, as a baked tree computes it (docs/gpu-dcp.md).

usage: python tools/dcp_byte_rule.py BAKED_TREE

Prints two Markdown tables from patch 01's own ``dcp_candidate_exchange_bytes`` (the wire
bytes a rank receives, by exchange) for the released DeepSeek-V4.1 config (2048
candidate blocks of 8 positions, 132-byte index keys, the candidate source at compress
ratio 1, the context split evenly over the W ranks):
- decode, per step: B rows at max_model_len 128k and 1M, and the exchange the rule picks;
- prefill, per 8k-row scheduler chunk at 128k and 1M context: vLLM's 512 MB logits budget
  splits it into sub-chunks (1024 rows at 128k, 128 at 1M); the index-K exchange gathers
  the chunk's keys once, the dense and sparse ones exchange every sub-chunk's rows.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lab.dcp.baked_kernels import load_file  # noqa: E402

CANDIDATES = "vllm/model_executor/kernels/attention/dsa/candidate_blocks.py"
TOPK_BLOCKS, BLOCK, KEY_BYTES = 2048, 8, 132
LOGITS_BUDGET = 512 * 1024 * 1024
CONTEXTS = {"128k": 128 * 1024, "1M": 1024 * 1024}
WORLDS = (2, 4, 8)
MB = 1e6


def tables(size_of) -> str:
    lines = ["Decode, per step (MB each rank receives):", ""]
    lines += ["| W | max_model_len | B | dense | sparse | picks |", "|---|---|---|---|---|---|"]
    for w in WORLDS:
        for label, ctx in CONTEXTS.items():
            for b in (1, 8, 32, 64):
                size = size_of(b, ctx // BLOCK, TOPK_BLOCKS, w)
                pick = min(size, key=size.__getitem__)
                lines.append(
                    f"| {w} | {label} | {b} | {size['dense'] / MB:.3f} | "
                    f"{size['sparse'] / MB:.3f} | {pick} |"
                )
    lines += ["", "Prefill, per 8k-row scheduler chunk (MB each rank receives):", ""]
    lines += [
        "| W | context | sub-chunks | dense | sparse | index-K (gathered once) | "
        "index-K if gathered per sub-chunk (before) | picks |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for w in WORLDS:
        for label, ctx in CONTEXTS.items():
            sub_rows = LOGITS_BUDGET // (ctx * 4)
            subs = -(-8192 // sub_rows)
            chunk = size_of(8192, ctx // BLOCK, TOPK_BLOCKS, w, ctx // w, KEY_BYTES)
            one_sub = size_of(sub_rows, ctx // BLOCK, TOPK_BLOCKS, w, ctx // w, KEY_BYTES)
            pick = min(chunk, key=chunk.__getitem__)
            lines.append(
                f"| {w} | {label} | {subs} x {sub_rows} rows | {chunk['dense'] / MB:.1f} | "
                f"{chunk['sparse'] / MB:.1f} | {chunk['index_k'] / MB:.1f} | "
                f"{subs * one_sub['index_k'] / MB:.1f} | {pick} |"
            )
    return "\n".join(lines)


def main() -> None:
    if len(sys.argv) != 2:
        raise SystemExit(__doc__.split("\n\n")[1])
    ns, _ = load_file(Path(sys.argv[1]), CANDIDATES, ["dcp_candidate_exchange_bytes"])
    print(tables(ns["dcp_candidate_exchange_bytes"]))


if __name__ == "__main__":
    main()
