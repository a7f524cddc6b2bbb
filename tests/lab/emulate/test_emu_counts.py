"""What a served run exercised (lab/emulate/bakery_emulate/counts.py), as the parity matrix's
summary reads it (bakery.parity.serving.exercised_counts): a publish by patch 06's index-K
exchange is counted as one, and a run folder from before it was counted still reads."""

from __future__ import annotations

import json

import pytest
import torch
from _emu import stand_in

from bakery.parity import serving


@pytest.fixture
def counts(monkeypatch):
    module = stand_in("counts")
    monkeypatch.delenv("BAKERY_LAUNCH_DIR", raising=False)  # count, write nothing
    monkeypatch.setattr(module, "COUNTS", dict.fromkeys(module.COUNTS, 0))
    return module


def test_a_publish_by_the_index_k_exchange_is_counted(counts):
    calls = []

    def step_06(
        logits,
        row_ks,
        row_ke,
        candidates,
        block_size,
        write,
        global_width=0,
        dcp_rank=0,
        dcp_world_size=1,
        cp_interleave=1,
        row_repeat=1,
        index_k=None,
    ):
        calls.append(index_k)  # _candidate_step's signature in patch 06

    step = counts.counted_candidate_step(step_06)
    logits = torch.zeros(2, 4)
    step(logits, None, None, None, 8, True)  # the dense or sparse exchange
    step(logits, None, None, None, 8, True, index_k=object())  # patch 06 passes it by name
    step(logits, None, None, None, 8, True, 64, 0, 2, 2, 1, object())  # or by position
    assert counts.COUNTS["candidate_publishes"] == 3
    assert counts.COUNTS["index_k_publishes"] == 2
    assert len(calls) == 3  # every call reached the step it counts
    step(logits, None, None, None, 8, False)  # a consumer's mask is not a publish
    assert counts.COUNTS["candidate_publishes"] == 3


def test_exercised_counts_take_each_dcp_rank_once_and_read_older_runs(tmp_path):
    folder = tmp_path / "emulate"
    folder.mkdir()
    rank = {"tp_rank": 0, "dcp_world_size": 2, "candidate_publishes": 3}
    (folder / "11.json").write_text(json.dumps(
        {**rank, "dcp_rank": 0, "indexer_calls": 5, "index_k_publishes": 2,
         "candidate_masked_positions": 10}))  # fmt: skip
    # a rank file written before index-K publishes were counted
    (folder / "12.json").write_text(json.dumps(
        {**rank, "dcp_rank": 1, "indexer_calls": 4, "candidate_masked_positions": 7}))  # fmt: skip
    assert serving.exercised_counts(tmp_path) == serving.Exercised(
        indexer_calls=5,
        candidate_publishes=3,
        index_k_publishes=2,
        candidate_masked_positions=17,
        index_k_keyless_gathers=0,
        multi_request_steps=0,
    )


def test_keyless_index_k_gathers_and_multi_request_steps_are_counted(counts, tmp_path):
    def keys_06(k_quant, k_scale, chunk, dcp_world_size, cp_interleave):
        return k_quant, k_scale  # _dcp_index_k_keys' signature in patch 06

    gather = counts.counted_index_k_keys(keys_06)
    for local in (0, 3, 0):
        gather(None, None, type("Chunk", (), {"local_total_seq_lens": local}), 2, 1)
    assert counts.COUNTS["index_k_keyless_gathers"] == 2

    def execute_model(self, scheduler_output, dummy_run=False):
        return len(scheduler_output.num_scheduled_tokens)

    step = counts.counted_steps(execute_model)
    for scheduled in ({"a": 5}, {"a": 1, "b": 7}, {"a": 1, "b": 1, "c": 1}, {}):
        assert step(None, type("Out", (), {"num_scheduled_tokens": scheduled})) == len(scheduled)
    dummy = type("Out", (), {"num_scheduled_tokens": {"a": 1, "b": 1}})
    step(None, dummy, dummy_run=True)  # a warmup run is no step
    assert counts.COUNTS["multi_request_steps"] == 2
    folder = tmp_path / "emulate"
    folder.mkdir()
    rank = {"tp_rank": 0, "dcp_world_size": 2, "candidate_publishes": 3, "indexer_calls": 1}
    (folder / "1.json").write_text(
        json.dumps(
            {**rank, "dcp_rank": 0, "candidate_masked_positions": 1, "multi_request_steps": 4}
        )
    )
    (folder / "2.json").write_text(
        json.dumps(
            {
                **rank,
                "dcp_rank": 1,
                "candidate_masked_positions": 1,
                "index_k_keyless_gathers": 2,
                "multi_request_steps": 4,
            }
        )
    )
    got = serving.exercised_counts(tmp_path)
    assert got is not None
    assert (got.index_k_keyless_gathers, got.multi_request_steps) == (2, 4)
