"""GPU run of the DCP combine: bf16 parity over NCCL, and the baked tree's real combine timed.

Needs only torch (2.11 on the device image), Triton for ``--baked``, lab/dcp and bakery's
markdown and clock (no vLLM).
Two ranks by default, started with torch.multiprocessing:

    python3 tools/gpu_dcp_bench.py --out "$OUT"            # 2 GPUs, NCCL
    python3 tools/gpu_dcp_bench.py --baked build/baked-cpu --kernels-only --out "$OUT"
    python3 tools/gpu_dcp_bench.py --device cpu --quick [--baked build/baked-cpu]  # gloo dry run

1. parity: DCP W (both combine flavours) against DCP1 on every rank, bf16
   (atol/rtol 3e-2) and fp32 (1e-5, LSE 1e-4), head dim 512;
2. bench: ``combine_ag_rs`` and ``combine_a2a`` (the torch reference combine)
   for T x gathered heads, head dim 512, bf16 output, fp32 LSE: us per call, and a
   plain NCCL all-gather that moves the same bytes per rank, timed in the same run;
   ``bound_fraction = t_allgather / t_combine``;
3. ``--baked TREE``: the REAL combine patch 09 calls, ``cp_lse_ag_out_rs`` and
   ``dcp_a2a_lse_reduce`` with ``is_lse_base_on_e=False``, loaded from
   ``TREE/vllm/v1/attention/ops/dcp.py`` by ``lab.dcp.baked_kernels`` (its Triton kernels,
   verbatim) over vLLM's collective calls (``all_gather_into_tensor``,
   ``reduce_scatter_tensor``, ``all_to_all_single``), each checked against the
   reference combine on every rank, then 20 calls captured in one CUDA graph; next to
   the reference combine over the same collectives and the all-gather bound.
   On CPU (``--device cpu``) the kernels run under ``TRITON_INTERPRET=1``, eagerly.

Writes gpu_dcp_bench.json and gpu_dcp_bench.md to --out.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

from bakery import markdown as md
from bakery.clock import MINUTE, utc_stamp
from lab.dcp import ranks
from lab.dcp import reference as ref
from lab.dcp.baked_kernels import DCP_OPS, load_file

HEAD_DIM = 512
PARITY_TOL = {torch.bfloat16: (3e-2, 1e-4), torch.float32: (1e-5, 1e-4)}
# What patch 09's _run_sm120_dcp calls (and CPTritonContext, one per layer).
COMBINE_ROOTS = ("cp_lse_ag_out_rs", "dcp_a2a_lse_reduce", "CPTritonContext")


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_us(fn, device: torch.device, iters: int, repeats: int) -> float:
    """Median over ``repeats`` of the mean wall time per call, in us (synchronised)."""
    for _ in range(3):
        fn()
    samples = []
    for _ in range(repeats):
        sync(device)
        dist.barrier()
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(iters):
                fn()
            end.record()
            end.synchronize()
            samples.append(start.elapsed_time(end) * 1e3 / iters)
        else:
            t0 = time.perf_counter()
            for _ in range(iters):
                fn()
            samples.append((time.perf_counter() - t0) * 1e6 / iters)
    return statistics.median(samples)


def graph_time_us(fn, device: torch.device, per_graph: int, repeats: int) -> float:
    """Median us per call with ``per_graph`` calls captured in one CUDA graph.

    Replaying a graph takes the host's launch overhead out, so this is the
    device-side time of the combine (and of the all-gather bound).
    """
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        for _ in range(3):  # warm up outside the capture
            fn()
    torch.cuda.current_stream(device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(per_graph):
            fn()
    samples = []
    for _ in range(repeats):
        sync(device)
        dist.barrier()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) * 1e3 / per_graph)
    del graph
    return statistics.median(samples)


def slowest(x: float, device: torch.device) -> float:
    """The slowest rank's number: a collective ends when its last rank does."""
    t = torch.tensor([x], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def parity(group: ref.TorchGroup, device: torch.device, quick: bool) -> list[dict]:
    w, rank = group.world_size, group.rank_in_group
    rows = []
    shapes = [(1, 16, [900, 4100], [1, 1]), (2, 16, [3000, 70, 1], [1, 9, 1])]
    for dtype in (torch.bfloat16, torch.float32):
        for k, h, n_states, tokens in shapes[:1] if quick else shapes:
            gen = torch.Generator().manual_seed(1234 + k)
            step = ref.random_step(
                gen,
                n_states,
                tokens,
                heads=h * w,
                dim=HEAD_DIM + 64,
                v_dim=HEAD_DIM,
                topk=128 if quick else 512,
                swa_width=64,
                dtype=dtype,
                padding_rows=1,
            )
            layout = ref.ShardLayout(w, k, 64)
            caches = ref.build_caches(step.states, layout, gen)
            dcp1_cache = ref.build_caches(step.states, ref.ShardLayout(1, 1, 64), gen)[0]
            step_d = step.to(device)
            dcp1 = ref.dcp1_attention(step_d, dcp1_cache.to(device), dtype)
            heads = slice(rank * h, (rank + 1) * h)
            for combine in ("ag_rs", "a2a"):
                got = ref.dcp_attention(
                    group, step_d, caches[rank].to(device), layout, combine, dtype
                )
                err = (got.out.float() - dcp1.out[:, heads].float()).abs().max().item()
                lerr = (got.lse - dcp1.lse[:, heads]).abs().max().item()
                tol, ltol = PARITY_TOL[dtype]
                ok = torch.allclose(
                    got.out.float(), dcp1.out[:, heads].float(), atol=tol, rtol=tol
                ) and torch.allclose(got.lse, dcp1.lse[:, heads], atol=ltol, rtol=ltol)
                ok = slowest(0.0 if ok else 1.0, device) == 0.0  # every rank passed
                rows.append(
                    dict(
                        dtype=str(dtype).removeprefix("torch."),
                        interleave=k,
                        heads=h * w,
                        tokens=int(step.q.shape[0]),
                        combine=combine,
                        max_abs_err=slowest(err, device),
                        max_lse_err=slowest(lerr, device),
                        passed=ok,
                    )
                )
    return rows


def bytes_sent(flavour: str, t: int, hw: int, w: int) -> int:
    """Bytes one rank sends over the links for one combine call."""
    out_bytes = t * hw * HEAD_DIM * 2  # bf16 partial output
    lse_bytes = t * hw * 4
    if flavour == "ag_rs":  # all-gather fp32 LSE + reduce-scatter the output
        return (w - 1) * lse_bytes + (w - 1) * out_bytes // w
    # a2a: [W, T, H, 512 + 2] bf16, the own chunk stays
    return (w - 1) * (t * hw * (HEAD_DIM + 2) * 2) // w


def bench(group: ref.TorchGroup, device: torch.device, quick: bool, graphs: bool) -> list[dict]:
    w = group.world_size
    tokens, heads = ([1, 8], [32]) if quick else ([1, 8, 64, 256], [32, 64, 128])
    iters, repeats = (5, 3) if quick else (200, 7)
    gen = torch.Generator().manual_seed(7 + group.rank_in_group)
    rows = []
    for t in tokens:
        for hw in heads:
            part = ref.AttnOut(
                torch.randn(t, hw, HEAD_DIM, generator=gen).to(device, torch.bfloat16),
                (torch.randn(t, hw, generator=gen) * 8).to(device),
            )
            row = dict(tokens=t, gathered_heads=hw, head_dim=HEAD_DIM, world_size=w)
            for flavour, fn in ref.COMBINES.items():
                sent = bytes_sent(flavour, t, hw, w)
                # the bound: a plain all-gather in which each rank sends the same bytes
                chunk = torch.empty(max(sent // (w - 1), 1), dtype=torch.uint8, device=device)
                gathered = torch.empty(w * chunk.numel(), dtype=torch.uint8, device=device)

                def all_gather(c=chunk, g=gathered):
                    dist.all_gather_into_tensor(g, c)

                def combine(f=fn, x=part):
                    f(group, x)

                t_ag = slowest(time_us(all_gather, device, iters, repeats), device)
                t_f = slowest(time_us(combine, device, iters, repeats), device)
                row[flavour] = dict(
                    us=round(t_f, 2),
                    bytes_sent=sent,
                    allgather_us=round(t_ag, 2),
                    bound_fraction=round(t_ag / t_f, 3),
                    gb_per_s=round(sent / t_f / 1e3, 2),
                )
                if device.type == "cuda" and graphs:
                    try:
                        g_ag = slowest(graph_time_us(all_gather, device, 20, repeats), device)
                        g_f = slowest(graph_time_us(combine, device, 20, repeats), device)
                        row[flavour].update(
                            graph_us=round(g_f, 2),
                            graph_allgather_us=round(g_ag, 2),
                            graph_bound_fraction=round(g_ag / g_f, 3),
                        )
                    except Exception as exc:  # keep the eager numbers if capture fails
                        row[flavour]["graph_error"] = repr(exc)[:200]
            rows.append(row)
    return rows


# ---- the baked tree's real combine ------------------------------------------


class CollectiveGroup:
    """The collectives of vLLM's ``GroupCoordinator`` as ``DeviceCommunicatorBase`` does
    them: one ``all_gather_into_tensor`` / ``reduce_scatter_tensor`` per call (the
    reference's ``TorchGroup`` gathers into a list); ``device_group`` for the a2a."""

    def __init__(self) -> None:
        self.world_size = dist.get_world_size()
        self.rank_in_group = dist.get_rank()
        self.device_group = None  # the default group

    def all_gather(self, x: torch.Tensor, dim: int = 0) -> torch.Tensor:
        w, size = self.world_size, x.size()
        out = torch.empty((size[0] * w,) + size[1:], dtype=x.dtype, device=x.device)
        dist.all_gather_into_tensor(out, x.contiguous())
        out = out.reshape((w,) + size).movedim(0, dim)
        return out.reshape(size[:dim] + (w * size[dim],) + size[dim + 1 :])

    def reduce_scatter(self, x: torch.Tensor, dim: int = 0) -> torch.Tensor:
        x = x.movedim(0, dim).contiguous()
        out = torch.empty(
            (x.shape[0] // self.world_size,) + x.shape[1:], dtype=x.dtype, device=x.device
        )
        dist.reduce_scatter_tensor(out, x)
        return out.movedim(0, dim).contiguous()

    def all_to_all(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        out = torch.empty_like(x)
        dist.all_to_all_single(out, x)
        return out


def real_combines(ns: dict, group: CollectiveGroup) -> dict:
    """The two calls exactly as patch 09's ``_run_sm120_dcp`` makes them (a fresh
    ``CPTritonContext`` per ``ag_rs`` call)."""
    context = ns["CPTritonContext"]

    def ag_rs(part: ref.AttnOut) -> torch.Tensor:
        return ns["cp_lse_ag_out_rs"](
            part.out, part.lse, group, ctx=context(), is_lse_base_on_e=False
        )

    def a2a(part: ref.AttnOut) -> torch.Tensor:
        return ns["dcp_a2a_lse_reduce"](part.out, part.lse, group, is_lse_base_on_e=False)

    return {"ag_rs": ag_rs, "a2a": a2a}


def random_partial(gen, t: int, hw: int, rank: int, device) -> ref.AttnOut:
    """bf16 partial output and base-2 LSE; one row empty on odd ranks (LSE -1e30, out 0)."""
    out = torch.randn(t, hw, HEAD_DIM, generator=gen)
    lse = torch.randn(t, hw, generator=gen) * 8
    if rank % 2 and t > 1:
        out[0], lse[0] = 0, ref.EMPTY_LSE
    return ref.AttnOut(out.to(device, torch.bfloat16), lse.to(device))


def real_parity(real, group: CollectiveGroup, part: ref.AttnOut, flavour: str) -> tuple:
    """Max abs error of the real combine against the reference; ok on every rank."""
    got = real[flavour](_copy(part))  # ag_rs corrects its input in place
    want = ref.COMBINES[flavour](group, part).out
    err = (got.float() - want.float()).abs().max().item()
    ok = bool(torch.allclose(got.float(), want.float(), atol=3e-2, rtol=3e-2))
    ok = ok and bool(torch.isfinite(got).all())  # NaN never passes
    device = part.out.device
    return slowest(err, device), slowest(0.0 if ok else 1.0, device) == 0.0


def _copy(part: ref.AttnOut) -> ref.AttnOut:
    return ref.AttnOut(part.out.clone(), part.lse.clone())


def time_calls(fns: dict, device: torch.device, repeats: int) -> dict:
    """us per call of each fn, slowest rank: graph-captured on CUDA, eager on CPU."""
    timed = {}
    for name, fn in fns.items():
        if device.type == "cuda":
            timed[name] = slowest(graph_time_us(fn, device, 20, repeats), device)
        else:  # dry run: the interpreter takes seconds per call
            timed[name] = slowest(time_us(fn, device, 1, 1), device)
    return timed


def kernel_bench(group: CollectiveGroup, device: torch.device, quick: bool, ns: dict) -> list[dict]:
    """Real and reference combine per shape: parity on every rank, then timings."""
    w = group.world_size
    tokens, heads = ([1, 8], [32]) if quick else ([1, 8, 64, 256], [32, 64, 128])
    repeats = 3 if quick else 7
    gen = torch.Generator().manual_seed(11 + group.rank_in_group)
    real = real_combines(ns, group)
    rows = []
    for t in tokens:
        for hw in heads:
            part = random_partial(gen, t, hw, group.rank_in_group, device)
            row = dict(tokens=t, gathered_heads=hw, head_dim=HEAD_DIM, world_size=w)
            for flavour in ("ag_rs", "a2a"):
                err, ok = real_parity(real, group, part, flavour)
                sent = bytes_sent(flavour, t, hw, w)
                chunk = torch.empty(max(sent // (w - 1), 1), dtype=torch.uint8, device=device)
                gathered = torch.empty(w * chunk.numel(), dtype=torch.uint8, device=device)
                # Timed calls reuse one copy: ag_rs rescales it in place on every call,
                # which moves the values, not the time.
                x = _copy(part)
                timed = time_calls(
                    {
                        "real": lambda f=real[flavour], x=x: f(x),
                        "ref": lambda f=ref.COMBINES[flavour], x=x: f(group, x),
                        "bound": lambda c=chunk, g=gathered: dist.all_gather_into_tensor(g, c),
                    },
                    device,
                    repeats,
                )
                row[flavour] = dict(
                    bytes_sent=sent,
                    real_us=round(timed["real"], 2),
                    ref_us=round(timed["ref"], 2),
                    bound_us=round(timed["bound"], 2),
                    real_fraction=round(timed["bound"] / timed["real"], 3),
                    ref_fraction=round(timed["bound"] / timed["ref"], 3),
                    max_abs_err_vs_ref=err,
                    parity=ok,
                )
            rows.append(row)
    return rows


def worker(rank: int, w: int, port: int, args: argparse.Namespace) -> None:
    device = ranks.join(rank, w, port, cuda=args.device == "cuda")
    try:
        group = ref.TorchGroup()
        result: dict = {}
        if args.baked:
            ns, report = load_file(Path(args.baked), DCP_OPS, COMBINE_ROOTS)
            result["kernels"] = report
            result["kernel_bench"] = kernel_bench(CollectiveGroup(), device, args.quick, ns)
            if rank == 0:
                write(result, w, device, args)
        if not args.kernels_only:
            result["parity"] = parity(group, device, args.quick)
            result["bench"] = bench(group, device, args.quick, graphs=False)
            if rank == 0:
                write(result, w, device, args)  # eager numbers land even if capture hangs
        if device.type == "cuda" and not args.no_graphs and not args.kernels_only:
            result["bench"] = bench(group, device, args.quick, graphs=True)
            if rank == 0:
                write(result, w, device, args)
    finally:
        dist.destroy_process_group()


def markdown(result: dict) -> str:
    meta = result["meta"]
    lines = [
        f"# DCP combine on {meta['device']} ({meta['date']})",
        "",
        f"torch {meta['torch']}, W={meta['world_size']}, head dim {HEAD_DIM}, "
        f"bf16 output, fp32 LSE, over {meta['backend']}.",
    ]
    if "kernel_bench" in result:
        lines += kernel_markdown(result)
    if "parity" in result:
        lines += parity_markdown(result)
    if "bench" in result:
        lines += bench_markdown(result)
    return "\n".join(lines) + "\n"


def kernel_markdown(result: dict) -> list[str]:
    timing = "20 calls in one CUDA graph" if result["meta"]["backend"] == "NCCL" else "eager"
    lines = [
        "",
        "## The baked tree's combine (its Triton kernels + collectives)",
        "",
        f"us per call, slowest rank, median; {timing}. real: `cp_lse_ag_out_rs` / "
        "`dcp_a2a_lse_reduce` from the baked `dcp.py`; ref: `lab.dcp.reference`; "
        "bound: `all_gather_into_tensor` of the flavour's bytes per rank; "
        "fraction = bound / combine. parity: real vs ref output, bf16 3e-2, every rank.",
        "",
    ]
    header = (
        "T",
        "heads",
        "bytes sent ag_rs / a2a",
        "ag_rs real",
        "ag_rs ref",
        "ag_rs bound",
        "a2a real",
        "a2a ref",
        "a2a bound",
        "fraction real ag_rs / a2a",
        "fraction ref ag_rs / a2a",
        "parity",
    )
    rows = []
    for b in result["kernel_bench"]:
        a, c = b["ag_rs"], b["a2a"]
        rows.append(
            (
                b["tokens"],
                b["gathered_heads"],
                f"{a['bytes_sent']} / {c['bytes_sent']}",
                a["real_us"],
                a["ref_us"],
                a["bound_us"],
                c["real_us"],
                c["ref_us"],
                c["bound_us"],
                f"{a['real_fraction']} / {c['real_fraction']}",
                f"{a['ref_fraction']} / {c['ref_fraction']}",
                "yes" if a["parity"] and c["parity"] else "NO",
            )
        )
    lines.append(md.table(header, rows))
    verbatim = result["kernels"]["kernels_verbatim"]
    lines += ["", f"Kernels verbatim from the baked file: {verbatim}"]
    return lines


def parity_markdown(result: dict) -> list[str]:
    lines = [
        "",
        "## Parity of the reference (DCP W vs DCP1)",
        "",
    ]
    header = ("dtype", "K", "heads", "T", "combine", "max abs err", "max LSE err", "pass")
    rows = [
        (
            p["dtype"],
            p["interleave"],
            p["heads"],
            p["tokens"],
            p["combine"],
            f"{p['max_abs_err']:.2e}",
            f"{p['max_lse_err']:.2e}",
            p["passed"],
        )
        for p in result["parity"]
    ]
    return [*lines, md.table(header, rows)]


def bench_markdown(result: dict) -> list[str]:
    lines = [
        "",
        "## Reference combine, us per call (slowest rank, median)",
        "",
        "Eager: host-launched calls. Graph: 20 calls captured in one CUDA graph "
        "(device time). Bound: `dist.all_gather_into_tensor` in which each rank sends "
        "the flavour's bytes; fraction = bound us / combine us.",
        "",
    ]
    header = (
        "T",
        "heads",
        "bytes sent ag_rs / a2a",
        "eager ag_rs",
        "eager a2a",
        "eager bound",
        "graph ag_rs",
        "graph a2a",
        "graph bound ag_rs / a2a",
        "graph fraction ag_rs / a2a",
    )
    rows = []
    for b in result["bench"]:
        a, c = b["ag_rs"], b["a2a"]
        rows.append(
            (
                b["tokens"],
                b["gathered_heads"],
                f"{a['bytes_sent']} / {c['bytes_sent']}",
                a["us"],
                c["us"],
                a["allgather_us"],
                a.get("graph_us", "-"),
                c.get("graph_us", "-"),
                f"{a.get('graph_allgather_us', '-')} / {c.get('graph_allgather_us', '-')}",
                f"{a.get('graph_bound_fraction', '-')} / {c.get('graph_bound_fraction', '-')}",
            )
        )
    lines.append(md.table(header, rows))
    errors = {b[f].get("graph_error") for b in result["bench"] for f in ("ag_rs", "a2a")}
    lines += [f"\ngraph capture error: {e}" for e in sorted(e for e in errors if e)]
    return lines


def write(result: dict, w: int, device: torch.device, args: argparse.Namespace) -> None:
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    result["meta"] = dict(
        date=utc_stamp(MINUTE),
        device=f"{w}x {name}",
        torch=torch.__version__,
        world_size=w,
        backend="NCCL" if device.type == "cuda" else "gloo",
        quick=args.quick,
        nccl=".".join(map(str, torch.cuda.nccl.version())) if device.type == "cuda" else None,
    )
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "gpu_dcp_bench.json").write_text(json.dumps(result, indent=1))
    md = markdown(result)
    (out / "gpu_dcp_bench.md").write_text(md)
    print(md, flush=True)


def failures(result: dict) -> list[str]:
    """What did not pass: reference parity rows, real-combine parity, unverified kernels."""
    bad = [f"parity {p}" for p in result.get("parity", []) if not p["passed"]]
    for b in result.get("kernel_bench", []):
        bad += [
            f"kernel {f} T={b['tokens']} H={b['gathered_heads']}"
            for f in ("ag_rs", "a2a")
            if not b[f]["parity"]
        ]
    verbatim = result.get("kernels", {}).get("kernels_verbatim", {})
    bad += [f"kernel {k} is not the baked file's" for k, ok in verbatim.items() if not ok]
    return bad


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--world-size", type=int, default=2)
    ap.add_argument("--quick", action="store_true", help="small shapes (dry run)")
    ap.add_argument("--no-graphs", action="store_true", help="skip the CUDA-graph timings")
    ap.add_argument("--baked", help="baked tree root: time its real combine (vllm/ inside)")
    ap.add_argument("--kernels-only", action="store_true", help="with --baked: only that")
    ap.add_argument("--out", default=os.environ.get("OUT", "artifacts/gpu-dcp"))
    args = ap.parse_args()
    if args.kernels_only and not args.baked:
        ap.error("--kernels-only needs --baked TREE")
    if args.world_size < 2:  # vLLM's combine returns early at W=1 (it is never called there)
        ap.error(f"--world-size {args.world_size}: a DCP combine needs 2 ranks or more")
    if args.baked and not (Path(args.baked) / DCP_OPS).is_file():
        ap.error(f"--baked {args.baked}: no {DCP_OPS} there (carry the baked file)")
    if args.device == "cpu":  # the real Triton kernels run on CPU only interpreted
        os.environ["TRITON_INTERPRET"] = "1"
    ranks.spawn(worker, args.world_size, args)
    bad = failures(json.loads((Path(args.out) / "gpu_dcp_bench.json").read_text()))
    for line in bad:
        print(f"FAILED: {line}", file=sys.stderr)
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
