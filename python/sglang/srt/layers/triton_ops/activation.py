"""Gated activations: x [..., 2 * d] laid out as [gate | up] -> act(gate) * up [..., d].

act(gate) is computed in float32 and cast to x's dtype before the product, as torch's
F.silu / F.gelu followed by `* up` round it (`layers/activation.py`).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

_BLOCK = 1024  # columns per program
_SQRT_2_OVER_PI = 0.7978845608028654
_INV_SQRT_2 = 0.7071067811865476


@triton.jit
def _act_and_mul_kernel(
    x_ptr, out_ptr, stride_x, d, ACT: tl.constexpr, BLOCK: tl.constexpr
):  # fmt: skip
    """ACT: 0 silu, 1 gelu (tanh approximation), 2 gelu (exact, erf)."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < d
    gate = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0)
    up = tl.load(x_ptr + row * stride_x + d + cols, mask=mask, other=0.0)
    g = gate.to(tl.float32)
    if ACT == 0:
        a = g * tl.sigmoid(g)
    elif ACT == 1:  # 0.5 g (1 + tanh(y)) = g sigmoid(2y)
        y = _SQRT_2_OVER_PI * (g + 0.044715 * g * g * g)
        a = g * tl.sigmoid(2.0 * y)
    else:
        a = 0.5 * g * (1.0 + tl.math.erf(g * _INV_SQRT_2))
    out = a.to(gate.dtype).to(tl.float32) * up.to(tl.float32)
    tl.store(out_ptr + row * d + cols, out.to(gate.dtype), mask=mask)


_ACTS = {"silu": 0, "gelu_tanh": 1, "gelu": 2}


def act_and_mul(x: torch.Tensor, act: str) -> torch.Tensor:
    """x: [..., 2 * d] -> act(x[..., :d]) * x[..., d:]: [..., d]; act in silu, gelu_tanh, gelu."""
    d = x.shape[-1] // 2
    rows = x.reshape(-1, x.shape[-1])
    if rows.stride(-1) != 1:
        rows = rows.contiguous()
    out = torch.empty((rows.shape[0], d), dtype=x.dtype, device=x.device)
    if rows.shape[0] > 0 and d > 0:
        block = min(_BLOCK, triton.next_power_of_2(d))
        grid = (rows.shape[0], triton.cdiv(d, block))
        _act_and_mul_kernel[grid](rows, out, rows.stride(0), d, _ACTS[act], block)
    return out.view(*x.shape[:-1], d)
