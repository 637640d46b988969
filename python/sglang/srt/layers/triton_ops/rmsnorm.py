"""RMSNorm kernels: Llama's (optionally after a fused residual add) and Gemma's (1 + weight).

Each program normalises one row in float32 and rounds where the torch ops round
(`layers/layernorm.py`): the sum x + residual and the normalised row are cast to x's
dtype before the weight multiplies (Llama); Gemma multiplies by 1 + weight in float32
and casts once.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _rmsnorm_kernel(
    x_ptr, res_ptr, w_ptr, out_ptr, res_out_ptr,
    stride_x, stride_res, hidden, eps,
    HAS_RESIDUAL: tl.constexpr, GEMMA: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < hidden
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0)
    dtype = x.dtype
    h = x.to(tl.float32)
    if HAS_RESIDUAL:
        r = tl.load(res_ptr + row * stride_res + cols, mask=mask, other=0.0)
        summed = (h + r.to(tl.float32)).to(dtype)
        tl.store(res_out_ptr + row * hidden + cols, summed, mask=mask)
        h = summed.to(tl.float32)
    inv_rms = tl.rsqrt(tl.sum(h * h, axis=0) / hidden + eps)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    if GEMMA:
        y = h * inv_rms * (1.0 + w)
    else:
        y = (h * inv_rms).to(dtype).to(tl.float32) * w
    tl.store(out_ptr + row * hidden + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


def _rows(x: torch.Tensor) -> torch.Tensor:
    """x: [..., H] -> a [N, H] view (or copy) whose rows have unit column stride."""
    rows = x.reshape(-1, x.shape[-1])
    return rows if rows.stride(-1) == 1 else rows.contiguous()


def _launch(x, weight, eps, residual, gemma, out_dtype):
    rows = _rows(x)
    n, hidden = rows.shape
    out = torch.empty((n, hidden), dtype=out_dtype, device=x.device)
    res_rows, res_out = rows, out  # placeholders when there is no residual
    if residual is not None:
        res_rows = _rows(residual)
        res_out = torch.empty_like(rows, memory_format=torch.contiguous_format)
    if n > 0:
        block = triton.next_power_of_2(hidden)
        _rmsnorm_kernel[(n,)](
            rows, res_rows, weight, out, res_out, rows.stride(0), res_rows.stride(0),
            hidden, eps, residual is not None, gemma, block,
            num_warps=min(max(block // 256, 1), 8),  # one row per program: wide rows, more warps
        )  # fmt: skip
    return out.view(x.shape), res_out.view(x.shape)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x: [..., H], weight: [H] -> weight * norm(x) in their promoted dtype."""
    return _launch(x, weight, eps, None, False, torch.promote_types(x.dtype, weight.dtype))[0]


def fused_add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(weight * norm(x + residual), x + residual); x and residual are left unchanged."""
    out_dtype = torch.promote_types(x.dtype, weight.dtype)
    return _launch(x, weight, eps, residual, False, out_dtype)


def gemma_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x: [..., H] -> norm(x) * (1 + weight), in x's dtype."""
    return _launch(x, weight, eps, None, True, x.dtype)[0]
