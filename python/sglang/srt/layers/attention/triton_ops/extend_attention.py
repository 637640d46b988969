"""Extend (prefill) attention in Triton: new tokens over a cached prefix plus each other.

Each request of the batch has, in absolute positions,

    [0, prefix_len)          cached: K/V read from the pool through `req_to_token`
    [prefix_len, seq_len)    new (extend_len tokens): K/V read from this step's k/v

One program attends BLOCK_M new tokens of one request for one query head: first over
the prefix, then causally over the new tokens, with one online softmax (the two-phase
structure of SGLang's extend kernel). A layer window W hides keys at or before
q - W from the query at position q. Any extend length works, so the speculative
verify shape (k + 1 tokens per request on a prefix) is an ordinary extend.

Shapes (T = new tokens of the batch, Hq / Hkv heads, D head_dim):
    q, out:             [T, Hq, D]
    k, v (new tokens):  [T, Hkv, D]
    k/v_buffer (pool):  [num_slots, Hkv, D] (any strides)
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from sglang.srt.layers.attention.triton_ops import dot_precision

_BLOCK_M = 32
_BLOCK_N = 32
_NO_MAX = tl.constexpr(-1.0e30)  # see decode_attention: keeps fully masked rows nan-free


@triton.jit
def _tanh(x):
    return 2 * tl.sigmoid(2 * x) - 1


@triton.jit
def _online_softmax_step(acc, e_max, e_sum, qk, v, DOT_PRECISION: tl.constexpr):
    """Fold one block of scores qk [M, N] (masked -> -inf) and values v [N, D] in."""
    new_max = tl.maximum(tl.max(qk, 1), e_max)
    rescale = tl.exp(e_max - new_max)
    p = tl.exp(qk - new_max[:, None])
    acc = acc * rescale[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
    return acc, new_max, e_sum * rescale + tl.sum(p, 1)


@triton.jit
def _scores(q, k, sm_scale, logit_cap, HAS_CAP: tl.constexpr, DOT_PRECISION: tl.constexpr):
    qk = tl.dot(q, k, input_precision=DOT_PRECISION) * sm_scale  # [M, N], fp32
    if HAS_CAP:
        qk = logit_cap * _tanh(qk / logit_cap)
    return qk


@triton.jit
def _extend_kernel(
    Q,
    K_new,
    V_new,
    Out,
    K_Buffer,
    V_Buffer,
    Req_to_token,
    Req_pool_indices,
    Seq_lens,
    Extend_start,
    Extend_lens,
    sm_scale,
    logit_cap,
    window,
    kv_group_num,
    stride_qt,
    stride_qh,
    stride_knt,
    stride_knh,
    stride_vnt,
    stride_vnh,
    stride_ot,
    stride_oh,
    stride_kbs,
    stride_kbh,
    stride_vbs,
    stride_vbh,
    stride_req,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    HAS_CAP: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    batch, head, block_m = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    kv_head = head // kv_group_num
    extend_len = tl.load(Extend_lens + batch)
    prefix_len = tl.load(Seq_lens + batch) - extend_len
    first_token = tl.load(Extend_start + batch)
    offs_m = block_m * BLOCK_M + tl.arange(0, BLOCK_M)  # query offsets among the new tokens
    mask_m = offs_m < extend_len
    offs_d = tl.arange(0, BLOCK_D)
    mask_d = offs_d < HEAD_DIM

    if block_m * BLOCK_M < extend_len:
        rows = (first_token + offs_m).to(tl.int64)
        q_ptrs = Q + rows[:, None] * stride_qt + head * stride_qh + offs_d[None, :]
        q = tl.load(q_ptrs, mask=mask_m[:, None] & mask_d[None, :], other=0.0)  # [M, D]
        q_pos = prefix_len + offs_m  # absolute positions
        # keys before `lowest` are outside the window of every query of this block
        lowest = tl.where(window > 0, tl.maximum(prefix_len + block_m * BLOCK_M - window + 1, 0), 0)
        e_max = tl.zeros([BLOCK_M], dtype=tl.float32) + _NO_MAX
        e_sum = tl.zeros([BLOCK_M], dtype=tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)

        # phase 1: the cached prefix, through req_to_token (every prefix key is causal)
        table_row = Req_to_token + tl.load(Req_pool_indices + batch).to(tl.int64) * stride_req
        for start_n in range(lowest, prefix_len, BLOCK_N):
            offs_n = start_n + tl.arange(0, BLOCK_N)
            mask_n = offs_n < prefix_len
            slots = tl.load(table_row + offs_n, mask=mask_n, other=0).to(tl.int64)
            k_ptrs = K_Buffer + slots[None, :] * stride_kbs + kv_head * stride_kbh + offs_d[:, None]
            k = tl.load(k_ptrs, mask=mask_n[None, :] & mask_d[:, None], other=0.0)  # [D, N]
            qk = _scores(q, k.to(q.dtype), sm_scale, logit_cap, HAS_CAP, DOT_PRECISION)
            visible = mask_n[None, :] & (
                (window <= 0) | (offs_n[None, :] > q_pos[:, None] - window)
            )
            qk = tl.where(visible, qk, float("-inf"))
            v_ptrs = V_Buffer + slots[:, None] * stride_vbs + kv_head * stride_vbh + offs_d[None, :]
            v = tl.load(v_ptrs, mask=mask_n[:, None] & mask_d[None, :], other=0.0)
            acc, e_max, e_sum = _online_softmax_step(
                acc, e_max, e_sum, qk, v.to(q.dtype), DOT_PRECISION
            )

        # phase 2: the new tokens, causally; none past this block's last query
        new_end = tl.minimum((block_m + 1) * BLOCK_M, extend_len)
        for start_n in range(tl.maximum(lowest - prefix_len, 0), new_end, BLOCK_N):
            offs_n = start_n + tl.arange(0, BLOCK_N)  # key offsets among the new tokens
            mask_n = offs_n < new_end
            key_rows = (first_token + offs_n).to(tl.int64)
            k_ptrs = K_new + key_rows[None, :] * stride_knt + kv_head * stride_knh + offs_d[:, None]
            k = tl.load(k_ptrs, mask=mask_n[None, :] & mask_d[:, None], other=0.0)
            qk = _scores(q, k.to(q.dtype), sm_scale, logit_cap, HAS_CAP, DOT_PRECISION)
            visible = mask_n[None, :] & (offs_n[None, :] <= offs_m[:, None])
            visible &= (window <= 0) | (offs_n[None, :] > offs_m[:, None] - window)
            qk = tl.where(visible, qk, float("-inf"))
            v_ptrs = V_new + key_rows[:, None] * stride_vnt + kv_head * stride_vnh + offs_d[None, :]
            v = tl.load(v_ptrs, mask=mask_n[:, None] & mask_d[None, :], other=0.0)
            acc, e_max, e_sum = _online_softmax_step(
                acc, e_max, e_sum, qk, v.to(q.dtype), DOT_PRECISION
            )

        # every real query sees itself, so e_sum > 0 on stored rows; padded rows divide by 1
        out = acc / tl.where(e_sum > 0, e_sum, 1.0)[:, None]
        o_ptrs = Out + rows[:, None] * stride_ot + head * stride_oh + offs_d[None, :]
        tl.store(o_ptrs, out.to(Out.dtype.element_ty), mask=mask_m[:, None] & mask_d[None, :])


def extend_attention_fwd(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    extend_start: torch.Tensor,
    extend_lens: torch.Tensor,
    max_extend_len: int,
    sm_scale: float,
    logit_cap: float | None = None,
    window: int | None = None,
) -> None:
    """Writes `out` [T, Hq, D] for the new tokens of every request.

    extend_start: int[bs], each request's first row in q/k/v/out; extend_lens: int[bs];
    seq_lens: int[bs] = prefix + extend. `req_to_token` must hold the prefix slots; the
    new tokens' K/V come from k and v, so the pool need not hold them yet.
    """
    t, hq, d = q.shape
    bs, hkv = seq_lens.shape[0], k.shape[1]
    if t == 0:
        return
    for x in (q, k, v, out, k_buffer, v_buffer):
        assert x.stride(-1) == 1, "head_dim must be contiguous"
    grid = (bs, hq, triton.cdiv(max_extend_len, _BLOCK_M))
    _extend_kernel[grid](
        q, k, v, out, k_buffer, v_buffer, req_to_token, req_pool_indices, seq_lens,
        extend_start, extend_lens, sm_scale, logit_cap or 0.0, window or 0, hq // hkv,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        out.stride(0), out.stride(1), k_buffer.stride(0), k_buffer.stride(1),
        v_buffer.stride(0), v_buffer.stride(1), req_to_token.stride(0),
        HEAD_DIM=d, BLOCK_D=triton.next_power_of_2(d), BLOCK_M=_BLOCK_M, BLOCK_N=_BLOCK_N,
        HAS_CAP=bool(logit_cap), DOT_PRECISION=dot_precision(q.dtype),
    )  # fmt: skip
