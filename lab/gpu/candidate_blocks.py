"""Stage 4 on GPUs: the baked candidate-block kernels over NCCL, against DCP1 and the reference.

No vLLM on the device: patch 01's ``candidate_blocks.py`` is read from a baked tree and its
definitions are exec'd with the real Triton (``lab.gpu.triton_kernels``' extraction,
kernels verified verbatim). W ranks are spawned (NCCL on ``cuda``; gloo with
``TRITON_INTERPRET=1`` on ``cpu``, a dry run). Every rank builds the same global logits, takes
its own columns (interleave K in state units) and, per case:

- DCP1: the baked ``select_candidate_blocks`` / ``apply_candidate_mask`` on the full logits;
- DCP W: ``select_candidate_blocks_dcp`` (``dist.all_reduce(MAX)`` over the group) and
  ``apply_candidate_mask_dcp`` on its columns.

Checks (exit 1 on any failure): the candidates are identical on every rank and equal to the
DCP1 kernel's (exactly), equal to ``lab.dcp.reference`` up to ties at the selection
boundary (rows where torch.topk picked other tied blocks than the lowest ids are counted),
and the consumer mask equals DCP1's on the rank's columns (bit for bit, NaN included).
fp32 and bf16 logits, decode rows (``max_model_len`` wide, 2048 blocks of 8, as the released
DeepSeek-V4.1 config) with padding rows, prefill chunks of packed causal rows, ties, -inf
rows and NaN. Timings: DCP1 select vs DCP select (median ms), and on CUDA a CUDA-graph
capture + replay of the DCP decode select with its all-reduce.

    python3 tools/gpu_candidate_blocks.py build/baked-cpu --world-size 2 --out "$OUT"
    TRITON_INTERPRET=1 .venv/bin/python -O tools/gpu_candidate_blocks.py build/baked-cpu \
        --device cpu --quick --out /tmp/cand    # dry run; -O: DCP1 asserts logits.is_cuda

Writes gpu_candidate_blocks.json and gpu_candidate_blocks.md to --out.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import threading
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from bakery import markdown as md
from lab.dcp import ranks
from lab.dcp import reference as ref
from lab.dcp.baked_kernels import load_file
from lab.gpu import triton_kernels as gtk

CANDIDATES = "vllm/model_executor/kernels/attention/dsa/candidate_blocks.py"
ROOTS = (
    "select_candidate_blocks",
    "apply_candidate_mask",
    "select_candidate_blocks_dcp",
    "apply_candidate_mask_dcp",
    "dcp_candidate_exchange_bytes",
    "_block_scores_kernel",
    "_dcp_block_keys_kernel",
)


@dataclass(frozen=True)
class Case:
    kind: str  # "decode" or "prefill"
    k: int  # interleave, state units
    bs: int  # candidate_block_size
    topk_blocks: int
    lens: tuple[int, ...]  # per request (decode: one row each; prefill: causal rows)
    width: int = 0  # decode: logits width (max_model_len in states)
    rows_per_req: int = 4
    pad: int = 0
    dtype: str = "float32"
    seed: int = 0


def cases(quick: bool, dtypes: tuple[str, ...] = ("float32", "bfloat16")) -> list[Case]:
    out = []
    for dtype in dtypes:
        if quick:
            out += [
                Case("decode", 1, 8, 16, (300, 5, 1, 77), width=384, pad=2, dtype=dtype),
                Case("decode", 2, 5, 8, (97, 40), width=128, dtype=dtype, seed=1),
                Case("prefill", 2, 8, 8, (150, 3, 60), rows_per_req=3, dtype=dtype, seed=2),
            ]
            continue
        out += [
            # the released config: 2048 blocks of 8 over a 64K-state context
            Case(
                "decode",
                1,
                8,
                2048,
                (65536, 40000, 16385, 7, 1) * 6,
                width=65536,
                pad=3,
                dtype=dtype,
            ),
            Case(
                "decode",
                2,
                8,
                2048,
                (65536, 30000, 9000, 2) * 4,
                width=65536,
                pad=1,
                dtype=dtype,
                seed=1,
            ),
            Case("decode", 2, 5, 512, (4099, 1000, 3), width=4099, dtype=dtype, seed=2),
            Case("prefill", 2, 8, 2048, (20000, 17, 3000), rows_per_req=8, dtype=dtype, seed=3),
            Case("prefill", 1, 3, 64, (900, 1, 64), rows_per_req=5, dtype=dtype, seed=4),
        ]
    if not quick:  # decode at a 1M-position max_model_len: the exchange follows the width
        out.append(
            Case("decode", 2, 8, 2048, (1 << 20, 300000, 5000, 1) * 2, width=1 << 20, seed=5)
        )
        # a batch of 64 live contexts far below a 1M width: what the live-context bound buys
        out.append(
            Case("decode", 2, 8, 2048, (65536, 16384, 4096, 1000) * 16, width=1 << 20, seed=6)
        )
    return out


def local_count(ends: torch.Tensor, rank: int, w: int, k: int) -> torch.Tensor:
    """Positions below ``ends`` that ``rank`` owns (vLLM's get_dcp_local_seq_lens)."""
    base = (ends // k // w) * k
    return base + (ends - base * w - rank * k).clamp(0, k)


def build(case: Case, rank: int, w: int) -> dict[str, Any]:
    """Global request-frame logits and this rank's packed local view (w=1: DCP1's)."""
    gen = torch.Generator().manual_seed(case.seed)
    k = case.k if w > 1 else 1
    lens = torch.tensor(case.lens)
    if case.kind == "decode":
        req = torch.arange(len(case.lens))
        ends = lens.clone()
    else:
        req = torch.cat(
            [torch.full((min(case.rows_per_req, n),), j) for j, n in enumerate(case.lens)]
        )
        ends = torch.cat(
            [torch.arange(max(1, n - case.rows_per_req + 1), n + 1) for n in case.lens]
        )
    req = torch.cat([req, torch.zeros(case.pad, dtype=torch.long)])
    ends = torch.cat([ends, torch.zeros(case.pad, dtype=torch.long)])
    rows, maxlen = len(ends), max(max(case.lens), case.width)
    # quantized values: ties everywhere; -inf rows; a little NaN
    frame = torch.randint(-40, 40, (rows, maxlen), generator=gen).float() / 8
    frame[1::7] = -math.inf
    frame[torch.rand(frame.shape, generator=gen) < 1e-3] = math.nan
    frame = frame.to(getattr(torch, case.dtype))
    garbage = torch.Generator().manual_seed(case.seed + 7 + rank)
    if case.kind == "decode":
        pos = torch.arange(case.width)
        mine = ref.owner_rank(pos, w, k) == rank
        gmap = pos[mine]  # local column -> global position
        packed = (torch.randn(rows, case.width, generator=garbage) * 100).to(frame.dtype)
        packed[:, : gmap.numel()] = frame[:, gmap]
        ks = None
        ke = local_count(ends, rank, w, k)
        global_width = case.width
    else:
        cu = torch.cat([torch.zeros(1, dtype=torch.long), lens.cumsum(0)])
        llens = local_count(lens, rank, w, k)
        lcu = torch.cat([torch.zeros(1, dtype=torch.long), llens.cumsum(0)])
        packed = (torch.randn(rows, int(lcu[-1]), generator=garbage) * 100).to(frame.dtype)
        gmap = torch.empty(int(lcu[-1]), dtype=torch.long)
        for j, n in enumerate(case.lens):
            p = torch.arange(n)
            p = p[ref.owner_rank(p, w, k) == rank]
            gmap[lcu[j] : lcu[j + 1]] = p
            packed[:, lcu[j] : lcu[j + 1]] = frame[:, p]
        ks = lcu[req]
        ke = ks + local_count(ends, rank, w, k)
        global_width = int(cu[-1])
    return {
        "frame": frame,
        "ends": ends,
        "req": req,
        "packed": packed,
        "gmap": gmap,
        "ks": None if ks is None else ks.to(torch.int32),
        "ke": ke.to(torch.int32),
        "global_width": global_width,
    }


def expected_local(case: Case, masked1: torch.Tensor, d1: dict, d: dict) -> torch.Tensor:
    """DCP1's masked logits on this rank's columns inside each row's bounds; outside
    them the rank's input, untouched (patch 01's mask walks only the row's columns).

    Local column ``c`` is request position ``gmap[c]``; in DCP1's packed logits that is
    column ``row start + gmap[c]`` (decode rows start at 0).
    """
    zeros = torch.zeros_like(d["ke"])
    start = zeros if d["ks"] is None else d["ks"]
    g_start = zeros if d1["ks"] is None else d1["ks"]
    n = d["gmap"].numel()
    cols = torch.arange(n)
    idx = (g_start[:, None].long() + d["gmap"][None, :]).clamp(0, masked1.shape[1] - 1)
    valid = (cols[None, :] >= start[:, None]) & (cols[None, :] < d["ke"][:, None])
    want = d["packed"].to(masked1.dtype)  # a copy when the dtypes differ
    want = want.clone() if want is d["packed"] else want
    want[:, :n] = torch.where(valid, masked1.gather(1, idx), want[:, :n])
    return want


def reference_masked_packed(case: Case, d1: dict, cands: torch.Tensor) -> torch.Tensor:
    """DCP1's consumer mask from the reference, laid out as DCP1's packed logits."""
    masked = ref.mask_candidates_dcp1(d1["frame"].float(), d1["ends"], cands, case.bs)
    out = torch.full(d1["packed"].shape, -math.inf)
    starts = [0] * len(d1["ends"]) if d1["ks"] is None else d1["ks"].tolist()
    for i, (start, end) in enumerate(zip(starts, d1["ends"].tolist(), strict=True)):
        out[i, start : start + end] = masked[i, :end]
    return out.to(d1["packed"].dtype)


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.equal(a.isnan(), b.isnan()) and torch.equal(a.nan_to_num(), b.nan_to_num())


def up_to_ties(got: torch.Tensor, case: Case, d: dict) -> tuple[bool, int]:
    """Reference sets, up to boundary ties; and rows whose tie choice was not lowest-id."""
    want = ref.candidate_blocks_dcp1(d["frame"].float(), d["ends"], case.topk_blocks, case.bs)
    nblocks = -(-d["frame"].shape[1] // case.bs)
    scores = ref.block_maxima(d["frame"].float(), d["ends"], case.bs, nblocks)
    for i, e in enumerate(d["ends"].tolist()):
        if e:
            scores[i, (e - 1) // case.bs] = math.inf
    ok, other_ties = True, 0
    for i in range(got.shape[0]):
        g = {b for b in got[i].tolist() if b >= 0}
        wnt = {b for b in want[i].tolist() if b >= 0}
        if g == wnt:
            continue
        edge = min(scores[i, b].item() for b in wnt)
        if len(g) == len(wnt) and all(scores[i, b].item() == edge for b in g ^ wnt):
            other_ties += 1
        else:
            ok = False
    return ok, other_ties


def median_ms(fn, device: torch.device, reps: int = 20) -> float:
    if device.type != "cuda":
        return float("nan")
    for _ in range(3):
        fn()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return sorted(times)[len(times) // 2]


def run_case(ns, case: Case, rank: int, w: int, device: torch.device) -> dict[str, Any]:
    def all_reduce_max(x: torch.Tensor) -> None:
        dist.all_reduce(x, op=dist.ReduceOp.MAX)

    def dev(t):
        return None if t is None else t.to(device)

    d1, d = build(case, 0, 1), build(case, rank, w)
    rows = d["ends"].numel()
    # DCP1, the upstream functions on the full logits
    g1, ks1, ke1 = dev(d1["packed"]), dev(d1["ks"]), dev(d1["ke"])
    c1 = torch.full((rows, case.topk_blocks), 99, dtype=torch.int32, device=device)
    # vLLM's indexer logits are fp32; DCP1's block-max kernel does not compile for bf16
    # (tt.reduce type mismatch, Triton 3.6), so its bf16 baseline runs on the exact upcast.
    g1_select = g1.float()
    ns["select_candidate_blocks"](g1_select.clone(), ks1, ke1, case.topk_blocks, case.bs, c1)
    if device.type == "cuda":
        m1 = g1.clone()
        ns["apply_candidate_mask"](m1, ks1, ke1, c1, case.bs)
        mask_baseline = "dcp1_kernel"
    else:  # Triton 3.9's interpreter refuses DCP1's negated-bool store mask
        m1 = reference_masked_packed(case, d1, c1.cpu())
        mask_baseline = "reference"
    # DCP W on this rank's columns
    loc, ks, ke = dev(d["packed"]), dev(d["ks"]), dev(d["ke"])
    cw = torch.full_like(c1, 99)

    def all_gather(x: torch.Tensor) -> torch.Tensor:
        out = x.new_empty((w * x.shape[0], *x.shape[1:]))
        dist.all_gather_into_tensor(out, x.contiguous())
        return out.view(w, *x.shape)

    def select(exchange: str | None = None, into: torch.Tensor | None = None):
        ns["select_candidate_blocks_dcp"](
            loc,
            ks,
            ke,
            case.topk_blocks,
            case.bs,
            cw if into is None else into,
            d["global_width"],
            rank,
            w,
            case.k,
            all_reduce_max,
            1,
            all_gather,
            exchange,
        )

    select("dense")
    sparse = torch.full_like(c1, 99)
    select("sparse", sparse)
    mw = loc.clone()
    ns["apply_candidate_mask_dcp"](mw, ks, ke, cw, case.bs, d["global_width"], rank, w, case.k)
    gathered = [torch.empty_like(cw) for _ in range(w)]
    dist.all_gather(gathered, cw)
    ref_ok, other_ties = up_to_ties(cw.cpu(), case, d)
    want = expected_local(case, m1.cpu(), d1, d)
    res = {
        **asdict(case),
        "lens": list(case.lens)[:6],
        "rows": rows,
        "W": w,
        "rank": rank,
        "same_on_every_rank": all(torch.equal(g, cw) for g in gathered),
        "eq_dcp1_kernel": torch.equal(cw, c1),
        # CPU torch.topk takes other tied blocks than CUDA's (the lower ids), which the
        # sparse merge reproduces: exact on CUDA, the reference up to ties on CPU
        "sparse_eq_dcp1": torch.equal(sparse, c1)
        if device.type == "cuda"
        else up_to_ties(sparse.cpu(), case, d)[0],
        "eq_reference_up_to_ties": ref_ok,
        "rows_tie_not_lowest_id": other_ties,
        "mask_eq_dcp1": same_bits(mw.cpu(), want),
        "mask_baseline": mask_baseline,
        "ms_dcp1_select": median_ms(
            lambda: ns["select_candidate_blocks"](
                g1_select, ks1, ke1, case.topk_blocks, case.bs, c1
            ),
            device,
        ),
        "ms_dcp_select": median_ms(lambda: select("dense"), device),
        "ms_dcp_sparse_select": median_ms(lambda: select("sparse", sparse), device),
    }
    res["ok"] = all(
        res[k]
        for k in (
            "same_on_every_rank",
            "eq_dcp1_kernel",
            "sparse_eq_dcp1",
            "eq_reference_up_to_ties",
            "mask_eq_dcp1",
        )
    )
    if device.type == "cuda" and case.kind == "decode":
        res["graph_replay_ok"] = graph_check(select, cw, loc)
        res["ok"] &= res["graph_replay_ok"] is True
    return res


def graph_check(select, out: torch.Tensor, loc: torch.Tensor) -> bool | str:
    """Capture the DCP decode select (all-reduce included), replay it on other logits,
    and compare with an eager run on those logits."""
    try:
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            select()  # warm up on the side stream
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            select()
        loc.copy_(torch.roll(loc, 1, dims=0))  # other rows under the same bounds
        out.fill_(99)
        graph.replay()
        replayed = out.clone()
        select()
        torch.cuda.synchronize()
        return bool(torch.equal(replayed, out))
    except Exception as exc:  # reported, and fails the case
        return f"{type(exc).__name__}: {exc}"[:300]


def worker(rank: int, w: int, port: int, args: argparse.Namespace) -> None:
    device = ranks.join(rank, w, port, cuda=args.device == "cuda")
    cuda = device.type == "cuda"
    try:
        ns, report = load_file(Path(args.baked), CANDIDATES, ROOTS)
        verbatim = report["kernels_verbatim"]
        results = []
        # Triton 3.9's interpreter computes bf16 block maxima wrongly (even DCP1's
        # upstream kernel), so the CPU dry run is fp32 only.
        dtypes = ("float32", "bfloat16") if cuda else ("float32",)
        for case in cases(args.quick, dtypes):
            try:
                results.append(run_case(ns, case, rank, w, device))
            except Exception as exc:
                results.append(
                    {
                        **asdict(case),
                        "rank": rank,
                        "ok": False,
                        "error": f"{type(exc).__name__}: {exc}"[:400],
                    }
                )
        all_res: list[Any] = [None] * w
        dist.all_gather_object(all_res, results)
        if rank == 0:
            write(args, w, device, verbatim, [r for per in all_res for r in per])
    finally:
        dist.destroy_process_group()


def markdown(res: dict[str, Any]) -> str:
    env = res["environment"]
    lines = [
        f"# Stage 4 candidate blocks: W={res['W']}, {env.get('gpu', 'cpu')}, {env['utc']}",
        "",
        f"torch {env['torch']}, Triton {env['triton']}; baked tree `{res['baked']}`; "
        f"kernels verbatim: {all(res['kernels_verbatim'].values())}.",
        "",
    ]
    header = (
        "kind",
        "dtype",
        "K",
        "B",
        "topk blocks",
        "rows",
        "rank",
        "same on ranks",
        "== DCP1 kernel",
        "== reference (ties)",
        "other-tie rows",
        "mask == DCP1",
        "graph",
        "DCP1 ms",
        "DCP ms",
        "pass",
    )
    rows: list[tuple[object, ...]] = []
    yes = {True: "yes", False: "NO"}
    for c in res["cases"]:
        case = (c["kind"], c["dtype"], c["k"], c["bs"], c["topk_blocks"])
        if "error" in c:  # the error fills the row, so the table keeps its shape
            rows.append((*case, "", c["rank"], f"error: {c['error']}", *[""] * 8))
            continue
        rows.append(
            (
                *case,
                c["rows"],
                c["rank"],
                yes[c["same_on_every_rank"]],
                yes[c["eq_dcp1_kernel"]],
                yes[c["eq_reference_up_to_ties"]],
                c["rows_tie_not_lowest_id"],
                yes[c["mask_eq_dcp1"]],
                c.get("graph_replay_ok", "-"),
                f"{c['ms_dcp1_select']:.3f}",
                f"{c['ms_dcp_select']:.3f}",
                yes[c["ok"]],
            )
        )
    lines.append(md.table(header, rows))
    lines += ["", f"Overall: {'PASS' if res['ok'] else 'FAIL'}", ""]
    return "\n".join(lines)


def write(args, w: int, device: torch.device, verbatim: dict, results: list) -> None:
    res = {
        "environment": gtk.environment(device),
        "baked": str(args.baked),
        "W": w,
        "kernels_verbatim": verbatim,
        # Under TRITON_INTERPRET the interpreter rewrites the kernels' code objects, so
        # the verbatim check only binds on a real (GPU) run.
        "ok": (all(verbatim.values()) or device.type != "cuda") and all(r["ok"] for r in results),
        "cases": results,
    }
    if device.type == "cuda":
        res["environment"]["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "gpu_candidate_blocks.json").write_text(json.dumps(res, indent=1, default=str))
    text = markdown(res)
    (out / "gpu_candidate_blocks.md").write_text(text)
    print(text, flush=True)


# ---- one GPU: W ranks as threads (collectives emulated), signed zero, bytes ----------


def emulated_ranks(ns, case: Case, w: int, device: torch.device) -> dict[str, Any]:
    """Every rank's dense and sparse candidates (``run_spmd`` threads on one device)."""

    def rank_fn(group):
        d = build(case, group.rank_in_group, w)

        def all_gather(x: torch.Tensor) -> torch.Tensor:
            return group.all_gather(x[None], dim=0)

        def all_reduce_max(x: torch.Tensor) -> None:
            x.copy_(all_gather(x).amax(0))

        out, on_device = {}, {}
        for exchange in ("dense", "sparse"):
            c = torch.full((d["ends"].numel(), case.topk_blocks), 99, dtype=torch.int32)
            c = c.to(device)
            ns["select_candidate_blocks_dcp"](
                d["packed"].to(device),
                None if d["ks"] is None else d["ks"].to(device),
                d["ke"].to(device),
                case.topk_blocks,
                case.bs,
                c,
                d["global_width"],
                group.rank_in_group,
                w,
                case.k,
                all_reduce_max,
                1,
                all_gather,
                exchange,
            )
            out[exchange] = c.cpu()
            on_device[exchange] = c
        masked = d["packed"].to(device)
        ns["apply_candidate_mask_dcp"](
            masked,
            None if d["ks"] is None else d["ks"].to(device),
            d["ke"].to(device),
            on_device["dense"],  # DCP1's own candidates, also on CPU (ties)
            case.bs,
            d["global_width"],
            group.rank_in_group,
            w,
            case.k,
        )
        out["masked"] = masked.cpu()
        return out

    return dict(enumerate(ref.run_spmd(w, rank_fn, timeout=600.0)))


def local_timing(ns, case: Case, w: int, device: torch.device) -> dict[str, Any]:
    """Rank 0's select without the wire (collectives replaced by local stand-ins of the
    same shapes), DCP1's select on the full logits, bytes per call, a graph replay."""
    d1, d = build(case, 0, 1), build(case, 0, w)
    rows = d["ends"].numel()
    g1 = d1["packed"].to(device).float()
    ks1 = None if d1["ks"] is None else d1["ks"].to(device)
    ke1 = d1["ke"].to(device)
    loc = d["packed"].to(device)
    ks = None if d["ks"] is None else d["ks"].to(device)
    ke = d["ke"].to(device)
    c = torch.full((rows, case.topk_blocks), 99, dtype=torch.int32, device=device)

    def run(exchange):
        ns["select_candidate_blocks_dcp"](
            loc,
            ks,
            ke,
            case.topk_blocks,
            case.bs,
            c,
            d["global_width"],
            0,
            w,
            case.k,
            lambda x: None,
            1,
            lambda x: x[None].expand(w, *x.shape).contiguous(),
            exchange,
        )

    nblocks = -(-d["global_width"] // case.bs)
    graph = {}
    for exchange in ("dense", "sparse"):
        graph[exchange] = graph_check(lambda e=exchange: run(e), c, loc)
    replay = {}
    if device.type == "cuda":  # what a captured decode step pays
        replay = {
            "ms_dcp1_graph": graph_ms(
                lambda: ns["select_candidate_blocks"](g1, ks1, ke1, case.topk_blocks, case.bs, c),
                device,
            ),
            "ms_dense_graph": graph_ms(lambda: run("dense"), device),
            "ms_sparse_graph": graph_ms(lambda: run("sparse"), device),
        }
    return {
        **replay,
        "bytes": ns["dcp_candidate_exchange_bytes"](rows, nblocks, case.topk_blocks, w),
        "ms_dcp1": median_ms(
            lambda: ns["select_candidate_blocks"](g1, ks1, ke1, case.topk_blocks, case.bs, c),
            device,
        ),
        "ms_dense_local": median_ms(lambda: run("dense"), device),
        "ms_sparse_local": median_ms(lambda: run("sparse"), device),
        # the consumer masks: DCP1's on the full logits, DCP's on rank 0's columns
        "ms_dcp1_mask": median_ms(
            lambda: ns["apply_candidate_mask"](g1, ks1, ke1, c, case.bs), device
        ),
        "ms_dcp_mask": median_ms(
            lambda: ns["apply_candidate_mask_dcp"](
                loc, ks, ke, c, case.bs, d["global_width"], 0, w, case.k
            ),
            device,
        ),
        "graph": graph,
    }


def graph_ms(fn, device: torch.device) -> float:
    """Median ms of one replay of ``fn`` captured in a CUDA graph."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return median_ms(graph.replay, device)


def signed_zero_facts(ns, device: torch.device) -> dict[str, Any]:
    """How DCP1's kernels and torch.topk order -0.0 and +0.0 here, and the reproducer."""
    facts: dict[str, Any] = {}
    # blocks of 2: (-0,+0) (+0,-0) (-0,-0) (+0,+0), then a pinned block (the newest)
    row = torch.tensor([[-0.0, 0.0, 0.0, -0.0, -0.0, -0.0, 0.0, 0.0, 5.0, 5.0]], device=device)
    ends = torch.tensor([10], dtype=torch.int32, device=device)
    scores = torch.empty((1, 5), device=device)
    ns["_block_scores_kernel"][(1, 1)](
        row, None, ends, scores, *row.stride(), 0, ends.stride(0), 10, 5, 2, False, 1, 128
    )
    sign = lambda v: "+0.0" if str(v) == "0.0" else ("-0.0" if str(v) == "-0.0" else str(v))  # noqa: E731
    facts["dcp1_block_max"] = [sign(v) for v in scores[0, :4].tolist()]
    keys = torch.empty((1, 6), dtype=torch.int32, device=device)
    ns["_dcp_block_keys_kernel"][(1, 1)](
        row, None, ends, keys, *row.stride(), 0, ends.stride(0), 10, 5, 0, 1, 1, 2, False, 1, 128
    )
    facts["dcp_keys"] = keys[0, :4].tolist()
    for where in ("cpu", device.type):
        for pair in ((-0.0, 0.0), (0.0, -0.0)):
            t = torch.tensor(pair, device=where)
            facts[f"topk1_{where}_{pair}"] = int(t.topk(1).indices)
    # which tied entries torch.topk takes at the boundary: the lower ids, or others
    for width in (8193, 131072):
        vals = torch.randint(0, 8, (16, width), generator=torch.Generator().manual_seed(width))
        vals = vals.float()
        got = vals.to(device).topk(2049, dim=-1).indices.cpu()
        want = torch.sort(
            ref.order_keys(vals) * (1 << 32) + ((1 << 32) - 1 - torch.arange(width)),
            descending=True,
        ).indices[:, :2049]
        facts[f"topk_ties_rows_not_lowest_id_w{width}"] = sum(
            set(a) != set(b) for a, b in zip(got.tolist(), want.tolist(), strict=True)
        )
        facts[f"topk_ties_rows_other_order_w{width}"] = int((got != want).any(1).sum())
    # the reproducer, and rows of random signed zeros
    repro = Case("decode", 1, 1, 2, (3,), width=3)
    zeros = Case("decode", 1, 1, 2048, (8193,) * 4, width=8193, seed=21)
    out = []
    for case, frame in (
        (repro, torch.tensor([[-0.0, 0.0, -1.0]])),
        (
            zeros,
            torch.where(
                torch.rand(4, 8193, generator=torch.Generator().manual_seed(3)) < 0.5, -0.0, 0.0
            ),
        ),
    ):
        out.append(signed_zero_case(ns, case, frame, device))
    facts["cases"] = out
    return facts


def signed_zero_case(ns, case: Case, frame: torch.Tensor, device) -> dict[str, Any]:
    """DCP1's CUDA select on ``frame`` against DCP W=2 (K 1) dense and sparse."""
    rows, width = frame.shape
    ends = torch.full((rows,), width, dtype=torch.int32)
    c1 = torch.full((rows, case.topk_blocks), 99, dtype=torch.int32, device=device)
    ns["select_candidate_blocks"](frame.to(device), None, ends.to(device), case.topk_blocks, 1, c1)
    got = {}
    for exchange in ("dense", "sparse"):

        def rank_fn(group, exchange=exchange):
            r = group.rank_in_group
            mine = ref.owner_rank(torch.arange(width), 2, 1) == r
            loc = torch.zeros(rows, width)
            loc[:, : int(mine.sum())] = frame[:, mine]
            ke = local_count(ends.long(), r, 2, 1).to(torch.int32)
            c = torch.full_like(c1, 99)

            def all_gather(x):
                return group.all_gather(x[None], dim=0)

            ns["select_candidate_blocks_dcp"](
                loc.to(device),
                None,
                ke.to(device),
                case.topk_blocks,
                1,
                c,
                width,
                r,
                2,
                1,
                lambda x: x.copy_(all_gather(x).amax(0)),
                1,
                all_gather,
                exchange,
            )
            return c.cpu()

        got[exchange] = ref.run_spmd(2, rank_fn)
    want = ref.candidate_blocks_dcp1(frame, ends, case.topk_blocks, 1)
    c1 = c1.cpu()
    sets = lambda t: [sorted(b for b in r if b >= 0) for r in t.tolist()]  # noqa: E731
    return {
        "rows": rows,
        "width": width,
        "topk_blocks": case.topk_blocks,
        "dcp1_first_row": c1[0, :4].tolist(),
        "rows_dcp1_eq_reference_set": sum(
            a == b for a, b in zip(sets(c1), sets(want), strict=True)
        ),
        **{
            f"rows_{x}_eq_dcp1_set": min(
                sum(a == b for a, b in zip(sets(got[x][r]), sets(c1), strict=True))
                for r in range(2)
            )
            for x in got
        },
        **{f"{x}_first_row": got[x][0][0, :4].tolist() for x in got},
    }


def index_k_costs(ns, device: torch.device) -> dict[str, Any]:
    """What the prefill alternative, all-gathering the source layer's index K and running
    DCP1's selection, pays locally on one chunk at vLLM's logits budget (M x N fp32 = 512
    MB: M = 2048 rows, N = 65536 positions, W = 2): the logits of the other rank's half,
    recomputed (an fp8 MQA-logits kernel of DeepSeek-V4.1's shape, 32 heads x 128, relu and
    head weights folded as DeepGEMM's ``fp8_mqa_logits`` does; a Triton stand-in, not
    DeepGEMM), HBM bandwidth, and DCP1's select on the full logits, against the dense and
    sparse exchanges' local work on the rank's half (the wire is in neither)."""
    from lab.gpu.mqa_logits import mqa_logits_kernel  # Triton: only on this path

    m, n, h, dim = 2048, 65536, 32, 128
    gen = torch.Generator(device=device).manual_seed(0)
    q = torch.randn(m * h, dim, device=device, generator=gen).to(torch.float8_e4m3fn)
    k = torch.randn(n, dim, device=device, generator=gen).to(torch.float8_e4m3fn)
    w = torch.rand(m * h, device=device, generator=gen)
    logits = torch.empty(m, n, device=device)

    def run_logits():
        mqa_logits_kernel[(m // 64, n // 128)](q, k, w, logits, n, h, dim, 64, 128)

    ms_logits = median_ms(run_logits, device, reps=10)
    big = torch.empty(1 << 28, device=device)  # 1 GiB
    ms_copy = median_ms(lambda: big.clone(), device, reps=10)
    ends = torch.arange(n - m + 1, n + 1, dtype=torch.int32, device=device)  # causal rows
    starts = torch.zeros(m, dtype=torch.int32, device=device)
    c = torch.full((m, 2048), 99, dtype=torch.int32, device=device)
    ms_dcp1 = median_ms(
        lambda: ns["select_candidate_blocks"](logits, starts, ends, 2048, 8, c), device
    )
    local = logits[:, : n // 2].contiguous()
    lends = (ends + 1) // 2  # rank 0's columns at K = 1, W = 2

    def dcp(exchange):
        ns["select_candidate_blocks_dcp"](
            local,
            starts,
            lends,
            2048,
            8,
            c,
            n,
            0,
            2,
            1,
            lambda x: None,
            1,
            lambda x: x[None].expand(2, *x.shape).contiguous(),
            exchange,
        )

    return {
        "rows": m,
        "positions": n,
        "heads": h,
        "head_dim": dim,
        "ms_logits_full": ms_logits,
        "tflops_logits": 2 * m * n * h * dim / ms_logits / 1e9,
        "hbm_gbs_copy": 2 * big.numel() * 4 / ms_copy / 1e6,
        "ms_dcp1_select_full": ms_dcp1,
        "ms_dense_local": median_ms(lambda: dcp("dense"), device),
        "ms_sparse_local": median_ms(lambda: dcp("sparse"), device),
        "bytes": ns["dcp_candidate_exchange_bytes"](m, n // 8, 2048, 2),
        "index_k_bytes": n * (dim + 4) // 2,
    }


def _serialize_interpreter(ns) -> None:
    """Triton's interpreter (the CPU dry run) is not thread-safe: one launch at a time."""
    lock = threading.Lock()

    def locked(run):
        def call(*args, **kwargs):
            with lock:
                return run(*args, **kwargs)

        return call

    for name, value in ns.items():
        if name.endswith("_kernel") and callable(getattr(value, "run", None)):
            value.run = locked(value.run)


def topk_tie_facts(device: torch.device) -> dict[str, Any]:
    """The property the sparse merge's exact set rests on (patch 01's comment names this
    check): among equal values, torch.topk on this device returns the lowest indices,
    i.e. its picks are the first k of a stable descending sort. Tie-heavy rows (no zeros:
    the signed-zero order is its own check), several widths, k and both ``sorted``."""
    gen = torch.Generator().manual_seed(5)
    palette = torch.tensor([-2.0, -1.0, 0.5, 1.0, 3.0])
    rows = []
    for width, k in ((64, 8), (1024, 64), (16384, 2048), (131072, 2048)):
        x = palette[torch.randint(0, len(palette), (8, width), generator=gen)].to(device)
        want = torch.sort(x, dim=-1, descending=True, stable=True).indices[:, :k]
        for sorted_ in (True, False):
            got = torch.topk(x, k, dim=-1, sorted=sorted_).indices
            same_set = torch.equal(got.sort(-1).values, want.sort(-1).values)
            same_order = torch.equal(got, want) if sorted_ else None
            rows.append({"width": width, "k": k, "sorted": sorted_, "lowest_index_set": same_set,
                         "lowest_index_order": same_order})  # fmt: skip
    return {"ok": all(r["lowest_index_set"] for r in rows), "cases": rows}


def emulated(args: argparse.Namespace) -> int:
    device = torch.device(args.device)
    ns, report = load_file(Path(args.baked), CANDIDATES, ROOTS)
    if device.type == "cpu":
        _serialize_interpreter(ns)
    res: dict[str, Any] = {
        "environment": gtk.environment(device),
        "baked": str(args.baked),
        "kernels_verbatim": report["kernels_verbatim"],
        "signed_zero": signed_zero_facts(ns, device),
        "topk_ties": topk_tie_facts(device),
        "index_k": index_k_costs(ns, device) if device.type == "cuda" else None,
        "cases": [],
    }
    for case in cases(args.quick, ("float32",)):
        if args.wide_only and case.width < (1 << 20):
            continue
        for w in (2, 4, 8) if max(case.lens) < (1 << 20) else (2, 8):
            per_rank = emulated_ranks(ns, case, w, device)
            d1 = build(case, 0, 1)
            c1 = torch.full((d1["ends"].numel(), case.topk_blocks), 99, dtype=torch.int32)
            c1 = c1.to(device)
            ns["select_candidate_blocks"](
                d1["packed"].to(device).float(),
                None if d1["ks"] is None else d1["ks"].to(device),
                d1["ke"].to(device),
                case.topk_blocks,
                case.bs,
                c1,
            )
            if device.type == "cuda":
                m1 = d1["packed"].to(device)
                ns["apply_candidate_mask"](
                    m1,
                    None if d1["ks"] is None else d1["ks"].to(device),
                    d1["ke"].to(device),
                    c1,
                    case.bs,
                )
                m1 = m1.cpu()
            else:  # Triton 3.9's interpreter refuses DCP1's negated-bool store mask
                m1 = reference_masked_packed(case, d1, c1.cpu())
            c1 = c1.cpu()
            row = {**asdict(case), "lens": list(case.lens)[:4], "W": w}
            row["mask_eq_dcp1"] = all(
                same_bits(per_rank[r]["masked"], expected_local(case, m1, d1, build(case, r, w)))
                for r in per_rank
            )
            sets = lambda t: [sorted(b for b in r if b >= 0) for r in t.tolist()]  # noqa: E731
            for x in ("dense", "sparse"):
                # consumers read the set; the order is reported beside it
                row[f"{x}_eq_dcp1"] = all(sets(per_rank[r][x]) == sets(c1) for r in per_rank)
                row[f"{x}_eq_dcp1_order"] = all(torch.equal(per_rank[r][x], c1) for r in per_rank)
                row[f"{x}_ref_ties"] = up_to_ties(per_rank[0][x], case, build(case, 0, w))[0]
            row.update(local_timing(ns, case, w, device))
            res["cases"].append(row)
            print(json.dumps(row, default=str), flush=True)
    sz = res["signed_zero"]
    res["ok"] = all(
        c["dense_eq_dcp1"]
        and c["sparse_eq_dcp1"]
        and c["mask_eq_dcp1"]
        and c["graph"]["sparse"] is True
        for c in res["cases"]
    ) and all(
        z["rows_dense_eq_dcp1_set"] == z["rows_sparse_eq_dcp1_set"] == z["rows"]
        for z in sz["cases"]
    )
    # CPU's topk picks other tied indices: the sparse set is exact on a device where it holds
    res["ok"] = res["ok"] and (res["topk_ties"]["ok"] or device.type == "cpu")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "gpu_candidate_exact.json").write_text(json.dumps(res, indent=1, default=str))
    print(json.dumps({k: v for k, v in res.items() if k != "cases"}, indent=1, default=str))
    return 0 if res["ok"] else 1


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("baked", type=Path, help="baked tree root (holds vllm/)")
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--world-size", type=int, default=2)
    ap.add_argument("--quick", action="store_true", help="small shapes (dry run)")
    ap.add_argument("--out", default=os.environ.get("OUT", "artifacts/gpu-candidates"))
    ap.add_argument(
        "--emulate",
        action="store_true",
        help="one device: W = 2, 4, 8 ranks as threads, dense and sparse exchange, signed zero",
    )
    ap.add_argument(
        "--wide-only",
        action="store_true",
        help="with --emulate: only the cases at a 1M-position decode width (timing)",
    )
    args = ap.parse_args(argv)
    if args.emulate:
        return emulated(args)
    ranks.spawn(worker, args.world_size, args)
    res = json.loads((Path(args.out) / "gpu_candidate_blocks.json").read_text())
    return 0 if res["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
