"""Triton kernels of the triton attention backend (imported only by that backend)."""

from __future__ import annotations

import torch


def dot_precision(dtype: torch.dtype) -> str:
    """`tl.dot`'s input_precision for operands of `dtype`: "ieee" (full fp32 products) for
    float32, as torch's own matmul computes by default; Triton's default on NVIDIA is TF32,
    whose 10-bit mantissa put a float32 model's attention ~2.5e-3 off torch_native's on an
    H200. 16-bit operands are multiplied exactly either way ("tf32" is a no-op for them).
    """
    return "ieee" if dtype == torch.float32 else "tf32"
