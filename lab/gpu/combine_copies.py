"""Patch 09's DCP combine without its extra copies, on one GPU: checked, then timed before/after.

Issue 21, item 5. The DCP layer's combine used vLLM's ``cp_lse_ag_out_rs`` (ag_rs: a
``reduce_scatter(dim=1)`` that copies the whole ``[T, H, 512]`` partials to head-major first
and its ``[T, h, 512]`` result back after) or ``dcp_a2a_lse_reduce`` (a2a: the combine into a
fresh ``[T, h, 512]``), then ``output.copy_``. Patch 09 now does ag_rs with one transposed copy
to rank-major and a dim-0 reduce-scatter, and a2a with the unpack-combine kernel writing
``output`` through its strides (``_dcp_combine_{ag_rs,a2a}_into``).

The baked ``vllm/v1/attention/ops/dcp.py`` kernels run for real (loaded without vLLM as in
``lab.gpu.triton_kernels``); the collectives are emulated on the one GPU (W ranks'
partials in one process; the all-to-all and the reduce-scatter's sum done locally).

- check: for W in {2, 4} and every rank, the new sequences equal the old ones bit for bit and
  ``lab.dcp.reference``'s combines within tolerance (``output`` a row slice of a larger
  tensor, as patch 09 passes its sub-chunks);
- time: one rank's local work, old and new sequence, as CUDA-graph replays and eager calls
  (median ms); the wire is not in either (the reduce-scatter's result is a copy of this rank's
  chunk in both), so the difference is the copies.

    python3 tools/gpu_combine_copies.py build/baked-cpu --out "$OUT"      # one GPU

Writes gpu_combine_copies.json to --out.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

import torch

from lab.dcp import reference as ref
from lab.gpu import triton_kernels as gtk

HEAD_DIM = 512
HEADS = 64  # gathered heads (n_local_heads x W), as patch 09 combines them
TOKENS = (1, 8, 64, 512, 2048)  # decode batches and one prefill sub-chunk (2048)


def old_a2a(ns, out, lse, world, rank_recv=None):
    t, hw, d = out.shape
    h, pack = hw // world, ns["_dcp_a2a_lse_pack_dim"](out.dtype)
    send, recv = ns["_dcp_a2a_send_recv_buffers"]((world, t, h, d + pack), out.device, out.dtype)
    ns["_dcp_a2a_pack_send"](out, lse, send, world, h, d, pack)
    recv = send if rank_recv is None else rank_recv(send)
    return ns["_dcp_a2a_unpack_combine"](recv, d, pack, False, False), send


def new_a2a_unpack(ns, recv, output, world):
    """Patch 09's ``_dcp_combine_a2a_into`` after its all-to-all: the kernel into ``output``."""
    t, h, d = output.shape
    pack = ns["_dcp_a2a_lse_pack_dim"](output.dtype)
    no_lse = torch.empty((1, 1), device=recv.device, dtype=recv.dtype)
    ns["_dcp_a2a_unpack_combine_kernel"][(t, h, 1)](
        recv,
        output,
        no_lse,
        *recv.stride(),
        *output.stride(),
        *no_lse.stride(),
        N=world,
        HEAD_DIM=d,
        IS_BASE_E=False,
        RETURN_LSE=False,
        LSE_PACK_DIM=pack,
    )


def rank_major(out: torch.Tensor, world: int) -> torch.Tensor:
    """Patch 09's ``_dcp_combine_ag_rs_into``: the partials as [W * T, h, D] rank-major."""
    t, hw, d = out.shape
    ranked = out.view(t, world, hw // world, d).transpose(0, 1)
    return ranked.reshape(world * t, hw // world, d)


def check(ns, device, world: int, t: int, seed: int) -> dict[str, Any]:
    gen = torch.Generator().manual_seed(seed)
    h = HEADS // world
    parts = [
        ref.AttnOut(p.out.to(device), p.lse.to(device))
        for p in gtk.random_parts(gen, world, t, h, HEAD_DIM, torch.bfloat16)
    ]
    want_ref = {
        flavour: ref.run_spmd(
            world, lambda g, f=flavour: ref.COMBINES[f](g, parts[g.rank_in_group])
        )
        for flavour in ("a2a", "ag_rs")
    }
    old = {"a2a": gtk.kernel_a2a(ns, parts), "ag_rs": gtk.kernel_ag_rs(ns, parts)}
    # a2a, new: pack on every rank, then each rank's unpack straight into its output slice
    sends = [old_a2a(ns, p.out, p.lse, world)[1] for p in parts]
    # ag_rs, new: correct (in place), rank-major copy, reduce-scatter as a rank-order sum
    lses = torch.stack([p.lse for p in parts])
    rows = []
    for rank, p in enumerate(parts):
        out, _ = ns["correct_attn_out"](p.out.clone(), lses, rank, None, is_lse_base_on_e=False)
        rows.append(rank_major(out, world))
    res: dict[str, Any] = {"W": world, "T": t, "ok": True}
    for rank in range(world):
        big = torch.full((t + 3, h, HEAD_DIM), 7.0, dtype=torch.bfloat16, device=device)
        new_a2a_unpack(ns, torch.stack([s[rank] for s in sends]), big[1 : t + 1], world)
        chunk = rows[0][rank * t : (rank + 1) * t].clone()
        for r in rows[1:]:
            chunk += r[rank * t : (rank + 1) * t]
        new = {"a2a": big[1 : t + 1], "ag_rs": chunk}
        untouched = bool((big[0] == 7).all() and (big[t + 1 :] == 7).all())
        for flavour in ("a2a", "ag_rs"):
            same_old = torch.equal(new[flavour], old[flavour][rank].out)
            err, ok = gtk._err(
                new[flavour], want_ref[flavour][rank].out, gtk.OUT_TOL[torch.bfloat16]
            )
            res[f"{flavour}_eq_old"] = res.get(f"{flavour}_eq_old", True) and same_old
            res[f"{flavour}_ref_err"] = max(res.get(f"{flavour}_ref_err", 0.0), err)
            res["ok"] &= same_old and ok
        res["ok"] &= untouched
    return res


def graph_ms(fn, reps: int = 50) -> float:
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return eager_ms(graph.replay, reps)


def eager_ms(fn, reps: int = 50) -> float:
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


def timing(ns, device, world: int, t: int) -> dict[str, Any]:
    """One rank's local combine work, old and new (the wire left out of both)."""
    gen = torch.Generator().manual_seed(t)
    h = HEADS // world
    out = (torch.randn(t, HEADS, HEAD_DIM, generator=gen)).to(torch.bfloat16).to(device)
    lse = (torch.randn(t, HEADS, generator=gen) * 4).to(device)
    lses = torch.stack([lse] * world)
    output = torch.empty(t, h, HEAD_DIM, dtype=torch.bfloat16, device=device)
    pack = ns["_dcp_a2a_lse_pack_dim"](out.dtype)
    send = torch.empty((world, t, h, HEAD_DIM + pack), dtype=out.dtype, device=device)

    def a2a_old():
        combined, _ = old_a2a(ns, out, lse, world)
        output.copy_(combined)

    def a2a_new():
        ns["_dcp_a2a_pack_send"](out, lse, send, world, h, HEAD_DIM, pack)
        new_a2a_unpack(ns, send, output, world)

    def ag_rs_old():
        corrected, _ = ns["correct_attn_out"](out, lses, 0, None, is_lse_base_on_e=False)
        head_major = corrected.movedim(0, 1).contiguous()  # the communicator's copy
        scattered = head_major[:h].clone()  # the reduce-scatter's result (no sum: no wire)
        output.copy_(scattered.movedim(0, 1).contiguous())

    def ag_rs_new():
        corrected, _ = ns["correct_attn_out"](out, lses, 0, None, is_lse_base_on_e=False)
        scattered = rank_major(corrected, world)[:t].clone()
        output.copy_(scattered)

    res: dict[str, Any] = {"W": world, "T": t}
    for name, fn in (
        ("a2a_old", a2a_old),
        ("a2a_new", a2a_new),
        ("ag_rs_old", ag_rs_old),
        ("ag_rs_new", ag_rs_new),
    ):
        res[f"{name}_graph_ms"] = graph_ms(fn)
        res[f"{name}_eager_ms"] = eager_ms(fn)
    return res


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("baked", type=Path, help="baked tree root (holds vllm/)")
    ap.add_argument("--out", type=Path, default=os.environ.get("OUT"))
    ap.add_argument("--device", default="cuda", help="cpu: the checks only (TRITON_INTERPRET=1)")
    ap.add_argument("--quick", action="store_true", help="W 2, T 1 and 3 only (the CPU dry run)")
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    ns = gtk.load(args.baked).dcp
    shapes = (
        [(2, 1), (2, 3)] if args.quick else [(w, t) for w in (2, 4) for t in TOKENS if t <= 512]
    )
    checks = [check(ns, device, w, t, seed=i) for i, (w, t) in enumerate(shapes)]
    times = (
        [timing(ns, device, w, t) for w in (2, 4) for t in TOKENS] if device.type == "cuda" else []
    )
    res = {
        "environment": gtk.environment(device),
        "ok": all(c["ok"] for c in checks),
        "checks": checks,
        "timing": times,
    }
    print(json.dumps(res, indent=1))
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "gpu_combine_copies.json").write_text(json.dumps(res, indent=1) + "\n")
    return 0 if res["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
