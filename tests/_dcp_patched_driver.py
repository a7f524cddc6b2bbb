"""Run patch 09's pure-torch DCP helpers from a baked tree against the reference.

Usage: ``python tests/_dcp_patched_driver.py TREE`` with ``TREE`` first on
``PYTHONPATH`` (``run_driver`` does that). It imports vLLM from ``TREE`` (and
refuses any other vLLM), builds the SM120 sparse-MLA attention class without a
model (``object.__new__`` plus the attributes the helpers read), drives it per
rank and prints one ``RESULT {json}`` line: ``{"vllm_file", "class", "checks":
[{"name", "case", "ok", "detail"}]}``.

Ranks run two ways, through the same ``rank_outputs``:
- real gloo process groups, W=2 and W=4, forked after the (20 s) vLLM import so
  it is paid once; forked processes also give each rank its own copy of the
  class-level ``_dcp_gather_cache``;
- a sequential record/replay group for a wider W/K/page-size sweep: pass 1
  records every rank's ``all_gather`` input, pass 2 hands each rank the W
  ranks' real inputs (and checks it sent the same input again).

Not run here, because they need CUDA, Triton or FlashInfer SM120 (the CPU
Triton has no backend): ``_compressed_topk_to_slots`` (Triton
``triton_filter_and_convert_dcp_index`` at DCP>1, Triton
``compute_global_topk_indices_and_lens`` at DCP1) and ``_run_sm120_dcp``
(``torch.cuda.is_current_stream_capturing``, the SM120 kernel and the Triton
combine kernels of ``cp_lse_ag_out_rs`` / ``dcp_a2a_lse_reduce``).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import tempfile
import traceback
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from types import SimpleNamespace

import torch

REPO = Path(__file__).resolve().parents[1]
MODULE = "vllm.models.deepseek_v41.nvidia.flashinfer_sparse"
MARK = "RESULT "
TOL, LSE_TOL = 1e-5, 1e-4  # fp32, as in vLLM's DCP combine tests

# Check names, so the tests can tell a planted index bug from broken plumbing.
GATHER_CHECKS = ("gather_kv", "gather_slots", "gather_lens", "gather_lookup", "gather_attention")
OTHER_CHECKS = ("sink", "sink_cached", "neutral_swa", "interleave", "interleave_refusal")


def run_driver(tree: Path, timeout: float = 300) -> dict:
    """Run this file in a child with ``tree`` first on PYTHONPATH; its parsed result."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(tree), str(REPO)]),
        "OMP_NUM_THREADS": "1",
        "VLLM_LOGGING_LEVEL": "WARNING",
    }
    proc = subprocess.run(
        [sys.executable, __file__, str(tree)],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(MARK)]
    if proc.returncode or not lines:
        raise RuntimeError(
            f"driver failed (rc {proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
        )
    return json.loads(lines[-1][len(MARK) :])


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
    from bakery import dcp_reference as ref

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
    layout = ref.Layout(case.w, case.k, case.bs)
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


def rank_outputs(cls, group, case: Case) -> dict:
    """What one rank's patched helpers return for ``case`` (collectives via ``group``)."""
    rank = group.rank_in_group
    step, _, caches, seq_lens = build(case)
    # Padded like a real sink parameter; NaN so a missing [:n_local_heads] shows.
    local_sink = torch.cat([step.sink[2 * rank : 2 * rank + 2], torch.full((2,), math.nan)])
    layer = make_layer(cls, group, rank, case, local_sink)
    meta = SimpleNamespace(
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
        block_table=caches[rank].block_table,
    )
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

    from bakery import dcp_reference as ref

    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.FileStore(store_path, w), rank=rank, world_size=w)
    try:
        group = ref.TorchGroup()
        results = [rank_outputs(cls, group, c) for c in GLOO_CASES[w]]
        torch.save(results, os.path.join(outdir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


def run_gloo(cls, w: int) -> list[list[dict]]:
    """``[case][rank]`` outputs from W forked processes over one gloo group."""
    ctx = torch.multiprocessing.get_context("fork")
    with tempfile.TemporaryDirectory() as tmp:
        store = os.path.join(tmp, "store")
        procs = [ctx.Process(target=_gloo_rank, args=(cls, r, w, store, tmp)) for r in range(w)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(120)
        bad = [(r, p.exitcode) for r, p in enumerate(procs) if p.exitcode != 0]
        for p in procs:
            if p.is_alive():
                p.kill()
        if bad:
            raise RuntimeError(f"gloo ranks failed (rank, exitcode): {bad}")
        per_rank = [torch.load(os.path.join(tmp, f"rank{r}.pt")) for r in range(w)]
    return [[per_rank[r][i] for r in range(w)] for i in range(len(GLOO_CASES[w]))]


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
    from bakery import dcp_reference as ref

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
    dcp1_cache = ref.build_caches(step.states, ref.Layout(1, 1, case.bs), torch.Generator())[0]
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
    from bakery import dcp_reference as ref

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
    result = {"vllm_file": str(vllm_file), "class": cls.__qualname__, "checks": report.checks}
    print(MARK + json.dumps(result), flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
