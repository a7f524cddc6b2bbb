"""Run the baked tree's own DCP Triton kernels on a GPU, without vLLM, against the reference.

The device image has torch and Triton but no vLLM, and the kernels live in modules that
import ``vllm`` at module level. ``lab.dcp.baked_kernels`` loads them anyway: it picks the
needed top-level definitions out of the two baked files with ``ast`` and execs them under
the baked file's own path with the real Triton and stand-ins for vLLM's launch glue (see
its docstring); the tool asserts that each kernel's ``src`` is a verbatim slice of the file.

Checks (exit status 1 on any mismatch):

a. ``triton_filter_and_convert_dcp_index(..., return_valid_counts=True)`` against
   ``lab.dcp.reference.filter_and_convert`` for W in {2, 4}, K in {1, 2, 4}, page
   sizes {4, 16, 64}, every rank: counts equal, the compacted prefix equal as a set (the
   kernel documents its order as unspecified), the tail all -1;
b. the ``cp_lse_ag_out_rs`` correction (``correct_attn_out``) and the ``dcp_a2a_lse_reduce``
   pack/unpack-combine kernels, base-2 LSE (``is_lse_base_on_e=False``), with the
   collectives emulated on one GPU, against ``combine_ag_rs`` / ``combine_a2a``; empty
   rows carry LSE -1e30 and output 0, the reference's merge identity.

    python3 tools/gpu_triton_kernels.py build/baked-cpu --out "$OUT"   # one GPU

Writes gpu_triton_kernels.json and gpu_triton_kernels.md to --out (default $OUT).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import socket
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from bakery import markdown as md
from bakery.clock import MINUTE, utc_stamp
from lab.dcp import reference as ref
from lab.dcp.baked_kernels import DCP_OPS, SPARSE_UTILS, load_file

SPARSE_ROOTS = ("triton_filter_and_convert_dcp_index",)
DCP_ROOTS = (
    "mask_dcp_empty_shards_",
    "correct_attn_out",
    "_dcp_a2a_lse_pack_dim",
    "_dcp_a2a_send_recv_buffers",
    "_dcp_a2a_pack_send",
    "_dcp_a2a_unpack_combine",
)
# dtype -> (atol, rtol) on the output, as tools/gpu_dcp_bench.py's parity: bf16 partials
# are rounded before the rank sum, so a one-ulp flip can reach 1-2 ulps of a partial sum.
# The LSE is fp32 in both flavours.
OUT_TOL = {torch.float32: (1e-5, 1e-5), torch.bfloat16: (3e-2, 3e-2)}
LSE_TOL = (1e-4, 1e-6)


@dataclass
class Loaded:
    sparse: dict[str, Any]
    dcp: dict[str, Any]
    report: dict[str, Any]


def load(baked: Path) -> Loaded:
    sparse, sparse_report = load_file(baked, SPARSE_UTILS, SPARSE_ROOTS)
    dcp, dcp_report = load_file(baked, DCP_OPS, DCP_ROOTS)
    return Loaded(sparse, dcp, {SPARSE_UTILS: sparse_report, DCP_OPS: dcp_report})


# ---- check a: filter and convert --------------------------------------------


def _owned_by(gen: torch.Generator, rank: int, layout: ref.ShardLayout, hi: int, n: int):
    ids = torch.randperm(hi, generator=gen)
    ids = ids[ref.owner_rank(ids, layout.world_size, layout.interleave) == rank]
    return ids[:n]


def filter_rows(gen: torch.Generator, layout: ref.ShardLayout, topk: int, width: int):
    """Rows of global ids: random with -1 tail, full, empty, single-owner, off-table."""
    span = width * layout.page_size * layout.world_size  # ids the table covers
    w = layout.world_size
    rows = [ref.random_topk(gen, span, int(c), topk) for c in (topk // 3, topk, 1, 0)]
    for rank in (0, w - 1):
        row = torch.full((topk,), -1, dtype=torch.int32)
        own = _owned_by(gen, rank, layout, span, topk // 2)
        row[: own.numel()] = own.to(torch.int32)
        rows.append(row)
    # Past the table width: the kernel and the reference both drop these.
    rows.append(ref.random_topk(gen, 3 * span, topk // 2, topk))
    return torch.stack(rows)


def _compare_filter(out, counts, ref_out, ref_counts) -> dict[str, Any]:
    bad_rows = []
    stable = True
    for t in range(out.shape[0]):
        n = int(ref_counts[t])
        same = int(counts[t]) == n
        same &= torch.equal(out[t, :n].sort().values, ref_out[t, :n].sort().values)
        same &= bool((out[t, n:] == -1).all())
        stable &= torch.equal(out[t], ref_out[t])
        if not same:
            bad_rows.append(t)
    return {"bad_rows": bad_rows, "stable_order": stable}


def check_filter(ns, device, world: int, k: int, page: int, topk: int, seed: int):
    gen = torch.Generator().manual_seed(seed)
    layout = ref.ShardLayout(world, k, page)
    # Wide enough that a full row fits the table; small pages give many pages.
    width, reqs = max(3, -(-2 * topk // (page * world))), 2
    ids = filter_rows(gen, layout, topk, width)
    t = ids.shape[0]
    token_to_req = (torch.arange(t) % reqs).to(torch.int32)
    table = torch.randperm(reqs * width + 5, generator=gen)[: reqs * width]
    table = table.reshape(reqs, width).to(torch.int32)
    results = []
    for rank in range(world):
        ref_out, ref_counts = ref.filter_and_convert(ids, token_to_req, table, layout, rank)
        out, counts = ns["triton_filter_and_convert_dcp_index"](
            token_to_req.to(device),
            table.to(device),
            ids.to(device),
            dcp_size=world,
            dcp_rank=rank,
            cp_kv_cache_interleave_size=k,
            BLOCK_SIZE=page,
            NUM_TOPK_TOKENS=topk,
            BLOCK_N=min(128, topk),
            return_valid_counts=True,
        )
        cmp = _compare_filter(out.cpu(), counts.cpu(), ref_out, ref_counts)
        results.append({"rank": rank, **cmp, "valid": int(ref_counts.sum())})
    ok = all(not r["bad_rows"] for r in results)
    return {
        "W": world,
        "K": k,
        "page": page,
        "topk": topk,
        "rows": t,
        "ok": ok,
        "stable_order": all(r["stable_order"] for r in results),
        "ranks": results,
    }


def filter_cases() -> list[tuple[int, int, int, int]]:
    cases = [(w, k, p, 512) for w in (2, 4) for k in (1, 2, 4) for p in (4, 16, 64)]
    cases += [(2, 2, 16, 64), (4, 1, 64, 64)]
    # Past 4096 columns the kernel switches to multi-tile atomic compaction.
    cases += [(2, 1, 64, 8192)]
    return cases


# ---- check b: LSE correction and combine ------------------------------------


def random_parts(gen, world: int, t: int, h: int, d: int, dtype) -> list[ref.AttnOut]:
    """Per-rank partials over all gathered heads; some (row, rank) shards empty."""
    parts = []
    for rank in range(world):
        out = torch.randn(t, h * world, d, generator=gen).to(dtype)
        lse = torch.randn(t, h * world, generator=gen) * 4 + 8
        empty = torch.zeros(t, dtype=torch.bool)
        if t > 1:
            empty[rank % (t - 1)] = True  # this rank empty on one row
            empty[t - 1] = True  # the last row is empty on every rank
        if t > 2:
            lse[1] += 40.0 * (rank == 0)  # rank 0 dominates: others' weight underflows
        lse[empty] = ref.EMPTY_LSE
        out[empty] = 0
        parts.append(ref.AttnOut(out, lse))
    return parts


def _err(a: torch.Tensor, b: torch.Tensor, tol: tuple[float, float]) -> tuple[float, bool]:
    a, b = a.float().cpu(), b.float().cpu()
    same_inf = torch.equal(torch.isinf(a), torch.isinf(b)) and torch.equal(
        a[a.isinf()], b[b.isinf()]
    )
    fin = ~torch.isinf(b)
    diff = (a[fin] - b[fin]).abs()
    ok = same_inf and bool((diff <= tol[0] + tol[1] * b[fin].abs()).all())
    return (float(diff.max()) if diff.numel() else 0.0), ok and not a.isnan().any()


def kernel_ag_rs(ns, parts, mask=None) -> list[ref.AttnOut]:
    """``_cp_lse_common`` + ``reduce_scatter`` with the gather and the sum done locally."""
    world = len(parts)
    lses = []
    for p in parts:
        lse = p.lse.clone()
        if mask is not None:
            ns["mask_dcp_empty_shards_"](lse, *mask[len(lses)])
        lses.append(lse)
    gathered = torch.stack(lses)
    corrected, merged = [], None
    for rank, p in enumerate(parts):
        out, merged = ns["correct_attn_out"](
            p.out.clone(), gathered, rank, None, is_lse_base_on_e=False
        )
        corrected.append(out)
    total = corrected[0].clone()
    for c in corrected[1:]:
        total += c  # output dtype, rank order: what the reference's reduce does
    h = total.shape[1] // world
    return [
        ref.AttnOut(total[:, r * h : (r + 1) * h], merged[:, r * h : (r + 1) * h])
        for r in range(world)
    ]


def kernel_a2a(ns, parts, mask=None) -> list[ref.AttnOut]:
    """``dcp_a2a_lse_reduce`` with ``all_to_all_single`` done as a local transpose."""
    world = len(parts)
    t, hw, d = parts[0].out.shape
    h = hw // world
    pack = ns["_dcp_a2a_lse_pack_dim"](parts[0].out.dtype)
    sends = []
    for rank, p in enumerate(parts):
        send, _ = ns["_dcp_a2a_send_recv_buffers"](
            (world, t, h, d + pack), p.out.device, p.out.dtype
        )
        extra = {} if mask is None else dict(seq_lens=mask[rank][0], query_start_loc=mask[rank][1])
        ns["_dcp_a2a_pack_send"](p.out, p.lse, send, world, h, d, pack, **extra)
        sends.append(send)
    results = []
    for rank in range(world):
        recv = torch.stack([s[rank] for s in sends])
        out, lse = ns["_dcp_a2a_unpack_combine"](recv, d, pack, True, False)
        results.append(ref.AttnOut(out, lse))
    return results


def empty_shard_mask(world: int, t: int, device) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """seq_lens/query_start_loc per rank: request 1 has no KV on odd ranks; the last
    row is CUDA-graph padding past query_start_loc[-1]."""
    qsl = torch.tensor([0, t // 2, t - 1], dtype=torch.int32, device=device)
    return [
        (torch.tensor([5, 0 if r % 2 else 3], dtype=torch.int32, device=device), qsl)
        for r in range(world)
    ]


def masked_reference_parts(parts, mask) -> list[ref.AttnOut]:
    """What the mask means, written out row by row: an empty shard's LSE is -inf."""
    masked = []
    for p, (seq_lens, qsl) in zip(parts, mask, strict=True):
        lse = p.lse.clone()
        bounds = qsl.tolist()
        for row in range(lse.shape[0]):
            seq = sum(b <= row for b in bounds[1:-1])
            if row >= bounds[-1] or int(seq_lens[seq]) == 0:
                lse[row] = -math.inf
        masked.append(ref.AttnOut(p.out, lse))
    return masked


def check_combine(
    ns, device, flavour: str, world: int, t: int, h: int, dtype, masked: bool, seed: int
) -> dict[str, Any]:
    gen = torch.Generator().manual_seed(seed)
    parts = [
        ref.AttnOut(p.out.to(device), p.lse.to(device))
        for p in random_parts(gen, world, t, h, 512, dtype)
    ]
    mask = empty_shard_mask(world, t, device) if masked else None
    ref_parts = masked_reference_parts(parts, mask) if masked else parts
    expect = ref.run_spmd(world, lambda g: ref.COMBINES[flavour](g, ref_parts[g.rank_in_group]))
    got = (kernel_ag_rs if flavour == "ag_rs" else kernel_a2a)(ns, parts, mask)
    out_err, lse_err, ok = 0.0, 0.0, True
    for g, e in zip(got, expect, strict=True):
        eo, oko = _err(g.out, e.out, OUT_TOL[dtype])
        el, okl = _err(g.lse, e.lse, LSE_TOL)
        out_err, lse_err, ok = max(out_err, eo), max(lse_err, el), ok and oko and okl
    return {
        "combine": flavour,
        "W": world,
        "T": t,
        "heads_per_rank": h,
        "dtype": str(dtype).removeprefix("torch."),
        "masked": masked,
        "ok": ok,
        "max_abs_err_out": out_err,
        "max_abs_err_lse": lse_err,
        "tol_out": OUT_TOL[dtype],
        "tol_lse": LSE_TOL,
    }


def combine_cases():
    for flavour in ("ag_rs", "a2a"):
        for world in (2, 4):
            for dtype in (torch.float32, torch.bfloat16):
                for t, h in ((1, 16), (7, 4), (33, 16)):
                    yield flavour, world, t, h, dtype, False
                yield flavour, world, 8, 8, dtype, True


# ---- report -----------------------------------------------------------------


def environment(device: torch.device) -> dict[str, Any]:
    import triton

    env = {
        "host": socket.gethostname(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "python": sys.version.split()[0],
        "utc": utc_stamp(MINUTE),
    }
    if device.type == "cuda":
        env["gpu"] = torch.cuda.get_device_name(device)
    return env


def markdown(res: dict[str, Any]) -> str:
    env = res["environment"]
    lines = [
        f"# Baked Triton kernels: {env.get('gpu', 'cpu')}, {env['utc']}",
        "",
        f"torch {env['torch']}, Triton {env['triton']}; baked tree `{res['baked']}`.",
        "",
        "## Filter and convert",
        "",
        md.table(
            ("W", "K", "page", "topk", "rows", "pass", "same order"),
            [
                (
                    c["W"],
                    c["K"],
                    c["page"],
                    c["topk"],
                    c["rows"],
                    "yes" if c["ok"] else "NO",
                    "yes" if c["stable_order"] else "no",
                )
                for c in res["filter"]
            ],
        ),
        "",
        "## LSE correction and combine (base 2)",
        "",
    ]
    header = (
        "combine",
        "W",
        "T",
        "heads/rank",
        "dtype",
        "masked",
        "max abs err out",
        "max abs err LSE",
        "pass",
    )
    rows = [
        (
            c["combine"],
            c["W"],
            c["T"],
            c["heads_per_rank"],
            c["dtype"],
            "yes" if c["masked"] else "no",
            f"{c['max_abs_err_out']:.2e}",
            f"{c['max_abs_err_lse']:.2e}",
            "yes" if c["ok"] else "NO",
        )
        for c in res["combine"]
    ]
    lines.append(md.table(header, rows))
    lines += ["", f"Overall: {'PASS' if res['ok'] else 'FAIL'}", ""]
    return "\n".join(lines)


def run(baked: Path, device: torch.device) -> dict[str, Any]:
    loaded = load(baked)
    filt = [
        check_filter(loaded.sparse, device, w, k, p, tk, seed=i)
        for i, (w, k, p, tk) in enumerate(filter_cases())
    ]
    comb = [
        check_combine(loaded.dcp, device, *case, seed=i) for i, case in enumerate(combine_cases())
    ]
    verbatim = [v for r in loaded.report.values() for v in r["kernels_verbatim"].values()]
    ok = all(verbatim) and all(c["ok"] for c in filt + comb)
    return {
        "environment": environment(device),
        "baked": str(baked),
        "ok": ok,
        "loaded": loaded.report,
        "filter": filt,
        "combine": comb,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("baked", type=Path, help="baked tree root (holds vllm/)")
    ap.add_argument("--out", type=Path, default=os.environ.get("OUT"))
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args(argv)
    res = run(args.baked, torch.device(args.device))
    text = markdown(res)
    print(text)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "gpu_triton_kernels.json").write_text(json.dumps(res, indent=1) + "\n")
        (args.out / "gpu_triton_kernels.md").write_text(text)
    if not res["ok"]:
        print("MISMATCH: see the tables above", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
