"""Stage 4 through the indexer's own prefill and decode call sites, on CPU over real gloo
groups (decode as stage 5's verification steps: two rows a request).

Usage: ``python -O tests/lab/dcp/_dcp_indexer_driver.py TREE`` (``run_driver`` sets it
up). It runs the baked ``sparse_attn_indexer`` op (patch 06) for a prefill chunk, and for a
decode step of verification rows (each with its own bound), twice per rank, as the
candidate source (writes the blocks) and as a consumer (masks to them), with the
interleave taken from ``SparseAttnIndexer.cp_kv_cache_interleave_size`` of an indexer of
compress_ratio 4 (token interleave 4 * K, so state units are K). What the op reaches
for and CPU lacks is replaced by stand-ins at the module's names: the forward context
and its metadata, the workspace, DeepGEMM's logits (this rank's packed columns of a
known global row; the paged logits of decode likewise), the row and decode top-k (they
record the logits they are given), the cache view and the DCP top-k merge. Everything
between (the call site's widths, ``_candidate_step``, patch 01's kernels, the
all-reduce) is the baked code. One ``RESULT {json}`` line, as _dcp_candidate_driver's.

Checks per rank: the published blocks equal the reference DCP1 candidates (up to ties)
and are the same on every rank; the consumer's logits equal the reference DCP1 mask on
this rank's columns; and with one candidate beyond the chunk's width (the edge flag,
slot ``nblocks``) DCP1's clamp keeps the last global position, on the rank that owns it.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace

import _dcp_index_k as index_k
import torch
from _dcp_candidate_driver import (
    KERNELS,
    Case,
    Report,
    layout,
    load,
    reference_rows,
    same_up_to_ties,
)
from _dcp_child import MARK, faster_interpreter, fork_ranks, rank_file, run_child

RATIO = 4  # the indexer's compress_ratio: positions are compressed states
PREFIX = "layers.0.indexer.k_cache"
CHECKS = ("published_eq_reference", "published_same_on_every_rank", "mask_eq_reference",
          "edge_kept_at_global_last")  # fmt: skip
# a chunk of enough rows that the size rule takes the index-K exchange (30 keys of
# 132 B on the wire against 60 rows x 61 x 4 B dense); keys, q and weights as _dcp_index_k's
INDEX_K_CASE = index_k.KCase(2, 1, 1, 32, (60,), 60, 41)
INDEX_K_CHECKS = ("index_k_taken", "index_k_published_eq_dcp1")
# One request per chunk (DCP1's edge clamp is on packed columns: one request keeps it
# on the global last position), local totals equal across ranks (a width mix-up then
# gives wrong blocks, not mismatched collectives).
CASES = [
    Case("prefill", 2, 1, 8, 3, (40,), 4, seed=21),
    Case("prefill", 2, 2, 4, 4, (36,), 3, seed=22),
    Case("prefill", 4, 1, 4, 3, (48,), 2, seed=23),
    # Stage 5's verification steps through the decode call site: each request's newest
    # position opens a candidate block, so a row bounded by its neighbour's position
    # pins another block.
    Case("verify", 2, 1, 8, 3, (41, 17), width=48, seed=24),
    Case("verify", 4, 2, 4, 3, (33, 9), width=40, seed=25),
]


def run_driver(tree: Path, timeout: float = 600) -> dict:
    return run_child(
        __file__, tree, env={"TRITON_INTERPRET": "1"}, timeout=timeout, python_flags=["-O"]
    )


def _interleave(mod, w: int, k: int) -> int:
    """The indexer's own property, for a compressed indexer (token interleave RATIO * k)."""
    fake = SimpleNamespace(
        _cp_kv_cache_interleave_size=None,
        _parallel_config=SimpleNamespace(cp_kv_cache_interleave_size=RATIO * k),
        dcp_world_size=w,
        compress_ratio=RATIO,
        k_cache=SimpleNamespace(prefix=PREFIX),
    )
    fake._merge_interleave = lambda t: mod.SparseAttnIndexer._merge_interleave(fake, t)
    return mod.SparseAttnIndexer.cp_kv_cache_interleave_size.fget(fake)


def _stand_ins(mod, packed: torch.Tensor, seen: list) -> None:
    def workspace_get(*specs):
        return [torch.zeros(shape, dtype=dtype) for shape, dtype in specs]

    mod.current_workspace_manager = lambda: SimpleNamespace(get_simultaneous=workspace_get)
    mod.fp8_fp4_mqa_logits = lambda *args, **kwargs: packed.clone()
    mod.ops = SimpleNamespace(
        top_k_per_row_prefill=lambda logits, *rest: seen.append(logits.clone()),
        cp_gather_indexer_k_quant_cache=lambda *args: None,
    )
    mod._merge_dcp_topk_global = lambda *args, **kwargs: None


def _run_op(mod, case: Case, rank: int, w: int, n: int, gw: int, candidates, write: bool):
    """The baked op on ``n`` rows of DCP1 width ``gw``, with the stand-ins already set."""
    mod.sparse_attn_indexer(
        torch.zeros(n, 8),  # hidden_states: only its row count is read
        PREFIX,
        None,  # kv_cache: the gather is skipped; decode's logits stand-in ignores it
        torch.zeros(n, 1, 8),  # q_quant
        None,
        None,
        torch.zeros(n, 1),  # weights
        128,
        None,
        8,  # topk_tokens
        8,
        gw,
        gw,
        torch.full((n, 8), -1, dtype=torch.int32),
        True,  # skip_k_cache_insert
        False,
        False,
        "",
        dcp_rank=rank,
        dcp_world_size=w,
        cp_kv_cache_interleave_size=_interleave(mod, w, case.k),
        candidate_blocks=candidates,
        candidate_block_size=case.bs,
        candidate_write=write,
    )


def _call(mod, case: Case, rank: int, w: int, candidates, write: bool) -> torch.Tensor:
    """One op call; the logits the row top-k received."""
    packed, ks, ke, gw, _, rows = layout(case, rank, w, case.k)
    n = len(rows)
    chunk = SimpleNamespace(
        cu_seqlen_ks=ks,
        cu_seqlen_ke=ke,
        local_cu_seq_lens=torch.tensor([0, packed.shape[1]], dtype=torch.int32),
        max_local_total_seq_lens=packed.shape[1],
        skip_kv_gather=True,
        local_total_seq_lens=packed.shape[1],
        total_seq_lens=gw,
        token_start=0,
        token_end=n,
        pcp_deinterleave_idx=None,
        block_table=None,
    )
    meta = SimpleNamespace(
        slot_mapping=torch.zeros(n, dtype=torch.int64),
        num_decodes=0,
        num_prefills=1,
        num_decode_tokens=0,
        prefill=SimpleNamespace(chunks=[chunk]),
    )
    context = SimpleNamespace(attn_metadata={PREFIX: meta}, cudagraph_runtime_mode=None)
    mod.get_forward_context = lambda: context
    seen: list[torch.Tensor] = []
    _stand_ins(mod, packed, seen)
    _run_op(mod, case, rank, w, n, gw, candidates, write)
    return seen[0]


def _call_verify(mod, case: Case, rank: int, w: int, candidates, write: bool) -> torch.Tensor:
    """One decode call of verification steps (two rows a request, each bounded at its own
    position, localized as vLLM's indexer builder gives them); the logits the decode
    top-k received."""
    packed, _, ke, gw, _, rows = layout(case, rank, w, case.k)
    n, reqs = len(rows), len(rows) // 2
    decode = SimpleNamespace(
        seq_lens=ke.view(reqs, 2).clone(),
        decode_lens=torch.full((reqs,), 2, dtype=torch.int32),
        requires_padding=False,
        block_table=torch.zeros(reqs, 1, dtype=torch.int32),
        schedule_metadata=None,
        indices=None,
        global_seq_lens=None,
    )
    meta = SimpleNamespace(
        slot_mapping=torch.zeros(n, dtype=torch.int64),
        num_decodes=reqs,
        num_prefills=0,
        num_decode_tokens=n,
        decode=decode,
        max_seq_len=gw,
    )
    context = SimpleNamespace(attn_metadata={PREFIX: meta}, cudagraph_runtime_mode=None)
    mod.get_forward_context = lambda: context
    seen: list[torch.Tensor] = []
    mod.kv_cache_as_quant_view = lambda kv_cache, *args: kv_cache
    mod.fp8_fp4_paged_mqa_logits = lambda *args, **kwargs: packed.clone()
    mod.get_indexer_topk = lambda backend: lambda logits, *rest: seen.append(logits.clone())
    _run_op(mod, case, rank, w, n, gw, candidates, write)
    return seen[0]


def _call_index_k(mod, case, rank: int) -> dict:
    """The op as the candidate source on INDEX_K_CASE, with this rank's keys in the
    workspace and the keys' logits stand-in; the key counts of each logits call."""
    _, _, q, weights, rows = index_k.global_inputs(case)
    kq, ksc, ks, ke, local_rows, max_rows = index_k.local_view(case, rank)
    n, total = len(rows), sum(case.lens)
    lens = torch.tensor(case.lens)
    chunk = SimpleNamespace(
        cu_seqlen_ks=ks,
        cu_seqlen_ke=ke,
        cu_seq_lens=torch.tensor([0, *lens.cumsum(0).tolist()], dtype=torch.int32),
        local_cu_seq_lens=torch.tensor([0, local_rows], dtype=torch.int32),
        max_local_total_seq_lens=max_rows,
        skip_kv_gather=True,
        local_total_seq_lens=local_rows,
        total_seq_lens=total,
        token_start=0,
        token_end=n,
        pcp_deinterleave_idx=None,
        block_table=None,
    )
    meta = SimpleNamespace(
        slot_mapping=torch.zeros(n, dtype=torch.int64),
        num_decodes=0,
        num_prefills=1,
        num_decode_tokens=0,
        prefill=SimpleNamespace(chunks=[chunk]),
    )
    mod.get_forward_context = lambda: SimpleNamespace(
        attn_metadata={PREFIX: meta}, cudagraph_runtime_mode=None
    )

    def workspace_get(values_spec, scales_spec, *more):
        values = torch.zeros(values_spec[0], dtype=torch.uint8).view(values_spec[1])
        scales = torch.zeros(scales_spec[0], dtype=scales_spec[1])
        values[: kq.shape[0]], scales[: ksc.shape[0]] = kq, ksc
        return [values, scales]

    widths: list[int] = []

    def logits(q, kv, *args, **kwargs):
        widths.append(kv[0].shape[0])
        return index_k.mqa_logits(q, kv, *args, **kwargs)

    mod.current_workspace_manager = lambda: SimpleNamespace(get_simultaneous=workspace_get)
    mod.fp8_fp4_mqa_logits = logits
    mod.ops = SimpleNamespace(
        top_k_per_row_prefill=lambda *args: None, cp_gather_indexer_k_quant_cache=None
    )
    mod._merge_dcp_topk_global = lambda *args, **kwargs: None
    cands = torch.full((n, case.topk_blocks), 99, dtype=torch.int32)
    mod.sparse_attn_indexer(
        torch.zeros(n, 8), PREFIX, None, q, None, None, weights, 128, None, 8,
        index_k.DIM, total, total, torch.full((n, 8), -1, dtype=torch.int32), True, False,
        False, "", dcp_rank=rank, dcp_world_size=case.w,
        cp_kv_cache_interleave_size=_interleave(mod, case.w, case.k),
        candidate_blocks=cands, candidate_block_size=case.bs, candidate_write=True,
    )  # fmt: skip
    return {"published": cands, "widths": widths}


def check_index_k(report: Report, kernels, outs: list[dict]) -> None:
    case = INDEX_K_CASE
    want = index_k.dcp1(kernels, case)
    for rank, out in enumerate(outs):
        label = f"{case.name}:op:r{rank}"
        if "error" in out:
            for name in INDEX_K_CHECKS:
                report.check(name, label, False, out["error"])
            continue
        report.check("index_k_taken", label, sum(case.lens) in out["widths"], str(out["widths"]))
        got = out["published"]
        report.check(
            "index_k_published_eq_dcp1",
            label,
            torch.equal(got, want)
            and all("published" in o and torch.equal(o["published"], got) for o in outs),
            f"{got.tolist()[:3]} vs DCP1 {want.tolist()[:3]}",
        )


def run_case(mod, case: Case, rank: int, w: int) -> dict:
    _, _, _, gw, _, rows = layout(case, rank, w, case.k)
    call = _call_verify if case.kind == "verify" else _call
    published = torch.full((len(rows), case.topk_blocks), 99, dtype=torch.int32)
    call(mod, case, rank, w, published, True)
    masked = call(mod, case, rank, w, published.clone(), False)
    # As from a source wider than this consumer: no block holding the last global position,
    # one candidate beyond the width (the edge flag); DCP1's clamp keeps that last position.
    beyond = -(-gw // case.bs) + 2
    last_block = published == (gw - 1) // case.bs
    edged = torch.cat(
        [published.masked_fill(last_block, -1), torch.full((len(rows), 1), beyond)], 1
    ).to(torch.int32)
    edge = call(mod, case, rank, w, edged, False)
    return {"published": published, "masked": masked, "edge": edge, "edged": edged}


def _gloo_rank(mod, rank: int, w: int, store_path: str, outdir: str) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.FileStore(store_path, w), rank=rank, world_size=w)
    try:
        outs = [run_case(mod, case, rank, w) for case in CASES if case.w == w]
        if w == INDEX_K_CASE.w:
            try:  # a bug that raises (before any collective) fails the checks, not the run
                outs.append(_call_index_k(mod, INDEX_K_CASE, rank))
            except Exception as exc:
                outs.append({"error": f"{type(exc).__name__}: {exc}"})
        torch.save(outs, rank_file(outdir, rank))
    finally:
        dist.destroy_process_group()


def expected_mask(case: Case, rank: int, cands: torch.Tensor, edge: bool) -> torch.Tensor:
    """This rank's columns of DCP1's masked logits inside each row's bounds (reference
    mask; with ``edge``, the global last position also kept where a row sees it: DCP1's
    clamp, which the reference does not model); outside them the logits as they came
    (the DCP mask writes only the row's own columns, the only ones the top-k reads)."""
    from lab.dcp import reference as ref

    logits, ends, _, _ = reference_rows(case)
    packed, ks, _, gw, owned, rows = layout(case, rank, case.w, case.k)
    masked1 = ref.mask_candidates_dcp1(logits, ends, cands, case.bs)
    if edge:
        last = gw - 1
        seen = ends > last
        masked1[seen, last] = logits[seen, last]
    out = packed.clone()
    for i, (req, end) in enumerate(rows):
        for j, p in enumerate(owned[req]):
            if p < end:
                out[i, int(ks[i]) + j] = masked1[i, p]
    return out


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.equal(a.isnan(), b.isnan()) and torch.equal(a.nan_to_num(), b.nan_to_num())


def check_case(report: Report, case: Case, outs: list[dict]) -> None:
    _, ends, pinned, want = reference_rows(case)
    for rank, out in enumerate(outs):
        label = f"{case.name}:r{rank}"
        got = out["published"]
        bad = [
            i
            for i in range(len(ends))
            if not same_up_to_ties(got[i].tolist(), want[i].tolist(), pinned[i])
        ]
        report.check("published_eq_reference", label, not bad, f"rows {bad}: {got.tolist()}")
        same = all(torch.equal(o["published"], got) for o in outs)
        report.check("published_same_on_every_rank", label, same, str(got.tolist()))
        expect = expected_mask(case, rank, got, False)
        report.check("mask_eq_reference", label, _same(expect, out["masked"]))
        edged = out["edged"]
        expect = expected_mask(case, rank, edged, True)
        report.check("edge_kept_at_global_last", label, _same(expect, out["edge"]))


def main(tree: str) -> None:
    torch.set_num_threads(1)
    mod = load(tree)
    report = Report()
    for w in sorted({c.w for c in CASES}):
        per_rank = fork_ranks(lambda r, store, out, w=w: _gloo_rank(mod, r, w, store, out), w, 400)
        cases = [c for c in CASES if c.w == w]
        for i, case in enumerate(cases):
            check_case(report, case, [per_rank[r][i] for r in range(w)])
        if w == INDEX_K_CASE.w:
            check_index_k(report, sys.modules[KERNELS], [per_rank[r][-1] for r in range(w)])
    result = {"vllm_file": str(Path(mod.__file__).resolve()), "checks": report.checks}
    print(MARK + json.dumps(result), flush=True)


if __name__ == "__main__":
    faster_interpreter()
    main(sys.argv[1])
