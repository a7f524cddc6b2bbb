"""vLLM's DCP combine kernels (``v1/attention/ops/dcp.py``, which the series calls but
does not patch), ported line for line to torch.

Interpreted, they were about two thirds of a CPU prefill under DCP (one program per
token and head). Each port keeps the kernel's fp32 arithmetic and its order over ranks;
tests/lab/emulate holds each equal to the interpreted original. The merge math is
``lab.dcp.merge``'s, the one copy the reference shares (numpy's exp2/log2 passed in where
the interpreter uses them).
"""

from __future__ import annotations

import numpy as np
import torch

from lab.dcp import merge

NEG_INF = float("-inf")


def _numpy(fn):
    # The interpreter evaluates tl.exp2/tl.log2 with numpy, whose float32 results differ
    # from torch's in the last bit; the port must give the interpreted kernel's bytes.
    return lambda x: torch.from_numpy(fn(x.float().numpy()))


class CorrectAttnOut:
    """``_CORRECT_ATTN_CP_OUT_KERNEL(out, new_out, lses, vlse, rank, ctx, is_base_e=)``."""

    def __call__(self, outputs, new_output, lses, vlse, lse_idx, ctx, *, is_base_e):
        exp, log = (torch.exp, torch.log) if is_base_e else (torch.exp2, torch.log2)
        total = merge.merge_lse(lses, exp, log)
        vlse.copy_(total)
        final = merge.clean(lses[lse_idx].float() - total)
        factor = torch.exp(final) if is_base_e else torch.exp2(final)
        out = outputs.float() * factor[..., None]
        out = torch.where(factor[..., None] == 0.0, 0.0, out)
        new_output.copy_(out.to(new_output.dtype))


def _empty_rows(num_rows, seq_lens, query_start_loc):
    if seq_lens is None or query_start_loc is None:
        return torch.zeros(num_rows, dtype=torch.bool)
    num_seqs = seq_lens.shape[0]
    rows = torch.arange(num_rows)
    seq = (query_start_loc[1 : num_seqs + 1][None, :] <= rows[:, None]).sum(1)
    seq = seq.clamp(max=num_seqs - 1)
    return (rows >= query_start_loc[num_seqs]) | (seq_lens[seq] == 0)


def pack_send(
    cp_attn_out,
    cp_attn_lse,
    send_buffer,
    world_size,
    h_per_rank,
    head_dim,
    lse_pack_dim,
    seq_lens=None,
    query_start_loc=None,
):
    """``_dcp_a2a_pack_send``: rank r's slice gets heads [r*Hr, (r+1)*Hr) and the fp32
    LSE, packed into one (fp32) or two (16-bit halves) trailing slots."""
    rows = cp_attn_out.shape[0]
    lse = cp_attn_lse.float()
    if seq_lens is not None and query_start_loc is not None:
        lse = torch.where(_empty_rows(rows, seq_lens, query_start_loc)[:, None], NEG_INF, lse)
    for rank in range(world_size):
        heads = slice(rank * h_per_rank, (rank + 1) * h_per_rank)
        send_buffer[rank, :, :, :head_dim] = cp_attn_out[:, heads]
        part = lse[:, heads].contiguous()
        if lse_pack_dim == 1:
            send_buffer[rank, :, :, head_dim] = part.to(send_buffer.dtype)
        else:
            bits = part.view(torch.int32)
            lo = (bits & 0xFFFF).to(torch.int32).to(torch.int16)
            hi = ((bits >> 16) & 0xFFFF).to(torch.int32).to(torch.int16)
            send_buffer[rank, :, :, head_dim] = lo.view(send_buffer.dtype)
            send_buffer[rank, :, :, head_dim + 1] = hi.view(send_buffer.dtype)


def unpack_combine(recv_buffer, head_dim, lse_pack_dim, return_lse, is_lse_base_on_e):
    """``_dcp_a2a_unpack_combine``: LSE-weighted sum over ranks, in rank order, fp32."""
    world_size = recv_buffer.shape[0]
    if lse_pack_dim == 1:
        lses = recv_buffer[..., head_dim].float()
    else:
        lo = recv_buffer[..., head_dim].contiguous().view(torch.int16).to(torch.int32) & 0xFFFF
        hi = recv_buffer[..., head_dim + 1].contiguous().view(torch.int16).to(torch.int32)
        lses = ((hi << 16) | lo).view(torch.float32)
    exp = _numpy(np.exp if is_lse_base_on_e else np.exp2)
    log = _numpy(np.log if is_lse_base_on_e else np.log2)
    global_lse = merge.merge_lse(lses, exp, log)
    lses = merge.clean(lses)
    acc = torch.zeros(recv_buffer.shape[1:3] + (head_dim,), dtype=torch.float32)
    for rank in range(world_size):
        weight = merge.weight(lses[rank], global_lse, exp)[..., None]
        acc = acc + merge.weighted(recv_buffer[rank, ..., :head_dim], weight)
    out = acc.to(recv_buffer.dtype)
    return (out, global_lse) if return_lse else out


class UnpackCombineKernel:
    """``_dcp_a2a_unpack_combine_kernel[grid](...)`` itself, for callers that launch it
    directly (patch 09's ``_dcp_combine_a2a_into`` writes into ``output`` through its
    strides): the same sum as ``unpack_combine``, stored into the given ``out``."""

    def __getitem__(self, grid):
        return self._launch

    @staticmethod
    def _launch(recv, out, out_lse, *strides, N, HEAD_DIM, IS_BASE_E, RETURN_LSE, LSE_PACK_DIM):
        if recv.shape[0] != N or len(strides) != 9:
            raise NotImplementedError("bakery_emulate: unexpected a2a combine launch")
        result = unpack_combine(recv, HEAD_DIM, LSE_PACK_DIM, RETURN_LSE, IS_BASE_E)
        combined, lse = result if RETURN_LSE else (result, None)
        out.copy_(combined.to(out.dtype))
        if lse is not None:
            out_lse.copy_(lse.to(out_lse.dtype))
