"""slot_mapping: ``compute_slot_mappings`` == the baked V2 runner's own method and Triton
``_compute_slot_mappings_kernel`` (interpreted) at cp_size 1, and == the ownership rule of
``lab.dcp.reference.placement`` at cp_size 2 and 4 (every real token of a sharded group
on exactly one rank). Groups cover block sizes 4, 8 and 16, a group with slot mapping off
and, under CP, a group that is not sharded; requests include a dummy (-1) one, an empty
one and chunked-prefill positions; stale slots past the tokens must be reset.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from _emu import baked, caught, passed, planted, stand_in

pytestmark = pytest.mark.needs("triton")

BLOCK_TABLE = "vllm/v1/worker/gpu/block_table.py"
SIZES, MAX_TOKENS, PADDED = [4, 8, 16], 20, 14
ENABLED, SHARDED = [True, True, False], [True, False, True]
IDX = [2, 0, -1, 1]  # batch row -> request state; -1: a dummy request
QSL = [0, 3, 3, 8, 12]  # batch row 1 has no token
POS = [37, 38, 39, 0, 1, 2, 3, 4, 5, 22, 23, 63]


def _fake(cp_size: int, cp_rank: int, interleave: int):
    gen = torch.Generator().manual_seed(11)
    tables = [
        torch.randperm(64, generator=gen)[: 3 * 16].view(3, 16).to(torch.int32) for _ in SIZES
    ]
    return SimpleNamespace(
        num_kv_cache_groups=len(SIZES),
        block_sizes=list(SIZES),
        block_tables=[SimpleNamespace(gpu=t) for t in tables],
        block_table_ptrs=torch.tensor([t.data_ptr() for t in tables], dtype=torch.uint64),
        block_table_strides=torch.tensor([t.stride(0) for t in tables], dtype=torch.int64),
        block_sizes_tensor=torch.tensor(SIZES, dtype=torch.int32),
        slot_mapping_enabled=torch.tensor(ENABLED),
        dcp_sharded=torch.tensor(SHARDED),
        slot_mappings=torch.full((len(SIZES), MAX_TOKENS), 4242, dtype=torch.int64),  # stale
        cp_size=cp_size,
        cp_rank=cp_rank,
        cp_interleave=interleave,
    )


def _run(method, fake) -> torch.Tensor:
    args = (
        torch.tensor(IDX, dtype=torch.int32),
        torch.tensor(QSL, dtype=torch.int32),
        torch.tensor(POS, dtype=torch.int64),
        PADDED,
    )
    view = method(fake, *args)
    assert view.data_ptr() == fake.slot_mappings.data_ptr() and view.shape[1] == PADDED
    return fake.slot_mappings.clone()


def _real_method(tree):
    from vllm.v1.attention.backends.utils import PAD_SLOT_ID
    from vllm.v1.worker.gpu.buffer_utils import _load_ptr

    ns = baked(
        tree, BLOCK_TABLE, ["BlockTables"], {"PAD_SLOT_ID": PAD_SLOT_ID, "_load_ptr": _load_ptr}
    )
    return ns["BlockTables"].compute_slot_mappings


def _ownership(cp_size: int, cp_rank: int, interleave: int) -> torch.Tensor:
    from lab.dcp.reference.shards import placement

    fake = _fake(cp_size, cp_rank, interleave)
    want = torch.full((len(SIZES), MAX_TOKENS), -1, dtype=torch.int64)
    for g, size in enumerate(SIZES):
        table = fake.block_tables[g].gpu
        for b, req in enumerate(IDX):
            for i in range(QSL[b], QSL[b + 1]):
                if req < 0 or not ENABLED[g]:
                    continue
                pos = torch.tensor([POS[i]])
                if SHARDED[g] and cp_size > 1:
                    rank, page, off = (int(v) for v in placement(pos, cp_size, interleave, size))
                    if rank != cp_rank:
                        continue
                else:
                    page, off = POS[i] // size, POS[i] % size
                want[g, i] = int(table[req, page]) * size + off
    return want


def cp1_vs_triton(tree, method=None) -> None:
    method = method or stand_in("slot_mapping").compute_slot_mappings
    want = _run(_real_method(tree), _fake(1, 0, 1))
    assert torch.equal(want, _ownership(1, 0, 1)), "Triton disagrees with the ownership rule"
    got = _run(method, _fake(1, 0, 1))
    assert torch.equal(got, want), (got, want)


def cp_vs_ownership(tree, method=None) -> None:
    method = method or stand_in("slot_mapping").compute_slot_mappings
    for cp_size in (2, 4):
        for interleave in (1, 2):
            held = torch.zeros(len(SIZES), MAX_TOKENS, dtype=torch.int64)
            for rank in range(cp_size):
                got = _run(method, _fake(cp_size, rank, interleave))
                want = _ownership(cp_size, rank, interleave)
                assert torch.equal(got, want), (cp_size, interleave, rank, got, want)
                held += got >= 0
            real = torch.tensor([IDX[b] >= 0 for b in range(4) for _ in range(QSL[b], QSL[b + 1])])
            assert (held[0, :12] == real.long()).all()  # a sharded group: one owner per token


def plant_pad_not_refilled(tree) -> None:
    bad = planted(
        stand_in("slot_mapping").compute_slot_mappings, "row[qsl[num_reqs] :] = PAD_SLOT_ID", "pass"
    )
    cp1_vs_triton(tree, bad)


def plant_interleave_ignored(tree) -> None:
    bad = planted(
        stand_in("slot_mapping").compute_slot_mappings,
        "is_local = offsets // self.cp_interleave % self.cp_size == self.cp_rank",
        "is_local = offsets % self.cp_size == self.cp_rank",
    )
    cp_vs_ownership(tree, bad)


CHECKS = ["cp1_vs_triton", "cp_vs_ownership", "plant_pad_not_refilled", "plant_interleave_ignored"]


@pytest.fixture(scope="module")
def results(child_results):
    return child_results[__name__]


def test_slot_mappings_match_the_triton_kernel_at_cp1(results):
    passed(results, "cp1_vs_triton")


def test_slot_mappings_match_ownership_at_cp2_and_cp4(results):
    passed(results, "cp_vs_ownership")


@pytest.mark.parametrize("plant", ["plant_pad_not_refilled", "plant_interleave_ignored"])
def test_slot_mapping_checks_catch(results, plant):
    caught(results, plant)
