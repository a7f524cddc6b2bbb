"""Stage 4 through the indexer itself: the prefill and decode call sites of the baked
``sparse_attn_indexer`` op (decode as stage 5's verification steps), the indexer's own
interleave, and the consumer mask's edge flag, over real gloo groups
(tests/lab/dcp/_dcp_indexer_driver.py says what is stood in).

Each planted variant copies patches/dcp2, rewrites one '+' line, bakes the copy (cpu
base) and runs the same driver; the unplanted series goes through the same steps and
must pass every check. The plants are issue 23's kinds 7-9, which the candidate tests
(``_candidate_step`` driven directly, the interleave checked on the attention class, no
candidate beyond the consumer's width) let through.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from _dcp_candidate_driver import failed
from _dcp_indexer_driver import CASES, CHECKS, INDEX_K_CASE, INDEX_K_CHECKS, run_driver
from _planting import bake_planted

pytestmark = [pytest.mark.slow, pytest.mark.needs("triton")]

KERNELS = "01-model_executor_kernels_attention_dsa_candidate_blocks.py.diff"
INDEXER = "06-model_executor_layers_sparse_attn_indexer.py.diff"
# variant -> (patch, correct text, planted text, after, checks that must fail)
BUGS = {
    "clean": None,
    # kind 7: the consumer's edge flag tested on the local column, not the global position
    "edge_flag_on_local_column": (
        KERNELS,
        "keep = (keep != 0) | ((pos == global_width - 1) & (edge != 0))",
        "keep = (keep != 0) | ((cols == global_width - 1) & (edge != 0))",
        None,
        {"edge_kept_at_global_last"},
    ),
    # kind 8: the prefill call site passes the chunk's local width as the global one
    "prefill_call_site_local_width": (
        INDEXER,
        "chunk.total_seq_lens,",
        "chunk.local_total_seq_lens,",
        "DCP1's logits width is the chunk's global total",
        {"published_eq_reference"},
    ),
    # index K through the op: the request offsets taken from this rank's local packing
    "index_k_local_offsets": (
        INDEXER,
        "chunk.cu_seq_lens, chunk.total_seq_lens, rows, dcp_world_size, cp_interleave",
        "chunk.local_cu_seq_lens, chunk.total_seq_lens, rows, dcp_world_size, cp_interleave",
        None,
        {"index_k_published_eq_dcp1"},
    ),
    # index K never taken, whatever the bytes
    "index_k_never": (
        INDEXER,
        'return min(size, key=size.__getitem__) == "index_k"',
        "return False",
        None,
        {"index_k_taken"},
    ),
    # stage 5: the verification step's candidate blocks taken from the wrong position (each
    # request's rows bounded by its first token's)
    "verify_rows_bounded_by_the_first_token": (
        INDEXER,
        "vis[:num_rows],",
        "seq_lens[:, :1].expand(-1, seq_lens.shape[1]).reshape(-1)[:num_rows],",
        None,
        {"published_eq_reference"},
    ),
    # kind 9: the indexer's interleave in token units at compress_ratio > 1
    "indexer_interleave_in_tokens": (
        INDEXER,
        "return token_interleave // self.compress_ratio",
        "return token_interleave",
        None,
        {"published_eq_reference", "mask_eq_reference"},
    ),
}


@pytest.fixture(scope="module")
def variants(module_tmp, cache) -> dict[str, tuple[Path, dict]]:
    trees = {}
    for name, bug in BUGS.items():
        patch, old, new, after = bug[:4] if bug else (INDEXER, None, None, None)
        trees[name] = bake_planted(module_tmp(name), cache, patch, old, new, after)
    with ThreadPoolExecutor(max_workers=2) as pool:
        results = dict(zip(trees, pool.map(run_driver, trees.values()), strict=True))
    return {name: (trees[name], results[name]) for name in trees}


@pytest.mark.parametrize("name", BUGS)
def test_indexer_call_site_and_planted_bugs(variants, name):
    tree, result = variants[name]
    assert Path(result["vllm_file"]).is_relative_to(Path(tree).resolve())
    bad = failed(result)
    if BUGS[name] is None:
        assert {c["name"] for c in result["checks"]} == {*CHECKS, *INDEX_K_CHECKS}
        assert (
            len(result["checks"])
            == len(CHECKS) * sum(case.w for case in CASES) + len(INDEX_K_CHECKS) * INDEX_K_CASE.w
        )
        assert bad == {}, [c for c in result["checks"] if not c["ok"]][:3]
        return
    _, _, new, _, must_fail = BUGS[name]
    assert new in _baked_text(tree), "the bug did not reach the baked tree"
    assert must_fail <= bad.keys(), f"planted {new!r} but only {bad} failed"


def _baked_text(tree: Path) -> str:
    folder = Path(tree) / "vllm" / "model_executor"
    return "".join(
        (folder / rel).read_text()
        for rel in ("layers/sparse_attn_indexer.py", "kernels/attention/dsa/candidate_blocks.py")
    )
