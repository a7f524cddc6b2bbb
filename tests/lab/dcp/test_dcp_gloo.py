"""The DCP reference over real torch.distributed gloo groups (W processes).

Same per-rank code as the in-process emulation, but the collectives are gloo's
all_gather / reduce_scatter / all_to_all_single between W forked processes
(``_dcp_child.fork_ranks``). Each rank saves its results; the test compares them with DCP1 and
with the emulation.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from _dcp_child import fork_ranks, rank_file

from lab.dcp import reference as ref

TOL = {torch.float32: 1e-5, torch.bfloat16: 3e-2}
SEED = 11
WORLDS = (2, 4)


def make_case(w: int, dtype: torch.dtype):
    """Deterministic case: every process builds the same step and caches."""
    gen = torch.Generator().manual_seed(SEED + w)
    # request 0 is shorter than W (ranks own nothing), 1 decodes, 2 prefills
    step = ref.random_step(
        gen, [w - 1, 70, 33], [1, 1, 5], heads=2 * w, dtype=dtype, padding_rows=1
    )
    layout = ref.ShardLayout(w, 2, 4)
    return step, layout, ref.build_caches(step.states, layout, gen)


def run_case(group: ref.TorchGroup, w: int) -> dict:
    rank = group.rank_in_group
    results = {}
    for dtype in (torch.float32, torch.bfloat16):
        step, layout, caches = make_case(w, dtype)
        for combine in ("ag_rs", "a2a"):
            got = ref.dcp_attention(group, step, caches[rank], layout, combine, dtype)
            results[(str(dtype), combine)] = got
    step, layout, caches = make_case(w, torch.float32)
    results["prefill"] = ref.prefill_gather(
        group,
        caches[rank],
        layout,
        [s.shape[0] for s in step.states],
        1,
        0,
        step.topk_ids,
        step.token_to_req,
        step.is_valid,
    )
    return results


def worker(rank: int, store: str, outdir: str) -> None:
    torch.set_num_threads(1)  # 4 processes share 2 cores in CI
    world = max(WORLDS)
    dist.init_process_group("gloo", store=dist.FileStore(store, world), rank=rank, world_size=world)
    try:
        # one fork serves every W: W=2 runs on a subgroup of ranks 0 and 1
        results = {}
        for w in WORLDS:
            pg = dist.new_group(list(range(w)))  # collective: every rank calls it
            if rank < w:
                results[w] = run_case(ref.TorchGroup(pg), w)
        torch.save(results, rank_file(outdir, rank))
        dist.barrier()
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def gloo_results():
    return fork_ranks(worker, max(WORLDS), 300)


@pytest.mark.parametrize("w", WORLDS)
def test_gloo_matches_dcp1_and_emulation(gloo_results, w):
    ranks = [gloo_results[r][w] for r in range(w)]
    for dtype in (torch.float32, torch.bfloat16):
        step, layout, caches = make_case(w, dtype)
        dcp1_cache = ref.build_caches(step.states, ref.ShardLayout(1, 1, 4), torch.Generator())[0]
        dcp1 = ref.dcp1_attention(step, dcp1_cache, dtype)
        tol = TOL[dtype]
        for combine in ("ag_rs", "a2a"):
            emulated = ref.run_spmd(
                w,
                lambda g, s=step, lay=layout, c=caches, cb=combine, d=dtype: ref.dcp_attention(
                    g, s, c[g.rank_in_group], lay, cb, d
                ),
            )
            for rank in range(w):
                got = ranks[rank][(str(dtype), combine)]
                heads = slice(2 * rank, 2 * rank + 2)
                torch.testing.assert_close(
                    got.out.float(), dcp1.out[:, heads].float(), atol=tol, rtol=tol
                )
                torch.testing.assert_close(got.lse, dcp1.lse[:, heads], atol=1e-4, rtol=1e-4)
                torch.testing.assert_close(got.out, emulated[rank].out, atol=tol, rtol=tol)
    step, layout, caches = make_case(w, torch.float32)
    stage9 = ref.prefill_attention(step, ranks[0]["prefill"], torch.float32)
    dcp1_cache = ref.build_caches(step.states, ref.ShardLayout(1, 1, 4), torch.Generator())[0]
    dcp1 = ref.dcp1_attention(step, dcp1_cache, torch.float32)
    torch.testing.assert_close(stage9.out, dcp1.out, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(stage9.lse, dcp1.lse, atol=1e-4, rtol=1e-4)
