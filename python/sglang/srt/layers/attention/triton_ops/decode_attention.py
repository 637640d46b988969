"""Paged decode attention in Triton: one query token per request, KV split over its length.

Stage 1 cuts each request's keys (its last min(seq_len, window) tokens, read through
`req_to_token`) into `num_kv_splits[b]` contiguous pieces; one program attends one
piece for a group of query heads that share a KV head, and writes the piece's
normalised output and log-sum-exp. Stage 2 merges the pieces of each (request, head)
with their log-sum-exps. A long context thus occupies many programs instead of one
(the structure of SGLang's and vLLM's split-KV decode kernels).

Shapes (T = batch size, Hq query heads, Hkv KV heads, D head_dim):
    q:            [bs, Hq, D]
    k/v_buffer:   [num_slots, Hkv, D] (any strides; the pool's kv[:, 0] / kv[:, 1])
    out:          [bs, Hq, D]
    split_out:    float32[bs, Hq, max_kv_splits, D]   (stage 1 -> stage 2)
    split_lse:    float32[bs, Hq, max_kv_splits]
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from sglang.srt.layers.attention.triton_ops import dot_precision

# tl.dot needs at least 16 rows: a program attends this many query heads at a time,
# masking the ones beyond its KV head's group
_BLOCK_H = 16
_BLOCK_N = 32
# Running maximum before any key: finite, so a row with no visible key in a block
# rescales by exp(0) instead of exp(-inf - -inf) = nan
_NO_MAX = tl.constexpr(-1.0e30)


@triton.jit
def _tanh(x):
    return 2 * tl.sigmoid(2 * x) - 1


@triton.jit
def _kv_range(seq_len, window):
    """[start, end) of the positions a request's decode query sees (window 0 = all)."""
    return tl.where(window > 0, tl.maximum(seq_len - window, 0), 0), seq_len


@triton.jit
def _decode_split_kernel(
    Q,
    K_Buffer,
    V_Buffer,
    Req_to_token,
    Req_pool_indices,
    Seq_lens,
    Num_kv_splits,
    Split_out,
    Split_lse,
    sm_scale,
    logit_cap,
    window,
    kv_group_num,
    stride_qb,
    stride_qh,
    stride_kbs,
    stride_kh,
    stride_vbs,
    stride_vh,
    stride_req,
    stride_ob,
    stride_oh,
    stride_os,
    stride_lb,
    stride_lh,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_H: tl.constexpr,
    HAS_CAP: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    batch, head_block, split = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    # a KV head's group of query heads takes cdiv(group, BLOCK_H) programs
    blocks_per_group = tl.cdiv(kv_group_num, BLOCK_H)
    kv_head = head_block // blocks_per_group
    in_group = (head_block % blocks_per_group) * BLOCK_H + tl.arange(0, BLOCK_H)
    heads = kv_head * kv_group_num + in_group
    mask_h = in_group < kv_group_num
    offs_d = tl.arange(0, BLOCK_D)
    mask_d = offs_d < HEAD_DIM

    num_splits = tl.load(Num_kv_splits + batch)
    kv_start, kv_end = _kv_range(tl.load(Seq_lens + batch), window)
    split_len = tl.cdiv(kv_end - kv_start, num_splits)
    split_start = kv_start + split_len * split
    split_end = tl.minimum(split_start + split_len, kv_end)
    table_row = Req_to_token + tl.load(Req_pool_indices + batch).to(tl.int64) * stride_req

    if split_end > split_start:
        q_ptrs = Q + batch * stride_qb + heads[:, None] * stride_qh + offs_d[None, :]
        q = tl.load(q_ptrs, mask=mask_h[:, None] & mask_d[None, :], other=0.0)  # [H, D]
        e_max = tl.zeros([BLOCK_H], dtype=tl.float32) + _NO_MAX
        e_sum = tl.zeros([BLOCK_H], dtype=tl.float32)
        acc = tl.zeros([BLOCK_H, BLOCK_D], dtype=tl.float32)
        for start_n in range(split_start, split_end, BLOCK_N):
            offs_n = start_n + tl.arange(0, BLOCK_N)
            mask_n = offs_n < split_end
            slots = tl.load(table_row + offs_n, mask=mask_n, other=0).to(tl.int64)
            k_ptrs = K_Buffer + slots[None, :] * stride_kbs + kv_head * stride_kh + offs_d[:, None]
            k = tl.load(k_ptrs, mask=mask_n[None, :] & mask_d[:, None], other=0.0)  # [D, N]
            qk = tl.dot(q, k.to(q.dtype), input_precision=DOT_PRECISION) * sm_scale  # [H, N], fp32
            if HAS_CAP:
                qk = logit_cap * _tanh(qk / logit_cap)
            qk = tl.where(mask_n[None, :], qk, float("-inf"))
            v_ptrs = V_Buffer + slots[:, None] * stride_vbs + kv_head * stride_vh + offs_d[None, :]
            v = tl.load(v_ptrs, mask=mask_n[:, None] & mask_d[None, :], other=0.0).to(q.dtype)
            new_max = tl.maximum(tl.max(qk, 1), e_max)
            rescale = tl.exp(e_max - new_max)
            p = tl.exp(qk - new_max[:, None])
            acc = acc * rescale[:, None] + tl.dot(p.to(q.dtype), v, input_precision=DOT_PRECISION)
            e_sum = e_sum * rescale + tl.sum(p, 1)
            e_max = new_max

        out_rows = batch * stride_ob + heads * stride_oh + split * stride_os
        out_ptrs = Split_out + out_rows[:, None] + offs_d[None, :]
        tl.store(out_ptrs, acc / e_sum[:, None], mask=mask_h[:, None] & mask_d[None, :])
        lse_ptrs = Split_lse + batch * stride_lb + heads * stride_lh + split
        tl.store(lse_ptrs, e_max + tl.log(e_sum), mask=mask_h)


@triton.jit
def _decode_reduce_kernel(
    Split_out,
    Split_lse,
    Out,
    Seq_lens,
    Num_kv_splits,
    window,
    stride_ob,
    stride_oh,
    stride_os,
    stride_lb,
    stride_lh,
    stride_out_b,
    stride_out_h,
    MAX_KV_SPLITS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    batch, head = tl.program_id(0), tl.program_id(1)
    offs_d = tl.arange(0, BLOCK_D)
    mask_d = offs_d < HEAD_DIM
    num_splits = tl.load(Num_kv_splits + batch)
    kv_start, kv_end = _kv_range(tl.load(Seq_lens + batch), window)
    split_len = tl.cdiv(kv_end - kv_start, num_splits)

    e_max = _NO_MAX
    e_sum = 0.0
    acc = tl.zeros([BLOCK_D], dtype=tl.float32)
    for split in range(0, MAX_KV_SPLITS):
        split_start = kv_start + split_len * split
        if (split < num_splits) & (split_start < kv_end):  # an empty split wrote nothing
            row = batch * stride_ob + head * stride_oh + split * stride_os
            part = tl.load(Split_out + row + offs_d, mask=mask_d, other=0.0)
            lse = tl.load(Split_lse + batch * stride_lb + head * stride_lh + split)
            new_max = tl.maximum(lse, e_max)
            rescale = tl.exp(e_max - new_max)
            weight = tl.exp(lse - new_max)
            acc = acc * rescale + weight * part
            e_sum = e_sum * rescale + weight
            e_max = new_max
    out_ptrs = Out + batch * stride_out_b + head * stride_out_h + offs_d
    tl.store(out_ptrs, (acc / e_sum).to(Out.dtype.element_ty), mask=mask_d)


def decode_attention_fwd(
    q: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    out: torch.Tensor,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    num_kv_splits: torch.Tensor,
    split_out: torch.Tensor,
    split_lse: torch.Tensor,
    sm_scale: float,
    logit_cap: float | None = None,
    window: int | None = None,
) -> None:
    """Writes `out` [bs, Hq, D]: each request's query against its (windowed) keys.

    num_kv_splits: int32[bs], each in [1, split_out.shape[2]]; the buffers are scratch
    that this call overwrites. A request's query sees positions
    [max(0, seq_len - window), seq_len) (window None = all of them).
    """
    bs, hq, d = q.shape
    hkv = k_buffer.shape[1]
    assert q.stride(-1) == k_buffer.stride(-1) == v_buffer.stride(-1) == out.stride(-1) == 1
    group = hq // hkv
    max_kv_splits = split_out.shape[2]
    block_d = triton.next_power_of_2(d)
    grid = (bs, hkv * triton.cdiv(group, _BLOCK_H), max_kv_splits)
    _decode_split_kernel[grid](
        q, k_buffer, v_buffer, req_to_token, req_pool_indices, seq_lens, num_kv_splits,
        split_out, split_lse, sm_scale, logit_cap or 0.0, window or 0, group,
        q.stride(0), q.stride(1), k_buffer.stride(0), k_buffer.stride(1),
        v_buffer.stride(0), v_buffer.stride(1), req_to_token.stride(0),
        split_out.stride(0), split_out.stride(1), split_out.stride(2),
        split_lse.stride(0), split_lse.stride(1),
        HEAD_DIM=d, BLOCK_D=block_d, BLOCK_N=_BLOCK_N, BLOCK_H=_BLOCK_H,
        HAS_CAP=bool(logit_cap), DOT_PRECISION=dot_precision(q.dtype),
    )  # fmt: skip
    _decode_reduce_kernel[(bs, hq)](
        split_out, split_lse, out, seq_lens, num_kv_splits, window or 0,
        split_out.stride(0), split_out.stride(1), split_out.stride(2),
        split_lse.stride(0), split_lse.stride(1), out.stride(0), out.stride(1),
        MAX_KV_SPLITS=max_kv_splits, HEAD_DIM=d, BLOCK_D=block_d,
    )  # fmt: skip
