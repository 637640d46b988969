"""Rotary embedding, neox layout (as `layers/rotary_embedding.py`): each head's first
`rotary_dim` columns are two halves x1, x2 rotated by the position's angles,

    out1 = x1 * cos - x2 * sin,    out2 = x2 * cos + x1 * sin,

and columns past `rotary_dim` (partial rotary) are copied. cos / sin come from the
module's float32 caches [max_len, rotary_dim / 2], already scaled (linear, dynamic,
llama3, yarn all live in the caches), read at each token's position and cast to x's
dtype first, as the torch path casts them.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

_HEADS_PER_PROGRAM = 4


@triton.jit
def _rotary_kernel(
    x_ptr, out_ptr, pos_ptr, cos_ptr, sin_ptr,
    stride_x, stride_cache, num_heads,
    HEAD_DIM: tl.constexpr, HALF: tl.constexpr, BLOCK_H: tl.constexpr,
    BLOCK_HALF: tl.constexpr, BLOCK_PASS: tl.constexpr,
):  # fmt: skip
    tok = tl.program_id(0).to(tl.int64)
    heads = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    pos = tl.load(pos_ptr + tok)
    x_row = x_ptr + tok * stride_x + heads[:, None] * HEAD_DIM  # [BLOCK_H, 1]
    out_row = out_ptr + (tok * num_heads + heads[:, None]) * HEAD_DIM
    i = tl.arange(0, BLOCK_HALF)
    mask = (heads[:, None] < num_heads) & (i[None, :] < HALF)
    x1 = tl.load(x_row + i[None, :], mask=mask, other=0.0)
    dtype = x1.dtype
    x1 = x1.to(tl.float32)
    x2 = tl.load(x_row + HALF + i[None, :], mask=mask, other=0.0).to(tl.float32)
    cs = pos * stride_cache + i
    cos = tl.load(cos_ptr + cs, mask=i < HALF, other=0.0).to(dtype).to(tl.float32)[None, :]
    sin = tl.load(sin_ptr + cs, mask=i < HALF, other=0.0).to(dtype).to(tl.float32)[None, :]
    tl.store(out_row + i[None, :], (x1 * cos - x2 * sin).to(dtype), mask=mask)
    tl.store(out_row + HALF + i[None, :], (x2 * cos + x1 * sin).to(dtype), mask=mask)
    if HEAD_DIM > 2 * HALF:  # partial rotary: copy the rest of each head
        j = 2 * HALF + tl.arange(0, BLOCK_PASS)
        pass_mask = (heads[:, None] < num_heads) & (j[None, :] < HEAD_DIM)
        rest = tl.load(x_row + j[None, :], mask=pass_mask, other=0.0)
        tl.store(out_row + j[None, :], rest, mask=pass_mask)


def rotary_neox(
    positions: torch.Tensor,
    x: torch.Tensor,
    cos_cache: torch.Tensor,
    sin_cache: torch.Tensor,
    head_dim: int,
) -> torch.Tensor:
    """positions: int64[T]; x: [T, H * head_dim]; caches: [max_len, rotary_dim / 2]
    -> rotated [T, H, head_dim] (a new tensor; x is left unchanged)."""
    t = x.shape[0]
    if x.stride(-1) != 1:
        x = x.contiguous()
    num_heads = x.shape[1] // head_dim
    half = cos_cache.shape[1]
    out = torch.empty((t, num_heads, head_dim), dtype=x.dtype, device=x.device)
    if t == 0 or num_heads == 0:
        return out
    cos_cache, sin_cache = cos_cache.contiguous(), sin_cache.contiguous()
    block_h = min(_HEADS_PER_PROGRAM, triton.next_power_of_2(num_heads))
    grid = (t, triton.cdiv(num_heads, block_h))
    _rotary_kernel[grid](
        x, out, positions, cos_cache, sin_cache, x.stride(0), cos_cache.stride(0), num_heads,
        head_dim, half, block_h, triton.next_power_of_2(half),
        triton.next_power_of_2(max(head_dim - 2 * half, 1)),
    )  # fmt: skip
    return out
