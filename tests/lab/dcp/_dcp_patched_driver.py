"""Run patch 09's pure-torch DCP helpers from a baked tree against the reference.

Usage: ``python tests/lab/dcp/_dcp_patched_driver.py TREE`` with ``TREE`` first on
``PYTHONPATH`` (``run_driver`` does that). It imports vLLM from ``TREE`` (and
refuses any other vLLM), builds the SM120 sparse-MLA attention class without a
model (``object.__new__`` plus the attributes the helpers read), drives it per
rank and prints one ``RESULT {json}`` line: ``{"vllm_file", "class", "checks":
[{"name", "case", "ok", "detail"}]}``.

Ranks run two ways, through the same ``rank_outputs``:
- real gloo process groups, W=2 and W=4, forked after the (20 s) vLLM import so
  it is paid once;
- a sequential record/replay group for a wider W/K/page-size sweep: pass 1
  records every rank's ``all_gather`` input, pass 2 hands each rank the W
  ranks' real inputs (and checks it sent the same input again).

Also, in the parent (series-side fixes of issue 13):
- stage 9 across layers (replay group, W=2 and W=4): two layers of
  compress_ratio 1 and 2 share one top-k
  buffer (overwritten in place between them) and one metadata object; each must
  get its own slots, a consumer of the same cache must reuse its gather, and no
  gathered KV may outlive the next source's gather or the step's metadata;
- patch 02's DCP refusals, by running the real ``__init__`` of each V4.1
  attention class on a config that raises as soon as anything past the
  refusal reads it;
- patch 09's ag_rs combine warm-up registration, read back from vLLM's
  ``JitWarmupRegistry``;
- patch 09's prefill timing: ``_run_sm120_dcp`` with its CUDA events, SM120
  kernel and combine replaced, must hand token counts to patch 01's
  ``prefill_acc_add``, whose log line then shows a tok/s figure.

Not run here (CUDA, Triton or FlashInfer SM120; see tests/lab/dcp/test_dcp_forward*.py
for the forward under ``TRITON_INTERPRET=1``): ``_compressed_topk_to_slots`` and
the real kernels of ``_run_sm120_dcp``.
"""

from __future__ import annotations

import ast
import gc
import json
import logging
import math
import os
import sys
import traceback
import weakref
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from types import SimpleNamespace
from unittest import mock

import torch
from _dcp_child import MARK, faster_interpreter, fork_ranks, rank_file, run_child

REPO = Path(__file__).resolve().parents[3]
MODULE = "vllm.models.deepseek_v41.nvidia.flashinfer_sparse"
TOL, LSE_TOL = 1e-5, 1e-4  # fp32, as in vLLM's DCP combine tests

# Check names, so the tests can tell a planted index bug from broken plumbing.
GATHER_CHECKS = ("gather_kv", "gather_slots", "gather_lens", "gather_lookup", "gather_attention")
OTHER_CHECKS = ("sink", "sink_cached", "neutral_swa", "interleave", "interleave_refusal")
TWO_LAYER_CHECKS = ("two_layer_slots", "two_layer_lookup", "two_layer_reuse", "two_layer_freed")
REFUSAL_CHECKS = ("dcp_refused", "dcp_admitted", "rocm_refused_by_base", "combine_source")
SERIES_CHECKS = TWO_LAYER_CHECKS + REFUSAL_CHECKS + ("combine_warmup", "prefill_timing_tokens")
# What a planted index-conversion bug may fail: everything that reads the slots.
INDEX_CHECKS = GATHER_CHECKS + ("two_layer_slots", "two_layer_lookup")


def run_driver(tree: Path, timeout: float = 300) -> dict:
    """Run this file in a child with ``tree`` first on PYTHONPATH; its parsed result."""
    return run_child(__file__, tree, timeout=timeout)


# ---- cases ------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    """One prefill step: requests ``n_states`` (decodes first), ``tokens`` rows each."""

    w: int
    k: int  # interleave in compressed-state units
    bs: int  # states per page
    ratio: int  # compress_ratio; the token interleave is k * ratio
    n_states: tuple[int, ...]
    tokens: tuple[int, ...]  # decode requests have no prefill rows: 0
    num_decodes: int
    seed: int

    @property
    def name(self) -> str:
        return f"W{self.w}K{self.k}bs{self.bs}r{self.ratio}s{self.seed}"


GLOO_CASES = {
    2: [
        Case(2, 2, 4, 4, (5, 1, 37, 9), (0, 0, 3, 2), 2, 1),
        Case(2, 1, 2, 1, (11, 4), (2, 3), 0, 2),
    ],
    4: [
        # request 1 has fewer states than W: some ranks own none of it
        Case(4, 2, 4, 4, (3, 2, 70), (0, 2, 4), 1, 3),
        Case(4, 4, 8, 128, (40, 130), (3, 3), 0, 4),
    ],
}


def sweep_cases() -> list[Case]:
    cases, seed = [], 100
    for w in (2, 4, 8):
        for k in (1, 2, 4, 8):
            for bs in (k, 2 * k):
                seed += 1
                span = bs * w
                # short (< W states), around one virtual block, several blocks
                n = (max(1, w - 1), span + k, 3 * span + 1)
                cases.append(Case(w, k, bs, 4, (7, *n), (0, 2, 2, 3), 1, seed))
    return cases


def edge_ids(case: Case, n: int, topk: int, rank: int | None) -> torch.Tensor:
    """Ids at interleave, page, rank and virtual-block edges, or all of one rank's."""
    k, w, bs = case.k, case.w, case.bs
    if rank is None:
        pts = {0, k - 1, k, k * w - 1, k * w, bs - 1, bs, bs * w - 1, bs * w, bs * w + k, n - 1}
        ids = sorted(p for p in pts if 0 <= p < n)
    else:
        ids = [s for s in range(n) if (s // k) % w == rank]
    out = torch.full((topk,), -1, dtype=torch.int32)
    ids = ids[:topk]
    out[: len(ids)] = torch.tensor(ids, dtype=torch.int32)
    return out


def build(case: Case):
    """The step, reference caches and seq_lens; deterministic in every process."""
    from lab.dcp import reference as ref

    assert all(t == 0 for t in case.tokens[: case.num_decodes])
    gen = torch.Generator().manual_seed(case.seed)
    step = ref.random_step(
        gen, case.n_states, case.tokens, heads=2 * case.w, topk=16, padding_rows=1
    )
    ids = step.topk_ids.clone()
    real = int(step.is_valid.sum())
    # row 0: edge ids; row 1: every candidate on the last rank; row 2: all -1
    for row, rank in ((0, None), (1, case.w - 1)):
        if row < real:
            n = case.n_states[int(step.token_to_req[row])]
            ids[row] = edge_ids(case, n, ids.shape[1], rank)
    if real > 2:
        ids[2] = -1
    step = replace(step, topk_ids=ids)
    layout = ref.ShardLayout(case.w, case.k, case.bs)
    caches = ref.build_caches(step.states, layout, gen)
    # token counts, not multiples of the ratio: the patch floors them to states
    seq_lens = [n * case.ratio + b % case.ratio for b, n in enumerate(case.n_states)]
    return step, layout, caches, seq_lens


# ---- the patched class, without a model ------------------------------------


def patched_class():
    import vllm

    mod = __import__(MODULE, fromlist=["_"])
    found = [
        c for c in vars(mod).values() if isinstance(c, type) and "_dcp_prefill_gather" in vars(c)
    ]
    assert len(found) == 1, f"classes holding _dcp_prefill_gather: {found}"
    return vllm, found[0]


def make_layer(cls, group, rank: int, case: Case, local_sink: torch.Tensor, max_tokens: int = 8):
    """``object.__new__`` + the attributes patches 02/09's __init__ would set."""
    layer = object.__new__(cls)
    torch.nn.Module.__init__(layer)
    layer.layer_id = 7
    layer.compress_ratio = case.ratio
    layer.n_local_heads = 2
    layer.dcp_world_size = case.w
    layer.dcp_rank = rank
    layer.dcp_group = group
    # Patch 02's property derives K from the token interleave: set tokens, not K.
    layer._dcp_parallel_config = SimpleNamespace(cp_kv_cache_interleave_size=case.k * case.ratio)
    layer._dcp_interleave_override = None
    layer.attn_sink = torch.nn.Parameter(local_sink, requires_grad=False)
    layer._dcp_sink = None
    layer._dcp_empty_swa = {}
    layer.max_num_batched_tokens = max_tokens
    return layer


def make_meta(seq_lens: list[int], block_table: torch.Tensor):
    """The real (patch 04) compressed-cache metadata; only the gather's fields matter."""
    from vllm.models.deepseek_v41.sparse_mla import DeepseekV4FlashMLAMetadata

    empty = torch.zeros(0, dtype=torch.int32)
    return DeepseekV4FlashMLAMetadata(
        num_reqs=len(seq_lens),
        max_query_len=0,
        max_seq_len=max(seq_lens),
        num_actual_tokens=0,
        query_start_loc=empty,
        slot_mapping=empty,
        block_table=block_table,
        req_id_per_token=empty,
        block_size=0,
        topk_tokens=0,
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
    )


def rank_outputs(cls, group, case: Case) -> dict:
    """What one rank's patched helpers return for ``case`` (collectives via ``group``)."""
    rank = group.rank_in_group
    step, _, caches, seq_lens = build(case)
    # Padded like a real sink parameter; NaN so a missing [:n_local_heads] shows.
    local_sink = torch.cat([step.sink[2 * rank : 2 * rank + 2], torch.full((2,), math.nan)])
    layer = make_layer(cls, group, rank, case, local_sink)
    meta = make_meta(seq_lens, caches[rank].block_table)
    kv, slots, lens = layer._dcp_prefill_gather(
        caches[rank].pool,
        step.topk_ids,
        step.token_to_req,
        step.is_valid,
        meta,
        case.num_decodes,
        len(case.n_states) - case.num_decodes,
        case.bs,
    )
    sink = layer._dcp_attn_sink()
    return {
        "kv": kv.clone(),
        "slots": slots.clone(),
        "lens": lens.clone(),
        "sink": sink.clone(),
        "sink_cached": layer._dcp_attn_sink() is sink,
    }


class ReplayGroup:
    """Rank ``rank`` of W ranks that run one after another.

    ``book[i][r]`` is rank r's input to its i-th ``all_gather``: filled in the
    recording pass (which returns a placeholder), read in the replay pass.
    """

    def __init__(self, book: dict, rank: int, world_size: int, record: bool) -> None:
        self.book, self.rank_in_group, self.world_size = book, rank, world_size
        self.record, self.calls = record, 0

    def all_gather(self, x: torch.Tensor, dim: int = 0) -> torch.Tensor:
        i, self.calls = self.calls, self.calls + 1
        if self.record:
            self.book.setdefault(i, {})[self.rank_in_group] = x.clone()
            return torch.cat([x] * self.world_size, dim=dim)
        mine = self.book[i][self.rank_in_group]
        # the input must not depend on what the recording pass handed back
        assert torch.equal(x.nan_to_num(), mine.nan_to_num()), "all_gather input changed"
        return torch.cat([self.book[i][r] for r in range(self.world_size)], dim=dim)

    def reduce_scatter(self, x: torch.Tensor, dim: int = 0) -> torch.Tensor:
        raise NotImplementedError("not used by the helpers under test")

    def all_to_all(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError("not used by the helpers under test")


def run_sequential(cls, case: Case) -> list[dict]:
    book: dict = {}
    for r in range(case.w):
        rank_outputs(cls, ReplayGroup(book, r, case.w, record=True), case)
    return [
        rank_outputs(cls, ReplayGroup(book, r, case.w, record=False), case) for r in range(case.w)
    ]


def _gloo_rank(cls, rank: int, w: int, store_path: str, outdir: str) -> None:
    import torch.distributed as dist

    from lab.dcp import reference as ref

    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.FileStore(store_path, w), rank=rank, world_size=w)
    try:
        group = ref.TorchGroup()
        results = [rank_outputs(cls, group, c) for c in GLOO_CASES[w]]
        torch.save(results, rank_file(outdir, rank))
    finally:
        dist.destroy_process_group()


def run_gloo(cls, w: int) -> list[list[dict]]:
    """``[case][rank]`` outputs from W forked processes over one gloo group."""
    per_rank = fork_ranks(lambda r, store, out: _gloo_rank(cls, r, w, store, out), w, 120)
    return [[per_rank[r][i] for r in range(w)] for i in range(len(GLOO_CASES[w]))]


# ---- stage 9 across layers --------------------------------------------------


@dataclass(frozen=True)
class TwoLayerCase:
    """Layers of compress_ratio 1 then 2 in one prefill step: one metadata
    object (token pages of ``token_block``, token interleave ``token_k``)."""

    w: int
    token_block: int
    token_k: int
    seq_lens: tuple[int, ...]  # tokens per request, decodes first
    tokens: tuple[int, ...]
    num_decodes: int
    seed: int
    ratios: tuple[int, ...] = (1, 2)

    @property
    def name(self) -> str:
        return f"W{self.w}B{self.token_block}k{self.token_k}s{self.seed}"

    def layer_case(self, ratio: int) -> Case:
        n_states = tuple(sl // ratio for sl in self.seq_lens)
        return Case(
            self.w,
            self.token_k // ratio,
            self.token_block // ratio,
            ratio,
            n_states,
            self.tokens,
            self.num_decodes,
            self.seed,
        )


# 33 and 65 tokens: the ratio-2 layer needs one page per rank fewer than the
# ratio-1 layer (floor to whole states), so page geometry shared across ratios
# shows, in either layer order.
TWO_LAYER_CASES = (
    TwoLayerCase(2, 8, 4, (9, 33, 50), (0, 3, 4), 1, 11),
    TwoLayerCase(4, 8, 2, (70, 13, 65), (0, 2, 3), 1, 12, ratios=(2, 1)),
)


def fill_pool(states, layout, table: torch.Tensor, n_pages: int) -> torch.Tensor:
    """One rank's pool for ``states`` placed through an existing block table."""
    pools = []
    for rank in range(layout.world_size):
        pool = torch.full((n_pages, layout.page_size, states[0].shape[-1]), math.nan)
        for req, st in enumerate(states):
            owner, page, off = ref_placement(st.shape[0], layout)
            mine = owner == rank
            pool[table[rank][req, page[mine]].long(), off[mine]] = st[mine]
        pools.append(pool)
    return pools


def ref_placement(n: int, layout):
    from lab.dcp import reference as ref

    return ref.placement(torch.arange(n), layout.world_size, layout.interleave, layout.page_size)


def build_two_layer(tc: TwoLayerCase):
    """Per layer, in ``tc.ratios`` order: (case, step, layout, per-rank pools);
    plus the per-rank block tables of the one metadata object."""
    from lab.dcp import reference as ref

    gen = torch.Generator().manual_seed(tc.seed)
    layers, tables = [], None
    for ratio in sorted(tc.ratios):  # ratio 1 has the most pages: it sizes the tables
        case = tc.layer_case(ratio)
        step = ref.random_step(
            gen, case.n_states, case.tokens, heads=2 * case.w, topk=16, padding_rows=1
        )
        layout = ref.ShardLayout(case.w, case.k, case.bs)
        if tables is None:  # the first layer's placement decides the pages
            caches = ref.build_caches(step.states, layout, gen)
            tables = [c.block_table for c in caches]
            n_pages = caches[0].pool.shape[0]
            pools = [c.pool for c in caches]
        else:
            pools = fill_pool(step.states, layout, tables, n_pages)
        layers.append((case, step, layout, pools))
    layers.sort(key=lambda layer: tc.ratios.index(layer[0].ratio))
    return layers, tables


def two_layer_outputs(cls, group, tc: TwoLayerCase) -> dict:
    """Both layers through one metadata object and one in-place top-k buffer."""
    rank = group.rank_in_group
    layers, tables = build_two_layer(tc)
    meta = make_meta(list(tc.seq_lens), tables[rank])
    buf = torch.empty_like(layers[0][1].topk_ids)  # the model-wide top-k buffer
    nd, npre = tc.num_decodes, len(tc.seq_lens) - tc.num_decodes
    got, held = [], []
    for i, (case, step, layout, pools) in enumerate(layers):
        buf.copy_(step.topk_ids)  # this layer's index source writes in place
        args = (
            pools[rank],
            buf,
            step.token_to_req,
            step.is_valid,
            meta,
            nd,
            npre,
            layout.page_size,
        )
        layer = make_layer(cls, group, rank, case, torch.zeros(2))
        kv, slots, lens = layer._dcp_prefill_gather(*args)
        got.append({"kv": kv.clone(), "slots": slots.clone(), "lens": lens.clone()})
        if i == 0:
            # a consumer layer of the same cache: same gather, no collective
            calls = group.calls
            consumer = make_layer(cls, group, rank, case, torch.zeros(2))
            got[0]["reused"] = consumer._dcp_prefill_gather(*args)[0] is kv and (
                group.calls == calls
            )
        held.append(weakref.ref(kv))
        del kv, slots, lens, args
        gc.collect()
        # the step holds the current source's gather and nothing older
        got[i]["alive"] = [h() is not None for h in held]
    del meta
    gc.collect()
    return {"layers": got, "alive_after_step": [h() is not None for h in held]}


def run_two_layer_sequential(cls, tc: TwoLayerCase) -> list[dict]:
    book: dict = {}
    for r in range(tc.w):
        two_layer_outputs(cls, ReplayGroup(book, r, tc.w, record=True), tc)
    return [
        two_layer_outputs(cls, ReplayGroup(book, r, tc.w, record=False), tc) for r in range(tc.w)
    ]


def check_two_layers(report: Report, tc: TwoLayerCase, outs: list[dict]) -> None:
    from lab.dcp import reference as ref

    layers, tables = build_two_layer(tc)
    nd = tc.num_decodes
    for i, (case, step, layout, pools) in enumerate(layers):
        want = ref.run_spmd(
            tc.w,
            lambda g, step=step, layout=layout, pools=pools, case=case: ref.prefill_gather(
                g,
                ref.PagedCache(pools[g.rank_in_group], tables[g.rank_in_group]),
                layout,
                list(tc.seq_lens[nd:]),
                case.ratio,
                nd,
                step.topk_ids,
                step.token_to_req,
                step.is_valid,
            ),
        )
        for rank, out in enumerate(outs):
            got = out["layers"][i]
            rn = f"{tc.name}:ratio{case.ratio}:r{rank}"

            def slots(got=got, want=want[rank]):
                _equal(got["slots"], want.slots)
                _equal(got["lens"], want.lens)
                same_bits(got["kv"].reshape(want.kv.shape), want.kv)

            report.check("two_layer_slots", rn, slots)
            report.check(
                "two_layer_lookup",
                rn,
                lambda got=got, step=step: lookup(step, got["kv"], got["slots"], got["lens"]),
            )
    for rank, out in enumerate(outs):
        rn = f"{tc.name}:r{rank}"
        first = out["layers"][0]
        report.check(
            "two_layer_reuse", rn, lambda f=first: None if f["reused"] else "gathered again"
        )

        def freed(out=out):
            # after layer 1: its gather alive; after layer 2: only layer 2's;
            # after the step's metadata is gone: none
            want = ([True], [False, True], [False, False])
            seen = (out["layers"][0]["alive"], out["layers"][1]["alive"], out["alive_after_step"])
            assert seen == want, f"gathered KV alive (per layer) {seen}, want {want}"

        report.check("two_layer_freed", rn, freed)


# ---- patch 02's DCP refusals -------------------------------------------------


class PastTheGate(Exception):
    """Raised when ``__init__`` reads the model config, i.e. after the refusals."""


class GateConfig:
    """A vLLM config with just what the refusal reads; anything else raises."""

    def __init__(
        self, dcp=2, pcp=1, v2=True, spec=None, replay=False, dbo=False, qrep=False
    ) -> None:
        self.parallel_config = SimpleNamespace(
            decode_context_parallel_size=dcp,
            prefill_context_parallel_size=pcp,
            use_ubatching=dbo,
            dcp_q_replicate=qrep,
        )
        self.cache_config = SimpleNamespace(swa_bounded_replay=replay)
        self.use_v2_model_runner = v2
        self.speculative_config = spec

    def __getattr__(self, name: str):
        raise PastTheGate(name)


SUPPORTED = "FLASHINFER_MLA_SPARSE_DSV41"


def build_layer(cls, config) -> str:
    """Run ``cls.__init__``: 'admitted' if it got past the refusals, else the message."""
    layer = object.__new__(cls)
    try:
        cls.__init__(layer, config, prefix="model.layers.3.attn")
    except PastTheGate:
        return "admitted"
    except NotImplementedError as exc:
        return str(exc)
    return "built"


def attention_classes(sm120) -> dict[str, type]:
    from vllm.models.deepseek_v41.nvidia.flash_mla_mega_attn import DeepseekV4MegaAttnAttention
    from vllm.models.deepseek_v41.nvidia.flashinfer_sparse import (
        DeepseekV4FlashInferMLAAttention,
    )
    from vllm.models.deepseek_v41.nvidia.flashmla import DeepseekV4FlashMLAAttention

    return {
        "sm120": sm120,
        "flashinfer_non_sm120": DeepseekV4FlashInferMLAAttention,
        "flashmla": DeepseekV4FlashMLAAttention,
        "mega_attention": DeepseekV4MegaAttnAttention,
    }


def check_refusals(report: Report, sm120, tree: Path) -> None:
    from vllm.models.deepseek_v41.attention import DeepseekV4Attention

    classes = attention_classes(sm120)
    for name, cls in classes.items():
        if name == "sm120":
            continue

        def refused(cls=cls):
            msg = build_layer(cls, GateConfig())
            assert "DCP2 refused" in msg and cls.__name__ in msg and SUPPORTED in msg, msg

        report.check("dcp_refused", f"{name}:dcp2", refused)
        report.check(
            "dcp_admitted",
            f"{name}:dcp1",
            lambda cls=cls: _admitted(build_layer(cls, GateConfig(dcp=1, spec=SPEC["mtp"]))),
        )
    settings = {
        "v1_runner": (GateConfig(v2=False), "V1 model runner"),
        "mtp": (GateConfig(spec=SPEC["mtp"]), "speculative decoding (mtp"),
        "dspark": (GateConfig(spec=SPEC["dspark"]), "speculative decoding (dspark"),
        "pcp": (GateConfig(pcp=2), "(PCP2)"),
        "swa_bounded_replay": (GateConfig(replay=True), "SWA bounded replay (--swa-bounded"),
        "dbo": (GateConfig(dbo=True), "dual-batch overlap (--enable-dbo"),
        "q_replicate": (GateConfig(qrep=True), "--dcp-q-replicate: this path"),
    }
    for name, (config, phrase) in settings.items():

        def refused(config=config, phrase=phrase):
            msg = build_layer(sm120, config)
            assert "DCP2 refused" in msg and phrase in msg and SUPPORTED in msg, msg

        report.check("dcp_refused", f"sm120:{name}", refused)

    def all_at_once():
        config = GateConfig(pcp=4, v2=False, spec=SPEC["mtp"], replay=True, dbo=True, qrep=True)
        msg = build_layer(classes["flashmla"], config)
        for phrase in (
            "DeepseekV4FlashMLAAttention",
            "V1 model runner",
            "(mtp",
            "(PCP4)",
            "--swa-bounded-replay",
            "--enable-dbo",
            "--dcp-q-replicate",
        ):
            assert phrase in msg, f"{phrase!r} missing: {msg}"

    report.check("dcp_refused", "every_problem_in_one_message", all_at_once)
    report.check("dcp_admitted", "sm120:dcp2", lambda: _admitted(build_layer(sm120, GateConfig())))

    # Stage 5 serves DSpark drafts; any other method stays refused by name.
    def at_stage_5(config):
        with mock.patch.dict(os.environ, {"DSV41_DCP_STAGE": "5"}):
            return build_layer(sm120, config)

    report.check(
        "dcp_admitted",
        "sm120:stage5_dspark",
        lambda: _admitted(at_stage_5(GateConfig(spec=SPEC["dspark"]))),
    )

    def other_method_refused():
        msg = at_stage_5(GateConfig(spec=SPEC["mtp"]))
        assert "speculative decoding by mtp: stage 5 serves only dspark" in msg, msg

    report.check("dcp_refused", "sm120:stage5_mtp", other_method_refused)

    def rocm():
        # vllm.models.deepseek_v41.amd.rocm needs a ROCm torch to import: read
        # its class from the baked source, and refuse a subclass shaped like it.
        src = (tree / "vllm/models/deepseek_v41/amd/rocm.py").read_text()
        cdef = next(
            n
            for n in ast.walk(ast.parse(src))
            if isinstance(n, ast.ClassDef) and n.name == "DeepseekV41ROCMAiterMLAAttention"
        )
        assert [ast.unparse(b) for b in cdef.bases] == ["DeepseekV4Attention"], cdef.bases
        assert "dcp_implemented" not in ast.unparse(cdef), "ROCm claims DCP"
        probe = type(
            "DeepseekV41ROCMAiterMLAAttention",
            (DeepseekV4Attention,),
            {
                k: getattr(classes["flashmla"], k)
                for k in ("get_padded_num_q_heads", "forward_mqa", "_o_proj", "backend_cls")
            },
        )
        msg = build_layer(probe, GateConfig())
        assert "DCP2 refused" in msg and "DeepseekV41ROCMAiterMLAAttention" in msg, msg

    report.check("rocm_refused_by_base", "rocm", rocm)


SPEC = {m: SimpleNamespace(method=m, num_speculative_tokens=1) for m in ("mtp", "dspark")}


def check_combine_source(report: Report) -> None:
    """Patch 02: --dcp-comm-backend is the combine; DSV41_DCP_COMBINE may only agree."""
    from vllm.models.deepseek_v41 import attention

    def gates(backend, env):
        saved = os.environ.pop("DSV41_DCP_COMBINE", None)
        if env is not None:
            os.environ["DSV41_DCP_COMBINE"] = env
        try:
            pc = SimpleNamespace(decode_context_parallel_size=2, dcp_comm_backend=backend)
            attention._check_dsv41_dcp_gates(pc)
            return attention.dsv41_dcp_combine(pc)
        except ValueError as exc:
            return str(exc)
        finally:
            os.environ.pop("DSV41_DCP_COMBINE", None)
            if saved is not None:
                os.environ["DSV41_DCP_COMBINE"] = saved

    want = {
        ("a2a", None): "a2a",
        ("ag_rs", None): "ag_rs",
        (None, None): "ag_rs",  # vLLM's own default before set_dcp_defaults
        ("a2a", "a2a"): "a2a",
        ("a2a", "ag_rs"): "DSV41_DCP_COMBINE='ag_rs', --dcp-comm-backend 'a2a'",
        ("ag_rs", "a2a"): "DSV41_DCP_COMBINE='a2a', --dcp-comm-backend 'ag_rs'",
        ("a2a", "rs"): "DSV41_DCP_COMBINE must be one of",
    }
    for (backend, env), expected in want.items():
        got = gates(backend, env)
        ok = got == expected if len(expected) < 6 else expected in got
        report.check(
            "combine_source", f"{backend}:{env}", lambda ok=ok, got=got: None if ok else got
        )


def _admitted(result: str) -> str | None:
    return None if result == "admitted" else f"not admitted: {result}"


# ---- patch 09: combine warm-up and prefill timing ---------------------------


def check_warmup(report: Report, cls) -> None:
    from vllm.model_executor.warmup.jit_warmup import JitWarmupRegistry
    from vllm.model_executor.warmup.jit_warmup_triton_helper import (
        triton_scalar_specialization_rep,
    )
    from vllm.v1.attention.ops.dcp import _CORRECT_ATTN_CP_OUT_KERNEL

    def registered(w: int, a2a: bool, enabled: bool) -> list:
        case = replace(GLOO_CASES[2][0], w=w)
        layer = make_layer(cls, None, 0, case, torch.zeros(2))
        layer.n_dcp_heads, layer.head_dim, layer._dcp_combine_a2a = 2 * w, 512, a2a
        config = SimpleNamespace(
            kernel_config=SimpleNamespace(enable_jit_warmup=enabled),
            parallel_config=SimpleNamespace(decode_context_parallel_size=w),
            scheduler_config=SimpleNamespace(max_num_batched_tokens=8192),
            model_config=SimpleNamespace(hf_config=None),
        )
        registry = JitWarmupRegistry(config)
        with registry.activate():
            layer._register_dcp_warmup(config)
        regs = registry._registrations.get(_CORRECT_ATTN_CP_OUT_KERNEL, [])
        return [(config, args, kwargs) for args, kwargs in regs]

    def ag_rs(w=4):
        regs = registered(w, a2a=False, enabled=True)
        assert len(regs) == 1, regs
        config, args, kwargs = regs[0]
        want = dict(output_dtype=torch.bfloat16, num_heads=2 * w, head_dim=512, is_base_e=False)
        assert kwargs == want and args == (config,), (args, kwargs)
        keys = _CORRECT_ATTN_CP_OUT_KERNEL.get_warmup_keys(*args, **kwargs)
        assert keys, "no compile keys"
        assert {(k.is_base_e, k.head_dim, k.n_rounded) for k in keys} == {(False, 512, w)}, keys
        ranks = {triton_scalar_specialization_rep(r) for r in range(w)}
        assert {k.lse_idx for k in keys} == ranks, "warm-up misses a rank's LSE index"
        return len(keys)

    report.check("combine_warmup", "ag_rs:W4", ag_rs)

    def called_at_build():
        # __init__ needs a whole model config; check its body calls the hook
        src = Path(sys.modules[cls.__module__].__file__).read_text()
        cdef = next(
            n
            for n in ast.walk(ast.parse(src))
            if isinstance(n, ast.ClassDef) and n.name == cls.__name__
        )
        init = next(n for n in cdef.body if isinstance(n, ast.FunctionDef) and n.name == "__init__")
        calls = {ast.unparse(n.func) for n in ast.walk(init) if isinstance(n, ast.Call)}
        assert "self._register_dcp_warmup" in calls, sorted(calls)

    report.check("combine_warmup", "registered_in_init", called_at_build)
    for name, args in {
        "a2a": (2, True, True),
        "disabled": (2, False, False),
        "dcp1": (1, False, True),
    }.items():
        report.check(
            "combine_warmup",
            name,
            lambda args=args: None if registered(*args) == [] else "registered anyway",
        )


def check_a2a_warmup(report: Report, cls) -> None:
    """The dummy run (no attention metadata) launches the a2a kernels once."""
    mod = sys.modules[cls.__module__]

    def dummy_runs(a2a: bool, w: int = 4, runs: int = 2) -> list:
        calls: list = []
        layer = make_layer(cls, None, 0, replace(GLOO_CASES[2][0], w=w), torch.zeros(2))
        layer.n_dcp_heads, layer.head_dim, layer._dcp_combine_a2a = 2 * w, 512, a2a
        layer._reserve_empty_forward_workspace = lambda: None
        patches = {
            (mod, "_dcp_a2a_warmed"): False,
            (mod, "_dcp_a2a_pack_send"): lambda *a: calls.append(("pack", a)),
            (mod, "_dcp_a2a_unpack_combine"): lambda *a: calls.append(("unpack", a)),
            (mod, "get_forward_context"): lambda: SimpleNamespace(attn_metadata=None),
            (torch.cuda, "is_current_stream_capturing"): lambda: False,
        }
        saved = {k: getattr(*k) for k in patches}
        try:
            for (obj, attr), value in patches.items():
                setattr(obj, attr, value)
            for _ in range(runs):
                q = torch.ones(3, 2, 512, dtype=torch.bfloat16)
                out = torch.ones_like(q)
                layer.forward_mqa(q, None, None, out)
                assert not out.any(), "dummy run output not zeroed"
        finally:
            for (obj, attr), value in saved.items():
                setattr(obj, attr, value)
        return calls

    def launched(w: int = 4):
        calls = dummy_runs(a2a=True, w=w)
        seen = []
        for kind, args in calls:
            if kind == "pack":
                out, lse, buf, world, h, dim, pack = args
                assert (out.dtype, lse.dtype, buf.dtype) == (
                    torch.bfloat16,
                    torch.float32,
                    torch.bfloat16,
                ), args
                assert out.shape[1:] == (2 * w, 512) and lse.shape == out.shape[:2], args
                assert buf.shape == (w, out.shape[0], 2, 512 + 2) and (world, h, dim, pack) == (
                    w,
                    2,
                    512,
                    2,
                ), args
                seen.append(("pack", out.shape[0]))
            else:
                buf, dim, pack, return_lse, base_e = args
                assert (dim, pack, return_lse, base_e) == (512, 2, False, False), args
                seen.append(("unpack", buf.shape[1]))
        # T=1 and T=8: both stride classes of the [W, T, H/W, 514] buffers; once
        want = [("pack", 1), ("unpack", 1), ("pack", 8), ("unpack", 8)]
        assert seen == want, f"a2a warm-up launches {seen}, want {want}"

    report.check("combine_warmup", "a2a:dummy_run", launched)
    report.check(
        "combine_warmup",
        "ag_rs:dummy_run",
        lambda: None if dummy_runs(a2a=False) == [] else "a2a kernels launched for ag_rs",
    )


class FakeEvent:
    """``torch.cuda.Event`` on CPU: each interval between records is 2 ms."""

    def __init__(self, enable_timing: bool = False) -> None:
        self.t = 0.0

    def record(self) -> None:
        FakeEvent.clock += 2.0
        self.t = FakeEvent.clock

    def synchronize(self) -> None:
        pass

    def elapsed_time(self, end: FakeEvent) -> float:
        return end.t - self.t

    clock = 0.0


class CopyGroup:
    """DCP rank 0 of ``world_size`` ranks that all hold the same tensors."""

    rank_in_group = 0

    def __init__(self, world_size: int) -> None:
        self.world_size = world_size

    def all_gather(self, x: torch.Tensor, dim: int = 0) -> torch.Tensor:
        return torch.cat([x] * self.world_size, dim=dim)


def check_prefill_timing(report: Report, cls) -> None:
    """``_run_sm120_dcp`` on a 1024-token prefill chunk, timers on, kernels stubbed."""
    mod = sys.modules[cls.__module__]
    from vllm.model_executor.kernels.attention.dsa import candidate_blocks

    def run() -> list:
        calls: list = []
        case = replace(GLOO_CASES[2][0])
        layer = make_layer(cls, CopyGroup(2), 0, case, torch.zeros(2))
        layer.head_dim, layer.scale, layer._dcp_timing = 16, 0.25, False
        layer._dcp_combine_a2a, layer._dcp_t_acc = False, [0.0] * 4
        layer._get_workspace = lambda device: torch.empty(0)

        def kernel(q, swa_cache, ws, swa_idx, swa_lens, kv, idx, idx_lens, out, scale, sink, lse):
            out.copy_(q)
            lse.fill_(0.0)

        def combine(out, lse, output):
            output.copy_(out[:, : out.shape[1] // 2])

        patches = {
            (mod, "_DSV41_PREFILL_TIMING"): True,
            (mod, "_sm120_sparse_attention_with_lse"): kernel,
            (layer, "_dcp_combine_ag_rs_into"): combine,
            (mod, "_dsv41_prefill_acc_add"): lambda *a: calls.append(a),
            (torch.cuda, "Event"): FakeEvent,
            (torch.cuda, "is_current_stream_capturing"): lambda: False,
        }
        saved = {k: getattr(*k) for k in patches}
        try:
            for (obj, attr), value in patches.items():
                setattr(obj, attr, value)
            t = 1024
            q = torch.randn(t, 2, 16).to(torch.bfloat16)
            out = torch.empty_like(q)
            swa = torch.zeros(t, 1, 4, dtype=torch.int32)
            lens = torch.zeros(t, dtype=torch.int32)
            layer._run_sm120_dcp(q, None, swa, lens, None, None, None, out)
        finally:
            for (obj, attr), value in saved.items():
                setattr(obj, attr, value)
        return calls

    def tokens_counted():
        calls = run()
        phases = [(c[0], c[2] if len(c) > 2 else 0) for c in calls]
        want = [("attn_gather", 1024), ("attn_kernel", 1024), ("attn_combine", 1024)]
        assert phases == want, f"prefill_acc_add got (phase, tokens) {phases}, want {want}"
        # through patch 01's accumulator: its log line names a number, not n/a
        lines: list[str] = []
        handler = logging.Handler()
        handler.emit = lambda rec: lines.append(rec.getMessage())
        log = candidate_blocks.logger
        saved = (
            candidate_blocks._PREFILL_TIMING,
            candidate_blocks._PREFILL_TIMING_LOG_S,
            log.level,
            log.disabled,
        )
        candidate_blocks._PREFILL_TIMING, candidate_blocks._PREFILL_TIMING_LOG_S = True, 0.0
        log.addHandler(handler)
        log.setLevel(logging.INFO)
        log.disabled = False
        try:
            for c in calls:
                candidate_blocks.prefill_acc_add(*c)
        finally:
            log.removeHandler(handler)
            (
                candidate_blocks._PREFILL_TIMING,
                candidate_blocks._PREFILL_TIMING_LOG_S,
                level,
                log.disabled,
            ) = saved
            log.setLevel(level)
        rates = [ln for ln in lines if "tok/s" in ln]
        assert rates and not any("n/a tok/s" in ln for ln in rates), lines
        return {"log": rates[-1]}

    report.check("prefill_timing_tokens", "T1024", tokens_counted)


# ---- checks against the reference -------------------------------------------


class Report:
    def __init__(self) -> None:
        self.checks: list[dict] = []

    def check(self, name: str, case: str, fn: Callable[[], object]) -> None:
        """Record ``fn()``: ok unless it raises (or returns a failure string)."""
        try:
            detail = fn()
            ok = not isinstance(detail, str)
        except Exception as exc:  # a wrong slot may also raise (out of range)
            ok, detail = False, f"{type(exc).__name__}: {str(exc)[:300]}"
        self.checks.append({"name": name, "case": case, "ok": ok, "detail": detail})


def same_bits(a: torch.Tensor, b: torch.Tensor) -> None:
    """Equal values and equal NaN (unwritten slot) pattern."""
    assert a.shape == b.shape, f"shape {tuple(a.shape)} != {tuple(b.shape)}"
    assert torch.equal(a.isnan(), b.isnan()), "NaN pattern differs"
    assert torch.equal(a.nan_to_num(), b.nan_to_num()), "values differ"


def lookup(step, kv: torch.Tensor, slots: torch.Tensor, lens: torch.Tensor) -> int:
    """Every counted slot holds the state of its global id; returns how many."""
    flat = kv.reshape(-1, kv.shape[-1])
    n = 0
    for t in range(slots.shape[0]):
        req = int(step.token_to_req[t])
        for j in range(int(lens[t])):
            sid, slot = int(step.topk_ids[t, j]), int(slots[t, j])
            assert sid >= 0 and 0 <= slot < flat.shape[0], f"row {t}: id {sid} -> slot {slot}"
            assert torch.equal(flat[slot], step.states[req][sid]), f"row {t}: id {sid} wrong state"
            n += 1
    return n


def check_case(report: Report, case: Case, outs: list[dict], how: str) -> None:
    from lab.dcp import reference as ref

    name = f"{how}:{case.name}"
    step, layout, caches, seq_lens = build(case)
    nd = case.num_decodes
    want = ref.run_spmd(
        case.w,
        lambda g: ref.prefill_gather(
            g,
            caches[g.rank_in_group],
            layout,
            seq_lens[nd:],
            case.ratio,
            nd,
            step.topk_ids,
            step.token_to_req,
            step.is_valid,
        ),
    )[0]
    dcp1_cache = ref.build_caches(step.states, ref.ShardLayout(1, 1, case.bs), torch.Generator())[0]
    dcp1 = ref.dcp1_attention(step, dcp1_cache, torch.float32)
    local = [step.sink[2 * r : 2 * r + 2] for r in range(case.w)]
    ref_sink = ref.run_spmd(case.w, lambda g: ref.gathered_sink(g, local[g.rank_in_group]))
    for rank, got in enumerate(outs):
        kv = got["kv"]
        rn = f"{name}:r{rank}"
        report.check("gather_kv", rn, lambda kv=kv: same_bits(kv.reshape(want.kv.shape), want.kv))
        report.check("gather_slots", rn, lambda g=got: _equal(g["slots"], want.slots))
        report.check("gather_lens", rn, lambda g=got: _equal(g["lens"], want.lens))
        report.check(
            "gather_lookup", rn, lambda g=got: lookup(step, g["kv"], g["slots"], g["lens"])
        )

        def attention(g=got):
            flat_kv = g["kv"].reshape(g["kv"].shape[0], case.bs, -1)
            out = ref.prefill_attention(
                step, ref.PrefillGather(flat_kv, g["slots"], g["lens"]), torch.float32
            )
            torch.testing.assert_close(out.out, dcp1.out, atol=TOL, rtol=TOL)
            torch.testing.assert_close(out.lse, dcp1.lse, atol=LSE_TOL, rtol=LSE_TOL)
            return float((out.out - dcp1.out).abs().max())

        report.check("gather_attention", rn, attention)
        report.check("sink", rn, lambda g=got, s=ref_sink[rank]: _equal(g["sink"], s))
        report.check("sink_cached", rn, lambda g=got: None if g["sink_cached"] else "re-gathered")


def _equal(a: torch.Tensor, b: torch.Tensor) -> None:
    assert a.dtype == b.dtype, f"dtype {a.dtype} != {b.dtype}"
    assert torch.equal(a, b), f"differs at {(a != b).nonzero()[:4].tolist()}"


def check_state(report: Report, cls) -> None:
    """``_dcp_neutral_swa`` and patch 02's state-unit interleave on the class."""
    from lab.dcp import reference as ref

    case = GLOO_CASES[2][0]
    layer = make_layer(cls, None, 1, case, torch.zeros(2), max_tokens=8)
    # grow past max_num_batched_tokens, then shrink and change width: buffer reuse
    for t, width in ((3, 4), (20, 4), (5, 4), (2, 64), (0, 64)):

        def neutral(t=t, width=width):
            idx, lens = layer._dcp_neutral_swa(t, width, torch.device("cpu"))
            want_idx, want_lens = ref.neutral_swa(t, width)
            _equal(idx, want_idx)
            _equal(lens, want_lens)

        report.check("neutral_swa", f"T{t}w{width}", neutral)

    for token_k, ratio, want in ((8, 4, 2), (128, 128, 1), (512, 4, 128), (6, 0, 6), (3, 1, 3)):

        def interleave(token_k=token_k, ratio=ratio, want=want):
            lay = make_layer(cls, None, 0, replace(case, ratio=ratio), torch.zeros(2))
            lay._dcp_parallel_config.cp_kv_cache_interleave_size = token_k
            assert lay.cp_kv_cache_interleave_size == want, lay.cp_kv_cache_interleave_size
            lay.cp_kv_cache_interleave_size = 5  # the setter pins state units
            assert lay.cp_kv_cache_interleave_size == 5

        report.check("interleave", f"tok{token_k}r{ratio}", interleave)

    for token_k, ratio in ((6, 4), (2, 4), (64, 128)):

        def refusal(token_k=token_k, ratio=ratio):
            lay = make_layer(cls, None, 0, replace(case, ratio=ratio), torch.zeros(2))
            lay._dcp_parallel_config.cp_kv_cache_interleave_size = token_k
            try:
                got = lay.cp_kv_cache_interleave_size
            except ValueError as exc:
                assert "multiple of compress_ratio" in str(exc), str(exc)
                return None
            return f"accepted {token_k} tokens at ratio {ratio} as {got}"

        report.check("interleave_refusal", f"tok{token_k}r{ratio}", refusal)


def two_layer_ranks() -> int:
    """Per-rank checks expected of each two-layer check name (per layer: x2)."""
    return sum(tc.w for tc in TWO_LAYER_CASES)


def ranks_checked() -> int:
    """Per-rank checks expected of each gather/sink check name."""
    return sum(c.w for cases in GLOO_CASES.values() for c in cases) + sum(
        c.w for c in sweep_cases()
    )


def failed(result: dict) -> dict[str, int]:
    """Failing check name -> how many of its checks failed."""
    out: dict[str, int] = {}
    for c in result["checks"]:
        if not c["ok"]:
            out[c["name"]] = out.get(c["name"], 0) + 1
    return out


def main(tree: str) -> None:
    torch.set_num_threads(1)
    vllm, cls = patched_class()
    vllm_file = Path(vllm.__file__).resolve()
    if not vllm_file.is_relative_to(Path(tree).resolve()):
        raise SystemExit(f"vllm imported from {vllm_file}, not from {tree}")
    report = Report()
    for w in GLOO_CASES:
        for case, outs in zip(GLOO_CASES[w], run_gloo(cls, w), strict=True):
            check_case(report, case, outs, "gloo")
    for case in sweep_cases():
        try:
            outs = run_sequential(cls, case)
        except Exception:
            report.check("gather_run", f"seq:{case.name}", lambda: traceback.format_exc(-1))
            continue
        check_case(report, case, outs, "seq")
    check_state(report, cls)
    for tc in TWO_LAYER_CASES:
        try:
            outs = run_two_layer_sequential(cls, tc)
        except Exception:
            report.check("two_layer_run", tc.name, lambda: traceback.format_exc(-1))
            continue
        check_two_layers(report, tc, outs)
    check_refusals(report, cls, Path(tree))
    check_combine_source(report)
    check_warmup(report, cls)
    check_a2a_warmup(report, cls)
    check_prefill_timing(report, cls)
    result = {"vllm_file": str(vllm_file), "class": cls.__qualname__, "checks": report.checks}
    print(MARK + json.dumps(result), flush=True)


if __name__ == "__main__":
    faster_interpreter()
    main(sys.argv[1])
