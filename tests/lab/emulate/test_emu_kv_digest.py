"""cache_insert's digest of the sliding-window KV a rank wrote: the whole-model matrix
holds every rank's equal (replicated under DCP; tests/parity/test_matrix_v41_spec.py plants
a draft KV written on one rank only). Equal for the same records at the same slots in any
order; different for a record skipped, a byte changed or a slot moved."""

from __future__ import annotations

import torch
from _emu import stand_in

BLOCK, PAGES = 16, 3


def _written(k: torch.Tensor, slots: torch.Tensor) -> int:
    cache = torch.zeros(PAGES, BLOCK * 584, dtype=torch.uint8)
    return stand_in("cache_insert").quantize_insert(k, cache, slots, BLOCK)


def _rows() -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(5)
    k = (torch.randn(12, 512, generator=gen) * 3).to(torch.bfloat16)
    return k, torch.randperm(PAGES * BLOCK, generator=gen)[:12]


def test_the_same_records_in_another_order_give_the_same_digest():
    k, slots = _rows()
    order = torch.randperm(12, generator=torch.Generator().manual_seed(6))
    digest = _written(k, slots)
    assert digest != 0
    assert _written(k[order], slots[order]) == digest


def test_a_skipped_record_a_changed_byte_or_a_moved_slot_changes_the_digest():
    k, slots = _rows()
    digest = _written(k, slots)
    skipped = slots.clone()
    skipped[3] = -1  # this rank did not write row 3
    changed = k.clone()
    changed[7, 500] += 1  # a bf16 tail element: one record's bytes differ
    moved = slots.clone()
    moved[0] = int(slots.max()) + 1  # the same bytes at another slot
    assert len({digest, _written(k, skipped), _written(changed, slots), _written(k, moved)}) == 4
    assert _written(k, torch.full_like(slots, -1)) == 0  # nothing written
