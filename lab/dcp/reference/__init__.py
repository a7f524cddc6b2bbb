"""Pure-torch reference model of patch 09's DCP attention math.

Job: state, in plain torch, what DeepSeek-V4.1 sparse MLA under decode context
parallelism (DCP, ``W`` ranks) must compute, so tests can prove that DCP ``W``
reproduces the single-rank (DCP1) softmax and can hold the patched helpers to it.
One module per seam:

- ``shards``: where compressed state ``s`` lives (rank ``(s // K) % W``, local
  index ``(s // (K*W)) * K + s % K``), in lookup form and, independently, in
  vLLM's slot-mapping form; the ``ShardLayout`` and the sharded paged caches;
- ``groups``: the collectives (a real ``torch.distributed`` group, or W ranks as
  threads in one process);
- ``attention``: sparse MLA at DCP1 and on one DCP rank (lookup, SWA and sink on
  rank 0 only, base-2 LSE), and stage 9's prefill gather;
- ``combine``: merging the ranks' partials by LSE (``ag_rs`` and ``a2a``);
- ``candidates``: stage 4's two-level candidate blocks at DCP1 and on a rank;
- ``spec``: speculative decoding's verification step (1 + k query tokens per request,
  each with its own causal bound), its owner-only KV writes, the rollback, DSpark's
  non-causal draft block;
- ``cases``: random steps for the property tests.

This package is the public face: ``from lab.dcp import reference as ref`` and
``ref.dcp_attention(...)``. To plant a bug, patch the name in the module that
calls it (``attention.local_index``, not ``ref.local_index``).

Boundary: torch only; no vLLM import and no kernels. Everything is per-rank SPMD
code over a ``Group`` whose methods match vLLM's ``GroupCoordinator``, so a
``Group`` can be set as ``dcp_group`` on the patched attention class.
"""

from lab.dcp.reference.attention import (
    EMPTY_LSE,
    LOG2E,
    PrefillGather,
    Source,
    Step,
    convert_dcp1,
    dcp1_attention,
    dcp_attention,
    filter_and_convert,
    gathered_sink,
    neutral_swa,
    prefill_attention,
    prefill_gather,
    prefill_geometry,
    rank_attention,
    sparse_attention,
)
from lab.dcp.reference.candidates import (
    block_maxima,
    candidate_blocks_dcp,
    candidate_blocks_dcp1,
    candidate_blocks_dcp_index_k,
    candidate_blocks_dcp_sparse,
    mask_candidates_dcp,
    mask_candidates_dcp1,
    merge_sparse,
    order_keys,
    select_blocks,
    shard_columns,
    token_topk_dcp,
    token_topk_dcp1,
)
from lab.dcp.reference.cases import random_step, random_topk, spec_step
from lab.dcp.reference.combine import (
    COMBINES,
    AttnOut,
    Combine,
    combine_a2a,
    combine_ag_rs,
    merge_lse,
)
from lab.dcp.reference.groups import Group, ThreadGroup, TorchGroup, run_spmd
from lab.dcp.reference.shards import (
    PagedCache,
    ShardLayout,
    build_caches,
    global_position,
    local_index,
    owner_rank,
    placement,
    prefill_remap,
    write_states,
)
from lab.dcp.reference.spec import (
    RankKV,
    block_ids,
    commit,
    open_batch,
    speculate,
    step_positions,
    step_state_ids,
    swa_rows,
    token_ends,
    visible_states,
    write_step,
)

__all__ = [
    "COMBINES",
    "EMPTY_LSE",
    "LOG2E",
    "AttnOut",
    "Combine",
    "Group",
    "PagedCache",
    "PrefillGather",
    "ShardLayout",
    "Source",
    "Step",
    "ThreadGroup",
    "TorchGroup",
    "block_maxima",
    "build_caches",
    "candidate_blocks_dcp",
    "candidate_blocks_dcp1",
    "candidate_blocks_dcp_index_k",
    "candidate_blocks_dcp_sparse",
    "combine_a2a",
    "combine_ag_rs",
    "convert_dcp1",
    "dcp1_attention",
    "dcp_attention",
    "filter_and_convert",
    "gathered_sink",
    "global_position",
    "local_index",
    "mask_candidates_dcp",
    "mask_candidates_dcp1",
    "merge_sparse",
    "order_keys",
    "merge_lse",
    "neutral_swa",
    "owner_rank",
    "placement",
    "prefill_attention",
    "prefill_gather",
    "prefill_geometry",
    "prefill_remap",
    "random_step",
    "random_topk",
    "rank_attention",
    "run_spmd",
    "select_blocks",
    "shard_columns",
    "sparse_attention",
    "token_topk_dcp",
    "token_topk_dcp1",
    "RankKV",
    "block_ids",
    "commit",
    "open_batch",
    "speculate",
    "spec_step",
    "step_positions",
    "step_state_ids",
    "swa_rows",
    "token_ends",
    "visible_states",
    "write_states",
    "write_step",
]
