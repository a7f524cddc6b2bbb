"""The index-K candidate exchange (prefill) inside ``_dcp_candidate_driver``'s gloo ranks.

Each case is a prefill chunk of packed requests with real fp8 index keys and a 4-byte
fp32 scale per position, causal query rows and head weights. DCP1: the keys packed
request by request, the global row bounds, the logits of a torch stand-in of
DeepGEMM's ``fp8_fp4_mqa_logits`` (sum over heads of weight * relu(q . k), -inf outside
the row) and the baked DCP1 ``select_candidate_blocks``. A DCP rank holds only its own
keys, packed as ``cp_gather_indexer_k_quant_cache`` writes them under DCP (request by
request, local order, garbage rows after them in the workspace), and its local row
bounds; patch 06's ``_candidate_step`` with ``index_k`` must publish DCP1's candidates
exactly (the same kernel on the same logits: ties included, also on CPU). Values are
small integers and halves, so every logit is exact in any summation order.

The size rule is checked against wire bytes counted here, not by the baked formula: the
index-K path when its all-gather of W x (largest rank's keys) x 132 B plus the row
bounds' all-reduce moves fewer bytes on the wire than the dense exchange's all-reduce and
the sparse exchange's all-gather (a ring all-reduce receives 2 (W-1)/W of its buffer, an
all-gather (W-1)/W of its output). The keyless cases leave ranks without a key of the
chunk and make the rule pick index K; each case also runs split into sub-chunks sharing
its keys, through the exchange's own choice, and must gather them once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from types import SimpleNamespace

import torch

HEADS, DIM = 2, 128
CHECKS = (
    "index_k_eq_dcp1_kernel",
    "index_k_same_on_every_rank",
    "index_k_rule",
    "index_k_sub_chunks_eq_dcp1_kernel",
    "index_k_one_gather_per_chunk",
)
SUB_CHUNKS = 3  # the rows split as vLLM splits a scheduler chunk by its logits budget


@dataclass(frozen=True)
class KCase:
    w: int
    k: int  # interleave, compressed-state units
    bs: int
    topk_blocks: int
    lens: tuple[int, ...]
    rows_per_req: int
    seed: int

    @property
    def name(self) -> str:
        return f"index_k-W{self.w}K{self.k}B{self.bs}T{self.topk_blocks}s{self.seed}"


CASES = {
    2: [KCase(2, 1, 4, 3, (37, 3, 20), 3, 31), KCase(2, 2, 3, 2, (1, 16, 9), 2, 32)],
    4: [KCase(4, 2, 4, 3, (50, 2, 19), 2, 33)],
    8: [KCase(8, 1, 2, 4, (70, 5), 2, 34)],
}
# Many short requests, every one shorter than the first position some ranks own: those
# ranks hold no key of the chunk, and the rule picks index K (issue 33's crash; the
# released config's W=4 interleave-2 case at 61+ prompts of <= 6 tokens, shrunk).
KEYLESS = {
    2: KCase(2, 8, 1, 20, (8,) * 6 + (5, 7), 8, 35),  # rank 1: none
    4: KCase(4, 2, 1, 20, (4,) * 12 + (3, 2), 4, 36),  # ranks 2 and 3: none
    8: KCase(8, 1, 1, 20, (3,) * 20 + (2, 1), 3, 37),  # ranks 3 to 7: none
}
for _w, _case in KEYLESS.items():
    CASES[_w].append(_case)


def owner(p: int, w: int, k: int) -> int:
    return (p // k) % w


def global_inputs(case: KCase):
    """Keys [n, DIM] fp8 and scales [n, 4] uint8 per request, q, weights, rows."""
    gen = torch.Generator().manual_seed(case.seed)
    keys, scales = [], []
    for n in case.lens:
        keys.append(torch.randint(-2, 3, (n, DIM), generator=gen).float().to(torch.float8_e4m3fn))
        halves = torch.randint(1, 3, (n, 1), generator=gen).float() / 2
        scales.append(halves.contiguous().view(torch.uint8))
    rows = [
        (req, end)
        for req, n in enumerate(case.lens)
        for end in range(max(1, n - case.rows_per_req + 1), n + 1)
    ]
    q = torch.randint(-2, 3, (len(rows), HEADS, DIM), generator=gen).float()
    weights = torch.randint(-1, 3, (len(rows), HEADS), generator=gen).float()
    return keys, scales, q.to(torch.float8_e4m3fn), weights, rows


def mqa_logits(q, kv, weights, ks, ke, clean_logits=False):
    """Stand-in of DeepGEMM's fp8 MQA logits (emulate's contract)."""
    (qv, _), (kq, kscale) = q, kv
    k = kq.float() * kscale.float()[:, None]
    logits = torch.einsum("mhd,nd->mhn", qv.float(), k).relu()
    logits = (logits * weights.float()[..., None]).sum(1)
    cols = torch.arange(k.shape[0])[None, :]
    inside = (cols >= ks[:, None]) & (cols < ke[:, None])
    return logits.masked_fill(~inside, -math.inf)


def dcp1(kernels, case: KCase) -> torch.Tensor:
    keys, scales, q, weights, rows = global_inputs(case)
    cu = [0]
    for n in case.lens:
        cu.append(cu[-1] + n)
    ks = torch.tensor([cu[r] for r, _ in rows], dtype=torch.int32)
    ke = torch.tensor([cu[r] + e for r, e in rows], dtype=torch.int32)
    kv = (torch.cat(keys), torch.cat(scales).view(torch.float32).squeeze(-1))
    logits = mqa_logits((q, None), kv, weights, ks, ke)
    out = torch.full((len(rows), case.topk_blocks), 99, dtype=torch.int32)
    kernels.select_candidate_blocks(logits, ks, ke, case.topk_blocks, case.bs, out)
    return out


def local_view(case: KCase, rank: int):
    """This rank's packed keys (with garbage rows after them), bounds and row counts."""
    keys, scales, _, _, rows = global_inputs(case)
    w, k = case.w, case.k
    mine = [[p for p in range(n) if owner(p, w, k) == rank] for n in case.lens]
    counts = [[sum(owner(p, w, k) == r for p in range(n)) for n in case.lens] for r in range(w)]
    local_cu = [0]
    for c in counts[rank]:
        local_cu.append(local_cu[-1] + c)
    max_rows = max(sum(c) for c in counts)
    gen = torch.Generator().manual_seed(case.seed + 100 + rank)
    slack = max_rows + 3  # the workspace is larger than this rank's keys
    kq = torch.randint(-100, 100, (slack, DIM), generator=gen).float().to(torch.float8_e4m3fn)
    ksc = torch.randint(0, 255, (slack, 4), generator=gen).to(torch.uint8)
    for req, pos in enumerate(mine):
        for j, p in enumerate(pos):
            kq[local_cu[req] + j] = keys[req][p]
            ksc[local_cu[req] + j] = scales[req][p]
    ks = torch.tensor([local_cu[r] for r, _ in rows], dtype=torch.int32)
    ke = torch.tensor(
        [local_cu[r] + sum(owner(p, w, k) == rank for p in range(e)) for r, e in rows],
        dtype=torch.int32,
    )
    return kq, ksc, ks, ke, local_cu[-1], max_rows


def _chunk(case: KCase, rank: int, start: int, end: int, skip: bool) -> SimpleNamespace:
    """Prefill chunk metadata as vLLM's indexer builder gives it (rows start..end)."""
    _, _, _, _, local_rows, max_rows = local_view(case, rank)
    cu = torch.tensor([0, *torch.tensor(case.lens).cumsum(0).tolist()], dtype=torch.int32)
    return SimpleNamespace(
        total_seq_lens=sum(case.lens),
        max_local_total_seq_lens=max_rows,
        local_total_seq_lens=local_rows,
        cu_seq_lens=cu,
        token_start=start,
        token_end=end,
        skip_kv_gather=skip,
    )


def _source(mod, case: KCase, chunks):
    return mod._DCPIndexKSource(chunks, case.topk_blocks, case.bs, case.w, case.k, False)


class _CountGathers:
    """Counts ``all_gather_into_tensor`` calls of the rank's torch.distributed."""

    def __init__(self, dist) -> None:
        self.dist, self.calls, self.real = dist, 0, dist.all_gather_into_tensor

    def __enter__(self) -> _CountGathers:
        def counted(*args, **kwargs):
            self.calls += 1
            return self.real(*args, **kwargs)

        self.dist.all_gather_into_tensor = counted
        return self

    def __exit__(self, *exc) -> None:
        self.dist.all_gather_into_tensor = self.real


def run(mod, case: KCase, rank: int) -> dict:
    """Patch 06's source step with the index-K exchange forced; the chunk split into
    sub-chunks that share its keys, through the exchange's own choice and gather; and
    the size rule's pick around the crossovers."""
    _, _, q, weights, rows = global_inputs(case)
    kq, ksc, ks, ke, _, _ = local_view(case, rank)
    total = sum(case.lens)
    whole = _chunk(case, rank, 0, len(rows), False)
    keys = mod._dcp_index_k_keys(kq, ksc, whole, case.w, case.k)
    ik = mod._DCPIndexK((q, None), weights, *keys, False)
    cands = torch.full((len(rows), case.topk_blocks), 99, dtype=torch.int32)
    step = (case.bs, True, total, rank, case.w, case.k)
    mod._candidate_step(torch.empty(len(rows), 0), ks, ke, cands, *step, index_k=ik)
    cuts = [len(rows) * i // SUB_CHUNKS for i in range(SUB_CHUNKS + 1)]
    spans = zip(cuts, cuts[1:], strict=False)
    subs = [_chunk(case, rank, a, b, i > 0) for i, (a, b) in enumerate(spans)]
    source = _source(mod, case, subs)
    split = torch.full_like(cands, 99)
    with _CountGathers(mod.dist) as gathers:
        for sub in subs:
            rows_ = slice(sub.token_start, sub.token_end)
            got = source.take(sub, q[rows_], None, weights[rows_], kq, ksc)
            if got is None:
                break
            empty = torch.empty(rows_.stop - rows_.start, 0)
            mod._candidate_step(empty, ks[rows_], ke[rows_], split[rows_], *step, index_k=got)
    picks = {}
    for n_rows in (1, len(rows), 64, 128, 256, 4096):  # around the crossovers
        alone = _chunk(case, rank, 0, n_rows, False)
        picks[n_rows] = _source(mod, case, [alone]).wins(alone, kq, ksc)
    return {"cands": cands, "split": split, "gathers": gathers.calls, "picks": picks}


def _all_reduce_wire(buffer: int, w: int) -> float:
    return 2 * (w - 1) / w * buffer  # ring: reduce-scatter, then all-gather


def _all_gather_wire(output: int, w: int) -> float:
    return (w - 1) / w * output


def expected_pick(case: KCase, n_rows: int, max_rows: int) -> bool:
    """Index K when it moves the fewest wire bytes (ties to dense, then sparse)."""
    nb = -(-sum(case.lens) // case.bs)
    dense = _all_reduce_wire(n_rows * (nb + 1) * 4, case.w)
    sparse = _all_gather_wire(case.w * n_rows * (min(case.topk_blocks + 1, nb) + 1) * 8, case.w)
    index_k = _all_gather_wire(case.w * max_rows * (DIM + 4), case.w)
    index_k += _all_reduce_wire(n_rows * 8, case.w)
    return index_k < min(dense, sparse)


def check(report, kernels, case: KCase, outs: list[dict]) -> None:
    want = dcp1(kernels, case)
    max_rows = local_view(case, 0)[5]
    chosen = expected_pick(case, len(global_inputs(case)[4]), max_rows)
    for rank, out in enumerate(outs):
        label = f"{case.name}:r{rank}"
        got = out["cands"]
        report.check(
            "index_k_eq_dcp1_kernel",
            label,
            torch.equal(got, want),
            f"{got.tolist()} vs DCP1 {want.tolist()}",
        )
        report.check(
            "index_k_same_on_every_rank", label, all(torch.equal(o["cands"], got) for o in outs)
        )
        expect = {n: expected_pick(case, n, max_rows) for n in out["picks"]}
        report.check("index_k_rule", label, out["picks"] == expect, f"{out['picks']} vs {expect}")
        if case in KEYLESS.values():  # the case exists to take the exchange by the rule
            report.check("index_k_rule", f"{label}:keyless", chosen, "the rule did not pick it")
        if chosen:
            split = out["split"]
            report.check(
                "index_k_sub_chunks_eq_dcp1_kernel",
                label,
                torch.equal(split, want),
                f"{split.tolist()} vs DCP1 {want.tolist()}",
            )
            # keys and scales: one all-gather each for the whole chunk
            report.check(
                "index_k_one_gather_per_chunk",
                label,
                out["gathers"] == 2,
                f"{out['gathers']} gathers",
            )
