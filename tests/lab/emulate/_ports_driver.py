"""The emulation's torch ports of upstream kernels against the interpreted originals.

Usage: ``python tests/lab/emulate/_ports_driver.py TREE`` with ``lab/emulate/`` and ``TREE`` (a
cpu bake) first on PYTHONPATH and TRITON_INTERPRET=1 (``test_ports.py`` runs it so).
Each check runs the original Triton kernel of the baked tree (interpreted, with the
emulation's nearest-even rounding) and the port on the same inputs, and then a planted
copy of the port that must disagree. It prints one ``RESULT {json}`` line:
``{name: {"equal": bool, "planted_equal": bool}}``.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import sys

os.environ["TRITON_INTERPRET"] = "1"
import bakery_emulate.patches  # noqa: E402

bakery_emulate.patches.install()

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from bakery_emulate import (  # noqa: E402
    cache_insert,
    compress_cache,
    dcp_combine,
    index_remap,
    inv_rope,
    rmsnorm,
    swa_indices,
    zero_blocks,
)

MARK = "RESULT "


def pristine(name: str):
    """A second copy of a baked module, executed without the emulation's hooks: the
    originals its ports replace (the imported module holds the ports)."""
    from importlib.machinery import SourceFileLoader

    path = importlib.util.find_spec(name).origin
    loader = SourceFileLoader(name, path)
    module = importlib.util.module_from_spec(importlib.util.spec_from_loader(name, loader))
    loader.exec_module(module)
    return module


RESULTS: dict[str, dict[str, bool]] = {}


def same(a, b) -> bool:
    """Byte-equal, except fp32 results of exp2/log2, which may differ in the last bit or
    two between numpy (the interpreter) and torch (as both do from CUDA's)."""
    a, b = (a if isinstance(a, tuple) else (a,)), (b if isinstance(b, tuple) else (b,))
    for x, y in zip(a, b, strict=True):
        if x.dtype == torch.float32:
            if not torch.allclose(x, y, rtol=5e-7, atol=0, equal_nan=True):
                return False
        elif not torch.equal(x, y):
            return False
    return True


def check(name, original, port, planted) -> None:
    want = original()
    RESULTS[name] = {"equal": same(want, port()), "planted_equal": same(want, planted())}


def quantize_insert() -> None:
    ops = importlib.import_module("vllm.models.deepseek_v41.common.ops.cache_utils")
    gen = torch.Generator().manual_seed(0)
    bs, pages, n = 16, 4, 40
    k = torch.randn(n, 512, generator=gen) * torch.logspace(-6, 3, n)[:, None]
    k = k.to(torch.bfloat16)
    k[0, :64] = 0  # an all-zero block: the 1e-4 floor
    k[2, :448] = 448.0 * 2.0**3  # a block max exactly at 448 * 2^k
    k[3, 64:128] = 448.0 * 2.0**3 * 1.0078125  # just above it
    slots = torch.randperm(pages * bs, generator=gen)[:n]
    slots[5] = -1

    def run(fn):
        cache = torch.zeros(pages, bs * 584, dtype=torch.uint8)
        fn(cache)
        return cache

    def planted(cache):  # a scale one power of two too large: the ceil rounded up again
        real = torch.ceil
        cache_insert.torch.ceil = lambda x: real(x) + 1
        try:
            cache_insert.quantize_insert(k, cache, slots, bs)
        finally:
            cache_insert.torch.ceil = real

    check(
        "quantize_insert",
        lambda: run(lambda c: ops.quantize_and_insert_k_cache(k, c, slots, block_size=bs)),
        lambda: run(lambda c: cache_insert.quantize_insert(k, c, slots, bs)),
        lambda: run(planted),
    )


def correct_attn_out() -> None:
    dcp = importlib.import_module("vllm.v1.attention.ops.dcp")
    gen = torch.Generator().manual_seed(1)
    n, b, h, d = 2, 5, 4, 512
    out = torch.randn(b, h, d, generator=gen).to(torch.bfloat16)
    lses = torch.randn(n, b, h, generator=gen) * 3
    lses[0, 0, 0] = float("-inf")
    lses[:, 1, 1] = float("-inf")  # a row every rank saw empty
    lses[1, 2, 2] = float("nan")

    def run(kernel, rank):
        new, vlse = torch.empty_like(out), torch.empty(b, h)
        kernel(out, new, lses, vlse, rank, dcp.CPTritonContext(), is_base_e=False)
        return new, vlse

    class Planted(dcp_combine.CorrectAttnOut):  # the rank's own LSE, not the total
        def __call__(self, outputs, new_output, lses, vlse, lse_idx, ctx, *, is_base_e):
            super().__call__(outputs, new_output, lses, vlse, 1 - lse_idx, ctx, is_base_e=is_base_e)

    for rank in range(n):
        check(
            f"correct_attn_out[rank{rank}]",
            lambda r=rank: run(dcp.CorrectAttnCPOutKernel(), r),
            lambda r=rank: run(dcp_combine.CorrectAttnOut(), r),
            lambda r=rank: run(Planted(), r),
        )


def a2a() -> None:
    for dtype in (torch.bfloat16, torch.float32):
        _a2a_case(dtype)


def _a2a_case(dtype) -> None:
    dcp = pristine("vllm.v1.attention.ops.dcp")
    assert dcp._dcp_a2a_unpack_combine is not dcp_combine.unpack_combine
    gen = torch.Generator().manual_seed(2)
    n, b, h, d = 2, 5, 4, 512
    out = torch.randn(b, h, d, generator=gen).to(dtype)
    lse = torch.randn(b, h, generator=gen) * 2
    pack = dcp._dcp_a2a_lse_pack_dim(dtype)
    seq_lens, qsl = torch.tensor([3, 0]), torch.tensor([0, 3, 5])  # request 2: empty shard

    def packed(fn):
        buf = torch.zeros(n, b, h // n, d + pack, dtype=dtype)
        fn(out, lse, buf, n, h // n, d, pack, seq_lens=seq_lens, query_start_loc=qsl)
        return buf.view(torch.int16) if dtype == torch.bfloat16 else buf

    def planted_pack(o, l_, buf, *args, **kwargs):  # the empty-shard mask dropped
        dcp_combine.pack_send(o, l_, buf, *args)

    name = str(dtype).removeprefix("torch.")
    check(
        f"a2a_pack[{name}]",
        lambda: packed(dcp._dcp_a2a_pack_send),
        lambda: packed(dcp_combine.pack_send),
        lambda: packed(planted_pack),
    )
    buf = torch.zeros(n, b, h // n, d + pack, dtype=dtype)
    dcp._dcp_a2a_pack_send(out, lse, buf, n, h // n, d, pack)
    check(
        f"a2a_unpack[{name}]",
        lambda: dcp._dcp_a2a_unpack_combine(buf, d, pack, True, False),
        lambda: dcp_combine.unpack_combine(buf, d, pack, True, False),
        lambda: dcp_combine.unpack_combine(buf, d, pack, True, True),  # base e, not 2
    )

    def launched(kernel, base_e=False):  # as patch 09 launches it: into a strided output
        output = torch.full((b, h, d + 64), 7.0, dtype=dtype)[:, : h // n, :d]
        no_lse = torch.empty((1, 1), dtype=dtype)
        kernel[(b, h // n, 1)](
            buf, output, no_lse, *buf.stride(), *output.stride(), *no_lse.stride(),
            N=n, HEAD_DIM=d, IS_BASE_E=base_e, RETURN_LSE=False, LSE_PACK_DIM=pack,
        )  # fmt: skip
        return output._base if output._base is not None else output

    check(
        f"a2a_unpack_kernel[{name}]",
        lambda: launched(dcp._dcp_a2a_unpack_combine_kernel),
        lambda: launched(dcp_combine.UnpackCombineKernel()),
        lambda: launched(dcp_combine.UnpackCombineKernel(), base_e=True),
    )


def inverse_rope() -> None:
    m = importlib.import_module("vllm.models.deepseek_v4.common.ops.fused_inv_rope_fp8_quant")
    gen = torch.Generator().manual_seed(3)
    t, g, hpg = 6, 2, 2
    o = torch.randn(t, g * hpg, 512, generator=gen).to(torch.bfloat16)
    pos, cs = torch.arange(t) * 7, torch.randn(100, 64, generator=gen)
    kw = dict(
        heads_per_group=hpg,
        quant_group_size=128,
        chunks_per_head=4,
        nope_dim=448,
        half_rope=32,
        tma_aligned_scales=False,
        quantize=False,
        fp8_max=448.0,
        launch_pdl=False,
        grid=(t, g * hpg),
    )

    def run(kernel, positions=pos):
        buf = torch.empty(g, t, hpg * 512, dtype=torch.bfloat16)
        kernel(o, positions, cs, buf, torch.empty(0), t, **kw)
        return buf

    check(
        "inverse_rope",
        lambda: run(m.FusedInvRopeFP8QuantKernel()),
        lambda: run(inv_rope.InvRope(None)),
        lambda: run(inv_rope.InvRope(None), pos + 1),
    )  # planted: off-by-one position


def index_remap_check() -> None:
    su = importlib.import_module("vllm.v1.attention.backends.mla.sparse_utils")
    gen = torch.Generator().manual_seed(4)
    t, k, r, mb, bs = 6, 128, 3, 8, 64
    req = torch.randint(0, r, (t,), dtype=torch.int32, generator=gen)
    bt = torch.randint(0, 50, (r, mb), dtype=torch.int32, generator=gen)
    ti = torch.randint(-1, 1200, (t, k), dtype=torch.int32, generator=gen)

    class Planted(index_remap.RemapIndex):  # every token taken as this rank's own
        def __call__(self, *args, **kwargs):
            super().__call__(*args, **{**kwargs, "DCP_SIZE": 1})

    for w, rank, il in ((1, 0, 1), (2, 0, 2), (2, 1, 2), (4, 3, 1)):

        def run(kernel, w=w, rank=rank, il=il):
            su._CONVERT_REQ_INDEX_TO_GLOBAL_INDEX_KERNEL = kernel
            if w == 1:
                return su.triton_convert_req_index_to_global_index(
                    req, bt, ti, BLOCK_SIZE=bs, NUM_TOPK_TOKENS=k, return_valid_counts=True
                )
            return su.triton_filter_and_convert_dcp_index(
                req, bt, ti, w, rank, il, BLOCK_SIZE=bs, NUM_TOPK_TOKENS=k, return_valid_counts=True
            )

        planted = (lambda: run(Planted())) if w > 1 else (lambda: run(_OffByOne()))
        check(
            f"index_remap[w{w}r{rank}i{il}]",
            lambda: run(su.ConvertReqIndexToGlobalIndexKernel()),
            lambda: run(index_remap.RemapIndex()),
            planted,
        )


class _OffByOne(index_remap.RemapIndex):  # the in-block offset shifted by one
    def __call__(self, *args, **kwargs):
        stride = kwargs["BLOCK_STRIDE_ROWS"] + 1
        super().__call__(*args, **{**kwargs, "BLOCK_STRIDE_ROWS": stride})


def qkv_rmsnorm() -> None:
    m = importlib.import_module("vllm.models.common.ops.fused_qk_rmsnorm")
    gen = torch.Generator().manual_seed(5)
    x = (torch.randn(7, 640, generator=gen) * 3).to(torch.bfloat16)
    q, kv = x[:, :128], x[:, 128:]
    qw = torch.randn(128, generator=gen).to(torch.bfloat16)
    kw_ = torch.randn(512, generator=gen).to(torch.bfloat16)

    def run(kernel, eps=1e-20):
        qo = torch.empty(7, 128, dtype=torch.bfloat16)
        ko = torch.empty(7, 512, dtype=torch.bfloat16)
        kernel(q, kv, qo, ko, qw, kw_, eps)
        return qo, ko

    check(
        "qkv_rmsnorm",
        lambda: run(m.FusedQKVRMSNormKernel()),
        lambda: run(rmsnorm.FusedQKVRMSNorm()),
        lambda: run(rmsnorm.FusedQKVRMSNorm(), 1.0),
    )


def swa() -> None:
    s = importlib.import_module("vllm.v1.attention.backends.mla.sparse_swa")
    window, bs, mb = 8, 4, 16
    qsl = torch.tensor([0, 5, 12, 20], dtype=torch.int32)
    seq = torch.tensor([9, 30, 8], dtype=torch.int32)
    t2r = torch.tensor([0] * 5 + [1] * 7 + [2] * 8 + [0] * 4, dtype=torch.int32)
    valid = torch.ones(24, dtype=torch.bool)
    valid[3] = False
    gen = torch.Generator().manual_seed(6)
    bt = torch.randint(0, 99, (3, mb), dtype=torch.int32, generator=gen)
    replay = torch.tensor([0, 25, 2], dtype=torch.int32)  # SWA bounded replay starts
    left = torch.randint(0, 6, (24,), dtype=torch.int32, generator=gen)
    right = torch.randint(0, 3, (24,), dtype=torch.int32, generator=gen)
    for image in (False, True):
        for offset in (0, 2):

            def run(kernel, rs=replay, image=image, offset=offset):
                ind = torch.full((18, window + 6), 7, dtype=torch.int32)
                lens = torch.full((18,), 7, dtype=torch.int32)
                kernel(
                    ind,
                    lens,
                    window,
                    window + 6,
                    left,
                    right,
                    qsl,
                    seq,
                    t2r,
                    valid,
                    bt,
                    bs,
                    rs,
                    num_tokens=18,
                    token_offset=offset,
                    has_image=image,
                )
                return ind, lens

            check(
                f"swa_indices[image={image},offset={offset}]",
                lambda: run(s.ComputeSWAIndicesAndLensKernel()),
                lambda: run(swa_indices.SWAIndicesAndLens()),
                lambda: run(swa_indices.SWAIndicesAndLens(), torch.zeros_like(replay)),
            )


def zero_kv_blocks() -> None:
    kernel = pristine("vllm.v1.worker.utils")._zero_kv_blocks_kernel
    gen = torch.Generator().manual_seed(7)
    # Two segments, as a packed layer's views: different block strides and page sizes.
    a = torch.randint(1, 2**30, (6, 40), dtype=torch.int32, generator=gen)
    b = torch.randint(1, 2**30, (6 * 24,), dtype=torch.int32, generator=gen)
    ids = torch.tensor([4, 0, 2], dtype=torch.int64)

    def run(zero, short=0):
        x, y = a.clone(), b.clone()
        addrs = torch.tensor([x.data_ptr(), y.data_ptr() + 8], dtype=torch.uint64)
        strides = torch.tensor([40, 24], dtype=torch.int64)
        pages = torch.tensor([40 - short, 21 - short], dtype=torch.int64)
        zero[(3, 2, 3)](addrs, strides, pages, ids, BLOCK_SIZE=16)
        return x, y

    check(
        "zero_kv_blocks",
        lambda: run(kernel),
        lambda: run(zero_blocks.ZeroKVBlocks()),
        lambda: run(zero_blocks.ZeroKVBlocks(), short=1),
    )


@triton.jit
def _sum_in_order(a, b):
    return a + b


@triton.jit
def _nan_max(a, b):
    return tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def _first_max(v1, i1, v2, i2):
    keep = v1 >= v2
    return tl.where(keep, v1, v2), tl.where(keep, i1, i2)


@triton.jit
def _reductions(x, rows, cols, total, kept, best, at, R: tl.constexpr, C: tl.constexpr):
    r, c = tl.arange(0, R), tl.arange(0, C)
    v = tl.load(x + r[:, None] * C + c[None, :])
    tl.store(rows + r, tl.reduce(v, 1, _nan_max))
    tl.store(cols + c, tl.reduce(v, 0, _sum_in_order))
    tl.store(total, tl.reduce(v, None, _sum_in_order))
    tl.store(kept + r[:, None], tl.reduce(v, 1, _sum_in_order, keep_dims=True))
    value, index = tl.reduce((v, c[None, :] + r[:, None] * 0), 1, _first_max)
    tl.store(best + r, value)
    tl.store(at + r, index)


def folded_reduce() -> None:
    """The interpreter's custom-combine reduce, folded over whole slices, against its own
    element-at-a-time loop: NaN, both zeros, infinities, ties, an order-sensitive sum."""
    interpreter = importlib.import_module("triton.runtime.interpreter")
    folded = interpreter.ReduceOps.generic_reduce
    gen = torch.Generator().manual_seed(8)
    x = torch.randn(8, 16, generator=gen) * torch.logspace(-8, 8, 16)
    x[0, 3], x[1, :] = float("nan"), 0.0
    x[1, ::3], x[2, 5], x[3, 7] = -0.0, float("inf"), -float("inf")
    x[4, 2] = x[4, 9] = x[4].abs().max() + 1  # a tie: the first index wins

    def reversed_fold(self, input):  # the plant: the same fold from the other end
        flipped = [self.to_tensor(a.handle.data[..., ::-1].copy(), a.dtype) for a in input]
        return folded(self, tuple(flipped))

    def run(reduce):
        interpreter.ReduceOps.generic_reduce = reduce
        try:
            out = (
                torch.empty(8),
                torch.empty(16),
                torch.empty(1),
                torch.empty(8),
                torch.empty(8),
                torch.empty(8, dtype=torch.int32),
            )
            _reductions[(1,)](x, *out, R=8, C=16)
            return tuple(o.view(torch.int32) for o in out)  # bits: same() allows fp32 ulps
        finally:
            interpreter.ReduceOps.generic_reduce = folded

    check(
        "folded_reduce",
        lambda: run(folded.elementwise),
        lambda: run(folded),
        lambda: run(reversed_fold),
    )


def listed_builtins() -> None:
    """The builtins the interpreter wraps per launch, listed once, against its own
    inspect.getmembers on every launch: the same (object, name, original) changes."""
    interpreter = importlib.import_module("triton.runtime.interpreter")
    listed = interpreter._patch_builtin

    def one_short(pkg, builder, scope):  # the plant: a name lost from the list
        listed(pkg, builder, scope)
        if pkg is tl:
            scope.restore()
            listed.every_launch(pkg, builder, scope)
            del scope._changes[-1]

    def changes(patch_builtin):
        scope = interpreter._LangPatchScope()
        for pkg in (tl, tl.core, tl.tensor, tl.math, tl.core.tensor_descriptor_base):
            patch_builtin(pkg, interpreter.interpreter_builder, scope)
        made = [(id(obj), name, id(original)) for obj, name, original in scope._changes]
        scope.restore()
        return torch.tensor([hash(tuple(made)) % 2**62, len(made)])

    check(
        "listed_builtins",
        lambda: changes(listed.every_launch),
        lambda: changes(listed),
        lambda: changes(one_short),
    )


# ---- indexer K store and mHC head reduce (V4.1's kernels beside the series) ----------


@triton.jit
def _row_sums(x, out, N: tl.constexpr):
    row, cols = tl.program_id(0), tl.arange(0, N)
    tl.store(out + row, tl.sum(tl.load(x + row * N + cols), axis=0))


def numpy_sum_check() -> None:
    """The indexer K store's k_norm sum in the order of the interpreter's tl.sum (numpy's
    pairwise one), bit for bit; torch's own .sum (the plant) differs in the last bits."""
    from bakery_emulate import indexer_k_store

    gen = torch.Generator().manual_seed(11)
    x = torch.randn(64, 128, generator=gen) * torch.logspace(-6, 6, 128)
    x = x[:, torch.randperm(128, generator=gen)] ** 2

    def interpreted():
        out = torch.empty(64)
        _row_sums[(64,)](x, out, N=128)
        return out.view(torch.int32)  # bits: same() allows fp32 ulps

    check(
        "numpy_sum[128]",
        interpreted,
        lambda: indexer_k_store.numpy_sum(x).view(torch.int32),
        lambda: x.sum(-1).view(torch.int32),
    )


def fp8_exponent_check() -> None:
    """The indexer K store's scale exponent ceil(log2(amax / 448)) over every amax it can
    see (each finite bf16 magnitude, and the 1e-4 floor): torch's log2 against numpy's,
    which the interpreter calls one value at a time; the two differ in the last bit for
    some values, the ceil must not. Planted: floor + 1, wrong at powers of two."""
    import numpy as np

    amax = torch.arange(0, 0x7F80, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)
    amax = torch.fmax(amax.float(), torch.tensor(1e-4)) * (1.0 / 448.0)

    def interpreted():
        ceil = [np.ceil(np.log2(np.array([v], dtype=np.float32))) for v in amax.tolist()]
        return torch.from_numpy(np.concatenate(ceil))

    check(
        "fp8_exponent[bf16]",
        interpreted,
        lambda: torch.ceil(torch.log2(amax)),
        lambda: torch.floor(torch.log2(amax)) + 1,
    )


def indexer_k_store_checks() -> None:
    """The V4.1 indexer K store's FP8 cache bytes, as the tiny V4.1 writes them (head 128,
    rope 64, pages of 128, ratios 1 and 2): values and scales, untouched bytes kept."""
    from bakery_emulate import indexer_k_store

    m = importlib.import_module("vllm.models.deepseek_v41.common.ops.indexer_k_store")
    port = m._indexer_k_norm_rope_quant_store_kernel  # as the hook installed it
    original = port.original
    gen = torch.Generator().manual_seed(9)
    n, pages, bs = 32, 3, 128
    spread = torch.logspace(-6, 6, 128)[torch.randperm(128, generator=gen)]
    k_pre = torch.randn(n, 128, generator=gen) * spread
    k_pre[1] = 0  # an all-zero row: the 1e-4 floor
    k_pre[2, ::3] = -0.0  # signed zeros through the nope pairs' cos 1 / sin 0
    k_pre[3] = 3e19  # k * k overflows fp32: rsqrt(inf) = 0
    k_pre[4, 7] = 2e4  # one spike: the row's amax
    k_pre[6] = float("nan")  # NaN: the interpreter's nanmax, fmax and fmin
    k_pre[7, :3] = float("inf")  # inf * rsqrt(inf): NaN beside zeros
    wide = torch.zeros(n, 160, dtype=torch.bfloat16)  # a row stride past the head
    wide[:, :128] = k_pre.to(torch.bfloat16)
    k_pre = wide[:, :128]
    weight = (torch.randn(128, generator=gen) * 4).to(torch.bfloat16)
    cos_sin = torch.randn(2 * pages * bs, 64, generator=gen)
    positions = torch.randperm(2 * pages * bs, generator=gen)[:n]  # across pages
    slots = torch.randperm(pages * bs, generator=gen)[:n]
    slots[[5, 17, 26]] = -1  # padding
    positions[[5, 17, 26]] = torch.tensor([1, 129, 255])  # group ends: only the slot skips
    bytes_ = torch.randint(0, 256, (pages, bs, 132), dtype=torch.uint8, generator=gen)

    def run(store, ratio, slot_mapping=slots):
        cache = bytes_.clone()
        _launched(
            m,
            "_indexer_k_norm_rope_quant_store_kernel",
            store,
            lambda mod: mod.indexer_k_norm_rope_store(
                k_pre, positions, cos_sin, weight, 1e-6, cache, slot_mapping, ratio, False
            ),
        )
        return cache

    class OwnPosition(indexer_k_store.IndexerKStore):  # RoPE at the token, not its group
        @staticmethod
        def group_positions(positions, ratio):
            return positions

    class PaddingKept(indexer_k_store.IndexerKStore):  # slot -1 written (as page -1)
        def store(self, num_tokens, *args, **kwargs):
            args = list(args)  # [7] k_cache, [8] kv_slot_mapping, [9] kv_cache_block_size
            args[8] = args[8] % (args[7].shape[0] * args[9])
            super().store(num_tokens, *args, **kwargs)

    class NeoX(indexer_k_store.IndexerKStore):  # RoPE pairs (i, i + 64), not (2i, 2i + 1)
        @staticmethod
        def pairs(k):
            return k[:, :64], k[:, 64:]

        @staticmethod
        def unpair(even, odd):
            return torch.cat([even, odd], dim=1)

    want = {ratio: run(original, ratio) for ratio in (1, 2)}  # interpreted: run once
    check(
        "indexer_k_store[ratio=1]",
        lambda: want[1],
        lambda: run(port, 1),
        lambda: run(NeoX(original), 1),
    )
    check(
        "indexer_k_store[ratio=2]",
        lambda: want[2],
        lambda: run(port, 2),
        lambda: run(OwnPosition(original), 2),
    )
    check(
        "indexer_k_store[padding]",
        lambda: want[2],
        lambda: run(port, 2),
        lambda: run(PaddingKept(original), 2),
    )


def hc_head_reduce_checks() -> None:
    """The mHC head reduce through both launchers: hc_collapse_triton (the tiny V4.1's
    hc_mult 4, hidden 256, a strided x) and hc_head_reduce_triton_kernel (hidden 1280:
    two column blocks, the second masked)."""
    from bakery_emulate import hc_reduce

    m = importlib.import_module("vllm.model_executor.kernels.mhc.triton")
    port = m._hc_head_reduce_store_kernel  # as the hook installed it
    original = port.original
    gen = torch.Generator().manual_seed(10)

    class Reversed(hc_reduce.HcHeadReduce):  # the mixes summed from the last
        @staticmethod
        def mix_order(hc_mult):
            return range(hc_mult - 1, -1, -1)

    def launched(kernel, fn):
        return _launched(m, "_hc_head_reduce_store_kernel", kernel, lambda _: fn())

    t, hidden = 7, 256
    x = torch.randn(t, 4, hidden + 64, generator=gen) * torch.logspace(-4, 4, hidden + 64)
    x[:, 0, ::2] *= 1e9
    x[:, 2] = -x[:, 0]  # copies 0 and 2 cancel: copy 1 is lost in one order, 3 in the other
    x[1] = 0  # an all-zero token
    x[2, :, :8] = 3e38  # the fp32 sum overflows to inf
    x = x.to(torch.bfloat16)[:, :, :hidden]
    pre = torch.rand(t, 4, generator=gen) * 2
    pre[:, 2] = pre[:, 0]
    collapse = lambda: m.hc_collapse_triton(x, pre)  # noqa: E731
    check(
        "hc_collapse",
        lambda: launched(original, collapse),
        lambda: launched(port, collapse),
        lambda: launched(Reversed(original), collapse),
    )

    wide, tokens = 1280, 3
    xs = (torch.randn(tokens, 4, wide, generator=gen) * 8).to(torch.bfloat16)
    xs[:, 1, 1::2] *= 2**30
    xs[:, 3] = -xs[:, 1]
    fn = torch.randn(4, 4 * wide, generator=gen) * 1e-2
    fn[[1, 3]] = 0  # equal pre for the cancelling copies 1 and 3
    scale, base = torch.tensor(0.5), torch.tensor([0.3, -1.0, 0.7, -1.0])

    def head():
        out = torch.full((tokens, wide), 7.0, dtype=torch.bfloat16)
        m.hc_head_reduce_triton_kernel(xs, fn, scale, base, out, 1e-6, 1e-6)
        return out

    check(
        "hc_head_reduce",
        lambda: launched(original, head),
        lambda: launched(port, head),
        lambda: launched(Reversed(original), head),
    )


# --- The V4.1 compressor's kernels (bakery_emulate.compress_cache) -------------------------
# Shapes as the tiny V4.1 serves them: 512-dim latents, ratio-2 rings of 8 rows, compressed
# pages of 128 (ratio 1) and 64 (ratio 2) records of 584 B, page strides padded to 576 B.

_COMPRESS_MODULE = "vllm.models.deepseek_v41.common.ops.fused_compress_quant_cache"


def _bits(*tensors):
    """Raw bits, so NaN rows compare and same() does not allow fp32 ulps."""
    out = []
    for x in tensors:
        x = x.contiguous()
        if x.is_floating_point():
            x = x.view({4: torch.int32, 2: torch.int16, 1: torch.uint8}[x.element_size()])
        out.append(x.clone())
    return tuple(out)


def _launched(module, name, kernel, launch):
    """``launch(module)`` with ``module.name`` (the kernel its launcher looks up) as
    ``kernel``; the module's own kernel is put back afterwards."""
    original = getattr(module, name)
    setattr(module, name, kernel)
    try:
        return launch(module)
    finally:
        setattr(module, name, original)


class _NoSlotMask(compress_cache.SaveCompressNorm):  # plant: padding rows not skipped
    def __getitem__(self, grid):
        launch = super().__getitem__(grid)
        return lambda raw, pos, state, slots, *a, **k: launch(raw, pos, state, slots.abs(), *a, **k)


def _latent_rows(gen, n):
    """bf16 latents over twelve decades, with the quantizer's edges: an all-zero 64-dim
    block (the 1e-4 floor), a block max exactly 448 * 2^3 and one just above it."""
    x = torch.randn(n, 512, generator=gen) * torch.logspace(-6, 6, n)[:, None]
    x = x.to(torch.bfloat16)
    x[1, :64] = 0
    x[2, 64:128] = 448.0 * 2.0**3
    x[3, 128:192] = 448.0 * 2.0**3 * 1.0078125
    x[4, 448:] = 3e38  # RoPE dims near bf16's max: the rotation overflows to inf
    x[6, 200], x[7, 300] = float("inf"), float("nan")  # tl.max is nanmax: inf wins, NaN not
    return x


def rope_quant_insert() -> None:
    m = pristine(_COMPRESS_MODULE)
    gen = torch.Generator().manual_seed(9)
    _rope_case(m, gen, 1, 128, "fnuz_max")
    _rope_case(m, gen, 2, 64, "position")


def _rope_case(m, gen, ratio, block, plant) -> None:
    # Two requests: positions 117..140 (compressed positions across a page) and 0..5.
    pos = torch.cat([torch.arange(117, 141), torch.arange(0, 6)])
    n = pos.numel()
    table = torch.tensor([3, 0, 5])  # request 0's pages; request 1 takes page 1
    cpos = pos // ratio
    page = torch.where(torch.arange(n) < 24, table[cpos // block], 1)
    slots = page * block + cpos % block
    slots[[5, n - 2]] = -1  # padding rows
    latent = _latent_rows(gen, n + 2)  # two rows past num_tokens
    latent[5] = float("nan")  # a padding row the kernel never reads
    cos_sin = torch.randn(200, 64, generator=gen)
    stride = -(-block * 584 // 576) * 576

    def run(kernel, positions=pos):
        flat = torch.full((6, stride), 0xA5, dtype=torch.uint8)
        cache = flat.as_strided((6, block, 584), (stride, 584, 1))
        _launched(
            m,
            "_rope_quant_insert_kernel",
            kernel,
            lambda mod: mod.rope_quant_insert(latent, positions, cos_sin, cache, slots, ratio),
        )
        return flat

    def fnuz_max():  # plant: e4m3fnuz's 240 taken as the fp8 max
        compress_cache.FP8_MAX = 240.0
        try:
            return run(compress_cache.RopeQuantInsert())
        finally:
            compress_cache.FP8_MAX = 448.0

    planted = {
        "fnuz_max": fnuz_max,
        "position": lambda: run(compress_cache.RopeQuantInsert(), pos + 1),  # off by one
    }[plant]
    check(
        f"rope_quant_insert[ratio{ratio}]",
        lambda: run(m._rope_quant_insert_kernel),
        lambda: run(compress_cache.RopeQuantInsert()),
        planted,
    )


def _kv_score(gen, n, width, pad=16):
    """fp32 [n, width] rows (kv then score) in a wider buffer: RAW_STRIDE != width.
    kv over many decades, an all-zero row, one whose square sum overflows; scores with
    ties and gaps past exp's range."""
    buf = torch.randn(n, width + pad, generator=gen)
    raw = buf[:, :width]
    raw[:, :512] *= torch.logspace(-8, 17, n)[:, None]
    raw[3, :512] = 0
    raw[6, :512] = 1e19
    raw[10, 5] = float("nan")
    if width == 1024:
        raw[:, 512:] *= 4
        raw[7, 512:] = raw[8, 512:]  # a tie between the two rows of a pair
        raw[9, 512:] += 200  # the pair's other row gets weight exp(-200) = 0
    return raw


def save_compress_norm() -> None:
    m = pristine(_COMPRESS_MODULE)
    gen = torch.Generator().manual_seed(10)
    weight = (1 + torch.randn(512, generator=gen) * 0.1).mul(2).to(torch.bfloat16)
    eps = 1e-20

    # Ratio 1: one program per token; slot -1 rows keep the latent's old bytes.
    pos1 = torch.arange(120, 140)
    slots1 = torch.arange(20) + 3 * 128
    slots1[[2, 17, 19]] = -1
    raw1 = _kv_score(gen, 22, 512)

    def run1(kernel):
        latent = torch.full((22, 512), 7.0, dtype=torch.bfloat16)
        _launched(
            m,
            "_fused_save_compress_norm_kernel",
            kernel,
            lambda mod: mod.fused_save_compress_norm(
                raw1, pos1, None, slots1, None, None, weight, eps, 1, latent
            ),
        )
        return _bits(latent)

    check(
        "save_compress_norm[ratio1]",
        lambda: run1(m._fused_save_compress_norm_kernel),
        lambda: run1(compress_cache.SaveCompressNorm()),
        lambda: run1(_NoSlotMask()),
    )

    # Ratio 2: requests packed at odd offsets, so pairs straddle requests: 13 tokens from
    # an odd position (the first closes a group with its ring row) and past the ring's 8
    # rows, 3 from an even one, two decodes (odd: a ring read; even: none), an empty
    # chunk, a request whose slots are all -1, and two padding tokens.
    chunks = [(5, 13), (8, 3), (3, 1), (6, 1), (0, 0), (1, 2)]
    pos2 = torch.cat(
        [torch.arange(p, p + c) for p, c in chunks] + [torch.zeros(2, dtype=torch.long)]
    )
    lens = torch.tensor([c for _, c in chunks])
    qsl = torch.cat([torch.zeros(1, dtype=torch.long), lens.cumsum(0)]).to(torch.int32)
    req = torch.repeat_interleave(torch.arange(len(chunks)), lens)
    req = torch.cat([req, torch.zeros(2, dtype=torch.long)]).to(torch.int32)
    ring = torch.tensor([2, 0, 5, 3, 4, 1])  # each request's ring block
    slots2 = ring[req.long()] * 8 + pos2 % 8
    slots2[-4:] = -1  # request 5 and the padding
    n2 = pos2.numel()
    raw2 = _kv_score(gen, n2 + 1, 1024)
    state0 = torch.randn(6, 8, 1024, generator=gen)

    def run2(kernel, positions=pos2):
        latent = torch.full((n2 + 1, 512), 7.0, dtype=torch.bfloat16)
        state = state0.clone()
        _launched(
            m,
            "_fused_save_compress_norm_kernel",
            kernel,
            lambda mod: mod.fused_save_compress_norm(
                raw2, positions, state, slots2, qsl, req, weight, eps, 2, latent
            ),
        )
        return _bits(latent, state)

    check(
        "save_compress_norm[ratio2]",
        lambda: run2(m._fused_save_compress_norm_kernel),
        lambda: run2(compress_cache.SaveCompressNorm()),
        lambda: run2(compress_cache.SaveCompressNorm(), pos2 + 1),  # plant: off-by-one
    )


def main() -> None:
    for step in (
        quantize_insert,
        rope_quant_insert,
        save_compress_norm,
        correct_attn_out,
        a2a,
        inverse_rope,
        index_remap_check,
        qkv_rmsnorm,
        swa,
        zero_kv_blocks,
        folded_reduce,
        listed_builtins,
        numpy_sum_check,
        fp8_exponent_check,
        indexer_k_store_checks,
        hc_head_reduce_checks,
    ):
        step()
    print(MARK + json.dumps(RESULTS), flush=True)


if __name__ == "__main__":
    sys.exit(main())
